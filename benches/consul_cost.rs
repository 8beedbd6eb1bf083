//! Consul cost per KV change: the agent beside Consul's own prefix watcher,
//! `consul watch -type=keyprefix` (the shape of consul-template and of the
//! Go API's watch plans), in one run, on one Consul, over the same changes.
//!
//! Run it with one command (it builds the release agent first):
//!
//! ```text
//! ./scripts/bench.sh --consul-cost
//! ```
//!
//! For ACLs off, then on (default deny; the agent's token reads the prefix),
//! one Consul 1.8.7 in dev mode holds `--keys` keys (default 100) under
//! `gitlab-haproxy-agent/state/` and four clients watch it, each through its
//! own counting proxy on 127.0.0.1 (`support::proxy`): the agent in default
//! consistency and with `--consistency stale`, and `consul watch` without and
//! with `-stale`. Then 20 changes (7 adds, 7 value changes, 6 deletes) are
//! written one at a time; after each, the run waits until every client has
//! taken it (the agent answers the new value to an agent-check, the watch
//! has run its handler) and every client has been parked on a blocking query
//! for 500 ms, and charges what each proxy counted since the previous change
//! to this one: requests, requests without `stale` in their query (served by
//! the leader), and bytes each way as they crossed the sockets (Consul's
//! answers as Consul encoded them, so gzip counts).
//!
//! The agent's index checks (`?keys&separator=/&stale`, one per
//! `--index-check` while a read is parked) are idle cost, not cost per
//! change: the proxy counts them apart, and they are reported beside the
//! figures per change, not in them. With ACLs off the run then leaves every
//! client idle for `--idle-secs` (default 120) and reports requests and
//! bytes per idle minute: index checks, and blocking reads ended by their
//! `--wait`.
//!
//! Targets are checked and printed (PASS or MISS); a miss does not fail the
//! run. The table is recorded in BENCHMARKS.md under "Consul cost per
//! change". Options (after `--`): `--agent-bin PATH`, `--keys N`,
//! `--no-record`, `--records none|sibling|below` (each key written with
//! its writer record, as the writer CLI does).

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::proxy::{CountingProxy, Forwarded, Totals};
use support::report::{machine, record};
use support::{load_average, wait_every, Agent, Consul, Proc, TempDir};

const PREFIX: &str = "gitlab-haproxy-agent/state/";
const MASTER: &str = "3b6f0c1e-8a4d-4f7e-b2c9-5d1a7e9f0c42";
const BEGIN: &str = "<!-- bench:consul-cost:begin -->";
const END: &str = "<!-- bench:consul-cost:end -->";
/// How long every client must have been parked on a blocking query, with
/// nothing sent or answered, before a change counts as settled. The agent
/// makes its follow-up reads at once and its next blocking read within
/// `--min-query-interval` (100 ms).
const QUIET: Duration = Duration::from_millis(500);
/// The most one change may take to settle.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// Targets: ACLs off, requests per change (and at most consul watch's).
const REQUESTS_ACL_OFF: f64 = 1.0;
/// Targets: ACLs off, bytes per change both ways over consul watch's.
const BYTES_RATIO_ACL_OFF: f64 = 1.2;
/// Targets: ACLs on, requests per change.
const REQUESTS_ACL_ON: f64 = 2.0;
/// Targets: stale mode, requests per change served by the leader.
const LEADER_STALE: f64 = 0.0;

#[derive(clap::Parser)]
#[command(
    name = "consul_cost",
    about = "Consul requests and bytes per KV change: the agent against consul watch"
)]
struct Args {
    /// Set by `cargo bench`; `cargo test --all-targets` runs this binary
    /// without it, and then it only says how to run it.
    #[arg(long, hide = true)]
    bench: bool,
    /// The agent binary under test.
    #[arg(long, value_name = "PATH", default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/gitlab-haproxy-agent"))]
    agent_bin: PathBuf,
    /// Keys under the prefix besides those the changes add (at least 8:
    /// the changes rewrite and delete some of them).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..=10_000))]
    keys: u32,
    /// Print only; leave BENCHMARKS.md alone.
    #[arg(long)]
    no_record: bool,
    /// With ACLs off, how long every client is left idle after the changes
    /// (0: not measured).
    #[arg(long, default_value_t = 120)]
    idle_secs: u64,
    /// Where each key's writer record (who, why, until when; about 110
    /// bytes of JSON) is written, in the key's own transaction, as the
    /// writer CLI does: `none`, `sibling` (`gitlab-haproxy-agent/state~meta/`,
    /// where the writer keeps them) or `below` (`<prefix>~meta/`, where
    /// writers up to 0.1 kept them, downloaded by every agent).
    #[arg(long, value_enum, default_value_t = Records::None)]
    records: Records,
}

