//! The snapshot: an immutable copy of the prefix at one Consul index, built
//! from the KV pairs of one answer; the first-match lookup that decides the
//! answer to one agent-send line; and the diff between two copies.

use std::collections::HashMap;

use super::identity::{is_control_key, validate_identity, InvalidIdentity};
use super::value::{parse_value, AdminState, AnswerKind, InvalidValue};

/// One key as Consul returns it, value decoded from base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    /// The full key, prefix included.
    pub key: String,
    /// The raw value; empty when Consul says `null`.
    pub value: Vec<u8>,
    /// The key's ModifyIndex.
    pub modify_index: u64,
    /// The key's `Flags`: an opaque number Consul keeps for the application
    /// (`?flags=` on a KV PUT, `"Flags"` in a transaction, `consul kv put
    /// -flags=N`); 0 when the answer does not carry it. The writer CLI
    /// marks the row keys `state drain` writes with odd Flags (see
    /// [`DRAIN_FLAGS`](super::marks::DRAIN_FLAGS)).
    pub flags: u64,
}

/// What one key below the prefix holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A value the agent will answer with.
    Valid(AdminState),
    /// A value the agent refuses, with no valid state known: the lookup
    /// skips the key (the next identity decides); a server whose only keys
    /// are such gets no answer, so HAProxy keeps its current state. Boxed:
    /// rare, and an entry stays two words for every key held.
    Invalid(Box<InvalidValue>),
    /// A key the agent's token may not read (403), known only by the
    /// writer's record of it (`~meta/<key>`), its value never seen: the
    /// lookup stops at it with no answer, so HAProxy keeps the server's
    /// state (past a cap, the cap is answered). Skipping it could let a
    /// later identity put a server the key keeps out back in rotation.
    Unreadable,
    /// A held key that may answer nothing of its own
    /// ([`KeyRecord::capping`](crate::decision::served::KeyRecord::capping)):
    /// its value vanished from a store that lost data or is hidden from the
    /// token (it may still hold this state, or be gone), or a value appeared
    /// from a store that lost data (it may be the newest write, or not). It
    /// neither decides (it would outrank a later identity that says less)
    /// nor is skipped (a later identity, or the default `ready`, could give
    /// more): the lookup goes on past it, and the answer it finds is capped
    /// at this state, the lower of the two in the order of traffic
    /// ([`AdminState::traffic`]).
    AtMost(AdminState),
}

/// One key below the prefix, as held in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The parsed value.
    pub entry: Entry,
    /// Consul's ModifyIndex of the key: changes on every write that changes
    /// the value (identical writes keep it).
    pub modify_index: u64,
}

/// An immutable copy of the prefix at one Consul index. The watcher builds a
/// new one per Consul answer that changed and swaps it in whole.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `X-Consul-Index` of the answer this copy was built from.
    pub index: u64,
    /// Keys relative to the prefix (`web/web-01`, `canary`).
    pub keys: HashMap<Box<str>, KeyState>,
    /// Read from the agent's state file, no Consul answer applied since the
    /// start: drain, maint and weights are answered, `ready` is withheld
    /// ([`Answer::Withheld`]). A weight is answered because no answer is
    /// worse after a HAProxy reload, which starts every server at its
    /// configured weight (100%): the file keeps the lower side of the order
    /// of traffic. `ready` adds nothing a reload does not already give, and
    /// withheld it cannot undo a lower state HAProxy holds. Default `false`.
    pub provisional: bool,
}

/// The agent's decision for one agent-send line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Reply with this state, decided by the key at this position of the
    /// line, or `None` when no identity has a key (the default, `ready`).
    State {
        /// The state to reply with.
        state: AdminState,
        /// Position in the line of the identity whose key decided.
        decided_by: Option<usize>,
    },
    /// The only identities with a key hold invalid values: send nothing.
    Invalid {
        /// Position in the line of the first identity with an invalid key.
        decided_by: usize,
    },
    /// A provisional snapshot ([`Snapshot::provisional`]) would answer
    /// `ready`: send nothing until Consul has answered.
    Withheld {
        /// The state the file says.
        state: AdminState,
        /// As in [`Answer::State`].
        decided_by: Option<usize>,
    },
}

