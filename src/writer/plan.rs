//! Drain and undrain sequences as pure plans: from what each key holds now to
//! an ordered list of writes and waits, each write a set of compare-and-set
//! operations that leaves every key with a valid value.

use std::collections::HashMap;
use std::time::Duration;

use crate::consul::KvPair;
use crate::state::{parse_value, AdminState, Entry, KeyState, Snapshot};

/// What one key holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// No such key.
    Absent,
    /// A value the agent answers with.
    Valid {
        /// The parsed value.
        state: AdminState,
        /// The key's ModifyIndex.
        index: u64,
    },
    /// A value the agent refuses.
    Invalid {
        /// Why it is refused.
        reason: String,
        /// The raw value, for display.
        raw: String,
        /// The key's ModifyIndex.
        index: u64,
    },
}

impl Current {
    /// From a KV pair, or `Absent` for `None`.
    pub fn from_pair(pair: Option<&KvPair>) -> Current {
        match pair {
            None => Current::Absent,
            Some(p) => match parse_value(&p.value) {
                Ok(state) => Current::Valid {
                    state,
                    index: p.modify_index,
                },
                Err(e) => Current::Invalid {
                    reason: e.to_string(),
                    raw: show_raw(&p.value),
                    index: p.modify_index,
                },
            },
        }
    }

    /// The ModifyIndex a compare-and-set must name: 0 for absent.
    pub fn index(&self) -> u64 {
        match self {
            Current::Absent => 0,
            Current::Valid { index, .. } | Current::Invalid { index, .. } => *index,
        }
    }

    /// How it is shown: `absent`, the canonical value, or `invalid "raw"`.
    pub fn describe(&self) -> String {
        match self {
            Current::Absent => "absent".into(),
            Current::Valid { state, .. } => state.to_string(),
            Current::Invalid { raw, .. } => format!("invalid {raw}"),
        }
    }
}

/// A raw KV value for display: quoted, escaped, at most 40 characters.
pub fn show_raw(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let mut shown: String = text.chars().take(40).collect();
    if text.chars().count() > 40 {
        shown.push('…');
    }
    format!("{shown:?}")
}

/// One write applied to many keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Set the key to this state.
    Set(AdminState),
    /// Delete the key.
    Clear,
}

impl Change {
    /// `drain`, `maint`, ..., or `clear`.
    pub fn describe(&self) -> String {
        match self {
            Change::Set(s) => s.to_string(),
            Change::Clear => "clear".into(),
        }
    }
}

/// Why a plan waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// Sessions on drained servers finish before maint.
    Drain,
    /// Every HAProxy applies maint before the key is cleared, so slowstart
    /// ramps the servers up.
    Maint,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write `change` to `keys`, in transactions of at most 64 operations.
    Write {
        /// What is written.
        change: Change,
        /// The keys, sorted.
        keys: Vec<String>,
    },
    /// Wait.
    Wait {
        /// How long.
        duration: Duration,
        /// Why.
        purpose: WaitFor,
    },
}

/// What happens to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlan {
    /// The key, relative to the prefix.
    pub key: String,
    /// What it holds now.
    pub before: Current,
    /// What it holds at the end: a state, or `None` for no key.
    pub after: Option<AdminState>,
    /// Why it is left alone, or what to know about it.
    pub note: Option<&'static str>,
}

impl KeyPlan {
    /// True when the plan writes this key.
    pub fn changes(&self) -> bool {
        match (&self.before, self.after) {
            (Current::Absent, None) => false,
            (Current::Valid { state, .. }, Some(after)) => *state != after,
            _ => true,
        }
    }
}

/// A sequence of steps over some keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every key asked about, sorted, changed or not.
    pub keys: Vec<KeyPlan>,
    /// The steps, in order; empty when there is nothing to do.
    pub steps: Vec<Step>,
}

fn sorted(mut targets: Vec<(String, Current)>) -> Vec<(String, Current)> {
    targets.sort_by(|a, b| a.0.cmp(&b.0));
    targets.dedup_by(|a, b| a.0 == b.0);
    targets
}

