//! What the Consul KV and transaction endpoints send and answer
//! (api-docs/kv, api-docs/txn): the error of a failed request, a prefix
//! answer, transaction operations and outcomes, and the decoding of their
//! JSON bodies. No transport and no metric labels here: the daemon maps a
//! [`ConsulError`] to its `outcome` label, the writer to an exit status.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

pub use crate::model::answer::{PrefixAnswer, ReadMeta};
pub use crate::model::snapshot::KvPair;

/// The keys of one answer that a Consul session holds (`?acquire=ID`):
/// full key -> session ID. Keys no session holds are not in it.
pub type Holders = std::collections::BTreeMap<String, String>;

/// A failed Consul request.
#[derive(Debug, thiserror::Error)]
pub enum ConsulError {
    /// Could not connect, or the connection was reset before an answer.
    #[error("cannot reach Consul at {addr}: {detail}")]
    Connect {
        /// The Consul address used.
        addr: String,
        /// The transport error.
        detail: String,
    },
    /// The TLS handshake failed: Consul's certificate did not verify, it
    /// refused ours, or it does not speak TLS there. Never retried over
    /// plain HTTP.
    #[error("TLS to Consul at {addr} failed: {detail}")]
    Tls {
        /// The Consul address used.
        addr: String,
        /// The TLS error, with what to check.
        detail: String,
    },
    /// No complete answer in time.
    #[error("Consul at {addr} did not answer within {after:?}")]
    Timeout {
        /// The Consul address used.
        addr: String,
        /// The time allowed.
        after: Duration,
    },
    /// An HTTP error status, with the start of the body Consul gave
    /// (`No cluster leader`, `ACL not found`, `Permission denied`).
    #[error("Consul answered {status}: {body}")]
    Status {
        /// The status code.
        status: StatusCode,
        /// Up to 200 bytes of the answer body.
        body: String,
    },
    /// An answer that cannot be used.
    #[error("unusable answer from Consul: {0}")]
    Decode(String),
    /// The token file could not be read.
    #[error("cannot read Consul token file {path}: {detail}")]
    Token {
        /// The token file.
        path: PathBuf,
        /// The I/O error.
        detail: String,
    },
}

impl ConsulError {
    /// True for 403: a bad, expired or rotated token.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, ConsulError::Status { status, .. } if *status == StatusCode::FORBIDDEN)
    }
}

/// Reads the freshness headers from an answer ([`ReadMeta::from_header`]).
pub fn read_meta(headers: &HeaderMap) -> ReadMeta {
    ReadMeta::from_header(|name| headers.get(name).and_then(|v| v.to_str().ok()))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawPair {
    key: String,
    value: Option<String>,
    modify_index: u64,
    #[serde(default)]
    flags: u64,
    /// The session holding the key (`?acquire=ID`); absent or empty when
    /// none does.
    #[serde(default)]
    session: Option<String>,
}

/// Decodes a KV list body: a JSON array of `{Key, Value, Flags, ModifyIndex,
/// ...}`
/// with values in standard padded base64 or `null` (api-docs/kv).
///
/// # Errors
///
/// [`ConsulError::Decode`] for malformed JSON or base64.
pub fn decode_pairs(body: &[u8]) -> Result<Vec<KvPair>, ConsulError> {
    decode_held_pairs(body).map(|(pairs, _)| pairs)
}

/// As [`decode_pairs`], with the keys a Consul session holds: each entry's
/// `Session` field (api-docs/kv; set by `PUT ?acquire=ID`, kept by a plain
/// PUT, cleared by `?release=ID`), by full key.
///
/// # Errors
///
/// As [`decode_pairs`].
pub fn decode_held_pairs(body: &[u8]) -> Result<(Vec<KvPair>, Holders), ConsulError> {
    let raw: Vec<RawPair> =
        serde_json::from_slice(body).map_err(|e| ConsulError::Decode(format!("JSON: {e}")))?;
    let mut holders = Holders::new();
    let mut pairs = Vec::with_capacity(raw.len());
    for mut p in raw {
        if let Some(id) = p.session.take().filter(|id| !id.is_empty()) {
            holders.insert(p.key.clone(), id);
        }
        pairs.push(decode_raw_pair(p)?);
    }
    Ok((pairs, holders))
}

fn decode_raw_pair(p: RawPair) -> Result<KvPair, ConsulError> {
    let value = match p.value {
        None => Vec::new(),
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ConsulError::Decode(format!("base64 value of {:?}: {e}", p.key)))?,
    };
    Ok(KvPair {
        key: p.key,
        value,
        modify_index: p.modify_index,
        flags: p.flags,
    })
}

