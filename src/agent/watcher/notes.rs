//! What the watcher says: the core's notes and the served state's changes
//! as log lines and metrics, and the start and end of a Consul outage.

use std::time::{Instant, SystemTime};

use tracing::{info, warn};

use super::Watcher;
use crate::agent::metrics::ConsulOutcome;
use crate::consul::ConsulError;
use crate::decision::served::Change;
use crate::decision::{BehindStep, Note};

impl Watcher {
    pub(super) fn on_sync(&self) {
        let mut sync = self.shared.sync.lock().unwrap();
        if let Some(since) = sync.failing_since.take() {
            info!(
                consul_addr = %self.client().addr(),
                outage_seconds = since.elapsed().as_secs(),
                "Consul reachable again"
            );
        }
        sync.last_error = None;
        sync.last_sync = Some(SystemTime::now());
        drop(sync);
        self.shared
            .metrics
            .last_sync_timestamp
            .set(crate::agent::metrics::unix_now());
        if let Some(served) = self.core.served() {
            crate::agent::notify::status(&format!(
                "synced, {} keys, index {}",
                served.consul_key_count(),
                served.index
            ));
        }
    }

    pub(super) fn on_failure(&self, error: &ConsulError) {
        let mut sync = self.shared.sync.lock().unwrap();
        let since = *sync.failing_since.get_or_insert_with(Instant::now);
        let first_failure = sync.last_error.is_none();
        sync.last_error = Some(error.to_string());
        drop(sync);
        let serving = self.core.served().is_some();
        if first_failure {
            let note = outage_note(serving);
            warn!(consul_addr = %self.client().addr(), error = %error, "Consul request failed; {note}");
        }
        let copy = if serving {
            "serving last state"
        } else {
            "no state yet, not answering"
        };
        crate::agent::notify::status(&format!(
            "Consul reads failing for {}s, {copy}: {error}",
            since.elapsed().as_secs()
        ));
    }

