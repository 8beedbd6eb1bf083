//! A small Consul KV client over the local agent's HTTP API: the blocking
//! prefix read the watcher holds, and the reads and compare-and-set writes
//! the writer CLI makes. The ACL token is read from a file, re-read on
//! demand, and sent only as `X-Consul-Token`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::StatusCode;
use serde::Deserialize;

use crate::metrics::ConsulOutcome;

/// Extra time allowed beyond `wait` before a blocking query counts as timed
/// out. Consul adds up to `wait / 16` of jitter (api-docs/features/blocking);
/// this margin covers that and a slow network.
pub const TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// Longest `wait` Consul honours (api-docs/features/blocking): 10 minutes.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

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
    /// The metric outcome this error is counted as.
    pub fn outcome(&self) -> ConsulOutcome {
        match self {
            ConsulError::Connect { .. } | ConsulError::Token { .. } => ConsulOutcome::ConnectError,
            ConsulError::Timeout { .. } => ConsulOutcome::Timeout,
            ConsulError::Status { status, .. } if status.is_server_error() => {
                ConsulOutcome::Http5xx
            }
            ConsulError::Status { .. } => ConsulOutcome::Http4xx,
            ConsulError::Decode(_) => ConsulOutcome::DecodeError,
        }
    }

    /// True for 403: a bad, expired or rotated token.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, ConsulError::Status { status, .. } if *status == StatusCode::FORBIDDEN)
    }
}

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
    /// `writer::drain_flags`).
    pub flags: u64,
}

/// The answer to a prefix read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixAnswer {
    /// `X-Consul-Index`, exactly as sent (0 is possible; callers clamp).
    pub index: u64,
    /// The keys; empty for a 404 (a prefix with no keys).
    pub pairs: Vec<KvPair>,
    /// The raw body size in bytes, for logs and benchmarks.
    pub body_bytes: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawPair {
    key: String,
    value: Option<String>,
    modify_index: u64,
    #[serde(default)]
    flags: u64,
}

/// Reads the ACL token from a file on first use and again after
/// [`TokenSource::invalidate`] (on a 403 or SIGHUP), so a rotated token needs
/// no restart. The token is never logged.
#[derive(Debug)]
pub struct TokenSource {
    path: Option<PathBuf>,
    fixed: Option<HeaderValue>,
    cached: Mutex<Option<Option<HeaderValue>>>,
    /// How many times the token was read from its file.
    loads: AtomicU64,
}

impl TokenSource {
    /// A token read from `path`, or no token when `None`.
    pub fn new(path: Option<PathBuf>) -> Self {
        TokenSource {
            path,
            fixed: None,
            cached: Mutex::new(None),
            loads: AtomicU64::new(0),
        }
    }

    /// A token given as a value (the writer CLI's `$CONSUL_HTTP_TOKEN`, as
    /// the `consul` CLI reads it); never re-read. An empty value means no
    /// token.
    ///
    /// # Errors
    ///
    /// [`ConsulError::Token`] when the value has characters not allowed in
    /// an HTTP header.
    pub fn from_value(token: &str, origin: &str) -> Result<Self, ConsulError> {
        let token = token.trim();
        let fixed = if token.is_empty() {
            None
        } else {
            let mut value = HeaderValue::from_str(token).map_err(|_| ConsulError::Token {
                path: PathBuf::from(origin),
                detail: "token has characters not allowed in an HTTP header".into(),
            })?;
            value.set_sensitive(true);
            Some(value)
        };
        Ok(TokenSource {
            path: None,
            fixed,
            cached: Mutex::new(None),
            loads: AtomicU64::new(0),
        })
    }

    /// The token file, if any.
    pub fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    /// Drops the cached token so the next request re-reads the file.
    pub fn invalidate(&self) {
        *self.cached.lock().unwrap() = None;
    }

