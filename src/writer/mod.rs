//! The writer CLI, `gitlab-haproxy-agent state ...`: reads desired state from
//! Consul KV through the agent's own parser, writes only values that parser
//! accepts, always with compare-and-set, and runs drains in the order HAProxy
//! needs (drain, wait, maint; back through maint so slowstart ramps).

pub mod cli;
pub mod confirm;
pub mod haproxy;
pub mod output;
pub mod plan;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

pub use cli::{CanaryAction, Selector, StateArgs, StateCommand, WriteOpts};

use crate::config::{ConsulArgs, ConsulConfig, Fallbacks};
use crate::consul::{
    ConsulClient, ConsulError, KvPair, TokenSource, TxnOp, TxnOutcome, MAX_TXN_OPS,
};
use crate::responder::parse_line;
use crate::state::{
    parse_value, validate_identity, AdminState, Answer, Entry, InvalidValue, Snapshot,
};
use crate::watcher::build_snapshot;
use haproxy::{glob_match, Enrolment, Server, SourceError};
use output::table;
use plan::{
    currents, plan_drain, plan_undrain, show_raw, Change, Claim, Current, Plan, Step, WaitFor,
};

/// Exit statuses, from sysexits.h; documented in `state --help`
/// ([`cli::EXIT_CODES_HELP`]).
pub mod exit {
    /// Done, or nothing to do.
    pub const OK: u8 = 0;
    /// EX_USAGE: bad options or arguments.
    pub const USAGE: u8 = 64;
    /// EX_DATAERR: an invalid key or value; nothing written. Also a drain
    /// from `--haproxy-socket` whose servers HAProxy did not put in DRAIN
    /// (their row key is not the assumed `<backend>/<server>`): drain
    /// written, maint not; or did not put in MAINT after maint was written
    /// (something else decides them first).
    pub const DATAERR: u8 = 65;
    /// EX_NOINPUT: the HAProxy configuration or socket cannot be read.
    pub const NOINPUT: u8 = 66;
    /// EX_NOHOST: written, but not every agent (host) confirmed it within
    /// `--confirm-timeout`, or Prometheus could not be asked; `state
    /// status`: an agent lags.
    pub const NOT_CONFIRMED: u8 = 68;
    /// EX_UNAVAILABLE: Consul unreachable, timed out, or without a leader.
    pub const UNAVAILABLE: u8 = 69;
    /// EX_TEMPFAIL: compare-and-set conflict; nothing overwritten.
    pub const CONFLICT: u8 = 75;
    /// EX_PROTOCOL: Consul answered something unusable.
    pub const PROTOCOL: u8 = 76;
    /// EX_NOPERM: Consul refused the token, or it cannot be read.
    pub const NOPERM: u8 = 77;
    /// 128 + SIGHUP (the terminal or SSH session went away).
    pub const SIGHUP: u8 = 129;
    /// 128 + SIGINT.
    pub const SIGINT: u8 = 130;
    /// 128 + SIGTERM.
    pub const SIGTERM: u8 = 143;
}

/// The key of the canary group.
pub const CANARY_KEY: &str = "canary";

/// How long after the drain wait HAProxy may take to show the servers of a
/// drain from `--haproxy-socket` in DRAIN (several `agent-inter` of 2 s).
pub const DRAIN_CHECK_GRACE: Duration = Duration::from_secs(10);

/// How often the stats socket is read while waiting for DRAIN.
const DRAIN_CHECK_POLL: Duration = Duration::from_millis(250);

/// What a report from `--haproxy-socket` says about its row keys.
const ASSUMED_ROW_KEYS: &str = "row keys are assumed to be <backend>/<server>: the stats \
     socket does not show agent-send lines, so a server whose agent-send starts with another \
     key is not decided by the key written (AGENT ANSWERS is the answer for that key alone). \
     `drain` checks on this HAProxy that the servers went to DRAIN before it writes maint, \
     and to MAINT after";

/// The generic drain mark: Consul KV Flags 1. A row key written by `state
/// drain` carries [`drain_flags`] of its selection id, an odd value; any odd
/// value is a drain's mark, and 1 (selection id 0) is the mark every `state
/// undrain` releases, whatever its selection: `consul kv put -flags=1 KEY
/// maint` writes a key `state undrain` will release.
///
/// Even Flags mark a key set by hand, which both leave alone at drain, maint
/// or `0%`: 0 is what `consul kv put`, `state set` and `state canary
/// disable` write, and Consul's answer for a key written without Flags.
pub const DRAIN_FLAGS: u64 = 1;

/// The Consul KV Flags of a row key written by the drain (or undrain) whose
/// selection id is `id` (see [`selection_id`]): `1 | id << 1`. `state
/// undrain` with the same selection releases it; another selection's undrain
/// leaves it alone unless `--any-drain`.
pub fn drain_flags(id: u32) -> u64 {
    DRAIN_FLAGS | (u64::from(id) << 1)
}

/// Reads a drain mark from Consul KV Flags, the inverse of [`drain_flags`]:
/// the selection id for odd Flags (`Some(0)`: the generic mark, Flags 1),
/// `None` for even Flags (a key set by hand).
pub fn drain_mark(flags: u64) -> Option<u64> {
    (flags & DRAIN_FLAGS != 0).then_some(flags >> 1)
}

/// The stable id of a drain selection: FNV-1a (32 bits) of `zone=<Z>
/// backend=<B> server=<GLOB>`, absent parts empty. Where the servers are
/// read from (configuration or stats socket) is not part of it.
pub fn selection_id(zone: Option<&str>, backend: Option<&str>, server: Option<&str>) -> u32 {
    let text = format!(
        "zone={} backend={} server={}",
        zone.unwrap_or(""),
        backend.unwrap_or(""),
        server.unwrap_or("")
    );
    fnv1a_32(text.as_bytes())
}

/// FNV-1a, 32 bits, with its published offset basis and prime.
fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Why a command did not complete, with its exit status.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// A stable name for `--json`: `usage`, `invalid`, `no_input`,
    /// `unavailable`, `conflict`, `protocol`, `permission_denied`,
    /// `interrupted`, `not_drained`, `not_in_maint`.
    pub kind: &'static str,
    /// What happened, and what was and was not written.
    pub message: String,
    /// Already in the JSON report printed on stdout.
    reported: bool,
}

impl Failure {
    fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            kind,
            message: message.into(),
            reported: false,
        }
    }

    fn usage(message: impl Into<String>) -> Failure {
        Failure::new(exit::USAGE, "usage", message)
    }

    fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(exit::DATAERR, "invalid", message)
    }

    fn conflict(message: impl Into<String>) -> Failure {
        Failure::new(exit::CONFLICT, "conflict", message)
    }

    fn json(&self) -> Value {
        json!({"kind": self.kind, "message": self.message, "exit_code": self.code})
    }
}

impl From<ConsulError> for Failure {
    fn from(e: ConsulError) -> Failure {
        let (code, kind) = match &e {
            ConsulError::Connect { .. } | ConsulError::Timeout { .. } => {
                (exit::UNAVAILABLE, "unavailable")
            }
            ConsulError::Status { .. } if e.is_forbidden() => (exit::NOPERM, "permission_denied"),
            ConsulError::Status { status, .. } if status.is_server_error() => {
                (exit::UNAVAILABLE, "unavailable")
            }
            ConsulError::Status { .. } | ConsulError::Decode(_) => (exit::PROTOCOL, "protocol"),
            ConsulError::Token { .. } => (exit::NOPERM, "permission_denied"),
        };
        Failure::new(code, kind, e.to_string())
    }
}

impl From<SourceError> for Failure {
    fn from(e: SourceError) -> Failure {
        Failure::new(exit::NOINPUT, "no_input", e.to_string())
    }
}

/// Runs one `state` command and returns its exit status. Consul options are
/// resolved as for the daemon (same flags, environment and token file).
pub fn main(consul: &ConsulArgs, args: &StateArgs, fallbacks: &Fallbacks) -> ExitCode {
    let code = match consul.resolve(fallbacks) {
        Err(e) => report_failure(args.json, &Failure::usage(e.to_string())),
        Ok(config) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Err(e) => report_failure(
                args.json,
                &Failure::new(1, "runtime", format!("cannot start the runtime: {e}")),
            ),
            Ok(rt) => rt.block_on(run(config, args, fallbacks)),
        },
    };
    ExitCode::from(code)
}

/// Reports a usage error found before a `state` command could be parsed
/// (clap's, e.g. an unknown option): the message on stderr and, with
/// `json`, the same `{"ok": false, "error": {"kind": "usage", ...}}` object
/// on stdout as every other failure. Returns exit status 64 (EX_USAGE).
pub fn usage_error(json: bool, message: &str) -> ExitCode {
    ExitCode::from(report_failure(json, &Failure::usage(message)))
}

fn report_failure(json: bool, failure: &Failure) -> u8 {
    err_line(&format!("gitlab-haproxy-agent state: {}", failure.message));
    if json && !failure.reported {
        out_line(&json!({"ok": false, "error": failure.json()}).to_string());
    }
    failure.code
}

/// Prints a line on stdout, ignoring write errors: after SIGHUP the terminal
/// may be gone, and the exit status must still say what happened (`println!`
/// would panic instead).
fn out_line(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
    let _ = stdout.flush();
}

