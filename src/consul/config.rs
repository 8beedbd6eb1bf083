//! Where Consul is, for both the daemon and the writer: the shared Consul
//! options ([`ConsulArgs`]) resolved, with the fallbacks `main` reads from
//! the process environment, into a validated [`ConsulConfig`].

use std::path::PathBuf;

use crate::cli::{bad, ConfigError, ConsulArgs};

/// Default Consul agent address.
pub const DEFAULT_CONSUL_ADDR: &str = "http://127.0.0.1:8500";

/// Name of the systemd credential holding the Consul token
/// (`LoadCredential=consul-token:...`).
pub const TOKEN_CREDENTIAL: &str = "consul-token";

/// Values the options fall back to that come from the process environment,
/// gathered by `main` so that conversion stays a pure function.
#[derive(Debug, Clone, Default)]
pub struct Fallbacks {
    /// `$CONSUL_HTTP_ADDR`, Consul's own variable.
    pub consul_http_addr: Option<String>,
    /// `$CREDENTIALS_DIRECTORY/consul-token`, when that file exists.
    pub credential_token_file: Option<PathBuf>,
    /// `$CONSUL_HTTP_TOKEN_FILE`, as the `consul` CLI reads it; used by the
    /// writer CLI only (the daemon takes its token from a file it is given).
    pub consul_http_token_file: Option<PathBuf>,
    /// `$STATE_DIRECTORY` (the first folder of systemd's `StateDirectory=`);
    /// the daemon's state folder when `--state-dir` is not given.
    pub state_directory: Option<PathBuf>,
    /// `$RUNTIME_DIRECTORY` (the first folder of systemd's
    /// `RuntimeDirectory=`); the daemon's runtime folder when
    /// `--runtime-dir` is not given.
    pub runtime_directory: Option<PathBuf>,
    /// `$CONSUL_HTTP_TOKEN`; used by the writer CLI only, after
    /// `--consul-token-file` and `$CONSUL_HTTP_TOKEN_FILE`.
    pub consul_http_token: Option<String>,
}

/// Consul connection settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    /// Base URL, `http://host:port`, no trailing slash.
    pub addr: String,
    /// Token file, if any.
    pub token_file: Option<PathBuf>,
    /// Prefix, ending in `/`.
    pub prefix: String,
}

impl ConsulArgs {
    /// Validates the Consul options.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an address that is not `http://host:port` (HTTPS is
    /// not supported: the agent talks to the local Consul agent) or a prefix
    /// with characters outside `A-Z a-z 0-9 . _ - /`.
    pub fn resolve(&self, fallbacks: &Fallbacks) -> Result<ConsulConfig, ConfigError> {
        let raw = self
            .consul_addr
            .clone()
            .or_else(|| fallbacks.consul_http_addr.clone())
            .unwrap_or_else(|| DEFAULT_CONSUL_ADDR.to_string());
        let addr = normalize_consul_addr(&raw).map_err(|r| bad("--consul-addr", &raw, r))?;
        let prefix =
            normalize_prefix(&self.prefix).map_err(|r| bad("--prefix", &self.prefix, r))?;
        Ok(ConsulConfig {
            addr,
            token_file: self
                .consul_token_file
                .clone()
                .or_else(|| fallbacks.credential_token_file.clone()),
            prefix,
        })
    }
}

/// Validates a Consul address as `--consul-addr` takes it
/// (`http://host:port`, or `host:port`): the base URL, no trailing slash.
///
/// # Errors
///
/// What is wrong with it: another scheme than http, no host, a path or a
/// query.
pub fn normalize_consul_addr(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| e.to_string())?;
    if url.scheme() != "http" {
        return Err("only http:// is supported (the local Consul agent)".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if url.path() != "/" || url.query().is_some() {
        return Err("give only scheme, host and port".into());
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

fn normalize_prefix(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() || trimmed == "/" {
        return Err("the prefix must not be empty (that would watch the whole KV store)".into());
    }
    if trimmed.starts_with('/') {
        return Err("the prefix must not start with /".into());
    }
    if let Some(c) = trimmed
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(format!("character {c:?} is not allowed"));
    }
    if trimmed.contains("//") {
        return Err("empty path segment".into());
    }
    Ok(if trimmed.ends_with('/') {
        trimmed.to_string()
    } else {
        format!("{trimmed}/")
    })
}
