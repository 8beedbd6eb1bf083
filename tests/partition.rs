//! A Consul partition under real load balancers: three Consul servers and
//! two client agents in a private network namespace, five HAProxies each
//! asking its own agent, and a writer that `state set`s a new weight every
//! second through a server of the quorum. Three agents run with the
//! default settings, so they find the servers as fallbacks from Consul
//! (lb1 default consistency through client agent c1, lb2 stale through c2,
//! lb3 stale straight to the leader); two are told
//! `--consul-fallback-addr none` (lb4 default through c1, lb5 stale
//! straight to the leader).
//!
//! First the leader is cut from the other two servers (nftables, see
//! `support::cluster`) for 15 s: lb1, lb2 and lb3 serve every acknowledged
//! write within 7 s, even when c1 or c2 sends its RPCs to the cut leader
//! and for lb3, which reads through it; lb4 within a bound (longer when c1
//! sends to the cut leader); lb5, whose server is cut off, says within
//! 10 s that it cannot confirm it serves Consul's latest index (`/status`
//! `consul_current` false, `gitlab_haproxy_agent_consul_unconfirmed_seconds`
//! above 0). lb1's reads are back on c1 before the next cut. Then client
//! agent c1 is cut from every server for 12 s: lb1 (through a server it
//! found) within 7 s, the others but lb4 within 5 s, and lb4 says within
//! 10 s that it cannot confirm.
//! After each heal, every load balancer serves the last write and says it
//! is current again.
//!
//! The agent is `GITLAB_HAPROXY_AGENT_TEST_AGENT_BIN` when set (another
//! build to measure), else this crate's. About 60 s.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::lbs::{self, says_unconfirmed, wait_all_show, write_weight, Lb, Watch, Writer};
use support::{netns, wait_every};

/// From a write's acknowledgement to HAProxy showing it, for a load
/// balancer whose client agent is on a server of the quorum: an index
/// check (2 s) finds the parked read behind, the re-issued read answers,
/// HAProxy asks again (`agent-inter` 500 ms).
const SERVED_WITHIN: Duration = Duration::from_secs(5);

/// The same for a load balancer whose client agent was sending its RPCs to
/// the server that is cut off: the agent's re-issued default read is held
/// by that server, which has no leader, for Consul's `rpc_hold_timeout`
/// (7 s, not settable per request) before "No cluster leader"; only that
/// error moves the client agent to another server.
const SERVED_WITHIN_PINNED: Duration = Duration::from_secs(5 + 7);

/// The same for an agent with the default settings (fallbacks found from
/// Consul), whatever its client agent does: an index check (2 s) that
/// times out (2 s) or finds no leader, the servers checked at once, the
/// read sent again through one, HAProxy asking again. 4.5 s at worst in the
/// partition bench; the room above that is for a loaded machine. Without
/// fallbacks lb1 is frozen for the whole second cut (12 s).
const SERVED_WITHIN_FALLBACK: Duration = Duration::from_secs(7);

/// From the cut to an agent that cannot reach the quorum saying so.
const SAYS_WITHIN: Duration = Duration::from_secs(10);

/// From a heal to every load balancer serving the last write, current.
const HEALED_WITHIN: Duration = Duration::from_secs(20);

/// From the first heal to lb1's reads going through c1 again: an index
/// check through `--consul-addr` every 15 checks (30 s) while reads go
/// through a fallback, with room for a loaded machine.
const BACK_ON_PRIMARY_WITHIN: Duration = Duration::from_secs(45);

/// `/status` `consul_fallback_in_use` of `lb`: `Some(None)` while reads go
/// through `--consul-addr`, `None` when `/status` does not answer.
fn fallback_in_use(lb: &Lb) -> Option<Option<String>> {
    let (status, _, body) = support::http_request(lb.agent.http, "GET", "/status", b"")?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .ok()
        .filter(|_| status == 200)?;
    Some(
        v.get("consul_fallback_in_use")?
            .as_str()
            .map(str::to_string),
    )
}

fn agent_bin() -> PathBuf {
    std::env::var_os("GITLAB_HAPROXY_AGENT_TEST_AGENT_BIN")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(support::AGENT_BIN))
}

