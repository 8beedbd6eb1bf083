//! Benchmark of the agent against its targets: responder cost against a
//! floor responder, footprint, convergence (100 agents, and a real HAProxy
//! with 1,000 enrolled rows), Consul load, and, behind `--soak`, a 10-minute
//! soak. Everything runs on loopback against a real Consul, a real HAProxy
//! and the release agent binary; prints one table and records it in
//! BENCHMARKS.md. Run it with `./scripts/bench.sh [--soak]`.
//!
//! Options (after `--`): `--agent-bin PATH` (default
//! `target/release/gitlab-haproxy-agent`), `--soak`, `--soak-secs N`
//! (default 600), `--quick` (short phases for a smoke run; records nothing),
//! `--no-record`, `--responder` (only the footprint and the responder cost,
//! `--runs N` times, default 3, plus instructions per check under
//! callgrind). `--floor ADDR` runs only the floor responder (the
//! benchmark starts it so); `--load ADDR [--rate R] [--secs S]` runs only the
//! load generator against a responder started by hand, for profiling.

mod support;

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use support::junk::{self, Junk, JunkSpec};
use support::load::{self, quantile, LoadResult, LoadSpec};
use support::report::{machine, record};
use support::{
    ask, context_switches, cpu_us, fd_count, free_port, load_average, metric_sum, status_kib,
    thread_count, wait_every, AdminStates, Agent, Consul, Haproxy, Proc, TempDir,
};

const DEFAULT_PREFIX: &str = "gitlab-haproxy-agent/state/";
/// The agent's default `--min-query-interval`: at most 10 Consul requests/s.
const MIN_QUERY_INTERVAL: Duration = Duration::from_millis(100);
/// The rate of the fixed-rate phase and of the p99 target.
const TARGET_RATE: f64 = 5_000.0;
/// Client threads in the fixed-rate phase (paced, so few are busy at once).
const PACED_THREADS: usize = 8;
/// Client threads in the max-rate phase.
const MAX_THREADS: usize = 4;
/// The most CPU per check the agent may use, as a multiple of the epoll
/// floor's (the median over the runs).
const CPU_RATIO_TARGET: f64 = 1.2;
const RESULTS_BEGIN: &str = "<!-- bench:results:begin -->";
const RESULTS_END: &str = "<!-- bench:results:end -->";
const RESPONDER_BEGIN: &str = "<!-- bench:responder:begin -->";
const RESPONDER_END: &str = "<!-- bench:responder:end -->";
const SOAK_BEGIN: &str = "<!-- bench:soak:begin -->";
const SOAK_END: &str = "<!-- bench:soak:end -->";
const HOSTILE_BEGIN: &str = "<!-- bench:hostile:begin -->";
const HOSTILE_END: &str = "<!-- bench:hostile:end -->";
/// The most CPU per answered check the agent may use beside the hostile
/// clients, as a multiple of the same run's figure without them.
const HOSTILE_CPU_RATIO_TARGET: f64 = 1.5;
/// The slowest a probe may be at the 99th percentile beside them, in ms.
const HOSTILE_PROBE_P99_MS: f64 = 100.0;

/// The benchmark's options (after `--` with cargo bench); an unknown or
/// malformed option is refused with clap's message and exit status 2.
#[derive(clap::Parser)]
#[command(
    name = "bench",
    about = "Benchmark of gitlab-haproxy-agent against its targets"
)]
struct Args {
    /// Set by `cargo bench`; `cargo test --all-targets` runs this binary
    /// without it, and then it only says how to run it.
    #[arg(long, hide = true)]
    bench: bool,
    /// Run only the floor (epoll) responder on this address.
    #[arg(long, value_name = "ADDR")]
    floor: Option<SocketAddr>,
    /// Run only the tokio floor responder on this address.
    #[arg(long, value_name = "ADDR")]
    floor_tokio: Option<SocketAddr>,
    /// Run only the load generator against a responder at this address.
    #[arg(long, value_name = "ADDR")]
    load: Option<SocketAddr>,
    /// With --load: checks per second (default: as fast as it can).
    #[arg(long)]
    rate: Option<f64>,
    /// With --load: seconds to run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// The agent binary under test.
    #[arg(long, value_name = "PATH", default_value_os_t = default_agent_bin())]
    agent_bin: PathBuf,
    /// Run the soak instead of the benchmark.
    #[arg(long)]
    soak: bool,
    /// Length of the soak, in seconds.
    #[arg(long, default_value_t = 600)]
    soak_secs: u64,
    /// Run only the footprint and the responder cost (`--runs` times, and
    /// instructions per check under callgrind) and record them in the
    /// "Responder cost rerun" section instead of "Results".
    #[arg(long, conflicts_with = "soak")]
    responder: bool,
    /// Runs of the responder cost phase; the figures are their median and
    /// spread. Default 3 with --responder, else 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: Option<u32>,
    /// An earlier agent binary to measure beside the one under test, in the
    /// same alternating slices (responder cost and callgrind only).
    #[arg(long, value_name = "PATH")]
    baseline_bin: Option<PathBuf>,
    /// Run only the hostile-clients phase (agent-checks at 5,000/s beside
    /// idle, one-byte and slow-reading clients and a stream of new lines)
    /// and record it in the "Hostile clients" section.
    #[arg(long, conflicts_with_all = ["soak", "responder"])]
    hostile: bool,
    /// Short phases for a smoke run; records nothing.
    #[arg(long)]
    quick: bool,
    /// Print the table without recording it in BENCHMARKS.md.
    #[arg(long)]
    no_record: bool,
}

impl Args {
    /// Whether to write the results into BENCHMARKS.md.
    fn record(&self) -> bool {
        !self.quick && !self.no_record
    }
}

fn default_agent_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/gitlab-haproxy-agent")
}

/// Whether a figure met its target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Miss,
    Info,
}

struct Row {
    section: &'static str,
    figure: String,
    measured: String,
    target: String,
    verdict: Verdict,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn info(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        measured: impl Into<String>,
    ) {
        self.rows.push(Row {
            section,
            figure: figure.into(),
            measured: measured.into(),
            target: String::new(),
            verdict: Verdict::Info,
        });
    }

    fn judge(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        measured: impl Into<String>,
        target: impl Into<String>,
        pass: bool,
    ) {
        self.rows.push(Row {
            section,
            figure: figure.into(),
            measured: measured.into(),
            target: target.into(),
            verdict: if pass { Verdict::Pass } else { Verdict::Miss },
        });
    }

    fn table(&self) -> String {
        let mut out = String::from(
            "| section | figure | measured | target | result |\n|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            let verdict = match r.verdict {
                Verdict::Pass => "PASS",
                Verdict::Miss => "MISS",
                Verdict::Info => "",
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.section, r.figure, r.measured, r.target, verdict
            );
        }
        out
    }

    fn misses(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Miss)
            .count()
    }
}

/// Figures the on-paper scale section is computed from.
#[derive(Default)]
struct Figures {
    bytes_1k: usize,
    bytes_10k: usize,
    read_ms_1k: f64,
    read_ms_10k: f64,
    agent_rss_10k_kib: u64,
    conv_p99_ms: f64,
    churn_rate_small: f64,
    churn_rate_10k: f64,
    churn_agent_cpu_10k: f64,
    churn_consul_cpu_10k: f64,
}

