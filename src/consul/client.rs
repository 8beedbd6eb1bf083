//! The HTTP client for one local Consul agent: the blocking prefix read the
//! watcher holds, and the reads, compare-and-set writes and transactions the
//! writer CLI makes. It is kept thin and our own, not a general Consul SDK:
//! its 404-versus-ACL check and its index rules are the agent's safety.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use super::tls::{tls_failure, Tls};
use super::token::TokenSource;
use super::types::{
    decode_bool, decode_held_pairs, decode_pairs, decode_txn, read_meta, ConsulError, Holders,
    KvPair, PrefixAnswer, ReadMeta, TxnOp, TxnOutcome,
};
use crate::cli::Consistency;
use crate::decision::KeyRead;

/// Extra time allowed beyond `wait` before a blocking query counts as timed
/// out. Consul adds up to `wait / 16` of jitter (api-docs/features/blocking);
/// this margin covers that and a slow network.
pub const TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// Longest `wait` Consul honours (api-docs/features/blocking): 10 minutes.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// A client for one Consul agent's HTTP API.
#[derive(Debug)]
pub struct ConsulClient {
    http: reqwest::Client,
    addr: String,
    token: TokenSource,
}

/// The key below the prefix that [`ConsulClient::read_check`] reads to
/// check the token's read access (defined with the identity rules, since
/// no state key can have its name).
pub use crate::model::identity::READ_CHECK_KEY;

/// Bytes percent-encoded in a KV key: all but the RFC 3986 unreserved set
/// (`A-Z a-z 0-9 - _ . ~`) and `/`, which Consul keys use as a path.
const KEY_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Percent-encodes a KV key for a URL path, keeping `/` (Consul keys are
/// paths).
fn encode_key(key: &str) -> String {
    utf8_percent_encode(key, KEY_ENCODE).to_string()
}

/// The query parameter a read adds for its consistency mode
/// (api-docs/features/consistency): none, or `&stale`.
fn consistency_param(consistency: Consistency) -> &'static str {
    match consistency {
        Consistency::Default => "",
        Consistency::Stale => "&stale",
    }
}

