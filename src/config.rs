//! Command-line options (each also read from a `GITLAB_HAPROXY_AGENT_*`
//! environment variable) and their conversion, as a pure function, into a
//! typed [`AgentConfig`]. Bad options exit 64 (EX_USAGE) before anything is
//! bound.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::consul::MAX_WAIT;
use crate::responder::ResponderConfig;
use crate::watcher::{Backoff, WatcherConfig};

/// Default Consul agent address.
pub const DEFAULT_CONSUL_ADDR: &str = "http://127.0.0.1:8500";

/// Default KV prefix.
pub const DEFAULT_PREFIX: &str = "gitlab-haproxy-agent/state/";

/// Name of the systemd credential holding the Consul token
/// (`LoadCredential=consul-token:...`).
pub const TOKEN_CREDENTIAL: &str = "consul-token";

/// Most agent-check connections `--max-connections` may allow: 65,536, far
/// above any load balancer's server count (each holds a file descriptor).
pub const MAX_CONNECTIONS_LIMIT: usize = 65_536;

/// The allowed `--min-query-interval` (inclusive): at least 10 ms so the
/// watcher loop never spins under churn, at most 10 s so a change still
/// reaches the agent quickly.
pub const MIN_QUERY_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(10));

/// Exit code for bad options: EX_USAGE from sysexits.h.
pub const EX_USAGE: i32 = 64;

/// Answers HAProxy agent-checks with the admin state desired in Consul KV.
///
/// Holds a Consul blocking query on the prefix, keeps an in-memory copy, and
/// answers each agent-send line (`<backend>/<server> <group>...`) from the
/// first identity that has a key: `ready 100%`, `drain 100%`, `maint 100%`
/// or `ready N%`.
#[derive(Debug, Parser)]
#[command(name = "gitlab-haproxy-agent", version, about, long_about)]
pub struct Cli {
    /// Consul connection options.
    #[command(flatten)]
    pub consul: ConsulArgs,
    /// Daemon options.
    #[command(flatten)]
    pub agent: AgentArgs,
    /// No subcommand: run the daemon.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands; without one the binary runs the daemon.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read and write desired state in Consul KV (the writer CLI): validated
    /// values, compare-and-set, drain -> wait -> maint sequences.
    State(crate::writer::StateArgs),
}

/// How to reach Consul; shared by the daemon and the writer (global, so they
/// are also accepted after `state ...`).
#[derive(Debug, Args, Clone)]
pub struct ConsulArgs {
    /// Local Consul agent HTTP address [default: $CONSUL_HTTP_ADDR, else
    /// http://127.0.0.1:8500].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_ADDR",
        value_name = "URL"
    )]
    pub consul_addr: Option<String>,

    /// File holding the Consul ACL token, sent as X-Consul-Token and re-read
    /// on 403 and SIGHUP [default: $CREDENTIALS_DIRECTORY/consul-token if it
    /// exists, else no token].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub consul_token_file: Option<PathBuf>,

    /// KV prefix holding desired state (always treated as ending in `/`).
    #[arg(long, global = true, env = "GITLAB_HAPROXY_AGENT_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// journald when stderr is the journal (`$JOURNAL_STREAM`), else text.
    Auto,
    /// Human-readable lines on stderr.
    Text,
    /// One JSON object per line on stderr.
    Json,
    /// Structured entries to the journal socket.
    Journald,
}

/// What the daemon does when the first Consul read has not succeeded within
/// `--startup-timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnStartupTimeout {
    /// Exit 1 naming the Consul address and the error. The default: on a VM
    /// systemd restarts the agent (`Restart=on-failure`) and the failure
    /// shows in the unit state.
    Exit,
    /// Stay up: `/-/ready` keeps answering 503 and agent-checks get no
    /// answer (HAProxy keeps each server's current state) while the watcher
    /// keeps retrying with its backoff (250 ms doubling to 30 s); ready at
    /// the first successful read. For a Kubernetes sidecar, where exiting
    /// would put the pod in CrashLoopBackOff (restart delays up to 5 min)
    /// and the readiness probe already keeps the pod out of rotation.
    Retry,
}