fn section(name: &str) {
    eprintln!("==> {name}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The floor responder, as a separate process so /proc accounts its CPU.
struct Floor {
    proc: Proc,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Floor {
    /// `flag` is `--floor` (epoll) or `--floor-tokio`.
    fn start(flag: &str) -> Floor {
        let dir = TempDir::new("floor");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.arg(flag).arg(addr.to_string());
        let proc = Proc::spawn(cmd, dir.path().join("floor.log"));
        let up = wait_every(Duration::from_secs(10), Duration::from_millis(20), || {
            TcpStream::connect(addr).ok()
        });
        assert!(
            up.is_some(),
            "floor responder did not start:\n{}",
            proc.log()
        );
        Floor {
            proc,
            addr,
            _dir: dir,
        }
    }
}

/// Runs `spec` against `addr` and returns the result and the CPU time the
/// process `pid` used meanwhile, in nanoseconds: the run time of all its
/// threads from /proc/PID/task/*/schedstat (exact; utime + stime would move
/// in 10 ms ticks), so other work on the machine enters only through what
/// it does to the responder's caches and scheduling, not as wall time.
fn measured(pid: u32, addr: SocketAddr, spec: &LoadSpec) -> (LoadResult, u64) {
    let before = support::cpu_ns_threads(pid);
    let result = load::run(addr, spec, &AtomicBool::new(false));
    let after = support::cpu_ns_threads(pid);
    (result, after.saturating_sub(before))
}

fn wait_keys(agent: &Agent, keys: usize) {
    let ok = wait_every(Duration::from_secs(30), Duration::from_millis(50), || {
        (agent.metric_sum("gitlab_haproxy_agent_keys") as usize == keys).then_some(())
    });
    assert!(ok.is_some(), "agent did not reach {keys} keys");
}

fn state_value(i: usize) -> String {
    match i % 4 {
        0 => "drain".into(),
        1 => "ready".into(),
        2 => "maint".into(),
        _ => format!("{}%", i % 100),
    }
}

fn reply_for(value: &str) -> String {
    match value {
        "ready" | "drain" | "maint" => format!("{value} 100%\n"),
        weight => format!("ready {weight}\n"),
    }
}

/// Footprint: resident memory with 0, 1,000 and 10,000 keys, and CPU and
/// Consul requests while idle. Returns the agent (kept for the long idle
/// window) with its request count and the time the window started.
fn footprint(
    args: &Args,
    consul: &Consul,
    report: &mut Report,
    figs: &mut Figures,
) -> (Agent, f64, Instant) {
    section("footprint");
    const S: &str = "footprint";
    let prefix = "bench/footprint/";
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), prefix, &[]);
    agent.wait_ready(Duration::from_secs(30));
    let rows: Vec<String> = (0..1000)
        .map(|i| format!("be{:02}/srv-{i:05} canary", i % 50))
        .collect();
    // HAProxy asks about every row between measurements, so the rows-seen
    // table is part of what is held.
    let ask_all = |agent: &Agent| {
        for r in &rows {
            let _ = agent.ask(r);
        }
    };
    let settle = Duration::from_secs(if args.quick { 1 } else { 2 });
    ask_all(&agent);
    std::thread::sleep(settle);
    let rss0 = status_kib(agent.pid(), "VmRSS");
    let keys: Vec<(String, String)> = (0..10_000)
        .map(|i| {
            (
                format!("{prefix}be{:02}/srv-{i:05}", i % 50),
                state_value(i),
            )
        })
        .collect();
    consul.put_many(&keys[..1000]);
    wait_keys(&agent, 1000);
    ask_all(&agent);
    std::thread::sleep(settle);
    let rss1k = status_kib(agent.pid(), "VmRSS");
    let (bytes_1k, took_1k) = median_read(consul, prefix);
    consul.put_many(&keys[1000..]);
    wait_keys(&agent, 10_000);
    ask_all(&agent);
    std::thread::sleep(settle);
    let rss10k = status_kib(agent.pid(), "VmRSS");
    let hwm = status_kib(agent.pid(), "VmHWM");
    let (bytes_10k, took_10k) = median_read(consul, prefix);
    figs.bytes_1k = bytes_1k;
    figs.bytes_10k = bytes_10k;
    figs.read_ms_1k = ms(took_1k);
    figs.read_ms_10k = ms(took_10k);
    figs.agent_rss_10k_kib = rss10k;
    report.info(
        S,
        "resident memory (VmRSS), 0 keys, 1,000 rows asked",
        mib(rss0),
    );
    report.info(S, "resident memory, 1,000 keys", mib(rss1k));
    report.judge(
        S,
        "resident memory, 10,000 keys",
        mib(rss10k),
        "< 16 MiB",
        rss10k < 16 * 1024,
    );
    report.info(
        S,
        "peak resident memory (VmHWM) after 10,000 keys",
        mib(hwm),
    );
    report.info(S, "threads", thread_count(agent.pid()).to_string());

    let idle = Duration::from_secs(if args.quick { 5 } else { 30 });
    std::thread::sleep(settle);
    let requests0 = agent.metric_sum("gitlab_haproxy_agent_consul_requests_total");
    let window_start = Instant::now();
    let cpu0 = support::cpu_ns_threads(agent.pid());
    let ticks0 = cpu_us(agent.pid());
    let cs0 = context_switches(agent.pid());
    std::thread::sleep(idle);
    let cpu1 = support::cpu_ns_threads(agent.pid());
    let ticks1 = cpu_us(agent.pid());
    let cs1 = context_switches(agent.pid());
    let requests1 = agent.metric_sum("gitlab_haproxy_agent_consul_requests_total");
    let secs = idle.as_secs_f64();
    // Share of one core, from the exact per-thread run time.
    let share = (cpu1 - cpu0) as f64 / 1e9 / secs;
    report.judge(
        S,
        format!("CPU while idle, 10,000 keys, quiet Consul, over {secs:.0} s"),
        format!(
            "{:.1} ms, {:.0} µs/s ({:.4}% of a core); utime+stime moved {} ms",
            (cpu1 - cpu0) as f64 / 1e6,
            (cpu1 - cpu0) as f64 / 1e3 / secs,
            share * 100.0,
            (ticks1 - ticks0) / 1000
        ),
        "no measurable use: < 0.1% of a core (top shows 0.0)",
        share < 0.001,
    );
    report.info(
        S,
        "wake-ups while idle (context switches, all threads)",
        format!("{:.1}/s", (cs1 - cs0) as f64 / secs),
    );
    let requests = requests1 - requests0;
    // A blocking query with --wait 60s returns at most once per wait (plus
    // Consul's jitter) when nothing changes.
    let allowed = (secs / 60.0).ceil();
    report.judge(
        S,
        format!("Consul requests while idle, over {secs:.0} s"),
        format!("{requests:.0}"),
        format!("no polling: <= {allowed:.0} (one per --wait 60s)"),
        requests <= allowed,
    );
    (agent, requests0, window_start)
}

/// The median of three full reads of `prefix`: (bytes, time).
fn median_read(consul: &Consul, prefix: &str) -> (usize, Duration) {
    let mut reads: Vec<(usize, Duration)> = (0..3).map(|_| consul.read_prefix(prefix)).collect();
    reads.sort_by_key(|r| r.1);
    reads[1]
}

/// CPU per answered check of the agent and the two floors in one phase of
/// one run, in microseconds, with the load results they come from.
struct PhaseRun {
    agent: LoadResult,
    floor: LoadResult,
    tokio: LoadResult,
    agent_us: f64,
    floor_us: f64,
    tokio_us: f64,
    /// The `--baseline-bin` agent, when given.
    baseline: Option<(LoadResult, f64)>,
}

/// `values` as "median" or, with several, "median (min to max, N runs)".
fn spread(values: &[f64], unit: &str, digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = quantile(&v, 0.5);
    if v.len() < 2 {
        return format!("{median:.digits$}{unit}");
    }
    format!(
        "{median:.digits$}{unit} (runs: {}; spread {:.digits$} to {:.digits$}{unit})",
        values
            .iter()
            .map(|x| format!("{x:.digits$}"))
            .collect::<Vec<_>>()
            .join(", "),
        v[0],
        v[v.len() - 1],
    )
}

/// The median of `values`.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

/// Responder cost: the agent and the floor under the same closed-loop
/// generator, paced to 5,000 checks/s and then as fast as they answer;
/// `runs` times over, each run its own alternating slices.
fn responder(args: &Args, consul: &Consul, report: &mut Report, runs: usize) {
    section("responder cost");
    const S: &str = "responder";
    let keys: Vec<(String, String)> = (0..100)
        .map(|i| {
            (
                format!("{DEFAULT_PREFIX}web/web-{i:04}"),
                "ready".to_string(),
            )
        })
        .collect();
    consul.put_many(&keys);
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), DEFAULT_PREFIX, &[]);
    agent.wait_ready(Duration::from_secs(30));
    wait_keys(&agent, 100);
    let baseline = args.baseline_bin.as_ref().map(|bin| {
        let b = Agent::spawn(bin, &consul.url(), DEFAULT_PREFIX, &[]);
        b.wait_ready(Duration::from_secs(30));
        wait_keys(&b, 100);
        b
    });
    let floor = Floor::start("--floor");
    let tokio_floor = Floor::start("--floor-tokio");
    let lines = check_lines();
    let expect = Some(support::floor::REPLY);
    let slice = Duration::from_secs(if args.quick { 2 } else { 5 });
    let rounds = if args.quick { 1 } else { 2 };
    let spec = |rate: Option<f64>, threads: usize, duration: Duration| LoadSpec {
        threads,
        duration,
        rate,
        lines: lines.clone(),
        expect,
    };
    // Warm both: connections, the rows-seen table, allocator pools.
    let warm = spec(None, MAX_THREADS, Duration::from_secs(1));
    let _ = measured(agent.pid(), agent.listen, &warm);
    if let Some(b) = &baseline {
        let _ = measured(b.pid(), b.listen, &warm);
    }
    let _ = measured(floor.proc.pid(), floor.addr, &warm);
    let _ = measured(tokio_floor.proc.pid(), tokio_floor.addr, &warm);

    let phases = [
        ("5,000 checks/s", Some(TARGET_RATE), PACED_THREADS),
        ("max rate", None, MAX_THREADS),
    ];
    let mut results: Vec<Vec<PhaseRun>> = phases.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        if runs > 1 {
            section(&format!("responder cost: run {} of {runs}", run + 1));
        }
        for (p, (_, rate, threads)) in phases.iter().enumerate() {
            let (mut a, mut f, mut t) = (
                LoadResult::default(),
                LoadResult::default(),
                LoadResult::default(),
            );
            let (mut a_cpu, mut f_cpu, mut t_cpu) = (0u64, 0u64, 0u64);
            let mut b = baseline.as_ref().map(|_| (LoadResult::default(), 0u64));
            // Alternate the responders in slices so background load hits all.
            for _ in 0..rounds {
                let (r, c) = measured(agent.pid(), agent.listen, &spec(*rate, *threads, slice));
                a.merge(r);
                a_cpu += c;
                if let (Some(agent), Some((res, cpu))) = (&baseline, &mut b) {
                    let (r, c) = measured(agent.pid(), agent.listen, &spec(*rate, *threads, slice));
                    res.merge(r);
                    *cpu += c;
                }
                let (r, c) = measured(floor.proc.pid(), floor.addr, &spec(*rate, *threads, slice));
                f.merge(r);
                f_cpu += c;
                let (r, c) = measured(
                    tokio_floor.proc.pid(),
                    tokio_floor.addr,
                    &spec(*rate, *threads, slice),
                );
                t.merge(r);
                t_cpu += c;
            }
            let per_check = |ns: u64, r: &LoadResult| ns as f64 / 1e3 / r.answered.max(1) as f64;
            results[p].push(PhaseRun {
                agent_us: per_check(a_cpu, &a),
                floor_us: per_check(f_cpu, &f),
                tokio_us: per_check(t_cpu, &t),
                baseline: b.map(|(res, cpu)| {
                    let us = per_check(cpu, &res);
                    (res, us)
                }),
                agent: a,
                floor: f,
                tokio: t,
            });
        }
    }
    let runs_note = if runs > 1 {
        format!(", {runs} runs")
    } else {
        String::new()
    };
    for ((phase, rate, threads), phase_runs) in phases.iter().zip(results) {
        let (mut a, mut f, mut t) = (
            LoadResult::default(),
            LoadResult::default(),
            LoadResult::default(),
        );
        let (mut a_us, mut f_us, mut t_us) = (Vec::new(), Vec::new(), Vec::new());
        let (mut b, mut b_us) = (LoadResult::default(), Vec::new());
        for r in phase_runs {
            if let Some((res, us)) = r.baseline {
                b.merge(res);
                b_us.push(us);
            }
            a_us.push(r.agent_us);
            f_us.push(r.floor_us);
            t_us.push(r.tokio_us);
            a.merge(r.agent);
            f.merge(r.floor);
            t.merge(r.tokio);
        }
        let ratios: Vec<f64> = a_us.iter().zip(&f_us).map(|(a, f)| a / f).collect();
        let tokio_ratios: Vec<f64> = t_us.iter().zip(&f_us).map(|(t, f)| t / f).collect();
        let agent_tokio: Vec<f64> = a_us.iter().zip(&t_us).map(|(a, t)| a / t).collect();
        let ratio = median(&ratios);
        let who = |r: &LoadResult| {
            format!(
                "{:.0} checks/s, p50 {:.3} / p99 {:.3} / p99.9 {:.3} ms, {} failed",
                r.rate(),
                r.quantile_ms(0.50),
                r.quantile_ms(0.99),
                r.quantile_ms(0.999),
                r.failed
            )
        };
        let label = format!("{phase}, {threads} client threads{runs_note}");
        if rate.is_some() {
            report.judge(
                S,
                format!("agent, {label}"),
                who(&a),
                "5,000 checks/s, p99 < 2 ms, none failed",
                a.rate() >= TARGET_RATE * 0.98 && a.quantile_ms(0.99) < 2.0 && a.failed == 0,
            );
        } else {
            report.judge(
                S,
                format!("agent, {label}"),
                who(&a),
                "none failed",
                a.failed == 0,
            );
        }
        if !b_us.is_empty() {
            report.info(S, format!("baseline agent, {label}"), who(&b));
        }
        report.info(S, format!("floor (epoll), {label}"), who(&f));
        report.info(S, format!("tokio floor, {label}"), who(&t));
        report.info(
            S,
            format!("agent CPU per answered check, {phase}"),
            spread(&a_us, " µs", 1),
        );
        if !b_us.is_empty() {
            let b_ratios: Vec<f64> = b_us.iter().zip(&f_us).map(|(b, f)| b / f).collect();
            let a_b: Vec<f64> = a_us.iter().zip(&b_us).map(|(a, b)| a / b).collect();
            report.info(
                S,
                format!("baseline agent CPU per answered check, {phase}"),
                spread(&b_us, " µs", 1),
            );
            report.info(
                S,
                format!("CPU per check baseline agent/floor, {phase}"),
                spread(&b_ratios, "x", 2),
            );
            report.info(
                S,
                format!("CPU per check agent/baseline agent, {phase}"),
                spread(&a_b, "x", 2),
            );
        }
        report.info(
            S,
            format!("floor (epoll) CPU per answered check, {phase}"),
            spread(&f_us, " µs", 1),
        );
        report.info(
            S,
            format!("tokio floor CPU per answered check, {phase}"),
            format!(
                "{} ({:.2}x the epoll floor)",
                spread(&t_us, " µs", 1),
                median(&tokio_ratios)
            ),
        );
        report.judge(
            S,
            format!("CPU per check agent/floor, {phase}"),
            spread(&ratios, "x", 2),
            format!("<= {CPU_RATIO_TARGET}x"),
            ratio <= CPU_RATIO_TARGET,
        );
        report.info(
            S,
            format!("CPU per check agent/tokio floor, {phase}"),
            spread(&agent_tokio, "x", 2),
        );
        if rate.is_none() {
            report.info(
                S,
                "max checks/s agent/floor",
                format!("{:.2}x", a.rate() / f.rate().max(1.0)),
            );
        }
    }
    report.info(
        S,
        "agent resident memory after the load",
        mib(status_kib(agent.pid(), "VmRSS")),
    );
}