/// Drain: every key not yet at drain or maint is set to drain; after
/// `drain_wait`, every key at drain goes to maint. Keys at maint are left
/// alone; a key found at drain (an interrupted run) waits again. Leaving MAINT
/// later is what makes HAProxy's slowstart ramp the servers up.
pub fn plan_drain(targets: Vec<(String, Current)>, drain_wait: Duration) -> Plan {
    let mut to_drain = Vec::new();
    let mut to_maint = Vec::new();
    let mut keys = Vec::new();
    for (key, before) in sorted(targets) {
        let (after, note) = match &before {
            Current::Valid {
                state: AdminState::Maint,
                ..
            } => (AdminState::Maint, Some("already maint")),
            Current::Valid {
                state: AdminState::Drain,
                ..
            } => {
                to_maint.push(key.clone());
                (
                    AdminState::Maint,
                    Some("already drain: waits again, then maint"),
                )
            }
            other => {
                to_drain.push(key.clone());
                to_maint.push(key.clone());
                let note = match other {
                    Current::Valid {
                        state: AdminState::Weight(_),
                        ..
                    } => Some("its weight is replaced: undrain clears the key (ready 100%)"),
                    Current::Invalid { .. } => Some("its invalid value is replaced"),
                    _ => None,
                };
                (AdminState::Maint, note)
            }
        };
        keys.push(KeyPlan {
            key,
            before,
            after: Some(after),
            note,
        });
    }
    let mut steps = Vec::new();
    if !to_drain.is_empty() {
        steps.push(Step::Write {
            change: Change::Set(AdminState::Drain),
            keys: to_drain,
        });
    }
    if !to_maint.is_empty() {
        steps.push(Step::Wait {
            duration: drain_wait,
            purpose: WaitFor::Drain,
        });
        steps.push(Step::Write {
            change: Change::Set(AdminState::Maint),
            keys: to_maint,
        });
    }
    Plan { keys, steps }
}

/// Undrain: keys at drain go to maint first and are held there for
/// `maint_wait` (HAProxy's slowstart fires only when a server leaves MAINT);
/// then every key at maint is cleared. Keys that are absent or in service
/// (`ready`, `N%`) are left alone.
///
/// # Errors
///
/// The keys holding an invalid value, with the reason: the servers they
/// decide are frozen in an unknown state, and guessing could put a
/// server into service without slowstart. Nothing is planned.
pub fn plan_undrain(
    targets: Vec<(String, Current)>,
    maint_wait: Duration,
) -> Result<Plan, Vec<(String, String)>> {
    let targets = sorted(targets);
    let invalid: Vec<(String, String)> = targets
        .iter()
        .filter_map(|(k, c)| match c {
            Current::Invalid { reason, raw, .. } => Some((k.clone(), format!("{raw}: {reason}"))),
            _ => None,
        })
        .collect();
    if !invalid.is_empty() {
        return Err(invalid);
    }
    let mut to_maint = Vec::new();
    let mut to_clear = Vec::new();
    let mut keys = Vec::new();
    for (key, before) in targets {
        let (after, note) = match &before {
            Current::Absent => (None, Some("no key")),
            Current::Valid {
                state: AdminState::Drain,
                ..
            } => {
                to_maint.push(key.clone());
                to_clear.push(key.clone());
                (None, Some("drain: maint first, so slowstart ramps"))
            }
            Current::Valid {
                state: AdminState::Maint,
                ..
            } => {
                to_clear.push(key.clone());
                (None, None)
            }
            Current::Valid { state, .. } => (Some(*state), Some("in service: left alone")),
            Current::Invalid { .. } => unreachable!("refused above"),
        };
        keys.push(KeyPlan {
            key,
            before,
            after,
            note,
        });
    }
    let mut steps = Vec::new();
    if !to_maint.is_empty() {
        steps.push(Step::Write {
            change: Change::Set(AdminState::Maint),
            keys: to_maint,
        });
        steps.push(Step::Wait {
            duration: maint_wait,
            purpose: WaitFor::Maint,
        });
    }
    if !to_clear.is_empty() {
        steps.push(Step::Write {
            change: Change::Clear,
            keys: to_clear,
        });
    }
    Ok(Plan { keys, steps })
}

/// The snapshot the agents will hold once `keys` reached their `after`
/// values: for showing what the fleet will answer.
pub fn snapshot_after(snapshot: &Snapshot, keys: &[KeyPlan]) -> Snapshot {
    let mut out = snapshot.clone();
    for k in keys {
        match k.after {
            None => {
                out.keys.remove(k.key.as_str());
            }
            Some(state) => {
                let modify_index = out
                    .keys
                    .get(k.key.as_str())
                    .map_or(0, |s: &KeyState| s.modify_index);
                out.keys.insert(
                    k.key.as_str().into(),
                    KeyState {
                        entry: Entry::Valid(state),
                        modify_index,
                    },
                );
            }
        }
    }
    out
}