/// Daemon options.
#[derive(Debug, Args, Clone)]
pub struct AgentArgs {
    /// Agent-check listener (HAProxy's agent-addr:agent-port).
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_LISTEN",
        default_value = "127.0.0.1:9777"
    )]
    pub listen: SocketAddr,

    /// HTTP listener for /metrics, /-/healthy, /-/ready and /status.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_HTTP_LISTEN",
        default_value = "127.0.0.1:9778"
    )]
    pub http_listen: SocketAddr,

    /// Blocking-query wait sent to Consul (1s to 10m; Consul adds up to
    /// 1/16 of jitter).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_WAIT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// How long to retry the first Consul read before --on-startup-timeout
    /// applies.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_STARTUP_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub startup_timeout: Duration,

    /// What to do when the first Consul read has not succeeded within
    /// --startup-timeout: `exit` 1 (the service manager restarts the agent),
    /// or `retry` (stay up and unready, answer nobody, keep retrying with
    /// backoff; for a Kubernetes sidecar).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_ON_STARTUP_TIMEOUT", value_enum, default_value_t = OnStartupTimeout::Exit)]
    pub on_startup_timeout: OnStartupTimeout,

    /// Time an agent-check client has to send its line (10ms to 2s; keep it
    /// well under agent-inter).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_CHECK_TIMEOUT", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub check_timeout: Duration,

    /// Agent-check connections served at once; more are closed unanswered.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,

    /// Least time between two Consul requests (rate limit under churn),
    /// 10ms..10s.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_MIN_QUERY_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub min_query_interval: Duration,

    /// Log format.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
}

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
    /// `$CONSUL_HTTP_TOKEN`; used by the writer CLI only, after
    /// `--consul-token-file` and `$CONSUL_HTTP_TOKEN_FILE`.
    pub consul_http_token: Option<String>,
}