/// Like [`out_line`], on stderr.
fn err_line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// The writer's token: `--consul-token-file` (or its environment variable,
/// or the systemd credential), else `$CONSUL_HTTP_TOKEN_FILE`, else
/// `$CONSUL_HTTP_TOKEN`, as on a console node where `consul kv` works.
fn token_source(config: &ConsulConfig, fallbacks: &Fallbacks) -> Result<TokenSource, ConsulError> {
    if let Some(path) = config
        .token_file
        .clone()
        .or_else(|| fallbacks.consul_http_token_file.clone())
    {
        return Ok(TokenSource::new(Some(path)));
    }
    match &fallbacks.consul_http_token {
        Some(token) => TokenSource::from_value(token, "$CONSUL_HTTP_TOKEN"),
        None => Ok(TokenSource::new(None)),
    }
}

async fn run(config: ConsulConfig, args: &StateArgs, fallbacks: &Fallbacks) -> u8 {
    let token = match token_source(&config, fallbacks) {
        Ok(t) => t,
        Err(e) => return report_failure(args.json, &Failure::from(e)),
    };
    let client = match ConsulClient::new(&config.addr, token, Duration::from_secs(2)) {
        Ok(c) => c,
        Err(e) => {
            return report_failure(
                args.json,
                &Failure::new(1, "runtime", format!("cannot build the Consul client: {e}")),
            )
        }
    };
    let confirm = match confirm::of_command(&args.command) {
        Ok(c) => c,
        Err(f) => return report_failure(args.json, &f),
    };
    let writer = Writer {
        client,
        prefix: config.prefix,
        json: args.json,
        confirm,
    };
    let result = match &args.command {
        StateCommand::Get { key } => writer.get(key).await,
        StateCommand::List => writer.list().await,
        StateCommand::Set {
            key,
            value,
            cas,
            write,
        } => writer.set(key, value, *cas, write.dry_run).await,
        StateCommand::Clear { key, cas, write } => writer.clear(key, *cas, write.dry_run).await,
        StateCommand::Canary { action } => match action {
            CanaryAction::Disable { drain_wait, write } => {
                let target = Target::canary();
                writer
                    .sequence("canary disable", target, write.dry_run, |t| {
                        Ok(plan_drain(t, *drain_wait, Claim::Any))
                    })
                    .await
            }
            CanaryAction::Enable { maint_wait, write } => {
                let target = Target::canary();
                writer
                    .sequence("canary enable", target, write.dry_run, |t| {
                        plan_undrain(t, *maint_wait, Claim::Any).map_err(refused_invalid)
                    })
                    .await
            }
        },
        StateCommand::Drain {
            select,
            drain_wait,
            write,
        } => match Target::servers(select) {
            Err(f) => Err(f),
            Ok(target) => {
                let id = select.id();
                writer
                    .sequence("drain", target, write.dry_run, |t| {
                        Ok(plan_drain(
                            t,
                            *drain_wait,
                            Claim::Marked {
                                id,
                                any_drain: false,
                            },
                        ))
                    })
                    .await
            }
        },
        StateCommand::Undrain {
            select,
            maint_wait,
            any_drain,
            write,
        } => match Target::servers(select) {
            Err(f) => Err(f),
            Ok(target) => {
                let claim = Claim::Marked {
                    id: select.id(),
                    any_drain: *any_drain,
                };
                writer
                    .sequence("undrain", target, write.dry_run, |t| {
                        plan_undrain(t, *maint_wait, claim).map_err(refused_invalid)
                    })
                    .await
            }
        },
        StateCommand::Explain {
            identities,
            haproxy_config,
        } => writer.explain(identities, haproxy_config.as_deref()).await,
        StateCommand::Status(status) => writer.status(status).await,
    };
    match result {
        Ok(()) => exit::OK,
        Err(f) => report_failure(args.json, &f),
    }
}

fn refused_invalid(keys: Vec<(String, String)>) -> Failure {
    let list: Vec<String> = keys.iter().map(|(k, why)| format!("{k} ({why})")).collect();
    Failure::invalid(format!(
        "refusing to guess: {} an invalid value, so the servers it decides are frozen in an \
         unknown state; nothing written. Set a valid value first (`state set KEY maint`), then \
         re-run",
        if keys.len() == 1 {
            format!("{} holds", list[0])
        } else {
            format!("{} hold", list.join(", "))
        }
    ))
}

fn check_key(key: &str) -> Result<(), Failure> {
    validate_identity(key).map_err(|e| {
        Failure::invalid(format!(
            "invalid key {key:?}: {e} (keys are relative to the prefix: `canary`, \
             `web/web-01`); nothing written"
        ))
    })
}

/// A value for display: as stored when it is plain text, else quoted.
fn display_value(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(s) if !s.is_empty() && s.len() <= 40 && s.bytes().all(|b| b.is_ascii_graphic()) => {
            s.to_string()
        }
        _ => show_raw(raw),
    }
}

fn reply_text(state: AdminState) -> String {
    String::from_utf8_lossy(state.reply().as_bytes())
        .trim_end()
        .to_string()
}

/// What a sequence acts on.
struct Target {
    /// The keys, relative to the prefix.
    keys: Vec<String>,
    /// Enrolled servers selected (empty for a group key).
    servers: Vec<Server>,
    /// Servers that matched but the agent cannot drain.
    not_enrolled: Vec<(Server, String)>,
    /// Where the servers came from, for the report.
    source: Option<String>,
    /// The stats socket the servers were read from: their row keys are
    /// assumed to be `<backend>/<server>` (the socket shows no agent-send
    /// line), and `drain` checks there that HAProxy drained them.
    socket: Option<PathBuf>,
    /// The selection, in words.
    selection: String,
}

impl Target {
    fn canary() -> Target {
        Target {
            keys: vec![CANARY_KEY.to_string()],
            servers: Vec::new(),
            not_enrolled: Vec::new(),
            source: None,
            socket: None,
            selection: format!("key {CANARY_KEY}"),
        }
    }

    /// Checks the combination of selector options (64 when bad).
    fn check_selector(select: &Selector) -> Result<(), Failure> {
        let problem = if select.server.is_some() && select.backend.is_none() {
            Some("--server needs --backend (the glob matches server names within one backend)")
        } else if select.zone.is_none() && select.backend.is_none() {
            Some("which servers? Give --zone, --backend or both")
        } else if select.zone.is_some() && select.haproxy_socket.is_some() {
            Some(
                "--zone cannot be used with --haproxy-socket: the stats socket does not know \
                 zones; read them from --haproxy-config",
            )
        } else {
            None
        };
        match problem {
            Some(p) => Err(Failure::usage(format!("{p}; nothing written (see --help)"))),
            None => Ok(()),
        }
    }

    fn servers(select: &Selector) -> Result<Target, Failure> {
        Target::check_selector(select)?;
        if let Some(zone) = &select.zone {
            validate_identity(&format!("{}{zone}", haproxy::ZONE_GROUP_PREFIX))
                .map_err(|e| Failure::invalid(format!("invalid zone {zone:?}: {e}")))?;
        }
        let (all, source) = match &select.haproxy_socket {
            Some(socket) => (
                haproxy::servers_from_socket(socket)?,
                format!("stats socket {}", socket.display()),
            ),
            None => (
                haproxy::servers_from_config(&select.haproxy_config)?,
                select.haproxy_config.display().to_string(),
            ),
        };
        let mut target = Target::select(all, select, source);
        target.socket.clone_from(&select.haproxy_socket);
        Ok(target)
    }

    fn select(all: Vec<Server>, select: &Selector, source: String) -> Target {
        let mut servers = Vec::new();
        let mut not_enrolled = Vec::new();
        for server in all {
            if select
                .backend
                .as_ref()
                .is_some_and(|b| *b != server.backend)
            {
                continue;
            }
            if select
                .server
                .as_ref()
                .is_some_and(|g| !glob_match(g, &server.name))
            {
                continue;
            }
            let in_zone = match &select.zone {
                None => Some(true),
                Some(z) if server.zones.iter().any(|s| s == z) => Some(true),
                Some(_) if server.zones.is_empty() => None,
                Some(_) => Some(false),
            };
            match (&server.enrolment, in_zone) {
                (_, Some(false)) => {}
                (Enrolment::Enrolled { .. }, Some(true)) => servers.push(server),
                (Enrolment::Enrolled { .. }, None) => {}
                (Enrolment::NotEnrolled(why), Some(true)) => {
                    let why = why.to_string();
                    not_enrolled.push((server, why));
                }
                (Enrolment::NotEnrolled(why), None) => {
                    let why = format!("{why}; zone unknown (no zone- group)");
                    not_enrolled.push((server, why));
                }
            }
        }
        let mut keys: Vec<String> = servers
            .iter()
            .filter_map(|s| s.row_key().map(str::to_string))
            .collect();
        keys.sort();
        keys.dedup();
        Target {
            keys,
            servers,
            not_enrolled,
            source: Some(source),
            socket: None,
            selection: Target::describe_selection(select),
        }
    }

    /// The servers whose row key is one of `keys`.
    fn servers_of(&self, keys: &[String]) -> Vec<&Server> {
        self.servers
            .iter()
            .filter(|s| s.row_key().is_some_and(|k| keys.iter().any(|w| w == k)))
            .collect()
    }

    fn describe_selection(select: &Selector) -> String {
        let mut parts = Vec::new();
        if let Some(z) = &select.zone {
            parts.push(format!("zone {z}"));
        }
        if let Some(b) = &select.backend {
            parts.push(format!("backend {b}"));
        }
        if let Some(g) = &select.server {
            parts.push(format!("servers {g}"));
        }
        parts.join(", ")
    }
}