impl Answer {
    /// Position in the line of the identity whose key decided, `None` when
    /// none has a key (the default).
    pub fn decided_by(&self) -> Option<usize> {
        match *self {
            Answer::State { decided_by, .. } | Answer::Withheld { decided_by, .. } => decided_by,
            Answer::Invalid { decided_by } => Some(decided_by),
        }
    }

    /// The answer kind used as the `kind` label of
    /// `gitlab_haproxy_agent_answers_total`.
    pub fn kind(&self) -> AnswerKind {
        match self {
            Answer::State { state, .. } => state.kind(),
            Answer::Invalid { .. } => AnswerKind::Invalid,
            Answer::Withheld { .. } => AnswerKind::Unsynced,
        }
    }
}

impl Snapshot {
    /// Number of keys whose value is invalid.
    pub fn invalid_count(&self) -> usize {
        self.keys
            .values()
            .filter(|k| matches!(k.entry, Entry::Invalid(_)))
            .count()
    }

    /// First-match lookup: the answer comes from the first identity that has
    /// a key with a valid state; a key with an invalid state (one with no
    /// valid state known: the decision core serves the last valid state of
    /// the others) is skipped, as if absent, so a typo in a row key cannot
    /// hide a group's drain. If no identity has a key, the server is `ready`
    /// at its configured weight; if the only keys are invalid, it gets no
    /// answer ([`Answer::Invalid`], HAProxy keeps its state). A held key
    /// that caps ([`Entry::AtMost`]) is looked past and caps the answer
    /// found; past a cap, keys that answer nothing (invalid, or hidden and
    /// never seen) answer the cap.
    pub fn lookup<'a, I>(&self, identities: I) -> Answer
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut first_invalid = None;
        // The lowest cap met so far, with its position.
        let mut cap: Option<(AdminState, usize)> = None;
        let capped =
            |state: AdminState, position: Option<usize>, cap: Option<(AdminState, usize)>| {
                match cap {
                    // On a tie the cap, the earlier key, decides.
                    Some((c, p)) if !c.more_than(state) => (c, Some(p)),
                    _ => (state, position),
                }
            };
        for (position, identity) in identities.into_iter().enumerate() {
            match self.keys.get(identity).map(|k| &k.entry) {
                Some(Entry::Valid(state)) => {
                    let (state, decided_by) = capped(*state, Some(position), cap);
                    return self.answer(state, decided_by);
                }
                Some(Entry::AtMost(state)) if cap.is_none_or(|(c, _)| c.more_than(*state)) => {
                    cap = Some((*state, position));
                }
                Some(Entry::AtMost(_)) => {}
                Some(Entry::Invalid(_)) => {
                    first_invalid.get_or_insert(position);
                }
                // Past a cap, the cap is answered (as past only invalid
                // keys, below).
                Some(Entry::Unreadable) => {
                    return match cap {
                        Some((state, position)) => self.answer(state, Some(position)),
                        None => Answer::Invalid {
                            decided_by: position,
                        },
                    }
                }
                None => {}
            }
        }
        match (first_invalid, cap) {
            // Only invalid keys past a cap: no answer could leave the
            // server at more than the cap allows (a reload starts it at
            // its configured weight), so the cap is answered.
            (Some(_), Some((state, position))) => self.answer(state, Some(position)),
            (Some(decided_by), None) => Answer::Invalid { decided_by },
            (None, _) => {
                let (state, decided_by) = capped(AdminState::Ready, None, cap);
                self.answer(state, decided_by)
            }
        }
    }

    /// The answer of `state`, withheld when this snapshot is provisional and
    /// the state is `ready` ([`Snapshot::provisional`]).
    fn answer(&self, state: AdminState, decided_by: Option<usize>) -> Answer {
        if self.provisional && state == AdminState::Ready {
            Answer::Withheld { state, decided_by }
        } else {
            Answer::State { state, decided_by }
        }
    }
}