/// Agent-checks at 5,000/s with and without hostile clients beside them, in
/// alternating slices of one run: 1,000 idle connections on the agent-check
/// port, 200 clients holding one byte of an HTTP request, 64 clients that
/// ask for `/status` and never read it (each reconnecting when the agent
/// closes it) and 1,000 new agent-send lines per second, against a rows
/// table already full. A prober asks `/-/ready` and `/-/healthy` every 20 ms
/// throughout. Figures: the agent's CPU per answered check (its own run
/// time over the slice, the junk's cost included) and probe latency.
fn hostile(args: &Args, consul: &Consul, report: &mut Report) {
    section("hostile clients");
    const S: &str = "hostile clients";
    let keys: Vec<(String, String)> = (0..100)
        .map(|i| {
            (
                format!("{DEFAULT_PREFIX}web/web-{i:04}"),
                "ready".to_string(),
            )
        })
        .collect();
    consul.put_many(&keys);
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), DEFAULT_PREFIX, &[]);
    agent.wait_ready(Duration::from_secs(30));
    wait_keys(&agent, 100);
    let slice = Duration::from_secs(if args.quick { 2 } else { 5 });
    let rounds = if args.quick { 1 } else { 2 };
    let spec = LoadSpec {
        threads: PACED_THREADS,
        duration: slice,
        rate: Some(TARGET_RATE),
        lines: check_lines(),
        expect: Some(support::floor::REPLY),
    };
    // Fill the rows table (16,384) with lines never asked again, so every
    // new line from here on replaces one.
    let fill = LoadSpec {
        threads: MAX_THREADS,
        duration: Duration::from_secs(30),
        rate: None,
        lines: Arc::new(
            (0..17_000)
                .map(|i| format!("fill/f-{i:05}\n").into_bytes())
                .collect(),
        ),
        expect: None,
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let filler = scope.spawn(|| load::run(agent.listen, &fill, &stop));
        let filled = wait_every(Duration::from_secs(30), Duration::from_millis(100), || {
            (agent.metric_sum("gitlab_haproxy_agent_answers_total") >= 17_000.0).then_some(())
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = filler.join();
        assert!(filled.is_some(), "the rows table did not fill");
    });
    let _ = measured(
        agent.pid(),
        agent.listen,
        &LoadSpec {
            duration: Duration::from_secs(1),
            ..spec.clone()
        },
    );
    let junk_spec = JunkSpec {
        idle: 1_000,
        one_byte: 200,
        slow_readers: 64,
        unique_lines_per_sec: 1_000.0,
    };
    let (mut clean, mut dirty) = (LoadResult::default(), LoadResult::default());
    let (mut clean_ns, mut dirty_ns) = (0u64, 0u64);
    let (mut clean_probes, mut dirty_probes) = (Vec::new(), Vec::new());
    let (mut clean_failed, mut dirty_failed) = (0u64, 0u64);
    let (mut junk_connections, mut junk_lines) = (0u64, 0u64);
    let with_probes =
        |result: &mut LoadResult, ns: &mut u64, probes: &mut Vec<u32>, failed: &mut u64| {
            let stop = Arc::new(AtomicBool::new(false));
            let prober = junk::probe(agent.http, Duration::from_millis(20), stop.clone());
            let (r, c) = measured(agent.pid(), agent.listen, &spec);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let (latencies, f) = prober.join().unwrap();
            result.merge(r);
            *ns += c;
            probes.extend(latencies);
            *failed += f;
        };
    for _ in 0..rounds {
        with_probes(
            &mut clean,
            &mut clean_ns,
            &mut clean_probes,
            &mut clean_failed,
        );
        let junk = Junk::start(agent.listen, agent.http, junk_spec);
        std::thread::sleep(Duration::from_secs(2));
        with_probes(
            &mut dirty,
            &mut dirty_ns,
            &mut dirty_probes,
            &mut dirty_failed,
        );
        junk_connections += junk.connections.load(std::sync::atomic::Ordering::Relaxed);
        junk_lines += junk.lines.load(std::sync::atomic::Ordering::Relaxed);
        drop(junk);
        std::thread::sleep(Duration::from_secs(1));
    }
    clean_probes.sort_unstable();
    dirty_probes.sort_unstable();
    let per_check = |ns: u64, r: &LoadResult| ns as f64 / 1e3 / r.answered.max(1) as f64;
    let (clean_us, dirty_us) = (per_check(clean_ns, &clean), per_check(dirty_ns, &dirty));
    let ratio = dirty_us / clean_us;
    let who = |r: &LoadResult| {
        format!(
            "{:.0} checks/s, p50 {:.3} / p99 {:.3} ms, {} failed",
            r.rate(),
            r.quantile_ms(0.50),
            r.quantile_ms(0.99),
            r.failed
        )
    };
    let probe_ms = |p: &[u32], q: f64| quantile(p, q) as f64 / 1000.0;
    report.info(S, "agent-checks, 5,000/s, no junk", who(&clean));
    report.judge(
        S,
        "agent-checks, 5,000/s, beside the junk",
        who(&dirty),
        "none failed",
        dirty.failed == 0,
    );
    report.info(
        S,
        "agent CPU per answered check, no junk / beside the junk",
        format!("{clean_us:.1} / {dirty_us:.1} µs"),
    );
    report.judge(
        S,
        "CPU per check beside the junk / without",
        format!("{ratio:.2}x"),
        format!("<= {HOSTILE_CPU_RATIO_TARGET}x"),
        ratio <= HOSTILE_CPU_RATIO_TARGET,
    );
    report.info(
        S,
        "probes (/-/ready, /-/healthy), no junk",
        format!(
            "{} probes, p50 {:.2} / p99 {:.2} / max {:.2} ms, {clean_failed} failed",
            clean_probes.len(),
            probe_ms(&clean_probes, 0.5),
            probe_ms(&clean_probes, 0.99),
            probe_ms(&clean_probes, 1.0),
        ),
    );
    let dirty_p99 = probe_ms(&dirty_probes, 0.99);
    report.judge(
        S,
        "probes (/-/ready, /-/healthy), beside the junk",
        format!(
            "{} probes, p50 {:.2} / p99 {dirty_p99:.2} / max {:.2} ms, {dirty_failed} failed",
            dirty_probes.len(),
            probe_ms(&dirty_probes, 0.5),
            probe_ms(&dirty_probes, 1.0),
        ),
        format!("p99 < {HOSTILE_PROBE_P99_MS:.0} ms, none failed"),
        dirty_p99 < HOSTILE_PROBE_P99_MS && dirty_failed == 0 && !dirty_probes.is_empty(),
    );
    let metrics = agent.metrics();
    let m = |name: &str| metric_sum(&metrics, name);
    report.info(
        S,
        "junk sent",
        format!(
            "{junk_connections} connections, {junk_lines} new lines ({} idle, {} one-byte, {} slow readers held)",
            junk_spec.idle, junk_spec.one_byte, junk_spec.slow_readers
        ),
    );
    report.info(
        S,
        "agent counters after the run",
        format!(
            "connections_refused {:.0}, http_idle_closed {:.0}, http_write_timeouts {:.0}, http_busy {:.0}, rows_seen {:.0}",
            m("gitlab_haproxy_agent_connections_refused_total"),
            m("gitlab_haproxy_agent_http_idle_closed_total"),
            m("gitlab_haproxy_agent_http_write_timeouts_total"),
            m("gitlab_haproxy_agent_http_busy_total"),
            m("gitlab_haproxy_agent_rows_seen"),
        ),
    );
    report.info(
        S,
        "agent resident memory after the run",
        mib(status_kib(agent.pid(), "VmRSS")),
    );
}

