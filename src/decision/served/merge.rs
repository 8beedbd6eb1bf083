//! The rules that merge one Consul answer into the served state: holds
//! for invalid values, for data lost by Consul, and for keys hidden from
//! the token.

use std::collections::BTreeMap;

use super::state::{Hold, HoldCause, KeyRecord, ServedState};
use super::view::{AnswerView, ConsulKey};
use crate::model::meta::KeyMeta;
use crate::model::snapshot::Entry;
use crate::model::value::{AdminState, InvalidValue};

/// What a direct read of a key the answer lacked said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The key exists and the token may read it: the answer was filtered by
    /// an older policy, or the key was written again since.
    Present(ConsulKey),
    /// 404: the key is gone.
    Absent,
    /// 403: the token may not read it.
    Forbidden,
}

/// One change to the served state, for the log and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The state answered for a key changed (`None`: not answered: absent
    /// or skipped).
    Served {
        /// The key.
        key: Box<str>,
        /// Before.
        from: Option<AdminState>,
        /// After.
        to: Option<AdminState>,
    },
    /// A write of an invalid value (once per ModifyIndex).
    Invalid {
        /// The key.
        key: Box<str>,
        /// Why it is invalid.
        error: InvalidValue,
        /// The state still answered, if any.
        held: Option<AdminState>,
    },
    /// A hold began.
    Held {
        /// The key.
        key: Box<str>,
        /// The state answered (`None`: held absent).
        state: Option<AdminState>,
        /// Why.
        cause: HoldCause,
    },
    /// A hold ended.
    Released {
        /// The key.
        key: Box<str>,
        /// Why it was held.
        cause: HoldCause,
    },
    /// A write to the release-rollback key released every rolled-back hold.
    ReleasedAll {
        /// How many keys were released.
        keys: usize,
    },
}

/// How one answer is merged (decided before the merge by the core).
#[derive(Debug, Clone, Default)]
pub struct MergeInput {
    /// The answer comes from a store that lost its data.
    pub rolled_back: bool,
    /// Direct reads of keys the answer lacked; a lacking key without a
    /// probe is deleted.
    pub probes: BTreeMap<Box<str>, Probe>,
    /// Unix time in seconds, for the start of new holds.
    pub now: u64,
    /// A hidden key holds only drain or maint (off only in tests that show
    /// what the rule prevents: then it holds whatever it served).
    pub hidden_holds_only_out: bool,
}

impl ServedState {
    /// Merges one answer into the served state by the hold rules:
    ///
    /// - a valid value is served, except that in an answer from a store that
    ///   lost data a value that could put a server back in rotation (see
    ///   `undoes`: drain or maint left, a `ready` or a weight that
    ///   appears) is not: the key keeps its state (held `rolled_back`)
    ///   until a forward answer shows a new write to it (it appears, or its
    ///   ModifyIndex changes) or a new release mark;
    /// - an invalid value keeps the key's last valid state (held
    ///   `invalid_value`), or is skipped if none is known;
    /// - a key the answer lacks is deleted, unless a direct read answered
    ///   403 (held `hidden`) or showed it (its value applies).
    pub fn merge(&self, view: AnswerView, input: &MergeInput) -> (ServedState, Vec<Change>) {
        let mut changes = Vec::new();
        let release_all = !input.rolled_back
            && view.release_mark.is_some()
            && view.release_mark != self.release_mark;
        if release_all {
            let n = self
                .keys
                .values()
                .filter(|r| r.hold.is_some_and(|h| h.cause == HoldCause::RolledBack))
                .count();
            if n > 0 {
                changes.push(Change::ReleasedAll { keys: n });
            }
        }
        let AnswerView {
            index,
            keys: mut shown_keys,
            store_id,
            release_mark,
            generation,
            mut meta,
            invalid_meta,
            ..
        } = view;
        // A generation written by hand that does not parse says nothing:
        // the one served is kept to judge the next answer by.
        let generation_shown = generation.is_some();
        let generation = match generation {
            Some(Ok(g)) => Some(g.mark()),
            Some(Err(_)) | None => self.generation,
        };
        // Keys neither served nor in the answer that a direct read was made
        // of (named only by a writer record).
        let probed_new: Vec<Box<str>> = input
            .probes
            .keys()
            .filter(|k| !self.keys.contains_key(*k) && !shown_keys.contains_key(*k))
            .cloned()
            .collect();
        let mut keys = BTreeMap::new();
        let mut one = |key: Box<str>, prev: Option<&KeyRecord>, in_answer: Option<ConsulKey>| {
            let from_answer = in_answer.is_some();
            let forbidden =
                in_answer.is_none() && matches!(input.probes.get(&key), Some(Probe::Forbidden));
            let shown = in_answer.or_else(|| match input.probes.get(&key) {
                Some(Probe::Present(k)) => Some(k.clone()),
                _ => None,
            });
            let record =
                merge_key(prev, shown, forbidden, release_all, self.index, input).map(|mut r| {
                    r.meta = pick_meta(prev, &r, meta.remove(&key), from_answer);
                    r.since = match prev {
                        Some(p) if p.served == r.served && p.since != 0 => p.since,
                        _ => input.now,
                    };
                    r
                });
            note_changes(&key, prev, record.as_ref(), &mut changes);
            if let Some(record) = record {
                keys.insert(key, record);
            }
        };
        // The keys served before, then the answer's new ones; the answer's
        // entries are moved, not copied (a 10,000-key answer is a few MB).
        for (key, prev) in &self.keys {
            let in_answer = shown_keys.remove(key);
            one(key.clone(), Some(prev), in_answer);
        }
        for (key, in_answer) in shown_keys {
            one(key, None, Some(in_answer));
        }
        for key in probed_new {
            one(key, None, None);
        }
        let next = ServedState {
            index,
            store_id,
            release_mark,
            generation,
            generation_shown,
            keys,
            invalid_meta,
        };
        (next, changes)
    }
}