    /// How many times the token has been read from its file (0 for a fixed
    /// token or none): a change means requests now carry another token.
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::SeqCst)
    }

    fn header(&self) -> Result<Option<HeaderValue>, ConsulError> {
        if self.fixed.is_some() {
            return Ok(self.fixed.clone());
        }
        let mut cached = self.cached.lock().unwrap();
        if let Some(h) = cached.as_ref() {
            return Ok(h.clone());
        }
        self.loads.fetch_add(1, Ordering::SeqCst);
        let header = match &self.path {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConsulError::Token {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
                if text.trim().is_empty() {
                    // An empty file (as the package installs it) means no
                    // token: Consul's anonymous token applies.
                    *cached = Some(None);
                    return Ok(None);
                }
                let mut value =
                    HeaderValue::from_str(text.trim()).map_err(|_| ConsulError::Token {
                        path: path.clone(),
                        detail: "token has characters not allowed in an HTTP header".into(),
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        *cached = Some(header.clone());
        Ok(header)
    }
}

/// A client for one Consul agent's HTTP API.
#[derive(Debug)]
pub struct ConsulClient {
    http: reqwest::Client,
    addr: String,
    token: TokenSource,
    /// [`TokenSource::loads`] when the token's read access to the prefix
    /// was last checked; `u64::MAX` before the first check.
    read_checked_at_load: AtomicU64,
}

/// The key below the prefix that [`ConsulClient::list_prefix`] reads to
/// check the token's read access. `~` is not allowed in identities, so no
/// state key can have this name.
pub const READ_CHECK_KEY: &str = "~read-check";

/// Percent-encodes a KV key for a URL path, keeping `/` (Consul keys are
/// paths).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn wait_param(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

impl ConsulClient {
    /// A client for the agent at `addr` (`http://127.0.0.1:8500`), with the
    /// token from `token`. Each connection attempt gives up after
    /// `connect_timeout`.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (no usable TLS-free backend).
    pub fn new(addr: &str, token: TokenSource, connect_timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_max_idle_per_host(2)
            .user_agent(concat!("gitlab-haproxy-agent/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(ConsulClient {
            http,
            addr: addr.trim_end_matches('/').to_string(),
            token,
            read_checked_at_load: AtomicU64::new(u64::MAX),
        })
    }

    /// The Consul address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The token source, for re-reading on SIGHUP.
    pub fn token(&self) -> &TokenSource {
        &self.token
    }

    fn headers(&self) -> Result<HeaderMap, ConsulError> {
        let mut headers = HeaderMap::new();
        if let Some(token) = self.token.header()? {
            headers.insert("X-Consul-Token", token);
        }
        Ok(headers)
    }

    fn transport_error(&self, e: reqwest::Error, after: Duration) -> ConsulError {
        if e.is_timeout() {
            ConsulError::Timeout {
                addr: self.addr.clone(),
                after,
            }
        } else {
            let mut detail = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                detail = format!("{detail}: {s}");
                source = s.source();
            }
            ConsulError::Connect {
                addr: self.addr.clone(),
                detail,
            }
        }
    }

    /// Reads every key under `prefix` (which ends in `/`), as a blocking query
    /// when `index > 0`: Consul holds the request until the prefix's index
    /// passes `index` or `wait` (plus jitter) ends (api-docs/features/blocking).
    /// `index == 0` answers at once.
    ///
    /// A 404 is a prefix with no keys: a valid, empty answer with an index.
    ///
    /// Consul filters a recursive read by the token's ACL rules: a token
    /// that may read nothing under the prefix gets the same 404 as an empty
    /// prefix, and one that may read only part of it (a rule for the folder
    /// key alone, or for one backend's folder) gets that part, while Consul
    /// refuses a plain read of a key the token may not read with 403
    /// (agent/consul/kvs_endpoint.go: `List` filters, `Get` refuses; checked
    /// against Consul 1.8.7). So after every 404, and after the first
    /// answer with each token read from its file, this also reads
    /// `<prefix>`[`READ_CHECK_KEY`] (a key that never exists): 403 fails the
    /// whole read. Without that check an agent with the wrong token would
    /// answer ready for every server. A token narrowed while the agent runs
    /// shows as an answer that drops keys: the watcher checks every such
    /// answer with [`ConsulClient::check_read_access`] before taking it.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, a timeout after
    /// `wait + TIMEOUT_MARGIN`, error statuses (403 also when the token may
    /// not read [`READ_CHECK_KEY`] below the prefix), and answers without a
    /// numeric `X-Consul-Index`, with malformed JSON or base64, or a 200
    /// with no key under the prefix (a real empty prefix answers 404).
    pub async fn list_prefix(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
    ) -> Result<PrefixAnswer, ConsulError> {
        let mut url = format!("{}/v1/kv/{}?recurse=true", self.addr, encode_key(prefix));
        let mut timeout = TIMEOUT_MARGIN;
        if index > 0 {
            url.push_str(&format!("&index={index}&wait={}", wait_param(wait)));
            timeout += wait + wait / 16;
        }
        let response = self
            .http
            .get(&url)
            .headers(self.headers()?)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        let status = response.status();
        let header_index = response
            .headers()
            .get("X-Consul-Index")
            .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
            return Err(status_error(status, &body));
        }
        let index = match header_index {
            None => return Err(ConsulError::Decode("no X-Consul-Index header".into())),
            Some(None) => return Err(ConsulError::Decode("X-Consul-Index is not a number".into())),
            Some(Some(i)) => i,
        };
        let load = self.token.loads();
        if status == StatusCode::NOT_FOUND
            || self.read_checked_at_load.load(Ordering::SeqCst) != load
        {
            // Empty or whole, or hidden from this token in part or in full:
            // only a plain read tells.
            self.get_key(&format!("{prefix}{READ_CHECK_KEY}")).await?;
            self.read_checked_at_load.store(load, Ordering::SeqCst);
        }
        if status == StatusCode::NOT_FOUND {
            return Ok(PrefixAnswer {
                index,
                pairs: Vec::new(),
                body_bytes: body.len(),
            });
        }
        let pairs = decode_pairs(&body)?;
        check_under_prefix(prefix, &pairs)?;
        Ok(PrefixAnswer {
            index,
            pairs,
            body_bytes: body.len(),
        })
    }
}

impl ConsulClient {
    /// The read check of [`ConsulClient::list_prefix`]: a plain read of
    /// `<prefix>`[`READ_CHECK_KEY`] (a key that never exists), which Consul
    /// answers 404 for a token that may read the whole prefix and 403 for
    /// one that may not (agent/consul/kvs_endpoint.go).
    ///
    /// # Errors
    ///
    /// [`ConsulError`]: 403 when the token may not read the whole prefix,
    /// transport failures and other error statuses.
    pub async fn check_read_access(&self, prefix: &str) -> Result<(), ConsulError> {
        self.get_key(&format!("{prefix}{READ_CHECK_KEY}"))
            .await
            .map(|_| ())
    }
}

/// A 200 to a recursive read must hold at least one key under the prefix
/// (the folder key itself counts): Consul answers 404 for an empty prefix, so
/// anything else is a broken answer, never "every server ready".
fn check_under_prefix(prefix: &str, pairs: &[KvPair]) -> Result<(), ConsulError> {
    if pairs.is_empty() {
        return Err(ConsulError::Decode(
            "200 with no keys (an empty prefix answers 404)".into(),
        ));
    }
    if !pairs.iter().any(|p| p.key.starts_with(prefix)) {
        return Err(ConsulError::Decode(format!(
            "200 with no key under {prefix:?}"
        )));
    }
    Ok(())
}

fn status_error(status: StatusCode, body: &[u8]) -> ConsulError {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)])
        .trim()
        .to_string();
    ConsulError::Status { status, body: text }
}