/// One KV operation inside a transaction (api-docs/txn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Sets `key` to `value` with `flags` only if its ModifyIndex is
    /// `index`; `index` 0 means only if the key does not exist. The key's
    /// previous Flags are replaced, not merged.
    Cas {
        /// The full key.
        key: String,
        /// The raw value.
        value: Vec<u8>,
        /// The key's Flags after the write (sent as `"Flags"`; 0 is what
        /// `consul kv put` writes).
        flags: u64,
        /// The expected ModifyIndex, 0 for absent.
        index: u64,
    },
    /// Deletes `key` only if its ModifyIndex is `index`. Consul counts a key
    /// that is already gone as deleted.
    DeleteCas {
        /// The full key.
        key: String,
        /// The expected ModifyIndex.
        index: u64,
    },
    /// Sets `key` to `value` (Flags 0) whatever it holds: for records that
    /// go with a compare-and-set of their key in the same transaction.
    Set {
        /// The full key.
        key: String,
        /// The raw value.
        value: Vec<u8>,
    },
    /// Deletes `key` whatever it holds (a key already gone counts as
    /// deleted).
    Delete {
        /// The full key.
        key: String,
    },
    /// Reads `key`; the transaction fails if it does not exist.
    Get {
        /// The full key.
        key: String,
    },
    /// Sets `key` to `value` with `flags` and releases it from `session`,
    /// which must hold it (Consul's `unlock` verb, as `PUT ?release=ID`
    /// with a body): the transaction fails if another session or none
    /// holds the key. It checks no ModifyIndex: put a
    /// [`TxnOp::CheckIndex`] of the key before it. Checked on Consul 1.8.7:
    /// the value and Flags are written and the key's `Session` is cleared,
    /// so the session ending later leaves the key alone.
    Unlock {
        /// The full key.
        key: String,
        /// The raw value.
        value: Vec<u8>,
        /// The key's Flags after the write.
        flags: u64,
        /// The ID of the session that holds the key.
        session: String,
    },
    /// Fails the transaction unless `key`'s ModifyIndex is `index`.
    CheckIndex {
        /// The full key.
        key: String,
        /// The expected ModifyIndex.
        index: u64,
    },
}

impl TxnOp {
    /// Sets `key` to `value` with Flags 0 only if its ModifyIndex is
    /// `index` (0: only if absent), as [`super::ConsulClient::put_cas`].
    pub fn put_cas(key: &str, value: &[u8], index: u64) -> TxnOp {
        let (key, value) = (key.to_string(), value.to_vec());
        TxnOp::Cas {
            key,
            value,
            flags: 0,
            index,
        }
    }