/// The agent-send lines of the responder phases: 1,000 rows, a tenth of
/// them with their own key (`web/web-0000` to `web/web-0099`), so both
/// lookup paths are taken.
fn check_lines() -> Arc<Vec<Vec<u8>>> {
    Arc::new(
        (0..1000)
            .map(|i| format!("web/web-{i:04} canary\n").into_bytes())
            .collect(),
    )
}

/// Checks per second and length of the measured window under callgrind:
/// slow enough that the responder, 20 to 50 times slower there, still
/// sleeps between most checks as it does natively at 5,000 checks/s.
const CALLGRIND_RATE: f64 = 500.0;
const CALLGRIND_SECS: u64 = 10;

/// User-space instructions per answered check of the agent and the epoll
/// floor, counted by `valgrind --tool=callgrind`: independent of what else
/// runs on the machine (unlike CPU time), but blind to the kernel's work,
/// which is most of a check's cost and the same for both. The counters are
/// zeroed after a warm-up and dumped after a paced window
/// (`callgrind_control -z` / `-d`); skipped when valgrind is not installed.
fn callgrind(args: &Args, consul: &Consul, report: &mut Report) {
    const S: &str = "responder";
    let tools = ["valgrind", "callgrind_control"];
    if tools
        .iter()
        .any(|t| Command::new(t).arg("--version").output().is_err())
    {
        report.info(
            S,
            "user-space instructions per check (callgrind)",
            "skipped: valgrind not installed",
        );
        return;
    }
    section("responder cost: instructions per check under callgrind");
    // The agent harness clears the environment: the wrapper names valgrind
    // by its full path.
    let valgrind = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("valgrind"))
                .find(|v| v.is_file())
        })
        .expect("valgrind on the PATH");
    let dir = TempDir::new("callgrind");
    let out = |name: &str| dir.path().join(format!("{name}.%p"));
    // A wrapper puts valgrind in front of the agent binary.
    let under_callgrind = |bin: &Path, name: &str| {
        let wrapper = dir.path().join(format!("{name}-under-callgrind"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec {} --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
                valgrind.display(),
                out(name).display(),
                bin.display()
            ),
        )
        .expect("write the callgrind wrapper");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the callgrind wrapper");
        let agent = Agent::spawn(
            &wrapper,
            &consul.url(),
            DEFAULT_PREFIX,
            &["--startup-timeout", "60s"],
        );
        agent.wait_ready(Duration::from_secs(120));
        wait_keys(&agent, 100);
        agent
    };
    let agent = under_callgrind(&args.agent_bin, "agent");
    let floor_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out("floor").display()))
        .arg(std::env::current_exe().expect("own path"))
        .arg("--floor")
        .arg(floor_addr.to_string());
    let floor = Proc::spawn(cmd, dir.path().join("floor.log"));
    let up = wait_every(Duration::from_secs(60), Duration::from_millis(50), || {
        TcpStream::connect(floor_addr).ok()
    });
    assert!(
        up.is_some(),
        "floor under callgrind did not start:\n{}",
        floor.log()
    );

    let lines = check_lines();
    let spec = |secs: u64| LoadSpec {
        threads: PACED_THREADS,
        duration: Duration::from_secs(if args.quick { 2 } else { secs }),
        rate: Some(CALLGRIND_RATE),
        lines: lines.clone(),
        expect: Some(support::floor::REPLY),
    };
    let count = |pid: u32, addr: SocketAddr, name: &str| -> (f64, LoadResult) {
        // Warm: every row seen once, pools filled.
        let _ = load::run(addr, &spec(4), &AtomicBool::new(false));
        control(pid, "-z");
        let result = load::run(addr, &spec(CALLGRIND_SECS), &AtomicBool::new(false));
        control(pid, "-d");
        let total = last_dump_total(dir.path(), &format!("{name}.{pid}"));
        (total as f64 / result.answered.max(1) as f64, result)
    };
    let (agent_ir, a) = count(agent.pid(), agent.listen, "agent");
    drop(agent);
    let (floor_ir, f) = count(floor.pid(), floor_addr, "floor");
    drop(floor);
    let secs = if args.quick { 2 } else { CALLGRIND_SECS };
    report.info(
        S,
        format!(
            "user-space instructions per answered check (callgrind), {CALLGRIND_RATE:.0} checks/s for {secs} s: agent / floor (epoll)"
        ),
        format!(
            "{agent_ir:.0} / {floor_ir:.0} ({} and {} checks, {} and {} failed); agent minus floor {:.0}",
            a.answered,
            f.answered,
            a.failed,
            f.failed,
            agent_ir - floor_ir
        ),
    );
    if let Some(bin) = &args.baseline_bin {
        let baseline = under_callgrind(bin, "baseline");
        let (ir, r) = count(baseline.pid(), baseline.listen, "baseline");
        report.info(
            S,
            format!(
                "user-space instructions per answered check (callgrind), {CALLGRIND_RATE:.0} checks/s for {secs} s: baseline agent"
            ),
            format!(
                "{ir:.0} ({} checks, {} failed); agent/baseline {:.2}x",
                r.answered,
                r.failed,
                agent_ir / ir
            ),
        );
    }
}

