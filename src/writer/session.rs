//! One `state` command's connection to Consul ([`Writer`]): the client, the
//! prefix, the output format and the confirmation options, which the
//! commands, the executor and the confirmation share.

use serde_json::Value;

use super::error::Failure;
use super::output::{err_line, out_line, Render};
use crate::cli::ConfirmArgs;
use crate::consul::ConsulClient;
use crate::decision::STORE_ID_KEY;
use crate::model::meta::Author;
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

    /// The records under the sibling prefix, or none with a warning.
    pub(super) async fn records(&self) -> Vec<KvPair> {
        self.client
            .read_records(&self.prefix)
            .await
            .unwrap_or_else(|e| {
                err_line(&format!("warning: who wrote the keys is not shown: {e}"));
                Vec::new()
            })
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
