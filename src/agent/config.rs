//! The daemon's configuration: its command-line options ([`crate::cli`]),
//! each also read from a `GITLAB_HAPROXY_AGENT_*` environment variable,
//! converted as a pure function into a typed [`AgentConfig`]. Bad options
//! exit 64 (EX_USAGE) before anything is bound.

use std::net::SocketAddr;
use std::time::Duration;

use crate::agent::discovery::{Discovery, REFRESH_RANGE};
use crate::agent::http::DebugAccess;
use crate::agent::responder::ResponderConfig;
use crate::agent::watcher::{Backoff, WatcherConfig};
use crate::cli::{bad, AgentArgs, Cli, ConfigError, LogFormat, OnStartupTimeout};
use crate::consul::config::{normalize_consul_addr_as, ConsulConfig, Fallbacks};
use crate::consul::MAX_WAIT;
use crate::decision::stale::MAX_STALE_RANGE;

/// Most agent-check connections `--max-connections` may allow: 65,536, far
/// above any load balancer's server count (each holds a file descriptor).
pub const MAX_CONNECTIONS_LIMIT: usize = 65_536;

/// The allowed `--index-check` when not 0 (inclusive): 500 ms to 60 s.
pub const INDEX_CHECK_RANGE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(60));

/// The allowed `--min-query-interval` (inclusive): at least 10 ms so the
/// watcher loop never spins under churn, at most 10 s so a change still
/// reaches the agent quickly.
pub const MIN_QUERY_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(10));

/// Everything the daemon needs, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Consul settings.
    pub consul: ConsulConfig,
    /// Agent-check listener.
    pub listen: SocketAddr,
    /// HTTP listener.
    pub http_listen: SocketAddr,
    /// Who may read `/status` and `/debug/pprof/`.
    pub http_debug: DebugAccess,
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
    /// Folder of the state file; `None`: nothing survives a restart.
    pub state_dir: Option<std::path::PathBuf>,
    /// Folder of the runtime copy of the state file (`--runtime-dir`, else
    /// `$RUNTIME_DIRECTORY`); `None`: no runtime copy.
    pub runtime_dir: Option<std::path::PathBuf>,
    /// Log lines queued for a sink that does not read (`--log-buffer-lines`).
    pub log_buffer_lines: usize,
    /// `--consul-fallback-addr`, validated, in order; empty by default.
    pub consul_fallbacks: Vec<String>,
    /// `--haproxy-pid-file`: whose master's old workers are counted.
    pub haproxy_pid_file: std::path::PathBuf,
}

impl AgentConfig {
    /// Converts parsed options into a config.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first bad option; a TLS option whose file
    /// cannot be read or used is one (the TLS files are read here).
    pub fn from_cli(cli: &Cli, fallbacks: &Fallbacks) -> Result<Self, ConfigError> {
        let consul = cli.consul.resolve(fallbacks)?.load_tls()?;
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
        if a.max_stale < MAX_STALE_RANGE.0 || a.max_stale > MAX_STALE_RANGE.1 {
            return Err(bad(
                "--max-stale",
                human(a.max_stale),
                "must be between 100ms and 10m",
            ));
        }
        if !a.index_check.is_zero()
            && (a.index_check < INDEX_CHECK_RANGE.0 || a.index_check > INDEX_CHECK_RANGE.1)
        {
            return Err(bad(
                "--index-check",
                human(a.index_check),
                "must be 0 (off) or between 500ms and 60s",
            ));
        }
        let mut consul_fallbacks = Vec::new();
        let listed: Vec<&String> = a
            .consul_fallback_addr
            .iter()
            .filter(|r| !r.trim().is_empty())
            .collect();
        let off = listed.iter().any(|r| r.trim().eq_ignore_ascii_case("none"));
        if off && listed.len() > 1 {
            return Err(bad(
                "--consul-fallback-addr",
                listed
                    .iter()
                    .map(|r| r.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                "`none` turns fallbacks off: give it alone",
            ));
        }
        let discovery = if off || !listed.is_empty() {
            None
        } else {
            Some(discovery(&consul.addr, a)?)
        };
        let https = consul.addr.starts_with("https://");
        for raw in listed.into_iter().filter(|_| !off) {
            let addr = normalize_consul_addr_as(raw, if https { "https" } else { "http" })
                .map_err(|reason| bad("--consul-fallback-addr", raw, reason))?;
            if https && !addr.starts_with("https://") {
                return Err(bad(
                    "--consul-fallback-addr",
                    raw,
                    "plain http:// while --consul-addr is https://: reads would leave TLS",
                ));
            }
            if addr == consul.addr || consul_fallbacks.contains(&addr) {
                return Err(bad(
                    "--consul-fallback-addr",
                    raw,
                    "given twice (or the same as --consul-addr)",
                ));
            }
            consul_fallbacks.push(addr);
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
                consistency: a.consistency,
                max_stale: a.max_stale,
                index_check: a.index_check,
                datacenter: consul_datacenter(a.consul_datacenter.as_deref())?,
                discovery,
            },
            consul,
            listen: a.listen,
            http_listen: a.http_listen,
            http_debug: if a.http_remote_debug {
                DebugAccess::Anyone
            } else {
                DebugAccess::Loopback
            },
            startup_timeout: a.startup_timeout,
            on_startup_timeout: a.on_startup_timeout,
            responder: ResponderConfig {
                max_connections: a.max_connections,
                check_timeout: a.check_timeout,
            },
            log_format: a.log_format,
            state_dir: state_dir(a.state_dir.as_deref(), fallbacks)?,
            runtime_dir: runtime_dir(a.runtime_dir.as_deref(), fallbacks)?,
            log_buffer_lines: usize::try_from(a.log_buffer_lines).unwrap_or(usize::MAX),
            consul_fallbacks,
            haproxy_pid_file: a.haproxy_pid_file.clone(),
        })
    }
}