/// Runs `callgrind_control OPTION PID` (`-z` zero, `-d` dump).
fn control(pid: u32, option: &str) {
    let out = Command::new("callgrind_control")
        .arg(option)
        .arg(pid.to_string())
        .output()
        .expect("run callgrind_control");
    assert!(
        out.status.success(),
        "callgrind_control {option} {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The instruction total (`summary:` or `totals:` line) of the newest
/// callgrind dump `dir/BASE.N`.
fn last_dump_total(dir: &Path, base: &str) -> u64 {
    let newest = std::fs::read_dir(dir)
        .expect("read the callgrind directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix(base)?.strip_prefix('.')?.parse().ok()?;
            Some((n, name))
        })
        .max()
        .unwrap_or_else(|| panic!("no callgrind dump {base}.N in {}", dir.display()));
    let text = std::fs::read_to_string(dir.join(&newest.1)).expect("read the callgrind dump");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no instruction total in {}", newest.1))
}

/// One KV write, then the time until every one of many agents answers the
/// new state; polled on their agent-check ports.
fn convergence(args: &Args, consul: &Consul, report: &mut Report, figs: &mut Figures) {
    const S: &str = "convergence";
    let agents_n = if args.quick { 20 } else { 100 };
    let writes = if args.quick { 5 } else { 30 };
    section(&format!("convergence: {agents_n} agents"));
    let prefix = "bench/conv/";
    consul.put(&format!("{prefix}other"), "ready");
    let agents: Vec<Agent> = (0..agents_n)
        .map(|_| {
            Agent::spawn(
                &args.agent_bin,
                &consul.url(),
                prefix,
                &["--startup-timeout", "60s"],
            )
        })
        .collect();
    for a in &agents {
        a.wait_ready(Duration::from_secs(60));
    }
    let rss: Vec<u64> = agents
        .iter()
        .map(|a| status_kib(a.pid(), "VmRSS"))
        .collect();
    let pollers = 10.min(agents_n);
    let mut per_write: Vec<f64> = Vec::new();
    let mut per_agent: Vec<f64> = Vec::new();
    let mut unconverged = 0usize;
    for w in 0..writes {
        let value = if w % 2 == 0 { "drain" } else { "maint" };
        let want = reply_for(value);
        let barrier = Barrier::new(pollers + 1);
        let t0 = Mutex::new(Instant::now());
        let samples: Vec<Option<f64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..pollers)
                .map(|p| {
                    let (agents, barrier, t0, want) = (&agents, &barrier, &t0, &want);
                    scope.spawn(move || {
                        let mine: Vec<&Agent> = agents.iter().skip(p).step_by(pollers).collect();
                        let mut done: Vec<Option<f64>> = vec![None; mine.len()];
                        barrier.wait();
                        let start = *t0.lock().unwrap();
                        let deadline = start + Duration::from_secs(5);
                        while done.iter().any(Option::is_none) && Instant::now() < deadline {
                            for (i, a) in mine.iter().enumerate() {
                                if done[i].is_none() && ask(a.listen, "conv/row grp") == *want {
                                    done[i] = Some(ms(start.elapsed()));
                                }
                            }
                        }
                        done
                    })
                })
                .collect();
            *t0.lock().unwrap() = Instant::now();
            barrier.wait();
            consul.put(&format!("{prefix}grp"), value);
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        let converged: Vec<f64> = samples.iter().flatten().copied().collect();
        unconverged += samples.len() - converged.len();
        if converged.len() == samples.len() {
            per_write.push(converged.iter().copied().fold(0.0, f64::max));
        } else {
            per_write.push(f64::INFINITY);
        }
        per_agent.extend(converged);
        // Let every agent block again before the next write, so the write
        // measures the blocking query and not the rate limit.
        std::thread::sleep(Duration::from_millis(400));
    }
    per_write.sort_by(f64::total_cmp);
    per_agent.sort_by(f64::total_cmp);
    let p99 = quantile(&per_write, 0.99);
    figs.conv_p99_ms = p99;
    report.judge(
        S,
        format!("write to all {agents_n} agents answering it, {writes} writes: p50 / p99"),
        format!("{:.1} / {:.1} ms", quantile(&per_write, 0.5), p99),
        "p99 < 100 ms",
        p99 < 100.0 && unconverged == 0,
    );
    report.info(
        S,
        format!(
            "write to one agent answering it ({} samples): p50 / p99 / max",
            per_agent.len()
        ),
        format!(
            "{:.1} / {:.1} / {:.1} ms",
            quantile(&per_agent, 0.5),
            quantile(&per_agent, 0.99),
            per_agent.last().copied().unwrap_or(0.0)
        ),
    );
    let mut rss_sorted = rss.clone();
    rss_sorted.sort_unstable();
    report.info(
        S,
        format!("resident memory of each of the {agents_n} agents: median / max"),
        format!(
            "{} / {}",
            mib(quantile(&rss_sorted, 0.5)),
            mib(*rss_sorted.last().unwrap_or(&0))
        ),
    );
    if unconverged > 0 {
        report.info(
            S,
            "agent answers not converged within 5 s",
            unconverged.to_string(),
        );
    }
}