/// Where the writer records go ([`Args::records`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Records {
    None,
    Sibling,
    Below,
}

impl Records {
    /// The full key of `key`'s record, if records are written.
    fn key(self, key: &str) -> Option<String> {
        match self {
            Records::None => None,
            Records::Sibling => Some(format!("gitlab-haproxy-agent/state~meta/{key}")),
            Records::Below => Some(format!("{PREFIX}~meta/{key}")),
        }
    }
}

/// A writer's record of a write of `value`.
fn record_of(value: &str) -> String {
    serde_json::json!({"by": "alice", "reason": "kernel upgrade CHG-1234",
        "at": 1_764_921_600u64, "until": 1_764_928_800u64, "value": value})
    .to_string()
}

/// The next write generation (`~generation`) as the writer advances it in
/// each of its transactions: the number and the ids of the last ones,
/// newest first (at most 64).
fn next_generation() -> (String, String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NUMBER: AtomicU64 = AtomicU64::new(0);
    let n = NUMBER.fetch_add(1, Ordering::Relaxed) + 1;
    let ids: Vec<String> = (n.saturating_sub(63).max(1)..=n)
        .rev()
        .map(|i| format!("{i:016x}"))
        .collect();
    (
        format!("{PREFIX}~generation"),
        format!("{n} {}", ids.join(" ")),
    )
}

/// Writes `value` at `key` (relative), with its record and the write
/// generation in one transaction when `records` says so (as the writer
/// does), or deletes both (`None`).
fn write(consul: &Consul, records: Records, key: &str, value: Option<&str>) {
    let full = format!("{PREFIX}{key}");
    match (records.key(key), value) {
        (None, Some(v)) => consul.put(&full, v),
        (None, None) => consul.delete(&full),
        (Some(r), Some(v)) => {
            consul.put_many(&[(full, v.to_string()), (r, record_of(v)), next_generation()])
        }
        (Some(r), None) => {
            let (g, gv) = next_generation();
            let gv = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, gv);
            let ops = serde_json::json!([
                {"KV": {"Verb": "delete", "Key": full}},
                {"KV": {"Verb": "delete", "Key": r}},
                {"KV": {"Verb": "set", "Key": g, "Value": gv}},
            ]);
            let (status, _, body) = consul.request("PUT", "/v1/txn", ops.to_string().as_bytes());
            assert_eq!(status, 200, "txn: {}", String::from_utf8_lossy(&body));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Add,
    Change,
    Delete,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Add, Kind::Change, Kind::Delete];
}

/// One KV change, relative to the prefix; `None` deletes.
struct Step {
    kind: Kind,
    key: &'static str,
    value: Option<&'static str>,
}

const fn step(kind: Kind, key: &'static str, value: Option<&'static str>) -> Step {
    Step { kind, key, value }
}

/// The fixed mix: every step changes the answer for its key, so the agent
/// having applied it can be asked. `web/web-0003`, `-0004` and `-0007` are
/// seeded keys (values `3%`, `drain`, `7%`).
const MIX: [Step; 20] = [
    step(Kind::Add, "canary", Some("drain")),
    step(Kind::Change, "canary", Some("maint")),
    step(Kind::Add, "web/web-new-1", Some("drain")),
    step(Kind::Change, "web/web-0003", Some("maint")),
    step(Kind::Delete, "canary", None),
    step(Kind::Add, "api/api-new-1", Some("50%")),
    step(Kind::Change, "web/web-new-1", Some("25%")),
    step(Kind::Delete, "web/web-0004", None),
    step(Kind::Add, "zone-b", Some("drain")),
    step(Kind::Change, "api/api-new-1", Some("maint")),
    step(Kind::Delete, "web/web-new-1", None),
    step(Kind::Add, "web/web-new-2", Some("maint")),
    step(Kind::Change, "zone-b", Some("25%")),
    step(Kind::Delete, "api/api-new-1", None),
    step(Kind::Add, "canary", Some("maint")),
    step(Kind::Change, "web/web-0007", Some("drain")),
    step(Kind::Delete, "zone-b", None),
    step(Kind::Add, "api/api-new-2", Some("drain")),
    step(Kind::Change, "canary", Some("ready")),
    step(Kind::Delete, "web/web-new-2", None),
];

