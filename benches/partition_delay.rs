//! Partition benchmark: how long after a write is acknowledged every load
//! balancer shows it, while part of a three-server Consul cluster is cut
//! off. Runs in a private network namespace (`support::netns`): three
//! servers and two client agents, three load balancers (a real HAProxy and
//! an agent each: lb1 default consistency through client agent c1, lb2
//! stale through c2, lb3 stale straight to the server that leads at the
//! start), and a writer that `state set`s a new weight every second through
//! the servers on the quorum's side. HAProxy's `show servers state` is read
//! every 100 ms.
//!
//! One run, one cluster, four scenarios of `--secs` each (default 30), the
//! network healed and every load balancer caught up between them: the
//! leader cut from the other servers; a follower cut from the other
//! servers; c1 cut from every server; a 1|2 split (c1 and the server it
//! sends to | the other two servers and c2). Before each cut a client agent
//! is restarted (at most 8 times; it picks its server at random) until it
//! sends its RPCs to the server the cut isolates, so that every run shows a
//! load balancer whose client agent is pinned to the cut server: c1 on the
//! leader, c2 on the follower, c2 on c1's server for the split (where c2
//! itself stays on the quorum's side). Printed per scenario and load
//! balancer: the time from acknowledgement to HAProxy showing each write
//! (p50, p99, worst; writes shown only after the heal count with their full
//! delay) and when the agent first said it could not confirm it serves
//! Consul's latest index.
//! Not run in CI: `./scripts/bench.sh --partition` (about 3 minutes).
//!
//! Options (after `--`): `--agent-bin PATH`, `--secs S`, `--label TEXT`
//! (the BENCHMARKS.md section it is recorded in, e.g. `before`),
//! `--rpc-hold-timeout DUR` (Consul's, on every node), `--fallback` (every
//! agent also gets the servers it does not read through as
//! `--consul-fallback-addr`; by default they find them from Consul, as an
//! agent installed with default settings does), `--no-fallback`
//! (`--consul-fallback-addr none`), `--keep-logs DIR`, `--no-record`.
#![allow(dead_code)]

#[path = "../tests/support/mod.rs"]
mod harness;
#[path = "support/report.rs"]
mod report;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser as _;
use harness::cluster::Cluster;
use harness::lbs::{self, quantile, says_unconfirmed, wait_all_show, write_weight, Lb, Watch};

#[derive(clap::Parser)]
#[command(
    name = "partition",
    about = "Partition benchmark of gitlab-haproxy-agent"
)]
struct Args {
    #[arg(long, hide = true)]
    bench: bool,
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/gitlab-haproxy-agent"))]
    agent_bin: PathBuf,
    /// How long each cut lasts, seconds.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// The section of BENCHMARKS.md the table goes in.
    #[arg(long, default_value = "current")]
    label: String,
    /// Consul's `performance.rpc_hold_timeout` on every node (e.g. `2s`):
    /// how long a server without a leader holds a request before it
    /// fails; unset: Consul's default, 7 s.
    #[arg(long)]
    rpc_hold_timeout: Option<String>,
    /// Give every agent the three servers (but the one it reads through) as
    /// `--consul-fallback-addr`.
    #[arg(long, conflicts_with = "no_fallback")]
    fallback: bool,
    /// Give every agent `--consul-fallback-addr none`: no fallbacks, found
    /// or listed.
    #[arg(long)]
    no_fallback: bool,
    /// Keep each load balancer's agent log per scenario in this folder,
    /// and each write's times from the cut (`<scenario>-writes`).
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// Print only; leave BENCHMARKS.md alone.
    #[arg(long)]
    no_record: bool,
}

/// How long a load balancer may take to catch up after a heal before the
/// next scenario starts anyway (a query parked on a cut server returns
/// within --wait 60s plus its jitter).
const CATCH_UP: Duration = Duration::from_secs(90);

struct Row {
    scenario: String,
    lb: String,
    acked: usize,
    p50: Option<Duration>,
    p99: Option<Duration>,
    worst: Option<Duration>,
    never: usize,
    said: Option<Duration>,
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64()))
}

