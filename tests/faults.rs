//! Fault suite: the agent binary against a Consul that loses its leader, is
//! killed and restarted, or answers slowly, malformed, truncated, with a
//! missing, zero or backwards `X-Consul-Index`, with `[]`, or huge; against
//! agent-check clients that stay silent, never end their line, flood, reset
//! or exhaust file descriptors; and killed with SIGKILL under load.
//!
//! Through all of it a server's answer changes only when a valid new
//! snapshot arrives, Consul requests stay rate-limited, staleness shows in
//! the metrics, and the agent recovers by itself. A real two-server Consul
//! cluster shows leader loss and restarts; the fake in `fake_consul` shows
//! the faults a real Consul cannot be made to show on demand.
//!
//! Needs `consul` (as the other suites) and util-linux `prlimit` (to lower
//! a running agent's descriptor limit, and to raise this process's own for
//! the 10,000 connections). Floods connect from 127.0.0.2 to the agent on
//! 127.0.0.1, so their client ports never take a port another test is
//! about to listen on.

mod fake_consul;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fake_consul::{FakeConsul, IndexHeader, Record, Reply};
use support::{free_port, wait_for, Agent, Consul, TempDir, PREFIX};

/// Agent-send lines asked throughout: groups and row keys, first match.
const LINES: [&str; 4] = [
    "x/y canary",
    "web/web-01 canary",
    "web/web-02 canary",
    "web/web-03",
];

/// What [`LINES`] get with canary=drain, web/web-01=maint, web/web-02=25%.
const GOOD: [&str; 4] = [
    "drain 100%\n",
    "maint 100%\n",
    "ready 25%\n",
    "ready 100%\n",
];

/// [`GOOD`] after `canary` is set to `maint`.
const CANARY_MAINT: [&str; 4] = [
    "maint 100%\n",
    "maint 100%\n",
    "ready 25%\n",
    "ready 100%\n",
];

/// The keys behind [`GOOD`].
const GOOD_KEYS: [(&str, &[u8]); 3] = [
    ("canary", b"drain"),
    ("web/web-01", b"maint"),
    ("web/web-02", b"25%"),
];

/// The agent's default `--min-query-interval`.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// How late a request may reach the fake after the agent started it, on a
/// busy machine. Only bounds on request starts need it.
const SKEW: Duration = Duration::from_millis(60);

/// The blocking-query wait support::Agent starts the agent with (`--wait
/// 5s`), as the agent sends it to Consul.
const WAIT_PARAM: &str = "5000ms";

const LONG: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// Helpers