/// The record kept for a merged key: the answer's when it describes the
/// write Consul shows; for a key shown by a direct read (no record read
/// with it), the one it had while its ModifyIndex is unchanged; for a key
/// held after it vanished or was hidden, the one it had.
fn pick_meta(
    prev: Option<&KeyRecord>,
    next: &KeyRecord,
    shown: Option<(KeyMeta, u64)>,
    from_answer: bool,
) -> Option<Box<KeyMeta>> {
    let prev_meta = || prev.and_then(|p| p.meta.clone());
    let Some(c) = &next.consul else {
        return prev_meta();
    };
    let Entry::Valid(state) = c.entry else {
        return None;
    };
    if !from_answer {
        let same = prev.and_then(|p| p.consul.as_ref()).map(|p| p.modify_index);
        return if same == Some(c.modify_index) {
            prev_meta()
        } else {
            None
        };
    }
    shown
        .filter(|(m, mi)| m.describes(*mi, state, c.modify_index))
        .map(|(m, _)| Box::new(m))
}

/// Whether applying `new` (`None`: absent) over `prev` (the state served;
/// `None`: absent or skipped) in an answer from a store that lost data
/// could put a server back in rotation: drain or maint left for anything
/// but drain or maint, or a `ready` or a weight that appears where there was
/// nothing (it would outrank a later identity's drain on the agent-send
/// line). A weight is in rotation already: what replaces it applies, and
/// its absence lets a later identity (a group's drain) decide.
fn undoes(prev: Option<AdminState>, new: Option<AdminState>) -> bool {
    use AdminState::{Drain, Maint, Ready, Weight};
    match prev {
        Some(Drain | Maint) => !matches!(new, Some(Drain | Maint)),
        Some(Ready | Weight(_)) => false,
        None => matches!(new, Some(Ready | Weight(_))),
    }
}

