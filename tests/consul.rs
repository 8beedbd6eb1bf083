//! The agent against a real Consul: start-up, outages, index resets, the
//! HTTP endpoints and the responder's bounds.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{ask_raw, wait_for, Agent, Consul};

const SOON: Duration = Duration::from_secs(5);

fn wait_answer(agent: &Agent, line: &str, want: &str) {
    let got = wait_for(Duration::from_secs(15), || {
        let a = agent.ask(line);
        (a == want).then_some(a)
    });
    assert!(
        got.is_some(),
        "{line:?}: wanted {want:?}, last {:?}\n{}",
        agent.ask(line),
        agent.log()
    );
}

#[test]
fn answers_from_the_first_identity_with_a_key() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    // An empty prefix (404 with an index) is a valid state: everyone ready.
    assert_eq!(agent.ask("web/web-cny-01 canary"), "ready 100%\n");
    consul.put("canary", "drain");
    wait_answer(&agent, "web/web-cny-01 canary", "drain 100%\n");
    consul.put("web/web-cny-01", "25%");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 25%\n");
    assert_eq!(agent.ask("web/web-cny-02\tcanary\r"), "drain 100%\n");
    assert_eq!(agent.ask("web/web-01"), "ready 100%\n");
    consul.put("web/web-01", "Maint");
    wait_answer(&agent, "web/web-01", "maint 100%\n");
    assert!(agent.metric("gitlab_haproxy_agent_answers_total{kind=\"drain\"}") >= 1.0);
    assert!(agent.metric("gitlab_haproxy_agent_answers_total{kind=\"weight\"}") >= 1.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_keys"), 3.0);
}

/// A host or image without CA certificates (a minimal Debian, the
/// sidecar's `FROM scratch` image) runs the agent against a plain
/// `http://` Consul: only an `https://` address needs the system's roots.
/// The system's roots are hidden here with the variables rustls reads them
/// by (`SSL_CERT_FILE`, `SSL_CERT_DIR`).
#[test]
fn a_host_without_ca_certificates_reads_a_plain_http_consul() {
    let consul = Consul::start();
    let empty = support::TempDir::new("no-ca-certificates");
    let none = empty.path().join("none.pem");
    let agent = Agent::spawn_env(
        &consul.url(),
        support::free_port(),
        support::free_port(),
        &[
            ("SSL_CERT_FILE", none.to_str().unwrap()),
            ("SSL_CERT_DIR", empty.path().to_str().unwrap()),
        ],
        &[],
    );
    agent.wait_ready();
    consul.put("canary", "drain");
    wait_answer(&agent, "web/web-cny-01 canary", "drain 100%\n");
}

#[test]
fn bad_lines_get_no_answer_and_are_counted() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &["--check-timeout", "300ms"]);
    for line in [
        &b"\n"[..],
        b"web/web-01 $HOME\n",
        b"a/b/c\n",
        b"\xff\xfe\n",
        b"web/web-01",
    ] {
        assert_eq!(ask_raw(agent.listen, line), "", "{line:?}");
    }
    // An endless line is cut off at the line limit.
    assert_eq!(ask_raw(agent.listen, &[b'a'; 4096]), "");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_answers_total{kind=\"bad_request\"}"),
        6.0
    );
    // Still answering well-formed lines.
    assert_eq!(agent.ask("web/web-01"), "ready 100%\n");
}

#[test]
fn silent_clients_cannot_hold_slots() {
    let consul = Consul::start();
    let agent = Agent::start(
        &consul.url(),
        &["--check-timeout", "300ms", "--max-connections", "2"],
    );
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(agent.listen).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    // Both slots are taken: a third client that has to wait for its line
    // takes the slot of the one that has waited longest, which is closed
    // unanswered at once.
    let mut silent = silent.into_iter();
    let mut oldest = silent.next().unwrap();
    let mut third = TcpStream::connect(agent.listen).unwrap();
    oldest
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let start = Instant::now();
    assert_eq!(oldest.read(&mut [0u8; 16]).unwrap_or(0), 0);
    assert!(start.elapsed() < Duration::from_millis(250));
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_connections_refused_total"),
        1.0
    );
    third.write_all(b"web/web-01\n").unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut reply = String::new();
    let _ = third.read_to_string(&mut reply);
    assert_eq!(reply, "ready 100%\n");
    // The other silent client is cut off at the check timeout.
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 16];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    assert_eq!(agent.ask("web/web-01"), "ready 100%\n");
}