/// A real HAProxy with 1,000 enrolled server rows asking one agent every
/// 2 s: time from a KV write to every row showing it in `show servers state`.
fn haproxy_convergence(args: &Args, consul: &Consul, report: &mut Report) {
    const S: &str = "convergence";
    section("convergence: HAProxy with 1,000 rows");
    let prefix = "bench/haproxy/";
    consul.put(&format!("{prefix}other"), "ready");
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), prefix, &[]);
    agent.wait_ready(Duration::from_secs(30));
    let inter_ms = 2000u64;
    let mut backends = String::new();
    for b in 0..10 {
        let _ = writeln!(backends, "backend bench{b}\n    balance roundrobin");
        for s in 0..100 {
            let _ = writeln!(
                backends,
                "    server s{s:03} 127.0.0.1:1 weight 100 agent-check agent-addr 127.0.0.1 agent-port {} agent-inter {inter_ms}ms agent-send \"bench{b}/s{s:03} fleet\\n\"",
                agent.listen.port()
            );
        }
    }
    let config = format!(
        "global\n    stats socket {{SOCKET}} mode 600 level admin\n    maxconn 4096\n\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    timeout check 1s\n\n{backends}"
    );
    let haproxy = Haproxy::start(&config);
    let all = |admin: u32| {
        let states = haproxy.admin_states();
        states.len() == 1000 && states.values().all(|s| *s == admin)
    };
    let ready = wait_every(Duration::from_secs(10), Duration::from_millis(50), || {
        all(0).then_some(())
    });
    assert!(ready.is_some(), "HAProxy rows not ready at start");
    // Let every row's checks run for a full interval before measuring.
    std::thread::sleep(Duration::from_millis(inter_ms + 500));
    let writes = if args.quick { 2 } else { 6 };
    let mut times: Vec<f64> = Vec::new();
    for w in 0..writes {
        let (value, admin) = if w % 2 == 0 {
            ("drain", 8)
        } else {
            ("ready", 0)
        };
        let t0 = Instant::now();
        consul.put(&format!("{prefix}fleet"), value);
        let done = wait_every(
            Duration::from_millis(inter_ms * 3),
            Duration::from_millis(5),
            || all(admin).then(|| ms(t0.elapsed())),
        );
        times.push(done.unwrap_or(f64::INFINITY));
        std::thread::sleep(Duration::from_millis(300));
    }
    let checks_per_s = 1000.0 * 1000.0 / inter_ms as f64;
    times.sort_by(f64::total_cmp);
    let max = times.last().copied().unwrap_or(f64::INFINITY);
    report.judge(
        S,
        format!("write to all 1,000 HAProxy rows showing it (agent-inter {inter_ms} ms), {writes} writes: p50 / max"),
        format!("{:.0} / {:.0} ms", quantile(&times, 0.5), max),
        format!("<= agent-inter + 100 ms = {} ms", inter_ms + 100),
        max <= (inter_ms + 100) as f64,
    );
    report.info(
        S,
        format!("agent CPU serving 1,000 rows every {inter_ms} ms ({checks_per_s:.0} checks/s)"),
        {
            let c0 = cpu_us(agent.pid());
            std::thread::sleep(Duration::from_secs(4));
            format!("{:.2}% of a core", (cpu_us(agent.pid()) - c0) as f64 / 4e4)
        },
    );
}

