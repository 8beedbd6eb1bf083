//! Hold rules between a Consul answer and the copy served: the two cases
//! where following Consul to the letter would put a server that someone
//! took out back in rotation.
//!
//! - **Invalid value after a valid one.** A key whose value becomes invalid
//!   (`mantenance`) keeps being answered with its last valid value while the
//!   agent runs: no answer would keep HAProxy's state only until HAProxy
//!   reloads. An agent that starts with an invalid value knows no valid one
//!   and gives no answer for the servers it decides.
//! - **Consul came back without its data.** When the index goes backwards
//!   (a `-dev` restart, a rebuilt cluster, an old snapshot restored; Consul's
//!   docs, api-docs/features/blocking), keys that held drain, maint or a
//!   weight and are now missing or `ready` keep their previous value. They
//!   are released by a new write to the key (its ModifyIndex changes, or it
//!   appears), or for every key at once by a write to
//!   `<prefix>`[`RELEASE_ROLLBACK_KEY`] (`state release-rollback`), which
//!   reaches every agent through the same blocking query.
//!
//! Deletes and `ready` writes with a forward-moving index apply at once.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use tracing::{info, warn};

use crate::consul::PrefixAnswer;
use crate::model::identity::RELEASE_ROLLBACK_KEY;
use crate::model::snapshot::{Entry, KeyState, Snapshot};
use crate::model::value::{AdminState, InvalidValue};

/// Why a key is answered with another value than the one in Consul.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldCause {
    /// The current value is invalid; the last valid one is answered.
    InvalidValue(InvalidValue),
    /// Consul's index went backwards and the key vanished or went to
    /// `ready`; its value from before is answered.
    RolledBack,
}

impl HoldCause {
    /// `invalid_value` or `rolled_back`, for `/status`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HoldCause::InvalidValue(_) => "invalid_value",
            HoldCause::RolledBack => "rolled_back",
        }
    }
}

/// One key answered with a held value, for `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// The state answered.
    pub state: AdminState,
    /// Why.
    pub cause: HoldCause,
    /// What Consul holds now: the ModifyIndex of the key, `None` if absent.
    pub consul_modify_index: Option<u64>,
    /// When the hold began.
    pub since: SystemTime,
}

/// The keys held, by key relative to the prefix.
pub type HeldKeys = BTreeMap<Box<str>, HeldKey>;

#[derive(Debug, Clone)]
struct RollbackHold {
    state: AdminState,
    /// The key's ModifyIndex in Consul when held (`None`: absent). Any other
    /// value later is a new write, which releases the hold.
    modify_index: Option<u64>,
    since: SystemTime,
}

/// The hold state of one watcher. Lives as long as the agent process.
#[derive(Debug, Default)]
pub struct Guard {
    rollback: HashMap<Box<str>, RollbackHold>,
    /// ModifyIndex of [`RELEASE_ROLLBACK_KEY`] in the last answer (`None`:
    /// absent); a different one in a forward answer releases every
    /// rollback hold.
    release_mark: Option<u64>,
    /// Keys held for an invalid value, with the ModifyIndex logged.
    invalid: HashMap<Box<str>, (u64, SystemTime)>,
    held: HeldKeys,
}

/// The ModifyIndex of [`RELEASE_ROLLBACK_KEY`] in an answer.
pub fn release_mark(prefix: &str, answer: &PrefixAnswer) -> Option<u64> {
    answer
        .pairs
        .iter()
        .find(|p| {
            p.key
                .strip_prefix(prefix)
                .is_some_and(|rel| rel == RELEASE_ROLLBACK_KEY)
        })
        .map(|p| p.modify_index)
}

