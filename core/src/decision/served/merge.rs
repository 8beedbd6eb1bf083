//! The rules that merge one Consul answer into the served state: holds
//! for invalid values, for data lost by Consul, and for keys hidden from
//! the token.

use std::collections::BTreeMap;

use super::state::{Hold, HoldCause, KeyRecord, ServedState};
use super::view::{AnswerView, ConsulKey};
use crate::model::meta::KeyMeta;
use crate::model::snapshot::Entry;
use crate::model::value::{AdminState, InvalidValue, Traffic};

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
    /// Holds compare only drain and maint, not the whole order of traffic
    /// (on only in tests that show what the order prevents: then a weight
    /// rising or vanishing from a store that lost data applies).
    pub weights_unprotected: bool,
    /// The state the writer's record names for a key the token may not
    /// read and the state never held (found by its record): held as the
    /// key's last value, so it caps what the line answers.
    pub written: BTreeMap<Box<str>, AdminState>,
}

impl ServedState {
    /// Merges one answer into the served state by the hold rules:
    ///
    /// - a valid value is served, except that in an answer from a store that
    ///   lost data a value that could give a server more traffic (see
    ///   `undoes`) is not: the key keeps its state (held `rolled_back`), or
    ///   caps its lines ([`KeyRecord::capping`]), until a forward answer
    ///   shows a new write to it (it appears, or its ModifyIndex changes) or
    ///   a new release mark;
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
            let record = merge_key(prev, shown, forbidden, release_all, self.index, input, &key)
                .map(|mut r| {
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
/// could give a server more traffic, in the order of traffic
/// ([`AdminState::traffic`]: maint < drain < 0% < lower weight < higher
/// weight, `ready` at 100%):
///
/// - a value replacing another undoes it when it ranks higher (maint to
///   drain, drain to `0%`, `25%` to `40%` or `ready`);
/// - a key vanishing lets the next identity decide, and a line with no key
///   left answers `ready`: it undoes anything below `ready`;
/// - a value that appears where there was nothing would outrank a later
///   identity on the agent-send line, which may be lower (a drain over a
///   group's maint, a weight over its drain): it is held, and caps what the
///   next identity answers ([`KeyRecord::cap`]); only maint, the lowest,
///   applies.
fn undoes(prev: Option<AdminState>, new: Option<AdminState>, order: bool) -> bool {
    use AdminState::{Drain, Maint, Ready, Weight};
    if !order {
        // Before weights were protected: drain and maint only.
        return match prev {
            Some(Drain | Maint) => !matches!(new, Some(Drain | Maint)),
            Some(Ready | Weight(_)) => false,
            None => matches!(new, Some(Ready | Weight(_))),
        };
    }
    match (prev, new) {
        (Some(p), Some(n)) => n.more_than(p),
        (Some(p), None) => Traffic::READY > p.traffic(),
        (None, Some(n)) => n != Maint,
        (None, None) => false,
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
    key: &str,
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
    // A held key that may answer nothing of its own caps the next
    // identity ([`KeyRecord::capping`]); what it answered as a value of its
    // own is what a store that lost data is judged against.
    let capping = prev.and_then(KeyRecord::capping);
    let was = if capping.is_some() { None } else { prev_served };
    let order = !input.weights_unprotected;
    // Held back from a store that lost data: a key that decided keeps its
    // state; one that did not caps the next identity at the lowest of what
    // it capped and what the store shows.
    let held_back = |shown: Option<&ConsulKey>| match was {
        Some(state) => (Some(state), None),
        None => (None, lower_cap(capping, valid(shown))),
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
        let harmless = valid(shown.as_ref()).is_some_and(|s| !undoes(was, Some(s), order));
        if !written && !release_all && !harmless {
            // Still gone: kept as it is. Shown again: held back.
            let (served, cap) = match &shown {
                None => (prev_served, prev.and_then(|p| p.cap)),
                Some(_) => held_back(shown.as_ref()),
            };
            return Some(KeyRecord {
                consul: shown,
                served,
                hold: prev_hold,
                cap,
                meta: None,
                since: 0,
            });
        }
    }
    if forbidden {
        // The state the writer's record names (a key never seen, or one
        // held hidden when a writer transaction came): held as the key's
        // last value (a drain or maint held, a `ready` or weight capping
        // the next identity); for a key held already, the lower of it and
        // what was held (a record does not show a write by hand after it).
        if let Some(&written) = input.written.get(key) {
            let before = prev.and_then(|p| p.served.or(p.cap).or(valid(p.consul.as_ref())));
            let state = lower_cap(before, Some(written)).unwrap_or(written);
            let keeps_out = state.keeps_out();
            return Some(KeyRecord {
                consul: None,
                served: keeps_out.then_some(state),
                hold: hold(HoldCause::Hidden),
                cap: (!keeps_out).then_some(state),
                meta: None,
                since: 0,
            });
        }
        // Hidden from the token, never seen (known by its writer record),
        // with no record read: no value known, answered by no answer.
        let Some(p) = prev else {
            return Some(KeyRecord {
                consul: None,
                served: None,
                hold: hold(HoldCause::Hidden),
                cap: None,
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
        let holds = |s: AdminState| s.keeps_out();
        let seen = match p.served {
            Some(state) if holds(state) => None,
            Some(state) => Some(ConsulKey {
                value: None,
                entry: Entry::Valid(state),
                modify_index: p.consul.as_ref().map_or(0, |c| c.modify_index),
            }),
            None => p.consul.clone(),
        };
        let served = p.served.filter(|s| holds(*s));
        // A `ready` or a weight not answered caps what a later identity
        // answers: the key may still hold it, or have been cleared.
        let cap = served
            .is_none()
            .then(|| lower_cap(p.cap, valid(seen.as_ref())))
            .flatten();
        return Some(KeyRecord {
            served,
            consul: seen,
            hold: hold(HoldCause::Hidden),
            cap,
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
        // A key that answered or capped something, gone from a store that
        // lost data, keeps that while its vanishing would give more: gone,
        // it caps the next identity ([`KeyRecord::capping`]).
        let (served, cap) = match (prev_served, capping) {
            (Some(state), _) => (Some(state), None),
            (None, cap) => (None, cap),
        };
        return (input.rolled_back && undoes(served.or(cap), None, order)).then(|| KeyRecord {
            consul: None,
            served,
            hold: hold(HoldCause::RolledBack),
            cap,
            meta: None,
            since: 0,
        });
    };
    let mut cap = None;
    let (served, hold) = match &c.entry {
        // A key no agent-send line can name is never answered.
        Entry::Invalid(e) if matches!(**e, InvalidValue::Key(_)) => (None, None),
        Entry::Invalid(_) => match (was, capping) {
            // The key capped the next identity: it still does.
            (_, Some(c)) => {
                cap = Some(c);
                (None, hold(HoldCause::InvalidValue))
            }
            (Some(state), None) => (Some(state), hold(HoldCause::InvalidValue)),
            (None, None) => (None, None),
        },
        Entry::Valid(state) if input.rolled_back && undoes(was, Some(*state), order) => {
            let (served, capped) = held_back(Some(&c));
            cap = capped;
            (served, hold(HoldCause::RolledBack))
        }
        Entry::Valid(state) => (Some(*state), None),
        // Never parsed from a value: only the snapshot names a key so.
        Entry::Unreadable | Entry::AtMost(_) => (prev_served, None),
    };
    Some(KeyRecord {
        consul: Some(c),
        served,
        hold,
        cap,
        meta: None,
        since: 0,
    })
}

/// The valid state `key` shows, if any.
fn valid(key: Option<&ConsulKey>) -> Option<AdminState> {
    match key.map(|c| &c.entry) {
        Some(Entry::Valid(state)) => Some(*state),
        _ => None,
    }
}

/// The lower of two caps in the order of traffic (either, when only one
/// is set).
fn lower_cap(a: Option<AdminState>, b: Option<AdminState>) -> Option<AdminState> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.least(b)),
        (a, b) => a.or(b),
    }
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
