//! The writer's commands as pure plans (drain, undrain, and `set` or `clear`
//! of one key): from what each key holds now to an ordered list of writes
//! and waits, each write a set of compare-and-set operations that leaves
//! every key with a valid value.
//!
//! Row keys written by `state drain` carry the drain mark in their Consul
//! Flags (odd Flags, [`DRAIN_FLAGS`]); a row key at drain, maint or `0%`
//! without it was set by hand, and the drain and undrain plans leave it
//! alone. A group key (`canary`, `zone-b`) is one fleet-wide switch with no
//! mark: the plans take it over whoever set it, and write it with Flags 0.

use std::collections::HashMap;
use std::time::Duration;

use crate::cli::RampArgs;
use crate::consul::KvPair;
use crate::model::marks::{is_drain_mark, DRAIN_FLAGS};
use crate::model::snapshot::{Entry, KeyState, Snapshot};
use crate::model::value::{parse_value, AdminState};

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
        /// The key's Consul Flags (odd: written by `state drain`).
        flags: u64,
    },
    /// A value the agent refuses.
    Invalid {
        /// Why it is refused.
        reason: String,
        /// The raw value, for display.
        raw: String,
        /// The key's ModifyIndex.
        index: u64,
        /// The key's Consul Flags.
        flags: u64,
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
                    flags: p.flags,
                },
                Err(e) => Current::Invalid {
                    reason: e.to_string(),
                    raw: show_raw(&p.value),
                    index: p.modify_index,
                    flags: p.flags,
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

    /// The key's Consul Flags: 0 for absent.
    pub fn flags(&self) -> u64 {
        match self {
            Current::Absent => 0,
            Current::Valid { flags, .. } | Current::Invalid { flags, .. } => *flags,
        }
    }

    /// True when the key carries a drain mark (odd Flags): `state drain`
    /// wrote it. False for an absent key and for even Flags (a key set by
    /// hand).
    pub fn by_drain(&self) -> bool {
        is_drain_mark(self.flags())
    }

    /// True for a key at drain, maint or `0%` that `state drain` did not
    /// write: someone took the server out on purpose (`state set`, `consul
    /// kv put`), and the drain and undrain plans leave it alone. A key at a
    /// weight above 0 is in service: a drain replaces it.
    pub fn set_by_hand(&self) -> bool {
        matches!(
            self,
            Current::Valid {
                state: AdminState::Drain | AdminState::Maint | AdminState::Weight(0),
                ..
            }
        ) && !self.by_drain()
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

/// A key's state as shown: the canonical value, or `absent` for `None`.
pub fn shown(state: Option<AdminState>) -> String {
    state.map_or("absent".into(), |s| s.to_string())
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
    /// The state written; `None` for a removal.
    pub fn state(self) -> Option<AdminState> {
        match self {
            Change::Set(s) => Some(s),
            Change::Clear => None,
        }
    }

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
    /// `--until-idle`: as [`WaitFor::Drain`], but the wait (its duration
    /// the longest) ends, after at least `at_least`, once no load balancer
    /// reports a session on the drained servers.
    Idle {
        /// The shortest wait ([`super::waits::floor`]).
        at_least: Duration,
    },
    /// Every HAProxy applies maint before the key is cleared, so slowstart
    /// ramps the servers up.
    Maint,
    /// `--ramp`: every HAProxy serves a weight step before the next.
    Ramp,
}

impl WaitFor {
    /// True for the wait between drain and maint.
    pub fn drains(self) -> bool {
        matches!(self, WaitFor::Drain | WaitFor::Idle { .. })
    }

    /// `drain`, `idle`, `maint` or `ramp`, for `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitFor::Drain => "drain",
            WaitFor::Idle { .. } => "idle",
            WaitFor::Maint => "maint",
            WaitFor::Ramp => "ramp",
        }
    }
}

/// True for a row key (`<backend>/<server>`), false for a group key such as
/// `canary` or `zone-b`.
pub fn is_row_key(key: &str) -> bool {
    key.contains('/')
}