#[test]
fn keeps_answering_through_a_consul_restart_then_follows_it() {
    let mut consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    consul.put("web/web-01", "drain");
    wait_answer(&agent, "web/web-01", "drain 100%\n");

    consul.stop();
    // Answers keep coming from the last copy while Consul is away.
    for _ in 0..10 {
        assert_eq!(agent.ask("web/web-01"), "drain 100%\n");
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for(SOON, || {
        let m = agent.metrics();
        (!m.contains("gitlab_haproxy_agent_consul_requests_total{outcome=\"connect_error\"} 0"))
            .then_some(())
    })
    .expect("connect errors counted");
    let status = agent.http_get("/status").unwrap().1;
    assert!(
        status.contains("\"last_error\": \"cannot reach Consul"),
        "{status}"
    );
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);

    // A dev Consul comes back empty, with its index starting over.
    consul.restart();
    consul.put("web/web-01", "maint");
    wait_answer(&agent, "web/web-01", "maint 100%\n");
    assert!(agent.log().contains("Consul reachable again"));
}

#[test]
fn follows_a_snapshot_restore_that_moves_the_index_backwards() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    consul.put("canary", "drain");
    wait_answer(&agent, "x/y canary", "drain 100%\n");
    let (status, _, snapshot) = consul.request("GET", "/v1/snapshot", b"");
    assert_eq!(status, 200);
    let before = consul.prefix_index();
    for i in 0..20 {
        consul.put("canary", if i % 2 == 0 { "maint" } else { "50%" });
    }
    wait_answer(&agent, "x/y canary", "ready 50%\n");
    assert!(consul.prefix_index() > before);

    let (status, _, body) = consul.request("PUT", "/v1/snapshot", &snapshot);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(consul.prefix_index(), before);
    wait_answer(&agent, "x/y canary", "drain 100%\n");
    assert!(agent.metric("gitlab_haproxy_agent_consul_index_resets_total") >= 1.0);
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_index"),
        before as f64
    );
    // The loop goes on blocking from the restored index.
    consul.put("canary", "ready");
    wait_answer(&agent, "x/y canary", "ready 100%\n");
}

#[test]
fn exits_non_zero_naming_consul_when_it_is_down_at_start() {
    let port = support::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    let mut agent = Agent::spawn(&url, &["--startup-timeout", "3s"]);
    let status = agent
        .proc()
        .wait_exit(Duration::from_secs(15))
        .expect("agent exits");
    assert_eq!(status.code(), Some(1));
    assert!(start.elapsed() < Duration::from_secs(10));
    // It keeps retrying (with back-off) for the whole --startup-timeout:
    // from its first log line to the fatal one, by the log's own clock.
    let log = agent.log();
    let at = |level: &str| {
        let line = log
            .lines()
            .find(|l| l.contains(level))
            .unwrap_or_else(|| panic!("no {level} line: {log}"));
        // `2026-11-29T11:20:08.820444Z`: seconds of the day.
        let clock = &line[11..26];
        let (h, m, s) = (&clock[..2], &clock[3..5], &clock[6..]);
        h.parse::<f64>().unwrap() * 3600.0
            + m.parse::<f64>().unwrap() * 60.0
            + s.parse::<f64>().unwrap()
    };
    let retried = (at("ERROR") - at("INFO")).rem_euclid(86_400.0);
    assert!(
        (2.9..5.0).contains(&retried),
        "gave up after {retried} s: {log}"
    );
    assert!(log.contains(&url), "{log}");
    assert!(log.contains("cannot reach Consul"), "{log}");
}

#[test]
fn with_json_logs_even_the_fatal_error_is_a_json_line() {
    let url = format!("http://127.0.0.1:{}", support::free_port());
    let mut agent = Agent::spawn(&url, &["--startup-timeout", "1s", "--log-format", "json"]);
    let status = agent
        .proc()
        .wait_exit(Duration::from_secs(15))
        .expect("agent exits");
    assert_eq!(status.code(), Some(1));
    let log = agent.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let last = lines.last().expect("at least one line");
    assert_eq!(last["level"], "ERROR", "{log}");
    let error = last["error"].as_str().expect("an error field");
    assert!(
        error.contains("cannot reach Consul") && error.contains(&url),
        "{log}"
    );
}