    /// The operation on a writer's record (`<prefix>~meta/<key>`, `key`
    /// in full) that goes with its key's write: set to `record` (a
    /// [`crate::model::meta::KeyMeta`], as JSON), or deleted with the key
    /// (`None`).
    pub fn record(key: String, record: Option<&impl serde::Serialize>) -> TxnOp {
        match record {
            Some(r) => TxnOp::Set {
                key,
                value: serde_json::to_vec(r).unwrap_or_default(),
            },
            None => TxnOp::Delete { key },
        }
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
        let kv = match self {
            TxnOp::Cas {
                key,
                value,
                flags,
                index,
            } => serde_json::json!({
                "Verb": "cas", "Key": key, "Value": b64(value), "Flags": flags, "Index": index,
            }),
            TxnOp::DeleteCas { key, index } => {
                serde_json::json!({"Verb": "delete-cas", "Key": key, "Index": index})
            }
            TxnOp::Set { key, value } => {
                serde_json::json!({"Verb": "set", "Key": key, "Value": b64(value)})
            }
            TxnOp::Unlock {
                key,
                value,
                flags,
                session,
            } => serde_json::json!({
                "Verb": "unlock", "Key": key, "Value": b64(value), "Flags": flags,
                "Session": session,
            }),
            TxnOp::Delete { key } => serde_json::json!({"Verb": "delete", "Key": key}),
            TxnOp::Get { key } => serde_json::json!({"Verb": "get", "Key": key}),
            TxnOp::CheckIndex { key, index } => {
                serde_json::json!({"Verb": "check-index", "Key": key, "Index": index})
            }
        };
        serde_json::json!({ "KV": kv })
    }
}

/// One operation that Consul refused, which rolled the whole transaction
/// back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnError {
    /// Position of the refused operation in the request.
    pub op_index: usize,
    /// Consul's reason, e.g. `failed to set key "k", index is stale` or
    /// `Permission denied`.
    pub what: String,
}

