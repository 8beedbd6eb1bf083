//! Every command-line option, in one place: the clap structs of the daemon
//! and of the `state` subcommand (the writer CLI), each also read from its
//! `GITLAB_HAPROXY_AGENT_*` environment variable. The daemon's
//! [`crate::agent::config`] and the Consul options' [`crate::consul::config`]
//! read these and validate them; nothing here does I/O.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Default of `--haproxy-pid-file`: `/run/haproxy.pid`, the `-p` of the
/// haproxy.service that Debian, Ubuntu and Red Hat ship. In master-worker
/// mode (`-W`, `-Ws`) it holds the master's PID (HAProxy
/// doc/management.txt, "-p").
pub const DEFAULT_HAPROXY_PID_FILE: &str = "/run/haproxy.pid";

pub mod defaults;
pub mod help;
pub mod state;
mod values;

pub use help::EXIT_CODES_HELP;
pub use state::{
    CanaryAction, ConfirmArgs, IdleArgs, RampArgs, RampSteps, Selector, StateArgs, StateCommand,
    StatusArgs, WriteOpts, DEFAULT_PROMETHEUS_SELECTOR, GLOBAL_OPTIONS,
};
pub use values::parse_duration;

/// Default KV prefix.
pub const DEFAULT_PREFIX: &str = "gitlab-haproxy-agent/state/";

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
    State(Box<StateArgs>),
    /// Exit 0 when the local agent is ready and answering, 69 when not: for
    /// HAProxy's ExecReload (the cookbook's drop-in), so that a reload,
    /// which starts every server READY, is refused while no agent would put
    /// the drained ones back.
    ///
    /// Answering: `/-/answering` on the agent's HTTP port answers 200 (the
    /// agent answers from Consul, or from its state file while Consul has
    /// not answered since it started: what it serves through an outage),
    /// and the agent-check port answers the line `check-ready` (answered
    /// like a group, but no row: never on `/status`, in the group names or
    /// the answered index; from the state file it reads the line and
    /// withholds the ready). A regular
    /// file at --override-file younger than --override-max-age lets the
    /// reload through anyway (exit 0, with a warning), for the day the agent
    /// itself is what is broken.
    CheckReady(CheckReadyArgs),
}

/// Default override file of `check-ready` (under /run: gone at reboot).
pub const DEFAULT_RELOAD_OVERRIDE: &str = "/run/gitlab-haproxy-agent-allow-haproxy-reload";

/// Options of `check-ready`.
#[derive(Debug, Args, Clone)]
pub struct CheckReadyArgs {
    /// The agent-check address to ask [default: --listen, i.e.
    /// $GITLAB_HAPROXY_AGENT_LISTEN, else 127.0.0.1:9777]; an unspecified
    /// address (0.0.0.0, ::) is asked on loopback.
    #[arg(long, value_name = "IP:PORT")]
    pub agent_addr: Option<SocketAddr>,
    /// The agent's HTTP address [default: --http-listen, i.e.
    /// $GITLAB_HAPROXY_AGENT_HTTP_LISTEN, else 0.0.0.0:9778; an unspecified
    /// address is asked on loopback].
    #[arg(long, value_name = "IP:PORT")]
    pub http_addr: Option<SocketAddr>,
    /// Time each of the two questions may take.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// A regular file whose presence lets the reload through while the agent
    /// is not answering (`touch` it, reload, remove it).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_RELOAD_OVERRIDE)]
    pub override_file: PathBuf,
    /// An override file older than this (by its modification time) is
    /// ignored, so one left behind does not disarm the check for good; so is
    /// one dated in the future, whose age cannot be told.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub override_max_age: Duration,
}

/// How to reach Consul; shared by the daemon and the writer (global, so they
/// are also accepted after `state ...`).
#[derive(Debug, Args, Clone)]
pub struct ConsulArgs {
    /// Local Consul agent HTTP address, http:// or https:// [default:
    /// $CONSUL_HTTP_ADDR, else http://127.0.0.1:8500; without a scheme
    /// https:// when $CONSUL_HTTP_SSL is true].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_ADDR",
        value_name = "URL",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_addr: Option<String>,

    /// File holding the Consul ACL token, sent as X-Consul-Token and re-read
    /// on 403 (by the daemon also on SIGHUP) [default: $CREDENTIALS_DIRECTORY/consul-token if it
    /// exists, else no token].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_TOKEN_FILE",
        value_name = "PATH",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_token_file: Option<PathBuf>,

    /// PEM file of the CA certificates that sign Consul's HTTPS
    /// certificate, for https:// addresses; replaces the system's roots
    /// [default: $CONSUL_CACERT, else the system's roots].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_CA_FILE",
        value_name = "PATH",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_ca_file: Option<PathBuf>,

