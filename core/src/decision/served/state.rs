//! The state served: for every key, what Consul shows, the state answered
//! and why it differs (a hold), with the snapshot the responder answers
//! from and the counts the metrics export.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::generation::GenerationMark;
use crate::model::meta::KeyMeta;
use crate::model::snapshot::{Entry, KeyState, Snapshot};
use crate::model::value::{parse_value, AdminState};

use super::view::ConsulKey;

/// Why a key is answered with another state than the one Consul shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldCause {
    /// Consul's value is invalid; the last valid state is answered.
    InvalidValue,
    /// Consul lost its data (see [`crate::decision`]) and the value it shows
    /// now would give servers more traffic in the order of traffic
    /// ([`crate::model::value::Traffic`]); the state from before is answered
    /// (or caps the key's lines, see [`KeyRecord::capping`]) until the key
    /// is written again or `state release-rollback`.
    RolledBack,
    /// The token may no longer read the key (a direct read answers 403):
    /// its last drain or maint is answered, its last `ready` or weight caps
    /// the next identity, until the key can be read again.
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
/// use: `maint 100% (held: invalid value)`; for a key that caps the next
/// identity (`cap`, [`KeyRecord::capping`]), [`capped_answer`]; for a key
/// held absent, `no answer from this key, the next identity decides (held:
/// rolled back)`; for a key hidden with no value known, which stops the
/// lookup, `no answer: its value was never seen (held: hidden from the
/// token)`.
pub fn held_answer(
    served: Option<AdminState>,
    cap: Option<AdminState>,
    cause: HoldCause,
) -> String {
    match (served, cap) {
        (_, Some(cap)) => capped_answer(cap, cause),
        (Some(state), None) => format!("{} (held: {})", state.reply_text(), cause.words()),
        (None, None) if cause == HoldCause::Hidden => format!(
            "no answer: its value was never seen (held: {})",
            cause.words()
        ),
        (None, None) => format!(
            "no answer from this key, the next identity decides (held: {})",
            cause.words()
        ),
    }
}

/// What a held key that caps the next identity ([`KeyRecord::capping`])
/// answers, in the one phrase `/status` and the writer use: `at most drain
/// 100%: the next identity decides when it gives less (held: rolled back)`.
pub fn capped_answer(cap: AdminState, cause: HoldCause) -> String {
    format!(
        "at most {}: the next identity decides when it gives less (held: {})",
        cap.reply_text(),
        cause.words()
    )
}

/// How [`held_state`] writes a cap: `at most 40%`, `at most ready`.
const AT_MOST: &str = "at most ";

/// The `state` label of `gitlab_haproxy_agent_held_key` for a held key:
/// `at most 40%` for a key that caps the next identity (`cap`,
/// [`KeyRecord::capping`]: it vanished or is hidden, or answers nothing of
/// its own), else the state it answers (`drain`, `40%`), or `none` for a
/// key that answers nothing. [`parse_held_state`] reads it back, so the
/// writer says what `/status` says.
pub fn held_state(served: Option<AdminState>, cap: Option<AdminState>) -> String {
    match (served, cap) {
        (_, Some(cap)) => format!("{AT_MOST}{cap}"),
        (Some(state), None) => state.to_string(),
        (None, None) => "none".to_string(),
    }
}

