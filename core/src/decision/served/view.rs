//! One Consul answer as the core judges it: the state keys by name, with
//! the control keys (store id, write generation, release mark, the
//! writer's records) taken apart.

use std::collections::BTreeMap;

use crate::model::generation::{BadGeneration, Generation, GENERATION_KEY};
use crate::model::identity::{is_control_key, validate_identity, InvalidIdentity, STORE_ID_KEY};
use crate::model::meta::{parse_meta, KeyMeta, META_PREFIX};
use crate::model::snapshot::{parse_entry, Entry, KvPair};
use crate::model::value::InvalidValue;

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
            Entry::Valid(_) | Entry::Unreadable | Entry::AtMost(_) => None,
            Entry::Invalid(_) => Some(String::from_utf8_lossy(raw).into()),
        };
        ConsulKey {
            value,
            entry,
            modify_index,
        }
    }
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
    pub generation: Option<Result<Generation, BadGeneration>>,
    /// The ModifyIndex of [`GENERATION_KEY`], 0 when absent: the index of
    /// the writer's last transaction, which also wrote the records of the
    /// keys it wrote.
    pub generation_index: u64,
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
                view.generation_index = pair.modify_index;
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
