//! `state release-rollback`: the one operator action that releases, on every
//! agent at once, the keys held since Consul's data went backwards (the
//! agent's guard).

use serde_json::json;

use super::error::Failure;
use super::session::Writer;
use crate::model::identity::RELEASE_ROLLBACK_KEY;

impl Writer {
    /// Writes `<prefix>`[`RELEASE_ROLLBACK_KEY`] with the time of the
    /// release, so its ModifyIndex changes; every agent sees it through its
    /// blocking query on the prefix and stops holding. Compare-and-set on
    /// the ModifyIndex read; two releases at once both succeed in effect,
    /// so a lost race is retried once.
    pub(super) async fn release_rollback(&self, dry_run: bool) -> Result<(), Failure> {
        let full = self.full(RELEASE_ROLLBACK_KEY);
        let value = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
        let mut written = false;
        let mut before = None;
        if !dry_run {
            self.ensure_store_id().await?;
            for _ in 0..2 {
                let pair = self.client.get_key(&full).await?;
                before = pair.as_ref().map(|p| p.modify_index);
                if self
                    .client
                    .put_cas(&full, value.as_bytes(), before.unwrap_or(0))
                    .await?
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
            }));
        } else if written {
            println!(
                "{RELEASE_ROLLBACK_KEY} written ({value}): every agent now follows Consul for \
                 the keys it held since Consul's data went backwards"
            );
        } else {
            println!(
                "dry run: {RELEASE_ROLLBACK_KEY} not written; it would release every key the \
                 agents hold since Consul's data went backwards"
            );
        }
        Ok(())
    }
}
