//! The served state: for every key below the prefix, what Consul shows, the
//! state answered and why it differs (a hold), with the rules that merge one
//! Consul answer into it. This is what the agent keeps on disk, so that a
//! restart answers what the agent answered before it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::generation::{Generation, GenerationMark, GENERATION_KEY};
use crate::model::identity::{is_control_key, validate_identity, InvalidIdentity};
use crate::model::meta::{parse_meta, KeyMeta, META_PREFIX};
use crate::model::snapshot::{parse_entry, Entry, KeyState, KvPair, Snapshot};
use crate::model::value::{parse_value, AdminState, InvalidValue};

pub use crate::model::identity::STORE_ID_KEY;

/// Why a key is answered with another state than the one Consul shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldCause {
    /// Consul's value is invalid; the last valid state is answered.
    InvalidValue,
    /// Consul lost its data (see [`crate::decision`]) and the value it shows
    /// now would put servers back in rotation (drain or maint left, or a
    /// `ready` or weight appeared); the state from before is answered
    /// (possibly none: held absent) until the key is written again or
    /// `state release-rollback`.
    RolledBack,
    /// The token may no longer read the key (a direct read answers 403);
    /// its last state is answered until the key can be read again.
    Hidden,
}

impl HoldCause {
    /// Every cause, so each label value exists at 0 from start-up.
    pub const ALL: [HoldCause; 3] = [
        HoldCause::InvalidValue,
        HoldCause::RolledBack,
        HoldCause::Hidden,
    ];

    /// `invalid_value`, `rolled_back` or `hidden`: the `cause` on `/status`
    /// and the label of `gitlab_haproxy_agent_held_keys`.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldCause::InvalidValue => "invalid_value",
            HoldCause::RolledBack => "rolled_back",
            HoldCause::Hidden => "hidden",
        }
    }

    /// The cause in words, as every surface says it: `invalid value`,
    /// `rolled back`, `hidden from the token`.
    pub fn words(self) -> &'static str {
        match self {
            HoldCause::InvalidValue => "invalid value",
            HoldCause::RolledBack => "rolled back",
            HoldCause::Hidden => "hidden from the token",
        }
    }

    /// The cause named by [`HoldCause::as_str`].
    pub fn from_label(label: &str) -> Option<HoldCause> {
        HoldCause::ALL.into_iter().find(|c| c.as_str() == label)
    }
}

/// What a held key answers, in the one phrase `/status`, the writer (`state
/// list`, `get`, `explain`, `status`, `release-rollback`) and the runbook
/// use: `maint 100% (held: invalid value)`; for a key held absent,
/// `no answer from this key, the next identity decides (held: rolled back)`;
/// for a key hidden with no value known, which stops the lookup, `no
/// answer: its value was never seen (held: hidden from the token)`.
pub fn held_answer(served: Option<AdminState>, cause: HoldCause) -> String {
    match served {
        Some(state) => format!(
            "{} (held: {})",
            String::from_utf8_lossy(state.reply().as_bytes()).trim_end(),
            cause.words()
        ),
        None if cause == HoldCause::Hidden => format!(
            "no answer: its value was never seen (held: {})",
            cause.words()
        ),
        None => format!(
            "no answer from this key, the next identity decides (held: {})",
            cause.words()
        ),
    }
}

/// A key as the last applied Consul answer (or direct read) showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulKey {
    /// An invalid value as text (lossy UTF-8), for the file; `None` for a
    /// valid one, whose canonical spelling stands for it.
    pub value: Option<Box<str>>,
    /// The parsed value.
    pub entry: Entry,
    /// Consul's ModifyIndex of the key.
    pub modify_index: u64,
}

impl ConsulKey {
    /// Parses one key (relative to the prefix) and its raw value
    /// ([`parse_entry`]); a folder key without a value, which an answer never
    /// keeps, is invalid here.
    pub fn parse(rel: &str, raw: &[u8], modify_index: u64) -> ConsulKey {
        let entry = parse_entry(rel, raw).unwrap_or_else(|| {
            Entry::Invalid(Box::new(InvalidValue::Key(InvalidIdentity::BadShape(
                rel.into(),
            ))))
        });
        ConsulKey::new(entry, raw, modify_index)
    }