/// Stops sequences between steps on SIGINT, SIGTERM or SIGHUP.
struct Interrupt {
    token: CancellationToken,
    signal: Arc<Mutex<Option<(&'static str, u8)>>>,
}

impl Interrupt {
    fn install() -> std::io::Result<Interrupt> {
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let token = CancellationToken::new();
        let which = Arc::new(Mutex::new(None));
        let (t, w) = (token.clone(), which.clone());
        tokio::spawn(async move {
            let got = tokio::select! {
                _ = int.recv() => ("SIGINT", exit::SIGINT),
                _ = term.recv() => ("SIGTERM", exit::SIGTERM),
                _ = hup.recv() => ("SIGHUP", exit::SIGHUP),
            };
            *w.lock().unwrap() = Some(got);
            t.cancel();
        });
        Ok(Interrupt {
            token,
            signal: which,
        })
    }

    fn fired(&self) -> Option<(&'static str, u8)> {
        if self.token.is_cancelled() {
            *self.signal.lock().unwrap()
        } else {
            None
        }
    }

    /// Sleeps `d`; `false` when a signal came first.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.token.cancelled() => false,
        }
    }
}

/// Where one step of a sequence got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepStatus {
    Planned,
    Done,
    Partial,
    Failed,
    Interrupted,
    NotRun,
}

impl StepStatus {
    fn as_str(self) -> &'static str {
        match self {
            StepStatus::Planned => "planned",
            StepStatus::Done => "done",
            StepStatus::Partial => "partial",
            StepStatus::Failed => "failed",
            StepStatus::Interrupted => "interrupted",
            StepStatus::NotRun => "not_run",
        }
    }
}

struct Writer {
    client: ConsulClient,
    prefix: String,
    json: bool,
    /// Set when write steps are to be confirmed through Prometheus.
    confirm: Option<confirm::ConfirmArgs>,
}

impl Writer {
    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn print_json(&self, value: Value) {
        out_line(&serde_json::to_string_pretty(&value).unwrap_or_default());
    }

    async fn get(&self, key: &str) -> Result<(), Failure> {
        check_key(key)?;
        let pair = self.client.get_key(&self.full(key)).await?;
        if self.json {
            let mut v = key_json(key, pair.as_ref());
            v["ok"] = json!(true);
            self.print_json(v);
            return Ok(());
        }
        match &pair {
            None => println!(
                "{key}: no key (the servers it selects fall back to their next key, or ready 100%)"
            ),
            Some(p) => print!("{}", key_table(&[(key.to_string(), p)])),
        }
        Ok(())
    }