/// One agent-check: connect, send `bytes`, read until the agent closes.
/// `None` when the agent cannot be reached.
fn try_ask(addr: SocketAddr, bytes: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The agent's replies to [`LINES`].
fn replies(agent: &Agent) -> Vec<String> {
    LINES.iter().map(|l| agent.ask(l)).collect()
}

/// Waits until the agent replies `want` to [`LINES`].
fn wait_replies(agent: &Agent, want: &[&str]) {
    let ok = wait_for(LONG, || (replies(agent) == want).then_some(()));
    assert!(
        ok.is_some(),
        "wanted {want:?}, last {:?}\n{}",
        replies(agent),
        agent.log()
    );
}

/// The value of `series` in a Prometheus text page.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of every sample of a metric with labels, e.g. all of
/// `gitlab_haproxy_agent_answers_total{...}`.
fn sum_of(text: &str, metric: &str) -> f64 {
    let start = format!("{metric}{{");
    text.lines()
        .filter(|l| l.starts_with(&start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn outcome(agent: &Agent, outcome: &str) -> f64 {
    agent.metric(&format!(
        "gitlab_haproxy_agent_consul_requests_total{{outcome=\"{outcome}\"}}"
    ))
}

/// Consul requests that failed, whatever the reason.
fn failed_requests(agent: &Agent) -> f64 {
    [
        "http_4xx",
        "http_5xx",
        "connect_error",
        "timeout",
        "decode_error",
    ]
    .iter()
    .map(|o| outcome(agent, o))
    .sum()
}

fn all_requests(agent: &Agent) -> f64 {
    sum_of(
        &agent.metrics(),
        "gitlab_haproxy_agent_consul_requests_total",
    )
}

fn consul_index(agent: &Agent) -> f64 {
    agent.metric("gitlab_haproxy_agent_consul_index")
}

fn status(agent: &Agent) -> serde_json::Value {
    serde_json::from_str(&agent.http_get("/status").expect("/status answers").1).unwrap()
}

/// Agent-check connections the agent has finished with: answered or not,
/// refused at the cap, or lost to an accept error.
fn connections_done(agent: &Agent) -> f64 {
    let m = agent.metrics();
    sum_of(&m, "gitlab_haproxy_agent_answers_total")
        + sample(&m, "gitlab_haproxy_agent_connections_refused_total").unwrap()
        + sample(&m, "gitlab_haproxy_agent_accept_errors_total").unwrap()
}

/// Waits until the agent has finished with `expected` agent-check
/// connections more than `done` (or the count stays put for a second), then
/// checks the count is within `slack` of that and none is in flight. The
/// kernel decides a few cases on its own under a flood: a reset can arrive
/// before the agent accepts, a client can give up on a handshake the
/// kernel still completes.
fn assert_accounted(agent: &Agent, done: f64, expected: usize, slack: usize) {
    let want = done + expected as f64;
    let mut last = (connections_done(agent), Instant::now());
    let _ = wait_for(Duration::from_secs(30), || {
        let now = connections_done(agent);
        if now != last.0 {
            last = (now, Instant::now());
        }
        (now >= want || last.1.elapsed() > Duration::from_secs(1)).then_some(())
    });
    let got = connections_done(agent);
    assert!(
        (got - want).abs() <= slack as f64,
        "{} of {expected} connections accounted (slack {slack}):\n{}",
        got - done,
        agent
            .metrics()
            .lines()
            .filter(|l| l.starts_with("gitlab_haproxy_agent_answers_total{")
                || l.starts_with("gitlab_haproxy_agent_connections_refused_total ")
                || l.starts_with("gitlab_haproxy_agent_accept_errors_total "))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    until_in_flight_is_zero(agent);
}

fn until_in_flight_is_zero(agent: &Agent) {
    let ok = wait_for(LONG, || {
        (agent.metric("gitlab_haproxy_agent_connections_in_flight") == 0.0).then_some(())
    });
    assert!(
        ok.is_some(),
        "connections still in flight:\n{}",
        agent.log()
    );
}

/// A fake Consul holding [`GOOD_KEYS`] and an agent synced to it.
fn fake_and_agent(extra: &[&str]) -> (FakeConsul, Agent) {
    let fake = FakeConsul::start(PREFIX, 100);
    for (k, v) in GOOD_KEYS {
        fake.put(k, v);
    }
    let agent = Agent::start(&fake.url(), extra);
    wait_replies(&agent, &GOOD);
    (fake, agent)
}

/// (soft, hard) `RLIMIT_NOFILE` of a process, from `/proc/<pid>/limits`.
fn fd_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files in limits");
    let mut f = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(u64::MAX));
    (f.next().unwrap(), f.next().unwrap())
}

/// Raises this test process's own descriptor limit to `need` with
/// util-linux `prlimit` if it is lower; panics if that is not allowed.
fn ensure_fd_limit(need: u64) {
    let pid = std::process::id();
    let (soft, hard) = fd_limits(pid);
    if soft >= need {
        return;
    }
    let _ = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={need}:{}", hard.max(need)))
        .status();
    let (soft, _) = fd_limits(pid);
    assert!(
        soft >= need,
        "this test needs {need} file descriptors; ulimit -n is {soft} and cannot be raised"
    );
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Checks that `requests`, each answered at once, were started at least
/// [`MIN_INTERVAL`] apart: no gap shorter than that (less [`SKEW`]), and
/// the whole run no faster.
fn assert_rate_limited(requests: &[Record]) {
    for w in requests.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(gap + SKEW >= MIN_INTERVAL, "requests {gap:?} apart");
    }
    if let [first, .., last] = requests {
        let span = last.at - first.at;
        let floor = MIN_INTERVAL * (requests.len() as u32 - 1);
        assert!(
            span + SKEW >= floor,
            "{} requests in {span:?}",
            requests.len()
        );
    }
}

/// Time from the fake answering `earlier` to `later` arriving: a lower
/// bound on the agent's pause between them, with no skew.
fn pause(earlier: &Record, later: &Record) -> Duration {
    later.at - earlier.answered_at.expect("answered")
}

/// Requests the fake answered with the reply labelled `label`.
fn served(fake: &FakeConsul, label: &str) -> Vec<Record> {
    fake.requests()
        .into_iter()
        .filter(|r| r.served == label)
        .collect()
}

// ---------------------------------------------------------------------------
// Consul: bad answers (fake)

#[test]
fn bad_consul_answers_never_change_a_servers_answer() {
    let (fake, agent) = fake_and_agent(&[]);
    let index = consul_index(&agent);
    assert_eq!(index, fake.index() as f64);

    // What each bad answer would make the agent say if it applied it: every
    // server something else, at a higher index.
    let other: [(&str, &[u8]); 4] = [
        ("canary", b"maint"),
        ("web/web-01", b"ready"),
        ("web/web-02", b"drain"),
        ("web/web-03", b"5%"),
    ];
    let later = fake.index() + 10;
    let json = fake.render(&other, later);
    let one = fake.render(&other[..1], later);
    let bad_base64 = format!(r#"[{{"Key":"{PREFIX}canary","Value":"!!","ModifyIndex":{later}}}]"#);
    let later = || IndexHeader::Value(fake.index() + 10);
    let faults: Vec<(Reply, &str, &str)> = vec![
        (
            Reply::error("no leader", 500, "No cluster leader"),
            "http_5xx",
            "No cluster leader",
        ),
        (
            Reply::error("in-flight EOF", 500, "rpc error making call: EOF"),
            "http_5xx",
            "rpc error making call: EOF",
        ),
        (
            Reply::error("acl", 403, "ACL not found"),
            "http_4xx",
            "ACL not found",
        ),
        (
            Reply::body("malformed", br#"[{"Key": "x", "Value": ]"#).with_index(later()),
            "decode_error",
            "JSON",
        ),
        (
            Reply::body("html", b"<html><body>502 Bad Gateway</body></html>"),
            "decode_error",
            "JSON",
        ),
        (
            Reply::body("an object, not a list", &one[1..one.len() - 1]).with_index(later()),
            "decode_error",
            "JSON",
        ),
        (
            Reply::body("bad base64", bad_base64.as_bytes()).with_index(later()),
            "decode_error",
            "base64",
        ),
        (
            Reply::body("truncated", &json[..json.len() / 2]).with_index(later()),
            "decode_error",
            "JSON",
        ),
        (
            Reply::cut("cut", &json, json.len() / 2).with_index(later()),
            "connect_error",
            "cannot reach Consul",
        ),
        (
            Reply::body("no index", &json).with_index(IndexHeader::Absent),
            "decode_error",
            "no X-Consul-Index header",
        ),
        (
            Reply::body("index text", &json).with_index(IndexHeader::Raw("12a".into())),
            "decode_error",
            "X-Consul-Index is not a number",
        ),
        (
            Reply::body("empty list", b"[]").with_index(later()),
            "decode_error",
            "200 with no keys",
        ),
    ];

    for (reply, kind, logged) in faults {
        let label = reply.label.clone();
        let before = outcome(&agent, kind);
        fake.script(reply);
        let at = fake.wait_served(&label, LONG);
        let counted = wait_for(LONG, || {
            (outcome(&agent, kind) == before + 1.0).then_some(())
        });
        assert!(counted.is_some(), "{label}: not counted as {kind}");
        assert_eq!(replies(&agent), GOOD, "{label} changed an answer");
        assert_eq!(consul_index(&agent), index, "{label} moved the index");

        // The retry is a full read, after a jittered backoff of 125-250 ms.
        let bad = &fake.requests()[at];
        let retry = fake.wait_request(at + 1, LONG);
        assert_eq!(retry.index, None, "{label}: retry is not a full read");
        assert!(
            pause(bad, &retry) >= Duration::from_millis(125),
            "{label}: retried after {:?}",
            pause(bad, &retry)
        );
        // Then the blocking query resumes on the copy's index.
        let resumed = fake.wait_request(at + 2, LONG);
        assert_eq!(resumed.index, Some(fake.index()), "{label}");
        assert_eq!(resumed.wait.as_deref(), Some(WAIT_PARAM), "{label}");
        assert!(
            agent.log().contains(logged),
            "{label}: {logged:?} not logged"
        );
    }
    assert_eq!(replies(&agent), GOOD);

    // A valid new snapshot is applied at once.
    fake.put("canary", b"maint");
    wait_replies(&agent, &CANARY_MAINT);
    assert_eq!(consul_index(&agent), fake.index() as f64);
    assert_eq!(status(&agent)["last_error"], serde_json::Value::Null);
}

// ---------------------------------------------------------------------------
// Consul: the index rules, churn and errors (fake)

#[test]
fn blocking_queries_follow_the_index_rules_and_stay_rate_limited() {
    let (fake, agent) = fake_and_agent(&[]);
    // A full read first, then a blocking query on the index it returned.
    let first = fake.wait_answered(0, LONG);
    assert_eq!(first.path, format!("/v1/kv/{PREFIX}"));
    assert_eq!(first.index, None);
    let blocking = fake.wait_request(1, LONG);
    assert_eq!(blocking.index, first.served_index);
    assert_eq!(blocking.wait.as_deref(), Some(WAIT_PARAM));

    // Churn elsewhere in the datacenter: every answer at once, each with a
    // higher index. The agent follows each index, at most every 100 ms.
    fake.set_sticky(Some(Reply::store("churn").bumping()));
    let churn_for = Duration::from_millis(1500);
    std::thread::sleep(churn_for);
    fake.set_sticky(None);
    let churn = served(&fake, "churn");
    // With ACLs off (the fake's default, as `GET /v1/acl/token/self`
    // says) nothing can be filtered: each churn answer is applied as it
    // is, one request per change. The blocking queries are rate-limited.
    let blocking: Vec<Record> = churn
        .iter()
        .filter(|r| r.index.is_some())
        .cloned()
        .collect();
    assert!(
        blocking.len() >= 5 && blocking.len() as u128 <= 2 + churn_for.as_millis() / 100,
        "{} blocking queries in {churn_for:?} of churn",
        blocking.len()
    );
    assert!(churn.len() <= blocking.len() + 1, "{churn:#?}");
    // The held query answered first; the rest were answered at once.
    assert_rate_limited(&blocking[1..]);
    for w in churn.windows(2) {
        if w[1].index.is_some() {
            assert_eq!(
                w[1].index, w[0].served_index,
                "blocks on the index just seen"
            );
        }
    }
    let ok = wait_for(LONG, || {
        (consul_index(&agent) == fake.index() as f64).then_some(())
    });
    assert!(ok.is_some(), "index not followed through churn");
    assert_eq!(replies(&agent), GOOD);
    // No key was read directly and no read check was made: with ACLs off
    // a change costs the blocking read alone. The writer's records beside
    // the prefix are read when a scrape asks for them (the metrics this
    // test polls), off the way from a write to HAProxy.
    let reads: Vec<String> = fake
        .key_reads()
        .into_iter()
        .filter(|r| !r.contains("state~meta/"))
        .collect();
    assert!(reads.is_empty(), "plain key reads: {reads:?}");

    // An index of 0 is clamped to 1 (applied like a backwards index, then
    // re-read); the agent then blocks on 1 instead of spinning. Nothing
    // moved with it, so it is counted as a reaped tombstone, not a loss.
    let went_back = |agent: &Agent| {
        agent.metric("gitlab_haproxy_agent_consul_index_resets_total")
            + agent.metric("gitlab_haproxy_agent_consul_tombstones_reaped_total")
    };
    let resets = went_back(&agent);
    fake.set_sticky(Some(Reply::store("zero").with_index(IndexHeader::Value(0))));
    std::thread::sleep(Duration::from_millis(1200));
    fake.set_sticky(None);
    let zero = served(&fake, "zero");
    assert!(zero.len() >= 4 && zero.len() <= 15, "{zero:#?}");
    assert_eq!(zero[1].index, None, "re-read after the reset");
    for r in &zero[2..] {
        assert_eq!(r.index, Some(1), "{zero:#?}");
    }
    assert_rate_limited(&zero[1..]);
    assert_eq!(went_back(&agent), resets + 1.0);
    assert_eq!(replies(&agent), GOOD);
    let ok = wait_for(LONG, || {
        (consul_index(&agent) == fake.index() as f64).then_some(())
    });
    assert!(ok.is_some(), "a real index after the zeros is not followed");

    // A backwards index with other data (a snapshot restore) is applied,
    // then re-read from 0, then blocked on.
    let held_at = fake.wait_pending(LONG);
    let held = fake.index();
    fake.restore(&[("canary", b"maint"), ("web/web-02", b"25%")], 7);
    wait_replies(&agent, &CANARY_MAINT);
    let after = fake.wait_request(held_at + 2, LONG);
    let log = fake.requests();
    assert_eq!(log[held_at].index, Some(held));
    assert_eq!(log[held_at].served_index, Some(7));
    assert_eq!(log[held_at + 1].index, None);
    assert_eq!(after.index, Some(7));
    assert_eq!(consul_index(&agent), 7.0);
    assert_eq!(went_back(&agent), resets + 2.0);

    // Consul down for a while: the copy keeps serving, a write made
    // meanwhile is not seen, staleness grows in the metrics, and retries
    // back off exponentially, each a full read.
    let before = replies(&agent);
    let http_5xx = outcome(&agent, "http_5xx");
    fake.set_sticky(Some(Reply::error("down", 500, "No cluster leader")));
    fake.put("web/web-03", b"drain");
    let down = Instant::now();
    while down.elapsed() < Duration::from_millis(2500) {
        assert_eq!(replies(&agent), before);
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = status(&agent);
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("No cluster leader"),
        "{st}"
    );
    assert!(
        st["consul_failing_for_seconds"].as_f64().unwrap() >= 1.0,
        "{st}"
    );
    assert!(agent.metric("gitlab_haproxy_agent_last_sync_age_seconds") >= 2.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_synced"), 1.0);
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);
    assert_eq!(consul_index(&agent), 7.0);
    fake.set_sticky(None);
    let mut want = before.clone();
    want[3] = "drain 100%\n".into();
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    wait_replies(&agent, &want);
    let failing = served(&fake, "down");
    assert!(failing.len() >= 3, "{failing:#?}");
    for (k, w) in failing.windows(2).enumerate() {
        // After k+1 failures: at least half of 250 ms * 2^k.
        let floor = Duration::from_millis(125 << k);
        assert!(
            pause(&w[0], &w[1]) >= floor,
            "retry {k}: {:?}",
            pause(&w[0], &w[1])
        );
        assert_eq!(w[1].index, None, "retry {k} is not a full read");
    }
    assert_eq!(outcome(&agent, "http_5xx"), http_5xx + failing.len() as f64);
    assert!(agent.log().contains("Consul reachable again"));
    assert_eq!(status(&agent)["last_error"], serde_json::Value::Null);
    assert!(agent.metric("gitlab_haproxy_agent_last_sync_age_seconds") < 2.0);
}

// ---------------------------------------------------------------------------
// Consul: slow answers (fake)

/// After a failed request the agent reads the prefix again without an
/// index. If that read is a filtered view (a token policy narrowed then,
/// restored before the read check that follows it), the check passes: so a
/// full read that drops keys is not taken for deletes either; each key it
/// lacks is read directly. Shown with the fake: the retry answers without
/// `canary`, the direct read shows it.
#[test]
fn a_full_read_that_drops_keys_after_a_failure_is_confirmed_not_applied() {
    let (fake, agent) = fake_and_agent(&[]);
    // ACLs on: after the failure the agent asks again and reads each key
    // an answer lacks directly.
    fake.set_acl_enabled(true);
    fake.script(Reply::error("no leader", 500, "No cluster leader"));
    // A write during the backoff moves the index forward (so this is no
    // rollback for the guard); the retry shows it, but not `canary`.
    fake.put("web/web-09", b"maint");
    let mut shown: Vec<(&str, &[u8])> = GOOD_KEYS[1..].to_vec();
    shown.push(("web/web-09", b"maint"));
    let filtered = fake.render(&shown, fake.index());
    fake.script(Reply::body("filtered", &filtered));
    let at = fake.wait_served("filtered", LONG);
    assert_eq!(fake.requests()[at].index, None, "the retry is a full read");
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(replies(&agent), GOOD, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!agent.log().contains("key removed"), "{}", agent.log());
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_key_reads_total{result=\"present\"}"),
        1.0
    );
}

#[test]
fn slow_consul_answers_never_hold_up_agent_checks() {
    let (fake, agent) = fake_and_agent(&[]);

    // Slow but in time: the copy answers meanwhile, without waiting.
    fake.put_silently("canary", b"maint");
    fake.script(Reply::store("slow").delayed(Duration::from_secs(2)));
    let slow = fake.wait_served("slow", LONG);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        let asked = Instant::now();
        assert_eq!(agent.ask(LINES[0]), GOOD[0]);
        assert!(asked.elapsed() < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_replies(&agent, &CANARY_MAINT);
    // One request at a time: nothing was sent while the slow one was out.
    let next = fake.wait_request(slow + 1, LONG);
    assert!(pause(&fake.requests()[slow], &next) >= Duration::from_secs(2));

    // Too slow: after a failure the full read (5 s deadline) gets no
    // answer in time; the write it would have carried is not applied until
    // a later read brings it.
    fake.put_silently("canary", b"drain");
    let timeouts = outcome(&agent, "timeout");
    fake.script(Reply::error("no leader", 500, "No cluster leader"));
    fake.script(Reply::store("too slow").delayed(Duration::from_secs(7)));
    let too_slow = fake.wait_served("too slow", LONG);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        let asked = Instant::now();
        assert_eq!(agent.ask(LINES[0]), "maint 100%\n");
        assert!(asked.elapsed() < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let counted = wait_for(LONG, || {
        (outcome(&agent, "timeout") == timeouts + 1.0).then_some(())
    });
    assert!(counted.is_some(), "timeout not counted:\n{}", agent.log());
    wait_replies(&agent, &GOOD);
    let retry = fake.wait_request(too_slow + 1, LONG);
    assert_eq!(retry.index, None);
    // Not given up on early: the 5 s deadline, then a 250-500 ms backoff.
    assert!(pause(&fake.requests()[too_slow], &retry) >= Duration::from_secs(5));
}

// ---------------------------------------------------------------------------
// Consul: huge answers

#[test]
fn a_huge_value_is_held_invalid_without_disturbing_other_servers() {
    let (fake, agent) = fake_and_agent(&[]);
    // 1 MiB, twice what Consul itself accepts for one value.
    fake.put("web/web-03", &vec![b'd'; 1 << 20]);
    let ok = wait_for(LONG, || {
        (agent.metric("gitlab_haproxy_agent_invalid_keys") == 1.0).then_some(())
    });
    assert!(ok.is_some(), "{}", agent.log());
    assert_eq!(consul_index(&agent), fake.index() as f64);
    // The server it decides gets no answer; every other answer is the same.
    assert_eq!(replies(&agent), [GOOD[0], GOOD[1], GOOD[2], ""]);
    let body = agent.http_get("/status").unwrap().1;
    assert!(body.len() < 64 * 1024, "/status is {} bytes", body.len());
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        st["invalid"]["web/web-03"]["reason"]
            .as_str()
            .unwrap()
            .len()
            < 200
    );
    assert!(
        !agent.log().contains(&"d".repeat(100)),
        "the value was logged"
    );

    fake.put("web/web-03", b"50%");
    wait_replies(&agent, &[GOOD[0], GOOD[1], GOOD[2], "ready 50%\n"]);
    assert_eq!(agent.metric("gitlab_haproxy_agent_invalid_keys"), 0.0);
}

fn bulk_value(i: usize) -> String {
    match i % 4 {
        0 => "drain".into(),
        1 => "maint".into(),
        2 => "ready".into(),
        _ => format!("{}%", i % 257),
    }
}

fn bulk_reply(i: usize) -> String {
    match i % 4 {
        0 => "drain 100%\n".into(),
        1 => "maint 100%\n".into(),
        2 => "ready 100%\n".into(),
        _ => format!("ready {}%\n", i % 257),
    }
}

#[test]
fn a_prefix_of_ten_thousand_keys_is_followed_while_answers_keep_coming() {
    const N: usize = 10_000;
    let consul = Consul::start();
    consul.put("web/web-01", "maint");
    let agent = Agent::start(&consul.url(), &[]);
    wait_replies(
        &agent,
        &[
            "ready 100%\n",
            "maint 100%\n",
            "ready 100%\n",
            "ready 100%\n",
        ],
    );

    let stop = Stop::default();
    let requests = all_requests(&agent);
    let started = Instant::now();
    let asked = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let mut n = 0;
            while !stop.is_set() {
                assert_eq!(agent.ask("web/web-01 canary"), "maint 100%\n");
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        });
        let _stop = stop.guard();
        // 64 keys per transaction, the most Consul 1.8 takes.
        let b64 = base64::engine::general_purpose::STANDARD;
        for chunk in (0..N).collect::<Vec<_>>().chunks(64) {
            let ops: Vec<serde_json::Value> = chunk
                .iter()
                .map(|&i| {
                    serde_json::json!({"KV": {
                        "Verb": "set",
                        "Key": format!("{PREFIX}bulk/s{i:05}"),
                        "Value": b64.encode(bulk_value(i)),
                    }})
                })
                .collect();
            let body = serde_json::to_vec(&ops).unwrap();
            let (status, _, answer) = consul.request("PUT", "/v1/txn", &body);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        }
        let ok = wait_for(Duration::from_secs(30), || {
            (agent.metric("gitlab_haproxy_agent_keys") == (N + 1) as f64).then_some(())
        });
        stop.set();
        assert!(
            ok.is_some(),
            "{} keys held",
            agent.metric("gitlab_haproxy_agent_keys")
        );
        prober.join().unwrap()
    });
    let took = started.elapsed();
    assert!(asked > 0);
    // Every transaction woke the watcher; it still asked at most every 100 ms.
    let made = all_requests(&agent) - requests;
    assert!(
        made <= 2.0 + took.as_millis() as f64 / 100.0,
        "{made} Consul requests in {took:?}"
    );
    // The key count is exported just before the new state is answered:
    // wait for the last key written to be answered too.
    let last = wait_for(LONG, || {
        (agent.ask(&format!("bulk/s{:05} canary", N - 1)) == bulk_reply(N - 1)).then_some(())
    });
    assert!(last.is_some(), "the last key written is not answered");
    for i in [0, 1, 2, 3, 4_999, 9_998, 9_999] {
        assert_eq!(
            agent.ask(&format!("bulk/s{i:05} canary")),
            bulk_reply(i),
            "{i}"
        );
    }

    consul.put("bulk/s05000", "maint");
    let ok = wait_for(LONG, || {
        (agent.ask("bulk/s05000") == "maint 100%\n").then_some(())
    });
    assert!(ok.is_some());

    // All 10,000 gone at one index.
    let (status, _, _) = consul.request("DELETE", &format!("/v1/kv/{PREFIX}bulk/?recurse"), b"");
    assert_eq!(status, 200);
    let ok = wait_for(LONG, || {
        (agent.metric("gitlab_haproxy_agent_keys") == 1.0).then_some(())
    });
    assert!(ok.is_some());
    assert_eq!(agent.ask("bulk/s00000"), "ready 100%\n");
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
}

// ---------------------------------------------------------------------------
// Consul: a real two-server cluster loses its leader; servers are killed
// and restarted.

/// One `consul agent -server` of a two-server cluster, on loopback, stopped
/// by its PID when dropped.
struct ConsulServer {
    name: &'static str,
    /// http, dns, serf LAN, serf WAN, server RPC.
    ports: [u16; 5],
    /// The other server's serf LAN port, to join.
    join: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl ConsulServer {
    fn new(name: &'static str, dir: &TempDir, join: u16, ports: [u16; 5]) -> ConsulServer {
        ConsulServer {
            name,
            ports,
            join,
            data: dir.path().join(name),
            log: dir.path().join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts (or restarts, on the same data directory and ports) the
    /// server. Raft timing is scaled down (`raft_multiplier = 1`) and
    /// requests wait at most 1 s for a leader, so the test runs in seconds.
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("consul")
            .args(["agent", "-server", "-bootstrap-expect=2", "-node"])
            .arg(self.name)
            .arg(format!("-data-dir={}", self.data.display()))
            .args(["-bind=127.0.0.1", "-client=127.0.0.1", "-grpc-port=-1"])
            .arg(format!("-http-port={}", self.ports[0]))
            .arg(format!("-dns-port={}", self.ports[1]))
            .arg(format!("-serf-lan-port={}", self.ports[2]))
            .arg(format!("-serf-wan-port={}", self.ports[3]))
            .arg(format!("-server-port={}", self.ports[4]))
            .arg(format!("-retry-join=127.0.0.1:{}", self.join))
            .arg("-retry-interval=200ms")
            .arg("-hcl=performance { raft_multiplier = 1 rpc_hold_timeout = \"1s\" }")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start consul");
        self.child = Some(child);
    }

    /// SIGKILL, then reap.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn http(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    fn url(&self) -> String {
        format!("http://{}", self.http())
    }

    /// The address Consul names a leader by.
    fn rpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ports[4])
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The leader this server knows, if any.
    fn leader(&self) -> Option<String> {
        let (status, body) = http(self.http(), "GET", "/v1/status/leader", b"")?;
        let leader = body.trim().trim_matches('"').to_string();
        (status == 200 && !leader.is_empty()).then_some(leader)
    }

    /// Writes `PREFIX + key`; false if Consul refused (e.g. no leader).
    fn put(&self, key: &str, value: &str) -> bool {
        http(
            self.http(),
            "PUT",
            &format!("/v1/kv/{PREFIX}{key}"),
            value.as_bytes(),
        )
        .is_some_and(|(s, b)| s == 200 && b.trim() == "true")
    }

    /// Waits up to 30 s for a leader and a write that succeeds.
    fn wait_writable(&self, key: &str, value: &str) {
        let ok = wait_for(Duration::from_secs(30), || {
            (self.leader().is_some() && self.put(key, value)).then_some(())
        });
        assert!(ok.is_some(), "no leader, no write:\n{}", self.log());
    }
}

impl Drop for ConsulServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One small HTTP/1.1 request (Connection: close): (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    let (status, _, body) = support::http_request(addr, method, path, body)?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

#[test]
fn consul_leader_loss_and_server_restarts_keep_the_last_copy_served() {
    let dir = TempDir::new("consul-cluster");
    let ports_a = [
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    ];
    let ports_b = [
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    ];
    let mut servers = [
        ConsulServer::new("fault-a", &dir, ports_b[2], ports_a),
        ConsulServer::new("fault-b", &dir, ports_a[2], ports_b),
    ];
    servers[0].start();
    servers[1].start();
    servers[0].wait_writable("canary", "drain");
    // The agent reads from the follower: its blocking query is in flight to
    // the leader when the leader dies.
    let leader = servers[0].leader().unwrap();
    let (f, l) = if servers[0].rpc_addr() == leader {
        (1, 0)
    } else {
        (0, 1)
    };
    servers[f].wait_writable("web/web-01", "maint");
    servers[f].wait_writable("web/web-02", "25%");
    let agent = Agent::start(&servers[f].url(), &[]);
    wait_replies(&agent, &GOOD);
    let index = consul_index(&agent);
    let failed = failed_requests(&agent);
    let requests = all_requests(&agent);

    // Leader lost: no quorum is left in a two-server cluster.
    let lost = Instant::now();
    servers[l].kill();
    let noticed = wait_for(Duration::from_secs(30), || {
        assert_eq!(replies(&agent), GOOD);
        let st = status(&agent);
        (failed_requests(&agent) > failed && st["last_error"].is_string()).then_some(st)
    });
    let st = noticed.unwrap_or_else(|| panic!("no failure seen:\n{}", agent.log()));
    assert!(
        st["last_error"].as_str().unwrap().contains("Consul"),
        "{st}"
    );
    // Staleness grows while the same copy is served.
    let stale = wait_for(LONG, || {
        assert_eq!(replies(&agent), GOOD);
        (agent.metric("gitlab_haproxy_agent_last_sync_age_seconds") >= 2.0).then_some(())
    });
    assert!(stale.is_some(), "sync age does not grow:\n{}", agent.log());
    assert_eq!(consul_index(&agent), index);
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);
    assert!(agent.log().contains("serving the last copy"));
    let made = all_requests(&agent) - requests;
    let took = lost.elapsed();
    assert!(
        made <= 2.0 + took.as_millis() as f64 / 100.0,
        "{made} Consul requests in {took:?}"
    );

    // The killed server comes back (same data, same ports): a leader is
    // elected again and a new write is picked up.
    servers[l].start();
    servers[f].wait_writable("canary", "maint");
    wait_replies(&agent, &CANARY_MAINT);
    assert_eq!(status(&agent)["last_error"], serde_json::Value::Null);
    assert!(agent.log().contains("Consul reachable again"));

    // The agent's own server is killed: connection errors, same answers.
    let before = replies(&agent);
    let index = consul_index(&agent);
    let refused = outcome(&agent, "connect_error");
    servers[f].kill();
    let noticed = wait_for(LONG, || {
        assert_eq!(replies(&agent), before);
        (outcome(&agent, "connect_error") > refused).then_some(())
    });
    assert!(noticed.is_some(), "{}", agent.log());
    assert_eq!(consul_index(&agent), index);
    // Restarted on the same data: the agent reads it again by itself and
    // follows the next write.
    servers[f].start();
    servers[f].wait_writable("web/web-02", "drain");
    wait_replies(
        &agent,
        &[
            "maint 100%\n",
            "maint 100%\n",
            "drain 100%\n",
            "ready 100%\n",
        ],
    );
    assert_eq!(status(&agent)["last_error"], serde_json::Value::Null);
}

// ---------------------------------------------------------------------------
// Responder: hostile clients

#[test]
fn hostile_clients_never_hold_up_well_formed_checks() {
    let (_fake, agent) = fake_and_agent(&["--check-timeout", "300ms"]);
    let listen = agent.listen;
    let bad_requests = || agent.metric("gitlab_haproxy_agent_answers_total{kind=\"bad_request\"}");
    let bad_before = bad_requests();
    let not_utf8: [&[u8]; 6] = [
        b"\xff\xfe\n",
        b"web/web-01 \xc3\x28\n",
        b"web/web-01\x00\n",
        b"\xc0\xaf canary\n",
        b"canary\xff\r\n",
        b"\xff\xff\xff",
    ];
    const SILENT: usize = 20;
    const ENDLESS: usize = 3;
    const DRIBBLE: usize = 3;

    std::thread::scope(|s| {
        let silent: Vec<_> = (0..SILENT)
            .map(|_| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut c = TcpStream::connect(listen).unwrap();
                    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut buf = [0u8; 64];
                    let n = c.read(&mut buf).unwrap_or(0);
                    (n, start.elapsed())
                })
            })
            .collect();
        // An endless line: bytes and no LF, as fast as the agent takes them.
        let endless: Vec<_> = (0..ENDLESS)
            .map(|_| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut c = TcpStream::connect(listen).unwrap();
                    c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                    let chunk = [b'a'; 4096];
                    while start.elapsed() < Duration::from_secs(10) {
                        if c.write(&chunk).is_err() {
                            break;
                        }
                    }
                    let closed_after = start.elapsed();
                    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut out = Vec::new();
                    let _ = c.read_to_end(&mut out);
                    (out, closed_after)
                })
            })
            .collect();
        // An endless line, one byte at a time.
        let dribble: Vec<_> = (0..DRIBBLE)
            .map(|_| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut c = TcpStream::connect(listen).unwrap();
                    while start.elapsed() < Duration::from_secs(10) {
                        if c.write(b"w").is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    let closed_after = start.elapsed();
                    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut out = Vec::new();
                    let _ = c.read_to_end(&mut out);
                    (out, closed_after)
                })
            })
            .collect();
        let garbage = s.spawn(move || {
            not_utf8
                .iter()
                .map(|b| try_ask(listen, b))
                .collect::<Vec<_>>()
        });

        // Well-formed checks meanwhile: every one answered, right, at once.
        for _ in 0..30 {
            let t = Instant::now();
            assert_eq!(agent.ask(LINES[1]), GOOD[1]);
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
            std::thread::sleep(Duration::from_millis(30));
        }

        for h in silent {
            let (n, took) = h.join().unwrap();
            assert_eq!(n, 0, "a silent client got an answer");
            assert!(
                took >= Duration::from_millis(250) && took < Duration::from_secs(3),
                "silent client closed after {took:?}"
            );
        }
        for h in endless.into_iter().chain(dribble) {
            let (out, took) = h.join().unwrap();
            assert!(out.is_empty(), "an endless line got {out:?}");
            assert!(
                took < Duration::from_secs(3),
                "endless line cut after {took:?}"
            );
        }
        for (bytes, got) in not_utf8.iter().zip(garbage.join().unwrap()) {
            assert_eq!(got.as_deref(), Some(""), "{bytes:?}");
        }
    });

    let hostile = (SILENT + ENDLESS + DRIBBLE + not_utf8.len()) as f64;
    let ok = wait_for(LONG, || {
        (bad_requests() == bad_before + hostile).then_some(())
    });
    assert!(
        ok.is_some(),
        "bad_request went from {bad_before} to {}, expected +{hostile}",
        bad_requests()
    );
    until_in_flight_is_zero(&agent);
    assert_eq!(replies(&agent), GOOD);
}