    fn new(entry: Entry, raw: &[u8], modify_index: u64) -> ConsulKey {
        let value = match entry {
            Entry::Valid(_) | Entry::Unreadable => None,
            Entry::Invalid(_) => Some(String::from_utf8_lossy(raw).into()),
        };
        ConsulKey {
            value,
            entry,
            modify_index,
        }
    }
}

/// One key of the served state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// What Consul shows; `None` while held after it vanished or was hidden.
    pub consul: Option<ConsulKey>,
    /// The state answered for the key; `None`: the key is skipped (an
    /// invalid value with no valid state known), the next identity on the
    /// line decides.
    pub served: Option<AdminState>,
    /// Why `served` is not Consul's value, if it is not.
    pub hold: Option<Hold>,
    /// The writer's record of the write Consul shows
    /// ([`KeyMeta::describes`]); `None`: written outside the writer. Kept
    /// while the key is held after it vanished or was hidden.
    pub meta: Option<Box<KeyMeta>>,
    /// Unix time in seconds (as given to the core) when this agent first
    /// served the key's current `served` state; kept across restarts in
    /// the state file.
    pub since: u64,
}

/// A hold on one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// Why.
    pub cause: HoldCause,
    /// Unix time in seconds when the hold began (as given to the core).
    pub since: u64,
}

/// The state served: the last applied Consul answer with every hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedState {
    /// `X-Consul-Index` of the last applied answer (at least 1).
    pub index: u64,
    /// The value of [`STORE_ID_KEY`] in the last applied answer.
    pub store_id: Option<Box<str>>,
    /// The ModifyIndex of [`RELEASE_ROLLBACK_KEY`](crate::model::identity::RELEASE_ROLLBACK_KEY)
    /// in the last applied answer.
    pub release_mark: Option<u64>,
    /// The write generation ([`GENERATION_KEY`]) last shown by an applied
    /// answer, kept through answers that lack it (a token that may not read
    /// it, a delete by hand) so that a branch showing up later is still
    /// told; `None` when none was ever shown.
    pub generation: Option<GenerationMark>,
    /// Whether the last applied answer showed [`ServedState::generation`]:
    /// its vanishing is lost data once, not at every answer after.
    pub generation_shown: bool,
    /// Every key known, relative to the prefix.
    pub keys: BTreeMap<Box<str>, KeyRecord>,
    /// Writer records in the last applied answer that could not be used
    /// (malformed, over-long, or below no valid identity); not kept in the
    /// state file.
    pub invalid_meta: usize,
}

/// A key served drain, maint or a weight, for the metrics
/// ([`ServedState::out_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutKey<'a> {
    /// The key, relative to the prefix.
    pub key: &'a str,
    /// The state served.
    pub state: AdminState,
    /// Unix time in seconds since when: the writer's record when it
    /// describes the state served, else when this agent first served it.
    pub since: u64,
    /// The record's `until`, Unix seconds, when it describes the state.
    pub until: Option<u64>,
}

/// The state keys of one Consul answer, relative to the prefix, with the
/// store id and the release mark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerView {
    /// `X-Consul-Index`, clamped to at least 1.
    pub index: u64,
    /// The state keys (folders without a value and control keys skipped).
    pub keys: BTreeMap<Box<str>, ConsulKey>,
    /// The value of [`STORE_ID_KEY`], if present.
    pub store_id: Option<Box<str>>,
    /// The ModifyIndex of [`STORE_ID_KEY`], 0 when absent.
    pub store_id_index: u64,
    /// The ModifyIndex of the release-rollback key, if present.
    pub release_mark: Option<u64>,
    /// The write generation ([`GENERATION_KEY`]), as it parsed: `None` when
    /// absent, an error for a value that does not parse (written by hand).
    pub generation: Option<Result<Generation, crate::model::generation::BadGeneration>>,
    /// The writer's records (`~meta/<key>`) by key, with their ModifyIndex.
    pub meta: BTreeMap<Box<str>, (KeyMeta, u64)>,
    /// Records that could not be used.
    pub invalid_meta: usize,
    /// The largest ModifyIndex of any pair shown (control and folder keys
    /// included), 0 for none: Consul's index for a prefix is the largest
    /// ModifyIndex below it or of a tombstone below it (kvsListTxn).
    pub latest_shown: u64,
}