fn main() {
    let args = Args::parse();
    if !args.bench {
        println!(
            "partition benchmark: not run under cargo test; run ./scripts/bench.sh --partition"
        );
        return;
    }
    assert!(
        args.agent_bin.is_file(),
        "no agent binary at {}",
        args.agent_bin.display()
    );
    let forwarded: Vec<String> = std::env::args().skip(1).collect();
    let forwarded: Vec<&str> = forwarded.iter().map(String::as_str).collect();
    if !harness::netns::enter(&forwarded, Duration::from_secs(30 * 60)) {
        return;
    }
    let started = Instant::now();
    let bin = &args.agent_bin;
    eprintln!("partition bench: agent {}", bin.display());
    let mut cluster = Cluster::start_partitionable_with(2, args.rpc_hold_timeout.as_deref());
    let first_leader = cluster.wait_leader(Duration::from_secs(30));
    let every = Duration::from_secs(1);
    let write_timeout = Duration::from_secs(3);
    let urls = |cluster: &Cluster, names: &[&str]| -> Vec<String> {
        names.iter().map(|n| cluster.node(n).url()).collect()
    };
    let server_names: Vec<String> = cluster.servers.iter().map(|s| s.name.clone()).collect();
    let all_servers: Vec<&str> = server_names.iter().map(String::as_str).collect();
    assert!(
        write_weight(
            bin,
            &urls(&cluster, &all_servers)[0],
            1,
            Duration::from_secs(15)
        )
        .acked
        .is_some(),
        "first write refused:\n{}",
        cluster.logs()
    );
    let lb3_server = cluster.servers[first_leader].name.clone();
    // With --fallback: the servers but `not`, as --consul-fallback-addr.
    let fallback = |not: &str| -> Vec<String> {
        if args.no_fallback {
            return vec!["--consul-fallback-addr".into(), "none".into()];
        }
        if !args.fallback {
            return Vec::new();
        }
        let addrs: Vec<String> = cluster
            .servers
            .iter()
            .filter(|s| s.name != not)
            .map(|s| s.url())
            .collect();
        vec!["--consul-fallback-addr".into(), addrs.join(",")]
    };
    let with = |mut extra: Vec<String>, more: &[&str]| -> Vec<String> {
        extra.extend(more.iter().map(|s| s.to_string()));
        extra
    };
    let via = if args.fallback {
        ", servers as fallback"
    } else if args.no_fallback {
        ", no fallback"
    } else {
        ", fallbacks found"
    };
    let lb_args = [
        with(fallback(""), &[]),
        with(fallback(""), &["--consistency", "stale"]),
        with(fallback(&lb3_server), &["--consistency", "stale"]),
    ];
    let lbs = vec![
        Lb::start(
            bin,
            &format!("lb1 default via c1{via}"),
            &cluster.client(0).url(),
            &refs(&lb_args[0]),
        ),
        Lb::start(
            bin,
            &format!("lb2 stale via c2{via}"),
            &cluster.client(1).url(),
            &refs(&lb_args[1]),
        ),
        Lb::start(
            bin,
            &format!("lb3 stale via {lb3_server}{via}"),
            &cluster.node(&lb3_server).url(),
            &refs(&lb_args[2]),
        ),
    ];
    assert!(
        wait_all_show(&lbs, 1, Duration::from_secs(30)),
        "the load balancers did not serve the first write"
    );
    std::thread::sleep(Duration::from_secs(2));

    let mut rows = Vec::new();
    let mut next = 2;
    let mut notes = String::new();
    for scenario in [
        "leader isolated",
        "follower isolated",
        "c1 cut from every server",
        "1|2 split",
    ] {
        let leader = cluster.wait_leader(Duration::from_secs(60));
        // The client agent a load balancer reads through is put on the
        // server this scenario cuts, where it can be: c1 on the leader,
        // c2 on a follower, c2 on c1's server for the split.
        let pinned = match scenario {
            "leader isolated" => pin(&mut cluster, &lbs, 0, |s| s == leader),
            "follower isolated" => pin(&mut cluster, &lbs, 1, |s| s != leader),
            "1|2 split" => match first_server(&cluster, 0) {
                Some(c1s) => pin(&mut cluster, &lbs, 1, |s| s == c1s),
                None => false,
            },
            _ => true,
        };
        let leader = cluster.wait_leader(Duration::from_secs(60));
        let leader = cluster.servers[leader].name.clone();
        // With fallbacks, every agent reads through its own Consul again
        // before the cut (a client agent restarted above moves reads to a
        // fallback; an index check through the primary every 30 s takes
        // them back), so the cut shows the move, not a fallback already in
        // use.
        let on_fallback: Vec<&str> = if !args.no_fallback {
            lbs.iter()
                .filter(|lb| !back_on_primary(lb))
                .map(|lb| lb.name.as_str())
                .collect()
        } else {
            Vec::new()
        };
        // The server c1 sends its RPCs to (the first, if several).
        let c1_server = cluster.clients[0]
            .rpc_peers()
            .first()
            .and_then(|ip| cluster.servers.iter().find(|s| s.ip == *ip))
            .map(|s| s.name.clone());
        // The follower a load balancer reads through: c1's, else c2's,
        // else lb3's, else any.
        let c2_server = cluster.clients[1]
            .rpc_peers()
            .first()
            .and_then(|ip| cluster.servers.iter().find(|s| s.ip == *ip))
            .map(|s| s.name.clone());
        let follower = [c2_server, c1_server.clone(), Some(lb3_server.clone())]
            .into_iter()
            .flatten()
            .chain(all_servers.iter().map(|s| s.to_string()))
            .find(|s| *s != leader)
            .unwrap();
        let lone = c1_server.clone().unwrap_or_else(|| leader.clone());
        let (cut_a, cut_b): (Vec<String>, Vec<String>) = match scenario {
            "leader isolated" => (vec![leader.clone()], others(&all_servers, &[&leader])),
            "follower isolated" => (vec![follower.clone()], others(&all_servers, &[&follower])),
            "c1 cut from every server" => (vec!["c1".into()], others(&all_servers, &[])),
            _ => {
                let mut b = others(&all_servers, &[&lone]);
                b.push("c2".into());
                (vec![lone.clone(), "c1".into()], b)
            }
        };
        let quorum: Vec<String> = all_servers
            .iter()
            .filter(|s| !cut_a.iter().any(|a| a == *s))
            .map(|s| s.to_string())
            .collect();
        let quorum_refs: Vec<&str> = quorum.iter().map(String::as_str).collect();
        let _ = writeln!(
            notes,
            "- {scenario}: leader {leader}, c1 sent to {}, c2 to {}; cut {} from {}{}",
            c1_server.as_deref().unwrap_or("?"),
            peers(&cluster, 1),
            cut_a.join("+"),
            cut_b.join("+"),
            if pinned {
                String::new()
            } else {
                " (the client agent could not be put on the cut server)".into()
            } + &if on_fallback.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} still on a fallback at the cut)",
                    on_fallback.join(", ")
                )
            }
        );
        eprintln!("{scenario}: cutting {cut_a:?} from {cut_b:?}");
        let watch = Watch::start(&lbs);
        let writer = lbs::Writer::start(
            bin,
            &urls(&cluster, &quorum_refs),
            next,
            every,
            write_timeout,
        );
        std::thread::sleep(Duration::from_millis(500));
        let a: Vec<&str> = cut_a.iter().map(String::as_str).collect();
        let b: Vec<&str> = cut_b.iter().map(String::as_str).collect();
        let cut_at = Instant::now();
        eprintln!(
            "{scenario}: cut at {} s since the epoch",
            std::time::UNIX_EPOCH.elapsed().unwrap().as_secs_f64()
        );
        cluster.cut(&a, &b);
        std::thread::sleep(Duration::from_secs(args.secs));
        let writes = writer.stop();
        cluster.heal();
        let healed_at = Instant::now();
        next = writes.last().map_or(next, |w| w.weight + 1);
        let last = writes
            .iter()
            .rev()
            .find(|w| w.acked.is_some())
            .map_or(1, |w| w.weight);
        if !wait_all_show(&lbs, last, CATCH_UP) {
            eprintln!("{scenario}: a load balancer did not catch up within {CATCH_UP:?}");
        }
        std::thread::sleep(Duration::from_secs(1));
        let samples = watch.stop();
        let acked = writes.iter().filter(|w| w.acked.is_some()).count();
        let mut every_lb: Vec<Option<Duration>> = vec![Some(Duration::ZERO); acked];
        for (i, lb) in lbs.iter().enumerate() {
            let delays = lbs::delays(&writes, &samples[i]);
            for (k, (_, d)) in delays.iter().enumerate() {
                every_lb[k] = match (every_lb[k], d) {
                    (Some(x), Some(y)) => Some(x.max(*y)),
                    _ => None,
                };
            }
            rows.push(row(
                scenario,
                &lb.name,
                delays.iter().map(|(_, d)| *d).collect(),
                says_unconfirmed(&samples[i], cut_at, healed_at),
            ));
        }
        rows.push(row(scenario, "every load balancer", every_lb, None));
        if let Some(dir) = &args.keep_logs {
            for lb in &lbs {
                let name = format!("{scenario}-{}", lb.name).replace([' ', '|'], "_");
                std::fs::write(dir.join(name), lb.agent.log()).unwrap();
            }
            let writes: Vec<String> = writes
                .iter()
                .map(|w| {
                    let at = |i: Instant| i.checked_duration_since(cut_at).map(|d| d.as_secs_f64());
                    format!(
                        "{} sent {:?} acked {:?}",
                        w.weight,
                        at(w.sent),
                        w.acked.map(at)
                    )
                })
                .collect();
            let name = scenario.replace([' ', '|'], "_") + "-writes";
            std::fs::write(dir.join(name), writes.join("\n")).unwrap();
        }
    }

    let mut table = String::from(
        "| scenario | load balancer | writes acked | p50 s | p99 s | worst s | never shown | says unconfirmed after s |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario,
            r.lb,
            r.acked,
            secs(r.p50),
            secs(r.p99),
            secs(r.worst),
            r.never,
            secs(r.said)
        );
    }
    println!("{table}\n{notes}");
    if !args.no_record {
        let body = format!(
            "Recorded by `./scripts/bench.sh --partition --label {}` in {} s, {} s per cut, \
             agent `{}`.\n\n{}\n{table}\n{notes}",
            args.label,
            started.elapsed().as_secs(),
            args.secs,
            bin.display(),
            report::machine(),
        );
        report::record(
            &format!("<!-- bench:partition:{}:begin -->", args.label),
            &format!("<!-- bench:partition:{}:end -->", args.label),
            &body,
        );
    }
}