    async fn list(&self) -> Result<(), Failure> {
        let answer = self
            .client
            .list_prefix(&self.prefix, 0, Duration::ZERO)
            .await?;
        let snapshot = build_snapshot(&self.prefix, &answer);
        let mut rows: Vec<(String, &KvPair)> = answer
            .pairs
            .iter()
            .filter_map(|p| {
                let rel = p.key.strip_prefix(&self.prefix)?;
                snapshot
                    .keys
                    .contains_key(rel)
                    .then(|| (rel.to_string(), p))
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let invalid = snapshot.invalid_count();
        if self.json {
            self.print_json(json!({
                "ok": true,
                "prefix": self.prefix,
                "consul_index": answer.index,
                "keys": rows.iter().map(|(k, p)| entry_json(k, p, &snapshot)).collect::<Vec<_>>(),
                "invalid": invalid,
            }));
            return Ok(());
        }
        if rows.is_empty() {
            println!(
                "no keys below {}: every server is ready 100% (a token that may not read the \
                 prefix sees no keys either). Consul index {}.",
                self.prefix, answer.index
            );
            return Ok(());
        }
        print!("{}", key_table_snapshot(&rows, &snapshot));
        println!(
            "{} key{}, {invalid} invalid{}. Consul index {}.",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" },
            if invalid > 0 {
                " (the servers an invalid key decides get no answer and keep their state)"
            } else {
                ""
            },
            answer.index
        );
        Ok(())
    }

    async fn set(
        &self,
        key: &str,
        value: &str,
        cas: Option<u64>,
        dry_run: bool,
    ) -> Result<(), Failure> {
        check_key(key)?;
        let state = parse_value(value.as_bytes()).map_err(|e| {
            Failure::invalid(format!(
                "refusing {value:?} for {key}: {e}; nothing written"
            ))
        })?;
        self.write_one(key, Change::Set(state), cas, dry_run).await
    }

    async fn clear(&self, key: &str, cas: Option<u64>, dry_run: bool) -> Result<(), Failure> {
        check_key(key)?;
        self.write_one(key, Change::Clear, cas, dry_run).await
    }

    async fn write_one(
        &self,
        key: &str,
        change: Change,
        cas: Option<u64>,
        dry_run: bool,
    ) -> Result<(), Failure> {
        let full = self.full(key);
        let pair = self.client.get_key(&full).await?;
        let before = Current::from_pair(pair.as_ref());
        if let Some(expected) = cas {
            if before.index() != expected {
                return Err(Failure::conflict(format!(
                    "{key} is {} at ModifyIndex {}, not at {expected} as --cas expects; not \
                     overwritten",
                    before.describe(),
                    before.index()
                )));
            }
        }
        let unchanged = match (&before, change) {
            (Current::Absent, Change::Clear) => true,
            // The same value written by `state drain` is written again with
            // Flags 0: the key becomes one set by hand, which `state
            // undrain` leaves alone.
            (Current::Valid { state, .. }, Change::Set(s)) => *state == s && !before.by_drain(),
            _ => false,
        };
        let after = match change {
            Change::Set(s) => s.to_string(),
            Change::Clear => "absent".to_string(),
        };
        let note = slowstart_note(&before, change).or_else(|| takeover_note(&before, change));
        let status = if unchanged {
            "unchanged"
        } else if dry_run {
            "dry run: not written"
        } else {
            let written = match change {
                Change::Set(s) => {
                    self.client
                        .put_cas(&full, s.to_string().as_bytes(), before.index())
                        .await?
                }
                Change::Clear => self.client.delete_cas(&full, before.index()).await?,
            };
            if !written {
                let now = self.client.get_key(&full).await?;
                let now = Current::from_pair(now.as_ref());
                return Err(Failure::conflict(format!(
                    "{key} changed since it was read (was {} at ModifyIndex {}, now {} at \
                     ModifyIndex {}); not overwritten. Look with `state get {key}` and re-run",
                    before.describe(),
                    before.index(),
                    now.describe(),
                    now.index()
                )));
            }
            "written"
        };
        if let (Some(n), false) = (note, unchanged) {
            eprintln!("note: {n}");
        }
        // An unchanged key is confirmed too: re-running a command whose
        // write was not confirmed confirms it.
        let unconfirmed = if !dry_run {
            self.confirm_one(key, &full, change).await
        } else {
            None
        };
        if self.json {
            self.print_json(json!({
                "ok": unconfirmed.is_none(),
                "error": unconfirmed.as_ref().map(Failure::json),
                "key": key,
                "before": before.describe(),
                "after": after,
                "modify_index_before": before.index(),
                "flags_before": before.flags(),
                "by_drain_before": before.by_drain(),
                "written": status == "written",
                "dry_run": dry_run,
                "note": if unchanged { None } else { note },
            }));
        } else {
            print!(
                "{}",
                table(
                    &["KEY", "BEFORE", "AFTER", "STATUS"],
                    &[vec![
                        key.to_string(),
                        before.describe(),
                        after,
                        status.to_string()
                    ]]
                )
            );
        }
        match unconfirmed {
            None => Ok(()),
            Some(mut f) => {
                f.reported = self.json;
                Err(f)
            }
        }
    }

    /// Reads the keys, plans, and (unless `dry_run`) writes the plan's steps,
    /// stopping at the first conflict, error or signal. Prints a report of
    /// where every key is now, in every case.
    async fn sequence(
        &self,
        action: &'static str,
        target: Target,
        dry_run: bool,
        make_plan: impl FnOnce(Vec<(String, Current)>) -> Result<Plan, Failure>,
    ) -> Result<(), Failure> {
        if target.keys.is_empty() {
            let mut message = format!(
                "no enrolled server matches {} in {}; nothing written",
                target.selection,
                target.source.as_deref().unwrap_or("the configuration")
            );
            if !target.not_enrolled.is_empty() {
                message.push_str(&format!(
                    " (not enrolled, so not counted: {} server{}: {})",
                    target.not_enrolled.len(),
                    if target.not_enrolled.len() == 1 {
                        ""
                    } else {
                        "s"
                    },
                    target
                        .not_enrolled
                        .iter()
                        .map(|(s, why)| format!("{} {why}", s.id()))
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            return Err(Failure::invalid(message));
        }
        let answer = self
            .client
            .list_prefix(&self.prefix, 0, Duration::ZERO)
            .await?;
        let snapshot = build_snapshot(&self.prefix, &answer);
        let plan = make_plan(currents(&self.prefix, &answer.pairs, &target.keys))?;
        if target.socket.is_some() {
            err_line(&format!("note: {ASSUMED_ROW_KEYS}"));
        }
        let mut run = Run::new(&plan, answer.index);
        let mut failure = None;
        if dry_run {
            run.statuses
                .iter_mut()
                .for_each(|s| *s = StepStatus::Planned);
        } else if !plan.steps.is_empty() {
            let stop = self.execute(action, &plan, &target, &mut run).await.err();
            // Report what Consul holds now, not only what was written: after
            // a conflict another writer's value is the truth.
            if let Ok(after) = self
                .client
                .list_prefix(&self.prefix, 0, Duration::ZERO)
                .await
            {
                run.observed = Some((
                    currents(&self.prefix, &after.pairs, &target.keys)
                        .into_iter()
                        .collect(),
                    build_snapshot(&self.prefix, &after),
                ));
            }
            // The message is written after that read, so that it says what
            // the keys hold now, as the report's table does.
            failure = stop.map(|stop| run.stopped(&plan, stop));
        }
        let report = Report {
            action,
            dry_run,
            plan: &plan,
            run: &run,
            target: &target,
            snapshot: &snapshot,
            failure: failure.as_ref(),
        };
        if self.json {
            self.print_json(report.json());
        } else {
            out_line(report.text().trim_end_matches('\n'));
        }
        match failure {
            None => Ok(()),
            Some(mut f) => {
                f.reported = true;
                Err(f)
            }
        }
    }

    async fn execute(
        &self,
        action: &str,
        plan: &Plan,
        target: &Target,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let interrupt = Interrupt::install().map_err(|e| {
            Stop::Setup(Failure::new(
                1,
                "runtime",
                format!("cannot watch signals: {e}; nothing written"),
            ))
        })?;
        for (i, step) in plan.steps.iter().enumerate() {
            if let Some((name, code)) = interrupt.fired() {
                return Err(Stop::Signal {
                    step: i,
                    name,
                    code,
                });
            }
            match step {
                Step::Wait { duration, purpose } => {
                    let what = match purpose {
                        WaitFor::Drain => {
                            "for sessions to finish before maint. Ctrl-C now \
                                           leaves drain in place and does not write maint"
                        }
                        WaitFor::Maint => {
                            "so every HAProxy applies maint before the key is \
                                           cleared. Ctrl-C now leaves maint in place"
                        }
                    };
                    err_line(&format!(
                        "{action}: waiting {} {what}",
                        humantime::format_duration(*duration)
                    ));
                    if !interrupt.sleep(*duration).await {
                        let (name, code) = interrupt.fired().unwrap_or(("SIGINT", exit::SIGINT));
                        run.statuses[i] = StepStatus::Interrupted;
                        return Err(Stop::Signal {
                            step: i,
                            name,
                            code,
                        });
                    }
                    run.statuses[i] = StepStatus::Done;
                    if let (WaitFor::Drain, Some(socket), Some(Step::Write { keys, .. })) =
                        (purpose, &target.socket, plan.steps.get(i + 1))
                    {
                        let servers = target.servers_of(keys);
                        self.check_admin(action, socket, &servers, Want::Drain, &interrupt, run)
                            .await
                            .map_err(|stop| stop.at(i + 1))?;
                    }
                }
                Step::Write {
                    change,
                    flags,
                    keys,
                } => {
                    let chunks = keys.chunks(MAX_TXN_OPS).count();
                    for (n, chunk) in keys.chunks(MAX_TXN_OPS).enumerate() {
                        if n > 0 {
                            if let Some((name, code)) = interrupt.fired() {
                                run.statuses[i] = StepStatus::Partial;
                                return Err(Stop::Signal {
                                    step: i,
                                    name,
                                    code,
                                });
                            }
                        }
                        if let Err(failure) = self.write_chunk(*change, *flags, chunk, run).await {
                            run.statuses[i] = if n == 0 {
                                StepStatus::Failed
                            } else {
                                StepStatus::Partial
                            };
                            return Err(Stop::Failed { step: i, failure });
                        }
                    }
                    run.statuses[i] = StepStatus::Done;
                    err_line(&format!(
                        "{action}: {} written to {} key{} ({chunks} transaction{})",
                        change.describe(),
                        keys.len(),
                        if keys.len() == 1 { "" } else { "s" },
                        if chunks == 1 { "" } else { "s" },
                    ));
                    match self
                        .confirm_written(action, *change, keys, &run.indexes, &interrupt.token)
                        .await
                    {
                        Ok(()) => {}
                        Err(confirm::Unconfirmed::Failed(failure)) => {
                            return Err(Stop::Failed { step: i, failure })
                        }
                        Err(confirm::Unconfirmed::Interrupted) => {
                            let (name, code) =
                                interrupt.fired().unwrap_or(("SIGINT", exit::SIGINT));
                            return Err(Stop::Signal {
                                step: i,
                                name,
                                code,
                            });
                        }
                    }
                    let after_drain_wait = i > 0
                        && matches!(
                            plan.steps[i - 1],
                            Step::Wait {
                                purpose: WaitFor::Drain,
                                ..
                            }
                        );
                    if let (Change::Set(AdminState::Maint), true, Some(socket)) =
                        (change, after_drain_wait, &target.socket)
                    {
                        let servers = target.servers_of(keys);
                        self.check_admin(action, socket, &servers, Want::Maint, &interrupt, run)
                            .await
                            .map_err(|stop| stop.at(i))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// With servers from the stats socket, reads `show servers state` there
    /// again until every server in `servers` is in the state `want`, for at
    /// most [`DRAIN_CHECK_GRACE`]:
    ///
    /// - [`Want::Drain`], after the drain wait: a server HAProxy does not
    ///   drain is one whose agent-send line does not start with the assumed
    ///   row key; the sequence stops before maint (exit 65, `not_drained`).
    /// - [`Want::Maint`], after maint was written: a server HAProxy does not
    ///   put in MAINT is decided by something else first (a group key earlier
    ///   on its agent-send line, e.g. `canary` = drain, which also fooled the
    ///   DRAIN check); exit 65, `not_in_maint`.
    async fn check_admin(
        &self,
        action: &str,
        socket: &Path,
        servers: &[&Server],
        want: Want,
        interrupt: &Interrupt,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let failed = |failure: Failure| Stop::Failed { step: 0, failure };
        let deadline = tokio::time::Instant::now() + DRAIN_CHECK_GRACE;
        loop {
            let reached =
                haproxy::with_admin_flag_from_socket(socket, want.flag()).map_err(|e| {
                    let mut f = Failure::from(e);
                    f.message = format!("{}; {}", f.message, want.unchecked());
                    failed(f)
                })?;
            let missing: Vec<String> = servers
                .iter()
                .map(|s| s.id())
                .filter(|id| reached.get(id) != Some(&true))
                .collect();
            if missing.is_empty() {
                err_line(&format!(
                    "{action}: HAProxy at {} shows {} server{} in {}",
                    socket.display(),
                    servers.len(),
                    if servers.len() == 1 { "" } else { "s" },
                    want.name(),
                ));
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let n = missing.len();
                let head = format!(
                    "{} {} not in {} on HAProxy at {} {} after {}: {}.",
                    n,
                    if n == 1 { "server is" } else { "servers are" },
                    want.name(),
                    socket.display(),
                    humantime::format_duration(DRAIN_CHECK_GRACE),
                    match want {
                        Want::Drain => "the drain wait",
                        Want::Maint => "maint was written",
                    },
                    missing.join(", "),
                );
                let its = if n == 1 { "Its" } else { "Their" };
                let (kind, message) = match want {
                    Want::Drain => {
                        run.not_drained.clone_from(&missing);
                        (
                            "not_drained",
                            format!(
                                "not drained by the agent: {head} {its} agent-send probably \
                                 does not start with <backend>/<server>, the row key assumed \
                                 with --haproxy-socket, so the key written does not decide; \
                                 maint is not written. Find the row key on the server's \
                                 agent-send line in the HAProxy configuration (drain with \
                                 --haproxy-config), and take the drain back with `state \
                                 undrain` and the same selection"
                            ),
                        )
                    }
                    Want::Maint => {
                        run.not_in_maint.clone_from(&missing);
                        (
                            "not_in_maint",
                            format!(
                                "not in maint: {head} maint is written to {} row key, but \
                                 something else decides first: {} agent-send probably starts \
                                 with another key (a group key such as `canary` at drain), \
                                 or the server was set from the HAProxy CLI. Find what \
                                 decides with `state explain` and the server's agent-send \
                                 line (--haproxy-config), and take it out that way",
                                if n == 1 { "its" } else { "their" },
                                its.to_lowercase(),
                            ),
                        )
                    }
                };
                return Err(failed(Failure::new(exit::DATAERR, kind, message)));
            }
            if !interrupt.sleep(DRAIN_CHECK_POLL).await {
                let (name, code) = interrupt.fired().unwrap_or(("SIGINT", exit::SIGINT));
                return Err(Stop::Signal {
                    step: 0,
                    name,
                    code,
                });
            }
        }
    }

    /// One transaction: every key in `chunk` gets `change` (a value with
    /// Consul Flags `flags`), each only if its ModifyIndex is the one last
    /// seen.
    async fn write_chunk(
        &self,
        change: Change,
        flags: u64,
        chunk: &[String],
        run: &mut Run,
    ) -> Result<(), Failure> {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|k| {
                let index = run.indexes.get(k).copied().unwrap_or(0);
                match change {
                    Change::Set(s) => TxnOp::Cas {
                        key: self.full(k),
                        value: s.to_string().into_bytes(),
                        flags,
                        index,
                    },
                    Change::Clear => TxnOp::DeleteCas {
                        key: self.full(k),
                        index,
                    },
                }
            })
            .collect();
        match self.client.txn(&ops).await? {
            TxnOutcome::Committed(results) => {
                for k in chunk {
                    match change {
                        Change::Set(s) => {
                            run.now.insert(k.clone(), Some(s));
                        }
                        Change::Clear => {
                            run.now.insert(k.clone(), None);
                            run.indexes.insert(k.clone(), 0);
                        }
                    }
                }
                for pair in results {
                    if let Some(rel) = pair.key.strip_prefix(&self.prefix) {
                        run.indexes.insert(rel.to_string(), pair.modify_index);
                    }
                }
                Ok(())
            }
            TxnOutcome::RolledBack(errors) => {
                if let Some(e) = errors.iter().find(|e| e.is_permission_denied()) {
                    return Err(Failure::new(
                        exit::NOPERM,
                        "permission_denied",
                        format!(
                            "Consul refused the write: {}; nothing in this transaction was \
                             written",
                            e.what
                        ),
                    ));
                }
                let mut lines = Vec::new();
                for e in &errors {
                    let Some(key) = chunk.get(e.op_index) else {
                        lines.push(e.what.clone());
                        continue;
                    };
                    let expected = run.indexes.get(key).copied().unwrap_or(0);
                    let now = match self.client.get_key(&self.full(key)).await {
                        Ok(p) => {
                            let c = Current::from_pair(p.as_ref());
                            format!("now {} at ModifyIndex {}", c.describe(), c.index())
                        }
                        Err(_) => "now unknown".to_string(),
                    };
                    lines.push(format!(
                        "{key} changed since this run last read or wrote it (expected \
                         ModifyIndex {expected}, {now})"
                    ));
                }
                Err(Failure::conflict(format!(
                    "conflict: {}. Not overwritten; this transaction wrote nothing. Look with \
                     `state list`, then re-run",
                    lines.join("; ")
                )))
            }
        }
    }

    async fn explain(&self, identities: &[String], config: Option<&Path>) -> Result<(), Failure> {
        let mut line = identities.join(" ");
        if let Some(path) = config {
            if identities.len() == 1 && identities[0].contains('/') {
                let servers = haproxy::servers_from_config(path)?;
                let found = servers.iter().find_map(|s| match &s.enrolment {
                    Enrolment::Enrolled {
                        row_key,
                        identities: line_ids,
                    } if *row_key == line => Some(line_ids.join(" ")),
                    _ => None,
                });
                line = found.ok_or_else(|| {
                    Failure::invalid(format!(
                        "no enrolled server with row key {line} in {}",
                        path.display()
                    ))
                })?;
            }
        }
        let ids = parse_line(line.as_bytes()).map_err(|e| {
            Failure::invalid(format!(
                "the agent refuses the agent-send line {line:?}: {e}"
            ))
        })?;
        let answer = self
            .client
            .list_prefix(&self.prefix, 0, Duration::ZERO)
            .await?;
        let snapshot = build_snapshot(&self.prefix, &answer);
        let raw: HashMap<&str, &KvPair> = answer
            .pairs
            .iter()
            .filter_map(|p| p.key.strip_prefix(&self.prefix).map(|r| (r, p)))
            .collect();
        let result = snapshot.lookup(ids.iter().copied());
        let deciding = match result {
            Answer::State { decided_by, .. } => decided_by,
            Answer::Invalid { decided_by } => Some(decided_by),
        };
        let rows: Vec<(String, Option<String>, &'static str)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let value = raw.get(id).map(|p| display_value(&p.value));
                let role = match (deciding, &value) {
                    (Some(d), _) if d == i => "decides",
                    (Some(d), Some(_)) if i > d => "not read (an earlier identity decides)",
                    (_, None) => "no key",
                    (_, Some(_)) => "not read",
                };
                (id.to_string(), value, role)
            })
            .collect();
        let (reply, summary) = match result {
            Answer::State {
                state,
                decided_by: Some(d),
            } => (
                Some(reply_text(state)),
                format!(
                    "{} (decided by key {} = {state})",
                    reply_text(state),
                    ids[d]
                ),
            ),
            Answer::State {
                state,
                decided_by: None,
            } => (
                Some(reply_text(state)),
                format!("{} (no identity has a key: the default)", reply_text(state)),
            ),
            Answer::Invalid { decided_by } => {
                let why = match snapshot.keys.get(ids[decided_by]).map(|k| &k.entry) {
                    Some(Entry::Invalid(e)) => e.to_string(),
                    _ => "invalid".into(),
                };
                (
                    None,
                    format!(
                        "none: key {} holds an invalid value ({why}); the agent closes the \
                         connection and HAProxy keeps the server's current state",
                        ids[decided_by]
                    ),
                )
            }
        };
        if self.json {
            self.print_json(json!({
                "ok": true,
                "line": line,
                "reply": reply,
                "answer": result.kind().as_str(),
                "decided_by": deciding.map(|d| ids[d]),
                "identities": rows.iter().map(|(id, value, role)| json!({
                    "identity": id, "value": value, "role": role,
                })).collect::<Vec<_>>(),
                "consul_index": answer.index,
            }));
            return Ok(());
        }
        println!("agent-send line: {line}");
        println!("answer: {summary}");
        let table_rows: Vec<Vec<String>> = rows
            .into_iter()
            .map(|(id, value, role)| {
                vec![id, value.unwrap_or_else(|| "-".into()), role.to_string()]
            })
            .collect();
        print!("{}", table(&["IDENTITY", "VALUE", "ROLE"], &table_rows));
        println!("Consul index {}.", answer.index);
        Ok(())
    }
}

/// Warns about ending a drain without going through maint.
fn slowstart_note(before: &Current, change: Change) -> Option<&'static str> {
    let from_drain = matches!(
        before,
        Current::Valid {
            state: AdminState::Drain,
            ..
        }
    );
    let to_service = matches!(
        change,
        Change::Clear | Change::Set(AdminState::Ready) | Change::Set(AdminState::Weight(_))
    );
    (from_drain && to_service).then_some(
        "drain -> ready skips HAProxy's slowstart (it applies only when leaving MAINT); \
         `state undrain` and `state canary enable` go through maint",
    )
}

/// Tells that `state set` takes over a key `state drain` wrote, setting it
/// to a value `state drain` and `state undrain` then leave alone (drain,
/// maint or 0%).
fn takeover_note(before: &Current, change: Change) -> Option<&'static str> {
    let out = matches!(
        change,
        Change::Set(AdminState::Drain | AdminState::Maint | AdminState::Weight(0))
    );
    (before.by_drain() && out).then_some(
        "the key was written by `state drain`; it is now set by hand (Consul Flags 0), so \
         `state undrain` and `state drain` leave it alone until `state clear`",
    )
}

fn key_json(key: &str, pair: Option<&KvPair>) -> Value {
    match pair {
        None => json!({"key": key, "present": false}),
        Some(p) => {
            let mut v = json!({
                "key": key,
                "present": true,
                "value": String::from_utf8_lossy(&p.value),
                "modify_index": p.modify_index,
                "flags": p.flags,
                "by_drain": is_row_key(key) && drain_mark(p.flags).is_some(),
                "drain_id": drain_id_json(key, p.flags),
                "set_by": set_by(key, p.flags),
            });
            match parse_value(&p.value) {
                Ok(s) => {
                    v["valid"] = json!(true);
                    v["state"] = json!(s.to_string());
                    v["reply"] = json!(reply_text(s));
                }
                Err(e) => {
                    v["valid"] = json!(false);
                    v["error"] = json!(e.to_string());
                }
            }
            v
        }
    }
}

fn entry_json(key: &str, pair: &KvPair, snapshot: &Snapshot) -> Value {
    let mut v = key_json(key, Some(pair));
    // The agent's verdict, key validity included.
    if let Some(Entry::Invalid(e)) = snapshot.keys.get(key).map(|k| &k.entry) {
        v["valid"] = json!(false);
        v["error"] = json!(e.to_string());
        if let Some(o) = v.as_object_mut() {
            o.remove("state");
            o.remove("reply");
        }
    }
    v
}

/// The REPLY column for a key the agent holds invalid: a server whose first
/// key it is gets no answer (frozen in its current state), but no server can
/// name a key that is not a valid identity.
fn invalid_reply(e: &InvalidValue) -> String {
    match e {
        InvalidValue::Key(_) => "none (no agent-send can name this key)".to_string(),
        _ => "none (frozen)".to_string(),
    }
}

fn key_row(key: &str, pair: &KvPair, entry: Option<&Entry>) -> Vec<String> {
    let (state, reply) = match entry {
        Some(Entry::Valid(s)) => (s.to_string(), reply_text(*s)),
        Some(Entry::Invalid(e)) => (format!("INVALID: {e}"), invalid_reply(e)),
        None => match parse_value(&pair.value) {
            Ok(s) => (s.to_string(), reply_text(s)),
            Err(e) => (format!("INVALID: {e}"), invalid_reply(&e)),
        },
    };
    vec![
        key.to_string(),
        display_value(&pair.value),
        state,
        reply,
        pair.modify_index.to_string(),
        set_by(key, pair.flags),
    ]
}

/// True for a row key (`<backend>/<server>`), false for a group key such as
/// `canary`, which has no set-by-hand rule.
fn is_row_key(key: &str) -> bool {
    key.contains('/')
}

/// The SET-BY column: `-` for a group key (its Flags mean nothing), else
/// [`mark_name`].
fn set_by(key: &str, flags: u64) -> String {
    if is_row_key(key) {
        mark_name(flags)
    } else {
        "-".to_string()
    }
}

/// What a row key's Flags say: `drain` for the generic mark (Flags 1),
/// `drain:<id>` (8 hex digits) for a drain with selection id `id`, `hand` for
/// even Flags (with them when they are not 0).
fn mark_name(flags: u64) -> String {
    match drain_mark(flags) {
        Some(0) => "drain".to_string(),
        Some(id) => format!("drain:{id:08x}"),
        None if flags == 0 => "hand".to_string(),
        None => format!("hand (flags {flags})"),
    }
}

/// The selection id of a drain mark for `--json`: 8 hex digits, `None` for
/// the generic mark, a key set by hand, or a group key.
fn drain_id_json(key: &str, flags: u64) -> Option<String> {
    drain_mark(flags)
        .filter(|id| is_row_key(key) && *id != 0)
        .map(|id| format!("{id:08x}"))
}

const KEY_HEADER: [&str; 6] = ["KEY", "VALUE", "STATE", "REPLY", "MODIFY-INDEX", "SET-BY"];

fn key_table(rows: &[(String, &KvPair)]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|(k, p)| key_row(k, p, None)).collect();
    table(&KEY_HEADER, &rows)
}

fn key_table_snapshot(rows: &[(String, &KvPair)], snapshot: &Snapshot) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(k, p)| key_row(k, p, snapshot.keys.get(k.as_str()).map(|s| &s.entry)))
        .collect();
    table(&KEY_HEADER, &rows)
}

/// The HAProxy admin state [`Writer::check_admin`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Drain,
    Maint,
}

impl Want {
    fn flag(self) -> u32 {
        match self {
            Want::Drain => haproxy::ADMIN_FORCED_DRAIN,
            Want::Maint => haproxy::ADMIN_FORCED_MAINT,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Want::Drain => "DRAIN",
            Want::Maint => "MAINT",
        }
    }

    /// What a socket error means for the sequence.
    fn unchecked(self) -> &'static str {
        match self {
            Want::Drain => "cannot check that HAProxy drained the servers, so maint is not written",
            Want::Maint => {
                "cannot check that HAProxy put the servers in MAINT (maint is written); look \
                 with `show servers state`"
            }
        }
    }
}

/// A table of servers a sequence left alone: server, key, value, `mark`
/// (under `mark_header`) and ModifyIndex of each key as read.
fn left_alone_table(
    keys: &[(Option<String>, &plan::KeyPlan)],
    mark_header: &str,
    mark: impl Fn(&plan::Current) -> String,
) -> String {
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(server, k)| {
            vec![
                server.clone().unwrap_or_else(|| "-".into()),
                k.key.clone(),
                k.before.describe(),
                mark(&k.before),
                k.before.index().to_string(),
            ]
        })
        .collect();
    table(
        &["SERVER", "KEY", "VALUE", mark_header, "MODIFY-INDEX"],
        &rows,
    )
}

