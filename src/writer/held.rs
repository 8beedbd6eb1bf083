//! Keys a Consul session holds ([`crate::consul::session`]). A plain write
//! keeps a key's session, and a session with Behavior `delete` deletes the
//! key when it ends: a maint written over an automation's lock would be
//! gone, and the server back in service, seconds after its session ended.
//! So every value the writer writes to a held key goes in the same
//! transaction as its release (`check-index` at the ModifyIndex read, then
//! `unlock` with the new value): the operator's newest write stays whatever
//! the session does next. The writer says so on stderr, in `--json` and in
//! the write's record (`released_session`); `get`, `list` and `explain`
//! show the session holding a key.

use std::collections::HashMap;

use serde::Serialize;

use super::plan::{Change, Plan, Step};
use super::session::Writer;
use crate::consul::{Holder, Holders, MAX_TXN_OPS};
use crate::model::meta::KeyMeta;

/// The keys (relative to the prefix) a Consul session holds, with the
/// session.
pub(super) type Held = HashMap<String, Holder>;

/// Most sessions one command asks Consul to describe
/// (`/v1/session/info/ID`, one request each): 32. Keys held by others show
/// the session ID only.
pub(super) const MAX_SESSIONS_DESCRIBED: usize = 32;

impl Writer {
    /// The sessions holding keys among `holders` (full keys), for the keys
    /// in `only` (relative to the prefix) or all of them, each session
    /// described once (at most [`MAX_SESSIONS_DESCRIBED`]).
    pub(super) async fn held(&self, holders: &Holders, only: Option<&[String]>) -> Held {
        let mut described: HashMap<&str, Holder> = HashMap::new();
        let mut held = Held::new();
        for (full, id) in holders {
            let Some(key) = full.strip_prefix(&self.prefix) else {
                continue;
            };
            if only.is_some_and(|keys| !keys.iter().any(|k| k == key)) {
                continue;
            }
            if !described.contains_key(id.as_str()) {
                let holder = match described.len() < MAX_SESSIONS_DESCRIBED {
                    true => self.client.holder(id).await,
                    false => Holder {
                        id: id.clone(),
                        info: None,
                        unknown: Some(format!(
                            "not described: more than {MAX_SESSIONS_DESCRIBED} sessions"
                        )),
                    },
                };
                described.insert(id, holder);
            }
            held.insert(key.to_string(), described[id.as_str()].clone());
        }
        held
    }
}

/// The record written with a key: [`KeyMeta`] and, when the write released
/// the key from a Consul session, that session (`released_session`, read
/// by `consul kv get`; the agents and the writer's readers ignore it).
#[derive(Serialize)]
pub(super) struct Record<'a> {
    #[serde(flatten)]
    pub(super) meta: &'a KeyMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) released_session: Option<&'a Holder>,
}

/// Whether writing `change` to `key` releases it from a session: a value
/// written to a held key (a removal takes the lock with the key).
pub(super) fn releases(held: &Held, key: &str, change: Change) -> bool {
    matches!(change, Change::Set(_)) && held.contains_key(key)
}

/// `keys` cut into transactions of at most [`MAX_TXN_OPS`] operations:
/// three per key (its write, its record, and the delete of an earlier
/// writer's record below the prefix), four for a key released
/// ([`releases`]: the index check, the unlock, the record, the delete), and
/// one for the write generation.
pub(super) fn chunks<'a>(keys: &'a [String], held: &Held, change: Change) -> Vec<&'a [String]> {
    let mut out = Vec::new();
    let (mut start, mut ops) = (0, 1);
    for (i, key) in keys.iter().enumerate() {
        let cost = if releases(held, key, change) { 4 } else { 3 };
        if ops + cost > MAX_TXN_OPS {
            out.push(&keys[start..i]);
            (start, ops) = (i, 1);
        }
        ops += cost;
    }
    if start < keys.len() {
        out.push(&keys[start..]);
    }
    out
}

/// The line on stderr for a key this run released from `holder` by
/// writing `change`.
pub(super) fn released_line(action: &str, key: &str, holder: &Holder, change: Change) -> String {
    match change {
        Change::Set(state) => format!(
            "{action}: released {key} from Consul {} in the transaction that wrote {state}, \
             so the session ending no longer deletes or changes it",
            holder.describe()
        ),
        Change::Clear => format!(
            "{action}: {key} was held by Consul {}; the key is removed, its lock with it",
            holder.describe()
        ),
    }
}

/// What to know of a key `holder` holds and this run does not write.
pub(super) fn held_note(key: &str, holder: &Holder) -> String {
    let fix = match holder.may_delete() {
        true => format!(
            "; a drain or maint there lasts only as long as the session. `state set {key} \
             VALUE` writes the key and releases it"
        ),
        false => String::new(),
    };
    format!(
        "{key} is held by Consul {}: {}{fix}",
        holder.describe(),
        holder.when_it_ends()
    )
}