    /// PEM client certificate, for a Consul that verifies clients
    /// (verify_incoming); needs --consul-client-key [default:
    /// $CONSUL_CLIENT_CERT, else none].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_CERT",
        value_name = "PATH",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_client_cert: Option<PathBuf>,

    /// PEM private key of --consul-client-cert [default: $CONSUL_CLIENT_KEY,
    /// else none].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_KEY",
        value_name = "PATH",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_client_key: Option<PathBuf>,

    /// Name Consul's HTTPS certificate is checked against instead of each
    /// address's host, e.g. server.dc1.consul [default:
    /// $CONSUL_TLS_SERVER_NAME, else the host].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_TLS_SERVER_NAME",
        value_name = "NAME",
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_tls_server_name: Option<String>,

    /// Verify Consul's HTTPS certificate; false takes any certificate
    /// [default: $CONSUL_HTTP_SSL_VERIFY, else true].
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL_VERIFY",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = GLOBAL_OPTIONS
    )]
    pub consul_http_ssl_verify: Option<bool>,

    /// KV prefix holding desired state (always treated as ending in `/`).
    #[arg(
        long,
        global = true,
        env = "GITLAB_HAPROXY_AGENT_PREFIX",
        default_value = DEFAULT_PREFIX,
        help_heading = GLOBAL_OPTIONS
    )]
    pub prefix: String,
}

/// Lines queued for the log sink by default (`--log-buffer-lines`): 10,000,
/// a few MB of memory at most and minutes of the agent's busiest logging;
/// beyond it, while the sink does not read, lines are dropped and counted.
pub const DEFAULT_LOG_BUFFER_LINES: u64 = 10_000;

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