/// The entry of one key below the prefix (`rel`, relative) holding `raw`;
/// `None` for a folder key without a value, which only marks the folder. A
/// folder key with a value is a typo (`consul kv put .../web/web-07/ maint`)
/// that must show, not vanish; a key that is not an identity is invalid
/// whatever its value.
pub fn parse_entry(rel: &str, raw: &[u8]) -> Option<Entry> {
    if rel.is_empty() || rel.ends_with('/') {
        if raw.is_empty() {
            return None;
        }
        return Some(Entry::Invalid(Box::new(InvalidValue::Key(
            InvalidIdentity::BadShape(rel.to_string()),
        ))));
    }
    Some(match validate_identity(rel) {
        Err(e) => Entry::Invalid(Box::new(InvalidValue::Key(e))),
        Ok(()) => match parse_value(raw) {
            Ok(state) => Entry::Valid(state),
            Err(e) => Entry::Invalid(Box::new(e)),
        },
    })
}

/// Builds a snapshot from the `pairs` of one prefix answer at Consul index
/// `index` (clamped to 1). Keys are made relative to `prefix`; folder keys
/// (ending in `/`) and the agent's control keys ([`is_control_key`]) are
/// skipped; a key that is not a valid identity, or whose value is invalid,
/// is held as [`Entry::Invalid`] so it is counted and shown, never answered.
pub fn build_snapshot(prefix: &str, index: u64, pairs: &[KvPair]) -> Snapshot {
    let mut keys = HashMap::with_capacity(pairs.len());
    for pair in pairs {
        let Some(rel) = pair.key.strip_prefix(prefix) else {
            continue;
        };
        if is_control_key(rel) {
            continue;
        }
        let Some(entry) = parse_entry(rel, &pair.value) else {
            continue;
        };
        keys.insert(
            rel.into(),
            KeyState {
                entry,
                modify_index: pair.modify_index,
            },
        );
    }
    Snapshot {
        index: index.max(1),
        keys,
        provisional: false,
    }
}

/// One key that differs between two snapshots (see [`diff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyChange<'a> {
    /// The key is new, its entry changed, or it holds an invalid value
    /// written again (a new ModifyIndex).
    Set {
        /// The key, relative to the prefix.
        key: &'a str,
        /// What it holds now.
        state: &'a KeyState,
        /// What it held before; `None` for a new key.
        prev: Option<&'a KeyState>,
    },
    /// The key is gone.
    Removed {
        /// The key, relative to the prefix.
        key: &'a str,
        /// What it held.
        prev: &'a KeyState,
    },
}

