//! How the core tells what an answer is against the state served: the same
//! (a wait that ended), a store that lost data (restarted, rebuilt,
//! restored), a reaped tombstone, or an answer filtered by the token's
//! policy that lacks keys or may hide writes.

use std::collections::BTreeMap;

use super::config::{Rule, Rules};
use super::protocol::Note;
use super::served::{AnswerView, HoldCause, Probe, ServedState};
use crate::model::generation::Lineage;

/// Whether `view` shows exactly what the served state shows of Consul.
pub(super) fn shows_the_same(served: Option<&ServedState>, view: &AnswerView) -> bool {
    let Some(served) = served else {
        return false;
    };
    let generation = match &view.generation {
        Some(Ok(g)) => Some(g.mark()),
        Some(Err(_)) | None => served.generation,
    };
    served.store_id == view.store_id
        && served.generation_shown == view.generation.is_some()
        && served.generation == generation
        && served.release_mark == view.release_mark
        && served.consul_key_count() == view.keys.len()
        && view.keys.iter().all(|(k, c)| {
            served
                .keys
                .get(k)
                .and_then(|r| r.consul.as_ref())
                .is_some_and(|s| s == c)
        })
}

/// Whether the answer comes from a store that lost data, with the notes
/// that say why:
///
/// - the index went backwards and something moved (with nothing moved, a
///   reaped tombstone: Consul reaps a delete's tombstone about 15 minutes
///   later and the prefix index drops to the highest live key's);
/// - the write generation does not descend from the one served;
/// - the store id the state had vanished or changed, whatever the index;
/// - the index did not move past the served one, yet a key shows another
///   ModifyIndex (with ACLs off, any difference: nothing is filtered).
pub(super) fn judge(
    served: Option<&ServedState>,
    view: &AnswerView,
    acl_on: bool,
    rules: Rules,
    notes: &mut Vec<Note>,
) -> bool {
    let Some(state) = served else {
        return false;
    };
    let mut lost = false;
    if view.index < state.index {
        let reaped = rules.on(Rule::Reap) && shows_the_same(served, view);
        notes.push(Note::IndexReset {
            previous: state.index,
            index: view.index,
            reaped,
        });
        lost = !reaped;
    }
    if rules.on(Rule::Generation) {
        if let Some(note) = generation_lost(state, view) {
            notes.push(note);
            lost = true;
        }
    }
    if rules.on(Rule::StoreId) {
        if let Some(previous) = state.store_id.clone() {
            if view.store_id.as_ref() != Some(&previous) {
                notes.push(Note::StoreChanged {
                    previous,
                    now: view.store_id.clone(),
                });
                lost = true;
            }
        }
    }
    // With ACLs on, keys shown or not at the same index may be a policy's
    // doing (a query parked under another one): only a key shown with
    // another ModifyIndex tells then.
    if !lost && view.index <= state.index && rewritten(state, view, acl_on) {
        notes.push(Note::NotMoved { index: view.index });
        lost = true;
    }
    lost
}

/// A note when the answer's write generation does not descend from the
/// one served: an older one or another branch (see
/// [`crate::model::generation`]), or none where the last answer showed
/// one. A value that does not parse (written by hand) and one too many
/// writes ahead to link say nothing.
///
/// Where the last answer showed none (a snapshot from before the
/// generation restored, the key deleted), the writer's next transaction
/// starts a new history at 1, which does not descend from the one served:
/// lost data again. The agent cannot tell it from a store rebuilt ahead,
/// or an old snapshot restored into a store started anew, whose first
/// writer transaction looks the same (a new store id and generation 1 past
/// every index served); taking it for a new history serves a drain lost
/// with the rebuild as gone (the simulation finds it). So it is held, on
/// the lower side of the order of traffic: what the write set is served
/// (a value that appears caps its lines at it), and `state
/// release-rollback` releases the rest.
fn generation_lost(state: &ServedState, view: &AnswerView) -> Option<Note> {
    let served = state.generation?;
    let now = match &view.generation {
        None if !state.generation_shown => return None,
        None => None,
        Some(Err(_)) => return None,
        Some(Ok(g)) => match g.lineage(served) {
            Lineage::Same | Lineage::Descends | Lineage::TooFar => return None,
            Lineage::Lost => Some(g.mark()),
        },
    };
    Some(Note::GenerationLost { served, now })
}

/// Whether `view`, at an index not past the served one, shows Consul's
/// keys otherwise than the served state: a key with another ModifyIndex,
/// or (with ACLs off, where nothing is filtered) any difference. A key held
/// hidden is not compared: what the state keeps of it is what was seen
/// before the token lost it, and it may have been written since, unseen.
fn rewritten(state: &ServedState, view: &AnswerView, acl_on: bool) -> bool {
    let moved = view.keys.iter().any(|(k, c)| {
        state
            .keys
            .get(k)
            .filter(|r| !r.hold.is_some_and(|h| h.cause == HoldCause::Hidden))
            .and_then(|r| r.consul.as_ref())
            .is_some_and(|s| s.modify_index != c.modify_index)
    });
    moved || (!acl_on && !shows_the_same(Some(state), view))
}

/// The keys to read directly: those the state holds that the answer lacks
/// (shown before, hidden, or, when the answer releases the rolled-back
/// holds, held since they vanished), and with `probe` (ACLs on) the keys
/// only a writer record names, once per write of the record: a deny on one
/// key passes the read check and shows only so.
pub(super) fn missing(
    served: Option<&ServedState>,
    view: &AnswerView,
    probe: bool,
    records_read: &BTreeMap<Box<str>, u64>,
) -> Vec<Box<str>> {
    let releases =
        view.release_mark.is_some() && served.map(|s| s.release_mark) != Some(view.release_mark);
    let mut missing: Vec<Box<str>> = match served {
        Some(s) => s
            .keys
            .iter()
            .filter(|(k, r)| {
                !view.keys.contains_key(*k)
                    && (r.consul.is_some()
                        || r.hold.is_some_and(|h| {
                            h.cause == HoldCause::Hidden
                                || (releases && h.cause == HoldCause::RolledBack)
                        }))
            })
            .map(|(k, _)| k.clone())
            .collect(),
        None => Vec::new(),
    };
    if probe {
        let known = |k: &str| served.is_some_and(|s| s.keys.contains_key(k));
        missing.extend(
            view.meta
                .iter()
                .filter(|(k, (_, mi))| {
                    !view.keys.contains_key(*k) && !known(k) && records_read.get(*k) != Some(mi)
                })
                .map(|(k, _)| k.clone()),
        );
    }
    missing
}

/// Whether an answer whose direct reads are in may hide a write: some key
/// it lacked is present, none is absent (a delete's tombstone would explain
/// the index) or forbidden, and its index is past every ModifyIndex shown.
pub(super) fn hides_writes(view: &AnswerView, probes: &BTreeMap<Box<str>, Probe>) -> bool {
    let mut latest = view.latest_shown;
    let mut present = false;
    for probe in probes.values() {
        match probe {
            Probe::Present(k) => {
                present = true;
                latest = latest.max(k.modify_index);
            }
            Probe::Absent | Probe::Forbidden => return false,
        }
    }
    present && view.index > latest
}