/// Connects `n` times to `addr` from 127.0.0.2 (so the client ports never
/// collide with listeners other tests bind on 127.0.0.1), at most
/// `at_once` connects in flight, and runs `each` on every connection
/// (with its number); returns what each returned.
fn connect_many<T, F>(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    n: usize,
    at_once: usize,
    each: impl Fn(tokio::net::TcpStream, usize) -> F + Send + Sync + 'static,
) -> Vec<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let each = Arc::new(each);
    rt.block_on(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(at_once));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let slots = slots.clone();
            let each = each.clone();
            set.spawn(async move {
                let slot = slots.acquire_owned().await.unwrap();
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                let stream = tokio::time::timeout(Duration::from_secs(20), socket.connect(addr))
                    .await
                    .expect("connect in time")
                    .expect("connect");
                drop(slot);
                each(stream, i).await
            });
        }
        let mut out = Vec::with_capacity(n);
        while let Some(r) = set.join_next().await {
            out.push(r.unwrap());
        }
        out
    })
}

/// Tells helper threads to stop. [`Stop::guard`] sets it when dropped, so
/// a failing assertion in a thread scope cannot leave them running (and the
/// scope waiting) forever.
#[derive(Default)]
struct Stop(AtomicBool);

impl Stop {
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn guard(&self) -> StopGuard<'_> {
        StopGuard(self)
    }
}