/// The keys that differ from `old` (`None`: no copy yet) to `new`: first
/// those of `new` that are new or changed, then those removed. A valid value
/// rewritten as it was is no change (only its ModifyIndex moved); an invalid
/// one is, so that each write of a bad value is logged once.
pub fn diff<'a>(old: Option<&'a Snapshot>, new: &'a Snapshot) -> Vec<KeyChange<'a>> {
    let mut changes = Vec::new();
    for (key, state) in &new.keys {
        let prev = old.and_then(|o| o.keys.get(key));
        match prev {
            Some(prev)
                if prev.entry == state.entry
                    && (matches!(state.entry, Entry::Valid(_))
                        || prev.modify_index == state.modify_index) => {}
            prev => changes.push(KeyChange::Set { key, state, prev }),
        }
    }
    if let Some(old) = old {
        for (key, prev) in &old.keys {
            if !new.keys.contains_key(key) {
                changes.push(KeyChange::Removed { key, prev });
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(pairs: &[(&str, &[u8])]) -> Snapshot {
        let keys = pairs
            .iter()
            .map(|(k, v)| {
                let entry = match parse_value(v) {
                    Ok(s) => Entry::Valid(s),
                    Err(e) => Entry::Invalid(Box::new(e)),
                };
                (
                    (*k).into(),
                    KeyState {
                        entry,
                        modify_index: 1,
                    },
                )
            })
            .collect();
        Snapshot {
            index: 1,
            keys,
            provisional: false,
        }
    }

    #[test]
    fn first_identity_with_a_key_decides() {
        let snap = snapshot(&[("canary", b"drain"), ("web/web-cny-01", b"50%")]);
        assert_eq!(
            snap.lookup(["web/web-cny-01", "canary"]),
            Answer::State {
                state: AdminState::Weight(50),
                decided_by: Some(0)
            }
        );
        assert_eq!(
            snap.lookup(["web/web-cny-02", "canary"]),
            Answer::State {
                state: AdminState::Drain,
                decided_by: Some(1)
            }
        );
        assert_eq!(
            snap.lookup(["web/web-01"]),
            Answer::State {
                state: AdminState::Ready,
                decided_by: None
            }
        );
    }

    #[test]
    fn a_provisional_snapshot_answers_all_but_ready() {
        let mut snap = snapshot(&[
            ("canary", b"drain"),
            ("web/web-02", b"maint"),
            ("web/web-03", b"50%"),
            ("web/web-04", b"ready"),
            ("web/web-06", b"0%"),
        ]);
        snap.provisional = true;
        let table: [(&[&str], Answer); 6] = [
            (
                &["web/web-01", "canary"],
                Answer::State {
                    state: AdminState::Drain,
                    decided_by: Some(1),
                },
            ),
            (
                &["web/web-02"],
                Answer::State {
                    state: AdminState::Maint,
                    decided_by: Some(0),
                },
            ),
            // A reload starts every server at its configured weight: no
            // answer would give it more than the file's weight.
            (
                &["web/web-03", "canary"],
                Answer::State {
                    state: AdminState::Weight(50),
                    decided_by: Some(0),
                },
            ),
            (
                &["web/web-06"],
                Answer::State {
                    state: AdminState::Weight(0),
                    decided_by: Some(0),
                },
            ),
            (
                &["web/web-04"],
                Answer::Withheld {
                    state: AdminState::Ready,
                    decided_by: Some(0),
                },
            ),
            (
                &["web/web-05"],
                Answer::Withheld {
                    state: AdminState::Ready,
                    decided_by: None,
                },
            ),
        ];
        for (line, want) in table {
            assert_eq!(snap.lookup(line.iter().copied()), want, "{line:?}");
        }
        assert_eq!(
            snap.lookup(["web/web-04"]).kind(),
            AnswerKind::Unsynced,
            "counted as not synced"
        );
    }

    #[test]
    fn a_hidden_ready_or_weight_is_looked_past_and_caps_the_answer() {
        let mut snap = snapshot(&[("canary", b"drain"), ("zone-b", b"150%")]);
        let at_most = |state| KeyState {
            entry: Entry::AtMost(state),
            modify_index: 3,
        };
        snap.keys
            .insert("web/s1".into(), at_most(AdminState::Weight(40)));
        snap.keys
            .insert("web/s2".into(), at_most(AdminState::Ready));
        let state = |state, decided_by| Answer::State { state, decided_by };
        let table: [(&[&str], Answer); 6] = [
            // A later drain is less: it decides.
            (&["web/s1", "canary"], state(AdminState::Drain, Some(1))),
            // Nothing later, or more later: the cap decides.
            (&["web/s1"], state(AdminState::Weight(40), Some(0))),
            (
                &["web/s1", "zone-b"],
                state(AdminState::Weight(40), Some(0)),
            ),
            (&["web/s2", "zone-b"], state(AdminState::Ready, Some(0))),
            // A tie: the cap, the earlier key, decides.
            (&["web/s2"], state(AdminState::Ready, Some(0))),
            // The lowest of two caps.
            (
                &["web/s2", "web/s1", "zone-b"],
                state(AdminState::Weight(40), Some(1)),
            ),
        ];
        for (line, want) in table {
            assert_eq!(snap.lookup(line.iter().copied()), want, "{line:?}");
        }
    }

    #[test]
    fn an_invalid_key_is_skipped_and_the_next_identity_decides() {
        let snap = snapshot(&[("web/web-cny-01", b"drian"), ("canary", b"maint")]);
        assert_eq!(
            snap.lookup(["web/web-cny-01", "canary"]),
            Answer::State {
                state: AdminState::Maint,
                decided_by: Some(1)
            }
        );
        // Nothing valid after it: no answer, HAProxy keeps its state.
        assert_eq!(
            snap.lookup(["web/web-cny-01", "zone-a"]),
            Answer::Invalid { decided_by: 0 }
        );
        assert_eq!(snap.invalid_count(), 1);
    }

    fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            modify_index,
            flags: 0,
        }
    }

    #[test]
    fn snapshot_strips_prefix_skips_folders_and_flags_bad_keys() {
        let pairs = [
            pair("p/", "", 1),
            pair("p/canary", "DRAIN", 2),
            pair("p/web/web-01", "50%", 3),
            pair("p/web/", "", 4),
            pair("p/a/b/c", "drain", 5),
            pair("p/web/web-02", "drian", 6),
            pair("p/web/web-07/", "maint", 7),
        ];
        let snap = build_snapshot("p/", 0, &pairs);
        assert_eq!(snap.index, 1);
        assert_eq!(snap.keys.len(), 5);
        assert_eq!(snap.keys["canary"].entry, Entry::Valid(AdminState::Drain));
        assert_eq!(
            snap.keys["web/web-01"].entry,
            Entry::Valid(AdminState::Weight(50))
        );
        assert!(matches!(
            &snap.keys["a/b/c"].entry,
            Entry::Invalid(e) if matches!(**e, InvalidValue::Key(_))
        ));
        assert!(matches!(
            &snap.keys["web/web-07/"].entry,
            Entry::Invalid(e) if matches!(**e, InvalidValue::Key(InvalidIdentity::BadShape(_)))
        ));
        assert_eq!(snap.invalid_count(), 3);
    }

    #[test]
    fn writer_records_are_not_keys() {
        let pairs = [
            pair("p/~meta/", "", 1),
            pair("p/~meta/canary", r#"{"by":"a","at":1,"value":"drain"}"#, 2),
            pair("p/~meta/web/web-01", "junk", 3),
            pair("p/canary", "drain", 2),
        ];
        let snap = build_snapshot("p/", 3, &pairs);
        assert_eq!(
            snap.keys.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["canary"]
        );
        assert_eq!(snap.invalid_count(), 0);
    }

    #[test]
    fn diff_names_changed_and_removed_keys_and_each_write_of_an_invalid_value() {
        let a = build_snapshot(
            "p/",
            5,
            &[
                pair("p/canary", "drain", 2),
                pair("p/x", "maint", 3),
                pair("p/bad", "drian", 4),
                pair("p/same", "ready", 4),
            ],
        );
        assert_eq!(diff(None, &a).len(), 4);
        assert_eq!(diff(Some(&a), &a), vec![]);
        let b = build_snapshot(
            "p/",
            6,
            &[
                pair("p/canary", "maint", 6),
                pair("p/bad", "drian", 6),
                pair("p/same", "ready", 6),
            ],
        );
        let mut keys: Vec<(&str, bool)> = diff(Some(&a), &b)
            .iter()
            .map(|c| match c {
                KeyChange::Set { key, .. } => (*key, true),
                KeyChange::Removed { key, .. } => (*key, false),
            })
            .collect();
        keys.sort();
        // `same` was rewritten as it was; `bad` was written again.
        assert_eq!(keys, [("bad", true), ("canary", true), ("x", false)]);
    }
}
