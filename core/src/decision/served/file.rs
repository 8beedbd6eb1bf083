//! The served state on disk (`served-state.json`, format version 1),
//! streamed out and read back by the agent's state file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::state::{Hold, HoldCause, KeyRecord, ServedState};
use super::view::ConsulKey;
use crate::model::generation::{Generation, GenerationMark};
use crate::model::meta::KeyMeta;
use crate::model::snapshot::Entry;
use crate::model::value::parse_value;

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
    /// The last answer applied lacked the generation (kept to judge the
    /// next one by); absent: it showed it.
    #[serde(default)]
    generation_vanished: bool,
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
    /// The cap of a held key that answers nothing of its own
    /// ([`KeyRecord::cap`]; absent in files from before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cap: Option<String>,
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
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    generation_vanished: bool,
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
                        (None, Entry::Invalid(_) | Entry::Unreadable | Entry::AtMost(_)) => {
                            String::new()
                        }
                    }),
                    modify_index: r.consul.as_ref().map(|c| c.modify_index),
                    served: r.served.map(|s| s.to_string()),
                    hold: r.hold.map(|h| h.cause),
                    hold_since: r.hold.map(|h| h.since),
                    cap: r.cap.map(|s| s.to_string()),
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
            generation_vanished: self.generation.is_some() && !self.generation_shown,
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
            let parse = |text: &String| {
                parse_value(text.as_bytes()).map_err(|_| StateFileError::Served {
                    key: key.clone(),
                    value: text.clone(),
                })
            };
            let served = k.served.as_ref().map(parse).transpose()?;
            let cap = k.cap.as_ref().map(parse).transpose()?;
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
                    // A file from before caps were kept: a held key with no
                    // answer of its own is capped by the value it shows.
                    cap: cap.or(match (served, hold, &consul) {
                        (None, Some(_), Some(c)) => match c.entry {
                            Entry::Valid(state) => Some(state),
                            _ => None,
                        },
                        _ => None,
                    }),
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
            generation_shown: generation.is_some() && !file.generation_vanished,
            generation,
            keys,
            invalid_meta: 0,
        })
    }
}