/// The server (index) of client agent `client`'s first RPC connection.
fn first_server(cluster: &Cluster, client: usize) -> Option<usize> {
    let first = *cluster.clients[client].rpc_peers().first()?;
    cluster.servers.iter().position(|s| s.ip == first)
}

/// Restarts client agent `client` (at most 8 times; it picks a server at
/// random on its first RPC) until it sends its RPCs to a server `want`
/// accepts (by index), then waits until every load balancer answers
/// again. False when it never did.
fn pin(cluster: &mut Cluster, lbs: &[Lb], client: usize, want: impl Fn(usize) -> bool) -> bool {
    let settle = Duration::from_secs(30);
    for _ in 0..8 {
        // The server of its first RPC connection, as the notes name it (a
        // client agent that moved keeps the old connection a while).
        let via = harness::wait_every(settle, Duration::from_millis(100), || {
            first_server(cluster, client)
        });
        if via.is_some_and(&want) {
            return true;
        }
        cluster.clients[client].terminate();
        cluster.clients[client].start();
        cluster.wait_formed(settle);
        let _ = wait_all_show_current(lbs);
    }
    false
}

/// Waits (up to 60 s) until `lb`'s agent reads through its
/// `--consul-addr` (`/status` `consul_fallback_in_use` null); false if it
/// did not.
fn back_on_primary(lb: &Lb) -> bool {
    harness::wait_every(Duration::from_secs(60), Duration::from_millis(250), || {
        let (status, _, body) = harness::http_request(lb.agent.http, "GET", "/status", b"")?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .ok()
            .filter(|_| status == 200)?;
        v.get("consul_fallback_in_use")?.is_null().then_some(())
    })
    .is_some()
}