/// The Flags a plan writes with a value on `key`: the drain mark on a row
/// key, 0 on a group key.
pub fn flags_for(key: &str) -> u64 {
    if is_row_key(key) {
        DRAIN_FLAGS
    } else {
        0
    }
}

/// The state of a key a plan leaves alone because it was set by hand: a row
/// key at drain, maint or `0%` without the drain mark. `None` for a key the
/// plan may take over, and for every group key.
/// The plan of a row key set by hand, which drain and undrain leave alone
/// ([`left_alone`]), or of a row key holding an invalid value without the
/// drain mark: agents answer its last valid value (a typo of `maint` keeps
/// the server out), so neither sequence takes it over. `None` for any
/// other key.
fn by_hand(key: &str, before: &Current, note: &'static str) -> Option<KeyPlan> {
    let hand = left_alone(key, before);
    let invalid =
        matches!(before, Current::Invalid { .. }) && is_row_key(key) && !before.by_drain();
    (hand.is_some() || invalid).then(|| KeyPlan {
        key: key.to_string(),
        before: before.clone(),
        after: hand,
        note: Some(match hand {
            Some(_) => note,
            None => "invalid value set by hand: left alone (agents answer its last valid value)",
        }),
        set_by_hand: true,
    })
}

fn left_alone(key: &str, current: &Current) -> Option<AdminState> {
    match current {
        Current::Valid { state, .. } if is_row_key(key) && current.set_by_hand() => Some(*state),
        _ => None,
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write `change` to `keys`, in transactions of at most 64 operations.
    Write {
        /// What is written.
        change: Change,
        /// The Flags each key gets with a [`Change::Set`] ([`flags_for`]:
        /// the drain mark on row keys, 0 on a group key); 0 with
        /// [`Change::Clear`].
        flags: u64,
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
    /// True when it is left alone because it is a row key at drain, maint
    /// or `0%` without a drain mark: set by hand, not by `state drain`.
    pub set_by_hand: bool,
}

impl KeyPlan {
    /// True when the plan writes this key.
    pub fn changes(&self) -> bool {
        if self.set_by_hand {
            return false;
        }
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
/// `drain_wait` (a wait for `purpose`, [`WaitFor::Drain`] or
/// [`WaitFor::Idle`]), every key at drain goes to maint. Keys at maint are left
/// alone; a key found at drain (an interrupted run) waits again. Leaving MAINT
/// later is what makes HAProxy's slowstart ramp the servers up.
///
/// A row key at drain, maint or `0%` without the drain mark was set by hand:
/// it is in no step and keeps its value. So is a row key holding an invalid
/// value without the mark: agents answer its last valid value (a typo of
/// `maint` keeps the server out), and a drain that took it over would hand
/// it to the undrain that follows, which would put the server back. A key
/// at a weight above 0 is drained, and undrain clears it. A group key is
/// taken over whatever its Flags.
pub fn plan_drain(targets: Vec<(String, Current)>, drain_wait: Duration, purpose: WaitFor) -> Plan {
    let mut to_drain = Vec::new();
    let mut to_maint = Vec::new();
    let mut keys = Vec::new();
    for (key, before) in sorted(targets) {
        if let Some(hand) = by_hand(&key, &before, "set by hand: left alone") {
            keys.push(hand);
            continue;
        }
        let note = match &before {
            Current::Valid {
                state: AdminState::Maint,
                ..
            } => Some("already maint"),
            Current::Valid {
                state: AdminState::Drain,
                ..
            } => {
                to_maint.push(key.clone());
                Some("already drain: waits again, then maint")
            }
            other => {
                to_drain.push(key.clone());
                to_maint.push(key.clone());
                match other {
                    Current::Valid {
                        state: AdminState::Weight(_),
                        ..
                    } => Some("its weight is replaced: undrain clears the key (ready 100%)"),
                    Current::Invalid { .. } => Some("its invalid value is replaced"),
                    _ => None,
                }
            }
        };
        keys.push(KeyPlan {
            key,
            before,
            after: Some(AdminState::Maint),
            note,
            set_by_hand: false,
        });
    }
    let mut steps = Vec::new();
    if !to_drain.is_empty() {
        steps.push(write_step(Change::Set(AdminState::Drain), to_drain));
    }
    if !to_maint.is_empty() {
        steps.push(Step::Wait {
            duration: drain_wait,
            purpose,
        });
        steps.push(write_step(Change::Set(AdminState::Maint), to_maint));
    }
    Plan { keys, steps }
}

/// A write of `change` to `keys` (all row keys or all group keys), with
/// their [`flags_for`].
fn write_step(change: Change, keys: Vec<String>) -> Step {
    let flags = match change {
        Change::Set(_) => keys.first().map_or(0, |k| flags_for(k)),
        Change::Clear => 0,
    };
    Step::Write {
        change,
        flags,
        keys,
    }
}

/// Undrain: keys at drain go to maint first and are held there for
/// `maint_wait` (HAProxy's slowstart fires only when a server leaves MAINT);
/// then every key at maint is cleared. Keys that are absent or in service
/// (`ready`, `N%`) are left alone.
///
/// With `--ramp` ([`RampArgs`]), every key is written each weight in turn, each held
/// for `ramp.every`, before it is cleared; a key at a weight below 100%
/// (a row key with the drain mark, or a group key: a ramp interrupted
/// there) goes on from the first step above it.
///
/// Only row keys carrying the drain mark are taken back: a row key at drain,
/// maint or `0%` without it was set by hand (a server out for repair) and is
/// in no step; `state clear` releases it. A group key is taken back whoever
/// set it. The maint written on the way carries the key's [`flags_for`], so
/// an interrupted undrain can be re-run.
///
/// # Errors
///
/// The keys holding an invalid value (but row keys without the drain mark,
/// left alone as set by hand), with the reason: the servers they decide
/// are frozen in an unknown state, and guessing could put a server into
/// service without slowstart. Nothing is planned.
pub fn plan_undrain(
    targets: Vec<(String, Current)>,
    maint_wait: Duration,
    ramp: &RampArgs,
) -> Result<Plan, Vec<(String, String)>> {
    let targets = sorted(targets);
    let invalid: Vec<(String, String)> = targets
        .iter()
        .filter_map(|(k, c)| match c {
            Current::Invalid { reason, raw, .. } if by_hand(k, c, "").is_none() => {
                Some((k.clone(), format!("{raw}: {reason}")))
            }
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
        let note = "set by hand: left alone (`state clear` releases it)";
        if let Some(hand) = by_hand(&key, &before, note) {
            keys.push(hand);
            continue;
        }
        let (after, note) = match &before {
            Current::Absent => (None, Some("no key")),
            Current::Valid {
                state: AdminState::Drain,
                ..
            } => {
                to_maint.push(key.clone());
                to_clear.push((key.clone(), 0));
                (None, Some("drain: maint first, so slowstart ramps"))
            }
            Current::Valid {
                state: AdminState::Maint,
                ..
            } => {
                to_clear.push((key.clone(), 0));
                (None, None)
            }
            // A ramp interrupted (a group key, or a row key with the drain
            // mark, below 100%): a ramp goes on from its step; a plain
            // undrain or enable finishes it rather than leave the servers
            // at a partial weight.
            Current::Valid {
                state: AdminState::Weight(w @ 1..=99),
                ..
            } if !is_row_key(&key) || before.by_drain() => {
                to_clear.push((key.clone(), *w));
                match ramp.weights().is_empty() {
                    false => (None, Some("at a ramp step: the ramp goes on from there")),
                    true => (
                        None,
                        Some("at an interrupted ramp's weight: finished, removed (ready 100%)"),
                    ),
                }
            }
            Current::Valid { state, .. } => (Some(*state), Some("in service: left alone")),
            Current::Invalid { .. } => unreachable!("refused above"),
        };
        keys.push(KeyPlan {
            key,
            before,
            after,
            note,
            set_by_hand: false,
        });
    }
    let mut steps = Vec::new();
    if !to_maint.is_empty() {
        steps.push(write_step(Change::Set(AdminState::Maint), to_maint));
        steps.push(Step::Wait {
            duration: maint_wait,
            purpose: WaitFor::Maint,
        });
    }
    for &w in ramp.weights() {
        let below: Vec<String> = to_clear
            .iter()
            .filter(|(_, at)| *at < w)
            .map(|(k, _)| k.clone())
            .collect();
        if !below.is_empty() {
            steps.push(write_step(Change::Set(AdminState::Weight(w)), below));
            steps.push(Step::Wait {
                duration: ramp.ramp_every,
                purpose: WaitFor::Ramp,
            });
        }
    }
    if !to_clear.is_empty() {
        let keys = to_clear.into_iter().map(|(k, _)| k).collect();
        steps.push(write_step(Change::Clear, keys));
    }
    Ok(Plan { keys, steps })
}

/// The snapshot the agents will hold once `keys` reached their `after`
/// values: for showing what the fleet will answer.
pub fn snapshot_after(snapshot: &Snapshot, keys: &[KeyPlan]) -> Snapshot {
    let mut out = snapshot.clone();
    for k in keys.iter().filter(|k| !k.set_by_hand) {
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

/// `state set` or `state clear` of one key: one write of `change` with
/// Flags 0 (the key becomes one set by hand), none when a key to clear is
/// already absent. A value the key already holds is written again, with a
/// new record; when `state drain` wrote it, the key becomes one set by
/// hand, which `state undrain` leaves alone. The note warns about a write
/// that skips slowstart or takes a key over from `state drain`.
pub fn plan_write(key: &str, before: Current, change: Change) -> Plan {
    // A value set again is written again: Consul keeps the key's
    // ModifyIndex, and the record says who set it last, why and until when.
    let (after, unchanged) = match (&before, change) {
        (Current::Absent, Change::Clear) => (None, true),
        (_, Change::Set(s)) => (Some(s), false),
        (_, Change::Clear) => (None, false),
    };
    let note = slowstart_note(&before, change).or_else(|| takeover_note(&before, change));
    Plan {
        steps: if unchanged {
            Vec::new()
        } else {
            vec![Step::Write {
                change,
                flags: 0,
                keys: vec![key.to_string()],
            }]
        },
        keys: vec![KeyPlan {
            key: key.to_string(),
            before,
            after,
            note: note.filter(|_| !unchanged),
            set_by_hand: false,
        }],
    }
}

/// Warns about ending a drain without going through maint.
pub fn slowstart_note(before: &Current, change: Change) -> Option<&'static str> {
    let from_drain = matches!(
        before,
        Current::Valid {
            state: AdminState::Drain,
            ..
        }
    );
    let to_service = matches!(
        change,
        Change::Clear | Change::Set(AdminState::Ready) | Change::Set(AdminState::Weight(_))
    );
    (from_drain && to_service).then_some(
        "drain -> ready skips HAProxy's slowstart (it applies only when leaving MAINT); \
         `state undrain` and `state canary enable` go through maint",
    )
}

/// Tells that `state set` takes over a key `state drain` wrote, setting it
/// to a value `state drain` and `state undrain` then leave alone (drain,
/// maint or 0%).
pub fn takeover_note(before: &Current, change: Change) -> Option<&'static str> {
    let out = matches!(
        change,
        Change::Set(AdminState::Drain | AdminState::Maint | AdminState::Weight(0))
    );
    (before.by_drain() && out).then_some(
        "the key was written by `state drain`; it is now set by hand (Consul Flags 0), so \
         `state undrain` and `state drain` leave it alone until `state clear`",
    )
}

#[cfg(test)]
mod tests;