/// Why a sequence stopped before its end.
enum Stop {
    /// Before any step.
    Setup(Failure),
    /// A signal, before or during step `step`.
    Signal {
        step: usize,
        name: &'static str,
        code: u8,
    },
    /// Step `step` failed (a conflict, Consul, permission).
    Failed { step: usize, failure: Failure },
}

impl Stop {
    /// The same stop, at step `step`.
    fn at(self, step: usize) -> Stop {
        match self {
            Stop::Failed { failure, .. } => Stop::Failed { step, failure },
            Stop::Signal { name, code, .. } => Stop::Signal { step, name, code },
            other => other,
        }
    }
}

/// Where a sequence got to.
struct Run {
    /// Consul index of the read the plan was made from.
    read_index: u64,
    /// Last ModifyIndex seen per key (0: absent).
    indexes: HashMap<String, u64>,
    /// Keys written so far and what they hold now (`None`: removed).
    now: HashMap<String, Option<AdminState>>,
    /// One per plan step.
    statuses: Vec<StepStatus>,
    /// The keys and the snapshot as read again at the end, when that read
    /// worked.
    observed: Option<(HashMap<String, Current>, Snapshot)>,
    /// Servers HAProxy did not put in DRAIN after the drain wait (with
    /// `--haproxy-socket`).
    not_drained: Vec<String>,
    /// Servers HAProxy did not put in MAINT after maint was written (with
    /// `--haproxy-socket`).
    not_in_maint: Vec<String>,
}