/// [`held_state`] read back: (the state answered, the cap); both `None`
/// for `none` or a text that is neither.
pub fn parse_held_state(text: &str) -> (Option<AdminState>, Option<AdminState>) {
    match text.strip_prefix(AT_MOST) {
        Some(cap) => (None, parse_value(cap.as_bytes()).ok()),
        None => (parse_value(text.as_bytes()).ok(), None),
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
    /// For a held key that answers nothing of its own (`served` `None`):
    /// the most traffic it lets a later identity's answer give, in the
    /// order of traffic ([`AdminState::traffic`]). Set when a `ready` or a
    /// weight it showed is not answered (hidden from the token, or appeared
    /// from a store that lost data: it may be the newest write, or not),
    /// kept, and only ever lowered, while the hold lasts.
    pub cap: Option<AdminState>,
    /// The writer's record of the write Consul shows
    /// ([`KeyMeta::describes`]); `None`: written outside the writer. Kept
    /// while the key is held after it vanished or was hidden.
    pub meta: Option<Box<KeyMeta>>,
    /// Unix time in seconds (as given to the core) when this agent first
    /// served the key's current `served` state; kept across restarts in
    /// the state file.
    pub since: u64,
}

impl KeyRecord {
    /// The state this key caps a later identity's answer at, when it is
    /// held and may answer nothing of its own (an [`Entry::AtMost`] in the
    /// snapshot): a held state Consul shows no value for (it vanished from
    /// a store that lost data, or the token may no longer read it: the key
    /// may still hold the state, or be gone, and then the next identity
    /// decides; the lower of the two is answered), or its
    /// [`KeyRecord::cap`].
    pub fn capping(&self) -> Option<AdminState> {
        self.hold?;
        match (self.served, &self.consul) {
            (Some(state), None) => Some(state),
            (Some(_), Some(_)) => None,
            (None, _) => self.cap,
        }
    }
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
    /// The value of [`STORE_ID_KEY`](crate::model::identity::STORE_ID_KEY) in the last applied answer.
    pub store_id: Option<Box<str>>,
    /// The ModifyIndex of [`RELEASE_ROLLBACK_KEY`](crate::model::identity::RELEASE_ROLLBACK_KEY)
    /// in the last applied answer.
    pub release_mark: Option<u64>,
    /// The write generation ([`GENERATION_KEY`](crate::model::generation::GENERATION_KEY)) last shown by an applied
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

impl ServedState {
    /// The snapshot the responder answers from: every key with a served
    /// state, skipped keys as [`Entry::Invalid`] (looked past), and as
    /// [`Entry::AtMost`] (looked past, capping the answer) the held keys
    /// that may answer nothing of their own: a held state Consul shows no
    /// value for, and a cap ([`KeyRecord::cap`]).
    pub fn snapshot(&self) -> Snapshot {
        let mut keys = std::collections::HashMap::with_capacity(self.keys.len());
        for (key, record) in &self.keys {
            let modify_index = record.consul.as_ref().map_or(0, |c| c.modify_index);
            let entry = match (record.served, &record.consul) {
                _ if record.capping().is_some() => {
                    Entry::AtMost(record.capping().expect("checked"))
                }
                (Some(state), _) => Entry::Valid(state),
                // Hidden from the token with no value ever seen.
                (None, None) if record.hold.is_some_and(|h| h.cause == HoldCause::Hidden) => {
                    Entry::Unreadable
                }
                // Held with no answer of its own and no cap.
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

#[cfg(test)]
mod held_answer_tests {
    use super::*;

    #[test]
    fn one_phrase_per_hold() {
        use AdminState::{Maint, Ready, Weight};
        assert_eq!(
            held_answer(Some(Maint), None, HoldCause::InvalidValue),
            "maint 100% (held: invalid value)"
        );
        assert_eq!(
            held_answer(Some(Weight(50)), None, HoldCause::RolledBack),
            "ready 50% (held: rolled back)"
        );
        for served in [None, Some(Weight(40))] {
            assert_eq!(
                held_answer(served, Some(Weight(40)), HoldCause::Hidden),
                "at most ready 40%: the next identity decides when it gives less (held: hidden \
                 from the token)"
            );
        }
        assert_eq!(
            held_answer(None, None, HoldCause::RolledBack),
            "no answer from this key, the next identity decides (held: rolled back)"
        );
        assert_eq!(
            held_answer(None, None, HoldCause::Hidden),
            "no answer: its value was never seen (held: hidden from the token)"
        );
        for (served, cap, text) in [
            (Some(Maint), None, "maint"),
            (Some(Weight(40)), None, "40%"),
            (None, Some(Weight(0)), "at most 0%"),
            (None, Some(Ready), "at most ready"),
            (None, None, "none"),
        ] {
            assert_eq!(held_state(served, cap), text);
            assert_eq!(parse_held_state(text), (served, cap), "{text}");
        }
        assert_eq!(held_state(Some(Maint), Some(Maint)), "at most maint");
        assert_eq!(parse_held_state("at most frozen"), (None, None));
        for c in HoldCause::ALL {
            assert_eq!(HoldCause::from_label(c.as_str()), Some(c));
        }
        assert_eq!(HoldCause::from_label("frozen"), None);
    }
}