impl AnswerView {
    /// Splits the pairs of one prefix answer at `index`.
    pub fn new(prefix: &str, index: u64, pairs: &[KvPair]) -> AnswerView {
        let mut view = AnswerView {
            index: index.max(1),
            ..AnswerView::default()
        };
        for pair in pairs {
            view.latest_shown = view.latest_shown.max(pair.modify_index);
            let Some(rel) = pair.key.strip_prefix(prefix) else {
                continue;
            };
            if rel == STORE_ID_KEY {
                view.store_id = Some(String::from_utf8_lossy(&pair.value).trim().into());
                view.store_id_index = pair.modify_index;
                continue;
            }
            if rel == crate::model::identity::RELEASE_ROLLBACK_KEY {
                view.release_mark = Some(pair.modify_index);
                continue;
            }
            if rel == GENERATION_KEY {
                view.generation = Some(Generation::parse(&pair.value));
                continue;
            }
            if let Some(key) = rel.strip_prefix(META_PREFIX) {
                match parse_meta(&pair.value) {
                    Ok(m) if validate_identity(key).is_ok() => {
                        view.meta.insert(key.into(), (m, pair.modify_index));
                    }
                    // The folder key `~meta/` itself, without a value.
                    _ if key.is_empty() && pair.value.is_empty() => {}
                    _ => view.invalid_meta += 1,
                }
                continue;
            }
            if is_control_key(rel) {
                continue;
            }
            let Some(entry) = parse_entry(rel, &pair.value) else {
                continue;
            };
            view.keys.insert(
                rel.into(),
                ConsulKey::new(entry, &pair.value, pair.modify_index),
            );
        }
        view
    }
}

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
    ///   [`undoes`]: drain or maint left, a `ready` or a weight that
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

    /// The snapshot the responder answers from: every key with a served
    /// state, and skipped keys as [`Entry::Invalid`] (looked past).
    pub fn snapshot(&self) -> Snapshot {
        let mut keys = std::collections::HashMap::with_capacity(self.keys.len());
        for (key, record) in &self.keys {
            let modify_index = record.consul.as_ref().map_or(0, |c| c.modify_index);
            let entry = match (record.served, &record.consul) {
                (Some(state), _) => Entry::Valid(state),
                // Hidden from the token with no value ever seen.
                (None, None) if record.hold.is_some_and(|h| h.cause == HoldCause::Hidden) => {
                    Entry::Unreadable
                }
                // Held absent: a value that appeared from a store that lost
                // data is not answered.
                (None, _) if record.hold.is_some() => continue,
                (None, Some(c)) => c.entry.clone(),
                (None, None) => continue,
            };
            keys.insert(
                key.clone(),
                KeyState {
                    entry,
                    modify_index,
                },
            );
        }
        Snapshot {
            index: self.index,
            keys,
            provisional: false,
        }
    }

    /// How many keys are held, by cause.
    pub fn held_count(&self, cause: HoldCause) -> usize {
        self.keys
            .values()
            .filter(|r| r.hold.is_some_and(|h| h.cause == cause))
            .count()
    }

    /// How many keys Consul shows with an invalid value (held or skipped).
    pub fn invalid_count(&self) -> usize {
        self.keys
            .values()
            .filter(|r| {
                r.consul
                    .as_ref()
                    .is_some_and(|c| matches!(c.entry, Entry::Invalid(_)))
            })
            .count()
    }

    /// How many keys Consul shows (a key hidden from the token is not
    /// shown, whatever was last seen of it).
    pub fn consul_key_count(&self) -> usize {
        self.keys
            .values()
            .filter(|r| r.consul.is_some() && !r.hold.is_some_and(|h| h.cause == HoldCause::Hidden))
            .count()
    }

    /// Every key served drain, maint or a weight, oldest first (ties by
    /// key), with since when and the record's `until`; a key whose since is
    /// not known yet (read from a state file written before it was kept,
    /// until the first answer) is left out rather than shown as 1970.
    pub fn out_keys(&self) -> Vec<OutKey<'_>> {
        let mut out: Vec<OutKey<'_>> = self
            .keys
            .iter()
            .filter_map(|(key, r)| {
                let state = r.served.filter(|s| *s != AdminState::Ready)?;
                let meta = r
                    .meta
                    .as_deref()
                    .filter(|m| parse_value(m.value.as_bytes()).ok() == Some(state));
                let since = meta.map_or(r.since, |m| m.at);
                (since > 0).then_some(OutKey {
                    key,
                    state,
                    since,
                    until: meta.and_then(|m| m.until),
                })
            })
            .collect();
        out.sort_by(|a, b| a.since.cmp(&b.since).then(a.key.cmp(b.key)));
        out
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
        // invalid value) or never seen stays so.
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