impl TxnError {
    /// True when an ACL refused the operation (Consul answers 409 with
    /// `Permission denied` inside a transaction, not 403).
    pub fn is_permission_denied(&self) -> bool {
        self.what.contains("Permission denied") || self.what.contains("ACL not found")
    }
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every operation applied, atomically. One pair per `cas`, `set`,
    /// `unlock`, `get` and `check-index`, in the order of the operations
    /// (with the ModifyIndex the key has after that operation; values only
    /// for `get`; Consul 1.8.7 answers a `check-index` with the key as it
    /// was checked); none for `delete-cas` and `delete`.
    Committed(Vec<KvPair>),
    /// Nothing applied (HTTP 409): why each refused operation failed.
    RolledBack(Vec<TxnError>),
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawTxnAnswer {
    results: Option<Vec<RawTxnResult>>,
    errors: Option<Vec<RawTxnError>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawTxnResult {
    #[serde(rename = "KV")]
    kv: Option<RawPair>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawTxnError {
    op_index: usize,
    what: String,
}

/// Decodes a `PUT /v1/txn` answer body (200 or 409).
///
/// # Errors
///
/// [`ConsulError::Decode`] for malformed JSON or base64.
pub fn decode_txn(status: StatusCode, body: &[u8]) -> Result<TxnOutcome, ConsulError> {
    let raw: RawTxnAnswer =
        serde_json::from_slice(body).map_err(|e| ConsulError::Decode(format!("txn JSON: {e}")))?;
    if status == StatusCode::CONFLICT {
        let errors: Vec<TxnError> = raw
            .errors
            .unwrap_or_default()
            .into_iter()
            .map(|e| TxnError {
                op_index: e.op_index,
                what: e.what,
            })
            .collect();
        if errors.is_empty() {
            return Err(ConsulError::Decode("409 without Errors".into()));
        }
        return Ok(TxnOutcome::RolledBack(errors));
    }
    raw.results
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| r.kv)
        .map(decode_raw_pair)
        .collect::<Result<_, _>>()
        .map(TxnOutcome::Committed)
}

/// Reads a `true`/`false` answer body of a KV PUT or DELETE.
pub(crate) fn decode_bool(body: &[u8]) -> Result<bool, ConsulError> {
    match body.trim_ascii() {
        b"true" => Ok(true),
        b"false" => Ok(false),
        other => Err(ConsulError::Decode(format!(
            "expected true or false, got {:?}",
            String::from_utf8_lossy(&other[..other.len().min(40)])
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_headers_are_read_as_consul_sends_them() {
        use reqwest::header::HeaderValue;
        let mut h = HeaderMap::new();
        h.insert("X-Consul-LastContact", HeaderValue::from_static("47"));
        h.insert("X-Consul-KnownLeader", HeaderValue::from_static("true"));
        h.insert(
            "X-Consul-Results-Filtered-By-ACLs",
            HeaderValue::from_static("true"),
        );
        assert_eq!(
            read_meta(&h),
            ReadMeta {
                last_contact: Some(Duration::from_millis(47)),
                known_leader: Some(true),
                filtered_by_acls: Some(true),
            }
        );
        h.remove("X-Consul-Results-Filtered-By-ACLs");
        h.insert("X-Consul-LastContact", HeaderValue::from_static("-1"));
        h.insert("X-Consul-KnownLeader", HeaderValue::from_static("False"));
        assert_eq!(read_meta(&h), ReadMeta::default());
    }

    #[test]
    fn decodes_values_and_nulls() {
        let body = br#"[{"LockIndex":0,"Key":"p/canary","Flags":0,"Value":"ZHJhaW4=","CreateIndex":5,"ModifyIndex":7},
                         {"Key":"p/web/web-01","Value":null,"ModifyIndex":9},
                         {"LockIndex":0,"Key":"p/web/web-02","Flags":1,"Value":"bWFpbnQ=","CreateIndex":8,"ModifyIndex":10}]"#;
        let pairs = decode_pairs(body).unwrap();
        assert_eq!(pairs[0].value, b"drain");
        assert_eq!(pairs[0].modify_index, 7);
        assert_eq!(pairs[0].flags, 0);
        assert_eq!(pairs[1].value, b"");
        assert_eq!(pairs[1].flags, 0, "no Flags field reads as 0");
        assert_eq!(pairs[2].value, b"maint");
        assert_eq!(pairs[2].flags, 1);
    }

    #[test]
    fn the_session_holding_a_key_is_read_with_it() {
        // Consul 1.8.7's entries, as recorded: one held, one released.
        let body = br#"[{"LockIndex":1,"Key":"p/web/s1","Flags":0,"Value":"ZHJhaW4=",
            "Session":"2b62df83-7e27-8e8e-c464-0d615ae73329","CreateIndex":14,"ModifyIndex":14},
            {"LockIndex":1,"Key":"p/web/s2","Flags":1,"Value":"bWFpbnQ=","CreateIndex":14,
            "ModifyIndex":17},{"Key":"p/web/s3","Value":null,"Session":"","ModifyIndex":3}]"#;
        let (pairs, holders) = decode_held_pairs(body).unwrap();
        assert_eq!(pairs, decode_pairs(body).unwrap());
        assert_eq!(pairs.len(), 3);
        assert_eq!(
            holders,
            Holders::from([(
                "p/web/s1".to_string(),
                "2b62df83-7e27-8e8e-c464-0d615ae73329".to_string()
            )])
        );
    }

    #[test]
    fn unlock_writes_the_value_with_the_session_that_holds_it() {
        let op = TxnOp::Unlock {
            key: "p/web/s1".into(),
            value: b"maint".to_vec(),
            flags: 0,
            session: "s-1".into(),
        };
        assert_eq!(
            op.to_json(),
            serde_json::json!({"KV": {"Verb": "unlock", "Key": "p/web/s1", "Value": "bWFpbnQ=",
                "Flags": 0, "Session": "s-1"}})
        );
    }

    #[test]
    fn flags_are_the_full_u64_range_and_refused_when_not_a_number() {
        let max = br#"[{"Key":"k","Flags":18446744073709551615,"Value":null,"ModifyIndex":1}]"#;
        assert_eq!(decode_pairs(max).unwrap()[0].flags, u64::MAX);
        assert!(matches!(
            decode_pairs(br#"[{"Key":"k","Flags":-1,"Value":null,"ModifyIndex":1}]"#),
            Err(ConsulError::Decode(_))
        ));
    }

    #[test]
    fn refuses_bad_json_and_bad_base64() {
        assert!(matches!(decode_pairs(b"[{"), Err(ConsulError::Decode(_))));
        assert!(matches!(
            decode_pairs(br#"[{"Key":"k","Value":"!!","ModifyIndex":1}]"#),
            Err(ConsulError::Decode(_))
        ));
    }

    #[test]
    fn txn_ops_use_consul_verbs_and_base64_values() {
        let ops = [
            TxnOp::Cas {
                key: "p/canary".into(),
                value: b"drain".to_vec(),
                flags: 1,
                index: 0,
            },
            TxnOp::DeleteCas {
                key: "p/web/web-01".into(),
                index: 7,
            },
            TxnOp::Get { key: "p/x".into() },
            TxnOp::CheckIndex {
                key: "p/y".into(),
                index: 3,
            },
            TxnOp::Set {
                key: "p/~meta/canary".into(),
                value: b"{}".to_vec(),
            },
            TxnOp::Delete {
                key: "p/~meta/x".into(),
            },
        ];
        let json: Vec<serde_json::Value> = ops.iter().map(TxnOp::to_json).collect();
        assert_eq!(
            json[0],
            serde_json::json!({"KV": {"Verb": "cas", "Key": "p/canary", "Value": "ZHJhaW4=", "Flags": 1, "Index": 0}})
        );
        assert_eq!(json[1]["KV"]["Verb"], "delete-cas");
        assert_eq!(json[1]["KV"]["Index"], 7);
        assert_eq!(json[2]["KV"]["Verb"], "get");
        assert_eq!(json[3]["KV"]["Verb"], "check-index");
        assert_eq!(
            json[4],
            serde_json::json!({"KV": {"Verb": "set", "Key": "p/~meta/canary", "Value": "e30="}})
        );
        assert_eq!(
            json[5],
            serde_json::json!({"KV": {"Verb": "delete", "Key": "p/~meta/x"}})
        );
    }

    #[test]
    fn txn_answers_decode_to_commits_and_rollbacks() {
        // Consul 1.8.7 answers, as recorded.
        let ok = br#"{"Results":[{"KV":{"LockIndex":0,"Key":"p/a","Flags":1,"Value":null,"CreateIndex":13,"ModifyIndex":20}}],"Errors":null}"#;
        assert_eq!(
            decode_txn(StatusCode::OK, ok).unwrap(),
            TxnOutcome::Committed(vec![KvPair {
                key: "p/a".into(),
                value: Vec::new(),
                modify_index: 20,
                flags: 1,
            }])
        );
        let stale = br#"{"Results":null,"Errors":[{"OpIndex":2,"What":"failed to delete key \"p/b\", index is stale"}]}"#;
        let TxnOutcome::RolledBack(errors) = decode_txn(StatusCode::CONFLICT, stale).unwrap()
        else {
            panic!("a 409 is a rollback");
        };
        assert_eq!(errors[0].op_index, 2);
        assert!(!errors[0].is_permission_denied());
        let denied = br#"{"Results":null,"Errors":[{"OpIndex":0,"What":"Permission denied"}]}"#;
        let TxnOutcome::RolledBack(errors) = decode_txn(StatusCode::CONFLICT, denied).unwrap()
        else {
            panic!("a 409 is a rollback");
        };
        assert!(errors[0].is_permission_denied());
        assert!(decode_txn(StatusCode::CONFLICT, br#"{"Errors":[]}"#).is_err());
        assert!(decode_txn(StatusCode::OK, b"nope").is_err());
    }

    #[test]
    fn kv_write_answers_are_true_or_false() {
        assert!(decode_bool(b"true\n").unwrap());
        assert!(!decode_bool(b"false").unwrap());
        assert!(decode_bool(b"<html>").is_err());
    }
}