/// The seeded value of `web/web-NNNN`.
fn seed_value(i: u32) -> String {
    match i % 4 {
        0 => "drain".into(),
        1 => "ready".into(),
        2 => "maint".into(),
        _ => format!("{}%", i % 100),
    }
}

/// The agent-check line that shows `key`: a row key alone, a group behind
/// a row that has no key.
fn probe_line(key: &str) -> String {
    if key.contains('/') {
        key.to_string()
    } else {
        format!("bench/probe {key}")
    }
}

/// The agent's reply for `value`; `None` (no key) answers the default.
fn reply_for(value: Option<&str>) -> String {
    match value {
        None => "ready 100%\n".into(),
        Some(v @ ("ready" | "drain" | "maint")) => format!("{v} 100%\n"),
        Some(weight) => format!("ready {weight}\n"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Acl {
    Off,
    On,
}

impl Acl {
    fn label(self) -> &'static str {
        match self {
            Acl::Off => "off",
            Acl::On => "on",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    Default,
    Stale,
}

impl Reads {
    fn label(self) -> &'static str {
        match self {
            Reads::Default => "default",
            Reads::Stale => "stale",
        }
    }
}

/// `consul watch -type=keyprefix` with a handler that counts its runs.
struct Watch {
    proc: Proc,
    fired: PathBuf,
}

impl Watch {
    fn spawn(http: SocketAddr, reads: Reads, token: Option<&str>, dir: &Path) -> Watch {
        let name = format!("watch-{}", reads.label());
        let fired = dir.join(format!("{name}.fired"));
        let mut cmd = Command::new("consul");
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .arg("watch")
            .arg(format!("-http-addr={http}"))
            .arg("-type=keyprefix")
            .arg(format!("-prefix={PREFIX}"));
        if reads == Reads::Stale {
            cmd.arg("-stale");
        }
        if let Some(token) = token {
            cmd.env("CONSUL_HTTP_TOKEN", token);
        }
        // One argument: consul runs it with `sh -c`, the answer on stdin.
        cmd.arg(format!(
            "cat >/dev/null; echo fired >> '{}'",
            fired.display()
        ));
        let proc = Proc::spawn(cmd, dir.join(format!("{name}.log")));
        Watch { proc, fired }
    }

    /// How many times the handler ran.
    fn fired(&self) -> usize {
        std::fs::read_to_string(&self.fired).map_or(0, |s| s.lines().count())
    }
}

enum Watcher {
    Agent(Agent),
    Watch(Watch),
}

/// One client, its proxy, and what it cost per change.
struct Client {
    reads: Reads,
    /// Declared before the proxy, so dropped (stopped by its PID) first.
    watcher: Watcher,
    proxy: CountingProxy,
    /// Handler runs before the first change (the watch only).
    fired_before: usize,
    /// The proxy's request log length before the first change.
    log_start: usize,
    per_change: Vec<Totals>,
}

impl Client {
    fn is_agent(&self) -> bool {
        matches!(self.watcher, Watcher::Agent(_))
    }

    fn name(&self) -> String {
        match (&self.watcher, self.reads) {
            (Watcher::Agent(_), Reads::Default) => "agent".into(),
            (Watcher::Agent(_), Reads::Stale) => "agent --consistency stale".into(),
            (Watcher::Watch(_), Reads::Default) => "consul watch".into(),
            (Watcher::Watch(_), Reads::Stale) => "consul watch -stale".into(),
        }
    }

    /// Whether the client has taken change number `done` (1-based) whose
    /// probe is `line` answering `want`, and is parked again.
    fn settled(&self, done: usize, line: &str, want: &str) -> bool {
        let taken = match &self.watcher {
            Watcher::Agent(agent) => agent.ask(line) == want,
            Watcher::Watch(watch) => watch.fired() >= self.fired_before + done,
        };
        taken && self.proxy.parked_for().is_some_and(|t| t >= QUIET)
    }

    fn log(&self) -> String {
        match &self.watcher {
            Watcher::Agent(agent) => agent.log(),
            Watcher::Watch(watch) => watch.proc.log(),
        }
    }
}

/// What one client cost, taken before it and its Consul were stopped.
struct Measured {
    name: String,
    reads: Reads,
    is_agent: bool,
    /// What its proxy counted for each change of [`MIX`], in order.
    per_change: Vec<Totals>,
    /// Its requests from the first change until the last one settled.
    requests: Vec<Forwarded>,
    /// What its proxy counted from the first change until the last one
    /// settled, and how long that took.
    changes: (Totals, Duration),
    /// What its proxy counted over the idle window, and its length.
    idle: Option<(Totals, Duration)>,
}

/// What one Consul (ACLs off or on) gave.
struct AclRun {
    acl: Acl,
    clients: Vec<Measured>,
    unsettled: Vec<String>,
    took: Duration,
}

/// Creates a token with `rules`; returns its secret.
fn token(consul: &Consul, name: &str, rules: &str) -> String {
    let policy = serde_json::json!({"Name": name, "Rules": rules});
    let (status, _, body) = consul.request(
        "PUT",
        "/v1/acl/policy",
        &serde_json::to_vec(&policy).unwrap(),
    );
    assert_eq!(status, 200, "policy: {}", String::from_utf8_lossy(&body));
    let token = serde_json::json!({"Description": name, "Policies": [{"Name": name}]});
    let (status, _, body) =
        consul.request("PUT", "/v1/acl/token", &serde_json::to_vec(&token).unwrap());
    assert_eq!(status, 200, "token: {}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["SecretID"].as_str().expect("SecretID").to_string()
}

fn run(args: &Args, acl: Acl) -> AclRun {
    let started = Instant::now();
    eprintln!("==> ACLs {}", acl.label());
    let consul = match acl {
        Acl::Off => Consul::start(),
        Acl::On => Consul::start_acl(MASTER),
    };
    let dir = TempDir::new("consul-cost");
    let read_rule = format!("key_prefix \"{PREFIX}\" {{ policy = \"read\" }}");
    // The agent's token also reads the records beside the prefix, as the
    // runbook's policy does.
    let agent_rule = format!(
        "{read_rule}\nkey_prefix \"gitlab-haproxy-agent/state~meta/\" {{ policy = \"read\" }}"
    );
    // The agent's token reads the prefix, as the cookbook's does. `consul
    // watch` first asks /v1/agent/self (its connectivity check), which
    // needs agent:read; nothing after that does.
    let (agent_token, watch_token) = match acl {
        Acl::Off => (None, None),
        Acl::On => (
            Some(token(&consul, "agent-read", &agent_rule)),
            Some(token(
                &consul,
                "watch-read",
                &format!("{read_rule}\nagent_prefix \"\" {{ policy = \"read\" }}"),
            )),
        ),
    };
    // The store id the writer creates before its first write, as on a
    // fleet that uses it; then one PUT per key, as operators' writes come:
    // each key gets its own index, which matters to how well an answer
    // compresses (a transaction would give them all one).
    consul.put(&format!("{PREFIX}~store-id"), "5f0c2b1e9a7d4c3b");
    for i in 0..args.keys {
        write(
            &consul,
            args.records,
            &format!("web/web-{i:04}"),
            Some(&seed_value(i)),
        );
    }

    let token_file = dir.path().join("consul-token");
    let mut clients = Vec::new();
    for reads in [Reads::Default, Reads::Stale] {
        let proxy = CountingProxy::start(consul.addr());
        let mut extra = Vec::new();
        if reads == Reads::Stale {
            extra.extend(["--consistency", "stale"]);
        }
        if let Some(secret) = &agent_token {
            std::fs::write(&token_file, secret).unwrap();
            extra.extend(["--consul-token-file", token_file.to_str().unwrap()]);
        }
        let agent = Agent::spawn(&args.agent_bin, &proxy.url(), PREFIX, &extra);
        clients.push(Client {
            reads,
            proxy,
            watcher: Watcher::Agent(agent),
            fired_before: 0,
            log_start: 0,
            per_change: Vec::new(),
        });
        let proxy = CountingProxy::start(consul.addr());
        let watch = Watch::spawn(proxy.addr(), reads, watch_token.as_deref(), dir.path());
        clients.push(Client {
            reads,
            proxy,
            watcher: Watcher::Watch(watch),
            fired_before: 0,
            log_start: 0,
            per_change: Vec::new(),
        });
    }
    for client in &clients {
        match &client.watcher {
            Watcher::Agent(agent) => agent.wait_ready(Duration::from_secs(30)),
            Watcher::Watch(watch) => {
                let first = wait_every(Duration::from_secs(30), Duration::from_millis(20), || {
                    (watch.fired() >= 1).then_some(())
                });
                assert!(
                    first.is_some(),
                    "consul watch never ran its handler:\n{}",
                    watch.proc.log()
                );
            }
        }
    }
    let parked = wait_every(Duration::from_secs(30), Duration::from_millis(20), || {
        clients
            .iter()
            .all(|c| c.proxy.parked_for().is_some_and(|t| t >= QUIET))
            .then_some(())
    });
    assert!(
        parked.is_some(),
        "a client never parked on a blocking query"
    );

    let mut before: Vec<Totals> = clients.iter().map(|c| c.proxy.totals()).collect();
    for c in &mut clients {
        c.log_start = c.proxy.requests().len();
        if let Watcher::Watch(watch) = &c.watcher {
            c.fired_before = watch.fired();
        }
    }
    let mut unsettled = Vec::new();
    let first = before.clone();
    let changes_began = Instant::now();
    for (n, step) in MIX.iter().enumerate() {
        write(&consul, args.records, step.key, step.value);
        let (line, want) = (probe_line(step.key), reply_for(step.value));
        let t0 = Instant::now();
        let settled = wait_every(CHANGE_TIMEOUT, Duration::from_millis(20), || {
            clients
                .iter()
                .all(|c| c.settled(n + 1, &line, &want))
                .then_some(())
        });
        if settled.is_none() {
            let late: Vec<String> = clients
                .iter()
                .filter(|c| !c.settled(n + 1, &line, &want))
                .map(Client::name)
                .collect();
            eprintln!(
                "change {} ({:?} {}): not settled after {:?}: {}",
                n + 1,
                step.kind,
                step.key,
                CHANGE_TIMEOUT,
                late.join(", ")
            );
            unsettled.push(format!(
                "ACLs {}, change {} ({:?} {}): {}",
                acl.label(),
                n + 1,
                step.kind,
                step.key,
                late.join(", ")
            ));
        }
        for (c, b) in clients.iter_mut().zip(before.iter_mut()) {
            let now = c.proxy.totals();
            c.per_change.push(now - *b);
            *b = now;
        }
        eprintln!(
            "change {:2} {:<6} {:<16} settled in {:>5} ms; requests: {}",
            n + 1,
            format!("{:?}", step.kind).to_lowercase(),
            step.key,
            t0.elapsed().as_millis(),
            clients
                .iter()
                .map(|c| format!("{} {}", c.name(), c.per_change.last().unwrap().requests))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let changes_took = changes_began.elapsed();
    // The requests of the changes, before the idle window adds its own.
    let change_requests: Vec<Vec<Forwarded>> = clients
        .iter()
        .map(|c| c.proxy.requests().split_off(c.log_start))
        .collect();
    let idle: Option<Vec<(Totals, Duration)>> =
        (acl == Acl::Off && args.idle_secs > 0).then(|| {
            eprintln!("idle for {} s", args.idle_secs);
            let start: Vec<Totals> = clients.iter().map(|c| c.proxy.totals()).collect();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(args.idle_secs));
            let took = t0.elapsed();
            clients
                .iter()
                .zip(start)
                .map(|(c, s)| (c.proxy.totals() - s, took))
                .collect()
        });
    let measured = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if c.is_agent() && c.log().contains("ERROR") {
                eprintln!("{} logged errors:\n{}", c.name(), c.log());
            }
            Measured {
                name: c.name(),
                reads: c.reads,
                is_agent: c.is_agent(),
                per_change: c.per_change.clone(),
                requests: change_requests[i].clone(),
                changes: (before[i] - first[i], changes_took),
                idle: idle.as_ref().map(|v| v[i]),
            }
        })
        .collect();
    // Clients first (each agent and watch by its PID, then its proxy), so
    // none of them meets a Consul that is gone.
    drop(clients);
    drop(consul);
    AclRun {
        acl,
        clients: measured,
        unsettled,
        took: started.elapsed(),
    }
}

/// Sum of a client's changes of `kind` (all when `None`), and their count.
fn sum(client: &Measured, kind: Option<Kind>) -> (Totals, usize) {
    let mut total = Totals::default();
    let mut n = 0;
    for (t, s) in client.per_change.iter().zip(MIX.iter()) {
        if kind.is_none_or(|k| k == s.kind) {
            total += *t;
            n += 1;
        }
    }
    (total, n)
}

fn per(value: u64, n: usize) -> f64 {
    value as f64 / n.max(1) as f64
}

/// `12,345` from 12345.4.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.round());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", a / b)
    }
}

/// The request's path and query with the numbers in its query (indexes,
/// waits) as `N`.
fn shape(r: &Forwarded) -> String {
    let (path, query) = r
        .path_and_query
        .split_once('?')
        .unwrap_or((&r.path_and_query, ""));
    let mut out = format!("{} {path}", r.method);
    if !r.path_and_query.contains('?') {
        return out;
    }
    out.push('?');
    let mut in_number = false;
    for c in query.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

struct Table {
    rows: String,
    misses: Vec<String>,
    passes: usize,
}

impl Table {
    fn new() -> Table {
        Table {
            rows: String::from(
                "| ACLs | reads | figure | agent | consul watch | agent / consul watch | target | result |\n|---|---|---|---|---|---|---|---|\n",
            ),
            misses: Vec::new(),
            passes: 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        acl: Acl,
        reads: Reads,
        figure: &str,
        agent: String,
        watch: String,
        ratio: String,
        target: Option<(String, bool)>,
    ) {
        let (target, result) = match target {
            None => (String::new(), ""),
            Some((t, true)) => {
                self.passes += 1;
                (t, "PASS")
            }
            Some((t, false)) => {
                self.misses.push(format!(
                    "ACLs {}, {} reads, {figure}: {agent} (target {t})",
                    acl.label(),
                    reads.label()
                ));
                (t, "MISS")
            }
        };
        let _ = writeln!(
            self.rows,
            "| {} | {} | {figure} | {agent} | {watch} | {ratio} | {target} | {result} |",
            acl.label(),
            reads.label()
        );
    }
}

fn report(runs: &[AclRun], table: &mut Table, shapes: &mut String) {
    for run in runs {
        let acl = run.acl;
        for reads in [Reads::Default, Reads::Stale] {
            let pick = |agent: bool| {
                run.clients
                    .iter()
                    .find(|c| c.reads == reads && c.is_agent == agent)
                    .expect("client")
            };
            let (agent, watch) = (pick(true), pick(false));
            let (a, n) = sum(agent, None);
            let (w, _) = sum(watch, None);

            let (ar, wr) = (per(a.requests, n), per(w.requests, n));
            let target = match acl {
                Acl::Off => (
                    format!("<= {REQUESTS_ACL_OFF:.1}, <= consul watch"),
                    ar <= REQUESTS_ACL_OFF && ar <= wr,
                ),
                Acl::On => (format!("<= {REQUESTS_ACL_ON:.1}"), ar <= REQUESTS_ACL_ON),
            };
            table.row(
                acl,
                reads,
                &format!("requests per change ({n} changes)"),
                format!("{ar:.2}"),
                format!("{wr:.2}"),
                ratio(ar, wr),
                Some(target),
            );

            let by_kind = |c: &Measured, f: &dyn Fn(Totals) -> u64, fmt: &dyn Fn(f64) -> String| {
                Kind::ALL
                    .iter()
                    .map(|k| {
                        let (t, n) = sum(c, Some(*k));
                        fmt(per(f(t), n))
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let kind_ratio = |f: &dyn Fn(Totals) -> u64| {
                Kind::ALL
                    .iter()
                    .map(|k| {
                        let ((ta, na), (tw, nw)) = (sum(agent, Some(*k)), sum(watch, Some(*k)));
                        ratio(per(f(ta), na), per(f(tw), nw))
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let requests = |t: Totals| t.requests;
            let two = |v: f64| format!("{v:.2}");
            table.row(
                acl,
                reads,
                "requests per add / value change / delete",
                by_kind(agent, &requests, &two),
                by_kind(watch, &requests, &two),
                kind_ratio(&requests),
                None,
            );

            let (al, wl) = (per(a.leader_requests, n), per(w.leader_requests, n));
            let target = (reads == Reads::Stale)
                .then(|| (format!("stale: {LEADER_STALE:.0}"), al <= LEADER_STALE));
            table.row(
                acl,
                reads,
                "leader requests per change (no `stale` in the query)",
                format!("{al:.2}"),
                format!("{wl:.2}"),
                ratio(al, wl),
                target,
            );

            let both = |t: Totals| t.to_consul + t.from_consul;
            let (ab, wb) = (per(both(a), n), per(both(w), n));
            let target = (acl == Acl::Off).then(|| {
                (
                    format!("<= {BYTES_RATIO_ACL_OFF:.1}x consul watch"),
                    ab <= BYTES_RATIO_ACL_OFF * wb,
                )
            });
            table.row(
                acl,
                reads,
                "bytes per change, both ways",
                format!("{} B", thousands(ab)),
                format!("{} B", thousands(wb)),
                ratio(ab, wb),
                target,
            );
            let from = |t: Totals| t.from_consul;
            let to = |t: Totals| t.to_consul;
            table.row(
                acl,
                reads,
                "bytes per change, from Consul / to Consul",
                format!(
                    "{} / {} B",
                    thousands(per(a.from_consul, n)),
                    thousands(per(a.to_consul, n))
                ),
                format!(
                    "{} / {} B",
                    thousands(per(w.from_consul, n)),
                    thousands(per(w.to_consul, n))
                ),
                format!(
                    "{} / {}",
                    ratio(per(from(a), n), per(from(w), n)),
                    ratio(per(to(a), n), per(to(w), n))
                ),
                None,
            );
            let b = |v: f64| thousands(v);
            table.row(
                acl,
                reads,
                "bytes both ways per add / value change / delete",
                by_kind(agent, &both, &b),
                by_kind(watch, &both, &b),
                kind_ratio(&both),
                None,
            );
            table.row(
                acl,
                reads,
                "requests asking gzip; answers gzipped",
                format!("{} of {}; {}", a.asked_gzip, a.requests, a.gzip_answers),
                format!("{} of {}; {}", w.asked_gzip, w.requests, w.gzip_answers),
                String::new(),
                None,
            );
            table.row(
                acl,
                reads,
                "TCP connections opened over the changes",
                a.connections.to_string(),
                w.connections.to_string(),
                String::new(),
                None,
            );
            let minutes = |d: Duration| d.as_secs_f64() / 60.0;
            let checks_over = |c: &Measured| {
                if !c.is_agent {
                    return "-".to_string();
                }
                let (t, d) = c.changes;
                format!(
                    "{} in {:.0} s ({:.1}/min)",
                    t.checks,
                    d.as_secs_f64(),
                    t.checks as f64 / minutes(d)
                )
            };
            table.row(
                acl,
                reads,
                "index checks over the changes (in no figure above)",
                checks_over(agent),
                checks_over(watch),
                String::new(),
                None,
            );
            if let (Some((ai, ad)), Some((wi, wd))) = (agent.idle, watch.idle) {
                let reqs = |t: Totals, d: Duration| {
                    format!(
                        "{:.1} ({:.1} index checks + {:.1} other)",
                        (t.checks + t.requests) as f64 / minutes(d),
                        t.checks as f64 / minutes(d),
                        t.requests as f64 / minutes(d)
                    )
                };
                table.row(
                    acl,
                    reads,
                    &format!("idle: requests per minute ({:.0} s idle)", ad.as_secs_f64()),
                    reqs(ai, ad),
                    reqs(wi, wd),
                    String::new(),
                    None,
                );
                let bytes = |t: Totals, d: Duration| {
                    let checks = (t.checks_to_consul + t.checks_from_consul) as f64 / minutes(d);
                    let other = (t.to_consul + t.from_consul) as f64 / minutes(d);
                    format!(
                        "{} B ({} B index checks + {} B other)",
                        thousands(checks + other),
                        thousands(checks),
                        thousands(other)
                    )
                };
                table.row(
                    acl,
                    reads,
                    "idle: bytes per minute, both ways",
                    bytes(ai, ad),
                    bytes(wi, wd),
                    String::new(),
                    None,
                );
                let per_check = |t: Totals| {
                    if t.checks == 0 {
                        "-".to_string()
                    } else {
                        format!(
                            "{} / {} B",
                            thousands(per(t.checks_from_consul, t.checks as usize)),
                            thousands(per(t.checks_to_consul, t.checks as usize))
                        )
                    }
                };
                table.row(
                    acl,
                    reads,
                    "idle: bytes per index check, from Consul / to Consul",
                    per_check(ai),
                    per_check(wi),
                    String::new(),
                    None,
                );
            }

            for c in [agent, watch] {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for r in &c.requests {
                    *counts.entry(shape(r)).or_default() += 1;
                }
                let _ = writeln!(shapes, "ACLs {}, {}:", acl.label(), c.name);
                for (s, k) in counts {
                    let _ = writeln!(shapes, "  {k:>4}  {s}");
                }
            }
        }
    }
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if !args.bench {
        println!(
            "consul_cost benchmark: not run under cargo test; run ./scripts/bench.sh --consul-cost"
        );
        return;
    }
    if Command::new("consul").arg("version").output().is_err() {
        eprintln!("consul_cost: consul not found; run scripts/install-deps.sh first");
        std::process::exit(1);
    }
    assert!(
        args.agent_bin.is_file(),
        "no agent binary at {}; build it with cargo build --release",
        args.agent_bin.display()
    );
    let machine = machine();
    let load_before = load_average();
    let started = Instant::now();
    let runs = [run(&args, Acl::Off), run(&args, Acl::On)];
    let mut table = Table::new();
    let mut shapes = String::new();
    report(&runs, &mut table, &mut shapes);
    let took = started.elapsed().as_secs();
    let load_after = load_average();
    let unsettled: Vec<&String> = runs.iter().flat_map(|r| &r.unsettled).collect();
    let mut notes = format!(
        "{} keys under the prefix before the changes, writer records {}; ACLs off took {} s, on {} s.\n",
        args.keys,
        match args.records {
            Records::None => "none",
            Records::Sibling => "in each key's transaction under gitlab-haproxy-agent/state~meta/",
            Records::Below => "in each key's transaction under the prefix's ~meta/",
        },
        runs[0].took.as_secs(),
        runs[1].took.as_secs()
    );
    if unsettled.is_empty() {
        notes.push_str("Every change was taken by every client.\n");
    } else {
        let _ = writeln!(
            notes,
            "Changes not settled within {} s (their counts are partial): {}",
            CHANGE_TIMEOUT.as_secs(),
            unsettled
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let checks = format!(
        "Target checks: {} passed, {} missed{}",
        table.passes,
        table.misses.len(),
        if table.misses.is_empty() {
            String::new()
        } else {
            format!(":\n- {}", table.misses.join("\n- "))
        }
    );
    println!(
        "{}\n{notes}\nRequests over the 20 changes, by shape:\n\n{shapes}\n{checks}",
        table.rows
    );
    println!("run took {took} s; 1-minute load average {load_before} before, {load_after} after");
    if !args.no_record {
        let body = format!(
            "Recorded by `./scripts/bench.sh --consul-cost` in {took} s; 1-minute load average {load_before} before, {load_after} after.\n\n{machine}\n{}\n{notes}\n{checks}\n\nRequests over the 20 changes, by shape (numbers shown as N):\n\n```text\n{shapes}```\n",
            table.rows
        );
        record(BEGIN, END, &body);
    }
}