/// How fallbacks are found when no `--consul-fallback-addr` list is
/// given: on the scheme of `--consul-addr` (`primary`, normalized) and on
/// `--consul-fallback-port`, else its port, read again every
/// `--consul-fallback-refresh`.
fn discovery(primary: &str, a: &AgentArgs) -> Result<Discovery, ConfigError> {
    let refresh = a.consul_fallback_refresh;
    if refresh < REFRESH_RANGE.0 || refresh > REFRESH_RANGE.1 {
        return Err(bad(
            "--consul-fallback-refresh",
            humantime::format_duration(refresh),
            "must be between 1s and 10m",
        ));
    }
    let url = reqwest::Url::parse(primary).map_err(|e| bad("--consul-addr", primary, e))?;
    let port = a
        .consul_fallback_port
        .or_else(|| url.port_or_known_default())
        .ok_or_else(|| bad("--consul-addr", primary, "no port"))?;
    Ok(Discovery {
        scheme: url.scheme().to_string(),
        port,
        refresh,
    })
}

/// `--consul-datacenter`, lower-cased as Consul keeps it: a name of letters,
/// digits, `-` and `_` (Consul's own rule for `datacenter`,
/// agent/config/builder.go); empty or unset: learned from `--consul-addr`.
fn consul_datacenter(option: Option<&str>) -> Result<Option<String>, ConfigError> {
    let Some(name) = option.map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    if name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(bad(
            "--consul-datacenter",
            name,
            "must be letters, digits, - and _ (at most 64)",
        ));
    }
    Ok(Some(name.to_ascii_lowercase()))
}

/// The runtime folder: `--runtime-dir`, else systemd's `$RUNTIME_DIRECTORY`.
fn runtime_dir(
    option: Option<&std::path::Path>,
    fallbacks: &Fallbacks,
) -> Result<Option<std::path::PathBuf>, ConfigError> {
    match option {
        Some(p) if p.as_os_str().is_empty() => {
            Err(bad("--runtime-dir", "\"\"", "must name a folder"))
        }
        Some(p) => Ok(Some(p.to_path_buf())),
        None => Ok(fallbacks.runtime_directory.clone()),
    }
}