#[test]
fn http_endpoints_report_health_readiness_metrics_and_status() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    consul.put("web/bad", "drian");
    let agent = Agent::start(&consul.url(), &[]);
    assert_eq!(agent.http_get("/-/healthy").unwrap().0, 200);
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);
    assert_eq!(agent.http_get("/nope").unwrap().0, 404);
    agent.ask("web/web-cny-01 canary");

    let m = agent.metrics();
    for series in [
        "gitlab_haproxy_agent_build_info{version=\"",
        "gitlab_haproxy_agent_synced 1",
        "gitlab_haproxy_agent_last_sync_timestamp_seconds ",
        "gitlab_haproxy_agent_last_sync_age_seconds ",
        "gitlab_haproxy_agent_consul_requests_total{outcome=\"ok\"} ",
        "gitlab_haproxy_agent_consul_index_resets_total 0",
        "gitlab_haproxy_agent_keys 2",
        "gitlab_haproxy_agent_invalid_keys 1",
        "gitlab_haproxy_agent_answers_total{kind=\"drain\"} 1",
        "gitlab_haproxy_agent_rows_seen 1",
        "process_resident_memory_bytes ",
    ] {
        assert!(m.contains(series), "missing {series}\n{m}");
    }
    let age = agent.metric("gitlab_haproxy_agent_last_sync_age_seconds");
    assert!((0.0..10.0).contains(&age), "{age}");

    let status: serde_json::Value =
        serde_json::from_str(&agent.http_get("/status").unwrap().1).unwrap();
    assert_eq!(status["synced"], true);
    assert_eq!(status["keys"]["canary"]["state"], "drain");
    assert_eq!(status["keys"]["canary"]["reply"], "drain 100%");
    assert!(status["invalid"]["web/bad"]["reason"]
        .as_str()
        .unwrap()
        .contains("drian"));
    assert_eq!(status["rows"][0]["agent_send"], "web/web-cny-01 canary");
    assert_eq!(status["rows"][0]["answer"], "drain 100%");
}

#[test]
fn sigterm_finishes_answers_in_flight_and_exits_zero() {
    let consul = Consul::start();
    let mut agent = Agent::start(&consul.url(), &["--check-timeout", "2s"]);
    // A check in flight: connected, line not yet sent.
    let mut pending = TcpStream::connect(agent.listen).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    agent.proc().signal("TERM");
    std::thread::sleep(Duration::from_millis(100));
    pending.write_all(b"web/web-01\n").unwrap();
    let mut answer = String::new();
    pending
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = pending.read_to_string(&mut answer);
    assert_eq!(answer, "ready 100%\n");
    let status = agent
        .proc()
        .wait_exit(Duration::from_secs(8))
        .expect("exits");
    assert!(status.success());
    assert!(agent.log().contains("signal=\"SIGTERM\"") || agent.log().contains("SIGTERM"));
    // No longer accepting.
    assert!(TcpStream::connect(agent.listen).is_err());
}

#[test]
fn version_and_bad_options() {
    let out = Command::new(support::AGENT_BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("gitlab-haproxy-agent {}", env!("CARGO_PKG_VERSION"))
    );
    for args in [
        &["--no-such-flag"][..],
        &["--listen", "nowhere"],
        &["--prefix", "/bad prefix"],
        &["--wait", "60"],
        &["--consul-addr", "ftp://consul:8501"],
    ] {
        let out = Command::new(support::AGENT_BIN)
            .env_clear()
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("gitlab-haproxy-agent: "), "{err}");
    }
}

/// A check whose line is already in the socket when it is accepted needs no
/// slot: it is answered even while silent clients hold every slot, and
/// none of them is closed for it.
#[test]
fn a_check_whose_line_is_there_is_answered_at_the_cap() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(
        &consul.url(),
        &["--check-timeout", "2s", "--max-connections", "2"],
    );
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(agent.listen).unwrap())
        .collect();
    let full = wait_for(Duration::from_secs(2), || {
        (agent.metric("gitlab_haproxy_agent_connections_in_flight") == 2.0).then_some(())
    });
    assert!(full.is_some(), "the silent clients hold no slot");
    // The agent is stopped while the check connects and sends its line, so
    // the line is in the socket when the agent accepts it, as it is for
    // HAProxy's checks almost always.
    agent.proc_ref().signal("STOP");
    let mut check = TcpStream::connect(agent.listen).unwrap();
    check.write_all(b"web/web-cny-01 canary\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    agent.proc_ref().signal("CONT");
    check
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reply = String::new();
    let _ = check.read_to_string(&mut reply);
    assert_eq!(reply, "drain 100%\n", "{}", agent.log());
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_connections_refused_total"),
        0.0
    );
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_connections_in_flight"),
        2.0
    );
    drop(silent);
}