fn wait_param(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

impl ConsulClient {
    /// A client for the agent at `addr` (`http://127.0.0.1:8500`, or
    /// `https://...` with `tls`), with the token from `token`. Each
    /// connection attempt gives up after `connect_timeout`.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (no usable TLS backend).
    pub fn new(
        addr: &str,
        token: TokenSource,
        connect_timeout: Duration,
        tls: &Tls,
    ) -> anyhow::Result<Self> {
        let builder = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_max_idle_per_host(2)
            .user_agent(concat!("gitlab-haproxy-agent/", env!("CARGO_PKG_VERSION")));
        let http = tls.apply(addr, builder).build()?;
        Ok(ConsulClient {
            http,
            addr: addr.trim_end_matches('/').to_string(),
            token,
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
        } else if let Some(detail) = tls_failure(&e) {
            ConsulError::Tls {
                addr: self.addr.clone(),
                detail,
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

    /// Reads every key under `prefix` (which ends in `/`) once, answered at
    /// once, for the writer CLI; checks the token's read access with it.
    ///
    /// A 404 is a prefix with no keys: a valid, empty answer with an index.
    /// Consul filters a recursive read by the token's ACL rules: a token
    /// that may read nothing under the prefix gets the same 404 as an empty
    /// prefix, and one that may read only part of it gets that part, while
    /// Consul refuses a plain read of a key the token may not read with 403
    /// (agent/consul/kvs_endpoint.go: `List` filters, `Get` refuses; checked
    /// against Consul 1.8.7). So this also reads
    /// `<prefix>`[`READ_CHECK_KEY`] (a key that never exists), and a 403
    /// there fails the whole read: without it a writer with the wrong token
    /// would take the prefix for empty.
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::read_prefix`], and 403 when the token may not read
    /// the whole prefix.
    pub async fn list_prefix(&self, prefix: &str) -> Result<PrefixAnswer, ConsulError> {
        Ok(self.list_held(prefix).await?.0)
    }

    /// As [`ConsulClient::list_prefix`], with the keys a Consul session
    /// holds ([`Holders`]).
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::list_prefix`].
    pub async fn list_held(&self, prefix: &str) -> Result<(PrefixAnswer, Holders), ConsulError> {
        let (answer, _, holders) = self
            .read_held(prefix, 0, Duration::ZERO, Consistency::Default)
            .await?;
        if !self.read_check(prefix, false).await? {
            return Err(ConsulError::Status {
                status: StatusCode::FORBIDDEN,
                body: format!("the token may not read every key under {prefix}"),
            });
        }
        Ok((answer, holders))
    }

    /// Reads every key under `prefix` (which ends in `/`), as a blocking query
    /// when `index > 0`: Consul holds the request until the prefix's index
    /// passes `index` or `wait` (plus jitter) ends (api-docs/features/blocking).
    /// `index == 0` answers at once. Asks for gzip, as Consul's own clients
    /// do, and inflates the answer into a buffer of the size the gzip
    /// trailer gives (one allocation, where a growing buffer would double
    /// its way to a 10,000-key answer). Checks nothing beyond the answer's
    /// shape: the decision core
    /// ([`crate::decision`]) asks for the read checks it needs.
    ///
    /// A 404 is a prefix with no keys: a valid, empty answer with an index.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, a timeout after
    /// `wait + TIMEOUT_MARGIN`, error statuses, and answers without a
    /// numeric `X-Consul-Index`, with malformed JSON or base64, or a 200
    /// with no key under the prefix (a real empty prefix answers 404).
    pub async fn read_prefix(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        consistency: Consistency,
    ) -> Result<(PrefixAnswer, ReadMeta), ConsulError> {
        let (answer, meta, _) = self.read_held(prefix, index, wait, consistency).await?;
        Ok((answer, meta))
    }

    /// [`ConsulClient::read_prefix`], with the keys a session holds.
    async fn read_held(
        &self,
        prefix: &str,
        index: u64,
        wait: Duration,
        consistency: Consistency,
    ) -> Result<(PrefixAnswer, ReadMeta, Holders), ConsulError> {
        let mut url = format!(
            "{}/v1/kv/{}?recurse=true{}",
            self.addr,
            encode_key(prefix),
            consistency_param(consistency)
        );
        let mut timeout = TIMEOUT_MARGIN;
        if index > 0 {
            url.push_str(&format!("&index={index}&wait={}", wait_param(wait)));
            timeout += wait + wait / 16;
        }
        let response = self
            .http
            .get(&url)
            .headers(self.headers()?)
            .header(reqwest::header::ACCEPT_ENCODING, "gzip")
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        let status = response.status();
        let header_index = consul_index(response.headers());
        let meta = read_meta(response.headers());
        let gzipped = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let raw = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        let body = if gzipped { gunzip(&raw)? } else { raw.to_vec() };
        drop(raw);
        if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
            return Err(status_error(status, &body));
        }
        let index = match header_index {
            None => return Err(ConsulError::Decode("no X-Consul-Index header".into())),
            Some(None) => return Err(ConsulError::Decode("X-Consul-Index is not a number".into())),
            Some(Some(i)) => i,
        };
        if status == StatusCode::NOT_FOUND {
            let answer = PrefixAnswer {
                index,
                pairs: Vec::new(),
                body_bytes: body.len(),
            };
            return Ok((answer, meta, Holders::new()));
        }
        let (pairs, holders) = decode_held_pairs(&body)?;
        check_under_prefix(prefix, &pairs)?;
        let answer = PrefixAnswer {
            index,
            pairs,
            body_bytes: body.len(),
        };
        Ok((answer, meta, holders))
    }

    /// The index check: `GET /v1/kv/<prefix>?keys&separator=/&stale`,
    /// answered at once by whichever server the Consul agent uses, with the
    /// prefix's `X-Consul-Index` (the same as a recursive read's,
    /// tombstones included; checked on Consul 1.8.7) and a body of a few
    /// top-level names, which is not read. `timeout` bounds the whole
    /// request. The third value is true for a 404: no key under the prefix
    /// that the token may see (an empty prefix, or every key filtered out
    /// by the ACLs, which Consul 1.8.7 does not tell apart).
    ///
    /// # Errors
    ///
    /// Transport errors, a timeout, a status other than 200 or 404, or no
    /// usable `X-Consul-Index`.
    pub async fn check_index(
        &self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(u64, ReadMeta, bool), ConsulError> {
        let url = format!(
            "{}/v1/kv/{}?keys=true&separator=/&stale",
            self.addr,
            encode_key(prefix)
        );
        let response = self
            .http
            .get(&url)
            .headers(self.headers()?)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        let status = response.status();
        let meta = read_meta(response.headers());
        let index = consul_index(response.headers());
        if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
            let body = response.bytes().await.unwrap_or_default();
            return Err(status_error(status, &body));
        }
        match index {
            Some(Some(i)) => Ok((i, meta, status == StatusCode::NOT_FOUND)),
            Some(None) => Err(ConsulError::Decode("X-Consul-Index is not a number".into())),
            None => Err(ConsulError::Decode("no X-Consul-Index header".into())),
        }
    }

    /// Reads one key (the full key, prefix included) as the watcher
    /// confirms a key an answer lacked, with the answer's `X-Consul-Index`.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, statuses other than 200, 403
    /// and 404, and malformed answers.
    pub async fn read_key(
        &self,
        key: &str,
        consistency: Consistency,
    ) -> Result<(KeyRead, Option<u64>), ConsulError> {
        let url = format!(
            "{}/v1/kv/{}{}",
            self.addr,
            encode_key(key),
            consistency_param(consistency).replace('&', "?")
        );
        let response = self
            .http
            .get(&url)
            .headers(self.headers()?)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        let status = response.status();
        let index = consul_index(response.headers()).flatten();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        let read = match status {
            StatusCode::NOT_FOUND => KeyRead::Absent,
            StatusCode::FORBIDDEN => KeyRead::Forbidden,
            StatusCode::OK => {
                let mut pairs = decode_pairs(&body)?;
                match pairs.iter().position(|p| p.key == key) {
                    Some(i) => KeyRead::Present(pairs.swap_remove(i)),
                    None => {
                        return Err(ConsulError::Decode(format!("answer does not hold {key:?}")))
                    }
                }
            }
            _ => return Err(status_error(status, &body)),
        };
        Ok((read, index))
    }

    /// The read check: a plain read of `<prefix>`[`READ_CHECK_KEY`] (a key
    /// that never exists), which Consul answers 404 for a token that may
    /// read the whole prefix and 403 for one that may not
    /// (agent/consul/kvs_endpoint.go). `Ok(false)` for 403.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures and other error statuses.
    pub async fn read_check(&self, prefix: &str, stale: bool) -> Result<bool, ConsulError> {
        let consistency = if stale {
            Consistency::Stale
        } else {
            Consistency::Default
        };
        match self
            .read_key(&format!("{prefix}{READ_CHECK_KEY}"), consistency)
            .await?
        {
            (KeyRead::Forbidden, _) => Ok(false),
            _ => Ok(true),
        }
    }

    /// The datacenter this Consul agent answers for: `GET /v1/agent/self`,
    /// `Config.Datacenter` (api-docs/agent#read-configuration). With ACLs
    /// on, Consul requires agent read on the agent's node for it
    /// (`agent_prefix "" { policy = "read" }`) and answers 403 otherwise.
    /// `timeout` bounds the whole request.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, a timeout, error statuses
    /// (403 when the token may not read the agent), and an answer without
    /// `Config.Datacenter`.
    pub async fn datacenter(&self, timeout: Duration) -> Result<String, ConsulError> {
        #[derive(serde::Deserialize)]
        struct AgentSelf {
            #[serde(rename = "Config")]
            config: AgentConfig,
        }
        #[derive(serde::Deserialize)]
        struct AgentConfig {
            #[serde(rename = "Datacenter")]
            datacenter: String,
        }
        let url = format!("{}/v1/agent/self", self.addr);
        let (status, body) = self.send_within(self.http.get(&url), timeout).await?;
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        let answer: AgentSelf = serde_json::from_slice(&body)
            .map_err(|e| ConsulError::Decode(format!("/v1/agent/self: {e}")))?;
        Ok(answer.config.datacenter)
    }

    /// Whether ACLs are enabled: `GET /v1/acl/token/self` answers 401 "ACL
    /// support disabled" when they are not (checked on Consul 1.8.7);
    /// anything else Consul answers (200, 403 "ACL not found", ...) counts
    /// as enabled.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures and 5xx statuses.
    pub async fn acl_enabled(&self) -> Result<bool, ConsulError> {
        let url = format!("{}/v1/acl/token/self", self.addr);
        let (status, body) = self.send(self.http.get(&url)).await?;
        if status.is_server_error() {
            return Err(status_error(status, &body));
        }
        let disabled = status == StatusCode::UNAUTHORIZED
            && String::from_utf8_lossy(&body).contains("ACL support disabled");
        Ok(!disabled)
    }
}

/// Most bytes an inflated answer may take: 64 MiB, far above any prefix
/// (Consul caps a value at 512 KiB; 10,000 keys are about 2.5 MB).
const MAX_INFLATED: usize = 64 << 20;

/// Inflates a gzip answer into one buffer sized by the gzip trailer's ISIZE
/// (the inflated length modulo 2^32, RFC 1952), capped at [`MAX_INFLATED`].
fn gunzip(raw: &[u8]) -> Result<Vec<u8>, ConsulError> {
    use std::io::Read as _;
    let hint = raw
        .len()
        .checked_sub(4)
        .map(|at| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]) as usize)
        .unwrap_or(0)
        .min(MAX_INFLATED);
    let mut out = Vec::with_capacity(hint);
    flate2::read::GzDecoder::new(raw)
        .take(MAX_INFLATED as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ConsulError::Decode(format!("gzip answer: {e}")))?;
    if out.len() > MAX_INFLATED {
        return Err(ConsulError::Decode(format!(
            "gzip answer inflates past {MAX_INFLATED} bytes"
        )));
    }
    Ok(out)
}

/// `X-Consul-Index`: `None` when missing, `Some(None)` when not a number.
fn consul_index(headers: &HeaderMap) -> Option<Option<u64>> {
    headers
        .get("X-Consul-Index")
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()))
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