struct StopGuard<'a>(&'a Stop);

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// One agent-check as seen by a client during a storm.
struct Probe {
    /// The reply; `None` when the connection could not be made in 2 s
    /// (the kernel dropped the SYN: the accept queue was full).
    reply: Option<String>,
    /// From connected to the agent's close.
    served_in: Duration,
}

/// Asks `line` every 20 ms until `stop`.
fn probe(addr: SocketAddr, line: &str, stop: &Stop) -> Vec<Probe> {
    let mut out = Vec::new();
    let bytes = format!("{line}\n");
    while !stop.is_set() {
        let mut probe = Probe {
            reply: None,
            served_in: Duration::ZERO,
        };
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            let t = Instant::now();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(bytes.as_bytes());
            let mut reply = Vec::new();
            let _ = s.read_to_end(&mut reply);
            probe = Probe {
                reply: Some(String::from_utf8_lossy(&reply).into_owned()),
                served_in: t.elapsed(),
            };
        }
        out.push(probe);
        std::thread::sleep(Duration::from_millis(20));
    }
    out
}

#[test]
fn ten_thousand_connections_at_once_leave_the_agent_answering() {
    const N: usize = 10_000;
    ensure_fd_limit(N as u64 + 1_000);
    let (_fake, mut agent) = fake_and_agent(&[]);
    let done = connections_done(&agent);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = Stop::default();
    let (probes, opened, after) = std::thread::scope(|s| {
        let prober = s.spawn(|| probe(agent.listen, LINES[1], &stop));
        let _stop = stop.guard();
        let t = Instant::now();
        // Silent connections, all open at once: the first 1,024 hold a slot
        // until the check timeout (500 ms), the rest are closed at once.
        let conns = connect_many(&rt, agent.listen, N, 1000, |c, _| async move { c });
        let opened = t.elapsed();
        assert_eq!(conns.len(), N);
        // Still holding all of them, the agent answers once the slot holders
        // have timed out.
        let mut after = 0;
        let answered = wait_for(Duration::from_secs(5), || {
            after += 1;
            (try_ask(agent.listen, b"web/web-01 canary\n").as_deref() == Some(GOOD[1]))
                .then_some(())
        });
        assert!(
            answered.is_some(),
            "no answer while holding {N} connections"
        );
        rt.block_on(async move { drop(conns) });
        stop.set();
        (prober.join().unwrap(), opened, after)
    });
    assert!(agent.proc().try_wait().is_none(), "the agent died");
    // Never a wrong answer. A check that got a connection was answered or
    // closed well within the 500 ms check timeout, never held.
    for p in &probes {
        if let Some(reply) = &p.reply {
            assert!(reply.is_empty() || reply == GOOD[1], "{reply:?}");
        }
        assert!(
            p.served_in < Duration::from_secs(2),
            "held {:?}",
            p.served_in
        );
    }
    let right = probes
        .iter()
        .filter(|p| p.reply.as_deref() == Some(GOOD[1]))
        .count();
    assert!(right > 0, "no check answered; connecting took {opened:?}");
    // Every connection is accounted for: answered, closed unanswered, or
    // refused at the cap (most of them: only 1,024 fit).
    let reached = probes.iter().filter(|p| p.reply.is_some()).count();
    assert_accounted(&agent, done, N + reached + after, N / 100);
    assert!(agent.metric("gitlab_haproxy_agent_connections_refused_total") > 0.0);
    until_in_flight_is_zero(&agent);
    assert_eq!(replies(&agent), GOOD);
}