impl Guard {
    /// Builds the copy to serve from `raw` (the snapshot of Consul's answer),
    /// given `served` (the copy served until now, `None` before the first),
    /// `mark` (the answer's [`release_mark`]) and `rolled_back` (the answer's
    /// index went backwards, or did not move on a full read after a
    /// failure: Consul may be another store).
    pub fn apply(
        &mut self,
        served: Option<&Snapshot>,
        mut raw: Snapshot,
        mark: Option<u64>,
        rolled_back: bool,
    ) -> Snapshot {
        let now = SystemTime::now();
        let index = raw.index;
        let current = |raw: &Snapshot, key: &str| raw.keys.get(key).map(|k| k.modify_index);

        // Releases.
        if !rolled_back && mark.is_some() && mark != self.release_mark && !self.rollback.is_empty()
        {
            info!(
                keys = self.rollback.len(),
                consul_index = index,
                "{RELEASE_ROLLBACK_KEY} written: releasing every key held since Consul's data went backwards"
            );
            self.rollback.clear();
        }
        self.release_mark = mark;
        self.rollback.retain(|key, hold| {
            let now_at = current(&raw, key);
            if rolled_back {
                // Consul went backwards again: this is not a write.
                hold.modify_index = now_at;
                return true;
            }
            let keep = now_at == hold.modify_index;
            if !keep {
                info!(key = %key, held = %hold.state, consul_index = index, "key written since Consul's data went backwards: hold released, its value applies");
            }
            keep
        });

        // New rollback holds: drain, maint or a weight that vanished or went
        // to ready.
        if rolled_back {
            if let Some(served) = served {
                for (key, before) in &served.keys {
                    let Entry::Valid(state) = before.entry else {
                        continue;
                    };
                    if state == AdminState::Ready || self.rollback.contains_key(key) {
                        continue;
                    }
                    let gone = match raw.keys.get(key) {
                        None => true,
                        Some(k) => k.entry == Entry::Valid(AdminState::Ready),
                    };
                    if gone {
                        warn!(
                            key = %key,
                            held = %state,
                            consul_index = index,
                            now = raw.keys.get(key).map_or("absent", |_| "ready"),
                            "Consul's data went backwards: holding the key's previous value until it is written again or `state release-rollback`"
                        );
                        self.rollback.insert(
                            key.clone(),
                            RollbackHold {
                                state,
                                modify_index: current(&raw, key),
                                since: now,
                            },
                        );
                    }
                }
            }
        }

        let mut held = HeldKeys::new();
        for (key, hold) in &self.rollback {
            let consul_modify_index = current(&raw, key);
            raw.keys.insert(
                key.clone(),
                KeyState {
                    entry: Entry::Valid(hold.state),
                    modify_index: consul_modify_index.unwrap_or(0),
                },
            );
            held.insert(
                key.clone(),
                HeldKey {
                    state: hold.state,
                    cause: HoldCause::RolledBack,
                    consul_modify_index,
                    since: hold.since,
                },
            );
        }

        // Invalid values after a valid one.
        let mut invalid = HashMap::new();
        for (key, ks) in raw.keys.iter_mut() {
            let Entry::Invalid(error) = &ks.entry else {
                continue;
            };
            if matches!(error, InvalidValue::Key(_)) {
                // No agent-send line can name it.
                continue;
            }
            let Some(Entry::Valid(state)) = served.and_then(|s| s.keys.get(key)).map(|k| &k.entry)
            else {
                continue;
            };
            let state = *state;
            let since = match self.invalid.get(key) {
                Some((logged, since)) if *logged == ks.modify_index => *since,
                Some((_, since)) => {
                    warn!(key = %key, error = %error, held = %state, modify_index = ks.modify_index, "invalid value; still answering the last valid value (held)");
                    *since
                }
                None => {
                    warn!(key = %key, error = %error, held = %state, modify_index = ks.modify_index, "invalid value; answering the key's last valid value (held) until a valid one is written");
                    now
                }
            };
            invalid.insert(key.clone(), (ks.modify_index, since));
            held.insert(
                key.clone(),
                HeldKey {
                    state,
                    cause: HoldCause::InvalidValue(error.clone()),
                    consul_modify_index: Some(ks.modify_index),
                    since,
                },
            );
            ks.entry = Entry::Valid(state);
        }
        for key in self.invalid.keys() {
            if !invalid.contains_key(key) {
                info!(key = %key, consul_index = index, "invalid value replaced or removed: hold released");
            }
        }
        self.invalid = invalid;
        self.held = held;
        raw
    }

    /// The keys held now.
    pub fn held(&self) -> &HeldKeys {
        &self.held
    }

    /// How many keys are held after a rollback.
    pub fn rollback_count(&self) -> usize {
        self.rollback.len()
    }