impl Run {
    fn new(plan: &Plan, read_index: u64) -> Run {
        Run {
            read_index,
            indexes: plan
                .keys
                .iter()
                .map(|k| (k.key.clone(), k.before.index()))
                .collect(),
            now: HashMap::new(),
            statuses: vec![StepStatus::NotRun; plan.steps.len()],
            observed: None,
            not_drained: Vec::new(),
            not_in_maint: Vec::new(),
        }
    }

    fn not_run_from(&mut self, from: usize) {
        for s in self.statuses.iter_mut().skip(from) {
            *s = StepStatus::NotRun;
        }
    }

    /// What this run wrote, what the keys hold now when they could be read
    /// again (another writer's changes named as such), and what was not
    /// written, from step `from` on.
    fn progress(&self, plan: &Plan, from: usize) -> String {
        let mut parts = Vec::new();
        let mut written: Vec<(&String, &Option<AdminState>)> = self.now.iter().collect();
        written.sort_by(|a, b| a.0.cmp(b.0));
        let sets: Vec<String> = written
            .iter()
            .filter_map(|(k, s)| s.map(|s| format!("{k} = {s}")))
            .collect();
        let clears: Vec<&str> = written
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(k, _)| k.as_str())
            .collect();
        if !sets.is_empty() {
            parts.push(format!("wrote {}", sets.join(", ")));
        }
        if !clears.is_empty() {
            parts.push(format!("removed {}", clears.join(", ")));
        }
        if parts.is_empty() {
            parts.push("this run wrote nothing".to_string());
        }
        let observed = self.observed.as_ref().map(|(keys, _)| keys);
        match observed {
            None => parts.push(
                "what the keys hold now is unknown (reading them again failed; look with \
                 `state list`)"
                    .to_string(),
            ),
            Some(observed) => {
                let mut changed = Vec::new();
                for k in &plan.keys {
                    let Some(now) = observed.get(&k.key) else {
                        continue;
                    };
                    let now_shown = now.describe();
                    match self.now.get(&k.key) {
                        Some(ours) => {
                            let ours = ours.map_or("absent".to_string(), |s| s.to_string());
                            if now_shown != ours {
                                changed.push(format!(
                                    "then {} changed to {now_shown} by someone else",
                                    k.key
                                ));
                            }
                        }
                        None => {
                            let before = k.before.describe();
                            if now_shown != before {
                                changed.push(format!(
                                    "{} changed from {before} to {now_shown} by someone else",
                                    k.key
                                ));
                            }
                        }
                    }
                }
                if !changed.is_empty() {
                    parts.push(format!("{}; nothing overwritten", changed.join(", ")));
                }
            }
        }
        let pending: Vec<String> = plan.steps[from.min(plan.steps.len())..]
            .iter()
            .filter_map(|s| match s {
                Step::Write { change, keys, .. } => {
                    let target = match change {
                        Change::Set(s) => Some(*s),
                        Change::Clear => None,
                    };
                    let left = keys
                        .iter()
                        .filter(|k| self.now.get(*k) != Some(&target))
                        .count();
                    (left > 0).then(|| {
                        format!(
                            "{} was NOT written to {left} key{}",
                            change.describe(),
                            if left == 1 { "" } else { "s" }
                        )
                    })
                }
                Step::Wait { .. } => None,
            })
            .collect();
        parts.push(if pending.is_empty() {
            "nothing was left to write".to_string()
        } else {
            pending.join(", ")
        });
        let mut text = parts.join("; ");
        if let Some(observed) = observed {
            let invalid: Vec<&str> = plan
                .keys
                .iter()
                .filter(|k| matches!(observed.get(&k.key), Some(Current::Invalid { .. })))
                .map(|k| k.key.as_str())
                .collect();
            if invalid.is_empty() {
                text.push_str(". Every key holds a valid value");
            } else {
                text.push_str(&format!(
                    ". {} now {} an invalid value",
                    invalid.join(", "),
                    if invalid.len() == 1 { "holds" } else { "hold" }
                ));
            }
        }
        text
    }

    /// The failure for a signal during step `current` (or before it),
    /// naming what is left unwritten.
    fn interrupted(&mut self, plan: &Plan, current: usize, name: &str, code: u8) -> Failure {
        self.not_run_from(current + 1);
        Failure::new(
            code,
            "interrupted",
            format!(
                "interrupted by {name}: {}. Re-run the same command to finish (it is \
                 idempotent)",
                self.progress(plan, current)
            ),
        )
    }

    /// The failure for a sequence that stopped, its message describing what
    /// was written and what the keys hold now.
    fn stopped(&mut self, plan: &Plan, stop: Stop) -> Failure {
        match stop {
            Stop::Setup(f) => f,
            Stop::Signal { step, name, code } => self.interrupted(plan, step, name, code),
            Stop::Failed { step, mut failure } => {
                self.not_run_from(step + 1);
                failure.message = format!(
                    "{}. So far: {}",
                    failure.message.trim_end_matches('.'),
                    self.progress(plan, step)
                );
                failure
            }
        }
    }

    /// What `key` holds now, given what it held before.
    fn now_of(&self, key: &str, before: &Current) -> String {
        if let Some(c) = self.observed.as_ref().and_then(|(keys, _)| keys.get(key)) {
            return c.describe();
        }
        match self.now.get(key) {
            Some(Some(s)) => s.to_string(),
            Some(None) => "absent".into(),
            None => before.describe(),
        }
    }
}

/// The report printed at the end of a sequence.
struct Report<'a> {
    action: &'static str,
    dry_run: bool,
    plan: &'a Plan,
    run: &'a Run,
    target: &'a Target,
    snapshot: &'a Snapshot,
    failure: Option<&'a Failure>,
}