#[test]
fn a_burst_of_resets_leaves_the_agent_answering() {
    const N: usize = 3_000;
    let (_fake, mut agent) = fake_and_agent(&[]);
    let done = connections_done(&agent);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = Stop::default();
    let probes = std::thread::scope(|s| {
        let prober = s.spawn(|| probe(agent.listen, LINES[0], &stop));
        let _stop = stop.guard();
        // Three kinds of reset, 200 at a time: at once, mid-line, and
        // before reading the answer; SO_LINGER 0 makes each close a RST.
        connect_many(&rt, agent.listen, N, 200, |mut c, i| async move {
            use tokio::io::AsyncWriteExt;
            c.set_zero_linger().unwrap();
            match i % 3 {
                0 => {}
                1 => {
                    let _ = c.write_all(b"web/web-0").await;
                }
                _ => {
                    let _ = c.write_all(b"web/web-01\n").await;
                }
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        stop.set();
        prober.join().unwrap()
    });
    assert!(agent.proc().try_wait().is_none(), "the agent died");
    // A probe whose SYN the kernel dropped (listen queue full under the
    // flood) never reached the agent; every one that connected was answered
    // right.
    let reached: Vec<_> = probes.iter().filter(|p| p.reply.is_some()).collect();
    assert!(!reached.is_empty(), "no check reached the agent");
    for p in &reached {
        assert_eq!(
            p.reply.as_deref(),
            Some(GOOD[0]),
            "a check during the resets"
        );
    }
    assert_accounted(&agent, done, N + reached.len(), N / 20);
    until_in_flight_is_zero(&agent);
    assert_eq!(replies(&agent), GOOD);
}

#[test]
fn out_of_file_descriptors_the_agent_backs_off_and_answers_again() {
    let (fake, mut agent) = fake_and_agent(&["--check-timeout", "2s"]);
    let pid = agent.proc().pid();
    let errors = agent.metric("gitlab_haproxy_agent_accept_errors_total");
    // A low `ulimit -n` for the running agent.
    let ok = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg("--nofile=64:64")
        .status()
        .expect("util-linux prlimit");
    assert!(ok.success());
    assert_eq!(agent.metric("process_max_fds"), 64.0);

    // More silent clients than the agent has descriptors for.
    let conns: Vec<TcpStream> = (0..150)
        .map(|_| TcpStream::connect(agent.listen).unwrap())
        .collect();
    let full = wait_for(Duration::from_secs(5), || {
        (open_fds(pid) >= 62).then_some(())
    });
    assert!(full.is_some(), "the agent holds {} fds", open_fds(pid));
    // A well-formed check waits in the backlog meanwhile.
    let listen = agent.listen;
    let pending = std::thread::spawn(move || try_ask(listen, b"web/web-01 canary\n"));
    std::thread::sleep(Duration::from_millis(500));
    drop(conns);
    assert_eq!(pending.join().unwrap().as_deref(), Some(GOOD[1]));
    let back = wait_for(LONG, || {
        (try_ask(listen, b"x/y canary\n").as_deref() == Some(GOOD[0])).then_some(())
    });
    assert!(back.is_some(), "{}", agent.log());
    assert!(agent.proc().try_wait().is_none(), "the agent died");
    assert!(agent.metric("gitlab_haproxy_agent_accept_errors_total") > errors);
    assert!(agent.log().contains("accept failed; backing off"));
    until_in_flight_is_zero(&agent);
    // The watcher still follows Consul.
    fake.put("canary", b"maint");
    wait_replies(&agent, &CANARY_MAINT);
}

// ---------------------------------------------------------------------------
// Process: SIGKILL and restart under load

#[test]
fn sigkill_and_restart_under_load_never_gives_a_wrong_answer() {
    let fake = FakeConsul::start(PREFIX, 100);
    for (k, v) in GOOD_KEYS {
        fake.put(k, v);
    }
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_on(&fake.url(), port, http_port, &[]);
    agent.wait_ready();
    let listen = agent.listen;
    let stop = Stop::default();
    let seen: Mutex<Vec<(usize, Option<String>)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.is_set() {
                    for (i, line) in LINES.iter().enumerate() {
                        let got = try_ask(listen, format!("{line}\n").as_bytes());
                        seen.lock().unwrap().push((i, got));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
        let _stop = stop.guard();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(300));
            agent.proc().kill();
            // The restarted agent cannot sync for a while.
            fake.set_sticky(Some(Reply::error("no leader", 500, "No cluster leader")));
            let restarted = Agent::spawn_on(&fake.url(), port, http_port, &[]);
            let unsynced = wait_for(LONG, || {
                let m = restarted.http_get("/metrics")?.1;
                (sample(&m, "gitlab_haproxy_agent_answers_total{kind=\"unsynced\"}")? >= 8.0)
                    .then_some(())
            });
            assert!(unsynced.is_some(), "{}", restarted.log());
            assert_eq!(restarted.http_get("/-/ready").unwrap().0, 503);
            // Its log does not claim a copy it does not have. (The unsynced
            // answers above can all come before its first read has failed.)
            let failed = wait_for(LONG, || {
                restarted
                    .log()
                    .contains("Consul request failed; not synced yet, answering nobody")
                    .then_some(())
            });
            let log = restarted.log();
            assert!(failed.is_some(), "{log}");
            assert!(!log.contains("serving the last copy"), "{log}");
            fake.set_sticky(None);
            restarted.wait_ready();
            agent = restarted;
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.set();
    });
    let seen = seen.into_inner().unwrap();
    let mut unanswered = 0;
    for (i, got) in &seen {
        match got.as_deref() {
            None | Some("") => unanswered += 1,
            Some(a) => assert_eq!(a, GOOD[*i], "{}", LINES[*i]),
        }
    }
    assert!(
        unanswered > 0 && seen.len() > unanswered + 20,
        "{unanswered} of {}",
        seen.len()
    );
    assert_eq!(replies(&agent), GOOD);
}