    /// How many keys are held for an invalid value.
    pub fn invalid_count(&self) -> usize {
        self.invalid.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::value::parse_value;

    fn snap(index: u64, pairs: &[(&str, &str, u64)]) -> Snapshot {
        let keys = pairs
            .iter()
            .map(|(k, v, mi)| {
                let entry = match parse_value(v.as_bytes()) {
                    Ok(s) => Entry::Valid(s),
                    Err(e) => Entry::Invalid(e),
                };
                (
                    (*k).into(),
                    KeyState {
                        entry,
                        modify_index: *mi,
                    },
                )
            })
            .collect();
        Snapshot { index, keys }
    }

    fn entry(s: &Snapshot, key: &str) -> Option<Entry> {
        s.keys.get(key).map(|k| k.entry.clone())
    }

    #[test]
    fn an_invalid_value_after_a_valid_one_is_held_and_a_valid_one_releases_it() {
        let mut g = Guard::default();
        let a = g.apply(None, snap(5, &[("web/s1", "maint", 5)]), None, false);
        let b = g.apply(
            Some(&a),
            snap(6, &[("web/s1", "mantenance", 6)]),
            None,
            false,
        );
        assert_eq!(entry(&b, "web/s1"), Some(Entry::Valid(AdminState::Maint)));
        assert_eq!(g.invalid_count(), 1);
        assert_eq!(g.held()["web/s1"].cause.as_str(), "invalid_value");
        // Still held on the next answer.
        let c = g.apply(
            Some(&b),
            snap(7, &[("web/s1", "mantenance", 6), ("x", "drain", 7)]),
            None,
            false,
        );
        assert_eq!(entry(&c, "web/s1"), Some(Entry::Valid(AdminState::Maint)));
        let d = g.apply(Some(&c), snap(8, &[("web/s1", "ready", 8)]), None, false);
        assert_eq!(entry(&d, "web/s1"), Some(Entry::Valid(AdminState::Ready)));
        assert_eq!(g.invalid_count(), 0);
        // An agent that starts with an invalid value has nothing to hold.
        let mut fresh = Guard::default();
        let e = fresh.apply(None, snap(6, &[("web/s1", "mantenance", 6)]), None, false);
        assert!(matches!(entry(&e, "web/s1"), Some(Entry::Invalid(_))));
    }

    #[test]
    fn after_a_rollback_drain_maint_and_weights_are_held_until_written_or_released() {
        let mut g = Guard::default();
        let before = snap(
            100,
            &[
                ("canary", "drain", 90),
                ("web/a", "maint", 91),
                ("web/b", "50%", 92),
                ("web/c", "ready", 93),
                ("web/d", "drain", 94),
            ],
        );
        let a = g.apply(None, before, None, false);
        // Consul restarted empty but for two keys written since.
        let b = g.apply(
            Some(&a),
            snap(3, &[("web/b", "ready", 2), ("web/d", "maint", 3)]),
            None,
            true,
        );
        assert_eq!(entry(&b, "canary"), Some(Entry::Valid(AdminState::Drain)));
        assert_eq!(entry(&b, "web/a"), Some(Entry::Valid(AdminState::Maint)));
        assert_eq!(
            entry(&b, "web/b"),
            Some(Entry::Valid(AdminState::Weight(50)))
        );
        assert_eq!(entry(&b, "web/c"), None, "ready vanishing is no loss");
        assert_eq!(
            entry(&b, "web/d"),
            Some(Entry::Valid(AdminState::Maint)),
            "a non-ready value applies"
        );
        assert_eq!(g.rollback_count(), 3);
        // A forward answer that does not touch them keeps them held.
        let c = g.apply(
            Some(&b),
            snap(
                4,
                &[
                    ("web/b", "ready", 2),
                    ("web/d", "maint", 3),
                    ("x", "ready", 4),
                ],
            ),
            None,
            false,
        );
        assert_eq!(entry(&c, "web/a"), Some(Entry::Valid(AdminState::Maint)));
        // A write to a held key releases it.
        let d = g.apply(
            Some(&c),
            snap(
                5,
                &[
                    ("web/a", "ready", 5),
                    ("web/b", "ready", 2),
                    ("web/d", "maint", 3),
                ],
            ),
            None,
            false,
        );
        assert_eq!(entry(&d, "web/a"), Some(Entry::Valid(AdminState::Ready)));
        assert_eq!(g.rollback_count(), 2);
        // The release key releases the rest.
        let e = g.apply(
            Some(&d),
            snap(6, &[("web/a", "ready", 5), ("web/b", "ready", 2)]),
            Some(6),
            false,
        );
        assert_eq!(entry(&e, "canary"), None);
        assert_eq!(entry(&e, "web/b"), Some(Entry::Valid(AdminState::Ready)));
        assert_eq!(g.rollback_count(), 0);
        assert!(g.held().is_empty());
    }

    #[test]
    fn a_release_mark_restored_with_old_data_releases_nothing() {
        let mut g = Guard::default();
        let a = g.apply(None, snap(100, &[("canary", "drain", 90)]), Some(50), false);
        // The restored store has an old release mark: not a new write.
        let b = g.apply(Some(&a), snap(40, &[]), Some(30), true);
        assert_eq!(entry(&b, "canary"), Some(Entry::Valid(AdminState::Drain)));
        let c = g.apply(Some(&b), snap(41, &[("x", "ready", 41)]), Some(30), false);
        assert_eq!(entry(&c, "canary"), Some(Entry::Valid(AdminState::Drain)));
        let d = g.apply(Some(&c), snap(42, &[]), Some(42), false);
        assert_eq!(entry(&d, "canary"), None);
    }

    #[test]
    fn deletes_with_a_forward_index_apply_at_once() {
        let mut g = Guard::default();
        let a = g.apply(None, snap(10, &[("canary", "drain", 9)]), None, false);
        let b = g.apply(Some(&a), snap(11, &[]), None, false);
        assert_eq!(entry(&b, "canary"), None);
        assert!(g.held().is_empty());
    }
}