/// The current value of each key in `keys`, from the pairs of one prefix
/// read (keys relative to `prefix`).
pub fn currents(prefix: &str, pairs: &[KvPair], keys: &[String]) -> Vec<(String, Current)> {
    let by_key: HashMap<&str, &KvPair> = pairs
        .iter()
        .filter_map(|p| p.key.strip_prefix(prefix).map(|rel| (rel, p)))
        .collect();
    keys.iter()
        .map(|k| {
            (
                k.clone(),
                Current::from_pair(by_key.get(k.as_str()).copied()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(state: AdminState, index: u64) -> Current {
        Current::Valid { state, index }
    }

    fn write(change: Change, keys: &[&str]) -> Step {
        Step::Write {
            change,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    const W: Duration = Duration::from_secs(60);

    #[test]
    fn drain_goes_through_drain_then_maint_and_skips_maint() {
        let plan = plan_drain(
            vec![
                ("web/b".into(), Current::Absent),
                ("web/a".into(), valid(AdminState::Weight(50), 3)),
                ("web/c".into(), valid(AdminState::Maint, 4)),
                ("web/d".into(), valid(AdminState::Drain, 5)),
                ("web/e".into(), valid(AdminState::Ready, 6)),
            ],
            W,
        );
        assert_eq!(
            plan.steps,
            vec![
                write(Change::Set(AdminState::Drain), &["web/a", "web/b", "web/e"]),
                Step::Wait {
                    duration: W,
                    purpose: WaitFor::Drain
                },
                write(
                    Change::Set(AdminState::Maint),
                    &["web/a", "web/b", "web/d", "web/e"]
                ),
            ]
        );
        assert_eq!(plan.keys[0].key, "web/a");
        assert!(plan.keys[0].note.unwrap().contains("weight"));
        assert!(!plan.keys[2].changes(), "maint stays");
        assert!(plan.keys.iter().all(|k| k.after == Some(AdminState::Maint)));
    }

    #[test]
    fn drain_of_maint_only_is_nothing() {
        let plan = plan_drain(vec![("canary".into(), valid(AdminState::Maint, 9))], W);
        assert!(plan.steps.is_empty());
    }

    #[test]
    fn interrupted_drain_waits_again() {
        let plan = plan_drain(vec![("canary".into(), valid(AdminState::Drain, 9))], W);
        assert_eq!(
            plan.steps,
            vec![
                Step::Wait {
                    duration: W,
                    purpose: WaitFor::Drain
                },
                write(Change::Set(AdminState::Maint), &["canary"]),
            ]
        );
    }

    #[test]
    fn undrain_goes_through_maint_and_leaves_service_alone() {
        let plan = plan_undrain(
            vec![
                ("web/a".into(), valid(AdminState::Drain, 3)),
                ("web/b".into(), valid(AdminState::Maint, 4)),
                ("web/c".into(), valid(AdminState::Weight(50), 5)),
                ("web/d".into(), Current::Absent),
            ],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            plan.steps,
            vec![
                write(Change::Set(AdminState::Maint), &["web/a"]),
                Step::Wait {
                    duration: Duration::from_secs(5),
                    purpose: WaitFor::Maint
                },
                write(Change::Clear, &["web/a", "web/b"]),
            ]
        );
        assert_eq!(plan.keys[2].after, Some(AdminState::Weight(50)));
        assert!(!plan.keys[2].changes());
        assert!(!plan.keys[3].changes());
    }

    #[test]
    fn undrain_from_maint_needs_no_wait() {
        let plan = plan_undrain(
            vec![("canary".into(), valid(AdminState::Maint, 3))],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(plan.steps, vec![write(Change::Clear, &["canary"])]);
    }

    #[test]
    fn undrain_refuses_invalid_values() {
        let err = plan_undrain(
            vec![(
                "canary".into(),
                Current::from_pair(Some(&KvPair {
                    key: "p/canary".into(),
                    value: b"drian".to_vec(),
                    modify_index: 7,
                    flags: 0,
                })),
            )],
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(err[0].0, "canary");
        assert!(err[0].1.contains("drian"));
    }

    #[test]
    fn snapshot_after_applies_final_values() {
        let snap = Snapshot::default();
        let plan = plan_drain(vec![("canary".into(), Current::Absent)], W);
        let after = snapshot_after(&snap, &plan.keys);
        assert_eq!(
            after.lookup(["web/x", "canary"]),
            crate::state::Answer::State {
                state: AdminState::Maint,
                decided_by: Some(1)
            }
        );
    }
}