    /// Logs and counts one note of the core.
    pub(super) fn note(&mut self, note: &Note) {
        if matches!(note, Note::Applied { .. }) {
            // The reads that decided the answer are logged before it.
            self.end_forbidden();
        }
        let metrics = &self.shared.metrics;
        match note {
            Note::Acl { enabled } => info!(
                acl_enabled = enabled,
                "Consul ACLs {}",
                if *enabled {
                    "enabled (or unknown): keys an answer lacks are read directly"
                } else {
                    "disabled: one request per change"
                }
            ),
            Note::NotModified => metrics.consul_request(ConsulOutcome::NotModified),
            Note::Applied { index, changes } => {
                metrics.state_changes.inc_by(
                    changes
                        .iter()
                        .filter(|c| matches!(c, Change::Served { .. }))
                        .count() as u64,
                );
                // The first answer and a mass change (a restore, a delete
                // of the prefix) in one line: journald's rate limit would
                // drop a line per key, and every line after them.
                match crate::agent::log_summary::summarise(changes, !self.shared.readiness.is_synced()) {
                    Some(summary) => summary.log(*index),
                    None => changes.iter().for_each(|c| log_change(c, *index)),
                }
            }
            // Readiness follows in `step`, once the state is published.
            Note::FirstSync => {
                metrics.synced.set(1);
                info!(consul_addr = %self.client().addr(), "first Consul sync applied; answering agent-checks");
            }
            Note::IndexReset {
                previous,
                index,
                reaped: true,
            } => {
                metrics.tombstones_reaped.inc();
                info!(
                    consul_index = index,
                    previous,
                    "X-Consul-Index went back with nothing moved: a tombstone was reaped, not a loss"
                );
            }
            Note::IndexReset {
                previous,
                index,
                reaped: false,
            } => {
                metrics.consul_index_resets.inc();
                warn!(
                    consul_index = index,
                    previous, "X-Consul-Index went backwards: Consul's data went backwards (a restart or a restore); drain and maint that would be undone are held"
                );
            }
            Note::StoreChanged { previous, now } => {
                metrics.store_changes.inc();
                warn!(
                    previous = %previous,
                    now = now.as_deref().unwrap_or("absent"),
                    "the store id below the prefix vanished or changed: Consul's data went backwards (a rebuilt or restarted store); drain and maint that would be undone are held"
                );
            }
            Note::GenerationLost { served, now } => {
                metrics.generation_lost.inc();
                warn!(
                    served_generation = served.number,
                    generation = now.map(|g| g.number),
                    "the write generation below the prefix does not descend from the one served: Consul's data went backwards (a restored snapshot, then writes); drain and maint that would be undone are held"
                );
            }
            Note::Confirmed { last_contact } => {
                let at = Instant::now().checked_sub(*last_contact);
                let mut sync = self.shared.sync.lock().unwrap();
                if at.is_some() && at > sync.confirmed_at {
                    sync.confirmed_at = at;
                }
            }
            Note::Unconfirmed { reason } => info!(
                reason = reason.as_str(),
                "index check could not confirm the state served is Consul's latest"
            ),
            Note::ParkedBehind {
                parked,
                index,
                then,
            } => match then {
                BehindStep::Waits => {}
                BehindStep::Reissued => info!(
                    parked_index = parked,
                    consul_index = index,
                    "the blocking query is parked behind Consul's index (its server may be cut off): re-issued"
                ),
                BehindStep::Replaced => warn!(
                    parked_index = parked,
                    consul_index = index,
                    checks = crate::decision::REPLACE_UNANSWERED_AFTER,
                    "the re-issued blocking query went unanswered while index checks showed Consul past it: replaced by a full read"
                ),
            },
            Note::IndexBelow { parked, index } => info!(
                parked_index = parked,
                consul_index = index,
                "index check below the blocking query's index (a restored snapshot or a reaped tombstone): reading again from 0"
            ),
            Note::NotMoved { index } => warn!(
                consul_index = index,
                "an answer that did not move past the served index shows other keys or values: Consul lost data; drain and maint that would be undone are held"
            ),
            Note::StaleHeld {
                reason,
                index,
                served_index,
            } => {
                metrics.stale_held(*reason);
                info!(
                    consul_index = index,
                    held_index = served_index,
                    reason = reason.as_str(),
                    "stale answer held; confirming with a default-consistency read"
                );
            }
            Note::Refused(reason) => {
                metrics.consul_answer_refused(*reason);
                info!(
                    reason = reason.as_str(),
                    "answer's index is past every key it shows: reading once more, fresh"
                );
            }
            Note::FilteredByAcls => {
                metrics.filtered_answers.inc();
            }
            Note::Probed {
                key,
                result,
                already_hidden,
            } => {
                metrics.key_reads.with_label_values(&[result]).inc();
                // A key already held hidden is read again at every answer
                // that lacks it: counted, not logged again. A policy that
                // denies thousands of keys: a line each for the first few,
                // one for the rest once the answer is done.
                if *result == "forbidden" && !*already_hidden && self.forbidden.add(key) {
                    warn!(key = %key, "the token may no longer read this key: answering its last state (held, hidden)");
                }
            }
            Note::RecordsListed { unknown, denied } => match denied {
                true => warn!(
                    "the token may not list the writer's records beside the prefix (403): a key it may not read that the writer wrote is not found; grant it read on the records prefix"
                ),
                false if *unknown > 0 => info!(
                    unknown,
                    "writer records name keys no answer shows: reading them directly"
                ),
                false => {}
            },
            Note::StoreMoved => warn!(
                "the store id changed while keys an answer lacked were read: Consul lost data; reading the prefix again"
            ),
            Note::ReadCheckDenied => warn!(
                "the token may not read every key under the prefix (read check 403): keeping the served state"
            ),
        }
    }
}

pub(super) fn log_change(change: &Change, index: u64) {
    let show = |s: Option<crate::model::value::AdminState>| {
        s.map_or_else(|| "none".to_string(), |s| s.to_string())
    };
    match change {
        Change::Served {
            key,
            from,
            to: None,
        } => info!(
            key = %key,
            previous = %show(*from),
            consul_index = index,
            "key removed (or skipped); servers fall back to their next key or ready"
        ),
        Change::Served { key, from, to } => info!(
            key = %key,
            value = %show(*to),
            previous = %show(*from),
            consul_index = index,
            "desired state applied"
        ),
        Change::Invalid { key, error, held } => match held {
            Some(state) => {
                warn!(key = %key, error = %error, held = %state, consul_index = index, "invalid value; answering the key's last valid value (held) until a valid one is written")
            }
            None => {
                warn!(key = %key, error = %error, consul_index = index, "invalid value with no valid state known: skipped, the next identity on the line decides")
            }
        },
        Change::Held { key, state, cause } => {
            warn!(key = %key, held = %show(*state), cause = cause.as_str(), consul_index = index, "holding the key's state")
        }
        Change::Released { key, cause } => {
            info!(key = %key, cause = cause.as_str(), consul_index = index, "hold released: Consul's value applies")
        }
        Change::ReleasedAll { keys } => info!(
            keys,
            consul_index = index,
            "release-rollback written: releasing every key held since Consul lost its data"
        ),
    }
}

/// What HAProxy gets while Consul cannot be read, for the log line that
/// opens an outage: the last state when there is one, no answer before.
fn outage_note(serving: bool) -> &'static str {
    if serving {
        "serving the last copy"
    } else {
        "not synced yet, answering nobody"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_without_a_state_is_not_logged_as_serving_one() {
        assert_eq!(outage_note(true), "serving the last copy");
        assert_eq!(outage_note(false), "not synced yet, answering nobody");
    }
}