/// The file format of the served state (`served-state.json`), version 1,
/// as read ([`FileOut`] writes it).
#[derive(Debug, Deserialize)]
struct FileV1 {
    version: u32,
    prefix: String,
    index: u64,
    store_id: Option<String>,
    release_mark: Option<u64>,
    /// The write generation served, `<number> <id>` (absent in files from
    /// before it was kept).
    #[serde(default)]
    generation: Option<String>,
    keys: BTreeMap<String, FileKey>,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileKey {
    /// Consul's value as text; absent while held after it vanished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    modify_index: Option<u64>,
    /// The state answered: `ready`, `drain`, `maint`, `N%`; absent: skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    served: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold: Option<HoldCause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold_since: Option<u64>,
    /// When the agent first served `served` (absent in files from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    since: Option<u64>,
    /// The writer's record of the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<KeyMeta>,
}

/// Why a state file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateFileError {
    /// Not JSON of the expected shape.
    #[error("not a served-state file: {0}")]
    Malformed(String),
    /// Another format version.
    #[error("format version {0} is not 1")]
    Version(u32),
    /// Written for another prefix.
    #[error("written for prefix {0:?}, not this agent's")]
    Prefix(String),
    /// A served state that does not parse.
    #[error("key {key:?}: served state {value:?} is not ready, drain, maint or N%")]
    Served {
        /// The key.
        key: String,
        /// The text.
        value: String,
    },
}

/// The file written, borrowing from the state (no copy of it is made).
#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    prefix: &'a str,
    index: u64,
    store_id: Option<&'a str>,
    release_mark: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<String>,
    keys: KeysOut<'a>,
}

/// A generation served as the file keeps it: `<number> <id>`.
fn file_generation(mark: GenerationMark) -> String {
    Generation {
        number: mark.number,
        ids: vec![mark.id],
    }
    .to_string()
}

struct KeysOut<'a>(&'a BTreeMap<Box<str>, KeyRecord>);

impl Serialize for KeysOut<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, r) in self.0 {
            map.serialize_entry(
                &**k,
                &FileKey {
                    value: r.consul.as_ref().map(|c| match (&c.value, &c.entry) {
                        (Some(v), _) => v.to_string(),
                        (None, Entry::Valid(state)) => state.to_string(),
                        (None, Entry::Invalid(_) | Entry::Unreadable) => String::new(),
                    }),
                    modify_index: r.consul.as_ref().map(|c| c.modify_index),
                    served: r.served.map(|s| s.to_string()),
                    hold: r.hold.map(|h| h.cause),
                    hold_since: r.hold.map(|h| h.since),
                    since: Some(r.since),
                    meta: r.meta.as_deref().cloned(),
                },
            )?;
        }
        map.end()
    }
}