/// Waits until every load balancer's agent has served Consul's answer
/// since its client agent came back (its `/-/ready` answers 200).
fn wait_all_show_current(lbs: &[Lb]) -> bool {
    lbs.iter().all(|lb| {
        harness::wait_every(Duration::from_secs(30), Duration::from_millis(100), || {
            let ready = harness::http_request(lb.agent.http, "GET", "/-/ready", b"");
            matches!(ready, Some((200, _, _))).then_some(())
        })
        .is_some()
    })
}

fn refs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn others(all: &[&str], not: &[&str]) -> Vec<String> {
    all.iter()
        .filter(|s| !not.contains(s))
        .map(|s| s.to_string())
        .collect()
}

fn peers(cluster: &Cluster, client: usize) -> String {
    let names: Vec<String> = cluster.clients[client]
        .rpc_peers()
        .iter()
        .filter_map(|ip| cluster.servers.iter().find(|s| s.ip == *ip))
        .map(|s| s.name.clone())
        .collect();
    if names.is_empty() {
        "?".into()
    } else {
        names.join("+")
    }
}

fn row(scenario: &str, lb: &str, delays: Vec<Option<Duration>>, said: Option<Duration>) -> Row {
    let never = delays.iter().filter(|d| d.is_none()).count();
    let mut shown: Vec<Duration> = delays.iter().flatten().copied().collect();
    Row {
        scenario: scenario.to_string(),
        lb: lb.to_string(),
        acked: delays.len(),
        p50: quantile(&mut shown, 0.5),
        p99: quantile(&mut shown, 0.99),
        worst: quantile(&mut shown, 1.0),
        never,
        said,
    }
}