/// The state folder: `--state-dir`, else systemd's `$STATE_DIRECTORY`.
fn state_dir(
    option: Option<&std::path::Path>,
    fallbacks: &Fallbacks,
) -> Result<Option<std::path::PathBuf>, ConfigError> {
    match option {
        Some(p) if p.as_os_str().is_empty() => {
            Err(bad("--state-dir", "\"\"", "must name a folder"))
        }
        Some(p) => Ok(Some(p.to_path_buf())),
        None => Ok(fallbacks.state_directory.clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser as _;

    use super::*;
    use crate::cli::{Command, Consistency};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gitlab-haproxy-agent").chain(args.iter().copied()))
    }

    fn config(args: &[&str], fallbacks: &Fallbacks) -> Result<AgentConfig, ConfigError> {
        AgentConfig::from_cli(&parse(args).expect("clap accepts"), fallbacks)
    }

    #[test]
    fn consul_datacenter_is_a_consul_name_lower_cased_and_learned_by_default() {
        let none = config(&[], &Fallbacks::default()).unwrap();
        assert_eq!(none.watcher.datacenter, None);
        let empty = config(&["--consul-datacenter", ""], &Fallbacks::default()).unwrap();
        assert_eq!(empty.watcher.datacenter, None);
        let c = config(
            &["--consul-datacenter", "GPRD-us_east1"],
            &Fallbacks::default(),
        )
        .unwrap();
        assert_eq!(c.watcher.datacenter.as_deref(), Some("gprd-us_east1"));
        for bad in ["dc 1", "dc1/x", "dc.1"] {
            let e = config(&["--consul-datacenter", bad], &Fallbacks::default()).unwrap_err();
            assert_eq!(e.option, "--consul-datacenter", "{bad}");
        }
    }

    #[test]
    fn consul_fallbacks_are_found_by_default_listed_or_none() {
        let found = config(&[], &Fallbacks::default()).unwrap();
        assert!(found.consul_fallbacks.is_empty());
        assert_eq!(
            found.watcher.discovery,
            Some(Discovery {
                scheme: "http".into(),
                port: 8500,
                refresh: crate::agent::discovery::DEFAULT_REFRESH,
            })
        );
        let port = config(
            &[
                "--consul-addr",
                "10.0.0.5",
                "--consul-fallback-refresh",
                "5s",
            ],
            &Fallbacks::default(),
        )
        .unwrap();
        let d = port.watcher.discovery.unwrap();
        assert_eq!((d.port, d.refresh), (80, Duration::from_secs(5)));
        let pinned = config(&["--consul-fallback-port", "8501"], &Fallbacks::default()).unwrap();
        assert_eq!(pinned.watcher.discovery.unwrap().port, 8501);
        for off in [
            &["--consul-fallback-addr", "none"][..],
            &["--consul-fallback-addr", "NONE"],
        ] {
            let c = config(off, &Fallbacks::default()).unwrap();
            assert!(c.consul_fallbacks.is_empty() && c.watcher.discovery.is_none());
        }
        let listed = config(
            &["--consul-fallback-addr", "10.0.0.2:8500"],
            &Fallbacks::default(),
        );
        assert_eq!(
            listed.unwrap().watcher.discovery,
            None,
            "a list replaces them"
        );
        for (args, option) in [
            (
                &["--consul-fallback-addr", "none,10.0.0.2:8500"][..],
                "--consul-fallback-addr",
            ),
            (
                &["--consul-fallback-refresh", "500ms"],
                "--consul-fallback-refresh",
            ),
            (
                &["--consul-fallback-refresh", "11m"],
                "--consul-fallback-refresh",
            ),
        ] {
            let e = config(args, &Fallbacks::default()).unwrap_err();
            assert_eq!(e.option, option, "{args:?}");
        }
        assert!(parse(&["--consul-fallback-port", "0"]).is_err());
    }

    #[test]
    fn consul_fallbacks_are_validated_in_order() {
        let c = config(
            &[
                "--consul-fallback-addr",
                "10.0.0.2:8500,http://10.0.0.3:8500/",
                "--consul-fallback-addr",
                "10.0.0.4:8500",
            ],
            &Fallbacks::default(),
        )
        .unwrap();
        assert_eq!(
            c.consul_fallbacks,
            [
                "http://10.0.0.2:8500",
                "http://10.0.0.3:8500",
                "http://10.0.0.4:8500"
            ]
        );
        for (args, reason) in [
            (
                vec!["--consul-fallback-addr", "ftp://10.0.0.2:8501"],
                "only http:// and https://",
            ),
            (
                vec!["--consul-fallback-addr", "127.0.0.1:8500"],
                "given twice",
            ),
            (
                vec!["--consul-fallback-addr", "a:1,http://a:1"],
                "given twice",
            ),
        ] {
            let e = config(&args, &Fallbacks::default()).unwrap_err();
            assert_eq!(e.option, "--consul-fallback-addr");
            assert!(e.reason.contains(reason), "{args:?}: {e}");
        }
    }

    #[test]
    fn status_and_profiles_reach_remote_clients_only_when_asked() {
        let c = config(&["--http-remote-debug"], &Fallbacks::default()).unwrap();
        assert_eq!(c.http_debug, DebugAccess::Anyone);
    }

    #[test]
    fn defaults_match_the_documented_interface() {
        let c = config(&[], &Fallbacks::default()).unwrap();
        assert_eq!(c.consul.addr, "http://127.0.0.1:8500");
        assert_eq!(c.consul.prefix, "gitlab-haproxy-agent/state/");
        assert_eq!(c.consul.token_file, None);
        assert_eq!(c.listen, "127.0.0.1:9777".parse().unwrap());
        assert_eq!(c.http_listen, "0.0.0.0:9778".parse().unwrap());
        assert_eq!(c.http_debug, DebugAccess::Loopback);
        assert_eq!(c.watcher.wait, Duration::from_secs(60));
        assert_eq!(c.responder.check_timeout, Duration::from_millis(500));
        assert_eq!(c.log_format, LogFormat::Auto);
        assert_eq!(c.on_startup_timeout, OnStartupTimeout::Exit);
        assert_eq!(c.watcher.consistency, Consistency::Default);
        assert_eq!(c.watcher.max_stale, Duration::from_secs(5));
        assert_eq!(c.haproxy_pid_file.to_str(), Some("/run/haproxy.pid"));
        let c = config(
            &["--consistency", "stale", "--max-stale", "2s"],
            &Fallbacks::default(),
        )
        .unwrap();
        assert_eq!(c.watcher.consistency, Consistency::Stale);
        assert_eq!(c.watcher.max_stale, Duration::from_secs(2));
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
    fn https_addresses_take_the_consul_cli_tls_variables_under_the_options() {
        use crate::consul::tls::{TlsFile, TlsSettings};
        // CONSUL_HTTP_SSL: an address without a scheme is https://, the
        // default one too; a scheme given wins.
        let ssl = Fallbacks {
            consul_http_ssl: Some("true".into()),
            ..Fallbacks::default()
        };
        assert_eq!(
            config(&[], &ssl).unwrap().consul.addr,
            "https://127.0.0.1:8500"
        );
        let c = config(&["--consul-addr", "http://c:8500"], &ssl).unwrap();
        assert_eq!(c.consul.addr, "http://c:8500");
        let bad_bool = Fallbacks {
            consul_http_ssl: Some("yes".into()),
            ..Fallbacks::default()
        };
        assert_eq!(
            config(&[], &bad_bool).unwrap_err().option,
            "$CONSUL_HTTP_SSL"
        );

        let env = Fallbacks {
            consul_cacert: Some("/env/ca.pem".into()),
            consul_client_cert: Some("/env/cert.pem".into()),
            consul_client_key: Some("/env/key.pem".into()),
            consul_tls_server_name: Some("server.dc1.consul".into()),
            consul_http_ssl_verify: Some("0".into()),
            ..Fallbacks::default()
        };
        let file = |path: &str, from| {
            Some(TlsFile {
                path: path.into(),
                from,
            })
        };
        let tls = |args: &[&str]| parse(args).unwrap().consul.resolve(&env).unwrap().tls;
        assert_eq!(
            tls(&[]),
            TlsSettings {
                ca_file: file("/env/ca.pem", "$CONSUL_CACERT"),
                client_cert: file("/env/cert.pem", "$CONSUL_CLIENT_CERT"),
                client_key: file("/env/key.pem", "$CONSUL_CLIENT_KEY"),
                server_name: Some("server.dc1.consul".into()),
                verify: false,
            }
        );
        let flags = tls(&[
            "--consul-ca-file",
            "/ca.pem",
            "--consul-tls-server-name",
            "consul.example",
            "--consul-http-ssl-verify",
            "true",
        ]);
        assert_eq!(flags.ca_file, file("/ca.pem", "--consul-ca-file"));
        assert_eq!(flags.server_name.as_deref(), Some("consul.example"));
        assert!(flags.verify);
        let none = parse(&[]).unwrap().consul.resolve(&Fallbacks::default());
        assert_eq!(none.unwrap().tls, TlsSettings::default());
    }

    #[test]
    fn fallbacks_take_the_scheme_of_consul_addr_and_never_leave_tls() {
        let fb = Fallbacks::default();
        let c = config(
            &[
                "--consul-addr",
                "https://c:8501",
                "--consul-fallback-addr",
                "s1:8501",
            ],
            &fb,
        )
        .unwrap();
        assert_eq!(c.consul_fallbacks, ["https://s1:8501"]);
        let err = config(
            &[
                "--consul-addr",
                "https://c:8501",
                "--consul-fallback-addr",
                "http://s1:8500",
            ],
            &fb,
        )
        .unwrap_err();
        assert_eq!(err.option, "--consul-fallback-addr");
        assert!(err.reason.contains("leave TLS"), "{err}");
        // The servers' HTTPS API behind a local agent over plain HTTP.
        let c = config(&["--consul-fallback-addr", "https://s1:8501,s2:8500"], &fb).unwrap();
        assert_eq!(c.consul_fallbacks, ["https://s1:8501", "http://s2:8500"]);
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
            (vec!["--consul-addr", "ftp://consul:8501"], "--consul-addr"),
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
            (vec!["--max-stale", "10ms"], "--max-stale"),
            (vec!["--max-stale", "11m"], "--max-stale"),
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