/// A key and the Consul session holding it (or that held it), in a
/// sequence's report.
#[derive(Serialize)]
pub(super) struct HeldRow {
    key: String,
    pub(super) session: Holder,
}

impl HeldRow {
    pub(super) fn note(&self) -> String {
        held_note(&self.key, &self.session)
    }
}

/// For a sequence's report: the keys released from a Consul session
/// (`released`: by the run, `done`, or for a dry run by `plan`'s writes),
/// or those a session still holds (`held`), sorted.
pub(super) fn rows(
    plan: &Plan,
    (held, done): (&Held, &[(String, Holder)]),
    dry_run: bool,
    released: bool,
) -> Vec<HeldRow> {
    let row = |(key, session): (&String, &Holder)| HeldRow {
        key: key.clone(),
        session: session.clone(),
    };
    let mut rows: Vec<HeldRow> = match (dry_run, released) {
        (false, true) => done.iter().map(|(k, h)| row((k, h))).collect(),
        (false, false) => held.iter().map(row).collect(),
        (true, _) => {
            let written = |key: &str| {
                plan.steps.iter().any(|s| {
                    matches!(s, Step::Write { change, keys, .. }
                        if releases(held, key, *change) && keys.iter().any(|k| k == key))
                })
            };
            (held.iter())
                .filter(|(k, _)| written(k) == released)
                .map(row)
                .collect()
        }
    };
    rows.sort_by(|a, b| a.key.cmp(&b.key));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::value::AdminState;

    fn holder(behavior: &str) -> Holder {
        Holder {
            id: "s-1".into(),
            info: Some(crate::consul::SessionInfo {
                id: "s-1".into(),
                name: "automation".into(),
                node: "n1".into(),
                behavior: behavior.into(),
                ttl: String::new(),
            }),
            unknown: None,
        }
    }

    #[test]
    fn a_transaction_holds_at_most_64_operations_with_released_keys() {
        let keys: Vec<String> = (0..100).map(|i| format!("web/s{i:03}")).collect();
        let set = Change::Set(AdminState::Maint);
        let none = Held::new();
        let sizes = |held: &Held, change| -> Vec<usize> {
            chunks(&keys, held, change)
                .iter()
                .map(|c| c.len())
                .collect()
        };
        assert_eq!(sizes(&none, set), vec![21, 21, 21, 21, 16]);
        let all: Held = keys.iter().map(|k| (k.clone(), holder("delete"))).collect();
        assert_eq!(sizes(&all, set), vec![15, 15, 15, 15, 15, 15, 10]);
        assert_eq!(
            sizes(&all, Change::Clear),
            vec![21, 21, 21, 21, 16],
            "a removal needs no unlock"
        );
        let some: Held = [("web/s000".to_string(), holder("delete"))].into();
        assert_eq!(sizes(&some, set), vec![20, 21, 21, 21, 17]);
        assert!(chunks(&[], &all, set).is_empty());
        for (held, change) in [(&none, set), (&all, set), (&some, set)] {
            for chunk in chunks(&keys, held, change) {
                let ops: usize = (chunk.iter())
                    .map(|k| if releases(held, k, change) { 4 } else { 3 })
                    .sum();
                assert!(ops < MAX_TXN_OPS, "{ops} and the generation");
            }
        }
    }

    #[test]
    fn the_record_names_the_session_released_and_is_still_a_record() {
        let meta = crate::model::meta::Author {
            by: "alice".into(),
            reason: "x".into(),
            until: None,
            at: 5,
        }
        .record(AdminState::Maint);
        let h = holder("delete");
        let json = serde_json::to_vec(&Record {
            meta: &meta,
            released_session: Some(&h),
        })
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["released_session"]["id"], "s-1");
        assert_eq!(v["released_session"]["info"]["behavior"], "delete");
        assert_eq!(crate::model::meta::parse_meta(&json).unwrap(), meta);
        let plain = serde_json::to_value(Record {
            meta: &meta,
            released_session: None,
        })
        .unwrap();
        assert_eq!(plain, serde_json::to_value(&meta).unwrap());
    }

    #[test]
    fn notes_say_what_the_session_does_and_how_to_release() {
        let note = held_note("web/s1", &holder("delete"));
        assert!(
            note.contains("deletes the key when the session ends"),
            "{note}"
        );
        assert!(note.contains("`state set web/s1 VALUE`"), "{note}");
        let note = held_note("web/s1", &holder("release"));
        assert!(note.contains("unbinds"), "{note}");
        assert!(!note.contains("state set"), "{note}");
    }
}