impl Report<'_> {
    /// The snapshot the agents hold now (or will, for a dry run).
    fn snapshot_now(&self) -> Snapshot {
        if self.dry_run {
            return plan::snapshot_after(self.snapshot, &self.plan.keys);
        }
        if let Some((_, snapshot)) = &self.run.observed {
            return snapshot.clone();
        }
        let reached: Vec<plan::KeyPlan> = self
            .run
            .now
            .iter()
            .map(|(k, s)| plan::KeyPlan {
                key: k.clone(),
                before: Current::Absent,
                after: *s,
                note: None,
                set_by_hand: false,
                held_by_other_drain: false,
            })
            .collect();
        plan::snapshot_after(self.snapshot, &reached)
    }

    /// The keys left alone because they were set by hand, each with the
    /// server it decides (`None` for a group key), in the report's order.
    fn set_by_hand(&self) -> Vec<(Option<String>, &plan::KeyPlan)> {
        self.left_alone(|k| k.set_by_hand)
    }

    /// The keys left alone because another drain's mark holds them, each
    /// with the server it decides.
    fn held_by_other_drain(&self) -> Vec<(Option<String>, &plan::KeyPlan)> {
        self.left_alone(|k| k.held_by_other_drain)
    }

    fn left_alone(
        &self,
        which: impl Fn(&plan::KeyPlan) -> bool,
    ) -> Vec<(Option<String>, &plan::KeyPlan)> {
        let hand: HashMap<&str, &plan::KeyPlan> = self
            .plan
            .keys
            .iter()
            .filter(|k| which(k))
            .map(|k| (k.key.as_str(), k))
            .collect();
        if self.target.servers.is_empty() {
            return self
                .plan
                .keys
                .iter()
                .filter(|k| which(k))
                .map(|k| (None, k))
                .collect();
        }
        self.target
            .servers
            .iter()
            .filter_map(|s| {
                let k = hand.get(s.row_key()?)?;
                Some((Some(s.id()), *k))
            })
            .collect()
    }

    /// The lines naming the servers left alone because their keys were set
    /// by hand, so on-call sees them; empty when there are none.
    fn set_by_hand_text(&self) -> String {
        let hand = self.set_by_hand();
        if hand.is_empty() {
            return String::new();
        }
        let n = hand.len();
        let (them, verb) = if n == 1 {
            ("its key was", "it stays")
        } else {
            ("their keys were", "they stay")
        };
        let mut out = format!(
            "{n} server{} left alone: {them} set by hand (drain, maint or 0% without Consul \
             Flags: no mark of `state drain`), so {verb} as set:\n",
            if n == 1 { "" } else { "s" },
        );
        out.push_str(&left_alone_table(&hand, "FLAGS", |c| c.flags().to_string()));
        out.push_str(
            "Before releasing one, ask whoever set it; then `state clear KEY` (from drain, \
             `state set KEY maint` first, so slowstart ramps).\n",
        );
        out
    }

    /// The lines naming the servers left alone because another drain holds
    /// their keys; empty when there are none.
    fn held_by_other_drain_text(&self) -> String {
        let held = self.held_by_other_drain();
        if held.is_empty() {
            return String::new();
        }
        let n = held.len();
        let mut out = format!(
            "{n} server{} left alone: held by another drain (drain or maint with another \
             selection's mark):\n",
            if n == 1 { "" } else { "s" },
        );
        out.push_str(&left_alone_table(&held, "SET-BY", |c| mark_name(c.flags())));
        out.push_str(
            "Undrain it with the same selection as its drain (or --any-drain), or `state \
             clear KEY`.\n",
        );
        out
    }

    fn outcome(&self) -> &'static str {
        match self.failure {
            Some(f) => f.kind,
            None if self.dry_run => "dry_run",
            None if self.plan.steps.is_empty() => "nothing_to_do",
            None => "done",
        }
    }

    fn server_answer(snapshot: &Snapshot, server: &Server) -> (String, Option<String>) {
        let ids: Vec<&str> = match &server.enrolment {
            Enrolment::Enrolled { identities, .. } => {
                identities.iter().map(String::as_str).collect()
            }
            Enrolment::NotEnrolled(_) => return ("-".into(), None),
        };
        match snapshot.lookup(ids.iter().copied()) {
            Answer::State { state, decided_by } => {
                (reply_text(state), decided_by.map(|d| ids[d].to_string()))
            }
            Answer::Invalid { decided_by } => (
                "none (invalid value)".into(),
                Some(ids[decided_by].to_string()),
            ),
        }
    }

    fn steps_json(&self) -> Vec<Value> {
        self.plan
            .steps
            .iter()
            .zip(&self.run.statuses)
            .map(|(step, status)| match step {
                Step::Write {
                    change,
                    flags,
                    keys,
                } => json!({
                    "write": change.describe(), "flags": flags, "keys": keys,
                    "status": status.as_str(),
                }),
                Step::Wait { duration, purpose } => json!({
                    "wait_seconds": duration.as_secs_f64(),
                    "for": match purpose { WaitFor::Drain => "drain", WaitFor::Maint => "maint" },
                    "status": status.as_str(),
                }),
            })
            .collect()
    }

    fn json(&self) -> Value {
        let now = self.snapshot_now();
        json!({
            "ok": self.failure.is_none(),
            "action": self.action,
            "outcome": self.outcome(),
            "dry_run": self.dry_run,
            "prefix_read_at_index": self.run.read_index,
            "source": self.target.source,
            "row_keys_assumed": self.target.socket.is_some(),
            "not_drained": self.run.not_drained,
            "not_in_maint": self.run.not_in_maint,
            "steps": self.steps_json(),
            "keys": self.plan.keys.iter().map(|k| json!({
                "key": k.key,
                "before": k.before.describe(),
                "modify_index_before": k.before.index(),
                "flags": k.before.flags(),
                "by_drain": k.before.by_drain(),
                "drain_id": k.before.drain_id().filter(|id| *id != 0).map(|id| format!("{id:08x}")),
                "set_by_hand": k.set_by_hand,
                "held_by_other_drain": k.held_by_other_drain,
                "now": if self.dry_run { k.before.describe() } else { self.run.now_of(&k.key, &k.before) },
                "target": k.after.map_or("absent".into(), |s| s.to_string()),
                "note": k.note,
            })).collect::<Vec<_>>(),
            "set_by_hand": self.set_by_hand().iter().map(|(server, k)| json!({
                "server": server,
                "key": k.key,
                "value": k.before.describe(),
                "flags": k.before.flags(),
            })).collect::<Vec<_>>(),
            "held_by_other_drain": self.held_by_other_drain().iter().map(|(server, k)| json!({
                "server": server,
                "key": k.key,
                "value": k.before.describe(),
                "flags": k.before.flags(),
                "drain_id": k.before.drain_id().map(|id| format!("{id:08x}")),
            })).collect::<Vec<_>>(),
            "servers": self.target.servers.iter().map(|s| {
                let (answer, decided_by) = Self::server_answer(&now, s);
                json!({
                    "server": s.id(),
                    "key": s.row_key(),
                    "zones": s.zones,
                    "agent_answer": answer,
                    "decided_by": decided_by,
                })
            }).collect::<Vec<_>>(),
            "not_enrolled": self.target.not_enrolled.iter().map(|(s, why)| json!({
                "server": s.id(), "reason": why, "zones": s.zones,
            })).collect::<Vec<_>>(),
            "error": self.failure.map(Failure::json),
        })
    }

    fn text(&self) -> String {
        let mut out = String::new();
        let headline = match self.outcome() {
            "dry_run" => "dry run, nothing written; the plan".to_string(),
            "nothing_to_do" => "nothing to do".to_string(),
            "done" => "done".to_string(),
            other => format!("stopped ({other})"),
        };
        let hand = self.set_by_hand().len();
        let hand = match hand {
            0 => String::new(),
            1 => "; 1 server set by hand left alone (see below)".to_string(),
            n => format!("; {n} servers set by hand left alone (see below)"),
        };
        let held = match self.held_by_other_drain().len() {
            0 => String::new(),
            1 => "; 1 server held by another drain left alone (see below)".to_string(),
            n => format!("; {n} servers held by another drain left alone (see below)"),
        };
        out.push_str(&format!("{}: {headline}{hand}{held}\n", self.action));
        if self.dry_run || self.failure.is_some() {
            for (step, status) in self.plan.steps.iter().zip(&self.run.statuses) {
                let what = match step {
                    Step::Write { change, keys, .. } => format!(
                        "write {} to {} key{}",
                        change.describe(),
                        keys.len(),
                        if keys.len() == 1 { "" } else { "s" }
                    ),
                    Step::Wait { duration, .. } => {
                        format!("wait {}", humantime::format_duration(*duration))
                    }
                };
                out.push_str(&format!("  {what}: {}\n", status.as_str()));
            }
        }
        let now = self.snapshot_now();
        let now_header = if self.dry_run { "AFTER" } else { "NOW" };
        if self.target.servers.is_empty() {
            let rows: Vec<Vec<String>> = self
                .plan
                .keys
                .iter()
                .map(|k| {
                    vec![
                        k.key.clone(),
                        k.before.describe(),
                        if self.dry_run {
                            k.after.map_or("absent".into(), |s| s.to_string())
                        } else {
                            self.run.now_of(&k.key, &k.before)
                        },
                        k.note.unwrap_or("").to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(&["KEY", "BEFORE", now_header, "NOTE"], &rows));
        } else {
            let by_key: HashMap<&str, &plan::KeyPlan> =
                self.plan.keys.iter().map(|k| (k.key.as_str(), k)).collect();
            let rows: Vec<Vec<String>> = self
                .target
                .servers
                .iter()
                .map(|s| {
                    let key = s.row_key().unwrap_or("-");
                    let (before, after, note) = match by_key.get(key) {
                        Some(k) => (
                            k.before.describe(),
                            if self.dry_run {
                                k.after.map_or("absent".into(), |s| s.to_string())
                            } else {
                                self.run.now_of(key, &k.before)
                            },
                            k.note.unwrap_or(""),
                        ),
                        None => ("-".into(), "-".into(), ""),
                    };
                    let (answer, decided_by) = Self::server_answer(&now, s);
                    vec![
                        s.id(),
                        key.to_string(),
                        before,
                        after,
                        match decided_by {
                            Some(d) => format!("{answer} ({d})"),
                            None => answer,
                        },
                        note.to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(
                &[
                    "SERVER",
                    "KEY",
                    "BEFORE",
                    now_header,
                    "AGENT ANSWERS",
                    "NOTE",
                ],
                &rows,
            ));
        }
        if !self.target.not_enrolled.is_empty() {
            let n = self.target.not_enrolled.len();
            out.push_str(&format!(
                "{n} server{} not enrolled, so not written (the agent does not decide their \
                 state; take them out another way if needed):\n",
                if n == 1 { "" } else { "s" }
            ));
            let rows: Vec<Vec<String>> = self
                .target
                .not_enrolled
                .iter()
                .map(|(s, why)| vec![s.id(), why.clone()])
                .collect();
            out.push_str(&table(&["SERVER", "REASON"], &rows));
        }
        out.push_str(&self.set_by_hand_text());
        out.push_str(&self.held_by_other_drain_text());
        if let Some(source) = &self.target.source {
            out.push_str(&format!("Servers read from {source}.\n"));
        }
        if self.target.socket.is_some() {
            let mut note = ASSUMED_ROW_KEYS.to_string();
            note[..1].make_ascii_uppercase();
            out.push_str(&format!("{note}.\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(zone: Option<&str>, backend: Option<&str>, server: Option<&str>) -> Selector {
        Selector {
            zone: zone.map(Into::into),
            backend: backend.map(Into::into),
            server: server.map(Into::into),
            haproxy_config: "/dev/null".into(),
            haproxy_socket: None,
        }
    }

    const CONFIG: &str = "defaults\n  default-server agent-check\nbackend web\n  server web-01 1.1.1.1:80 agent-send \"web/web-01 zone-a\\n\"\n  server web-02 1.1.1.2:80 agent-send \"web/web-02 zone-b\\n\"\n  server web-03 1.1.1.3:80 no-agent-check agent-send \"web/web-03 zone-b\\n\"\n  server web-04 1.1.1.4:80 no-agent-check\nbackend api\n  server api-01 1.1.2.1:80 agent-send \"api/api-01 canary zone-b\\n\"\n";

    #[test]
    fn zone_selection_lists_unenrolled_servers() {
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), None, None),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["api/api-01", "web/web-02"]);
        let ne: Vec<(String, &str)> = t
            .not_enrolled
            .iter()
            .map(|(s, w)| (s.id(), w.as_str()))
            .collect();
        assert_eq!(
            ne,
            vec![
                ("web/web-03".to_string(), "no agent-check"),
                (
                    "web/web-04".to_string(),
                    "no agent-check; zone unknown (no zone- group)"
                ),
            ]
        );
    }

    #[test]
    fn servers_the_agent_would_not_answer_from_their_row_key_are_not_enrolled() {
        let config = "defaults\n  default-server agent-check\nbackend legacy\n  server l-01 1.1.1.1:80 agent-send \"legacy/l-01 zone-c\\n\"\n  server l-02 1.1.1.2:80 agent-send \"canary legacy/l-02 zone-c\\n\"\n  server l-03 1.1.1.3:80 agent-send \"legacy/l-03 zone-c\"\n  server l-04 1.1.1.4:80 agent-send \"legacy/l-04 zone-c a b c d e f g h i j k l m n o\\n\"\n";
        for select in [
            selector(Some("c"), None, None),
            selector(None, Some("legacy"), None),
        ] {
            let t = Target::select(haproxy::parse_config(config), &select, "cfg".into());
            assert_eq!(t.keys, vec!["legacy/l-01"]);
            let ids: Vec<String> = t.servers.iter().map(Server::id).collect();
            assert_eq!(ids, vec!["legacy/l-01"]);
            let ne: Vec<(String, &str)> = t
                .not_enrolled
                .iter()
                .map(|(s, w)| (s.id(), w.as_str()))
                .collect();
            assert_eq!(ne.len(), 3, "{ne:?}");
            assert_eq!(ne[0].0, "legacy/l-02");
            assert!(
                ne[0]
                    .1
                    .starts_with("first identity on agent-send is `canary`, not a row key"),
                "{ne:?}"
            );
            assert_eq!(ne[1].0, "legacy/l-03");
            assert!(ne[1].1.contains("does not end with \\n"), "{ne:?}");
            assert_eq!(ne[2].0, "legacy/l-04");
            assert!(ne[2].1.contains("more than 16 identities"), "{ne:?}");
        }
    }

    #[test]
    fn backend_and_glob_selection() {
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(None, Some("web"), Some("web-0[12]")),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["web/web-01", "web/web-02"]);
        assert!(t.not_enrolled.is_empty());
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), Some("web"), None),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["web/web-02"]);
    }

    #[test]
    fn consul_errors_map_to_exit_codes() {
        let f: Failure = ConsulError::Connect {
            addr: "x".into(),
            detail: "refused".into(),
        }
        .into();
        assert_eq!(f.code, exit::UNAVAILABLE);
        let f: Failure = ConsulError::Status {
            status: reqwest::StatusCode::FORBIDDEN,
            body: "Permission denied".into(),
        }
        .into();
        assert_eq!(f.code, exit::NOPERM);
        let f: Failure = ConsulError::Status {
            status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            body: "No cluster leader".into(),
        }
        .into();
        assert_eq!(f.code, exit::UNAVAILABLE);
        let f: Failure = ConsulError::Decode("x".into()).into();
        assert_eq!(f.code, exit::PROTOCOL);
    }

    #[test]
    fn slowstart_note_only_when_leaving_drain_for_service() {
        let drain = Current::Valid {
            state: AdminState::Drain,
            index: 1,
            flags: 0,
        };
        assert!(slowstart_note(&drain, Change::Clear).is_some());
        assert!(slowstart_note(&drain, Change::Set(AdminState::Ready)).is_some());
        assert!(slowstart_note(&drain, Change::Set(AdminState::Maint)).is_none());
        assert!(slowstart_note(&Current::Absent, Change::Set(AdminState::Ready)).is_none());
    }

    #[test]
    fn set_takes_over_a_key_state_drain_wrote_and_says_so() {
        let maint = |flags| Current::Valid {
            state: AdminState::Maint,
            index: 1,
            flags,
        };
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Maint)).is_some());
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Drain)).is_some());
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Weight(0))).is_some());
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Weight(1))).is_none());
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Set(AdminState::Ready)).is_none());
        assert!(takeover_note(&maint(DRAIN_FLAGS), Change::Clear).is_none());
        assert!(takeover_note(&maint(0), Change::Set(AdminState::Maint)).is_none());
        assert!(takeover_note(&Current::Absent, Change::Set(AdminState::Maint)).is_none());
    }

    #[test]
    fn selection_ids_are_fnv1a_of_the_normalized_selection() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        assert_eq!(
            selection_id(Some("b"), None, None),
            fnv1a_32(b"zone=b backend= server=")
        );
        assert_eq!(
            selection_id(None, Some("web"), Some("web-0*")),
            fnv1a_32(b"zone= backend=web server=web-0*")
        );
        assert_ne!(
            selection_id(Some("b"), None, None),
            selection_id(None, Some("b"), None)
        );
    }

    #[test]
    fn set_by_column_names_the_drain_mark() {
        assert_eq!(set_by("web/a", DRAIN_FLAGS), "drain");
        assert_eq!(set_by("web/a", 0), "hand");
        assert_eq!(set_by("web/a", 42), "hand (flags 42)");
        assert_eq!(set_by("web/a", drain_flags(0x1234abcd)), "drain:1234abcd");
        assert_eq!(
            drain_id_json("web/a", drain_flags(0xab)).unwrap(),
            "000000ab"
        );
        assert_eq!(drain_id_json("web/a", DRAIN_FLAGS), None);
        // Group keys have no set-by-hand rule.
        for flags in [0, DRAIN_FLAGS, drain_flags(7), 42] {
            assert_eq!(set_by("canary", flags), "-");
            assert_eq!(drain_id_json("canary", flags), None);
        }
    }

    #[test]
    fn report_names_servers_left_alone_because_set_by_hand() {
        let target = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), None, None),
            "cfg".into(),
        );
        let key = |key: &str, value: &[u8], flags| KvPair {
            key: format!("p/{key}"),
            value: value.to_vec(),
            modify_index: 5,
            flags,
        };
        let pairs = [
            key("api/api-01", b"maint", 0),
            key("web/web-02", b"maint", DRAIN_FLAGS),
        ];
        let plan = plan_undrain(
            currents("p/", &pairs, &target.keys),
            Duration::ZERO,
            Claim::Marked {
                id: 0,
                any_drain: false,
            },
        )
        .unwrap();
        let run = Run::new(&plan, 9);
        let snapshot = Snapshot::default();
        let report = Report {
            action: "undrain",
            dry_run: true,
            plan: &plan,
            run: &run,
            target: &target,
            snapshot: &snapshot,
            failure: None,
        };
        let text = report.text();
        assert!(
            text.starts_with("undrain: dry run, nothing written; the plan; 1 server set by hand"),
            "{text}"
        );
        assert!(
            text.contains("1 server left alone: its key was set by hand"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("api/api-01") && l.ends_with(" 5"))
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["api/api-01", "api/api-01", "maint", "0", "5"]
        );
        let v = report.json();
        assert_eq!(
            v["set_by_hand"],
            json!([{"server": "api/api-01", "key": "api/api-01", "value": "maint", "flags": 0}])
        );
        let keys = v["keys"].as_array().unwrap();
        assert_eq!(keys[0]["key"], "api/api-01");
        assert_eq!(keys[0]["set_by_hand"], true);
        assert_eq!(keys[1]["flags"], DRAIN_FLAGS);
        assert_eq!(keys[1]["by_drain"], true);
        assert_eq!(keys[1]["set_by_hand"], false);
    }
}
