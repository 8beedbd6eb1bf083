//! Fleet-scale benchmark: thousands of agents on a real three-server Consul
//! cluster with client agents, as production runs them (each agent reads
//! through a client agent; 100 agents per client agent here, where a load
//! balancer has its own). Not run in CI: `./scripts/bench.sh --fleet`.
//!
//! For each fleet size: the cold start (every agent spawned at once, until
//! each has applied its first sync), writes to a group key until every agent
//! has applied them (default and stale reads), with the CPU and bytes each
//! Consul server spent per write and the leader's share, 100 against 1,000
//! keys, and the storm after quorum is lost and comes back.
//!
//! When an agent applied a change is read from its own log (`desired state
//! applied`, `first Consul sync applied`, `Consul reachable again`, with
//! microsecond UTC timestamps), so the measurement costs the agents nothing
//! and its resolution does not shrink as the fleet grows; agent-checks on a
//! sample of agents confirm that the answers follow.
//!
//! With `--gprd`, instead: gprd's keyspace at each fleet size, 919 row keys
//! under one prefix without writer records and, in the same run on the same
//! cluster, under another prefix with each key's writer record
//! (beside the prefix, `<prefix without its />~meta/<key>`, written in the
//! key's transaction as the writer does),
//! default and stale reads: write apply times, and the servers' CPU and bytes
//! per write (recorded under its own section of BENCHMARKS.md).
//!
//! Options (after `--`): `--agent-bin PATH`, `--agents 1000,5000`,
//! `--writes N` (default 10), `--outage-secs S` (default 20), `--gprd`,
//! `--no-record`.
#![allow(dead_code)]

#[path = "../tests/support/mod.rs"]
mod harness;

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::cluster::{Cluster, Node};
use harness::{Proc, TempDir};

const PREFIX: &str = "bench/fleet/";
const RESULTS_BEGIN: &str = "<!-- bench:fleet:begin -->";
const RESULTS_END: &str = "<!-- bench:fleet:end -->";
const GPRD_BEGIN: &str = "<!-- bench:fleet-gprd:begin -->";
const GPRD_END: &str = "<!-- bench:fleet-gprd:end -->";
/// The prefix with writer records in `--gprd` runs.
const META_PREFIX: &str = "bench/fleet-meta/";
/// Row keys in `--gprd` runs: gprd's count.
const GPRD_ROWS: usize = 919;
/// Agents per client agent.
const PER_CLIENT: usize = 100;

#[derive(clap::Parser)]
#[command(
    name = "fleet",
    about = "Fleet-scale benchmark of gitlab-haproxy-agent"
)]
struct Args {
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/gitlab-haproxy-agent"))]
    agent_bin: PathBuf,
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    agents: Vec<usize>,
    /// Writes per measurement.
    #[arg(long, default_value_t = 10)]
    writes: usize,
    /// How long quorum is lost in the recovery storm, seconds.
    #[arg(long, default_value_t = 20)]
    outage_secs: u64,
    /// Print only; leave BENCHMARKS.md alone.
    #[arg(long)]
    no_record: bool,
    /// gprd's keyspace (919 row keys) without and with writer records,
    /// instead of the default run.
    #[arg(long)]
    gprd: bool,
    /// With --gprd: run only its fleets from FROM (0-based) to TO
    /// (exclusive), of four: no records default, stale; records default,
    /// stale.
    #[arg(long, default_value_t = 0)]
    gprd_from: usize,
    /// See --gprd-from.
    #[arg(long, default_value_t = 4)]
    gprd_to: usize,
    /// An option passed to every agent (repeatable), e.g.
    /// `--agent-arg=--index-check=0`.
    #[arg(long, allow_hyphen_values = true)]
    agent_arg: Vec<String>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `2026-12-01T09:07:02.093683Z` at the start of a log line, as Unix
/// seconds.
fn log_time(line: &str) -> Option<f64> {
    let t = line.get(..27)?;
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, s) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let frac: f64 = format!("0{}", t.get(19..26)?).parse().ok()?;
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60 + s) as f64 + frac)
}

/// One agent process, on its own loopback address.
struct FleetAgent {
    proc: Proc,
    listen: SocketAddr,
    log: PathBuf,
    read: u64,
}

