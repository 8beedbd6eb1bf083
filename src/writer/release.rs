//! `state release-rollback`: the one operator action that releases, on every
//! agent at once, the keys held since Consul's data went backwards (the
//! agent's guard).

use serde_json::json;

use super::error::Failure;
use super::session::Writer;
use crate::consul::{TxnOp, TxnOutcome};
use crate::decision::HoldCause;
use crate::fleet::held::{agents_text, Holds};
use crate::model::identity::RELEASE_ROLLBACK_KEY;
use crate::model::meta::records_prefix;

impl Writer {
    /// Writes `<prefix>`[`RELEASE_ROLLBACK_KEY`] with the time of the
    /// release, so its ModifyIndex changes; every agent sees it through its
    /// blocking query on the prefix and stops holding. Compare-and-set on
    /// the ModifyIndex read, advancing the write generation; two releases
    /// at once both succeed in effect, so a lost race is retried once.
    pub(super) async fn release_rollback(&self, dry_run: bool) -> Result<(), Failure> {
        let full = self.full(RELEASE_ROLLBACK_KEY);
        let value = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
        let mut written = false;
        let mut before = None;
        // What it releases: the keys the agents hold since the rollback,
        // asked before the write (after it, they are gone).
        let holds = crate::fleet::held::fleet_holds(self.holds.as_ref()).await;
        let releases = holds.lines(Some(HoldCause::RolledBack));
        if !dry_run {
            self.ensure_store_id().await?;
            for _ in 0..2 {
                let pair = self.client.get_key(&full).await?;
                before = pair.as_ref().map(|p| p.modify_index);
                let op = [TxnOp::put_cas(&full, value.as_bytes(), before.unwrap_or(0))];
                if let TxnOutcome::Committed(_) =
                    self.client.txn_advancing(&self.prefix, &op).await?
                {
                    written = true;
                    break;
                }
            }
            if !written {
                return Err(Failure::conflict(format!(
                    "{RELEASE_ROLLBACK_KEY} changed twice while being written; run again"
                )));
            }
        }
        if self.json {
            self.print_json(json!({
                "ok": true,
                "key": RELEASE_ROLLBACK_KEY,
                "value": value,
                "modify_index_before": before,
                "written": written,
                "dry_run": dry_run,
                "held": holds.json(),
                "releases": releases,
            }));
        } else if written {
            println!(
                "{RELEASE_ROLLBACK_KEY} written ({value}): every agent now follows Consul for \
                 the keys it held since Consul's data went backwards{}",
                match (&holds, releases.is_empty()) {
                    (Holds::Unknown(why), _) => format!(" (which: not known here: {why})"),
                    (_, true) => " (Prometheus showed none held just before)".to_string(),
                    (_, false) => format!(
                        "; released, as Prometheus showed them just before:\n  {}",
                        releases.join("\n  ")
                    ),
                }
            );
        } else {
            match (&holds, releases.is_empty()) {
                (Holds::Unknown(why), _) => println!(
                    "dry run: {RELEASE_ROLLBACK_KEY} not written; it would release every key \
                     the agents hold since Consul's data went backwards (which: not known \
                     here: {why})"
                ),
                (Holds::Known { base, agents, .. }, true) => println!(
                    "dry run: {RELEASE_ROLLBACK_KEY} not written; no agent holds a key since \
                     Consul's data went backwards (Prometheus at {base}, {}): it would release \
                     nothing",
                    agents_text(*agents)
                ),
                (Holds::Known { base, agents, .. }, false) => println!(
                    "dry run: {RELEASE_ROLLBACK_KEY} not written; it would release, on every \
                     agent, the keys held since Consul's data went backwards (Prometheus at \
                     {base}, {}), which then answer Consul's value:\n  {}",
                    agents_text(*agents),
                    releases.join("\n  ")
                ),
            }
        }
        Ok(())
    }

    /// `state migrate-records` ([`crate::consul::ConsulClient::migrate_records`]).
    pub(super) async fn migrate_records(&self, dry_run: bool) -> Result<(), Failure> {
        if !dry_run {
            self.ensure_store_id().await?;
        }
        let m = self.client.migrate_records(&self.prefix, dry_run).await?;
        let to = records_prefix(&self.prefix);
        match self.json {
            true => self.print_json(json!({"ok": m.raced == 0, "records": m.found,
                "moved": m.moved, "changed_meanwhile": m.raced, "to": to, "dry_run": dry_run})),
            false if dry_run => println!("dry run: {} records would move to {to}", m.found),
            false => println!("{} of {} records moved to {to}", m.moved, m.found),
        }
        match m.raced {
            0 => Ok(()),
            n => Err(Failure::conflict(format!(
                "{n} records changed meanwhile; run again"
            ))),
        }
    }
}
