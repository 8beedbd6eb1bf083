//! A small Consul KV client over the local agent's HTTP API: the blocking
//! prefix read the watcher holds, and the reads and compare-and-set writes
//! the writer CLI makes. The ACL token is read from a file, re-read on
//! demand, and sent only as `X-Consul-Token`.

use std::path::PathBuf;
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
}

/// Reads the ACL token from a file on first use and again after
/// [`TokenSource::invalidate`] (on a 403 or SIGHUP), so a rotated token needs
/// no restart. The token is never logged.
#[derive(Debug)]
pub struct TokenSource {
    path: Option<PathBuf>,
    cached: Mutex<Option<Option<HeaderValue>>>,
}

impl TokenSource {
    /// A token read from `path`, or no token when `None`.
    pub fn new(path: Option<PathBuf>) -> Self {
        TokenSource {
            path,
            cached: Mutex::new(None),
        }
    }

    /// The token file, if any.
    pub fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    /// Drops the cached token so the next request re-reads the file.
    pub fn invalidate(&self) {
        *self.cached.lock().unwrap() = None;
    }

    fn header(&self) -> Result<Option<HeaderValue>, ConsulError> {
        let mut cached = self.cached.lock().unwrap();
        if let Some(h) = cached.as_ref() {
            return Ok(h.clone());
        }
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
}

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
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, a timeout after
    /// `wait + TIMEOUT_MARGIN`, error statuses, and answers without a numeric
    /// `X-Consul-Index`, with malformed JSON or base64, or a 200 with no keys
    /// (a real empty prefix answers 404).
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
        if status == StatusCode::NOT_FOUND {
            return Ok(PrefixAnswer {
                index,
                pairs: Vec::new(),
                body_bytes: body.len(),
            });
        }
        let pairs = decode_pairs(&body)?;
        if pairs.is_empty() {
            return Err(ConsulError::Decode(
                "200 with no keys (an empty prefix answers 404)".into(),
            ));
        }
        Ok(PrefixAnswer {
            index,
            pairs,
            body_bytes: body.len(),
        })
    }
}

fn status_error(status: StatusCode, body: &[u8]) -> ConsulError {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)])
        .trim()
        .to_string();
    ConsulError::Status { status, body: text }
}

/// Decodes a KV list body: a JSON array of `{Key, Value, ModifyIndex, ...}`
/// with values in standard padded base64 or `null` (api-docs/kv).
///
/// # Errors
///
/// [`ConsulError::Decode`] for malformed JSON or base64.
pub fn decode_pairs(body: &[u8]) -> Result<Vec<KvPair>, ConsulError> {
    let raw: Vec<RawPair> =
        serde_json::from_slice(body).map_err(|e| ConsulError::Decode(format!("JSON: {e}")))?;
    raw.into_iter()
        .map(|p| {
            let value = match p.value {
                None => Vec::new(),
                Some(b64) => base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| {
                        ConsulError::Decode(format!("base64 value of {:?}: {e}", p.key))
                    })?,
            };
            Ok(KvPair {
                key: p.key,
                value,
                modify_index: p.modify_index,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_values_and_nulls() {
        let body = br#"[{"LockIndex":0,"Key":"p/canary","Flags":0,"Value":"ZHJhaW4=","CreateIndex":5,"ModifyIndex":7},
                         {"Key":"p/web/web-01","Value":null,"ModifyIndex":9}]"#;
        let pairs = decode_pairs(body).unwrap();
        assert_eq!(pairs[0].value, b"drain");
        assert_eq!(pairs[0].modify_index, 7);
        assert_eq!(pairs[1].value, b"");
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
}