impl ServedState {
    /// Writes the served state as `served-state.json` (format version 1)
    /// for the watched `prefix`, streamed: no copy of the state is made.
    ///
    /// # Errors
    ///
    /// The writer's I/O error.
    pub fn write_file<W: std::io::Write>(&self, prefix: &str, writer: W) -> std::io::Result<()> {
        let file = FileOut {
            version: 1,
            prefix,
            index: self.index,
            store_id: self.store_id.as_deref(),
            release_mark: self.release_mark,
            generation: self.generation.map(file_generation),
            keys: KeysOut(&self.keys),
        };
        serde_json::to_writer(writer, &file).map_err(std::io::Error::other)
    }

    /// The served state as the JSON text of `served-state.json`.
    pub fn to_file(&self, prefix: &str) -> String {
        let mut out = Vec::new();
        // Writing to memory cannot fail.
        let _ = self.write_file(prefix, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Reads `served-state.json` text written by [`ServedState::to_file`]
    /// for `prefix`.
    ///
    /// # Errors
    ///
    /// [`StateFileError`] for malformed text, another version or prefix, or
    /// a served state that does not parse.
    pub fn from_file(prefix: &str, text: &str) -> Result<ServedState, StateFileError> {
        let file: FileV1 =
            serde_json::from_str(text).map_err(|e| StateFileError::Malformed(e.to_string()))?;
        if file.version != 1 {
            return Err(StateFileError::Version(file.version));
        }
        if file.prefix != prefix {
            return Err(StateFileError::Prefix(file.prefix));
        }
        let mut keys = BTreeMap::new();
        for (key, k) in file.keys {
            let served = match &k.served {
                None => None,
                Some(text) => {
                    Some(
                        parse_value(text.as_bytes()).map_err(|_| StateFileError::Served {
                            key: key.clone(),
                            value: text.clone(),
                        })?,
                    )
                }
            };
            let consul = match (k.value, k.modify_index) {
                (Some(v), Some(mi)) => Some(ConsulKey::parse(&key, v.as_bytes(), mi)),
                _ => None,
            };
            let hold = k.hold.map(|cause| Hold {
                cause,
                since: k.hold_since.unwrap_or(0),
            });
            keys.insert(
                key.into(),
                KeyRecord {
                    consul,
                    served,
                    hold,
                    meta: k.meta.map(Box::new),
                    since: k.since.unwrap_or(0),
                },
            );
        }
        let generation = match file.generation {
            None => None,
            Some(text) => Some(
                Generation::parse(text.as_bytes())
                    .map_err(|e| StateFileError::Malformed(e.to_string()))?
                    .mark(),
            ),
        };
        Ok(ServedState {
            index: file.index.max(1),
            store_id: file.store_id.map(Into::into),
            release_mark: file.release_mark,
            generation_shown: generation.is_some(),
            generation,
            keys,
            invalid_meta: 0,
        })
    }
}

#[cfg(test)]
mod held_answer_tests {
    use super::*;

    #[test]
    fn one_phrase_per_hold() {
        assert_eq!(
            held_answer(Some(AdminState::Maint), HoldCause::InvalidValue),
            "maint 100% (held: invalid value)"
        );
        assert_eq!(
            held_answer(Some(AdminState::Weight(50)), HoldCause::Hidden),
            "ready 50% (held: hidden from the token)"
        );
        assert_eq!(
            held_answer(None, HoldCause::RolledBack),
            "no answer from this key, the next identity decides (held: rolled back)"
        );
        assert_eq!(
            held_answer(None, HoldCause::Hidden),
            "no answer: its value was never seen (held: hidden from the token)"
        );
        for c in HoldCause::ALL {
            assert_eq!(HoldCause::from_label(c.as_str()), Some(c));
        }
        assert_eq!(HoldCause::from_label("frozen"), None);
    }
}