/// Decodes a KV list body: a JSON array of `{Key, Value, Flags, ModifyIndex,
/// ...}`
/// with values in standard padded base64 or `null` (api-docs/kv).
///
/// # Errors
///
/// [`ConsulError::Decode`] for malformed JSON or base64.
pub fn decode_pairs(body: &[u8]) -> Result<Vec<KvPair>, ConsulError> {
    let raw: Vec<RawPair> =
        serde_json::from_slice(body).map_err(|e| ConsulError::Decode(format!("JSON: {e}")))?;
    raw.into_iter().map(decode_raw_pair).collect()
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

/// Most operations Consul 1.8 accepts in one transaction (`PUT /v1/txn`
/// answers 413 beyond it).
pub const MAX_TXN_OPS: usize = 64;

/// Time allowed for one KV read or write made by the writer CLI (not a
/// blocking query): a write goes through the Raft leader.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Reads `key`; the transaction fails if it does not exist.
    Get {
        /// The full key.
        key: String,
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
    fn to_json(&self) -> serde_json::Value {
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
    /// Every operation applied, atomically. One pair per `cas` and `get`
    /// (with the ModifyIndex the key has now; values only for `get`); none
    /// for `delete-cas` and `check-index`.
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
fn decode_bool(body: &[u8]) -> Result<bool, ConsulError> {
    match body.trim_ascii() {
        b"true" => Ok(true),
        b"false" => Ok(false),
        other => Err(ConsulError::Decode(format!(
            "expected true or false, got {:?}",
            String::from_utf8_lossy(&other[..other.len().min(40)])
        ))),
    }
}

impl ConsulClient {
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, Vec<u8>), ConsulError> {
        let response = request
            .headers(self.headers()?)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        Ok((status, body.to_vec()))
    }

    /// Reads one key (the full key, prefix included) with its ModifyIndex;
    /// `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, error statuses (403 when the
    /// token may not read it) and malformed answers.
    pub async fn get_key(&self, key: &str) -> Result<Option<KvPair>, ConsulError> {
        let url = format!("{}/v1/kv/{}", self.addr, encode_key(key));
        let (status, body) = self.send(self.http.get(&url)).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        let mut pairs = decode_pairs(&body)?;
        match pairs.iter().position(|p| p.key == key) {
            Some(i) => Ok(Some(pairs.swap_remove(i))),
            None => Err(ConsulError::Decode(format!("answer does not hold {key:?}"))),
        }
    }

    /// Writes `value` at `key` only if the key's ModifyIndex is still `cas`
    /// (`?cas=N`; 0 writes only if the key does not exist). `Ok(false)`: the
    /// key changed since it was read, and nothing was written. The key's
    /// Flags become 0 (`?flags=0`, as `consul kv put` writes), whatever they
    /// were.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, error statuses (403 without
    /// write permission) and an answer other than `true` or `false`.
    pub async fn put_cas(&self, key: &str, value: &[u8], cas: u64) -> Result<bool, ConsulError> {
        let url = format!("{}/v1/kv/{}?cas={cas}&flags=0", self.addr, encode_key(key));
        let (status, body) = self.send(self.http.put(&url).body(value.to_vec())).await?;
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        decode_bool(&body)
    }

    /// Deletes `key` only if its ModifyIndex is still `cas` (`?cas=N`).
    /// `Ok(false)`: the key changed since it was read, and it was kept. A key
    /// that is already gone counts as deleted.
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::put_cas`].
    pub async fn delete_cas(&self, key: &str, cas: u64) -> Result<bool, ConsulError> {
        let url = format!("{}/v1/kv/{}?cas={cas}", self.addr, encode_key(key));
        let (status, body) = self.send(self.http.delete(&url)).await?;
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        decode_bool(&body)
    }

    /// Applies `ops` atomically (`PUT /v1/txn`): all or none. At most
    /// [`MAX_TXN_OPS`]; Consul answers 413 to more.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, statuses other than 200 and
    /// 409 (403 for a token Consul does not know, 413 for too many
    /// operations) and malformed answers. A rollback (409) is not an error:
    /// it is [`TxnOutcome::RolledBack`].
    pub async fn txn(&self, ops: &[TxnOp]) -> Result<TxnOutcome, ConsulError> {
        let body = serde_json::Value::Array(ops.iter().map(TxnOp::to_json).collect());
        let url = format!("{}/v1/txn", self.addr);
        let (status, answer) = self
            .send(self.http.put(&url).body(body.to_string()))
            .await?;
        if status != StatusCode::OK && status != StatusCode::CONFLICT {
            return Err(status_error(status, &answer));
        }
        decode_txn(status, &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn keys_are_percent_encoded_except_slashes() {
        assert_eq!(
            encode_key("gitlab-haproxy-agent/state/"),
            "gitlab-haproxy-agent/state/"
        );
        assert_eq!(encode_key("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn wait_always_has_a_unit() {
        assert_eq!(wait_param(Duration::from_secs(60)), "60000ms");
        assert_eq!(wait_param(Duration::ZERO), "1ms");
    }

    #[test]
    fn token_file_is_trimmed_reread_after_invalidate_and_empty_means_none() {
        let path = std::env::temp_dir().join(format!("gha-token-{}", std::process::id()));
        std::fs::write(&path, "").unwrap();
        let source = TokenSource::new(Some(path.clone()));
        assert_eq!(source.header().unwrap(), None);
        std::fs::write(&path, "s3cret\n").unwrap();
        // Cached until invalidated.
        assert_eq!(source.header().unwrap(), None);
        source.invalidate();
        let header = source.header().unwrap().unwrap();
        assert_eq!(header.to_str().unwrap(), "s3cret");
        assert!(header.is_sensitive());
        std::fs::remove_file(&path).unwrap();
        source.invalidate();
        assert!(matches!(source.header(), Err(ConsulError::Token { .. })));
    }

    #[test]
    fn token_given_as_a_value_is_sent_and_empty_means_none() {
        let source = TokenSource::from_value(" abc \n", "CONSUL_HTTP_TOKEN").unwrap();
        assert_eq!(source.header().unwrap().unwrap().to_str().unwrap(), "abc");
        source.invalidate();
        assert!(source.header().unwrap().is_some());
        assert_eq!(
            TokenSource::from_value("", "x").unwrap().header().unwrap(),
            None
        );
        assert!(TokenSource::from_value("a\u{7f}b", "x").is_err());
    }

    #[test]
    fn a_200_must_hold_a_key_under_the_prefix() {
        let pair = |key: &str| KvPair {
            key: key.into(),
            value: Vec::new(),
            modify_index: 1,
            flags: 0,
        };
        assert!(check_under_prefix("p/", &[]).is_err());
        assert!(check_under_prefix("p/", &[pair("other/x")]).is_err());
        assert!(check_under_prefix("p/", &[pair("p/")]).is_ok());
        assert!(check_under_prefix("p/", &[pair("other/x"), pair("p/canary")]).is_ok());
    }

    #[test]
    fn status_errors_map_to_outcomes() {
        let e = status_error(StatusCode::INTERNAL_SERVER_ERROR, b"No cluster leader");
        assert_eq!(e.outcome(), ConsulOutcome::Http5xx);
        assert_eq!(
            e.to_string(),
            "Consul answered 500 Internal Server Error: No cluster leader"
        );
        let e = status_error(StatusCode::FORBIDDEN, b"ACL not found");
        assert_eq!(e.outcome(), ConsulOutcome::Http4xx);
        assert!(e.is_forbidden());
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
