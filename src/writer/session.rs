//! One `state` command's connection to Consul ([`Writer`]): the client, the
//! prefix, the output format and the confirmation options, which the
//! commands, the executor and the confirmation share.

use serde_json::Value;

use super::error::Failure;
use super::output::{err_line, out_line, Render};
use crate::cli::ConfirmArgs;
use crate::cli::Consistency;
use crate::consul::ConsulClient;
use crate::decision::STORE_ID_KEY;
use crate::model::meta::{records_prefix, Author};
use crate::model::snapshot::KvPair;

/// One `state` command's connection: the Consul client, the prefix (ending
/// in `/`), and whether output is `--json`.
pub(super) struct Writer {
    pub(super) client: ConsulClient,
    pub(super) prefix: String,
    pub(super) json: bool,
    /// Set when write steps are to be confirmed through Prometheus.
    pub(super) confirm: Option<ConfirmArgs>,
    /// The Prometheus that shows what the agents hold (`--prometheus`).
    pub(super) holds: Option<crate::fleet::held::Source>,
    /// Who writes, why and until when, recorded with every key written.
    pub(super) author: Author,
}

impl Writer {
    pub(super) fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Creates `<prefix>`[`STORE_ID_KEY`] with a random id if it is absent
    /// (compare-and-set on 0, so a present id is never replaced), before
    /// any write: the agents take a store without it, or with another id,
    /// for one that lost its data, whatever its index.
    pub(super) async fn ensure_store_id(&self) -> Result<(), Failure> {
        let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        self.client
            .put_cas(&self.full(STORE_ID_KEY), id.as_bytes(), 0)
            .await?;
        Ok(())
    }

    /// Every record below [`records_prefix`] (full keys), to read with the
    /// prefix's pairs ([`crate::model::meta::Records::read`]): none, with a
    /// warning on stderr, when they cannot be read (the keys then show as
    /// written outside the writer, unless an earlier writer's record below
    /// the prefix describes them).
    pub(super) async fn records(&self) -> Vec<KvPair> {
        let sibling = records_prefix(&self.prefix);
        let read = self
            .client
            .read_prefix(&sibling, 0, std::time::Duration::ZERO, Consistency::Default)
            .await;
        match read {
            Ok((answer, _)) => answer.pairs,
            Err(e) => {
                err_line(&format!(
                    "warning: cannot read the writer's records under {sibling} ({e}): who \
                     wrote the keys, why and until when is not shown (give the token read \
                     on {sibling})"
                ));
                Vec::new()
            }
        }
    }

    /// Prints `report` as JSON with `--json`, else as text.
    pub(super) fn print(&self, report: &impl Render) {
        match self.json {
            true => self.print_json(serde_json::to_value(report).unwrap_or_default()),
            false => out_line(report.text().trim_end_matches('\n')),
        }
    }

    pub(super) fn print_json(&self, value: Value) {
        out_line(&serde_json::to_string_pretty(&value).unwrap_or_default());
    }
}
