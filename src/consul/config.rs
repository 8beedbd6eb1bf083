//! Where Consul is, for both the daemon and the writer: the shared Consul
//! options ([`ConsulArgs`]) resolved, with the fallbacks `main` reads from
//! the process environment, into a validated [`ConsulConfig`].

use std::path::PathBuf;

use super::tls::{file, Tls, TlsSettings};
use super::{ConsulClient, TokenSource};
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
    /// `$CONSUL_HTTP_SSL`: when true, an address without a scheme is
    /// https:// (the Consul CLI's rule).
    pub consul_http_ssl: Option<String>,
    /// `$CONSUL_CACERT`, under `--consul-ca-file`.
    pub consul_cacert: Option<PathBuf>,
    /// `$CONSUL_CLIENT_CERT`, under `--consul-client-cert`.
    pub consul_client_cert: Option<PathBuf>,
    /// `$CONSUL_CLIENT_KEY`, under `--consul-client-key`.
    pub consul_client_key: Option<PathBuf>,
    /// `$CONSUL_TLS_SERVER_NAME`, under `--consul-tls-server-name`.
    pub consul_tls_server_name: Option<String>,
    /// `$CONSUL_HTTP_SSL_VERIFY`, under `--consul-http-ssl-verify`.
    pub consul_http_ssl_verify: Option<String>,
}

/// Consul connection settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsulConfig {
    /// Base URL, `http://host:port` or `https://host:port`, no trailing
    /// slash.
    pub addr: String,
    /// Token file, if any.
    pub token_file: Option<PathBuf>,
    /// Prefix, ending in `/`.
    pub prefix: String,
    /// TLS options for https:// addresses.
    pub tls: TlsSettings,
    /// `tls`'s files, loaded by [`ConsulConfig::load_tls`] (until then
    /// none: [`Tls::default`]); every Consul client is built with it.
    pub loaded_tls: Tls,
}

impl ConsulConfig {
    /// Reads the TLS options' files ([`TlsSettings::load`]) into
    /// `loaded_tls`.
    ///
    /// # Errors
    ///
    /// As [`TlsSettings::load`]: a [`ConfigError`] naming the option.
    pub fn load_tls(mut self) -> Result<Self, ConfigError> {
        self.loaded_tls = self.tls.load()?;
        Ok(self)
    }

    /// A client for `addr` with `loaded_tls` and `token`, each connection
    /// attempt bounded by 2 s.
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::new`].
    pub fn client(&self, token: TokenSource) -> anyhow::Result<ConsulClient> {
        let connect_timeout = std::time::Duration::from_secs(2);
        ConsulClient::new(&self.addr, token, connect_timeout, &self.loaded_tls)
    }
}

impl ConsulArgs {
    /// Validates the Consul options. Each TLS option falls back to the
    /// Consul CLI's variable (`$CONSUL_CACERT`, `$CONSUL_CLIENT_CERT`,
    /// `$CONSUL_CLIENT_KEY`, `$CONSUL_TLS_SERVER_NAME`,
    /// `$CONSUL_HTTP_SSL_VERIFY`), as `--consul-addr` falls back to
    /// `$CONSUL_HTTP_ADDR`; no file is read here ([`TlsSettings::load`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an address that is not `http(s)://host:port`, a
    /// prefix with characters outside `A-Z a-z 0-9 . _ - /`, or
    /// `$CONSUL_HTTP_SSL` / `$CONSUL_HTTP_SSL_VERIFY` that is not a boolean
    /// as Go's `strconv.ParseBool` reads it.
    pub fn resolve(&self, fallbacks: &Fallbacks) -> Result<ConsulConfig, ConfigError> {
        let ssl = go_bool("$CONSUL_HTTP_SSL", fallbacks.consul_http_ssl.as_deref())?;
        let scheme = if ssl == Some(true) { "https" } else { "http" };
        let raw = self
            .consul_addr
            .clone()
            .or_else(|| fallbacks.consul_http_addr.clone())
            .unwrap_or_else(|| {
                DEFAULT_CONSUL_ADDR
                    .trim_start_matches("http://")
                    .to_string()
            });
        let addr =
            normalize_consul_addr_as(&raw, scheme).map_err(|r| bad("--consul-addr", &raw, r))?;
        let prefix =
            normalize_prefix(&self.prefix).map_err(|r| bad("--prefix", &self.prefix, r))?;
        let either = |flag: &Option<PathBuf>, flag_name, env: &Option<PathBuf>, env_name| {
            file(flag.as_deref(), flag_name).or_else(|| file(env.as_deref(), env_name))
        };
        let verify = match self.consul_http_ssl_verify {
            Some(v) => v,
            None => go_bool(
                "$CONSUL_HTTP_SSL_VERIFY",
                fallbacks.consul_http_ssl_verify.as_deref(),
            )?
            .unwrap_or(true),
        };
        let tls = TlsSettings {
            ca_file: either(
                &self.consul_ca_file,
                "--consul-ca-file",
                &fallbacks.consul_cacert,
                "$CONSUL_CACERT",
            ),
            client_cert: either(
                &self.consul_client_cert,
                "--consul-client-cert",
                &fallbacks.consul_client_cert,
                "$CONSUL_CLIENT_CERT",
            ),
            client_key: either(
                &self.consul_client_key,
                "--consul-client-key",
                &fallbacks.consul_client_key,
                "$CONSUL_CLIENT_KEY",
            ),
            server_name: self
                .consul_tls_server_name
                .clone()
                .or_else(|| fallbacks.consul_tls_server_name.clone())
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty()),
            verify,
        };
        Ok(ConsulConfig {
            addr,
            token_file: self
                .consul_token_file
                .clone()
                .or_else(|| fallbacks.credential_token_file.clone()),
            prefix,
            tls,
            loaded_tls: Tls::default(),
        })
    }
}

/// A boolean variable of the Consul CLI, read as Go's `strconv.ParseBool`
/// does (`1 t T TRUE true True`, `0 f F FALSE false False`); `None` when
/// unset or empty.
fn go_bool(name: &'static str, raw: Option<&str>) -> Result<Option<bool>, ConfigError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(Some(true)),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(Some(false)),
        Some(other) => Err(bad(name, other, "must be true or false")),
    }
}

/// Validates a Consul address as `--consul-addr` takes it
/// (`http://host:port`, `https://host:port`, or `host:port` for http):
/// the base URL, no trailing slash.
///
/// # Errors
///
/// As [`normalize_consul_addr_as`].
pub fn normalize_consul_addr(raw: &str) -> Result<String, String> {
    normalize_consul_addr_as(raw, "http")
}

/// As [`normalize_consul_addr`], with `scheme` (`http` or `https`) for an
/// address without one.
///
/// # Errors
///
/// What is wrong with it: another scheme than http or https, no host, a
/// path or a query.
pub fn normalize_consul_addr_as(raw: &str, scheme: &str) -> Result<String, String> {
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("{scheme}://{raw}")
    };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| e.to_string())?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err("only http:// and https:// are supported".into());
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