/// Rewrites `key` every 5 ms for `duration` while counting the agent's
/// Consul requests; then checks the agent answers the last value.
#[allow(clippy::too_many_arguments)]
fn churn(
    consul: &Consul,
    agent: &Agent,
    key: &str,
    line: &str,
    duration: Duration,
    report: &mut Report,
    label: &str,
) -> (f64, f64, f64) {
    let period = Duration::from_millis(5);
    let requests0 = agent.metric_sum("gitlab_haproxy_agent_consul_requests_total");
    let agent_cpu0 = cpu_us(agent.pid());
    let consul_cpu0 = cpu_us(consul.pid());
    let start = Instant::now();
    let mut next = start;
    let mut writes = 0usize;
    let mut last = String::new();
    while start.elapsed() < duration {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        // A write that ran late does not make the next ones burst.
        next = (next + period).max(Instant::now());
        last = state_value(writes + 1);
        consul.put(key, &last);
        writes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let agent_cpu = (cpu_us(agent.pid()) - agent_cpu0) as f64 / 1e4 / secs;
    let consul_cpu = (cpu_us(consul.pid()) - consul_cpu0) as f64 / 1e4 / secs;
    let requests = agent.metric_sum("gitlab_haproxy_agent_consul_requests_total") - requests0;
    let want = reply_for(&last);
    let settled = Instant::now();
    let correct = wait_every(Duration::from_secs(3), Duration::from_millis(5), || {
        (ask(agent.listen, line) == want).then(|| ms(settled.elapsed()))
    });
    let bound = secs / MIN_QUERY_INTERVAL.as_secs_f64() + 1.0;
    let rate = requests / secs;
    report.judge(
        "Consul load",
        format!("requests/s per agent under churn, {label} ({writes} writes in {secs:.1} s)"),
        format!("{rate:.1}/s ({requests:.0} requests)"),
        format!(
            "<= 1 / min-query-interval = {:.0}/s",
            1.0 / MIN_QUERY_INTERVAL.as_secs_f64()
        ),
        requests <= bound,
    );
    report.judge(
        "Consul load",
        format!("final state after churn, {label}"),
        match correct {
            Some(t) => format!(
                "correct ({}), answered {t:.0} ms after the last write",
                want.trim()
            ),
            None => format!("WRONG: {:?} instead of {:?}", ask(agent.listen, line), want),
        },
        "the last value written",
        correct.is_some(),
    );
    report.info(
        "Consul load",
        format!("CPU during churn, {label}: agent / Consul"),
        format!("{agent_cpu:.1}% / {consul_cpu:.1}% of a core"),
    );
    (rate, agent_cpu, consul_cpu)
}

fn consul_load(
    args: &Args,
    consul: &Consul,
    idle_agent: (Agent, f64, Instant),
    report: &mut Report,
    figs: &mut Figures,
) {
    section("Consul load");
    let (fp_agent, requests0, since) = idle_agent;
    let requests = fp_agent.metric_sum("gitlab_haproxy_agent_consul_requests_total") - requests0;
    let secs = since.elapsed().as_secs_f64();
    report.judge(
        "Consul load",
        format!("requests/s per agent while its prefix is idle, over {secs:.0} s"),
        format!("{:.4}/s ({requests:.0} requests)", requests / secs),
        "<= 1 per --wait (60 s) = 0.017/s",
        requests <= (secs / 60.0).ceil(),
    );
    let duration = Duration::from_secs(if args.quick { 3 } else { 10 });
    let prefix = "bench/churn/";
    consul.put_many(
        &(0..10)
            .map(|i| (format!("{prefix}web/web-{i:02}"), "ready".to_string()))
            .collect::<Vec<_>>(),
    );
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), prefix, &[]);
    agent.wait_ready(Duration::from_secs(30));
    let (rate, _, _) = churn(
        consul,
        &agent,
        &format!("{prefix}churn"),
        "web/web-99 churn",
        duration,
        report,
        "11 keys",
    );
    figs.churn_rate_small = rate;
    let (rate, agent_cpu, consul_cpu) = churn(
        consul,
        &fp_agent,
        "bench/footprint/churn",
        "zz/none churn",
        duration,
        report,
        "10,001 keys",
    );
    figs.churn_rate_10k = rate;
    figs.churn_agent_cpu_10k = agent_cpu;
    figs.churn_consul_cpu_10k = consul_cpu;
}

fn human_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.0} kB", b / 1e3)
    }
}

/// The Consul cost of N load balancers, computed from the measured figures.
fn scale_table(figs: &Figures) -> String {
    let mut out = String::from(
        "| load balancers | blocking queries held | wake-ups per write | bytes sent per write, 1,000 keys | bytes sent per write, 10,000 keys | bytes/s at the rate limit (10 wake-ups/s each), 10,000 keys |\n|---|---|---|---|---|---|\n",
    );
    for n in [80usize, 1000, 10_000] {
        let nf = n as f64;
        let _ = writeln!(
            out,
            "| {n} | {n} | {n} | {} | {} | {}/s |",
            human_bytes(nf * figs.bytes_1k as f64),
            human_bytes(nf * figs.bytes_10k as f64),
            human_bytes(nf * figs.bytes_10k as f64 * figs.churn_rate_10k.max(1.0)),
        );
    }
    let _ = writeln!(
        out,
        "\nMeasured inputs: one full read of the prefix is {} with 1,000 keys ({:.1} ms) and {} with 10,000 keys ({:.1} ms) from a dev-mode Consul on loopback; the agent holds {} at 10,000 keys; 100 agents on one Consul converge with p99 {:.1} ms; under churn an agent sends {:.1} requests/s (11 keys) and {:.1} requests/s (10,001 keys), during which the agent uses {:.1}% and Consul {:.1}% of a core.",
        human_bytes(figs.bytes_1k as f64),
        figs.read_ms_1k,
        human_bytes(figs.bytes_10k as f64),
        figs.read_ms_10k,
        mib(figs.agent_rss_10k_kib),
        figs.conv_p99_ms,
        figs.churn_rate_small,
        figs.churn_rate_10k,
        figs.churn_agent_cpu_10k,
        figs.churn_consul_cpu_10k,
    );
    out
}