/// A bad option value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {option} {value:?}: {reason}")]
pub struct ConfigError {
    /// The option, e.g. `--prefix`.
    pub option: &'static str,
    /// The value given.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(option: &'static str, value: impl ToString, reason: impl ToString) -> ConfigError {
    ConfigError {
        option,
        value: value.to_string(),
        reason: reason.to_string(),
    }
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

fn normalize_consul_addr(raw: &str) -> Result<String, String> {
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

/// Everything the daemon needs, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Consul settings.
    pub consul: ConsulConfig,
    /// Agent-check listener.
    pub listen: SocketAddr,
    /// HTTP listener.
    pub http_listen: SocketAddr,
    /// How long to retry the first sync.
    pub startup_timeout: Duration,
    /// What to do when the first sync has not succeeded by then.
    pub on_startup_timeout: OnStartupTimeout,
    /// Watcher settings.
    pub watcher: WatcherConfig,
    /// Responder settings.
    pub responder: ResponderConfig,
    /// Log format.
    pub log_format: LogFormat,
}

impl AgentConfig {
    /// Converts parsed options into a config.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first bad option.
    pub fn from_cli(cli: &Cli, fallbacks: &Fallbacks) -> Result<Self, ConfigError> {
        let consul = cli.consul.resolve(fallbacks)?;
        let a = &cli.agent;
        let human = |d: Duration| humantime::format_duration(d).to_string();
        if a.wait < Duration::from_secs(1) || a.wait > MAX_WAIT {
            return Err(bad("--wait", human(a.wait), "must be between 1s and 10m"));
        }
        if a.startup_timeout.is_zero() {
            return Err(bad("--startup-timeout", "0s", "must be more than 0"));
        }
        if a.check_timeout < Duration::from_millis(10) || a.check_timeout > Duration::from_secs(2) {
            return Err(bad(
                "--check-timeout",
                human(a.check_timeout),
                "must be between 10ms and 2s (under agent-inter)",
            ));
        }
        if a.max_connections == 0 || a.max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(bad(
                "--max-connections",
                a.max_connections,
                format!("must be between 1 and {MAX_CONNECTIONS_LIMIT}"),
            ));
        }
        if a.min_query_interval < MIN_QUERY_INTERVAL_RANGE.0
            || a.min_query_interval > MIN_QUERY_INTERVAL_RANGE.1
        {
            return Err(bad(
                "--min-query-interval",
                human(a.min_query_interval),
                "must be between 10ms and 10s",
            ));
        }
        if a.listen == a.http_listen && a.listen.port() != 0 {
            return Err(bad(
                "--http-listen",
                a.http_listen,
                "same address as --listen",
            ));
        }
        Ok(AgentConfig {
            watcher: WatcherConfig {
                prefix: consul.prefix.clone(),
                wait: a.wait,
                min_interval: a.min_query_interval,
                backoff: Backoff::default(),
            },
            consul,
            listen: a.listen,
            http_listen: a.http_listen,
            startup_timeout: a.startup_timeout,
            on_startup_timeout: a.on_startup_timeout,
            responder: ResponderConfig {
                max_connections: a.max_connections,
                check_timeout: a.check_timeout,
            },
            log_format: a.log_format,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gitlab-haproxy-agent").chain(args.iter().copied()))
    }

    fn config(args: &[&str], fallbacks: &Fallbacks) -> Result<AgentConfig, ConfigError> {
        AgentConfig::from_cli(&parse(args).expect("clap accepts"), fallbacks)
    }

    #[test]
    fn defaults_match_the_documented_interface() {
        let c = config(&[], &Fallbacks::default()).unwrap();
        assert_eq!(c.consul.addr, "http://127.0.0.1:8500");
        assert_eq!(c.consul.prefix, "gitlab-haproxy-agent/state/");
        assert_eq!(c.consul.token_file, None);
        assert_eq!(c.listen, "127.0.0.1:9777".parse().unwrap());
        assert_eq!(c.http_listen, "127.0.0.1:9778".parse().unwrap());
        assert_eq!(c.watcher.wait, Duration::from_secs(60));
        assert_eq!(c.responder.check_timeout, Duration::from_millis(500));
        assert_eq!(c.log_format, LogFormat::Auto);
        assert_eq!(c.on_startup_timeout, OnStartupTimeout::Exit);
    }

    #[test]
    fn on_startup_timeout_takes_exit_or_retry() {
        let fb = Fallbacks::default();
        let c = config(&["--on-startup-timeout", "retry"], &fb).unwrap();
        assert_eq!(c.on_startup_timeout, OnStartupTimeout::Retry);
        assert!(parse(&["--on-startup-timeout", "wait"]).is_err());
    }

    #[test]
    fn consul_http_addr_is_a_fallback_and_the_flag_wins() {
        let fb = Fallbacks {
            consul_http_addr: Some("10.0.0.1:8500".into()),
            credential_token_file: Some("/run/credentials/x/consul-token".into()),
            ..Fallbacks::default()
        };
        let c = config(&[], &fb).unwrap();
        assert_eq!(c.consul.addr, "http://10.0.0.1:8500");
        assert_eq!(
            c.consul.token_file,
            Some(PathBuf::from("/run/credentials/x/consul-token"))
        );
        let c = config(
            &[
                "--consul-addr",
                "http://127.0.0.1:18500/",
                "--consul-token-file",
                "/t",
            ],
            &fb,
        )
        .unwrap();
        assert_eq!(c.consul.addr, "http://127.0.0.1:18500");
        assert_eq!(c.consul.token_file, Some(PathBuf::from("/t")));
    }

    #[test]
    fn prefix_always_ends_in_slash() {
        let c = config(&["--prefix", "a/b"], &Fallbacks::default()).unwrap();
        assert_eq!(c.consul.prefix, "a/b/");
    }

    #[test]
    fn bad_values_name_the_option() {
        let fb = Fallbacks::default();
        for (args, option) in [
            (vec!["--prefix", ""], "--prefix"),
            (vec!["--prefix", "/abs"], "--prefix"),
            (vec!["--prefix", "a b"], "--prefix"),
            (
                vec!["--consul-addr", "https://consul:8501"],
                "--consul-addr",
            ),
            (
                vec!["--consul-addr", "http://consul:8500/v1"],
                "--consul-addr",
            ),
            (vec!["--wait", "20m"], "--wait"),
            (vec!["--wait", "10ms"], "--wait"),
            (vec!["--check-timeout", "5s"], "--check-timeout"),
            (vec!["--min-query-interval", "0s"], "--min-query-interval"),
            (vec!["--min-query-interval", "11s"], "--min-query-interval"),
            (vec!["--max-connections", "0"], "--max-connections"),
            (vec!["--max-connections", "65537"], "--max-connections"),
            (
                vec!["--max-connections", "18446744073709551615"],
                "--max-connections",
            ),
            (vec!["--http-listen", "127.0.0.1:9777"], "--http-listen"),
        ] {
            let err = config(&args, &fb).unwrap_err();
            assert_eq!(err.option, option, "{args:?}");
        }
    }

    #[test]
    fn no_subcommand_is_the_daemon_and_consul_options_follow_state() {
        assert!(parse(&[]).unwrap().command.is_none());
        let cli = parse(&[
            "state",
            "list",
            "--consul-addr",
            "127.0.0.1:18500",
            "--prefix",
            "p",
        ])
        .unwrap();
        assert!(matches!(cli.command, Some(Command::State(_))));
        let c = cli.consul.resolve(&Fallbacks::default()).unwrap();
        assert_eq!(c.addr, "http://127.0.0.1:18500");
        assert_eq!(c.prefix, "p/");
        let cli = parse(&["--consul-addr", "10.0.0.1:8500", "state", "get", "canary"]).unwrap();
        assert_eq!(cli.consul.consul_addr.as_deref(), Some("10.0.0.1:8500"));
        // Daemon options do not apply to the writer.
        assert!(parse(&["state", "list", "--listen", "127.0.0.1:1"]).is_err());
    }

    #[test]
    fn clap_refuses_malformed_values() {
        assert!(parse(&["--listen", "nope"]).is_err());
        assert!(parse(&["--wait", "60"]).is_err());
        assert!(parse(&["--log-format", "xml"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
    }
}