pub(crate) fn status_error(status: StatusCode, body: &[u8]) -> ConsulError {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)])
        .trim()
        .to_string();
    ConsulError::Status { status, body: text }
}

/// Most operations Consul 1.8 accepts in one transaction (`PUT /v1/txn`
/// answers 413 beyond it).
pub const MAX_TXN_OPS: usize = 64;

/// Keys per transaction when each key's record, the delete of an earlier
/// writer's record below the prefix, and the write generation
/// (`~generation`, one operation) go in the same transaction: a third of
/// [`MAX_TXN_OPS`] less that one, rounded down.
pub const KEYS_PER_TXN: usize = (MAX_TXN_OPS - 1) / 3;

/// Time allowed for one KV read or write made by the writer CLI (not a
/// blocking query): a write goes through the Raft leader.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

impl ConsulClient {
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, Vec<u8>), ConsulError> {
        self.send_within(request, REQUEST_TIMEOUT).await
    }

    /// Sends `request` with the token, bounded by `timeout` as a whole: its
    /// status and body.
    async fn send_within(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<(StatusCode, Vec<u8>), ConsulError> {
        let response = request
            .headers(self.headers()?)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e, timeout))?;
        Ok((status, body.to_vec()))
    }

    /// The full names of the keys under `prefix` (`GET
    /// /v1/kv/<prefix>?keys`, `&stale` when `stale`, asking gzip, within
    /// [`REQUEST_TIMEOUT`]) and the answer's `X-Consul-Index`: empty for a
    /// 404, `None` for a 403.
    ///
    /// # Errors
    ///
    /// Transport errors, a timeout, other error statuses, a body that is not
    /// a JSON list of strings.
    pub async fn list_keys(
        &self,
        prefix: &str,
        stale: bool,
    ) -> Result<(Option<Vec<String>>, Option<u64>), ConsulError> {
        let stale = if stale { "&stale" } else { "" };
        let url = format!("{}/v1/kv/{}?keys{stale}", self.addr, encode_key(prefix));
        let request = (self.http.get(&url)).header(reqwest::header::ACCEPT_ENCODING, "gzip");
        let response = (request.headers(self.headers()?).timeout(REQUEST_TIMEOUT))
            .send()
            .await
            .map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        let (status, index) = (
            response.status(),
            consul_index(response.headers()).flatten(),
        );
        let gzipped = (response.headers().get(reqwest::header::CONTENT_ENCODING))
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let raw = (response.bytes().await).map_err(|e| self.transport_error(e, REQUEST_TIMEOUT))?;
        let body = if gzipped { gunzip(&raw)? } else { raw.to_vec() };
        let keys = match status {
            StatusCode::NOT_FOUND => Some(Vec::new()),
            StatusCode::FORBIDDEN => None,
            StatusCode::OK => Some(
                serde_json::from_slice(&body)
                    .map_err(|e| ConsulError::Decode(format!("key list: {e}")))?,
            ),
            _ => return Err(status_error(status, &body)),
        };
        Ok((keys, index))
    }

    /// Reads one key (the full key, prefix included) with its ModifyIndex;
    /// `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, error statuses (403 when the
    /// token may not read it) and malformed answers.
    pub async fn get_key(&self, key: &str) -> Result<Option<KvPair>, ConsulError> {
        Ok(self.get_held_key(key).await?.map(|(pair, _)| pair))
    }

    /// As [`ConsulClient::get_key`], with the ID of the Consul session
    /// holding the key, if one does.
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::get_key`].
    pub async fn get_held_key(
        &self,
        key: &str,
    ) -> Result<Option<(KvPair, Option<String>)>, ConsulError> {
        let url = format!("{}/v1/kv/{}", self.addr, encode_key(key));
        let (status, body) = self.get(&url).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        let (mut pairs, mut holders) = decode_held_pairs(&body)?;
        match pairs.iter().position(|p| p.key == key) {
            Some(i) => Ok(Some((pairs.swap_remove(i), holders.remove(key)))),
            None => Err(ConsulError::Decode(format!("answer does not hold {key:?}"))),
        }
    }

    /// A GET of `url` within [`REQUEST_TIMEOUT`]: status and body.
    pub(crate) async fn get(&self, url: &str) -> Result<(StatusCode, Vec<u8>), ConsulError> {
        self.send(self.http.get(url)).await
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
    fn keys_are_percent_encoded_except_slashes() {
        assert_eq!(
            encode_key("gitlab-haproxy-agent/state/"),
            "gitlab-haproxy-agent/state/"
        );
        assert_eq!(encode_key("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn stale_mode_adds_the_query_parameter() {
        assert_eq!(consistency_param(Consistency::Default), "");
        assert_eq!(consistency_param(Consistency::Stale), "&stale");
        assert_eq!(Consistency::default(), Consistency::Default);
    }

    #[test]
    fn a_gzip_answer_inflates_exactly_and_a_broken_one_is_refused() {
        use std::io::Write as _;
        let text = br#"[{"Key":"p/canary","Value":"ZHJhaW4=","ModifyIndex":7}]"#.repeat(100);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&text).unwrap();
        let gz = enc.finish().unwrap();
        let out = gunzip(&gz).unwrap();
        assert_eq!(out, text);
        assert_eq!(
            out.capacity(),
            text.len(),
            "one allocation of the trailer's size"
        );
        assert!(gunzip(&gz[..gz.len() / 2]).is_err());
        assert!(gunzip(b"not gzip").is_err());
    }

    #[test]
    fn wait_always_has_a_unit() {
        assert_eq!(wait_param(Duration::from_secs(60)), "60000ms");
        assert_eq!(wait_param(Duration::ZERO), "1ms");
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
}