/// Consistency mode of the watcher's reads (`--consistency`; Consul's
/// api-docs/features/consistency). How stale answers are held is in
/// [`crate::agent::consistency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Consistency {
    /// Consul's default: the leader answers every read. Strongly ordered;
    /// the leader carries every agent's blocking query.
    #[default]
    Default,
    /// `?stale`: any server answers; an answer is held unless fresh and not
    /// behind the copy.
    Stale,
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
    /// keeps retrying with its backoff (250 ms doubling to 10 s); ready at
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

    /// HTTP listener for /metrics, /-/healthy, /-/ready and /-/answering:
    /// every IPv4 address by default, so the fleet's Prometheus can scrape
    /// it (`[::]:9778` adds IPv6). /status and /debug/pprof/ are served on
    /// it to clients at 127.0.0.1 and ::1 only (see --http-remote-debug).
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_HTTP_LISTEN",
        default_value = "0.0.0.0:9778"
    )]
    pub http_listen: SocketAddr,

    /// Serve /status and /debug/pprof/ to every client (`true`/`false` in
    /// the environment). Without it they answer 403 to every address but
    /// 127.0.0.1 and ::1, the rest of 127.0.0.0/8 included (Istio's sidecar
    /// hands connections on from 127.0.0.6): /status lists every key and
    /// the servers HAProxy asks about, and a profile costs CPU.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_HTTP_REMOTE_DEBUG")]
    pub http_remote_debug: bool,

    /// Blocking-query wait sent to Consul (1s to 10m; Consul adds up to
    /// 1/16 of jitter).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub wait: Duration,

    /// How long to retry the first Consul read before --on-startup-timeout
    /// applies.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_STARTUP_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub startup_timeout: Duration,

    /// What to do when the first Consul read has not succeeded within
    /// --startup-timeout: `exit` 1 (the service manager restarts the agent),
    /// or `retry` (stay up and unready, answer nobody, keep retrying with
    /// backoff; for a Kubernetes sidecar). An agent that started from its
    /// state file keeps answering from it and retries, whatever this says.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_ON_STARTUP_TIMEOUT", value_enum, default_value_t = OnStartupTimeout::Exit)]
    pub on_startup_timeout: OnStartupTimeout,

    /// Time an agent-check client has to send its line (10ms to 2s; keep it
    /// well under agent-inter).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_CHECK_TIMEOUT", default_value = "500ms", value_parser = parse_duration)]
    pub check_timeout: Duration,

    /// Agent-check connections waiting for their line at once; a check whose
    /// line is there at accept needs no slot and is answered even at the cap;
    /// at the cap, the connection that has waited longest for its line is
    /// closed unanswered to make room for a new one.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_connections: usize,

    /// Least time between two Consul requests (rate limit under churn),
    /// 10ms..10s.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_MIN_QUERY_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub min_query_interval: Duration,

    /// Read consistency of the blocking query: `default` (the Consul leader
    /// answers every read) or `stale` (any server answers; answers that are
    /// behind the copy, older than --max-stale or from a server without a
    /// leader are confirmed by a default read first).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_CONSISTENCY", value_enum, default_value_t = Consistency::Default)]
    pub consistency: Consistency,

    /// With --consistency stale: the largest X-Consul-LastContact an answer
    /// may carry to be applied without a default read (100ms to 10m).
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_MAX_STALE", default_value = "5s", value_parser = parse_duration)]
    pub max_stale: Duration,

    /// While a blocking query is parked, how often to check the prefix's
    /// index with a small stale read (`?keys&separator=/&stale`): a query
    /// parked on a Consul server cut off from the quorum, or held across a
    /// snapshot restore, answers nothing until --wait ends, and the check
    /// re-issues it (from index 0 when the index went below it; a re-issued
    /// query still unanswered 3 checks later is replaced by a full read).
    /// 500ms..60s, or 0 to turn the checks off.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_INDEX_CHECK", default_value = "2s", value_parser = parse_duration)]
    pub index_check: Duration,

    /// Other ways into the same Consul datacenter (another client agent, or
    /// the servers' HTTP addresses), repeatable or comma-separated, tried in
    /// order: reads move to one while an index check through --consul-addr
    /// cannot confirm the state served (its server cut off from the
    /// quorum, no leader) or a request through it fails, and go back once
    /// it answers fresh again. Default: found from Consul (the servers of
    /// /v1/status/peers on --consul-fallback-port, read again every
    /// --consul-fallback-refresh); a list given here replaces them, `none`
    /// turns fallbacks off. Same token and TLS options; without a scheme,
    /// --consul-addr's (no http:// when it is https://).
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub consul_fallback_addr: Vec<String>,

    /// The HTTP port of the Consul servers found as fallbacks (Consul does
    /// not publish it). Default: the port of --consul-addr. Not used with a
    /// --consul-fallback-addr list.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_PORT",
        value_name = "PORT",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub consul_fallback_port: Option<u16>,

    /// How often the Consul servers found as fallbacks are read again
    /// (/v1/status/peers), 1s..10m; after a read that failed, 5 s. Not used
    /// with a --consul-fallback-addr list.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_REFRESH", default_value = "30s", value_parser = parse_duration)]
    pub consul_fallback_refresh: Duration,

    /// The Consul datacenter the agent reads (`Config.Datacenter` of
    /// --consul-addr's /v1/agent/self), against which every
    /// --consul-fallback-addr is proven before reads go through it. Default:
    /// learned from --consul-addr when it answers; set it so a fallback can
    /// be proven while --consul-addr is down at start-up.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_CONSUL_DATACENTER",
        value_name = "NAME"
    )]
    pub consul_datacenter: Option<String>,

    /// Folder of the state file (served-state.json): the state served, holds
    /// included, written on every change and read at start, so a restart
    /// answers what the agent answered before. Default: systemd's
    /// $STATE_DIRECTORY (StateDirectory= in the unit) when set; without
    /// either nothing survives a restart.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,

    /// Folder of the runtime copy of the state file (served-state.json),
    /// written before each new state is served, so that an agent restarted
    /// while the state folder's disk stalls starts from the newest state;
    /// a tmpfs that survives restarts but not reboots. Default: systemd's
    /// $RUNTIME_DIRECTORY (RuntimeDirectory= in the unit) when set; without
    /// either there is no runtime copy.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_RUNTIME_DIR", value_name = "DIR")]
    pub runtime_dir: Option<std::path::PathBuf>,

    /// HAProxy's PID file (its `-p`; in master-worker mode the master's
    /// PID): the agent counts the master's old workers, left by a reload
    /// with the sessions they hold, every second from /proc and exports
    /// gitlab_haproxy_agent_haproxy_old_workers (-1 when it cannot tell:
    /// no such file or master, or /proc hidden from the agent), which
    /// `state drain --until-idle` waits on. Needs no HAProxy socket.
    #[arg(
        long,
        env = "GITLAB_HAPROXY_AGENT_HAPROXY_PID_FILE",
        value_name = "FILE",
        default_value = DEFAULT_HAPROXY_PID_FILE
    )]
    pub haproxy_pid_file: std::path::PathBuf,

    /// Log format.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Log lines queued for a log sink (stderr, the journal) that is slow
    /// or not reading; past them lines are dropped and counted
    /// (gitlab_haproxy_agent_log_lines_dropped_total) rather than holding
    /// the agent back. 1..1000000.
    #[arg(long, env = "GITLAB_HAPROXY_AGENT_LOG_BUFFER_LINES", default_value_t = DEFAULT_LOG_BUFFER_LINES, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub log_buffer_lines: u64,
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

pub(crate) fn bad(
    option: &'static str,
    value: impl ToString,
    reason: impl ToString,
) -> ConfigError {
    ConfigError {
        option,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}