impl FleetAgent {
    /// Times of the log lines (since the last [`FleetAgent::mark`]) that
    /// contain every one of `needles`.
    fn find(&self, needles: &[&str]) -> Option<f64> {
        let mut f = std::fs::File::open(&self.log).ok()?;
        f.seek(SeekFrom::Start(self.read)).ok()?;
        let mut text = String::new();
        f.read_to_string(&mut text).ok()?;
        text.lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .find_map(log_time)
    }

    /// Forgets the log so far: later [`FleetAgent::find`]s read only what
    /// comes after.
    fn mark(&mut self) {
        self.read = std::fs::metadata(&self.log).map_or(0, |m| m.len());
    }

    fn ask(&self, line: &str) -> String {
        let Ok(mut s) = TcpStream::connect_timeout(&self.listen, Duration::from_secs(2)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(format!("{line}\n").as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }
}

struct Fleet {
    agents: Vec<FleetAgent>,
    /// The prefix the agents watch.
    prefix: &'static str,
    /// Whether a write also writes the key's writer record, in one
    /// transaction, as the writer does.
    records: bool,
    dir: TempDir,
    spawned_at: f64,
    spawn_took: Duration,
}

impl Fleet {
    /// Spawns `n` agents, agent `i` on `127.250.(i / 250).(i % 250 + 1)`
    /// reading through client agent `i % clients`, as fast as they start.
    fn spawn(bin: &Path, cluster: &Cluster, n: usize, extra: &[&str]) -> Fleet {
        Fleet::spawn_on(bin, cluster, n, extra, PREFIX, false)
    }

    /// [`Fleet::spawn`] on `prefix`; `records`: writes carry the writer's
    /// record.
    fn spawn_on(
        bin: &Path,
        cluster: &Cluster,
        n: usize,
        extra: &[&str],
        prefix: &'static str,
        records: bool,
    ) -> Fleet {
        let dir = TempDir::new("fleet");
        let spawned_at = now();
        let t = Instant::now();
        let agents = (0..n)
            .map(|i| {
                let ip = Ipv4Addr::new(127, 250, (i / 250) as u8, (i % 250 + 1) as u8);
                let listen = SocketAddr::from((ip, 9777));
                let client = &cluster.clients[i % cluster.clients.len()];
                let log = dir.path().join(format!("agent-{i}.log"));
                let mut cmd = Command::new(bin);
                cmd.env_clear()
                    .env("RUST_LOG", "info")
                    .arg("--consul-addr")
                    .arg(client.url())
                    .arg("--prefix")
                    .arg(prefix)
                    .arg("--listen")
                    .arg(listen.to_string())
                    .arg("--http-listen")
                    .arg(SocketAddr::from((ip, 9778)).to_string())
                    .args(["--log-format", "text", "--startup-timeout", "300s"])
                    .args(extra);
                FleetAgent {
                    proc: Proc::spawn(cmd, log.clone()),
                    listen,
                    log,
                    read: 0,
                }
            })
            .collect();
        Fleet {
            agents,
            prefix,
            records,
            dir,
            spawned_at,
            spawn_took: t.elapsed(),
        }
    }

    /// Waits up to `timeout` until every agent's log has a line with all
    /// of `needles`; returns each agent's time (None: not within timeout).
    fn wait_all(&self, needles: &[&str], timeout: Duration) -> Vec<Option<f64>> {
        let deadline = Instant::now() + timeout;
        let mut found: Vec<Option<f64>> = vec![None; self.agents.len()];
        loop {
            for (i, a) in self.agents.iter().enumerate() {
                if found[i].is_none() {
                    found[i] = a.find(needles);
                }
            }
            if found.iter().all(Option::is_some) || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Log lines since the last mark containing `needle`, over all agents.
    fn count_lines(&self, needle: &str) -> usize {
        self.agents
            .iter()
            .map(|a| {
                let mut f = match std::fs::File::open(&a.log) {
                    Ok(f) => f,
                    Err(_) => return 0,
                };
                let _ = f.seek(SeekFrom::Start(a.read));
                let mut text = String::new();
                let _ = f.read_to_string(&mut text);
                text.matches(needle).count()
            })
            .sum()
    }

    fn mark(&mut self) {
        for a in &mut self.agents {
            a.mark();
        }
    }

    /// Asks `line` of every `step`-th agent; how many did not answer `want`.
    fn sample_wrong(&self, line: &str, want: &str, step: usize) -> usize {
        self.agents
            .iter()
            .step_by(step.max(1))
            .filter(|a| a.ask(line) != want)
            .count()
    }

    /// Proportional set size of all agents (shared pages of the binary
    /// counted once over all of them), KiB.
    fn pss_kib(&self) -> u64 {
        self.agents.iter().map(|a| pss_kib(a.proc.pid())).sum()
    }
}

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU ticks (utime + stime) and bytes written (`wchar`, sockets
/// included) of a process.
fn proc_cost(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let wchar = io
        .lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (ticks, wchar)
}

/// CPU ticks (utime + stime) of all of `pids`.
fn cpu_ticks(pids: impl Iterator<Item = u32>) -> u64 {
    pids.map(|p| proc_cost(p).0).sum()
}

fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Writes `PREFIX + key` through `node`; false when Consul refused.
fn put(node: &Node, key: &str, value: &str) -> bool {
    node.request("PUT", &format!("/v1/kv/{PREFIX}{key}"), value.as_bytes())
        .is_some_and(|(s, _, b)| s == 200 && b.trim_ascii() == b"true")
}

/// The writer's record of `value` (`~meta/<key>`), as the writer CLI
/// writes it.
fn record_of(value: &str) -> String {
    let at = now() as u64;
    format!(
        r#"{{"by":"fleet-bench","reason":"gprd-sized fleet benchmark","at":{at},"value":"{value}"}}"#
    )
}

/// `pairs` with the writer's record of each after it, when `records`.
fn with_records(pairs: &[(String, String)], records: bool) -> Vec<(String, String)> {
    pairs
        .iter()
        .flat_map(|(k, v)| {
            let mut out = vec![(k.clone(), v.clone())];
            if records {
                out.push((format!("~meta/{k}"), record_of(v)));
            }
            out
        })
        .collect()
}

/// Writes `key` of the fleet's prefix, with its record in the same
/// transaction when the fleet's writes carry records; false when Consul
/// refused.
fn put_fleet(node: &Node, fleet: &Fleet, key: &str, value: &str) -> bool {
    if !fleet.records && fleet.prefix == PREFIX {
        return put(node, key, value);
    }
    let ops = txn_ops(
        fleet.prefix,
        &with_records(&[(key.to_string(), value.to_string())], fleet.records),
    );
    node.request("PUT", "/v1/txn", &serde_json::to_vec(&ops).unwrap())
        .is_some_and(|(s, _, _)| s == 200)
}

/// `set` operations of `pairs` (keys relative to `prefix`); a writer record
/// (`~meta/<key>`) goes beside the prefix (`<prefix without its />~meta/<key>`),
/// where the writer CLI writes it, out of the agents' answers.
fn txn_ops(prefix: &str, pairs: &[(String, String)]) -> Vec<serde_json::Value> {
    use base64::Engine as _;
    let full = |k: &str| match k.strip_prefix("~meta/") {
        Some(rec) => format!("{}~meta/{rec}", prefix.trim_end_matches('/')),
        None => format!("{prefix}{k}"),
    };
    pairs
        .iter()
        .map(|(k, v)| {
            serde_json::json!({"KV": {"Verb": "set", "Key": full(k),
                "Value": base64::engine::general_purpose::STANDARD.encode(v)}})
        })
        .collect()
}

/// Writes `pairs` (relative keys) with `PUT /v1/txn`, 64 at a time.
fn put_many(node: &Node, pairs: &[(String, String)]) {
    put_many_on(node, PREFIX, pairs);
}

/// [`put_many`] under `prefix`.
fn put_many_on(node: &Node, prefix: &str, pairs: &[(String, String)]) {
    for chunk in pairs.chunks(64) {
        let ops = txn_ops(prefix, chunk);
        let body = serde_json::to_vec(&ops).unwrap();
        let ok = harness::wait_every(Duration::from_secs(60), Duration::from_millis(100), || {
            let (status, _, _) = node.request("PUT", "/v1/txn", &body)?;
            (status == 200).then_some(())
        });
        assert!(ok.is_some(), "PUT /v1/txn failed for 60 s");
    }
}

struct Report {
    rows: Vec<[String; 4]>,
}

impl Report {
    fn row(&mut self, scenario: &str, figure: &str, measured: String, target: &str) {
        eprintln!("  {scenario} | {figure} | {measured} | {target}");
        self.rows
            .push([scenario.into(), figure.into(), measured, target.into()]);
    }

    fn table(&self) -> String {
        let mut out = String::from("| fleet | figure | measured | target |\n|---|---|---|---|\n");
        for r in &self.rows {
            let _ = writeln!(out, "| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
        out
    }
}

/// Per-server cost over a window: CPU ms and bytes written.
fn servers_cost(cluster: &Cluster) -> Vec<(u64, u64)> {
    cluster.servers.iter().map(|s| proc_cost(s.pid())).collect()
}

/// `writes` writes of the group key, each waited for in every agent's log.
/// Reports all-applied p50/p99/max, per-agent p99, and the servers' cost.
fn writes(
    report: &mut Report,
    scenario: &str,
    cluster: &Cluster,
    fleet: &mut Fleet,
    writes: usize,
    target_p99_ms: f64,
) {
    let n = fleet.agents.len();
    let tck = clock_ticks();
    // Idle baseline over as long as the writes take.
    let window = Duration::from_millis(1500) * writes as u32;
    let before = servers_cost(cluster);
    std::thread::sleep(window.min(Duration::from_secs(10)));
    let idle: Vec<(u64, u64)> = servers_cost(cluster)
        .iter()
        .zip(&before)
        .map(|(a, b)| (a.0 - b.0, a.1 - b.1))
        .collect();
    let idle_secs = window.min(Duration::from_secs(10)).as_secs_f64();
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let before = servers_cost(cluster);
    let clients_before = cpu_ticks(cluster.clients.iter().map(Node::pid));
    let agents_before = cpu_ticks(fleet.agents.iter().map(|a| a.proc.pid()));
    let started = Instant::now();
    let mut all = Vec::new();
    let mut each = Vec::new();
    let mut missing = 0;
    let mut wrong = 0;
    let mut held = 0;
    let mut reissued = 0;
    let mut unconfirmed = 0;
    static WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..writes {
        let w = WRITES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let value = if w % 2 == 0 { "drain" } else { "maint" };
        fleet.mark();
        let t0 = now();
        let ok = harness::wait_every(Duration::from_secs(60), Duration::from_millis(50), || {
            put_fleet(cluster.client(0), fleet, "grp", value).then_some(())
        });
        assert!(ok.is_some(), "PUT grp={value} failed for 60 s");
        let times = fleet.wait_all(
            &[
                "desired state applied",
                "key=grp",
                &format!("value={value}"),
            ],
            Duration::from_secs(30),
        );
        let got: Vec<f64> = times.iter().flatten().map(|t| (t - t0) * 1000.0).collect();
        missing += n - got.len();
        if let Some(i) = times.iter().position(Option::is_none) {
            let log = std::fs::read_to_string(&fleet.agents[i].log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            eprintln!("agent {i} did not apply grp={value}: {tail:#?}");
        }
        held += fleet.count_lines("stale answer held");
        reissued += fleet.count_lines("re-issued");
        unconfirmed += fleet.count_lines("index check could not confirm");
        all.push(got.iter().copied().fold(0.0, f64::max));
        each.extend(got);
        wrong += fleet.sample_wrong("x/y grp", &format!("{value} 100%\n"), n / 50);
        std::thread::sleep(Duration::from_millis(1000));
    }
    let secs = started.elapsed().as_secs_f64();
    let clients_cpu = cpu_ticks(cluster.clients.iter().map(Node::pid)) - clients_before;
    let agents_cpu = cpu_ticks(fleet.agents.iter().map(|a| a.proc.pid())) - agents_before;
    let cost: Vec<(u64, u64)> = servers_cost(cluster)
        .iter()
        .zip(&before)
        .map(|(a, b)| (a.0 - b.0, a.1 - b.1))
        .collect();
    let all = sorted(all);
    let each = sorted(each);
    report.row(
        scenario,
        &format!("write to all {n} agents applied, {writes} writes: p50 / p99 / max"),
        format!(
            "{:.0} / {:.0} / {:.0} ms{}",
            quantile(&all, 0.5),
            quantile(&all, 0.99),
            all.last().copied().unwrap_or(f64::NAN),
            if missing > 0 {
                format!(" ({missing} agent-writes not applied in 30 s)")
            } else {
                String::new()
            }
        ),
        &format!("p99 < {target_p99_ms:.0} ms"),
    );
    report.row(
        scenario,
        "write to one agent applied: p50 / p99",
        format!(
            "{:.0} / {:.0} ms",
            quantile(&each, 0.5),
            quantile(&each, 0.99)
        ),
        "",
    );
    report.row(
        scenario,
        "agent-checks on every 50th agent after each write not answering it",
        wrong.to_string(),
        "0",
    );
    let per_server: Vec<String> = cost
        .iter()
        .zip(&idle)
        .enumerate()
        .map(|(i, (c, idle))| {
            let busy_ticks = c.0 as f64 - idle.0 as f64 * secs / idle_secs;
            let busy_bytes = c.1 as f64 - idle.1 as f64 * secs / idle_secs;
            format!(
                "s{}{}: {:.0} ms CPU, {:.0} kB",
                i + 1,
                if i == leader { " (leader)" } else { "" },
                (busy_ticks.max(0.0) / tck * 1000.0) / writes as f64,
                busy_bytes.max(0.0) / 1000.0 / writes as f64
            )
        })
        .collect();
    report.row(
        scenario,
        "CPU per write, idle included: all client agents / all agents",
        format!(
            "{:.0} ms / {:.0} ms",
            clients_cpu as f64 / tck * 1000.0 / writes as f64,
            agents_cpu as f64 / tck * 1000.0 / writes as f64
        ),
        "",
    );
    report.row(
        scenario,
        "each server per write, idle subtracted: CPU, bytes written",
        per_server.join("; "),
        "",
    );
    let via: Vec<String> = (0..cluster.clients.len())
        .map(|c| match cluster.server_of(c) {
            Some(s) => format!("s{}", s + 1),
            None => "?".into(),
        })
        .collect();
    report.row(
        scenario,
        "server each client agent reads through; stale answers held",
        format!("{}; {held}", via.join(" ")),
        "",
    );
    report.row(
        scenario,
        "index checks over the writes: reads re-issued / checks that could not confirm, per agent and write",
        format!(
            "{:.2} / {:.2}",
            reissued as f64 / (n * writes) as f64,
            unconfirmed as f64 / (n * writes) as f64
        ),
        "",
    );
    let total: f64 = cost.iter().map(|c| c.1 as f64).sum();
    let share = cost[leader].1 as f64 / total.max(1.0) * 100.0;
    report.row(
        scenario,
        "leader's share of the bytes the servers wrote",
        format!("{share:.0}%"),
        "stale: <= 40%",
    );
}

/// Spawns the fleet and measures the cold start.
fn cold_start(
    report: &mut Report,
    scenario: &str,
    bin: &Path,
    cluster: &Cluster,
    n: usize,
    extra: &[&str],
) -> Fleet {
    let fleet = Fleet::spawn(bin, cluster, n, extra);
    let synced = fleet.wait_all(&["first Consul sync applied"], Duration::from_secs(180));
    let done: Vec<f64> = synced.iter().flatten().copied().collect();
    let last = done.iter().copied().fold(0.0, f64::max) - fleet.spawned_at;
    let per_agent: Vec<f64> = fleet
        .agents
        .iter()
        .zip(&synced)
        .filter_map(|(a, s)| Some(s.as_ref()? - a.find(&["starting;"])?))
        .collect();
    let per_agent = sorted(per_agent);
    report.row(
        scenario,
        &format!(
            "cold start: {n} agents spawned in {:.1} s; all synced after",
            fleet.spawn_took.as_secs_f64()
        ),
        format!(
            "{last:.1} s ({} of {n} synced); own start to sync p50 / p99 {:.2} / {:.2} s",
            done.len(),
            quantile(&per_agent, 0.5),
            quantile(&per_agent, 0.99)
        ),
        "3,000: <= 15 s",
    );
    fleet
}

/// Quorum lost for `outage`, then back: time until every agent has read
/// Consul again, and a write's latency then.
fn storm(
    report: &mut Report,
    scenario: &str,
    cluster: &mut Cluster,
    fleet: &mut Fleet,
    outage: Duration,
) {
    let n = fleet.agents.len();
    fleet.mark();
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let other = (0..3).find(|s| *s != leader).unwrap();
    cluster.servers[leader].kill();
    cluster.servers[other].kill();
    std::thread::sleep(outage);
    cluster.servers[leader].start();
    cluster.servers[other].start();
    let t = Instant::now();
    cluster.wait_leader(Duration::from_secs(60));
    let back = now();
    let elected = t.elapsed();
    let w = Instant::now();
    let ok = harness::wait_every(Duration::from_secs(30), Duration::from_millis(50), || {
        put(cluster.client(0), "grp", "ready").then_some(())
    });
    assert!(ok.is_some(), "no write after quorum came back");
    let put_took = w.elapsed();
    let times = fleet.wait_all(
        &["desired state applied", "key=grp", "value=ready"],
        Duration::from_secs(120),
    );
    let got: Vec<f64> = times.iter().flatten().map(|t| t - back).collect();
    let got = sorted(got);
    report.row(
        scenario,
        &format!("quorum lost {} s, back (leader after {:.1} s): every agent applied a write made then, after", outage.as_secs(), elected.as_secs_f64()),
        format!(
            "p50 / p99 / max {:.1} / {:.1} / {:.1} s ({} of {n}); the write took {:.0} ms",
            quantile(&got, 0.5),
            quantile(&got, 0.99),
            got.last().copied().unwrap_or(f64::NAN),
            got.len(),
            put_took.as_secs_f64() * 1000.0
        ),
        "3,000: <= 15 s",
    );
    cluster.wait_formed(Duration::from_secs(60));
}

fn consul_rss_kib(cluster: &Cluster) -> u64 {
    cluster
        .servers
        .iter()
        .chain(&cluster.clients)
        .map(|n| status_kib(n.pid(), "VmRSS"))
        .sum()
}

fn run(args: &Args, n: usize, report: &mut Report) {
    let clients = n.div_ceil(PER_CLIENT).max(3);
    eprintln!("== {n} agents, {clients} client agents");
    let mut cluster = Cluster::start_with(clients as u8, 5);
    let keys: Vec<(String, String)> = (0..99)
        .map(|i| {
            (
                format!("web/web-{i:03}"),
                if i % 10 == 0 { "maint" } else { "ready" }.to_string(),
            )
        })
        .chain([("grp".to_string(), "ready".to_string())])
        .collect();
    put_many(cluster.client(0), &keys);
    let name = format!("{n}");

    let mut fleet = cold_start(
        report,
        &format!("{name}, default"),
        &args.agent_bin,
        &cluster,
        n,
        &[],
    );
    report.row(
        &name,
        "memory: agents (PSS) / Consul (RSS of the 3 servers and the client agents)",
        format!(
            "{:.0} MB / {:.0} MB",
            fleet.pss_kib() as f64 / 1024.0,
            consul_rss_kib(&cluster) as f64 / 1024.0
        ),
        "",
    );
    let target = if n <= 1000 { 250.0 } else { 2000.0 };
    writes(
        report,
        &format!("{name}, default, 100 keys"),
        &cluster,
        &mut fleet,
        args.writes,
        target,
    );
    drop(fleet);

    let mut fleet = cold_start(
        report,
        &format!("{name}, stale"),
        &args.agent_bin,
        &cluster,
        n,
        &["--consistency", "stale"],
    );
    writes(
        report,
        &format!("{name}, stale, 100 keys"),
        &cluster,
        &mut fleet,
        args.writes,
        target,
    );
    if n <= 1000 {
        let more: Vec<(String, String)> = (0..900)
            .map(|i| (format!("big/s{i:04}"), "ready".to_string()))
            .collect();
        put_many(cluster.client(0), &more);
        std::thread::sleep(Duration::from_secs(5));
        writes(
            report,
            &format!("{name}, stale, 1,000 keys"),
            &cluster,
            &mut fleet,
            args.writes,
            target,
        );
    }
    // Last: after it, every client agent reads through the server that
    // stayed up, until its periodic rebalance (minutes).
    storm(
        report,
        &format!("{name}, stale"),
        &mut cluster,
        &mut fleet,
        Duration::from_secs(args.outage_secs),
    );
    drop(fleet);
}

/// gprd's keyspace: [`GPRD_ROWS`] row keys under [`PREFIX`] without
/// records and under [`META_PREFIX`] with each key's record, default then
/// stale reads on each, on one cluster.
fn run_gprd(args: &Args, n: usize, report: &mut Report) {
    let clients = n.div_ceil(PER_CLIENT).max(3);
    eprintln!("== gprd keyspace, {n} agents, {clients} client agents");
    let cluster = Cluster::start_with(clients as u8, 5);
    let rows: Vec<(String, String)> = (0..GPRD_ROWS - 1)
        .map(|i| {
            (
                format!("web/web-{i:04}"),
                if i % 10 == 0 { "maint" } else { "ready" }.to_string(),
            )
        })
        .chain([("grp".to_string(), "ready".to_string())])
        .collect();
    put_many_on(cluster.client(0), PREFIX, &rows);
    put_many_on(cluster.client(0), META_PREFIX, &with_records(&rows, true));
    let target = if n <= 1000 { 250.0 } else { 2000.0 };
    let mut fleets = 0;
    for (prefix, records, what) in [
        (PREFIX, false, format!("{GPRD_ROWS} keys")),
        (
            META_PREFIX,
            true,
            format!("{GPRD_ROWS} keys + {GPRD_ROWS} records"),
        ),
    ] {
        for (reads, extra) in [
            ("default", &[][..]),
            ("stale", &["--consistency", "stale"][..]),
        ] {
            fleets += 1;
            if fleets <= args.gprd_from || fleets > args.gprd_to {
                continue;
            }
            let mut extra: Vec<&str> = extra.to_vec();
            extra.extend(args.agent_arg.iter().map(String::as_str));
            let fleet = Fleet::spawn_on(&args.agent_bin, &cluster, n, &extra, prefix, records);
            let synced = fleet.wait_all(&["first Consul sync applied"], Duration::from_secs(300));
            let done = synced.iter().flatten().count();
            let last = synced.iter().flatten().copied().fold(0.0, f64::max) - fleet.spawned_at;
            report.row(
                &format!("{n}, {reads}, {what}"),
                "cold start: all synced after",
                format!("{last:.1} s ({done} of {n} synced)"),
                "",
            );
            let mut fleet = fleet;
            writes(
                report,
                &format!("{n}, {reads}, {what}"),
                &cluster,
                &mut fleet,
                args.writes,
                target,
            );
            drop(fleet);
        }
    }
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if !args.bench {
        println!("fleet benchmark: not run under cargo test; run ./scripts/bench.sh --fleet");
        return;
    }
    assert!(
        args.agent_bin.is_file(),
        "no agent binary at {}",
        args.agent_bin.display()
    );
    let started = Instant::now();
    let mut report = Report { rows: Vec::new() };
    for &n in &args.agents {
        if args.gprd {
            run_gprd(&args, n, &mut report);
        } else {
            run(&args, n, &mut report);
        }
    }
    let table = report.table();
    println!("{table}");
    if !args.no_record {
        let body = format!(
            "Recorded by `./scripts/bench.sh --fleet{}{} --agents {}` in {} s.\n\n{table}",
            if args.gprd { " --gprd" } else { "" },
            args.agent_arg
                .iter()
                .map(|a| format!(" --agent-arg={a}"))
                .collect::<String>(),
            args.agents
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            started.elapsed().as_secs()
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let (begin, end) = if args.gprd {
            (GPRD_BEGIN, GPRD_END)
        } else {
            (RESULTS_BEGIN, RESULTS_END)
        };
        let block = format!("{begin}\n{body}{end}");
        let new = match (text.find(begin), text.find(end)) {
            (Some(b), Some(e)) if e > b => {
                format!("{}{block}{}", &text[..b], &text[e + end.len()..])
            }
            _ => format!("{}\n\n{block}\n", text.trim_end()),
        };
        std::fs::write(&path, new).expect("write BENCHMARKS.md");
    }
}