/// The rules for one key. `shown`: what the answer (or a direct read after
/// it) shows; `forbidden`: the answer lacks it and a direct read was 403;
/// `served_index`: the index of the answer served until now.
fn merge_key(
    prev: Option<&KeyRecord>,
    shown: Option<ConsulKey>,
    forbidden: bool,
    release_all: bool,
    served_index: u64,
    input: &MergeInput,
) -> Option<KeyRecord> {
    let prev_served = prev.and_then(|p| p.served);
    let prev_hold = prev.and_then(|p| p.hold);
    let prev_mi = prev.and_then(|p| p.consul.as_ref().map(|c| c.modify_index));
    let now_mi = shown.as_ref().map(|c| c.modify_index);
    let hold = |cause: HoldCause| {
        Some(match prev_hold {
            Some(h) if h.cause == cause => h,
            _ => Hold {
                cause,
                since: input.now,
            },
        })
    };

    // A rolled-back hold lasts until a forward answer shows a write to the
    // key or a new release mark. A value that undoes nothing the hold keeps
    // (it keeps the servers out, see [`undoes`]) applies at once, whatever
    // its ModifyIndex: after another loss, or a restore the agent did not
    // see, a new write can carry the ModifyIndex the held value had.
    //
    // A write since the answer served until now has a ModifyIndex above its
    // index (Consul's index of a recursive read is the highest ModifyIndex
    // under the prefix). A key shown at or below it was there when that
    // answer lacked it or showed it otherwise: a view filtered by the
    // token's policy, or a store restored unseen. It is not a write.
    if prev_hold.is_some_and(|h| h.cause == HoldCause::RolledBack) && !forbidden {
        let written =
            !input.rolled_back && now_mi != prev_mi && now_mi.is_none_or(|mi| mi > served_index);
        let harmless = match shown.as_ref().map(|c| &c.entry) {
            Some(Entry::Valid(state)) => !undoes(prev_served, Some(*state)),
            _ => false,
        };
        if !written && !release_all && !harmless {
            return Some(KeyRecord {
                consul: shown,
                served: prev_served,
                hold: prev_hold,
                meta: None,
                since: 0,
            });
        }
    }
    if forbidden {
        // Hidden from the token, never seen (known by its writer record):
        // no value known, answered by no answer.
        let Some(p) = prev else {
            return Some(KeyRecord {
                consul: None,
                served: None,
                hold: hold(HoldCause::Hidden),
                meta: None,
                since: 0,
            });
        };
        // Hidden from the token. A drain or maint is held: the key may
        // still keep its servers out. A `ready` or a weight is not: the key
        // may have been cleared since, and answering it would outrank a
        // later identity's drain or maint on the line (the rule that holds
        // a `ready` appearing from a store that lost data as absent, for the
        // same reason); it is skipped, the next identity decides, its last
        // value kept to tell it from a key never seen. A key skipped (an
        // invalid value) or never seen stays so, and so does a key held
        // absent (a `ready` that appeared from a store that lost data): it
        // answers nothing and must not start to stop the lookup.
        if p.served.is_none()
            && p.consul.is_none()
            && p.hold.is_some_and(|h| h.cause != HoldCause::Hidden)
        {
            return Some(p.clone());
        }
        let holds = |s: AdminState| s.keeps_out() || !input.hidden_holds_only_out;
        let seen = match p.served {
            Some(state) if holds(state) => None,
            Some(state) => Some(ConsulKey {
                value: None,
                entry: Entry::Valid(state),
                modify_index: p.consul.as_ref().map_or(0, |c| c.modify_index),
            }),
            None => p.consul.clone(),
        };
        return Some(KeyRecord {
            served: p.served.filter(|s| holds(*s)),
            consul: seen,
            hold: hold(HoldCause::Hidden),
            meta: None,
            since: 0,
        });
    }
    let Some(c) = shown else {
        // A key hidden with no value known stays so until a direct read
        // tells otherwise; an answer from a store that lost data gets none.
        if let Some(p) = prev.filter(|p| {
            input.rolled_back
                && p.consul.is_none()
                && p.served.is_none()
                && p.hold.is_some_and(|h| h.cause == HoldCause::Hidden)
        }) {
            return Some(p.clone());
        }
        return (input.rolled_back && undoes(prev_served, None)).then(|| KeyRecord {
            consul: None,
            served: prev_served,
            hold: hold(HoldCause::RolledBack),
            meta: None,
            since: 0,
        });
    };
    let (served, hold) = match &c.entry {
        // A key no agent-send line can name is never answered.
        Entry::Invalid(e) if matches!(**e, InvalidValue::Key(_)) => (None, None),
        Entry::Invalid(_) => match prev_served {
            Some(state) => (Some(state), hold(HoldCause::InvalidValue)),
            None => (None, None),
        },
        Entry::Valid(state) if input.rolled_back && undoes(prev_served, Some(*state)) => {
            (prev_served, hold(HoldCause::RolledBack))
        }
        Entry::Valid(state) => (Some(*state), None),
        // Never parsed from a value: only the snapshot names a key so.
        Entry::Unreadable => (prev_served, None),
    };
    Some(KeyRecord {
        consul: Some(c),
        served,
        hold,
        meta: None,
        since: 0,
    })
}

fn note_changes(
    key: &str,
    prev: Option<&KeyRecord>,
    next: Option<&KeyRecord>,
    changes: &mut Vec<Change>,
) {
    let from = prev.and_then(|p| p.served);
    let to = next.and_then(|n| n.served);
    let prev_hold = prev.and_then(|p| p.hold).map(|h| h.cause);
    let next_hold = next.and_then(|n| n.hold).map(|h| h.cause);
    if let Some(cause) = prev_hold.filter(|c| Some(*c) != next_hold) {
        changes.push(Change::Released {
            key: key.into(),
            cause,
        });
    }
    if let Some(cause) = next_hold.filter(|c| Some(*c) != prev_hold) {
        changes.push(Change::Held {
            key: key.into(),
            state: to,
            cause,
        });
    }
    if let Some(c) = next.and_then(|n| n.consul.as_ref()) {
        let prev_mi = prev.and_then(|p| p.consul.as_ref()).map(|p| p.modify_index);
        if let Entry::Invalid(error) = &c.entry {
            if prev_mi != Some(c.modify_index) {
                changes.push(Change::Invalid {
                    key: key.into(),
                    error: (**error).clone(),
                    held: to,
                });
            }
        }
    }
    if from != to {
        changes.push(Change::Served {
            key: key.into(),
            from,
            to,
        });
    }
}