/// What went wrong in one phase, with every delay measured (for the
/// message either way).
fn judge(
    phase: &str,
    lbs: &[Lb],
    writes: &[lbs::Write],
    samples: &[Vec<lbs::Sample>],
    bounds: &[Option<Duration>],
    must_say: &[usize],
    (cut_at, healed_at): (Instant, Instant),
) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let mut report = format!(
        "{phase}: {} writes, {} acknowledged\n",
        writes.len(),
        writes.iter().filter(|w| w.acked.is_some()).count()
    );
    for (i, lb) in lbs.iter().enumerate() {
        let delays = lbs::delays(writes, &samples[i]);
        let shown: Vec<String> = delays
            .iter()
            .map(|(w, d)| match d {
                Some(d) => format!("{}%:{:.1}s", w.weight, d.as_secs_f64()),
                None => format!("{}%:never", w.weight),
            })
            .collect();
        let said = says_unconfirmed(&samples[i], cut_at, healed_at);
        report.push_str(&format!(
            "  {}: bound {:?}; says unconfirmed after {:?}; {}\n",
            lb.name,
            bounds[i],
            said,
            shown.join(" ")
        ));
        if let Some(bound) = bounds[i] {
            for (w, d) in &delays {
                if d.is_none_or(|d| d > bound) {
                    failures.push(format!(
                        "{phase}: {} served write {}% after {d:?}, bound {bound:?}",
                        lb.name, w.weight
                    ));
                }
            }
        }
        if must_say.contains(&i) && said.is_none_or(|d| d > SAYS_WITHIN) {
            failures.push(format!(
                "{phase}: {} did not say within {SAYS_WITHIN:?} that it cannot confirm \
                 (consul_current false, consul_unconfirmed_seconds > 0): {said:?}",
                lb.name
            ));
        }
    }
    (failures, report)
}