/// Ten minutes (by default) at 2,000 checks/s with keys changing every
/// second; samples resident memory and descriptors every 10 s.
fn soak(args: &Args) -> (Report, String) {
    const S: &str = "soak";
    let secs = args.soak_secs;
    section(&format!(
        "soak: {secs} s at 2,000 checks/s, keys changing every second"
    ));
    let consul = Consul::start();
    let keys: Vec<(String, String)> = (0..100)
        .map(|i| (format!("{DEFAULT_PREFIX}web/web-{i:04}"), state_value(i)))
        .collect();
    consul.put_many(&keys);
    let agent = Agent::spawn(&args.agent_bin, &consul.url(), DEFAULT_PREFIX, &[]);
    agent.wait_ready(Duration::from_secs(30));
    let lines: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..1000)
            .map(|i| format!("web/web-{i:04} canary\n").into_bytes())
            .collect(),
    );
    let pid = agent.pid();
    // Warm up, then take the baseline.
    let warm = LoadSpec {
        threads: PACED_THREADS,
        duration: Duration::from_secs(5),
        rate: Some(2000.0),
        lines: lines.clone(),
        expect: None,
    };
    let _ = load::run(agent.listen, &warm, &AtomicBool::new(false));
    std::thread::sleep(Duration::from_secs(1));
    let fds_before = fd_count(pid);
    let cpu0 = cpu_us(pid);
    let stop = AtomicBool::new(false);
    let spec = LoadSpec {
        duration: Duration::from_secs(secs),
        ..warm
    };
    let mut samples: Vec<(f64, u64, usize)> = Vec::new();
    let mut writes = 0usize;
    let start = Instant::now();
    let result = std::thread::scope(|scope| {
        let generator = scope.spawn(|| load::run(agent.listen, &spec, &stop));
        // Every second: ten keys change value, and ten keys are created or
        // deleted in turn.
        let mut next_sample = Duration::ZERO;
        let mut tick = 0usize;
        while start.elapsed() < Duration::from_secs(secs) {
            if start.elapsed() >= next_sample {
                samples.push((
                    start.elapsed().as_secs_f64(),
                    status_kib(pid, "VmRSS"),
                    fd_count(pid),
                ));
                next_sample += Duration::from_secs(10);
            }
            let changes: Vec<(String, String)> = (0..10)
                .map(|j| {
                    let i = (tick * 10 + j) % 100;
                    (
                        format!("{DEFAULT_PREFIX}web/web-{i:04}"),
                        state_value(i + tick),
                    )
                })
                .collect();
            consul.put_many(&changes);
            let extra: Vec<String> = (0..10)
                .map(|j| format!("{DEFAULT_PREFIX}extra/e-{j:02}"))
                .collect();
            if tick % 2 == 0 {
                consul.put_many(
                    &extra
                        .iter()
                        .map(|k| (k.clone(), "drain".to_string()))
                        .collect::<Vec<_>>(),
                );
            } else {
                consul.delete_many(&extra);
            }
            writes += 2;
            tick += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        generator.join().unwrap()
    });
    let cpu = cpu_us(pid) - cpu0;
    std::thread::sleep(Duration::from_secs(2));
    let fds_after = fd_count(pid);
    let rss_end = status_kib(pid, "VmRSS");
    samples.push((start.elapsed().as_secs_f64(), rss_end, fds_after));
    let mut report = Report::default();
    report.info(
        S,
        format!("checks answered over {secs} s"),
        format!(
            "{} ({:.0}/s), {} failed; p50 {:.3} / p99 {:.3} / p99.9 {:.3} ms",
            result.answered,
            result.rate(),
            result.failed,
            result.quantile_ms(0.5),
            result.quantile_ms(0.99),
            result.quantile_ms(0.999)
        ),
    );
    report.info(
        S,
        "agent CPU per answered check",
        format!("{:.1} µs", cpu as f64 / result.answered.max(1) as f64),
    );
    report.info(S, "KV writes (each 10 keys)", writes.to_string());
    // Flat: after the first two minutes, memory moves by less than 1 MiB.
    let after_warm: Vec<&(f64, u64, usize)> = samples
        .iter()
        .filter(|s| s.0 >= 120.0_f64.min(secs as f64 / 5.0))
        .collect();
    let base = after_warm.first().map_or(0, |s| s.1);
    let peak = after_warm.iter().map(|s| s.1).max().unwrap_or(0);
    let first_rss = samples.first().map_or(0, |s| s.1);
    report.judge(
        S,
        "resident memory: start / after warm-up / peak / end",
        format!(
            "{} / {} / {} / {}",
            mib(first_rss),
            mib(base),
            mib(peak),
            mib(rss_end)
        ),
        "flat: peak and end within 1 MiB of the after-warm-up sample",
        peak.saturating_sub(base) < 1024 && rss_end.saturating_sub(base) < 1024,
    );
    let max_fds = samples.iter().map(|s| s.2).max().unwrap_or(0);
    report.judge(
        S,
        "open descriptors: before / max sampled / after",
        format!("{fds_before} / {max_fds} / {fds_after}"),
        "none leaked: after == before",
        fds_after == fds_before,
    );
    let mut series = String::from("\nSamples (seconds, VmRSS KiB, open fds):\n\n```text\n");
    for s in &samples {
        let _ = writeln!(series, "{:6.0} {:7} {:4}", s.0, s.1, s.2);
    }
    series.push_str("```\n");
    (report, series)
}

/// `--load ADDR [--rate R] [--secs S]`: only the load generator, against a
/// responder started by hand (for profiling it with perf).
fn load_only(addr: SocketAddr, rate: Option<f64>, secs: u64) {
    let spec = LoadSpec {
        threads: if rate.is_some() {
            PACED_THREADS
        } else {
            MAX_THREADS
        },
        duration: Duration::from_secs(secs),
        rate,
        lines: Arc::new(
            (0..1000)
                .map(|i| format!("web/web-{i:04} canary\n").into_bytes())
                .collect(),
        ),
        expect: None,
    };
    let r = load::run(addr, &spec, &AtomicBool::new(false));
    println!(
        "{:.0} checks/s, p50 {:.3} / p99 {:.3} / p99.9 {:.3} ms, {} failed",
        r.rate(),
        r.quantile_ms(0.5),
        r.quantile_ms(0.99),
        r.quantile_ms(0.999),
        r.failed
    );
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if let Some(addr) = args.floor {
        support::floor::serve(addr);
    }
    if let Some(addr) = args.floor_tokio {
        support::floor::serve_tokio(addr);
    }
    if let Some(addr) = args.load {
        load_only(addr, args.rate, args.secs);
        return;
    }
    if !args.bench {
        println!("agent benchmark: not run under cargo test; run ./scripts/bench.sh");
        return;
    }
    for tool in ["consul", "haproxy"] {
        if Command::new(tool).arg("version").output().is_err()
            && Command::new(tool).arg("-v").output().is_err()
        {
            eprintln!("bench: {tool} not found; run scripts/install-deps.sh first");
            std::process::exit(1);
        }
    }
    assert!(
        args.agent_bin.is_file(),
        "no agent binary at {}; build it with cargo build --release",
        args.agent_bin.display()
    );
    let machine = machine();
    let load_before = load_average();
    let started = Instant::now();

    if args.soak {
        let (report, series) = soak(&args);
        let table = report.table();
        println!("{table}");
        let load_after = load_average();
        if args.record() {
            let body = format!(
                "Recorded by `./scripts/bench.sh --soak` ({} s); 1-minute load average {load_before} before, {load_after} after.\n\n{machine}\n{table}{series}",
                args.soak_secs
            );
            record(SOAK_BEGIN, SOAK_END, &body);
        }
        return;
    }

    if args.hostile {
        let consul = Consul::start();
        let mut report = Report::default();
        hostile(&args, &consul, &mut report);
        let table = report.table();
        let load_after = load_average();
        let took = started.elapsed().as_secs();
        println!("{table}");
        println!(
            "{} targets missed; run took {took} s; 1-minute load average {load_before} before, {load_after} after",
            report.misses()
        );
        if args.record() {
            let body = format!(
                "Recorded by `./scripts/bench.sh --hostile` in {took} s; 1-minute load average {load_before} before, {load_after} after.\n\n{machine}\n{table}"
            );
            record(HOSTILE_BEGIN, HOSTILE_END, &body);
        }
        return;
    }

    if args.responder {
        let consul = Consul::start();
        let mut report = Report::default();
        let mut figs = Figures::default();
        let runs = args.runs.unwrap_or(3) as usize;
        drop(footprint(&args, &consul, &mut report, &mut figs));
        responder(&args, &consul, &mut report, runs);
        callgrind(&args, &consul, &mut report);
        let table = report.table();
        let load_after = load_average();
        let took = started.elapsed().as_secs();
        println!("{table}");
        println!(
            "{} targets missed; run took {took} s; 1-minute load average {load_before} before, {load_after} after",
            report.misses()
        );
        if args.record() {
            let body = format!(
                "Recorded by `./scripts/bench.sh --responder` in {took} s; 1-minute load average {load_before} before, {load_after} after.\n\n{machine}\n{table}"
            );
            record(RESPONDER_BEGIN, RESPONDER_END, &body);
        }
        return;
    }

    let consul = Consul::start();
    let mut report = Report::default();
    let mut figs = Figures::default();
    let idle_agent = footprint(&args, &consul, &mut report, &mut figs);
    responder(&args, &consul, &mut report, args.runs.unwrap_or(1) as usize);
    convergence(&args, &consul, &mut report, &mut figs);
    haproxy_convergence(&args, &consul, &mut report);
    consul_load(&args, &consul, idle_agent, &mut report, &mut figs);
    let table = report.table();
    let scale = scale_table(&figs);
    let load_after = load_average();
    let took = started.elapsed().as_secs();
    println!("{table}\n{scale}");
    println!(
        "{} targets missed; run took {took} s; 1-minute load average {load_before} before, {load_after} after",
        report.misses()
    );
    if args.record() {
        let body = format!(
            "Recorded by `./scripts/bench.sh` in {took} s; 1-minute load average {load_before} before, {load_after} after.\n\n{machine}\n{table}\n### Consul cost of N load balancers (computed)\n\n{scale}"
        );
        record(RESULTS_BEGIN, RESULTS_END, &body);
    }
}