/// Runs `gitlab-haproxy-agent state ARGS --consul-addr URL`; returns the
/// exit code and stdout.
fn writer(consul: &Consul, args: &[&str]) -> (i32, String) {
    let out = Command::new(support::AGENT_BIN)
        .env_clear()
        // Writes that take servers out need a reason (tests/drain_records.rs
        // tests that and the records); the environment's default gives it.
        .env("GITLAB_HAPROXY_AGENT_REASON", "test")
        .arg("state")
        .args(args)
        .args(["--consul-addr", &consul.url()])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A dev Consul restarted comes back without its data, index starting over:
/// every drain, maint and weight vanishes. The agent keeps answering the
/// drain, maint and weight (held: gone, the weight would give its server
/// full weight), pages through `rollback_held_keys`, lists them on
/// /status, and releases a key on a new write to it and all of them on
/// `state release-rollback`; a `ready` that vanishes gives nothing more and
/// follows Consul. Deletes with a forward index apply at once.
#[test]
fn keys_lost_when_consul_comes_back_without_its_data_are_held_until_released() {
    let mut consul = Consul::start();
    consul.put("canary", "drain");
    consul.put("web/web-01", "maint");
    consul.put("web/web-02", "50%");
    consul.put("web/web-03", "ready");
    // Move the index well past where a restarted dev Consul starts.
    for i in 0..10 {
        consul.put("web/web-04", if i % 2 == 0 { "drain" } else { "ready" });
    }
    let agent = Agent::start(&consul.url(), &[]);
    let held = || agent.metric("gitlab_haproxy_agent_rollback_held_keys");

    consul.restart();
    // The blocking query in flight may be carried over to the new Consul
    // and end only with its wait (5 s) plus jitter.
    let resets = wait_for(Duration::from_secs(15), || {
        (agent.metric("gitlab_haproxy_agent_consul_index_resets_total") >= 1.0).then_some(())
    });
    assert!(resets.is_some(), "no reset seen:\n{}", agent.log());
    // Give the agent a moment to apply the empty store, then: still out.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        assert_eq!(
            agent.ask("web/web-cny-01 canary"),
            "drain 100%\n",
            "{}",
            agent.log()
        );
        assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
        assert_eq!(agent.ask("web/web-02"), "ready 50%\n");
        assert_eq!(agent.ask("web/web-03"), "ready 100%\n");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(held(), 3.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_keys"), 0.0);
    let status: serde_json::Value =
        serde_json::from_str(&agent.http_get("/status").unwrap().1).unwrap();
    for (key, state) in [
        ("canary", "drain"),
        ("web/web-01", "maint"),
        ("web/web-02", "50%"),
    ] {
        assert_eq!(status["held"][key]["state"], state, "{status}");
        assert_eq!(status["held"][key]["cause"], "rolled_back", "{status}");
    }
    assert!(agent.log().contains("Consul's data went backwards"));

    // A write elsewhere moves the index forward: still held.
    consul.put("web/web-05", "ready");
    wait_answer(&agent, "web/web-05", "ready 100%\n");
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
    // A new write to a held key releases that key.
    consul.put("web/web-01", "ready");
    wait_answer(&agent, "web/web-01", "ready 100%\n");
    assert_eq!(held(), 2.0);

    // One operator action releases the rest on every agent.
    let (code, out) = writer(&consul, &["release-rollback", "--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    assert_eq!(agent.ask("web/web-02"), "ready 50%\n");
    let (code, out) = writer(&consul, &["release-rollback"]);
    assert_eq!(code, 0, "{out}");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 100%\n");
    assert_eq!(agent.ask("web/web-02"), "ready 100%\n");
    assert_eq!(held(), 0.0);
    // The release key is the agent's own: not a key, not an invalid key.
    assert_eq!(agent.metric("gitlab_haproxy_agent_invalid_keys"), 0.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_keys"), 2.0);

    // Deletes with a forward-moving index apply at once, as before.
    consul.put("canary", "drain");
    wait_answer(&agent, "web/web-cny-01 canary", "drain 100%\n");
    consul.delete("canary");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 100%\n");
}

/// The bound on a drain through a blocking read that is never answered:
/// two index checks to re-issue the read, three more to replace it, the
/// full read, and HAProxy's next check; at `--index-check 1s`, about 5 s.
const UNANSWERED_BOUND: Duration = Duration::from_secs(12);

/// The agent reads through a proxy that withholds every blocking read
/// while index checks and full reads pass (an overloaded server, a proxy
/// that holds long polls), with `--wait 60s`; `fallback`: the real Consul
/// is also given as `--consul-fallback-addr`. A drain reaches HAProxy
/// within [`UNANSWERED_BOUND`], every check counted. On 89740e7 it came
/// after the request's timeout (71.6 s measured at `--wait 60s`), the
/// checks after the re-issue uncounted, the fallback never tried.
fn a_drain_through_a_read_never_answered(fallback: bool) {
    use support::withhold::WithholdingProxy;
    let consul = Consul::start();
    // The writer made the store id before (a fallback is proven by it).
    let (code, out) = writer(&consul, &["set", "web/s1", "ready"]);
    assert_eq!(code, 0, "{out}");
    let proxy = WithholdingProxy::start(consul.addr());
    proxy.withhold(true);
    let port = support::free_port();
    let consul_url = consul.url();
    let mut extra = vec!["--wait", "60s", "--index-check", "1s"];
    if fallback {
        extra.extend(["--consul-fallback-addr", &consul_url]);
    }
    let agent = Agent::spawn_on(&proxy.url(), port, support::free_port(), &extra);
    agent.wait_ready();
    let backend = format!(
        "backend web\n{}",
        support::server_line("web", "s1", &["web/s1"], port, 200)
    );
    let haproxy = support::Haproxy::start(&support::haproxy_config(&backend));
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| {
        s.is_ready_full_weight()
    });
    // The next blocking read is parked at the proxy.
    assert!(wait_for(Duration::from_secs(10), || (proxy.withheld() >= 1)
        .then_some(()))
    .is_some());
    let checks = |agent: &Agent| -> f64 {
        [
            "current",
            "behind",
            "below",
            "failed",
            "no_leader",
            "too_old",
        ]
        .iter()
        .map(|r| {
            agent.metric(&format!(
                "gitlab_haproxy_agent_index_checks_total{{result=\"{r}\"}}"
            ))
        })
        .sum()
    };

    let (code, out) = writer(&consul, &["set", "web/s1", "drain"]);
    assert_eq!(code, 0, "{out}");
    let written = Instant::now();
    let shown = wait_for(UNANSWERED_BOUND, || {
        haproxy
            .server("web", "s1")
            .is_drain()
            .then(|| written.elapsed())
    });
    eprintln!(
        "drain shown by HAProxy after {shown:?}; {} blocking reads withheld",
        proxy.withheld()
    );
    assert!(
        shown.is_some(),
        "no drain within {UNANSWERED_BOUND:?}: HAProxy {:?}, the agent answers {:?}\n{}",
        haproxy.server("web", "s1"),
        agent.ask("web/s1"),
        agent.log()
    );
    let behind = agent.metric("gitlab_haproxy_agent_index_checks_total{result=\"behind\"}");
    assert!(behind >= 5.0, "every check behind counted: {behind}");
    // Every check made is counted: one per second while parked.
    let before = checks(&agent);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        checks(&agent) >= before + 1.0,
        "checks go on and are counted"
    );
    let log = agent.log();
    assert!(
        log.contains("went unanswered while index checks showed Consul past it"),
        "{log}"
    );
    let route = agent.metric("gitlab_haproxy_agent_consul_route");
    if fallback {
        assert_eq!(route, 1.0, "reads moved to the fallback\n{log}");
        // Through the fallback, blocking reads are answered again.
        let (code, out) = writer(&consul, &["set", "web/s1", "maint"]);
        assert_eq!(code, 0, "{out}");
        assert!(
            haproxy
                .wait_server("web", "s1", Duration::from_secs(5), |s| s.is_maint())
                .is_maint(),
            "{}",
            agent.log()
        );
    } else {
        assert_eq!(route, 0.0);
    }
}

#[test]
fn a_drain_reaches_haproxy_within_seconds_through_a_read_never_answered() {
    a_drain_through_a_read_never_answered(false);
}

#[test]
fn a_read_never_answered_moves_reads_to_the_fallback() {
    a_drain_through_a_read_never_answered(true);
}