#[test]
fn a_cut_server_or_client_agent_is_served_around_and_said() {
    let name = "a_cut_server_or_client_agent_is_served_around_and_said";
    if !netns::enter(
        &[name, "--exact", "--nocapture", "--test-threads=1"],
        Duration::from_secs(300),
    ) {
        return;
    }
    let bin = agent_bin();
    let cluster = Cluster::start_partitionable(2);
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let leader_name = cluster.servers[leader].name.clone();
    let quorum: Vec<String> = (0..3)
        .filter(|s| *s != leader)
        .map(|s| cluster.servers[s].url())
        .collect();
    let writer_url = &quorum[0];
    let every = Duration::from_secs(1);
    let write_timeout = Duration::from_secs(3);

    assert!(
        write_weight(&bin, writer_url, 1, Duration::from_secs(15))
            .acked
            .is_some(),
        "first write refused:\n{}",
        cluster.logs()
    );
    let none = ["--consul-fallback-addr", "none"];
    let lbs = vec![
        Lb::start(
            &bin,
            "lb1 default via c1, fallbacks found",
            &cluster.client(0).url(),
            &[],
        ),
        Lb::start(
            &bin,
            "lb2 stale via c2, fallbacks found",
            &cluster.client(1).url(),
            &["--consistency", "stale"],
        ),
        Lb::start(
            &bin,
            &format!("lb3 stale via {leader_name}, fallbacks found"),
            &cluster.servers[leader].url(),
            &["--consistency", "stale"],
        ),
        Lb::start(
            &bin,
            "lb4 default via c1, none",
            &cluster.client(0).url(),
            &none,
        ),
        Lb::start(
            &bin,
            &format!("lb5 stale via {leader_name}, none"),
            &cluster.servers[leader].url(),
            &["--consistency", "stale", none[0], none[1]],
        ),
    ];
    // The default-settings agents have found the servers.
    for lb in &lbs[..3] {
        let found = wait_every(Duration::from_secs(10), Duration::from_millis(250), || {
            (lb.agent
                .metric("gitlab_haproxy_agent_consul_fallbacks_found")
                >= 2.0)
                .then_some(())
        });
        assert!(
            found.is_some(),
            "{} found no servers:\n{}",
            lb.name,
            lb.agent.log()
        );
    }
    assert!(
        wait_all_show(&lbs, 1, Duration::from_secs(15)),
        "the load balancers did not all serve the first write"
    );
    // Every agent's blocking read parks (the one a cut freezes).
    std::thread::sleep(Duration::from_secs(2));
    let watch = Watch::start(&lbs);
    let mut failures = Vec::new();
    let mut report = String::new();

    // Phase 1: the leader cut from the other two servers.
    let pinned: Vec<bool> = (0..2)
        .map(|c| {
            cluster.clients[c]
                .rpc_peers()
                .contains(&cluster.servers[leader].ip)
        })
        .collect();
    report.push_str(&format!(
        "leader {leader_name}; c1 on {:?}, c2 on {:?}\n",
        cluster.clients[0].rpc_peers(),
        cluster.clients[1].rpc_peers()
    ));
    let writer = Writer::start(&bin, &quorum, 2, every, write_timeout);
    std::thread::sleep(Duration::from_millis(500));
    let cut_at = Instant::now();
    cluster.isolate(&leader_name);
    std::thread::sleep(Duration::from_secs(15));
    let writes1 = writer.stop();
    cluster.heal();
    let healed1_at = Instant::now();
    let last1 = writes1
        .iter()
        .rev()
        .find(|w| w.acked.is_some())
        .map_or(1, |w| w.weight);
    let healed1 = wait_all_show(&lbs, last1, HEALED_WITHIN);
    let bound = |pinned: bool| {
        Some(if pinned {
            SERVED_WITHIN_PINNED
        } else {
            SERVED_WITHIN
        })
    };
    let cut1 = (
        (cut_at, healed1_at),
        writes1,
        [
            Some(SERVED_WITHIN_FALLBACK),
            Some(SERVED_WITHIN_FALLBACK),
            Some(SERVED_WITHIN_FALLBACK),
            bound(pinned[0]),
            None,
        ],
    );

    // Phase 2: client agent c1 cut from every server, once lb1 reads
    // through c1 again.
    cluster.wait_leader(HEALED_WITHIN);
    let lb1_back = wait_every(BACK_ON_PRIMARY_WITHIN, Duration::from_millis(250), || {
        (fallback_in_use(&lbs[0]) == Some(None)).then_some(())
    });
    if lb1_back.is_none() {
        failures.push(format!(
            "lb1 did not read through c1 again within {BACK_ON_PRIMARY_WITHIN:?} of the heal: \
             consul_fallback_in_use {:?}",
            fallback_in_use(&lbs[0])
        ));
    }
    let next = cut1.1.last().map_or(2, |w| w.weight + 1);
    let writer = Writer::start(&bin, &quorum, next, every, write_timeout);
    std::thread::sleep(Duration::from_millis(500));
    let cut2_at = Instant::now();
    cluster.isolate("c1");
    std::thread::sleep(Duration::from_secs(12));
    let writes2 = writer.stop();
    cluster.heal();
    let healed2_at = Instant::now();
    let last2 = writes2
        .iter()
        .rev()
        .find(|w| w.acked.is_some())
        .map_or(1, |w| w.weight);
    let healed2 = wait_all_show(&lbs, last2, HEALED_WITHIN);
    // The agents say they are current again.
    std::thread::sleep(Duration::from_secs(3));
    let samples = watch.stop();

    let (f, r) = judge(
        &format!("{leader_name} (leader) cut from the other servers"),
        &lbs,
        &cut1.1,
        &samples,
        &cut1.2,
        &[4],
        cut1.0,
    );
    failures.extend(f);
    report.push_str(&r);
    let (f, r) = judge(
        "c1 cut from every server",
        &lbs,
        &writes2,
        &samples,
        &[
            Some(SERVED_WITHIN_FALLBACK),
            Some(SERVED_WITHIN),
            Some(SERVED_WITHIN),
            None,
            Some(SERVED_WITHIN),
        ],
        &[3],
        (cut2_at, healed2_at),
    );
    failures.extend(f);
    report.push_str(&r);
    if !healed1 || !healed2 {
        failures.push(format!(
            "after a heal, a load balancer did not serve the last write within {HEALED_WITHIN:?} \
             (leader cut: {healed1}, c1 cut: {healed2})"
        ));
    }
    for (i, lb) in lbs.iter().enumerate() {
        let last = samples[i].last().copied();
        if last.is_none_or(|s| s.current != Some(true)) {
            failures.push(format!(
                "{} does not say it is current after the heals: {last:?}",
                lb.name
            ));
        }
    }
    eprintln!("{report}");
    if !failures.is_empty() {
        let logs: String = lbs
            .iter()
            .map(|lb| {
                let log = lb.agent.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "--- {} agent (last 30 lines)\n{}\n",
                    lb.name,
                    tail.join("\n")
                )
            })
            .collect();
        panic!("{}\n\n{report}\n{logs}", failures.join("\n"));
    }
}
