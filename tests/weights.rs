//! Weights inside the one promise, against a real Consul, a real HAProxy
//! and the agent: wherever the agent holds or withholds a value, it keeps
//! the lower side of the order of traffic (maint < drain < 0% < lower
//! weight < higher weight, `ready` at 100%), weights included.
//!
//! - the state file answers weights (only `ready` is withheld), so a HAProxy
//!   reload while Consul is down leaves a server at 0% or 25% there, not at
//!   its configured weight;
//! - a snapshot restore that brings back `ready` over `0%` holds the 0%;
//! - a Consul that comes back without its data holds a row key's 40% until
//!   `state release-rollback`, which names it first (`--dry-run`);
//! - a weight the token may no longer read caps what a later identity on
//!   the agent-send line answers: a group's `ready` gives 40%, not 100%, and
//!   its drain drains.
//!
//! Each test is one way a server at a lowered weight once went back to its
//! full weight.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::prometheus::Prometheus;
use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, Run, ServerState,
    TempDir, AGENT_BIN, PREFIX,
};

/// `agent-inter` of every server, milliseconds.
const INTER_MS: u64 = 200;

/// How long a state HAProxy is expected to reach may take: a few
/// agent-inters, with room for a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(10);

/// One server: its name, its configured weight, and the identities after
/// its row key on its agent-send line.
type Server<'a> = (&'a str, u32, &'a [&'a str]);

/// A HAProxy with one backend whose servers ask the agent on `port`, each
/// at its configured weight.
fn haproxy(port: u16, backend: &str, servers: &[Server]) -> Haproxy {
    let mut section = format!("backend {backend}\n");
    for (server, weight, ids) in servers {
        section.push_str(
            &server_line(backend, server, ids, port, INTER_MS)
                .replace(" weight 100 ", &format!(" weight {weight} ")),
        );
    }
    Haproxy::start(&haproxy_config(&section))
}

/// Whether HAProxy runs the server READY (no drain, no maint) at `pct` of
/// its configured weight (HAProxy's own scaling: `iweight * pct / 100`).
fn at_weight(pct: u32) -> impl Fn(&ServerState) -> bool {
    move |s| s.admin_state == 0 && s.uweight == s.iweight * pct / 100
}

/// Checks `cond` on the server every 50 ms for `during`.
#[track_caller]
fn server_stays(
    haproxy: &Haproxy,
    backend: &str,
    server: &str,
    what: &str,
    during: Duration,
    cond: impl Fn(&ServerState) -> bool,
) {
    let until = Instant::now() + during;
    while Instant::now() < until {
        let row = haproxy.server(backend, server);
        assert!(cond(&row), "{backend}/{server} is not {what}: {row:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `weight` column of `show stat` for one server.
fn stat_weight(haproxy: &Haproxy, backend: &str, server: &str) -> String {
    haproxy.stat()[&(backend.to_string(), server.to_string())]["weight"].clone()
}

/// Asks `line` every 100 ms for `during`; every answer must be `want`.
#[track_caller]
fn keeps_answering(agent: &Agent, line: &str, want: &str, during: Duration) {
    let until = Instant::now() + during;
    while Instant::now() < until {
        assert_eq!(agent.ask(line), want, "{line:?}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits up to 30 s until `/status` shows `key` held with `cause`; returns
/// its `held` entry.
#[track_caller]
fn wait_held(agent: &Agent, key: &str, cause: &str) -> serde_json::Value {
    let held = wait_for(Duration::from_secs(30), || {
        let held = status(agent)["held"][key].clone();
        (held["cause"] == cause).then_some(held)
    });
    held.unwrap_or_else(|| {
        panic!(
            "{key} not held as {cause}: {}\n{}",
            status(agent),
            agent.log()
        )
    })
}

/// `state ARGS` with the writer CLI against `consul` (and Prometheus at
/// `prometheus`, when given).
fn writer(consul: &Consul, prometheus: Option<&str>, args: &[&str]) -> Run {
    match prometheus {
        Some(url) => writer_env(
            consul,
            &[("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL", url)],
            args,
        ),
        None => writer_env(consul, &[], args),
    }
}

/// `state ARGS` with the writer CLI against `consul`, with more
/// environment variables (a token, Prometheus).
fn writer_env(consul: &Consul, envs: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = support::state_command(&consul.url(), args);
    Run::from(cmd.envs(envs.iter().copied()).output().unwrap())
}

/// [`writer`] that must exit 0.
#[track_caller]
fn write(consul: &Consul, args: &[&str]) {
    let run = writer(consul, None, args);
    assert_eq!(run.code, 0, "state {args:?}: {run:?}");
}

/// `s1 = 0%`, `s2 = drain`, `s3 = 25%` (configured weight 40) and `s4`
/// with no key; Consul stops, the agent restarts from its state file,
/// `check-ready` lets HAProxy reload, and a reload starts every server
/// READY at its configured weight. The agent answers the file's weights
/// and drain, so s1 is back at weight 0, s3 at 10 (25% of 40) and s2 in
/// DRAIN; only s4's `ready` is withheld, and the reload gives it its full
/// weight anyway.
#[test]
fn the_state_file_answers_weights_through_a_reload_while_consul_is_down() {
    let mut consul = Consul::start();
    write(&consul, &["set", "web/s1", "0%"]);
    write(&consul, &["set", "web/s2", "drain"]);
    write(&consul, &["set", "web/s3", "25%"]);
    let state = TempDir::new("weights-state");
    let dir = state.path().to_str().unwrap();
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &["--state-dir", dir]);
    agent.wait_ready();
    let servers: [Server; 4] = [
        ("s1", 100, &[]),
        ("s2", 100, &[]),
        ("s3", 40, &[]),
        ("s4", 100, &[]),
    ];
    let haproxy = haproxy(port, "web", &servers);
    haproxy.wait_server("web", "s1", CONVERGE, at_weight(0));
    haproxy.wait_server("web", "s2", CONVERGE, ServerState::is_drain);
    let s3 = haproxy.wait_server("web", "s3", CONVERGE, at_weight(25));
    assert_eq!((s3.iweight, s3.uweight), (40, 10), "{s3:?}");
    haproxy.wait_server("web", "s4", CONVERGE, ServerState::is_ready_full_weight);
    let file = state.path().join("served-state.json");
    let saved = wait_for(CONVERGE, || {
        let text = std::fs::read_to_string(&file).ok()?;
        (text.contains("web/s1") && text.contains("web/s3")).then_some(text)
    });
    assert!(saved.is_some(), "no state file with the weights");

    consul.stop();
    assert!(agent.terminate().is_some_and(|s| s.success()));
    drop(agent);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &["--state-dir", dir]);
    let answering = wait_for(CONVERGE, || {
        agent
            .http_get("/-/answering")
            .filter(|(code, body)| *code == 200 && body.contains("state file"))
    });
    assert!(answering.is_some(), "{}", agent.log());

    let out = Command::new(AGENT_BIN)
        .args(["check-ready", "--agent-addr", &agent.listen.to_string()])
        .args(["--http-addr", &agent.http.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check-ready refused the reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    haproxy.reload();
    haproxy.wait_server("web", "s1", CONVERGE, at_weight(0));
    haproxy.wait_server("web", "s3", CONVERGE, at_weight(25));
    haproxy.wait_server("web", "s2", CONVERGE, ServerState::is_drain);
    haproxy.wait_server("web", "s4", CONVERGE, ServerState::is_ready_full_weight);
    let during = Duration::from_secs(2);
    server_stays(&haproxy, "web", "s1", "at weight 0", during, at_weight(0));
    server_stays(&haproxy, "web", "s3", "at 25%", during, at_weight(25));
    server_stays(&haproxy, "web", "s2", "DRAIN", during, |s| s.is_drain());
    server_stays(&haproxy, "web", "s4", "READY at full weight", during, |s| {
        s.is_ready_full_weight()
    });
    assert_eq!(stat_weight(&haproxy, "web", "s1"), "0");
    assert_eq!(stat_weight(&haproxy, "web", "s3"), "10");
    assert_eq!(stat_weight(&haproxy, "web", "s4"), "100");
    assert_eq!(agent.ask("web/s1"), "ready 0%\n");
    assert_eq!(agent.ask("web/s3"), "ready 25%\n");
    assert_eq!(agent.ask("web/s2"), "drain 100%\n");
    assert_eq!(agent.ask("web/s4"), "", "{}", agent.log());
}

/// `web/s1 = ready`, a snapshot, then `web/s1 = 0%` and `web/s2 = drain`
/// (served); the snapshot is restored. The restored store says `ready` for
/// s1 and nothing for s2, and its write generation is lower than the one
/// served: the agent holds s1 at 0% and s2 at drain (rolled back), also
/// after the next write.
#[test]
fn a_restore_that_brings_back_ready_over_zero_percent_holds_the_zero() {
    let consul = Consul::start();
    let state = TempDir::new("weights-restore");
    let (port, http_port) = (free_port(), free_port());
    let dir = state.path().to_str().unwrap();
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &["--state-dir", dir]);
    agent.wait_ready();
    let servers: [Server; 3] = [("s1", 100, &[]), ("s2", 100, &[]), ("s3", 100, &[])];
    let haproxy = haproxy(port, "web", &servers);
    write(&consul, &["set", "web/s1", "ready"]);
    agent.wait_answer("web/s1", "ready 100%\n");
    let snap = state.path().join("s1-ready.snap");
    consul.snapshot("save", &snap);
    write(&consul, &["set", "web/s1", "0%"]);
    write(&consul, &["set", "web/s2", "drain"]);
    agent.wait_answer("web/s1", "ready 0%\n");
    agent.wait_answer("web/s2", "drain 100%\n");
    haproxy.wait_server("web", "s1", CONVERGE, at_weight(0));
    haproxy.wait_server("web", "s2", CONVERGE, ServerState::is_drain);

    consul.snapshot("restore", &snap);
    // The loss is seen (s2 gone from the restored store is held), and s1,
    // `ready` there, is held at 0%.
    let s2 = wait_held(&agent, "web/s2", "rolled_back");
    assert_eq!(s2["state"], "drain", "{s2}");
    keeps_answering(&agent, "web/s1", "ready 0%\n", Duration::from_secs(2));
    assert_eq!(agent.ask("web/s2"), "drain 100%\n");
    let s1 = wait_held(&agent, "web/s1", "rolled_back");
    assert_eq!(s1["state"], "0%", "{s1}");
    assert_eq!(s1["reply"], "ready 0%", "{s1}");
    server_stays(
        &haproxy,
        "web",
        "s1",
        "at weight 0",
        Duration::from_secs(1),
        at_weight(0),
    );

    // A write after the restore moves the index past the one served: still
    // held.
    write(&consul, &["set", "web/s3", "drain"]);
    agent.wait_answer("web/s3", "drain 100%\n");
    keeps_answering(&agent, "web/s1", "ready 0%\n", Duration::from_secs(1));
    assert_eq!(agent.ask("web/s2"), "drain 100%\n");
    assert_eq!(status(&agent)["held"]["web/s1"]["cause"], "rolled_back");
    server_stays(
        &haproxy,
        "web",
        "s1",
        "at weight 0",
        Duration::from_secs(1),
        at_weight(0),
    );
    assert!(haproxy.server("web", "s2").is_drain());
}

/// `api/api-01 = 40%` (a row key, beside the store id); a `-dev` Consul
/// restarts without its data. The agent holds the 40% (rolled back) on `/status` and in
/// `gitlab_haproxy_agent_held_key`, `state release-rollback --dry-run`
/// (through Prometheus) names it, and HAProxy keeps the server at 40%;
/// after `state release-rollback` it follows Consul, which has no key:
/// full weight.
#[test]
fn a_weight_lost_with_consuls_data_is_held_until_release_rollback() {
    let mut consul = Consul::start();
    // Written by hand, with the store id the writer would have created:
    // the store has no write generation.
    consul.put("~store-id", "8c3e5a1f0b9d4e27a6f1c0d2b3e4f5a6");
    consul.put("api/api-01", "40%");
    let agent = Agent::start(&consul.url(), &[]);
    let haproxy = haproxy(
        agent.listen.port(),
        "api",
        &[("api-01", 100, &[]), ("api-02", 100, &[])],
    );
    haproxy.wait_server("api", "api-01", CONVERGE, at_weight(40));
    let prometheus = Prometheus::start(&[agent.http]);
    let prom = prometheus.url();

    consul.restart();
    // The restarted store's answer is applied once the store id is gone
    // from what the agent serves.
    let applied = wait_for(Duration::from_secs(30), || {
        status(&agent)["store_id"].is_null().then_some(())
    });
    assert!(applied.is_some(), "{}", agent.log());
    keeps_answering(&agent, "api/api-01", "ready 40%\n", Duration::from_secs(2));
    let held = wait_held(&agent, "api/api-01", "rolled_back");
    assert_eq!(held["state"], "40%", "{held}");
    let capped =
        "at most ready 40%: the next identity decides when it gives less (held: rolled back)";
    assert_eq!(held["answer"], capped, "{held}");
    server_stays(
        &haproxy,
        "api",
        "api-01",
        "at 40%",
        Duration::from_secs(1),
        at_weight(40),
    );
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_held_key{key=\"api/api-01\",cause=\"rolled_back\",state=\"at most 40%\"}",
            1,
            |v| v == 1.0
        ),
        "Prometheus did not see api/api-01 held:\n{}",
        prometheus.log()
    );
    let run = writer(&consul, Some(&prom), &["release-rollback", "--dry-run"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says(&format!("  api/api-01: {capped} on 1/1 agents"));
    // A dry run releases nothing.
    keeps_answering(&agent, "api/api-01", "ready 40%\n", Duration::from_secs(1));

    let run = writer(&consul, Some(&prom), &["release-rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says(&format!("  api/api-01: {capped} on 1/1 agents"));
    agent.wait_answer("api/api-01", "ready 100%\n");
    haproxy.wait_server("api", "api-01", CONVERGE, ServerState::is_ready_full_weight);
    assert!(
        status(&agent)["held"]["api/api-01"].is_null(),
        "{}",
        status(&agent)
    );
}

/// The management token of the ACL test's Consul.
const MASTER: &str = "0b7e4f2a-6c1d-4e8b-9f3a-52d7c8e1a604";

/// ACLs on: `web/s3 = 40%` and the group `canary = ready`, after it on s3's
/// agent-send line. The token's policy then denies `web/s3`: a recursive
/// read leaves it out and a direct read is a 403, so the agent cannot tell
/// whether it still says 40% or was cleared. It neither answers the 40% as
/// its own (a later drain must still decide) nor skips it (canary's `ready`
/// would give 100%): it caps the line, and s3 stays at 40%. When canary is
/// drained, s3 drains.
#[test]
fn a_weight_hidden_from_the_token_caps_a_later_groups_ready() {
    let consul = Consul::start_acl(MASTER);
    let read = format!(r#"key_prefix "{PREFIX}" {{ policy = "read" }}"#);
    let policy = consul.put_policy("agent-read", &read);
    let dir = TempDir::new("weights-token");
    let token_file = dir.path().join("consul-token");
    std::fs::write(&token_file, consul.token_with("agent-read").1).unwrap();
    consul.put("web/s3", "40%");
    consul.put("canary", "ready");
    let state = TempDir::new("weights-token-state");
    let args = [
        "--consul-token-file",
        token_file.to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
    ];
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &args);
    agent.wait_ready();
    let servers: [Server; 2] = [("s3", 100, &["canary"]), ("s4", 100, &["canary"])];
    let haproxy = haproxy(port, "web", &servers);
    haproxy.wait_server("web", "s3", CONVERGE, at_weight(40));
    haproxy.wait_server("web", "s4", CONVERGE, ServerState::is_ready_full_weight);

    // The same policy, plus a deny on the one key.
    let rules = format!(r#"{read} key "{PREFIX}web/s3" {{ policy = "deny" }}"#);
    let body = serde_json::json!({"ID": policy, "Name": "agent-read", "Rules": rules});
    let (code, _, answer) = consul.request(
        "PUT",
        &format!("/v1/acl/policy/{policy}"),
        body.to_string().as_bytes(),
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&answer));
    // A blocking query keeps the ACL it started with: unrelated writes
    // until one is answered under the new policy and the agent has read
    // web/s3 directly (403).
    let mut n = 0;
    let hidden = wait_for(Duration::from_secs(30), || {
        n += 1;
        consul.put("zone-z", &format!("{}%", n % 100));
        std::thread::sleep(Duration::from_millis(300));
        let held = status(&agent)["held"]["web/s3"].clone();
        (held["cause"] == "hidden").then_some(held)
    });
    let held = hidden.unwrap_or_else(|| panic!("web/s3 not held hidden:\n{}", agent.log()));
    keeps_answering(
        &agent,
        "web/s3 canary",
        "ready 40%\n",
        Duration::from_secs(2),
    );
    server_stays(
        &haproxy,
        "web",
        "s3",
        "at 40%",
        Duration::from_secs(1),
        at_weight(40),
    );
    assert!(haproxy.server("web", "s4").is_ready_full_weight());
    assert_eq!(
        held["answer"],
        "at most ready 40%: the next identity decides when it gives less (held: hidden from the token)",
        "{held}"
    );
    // The writer says the same through Prometheus.
    let prometheus = Prometheus::start(&[agent.http]);
    let series =
        "gitlab_haproxy_agent_held_key{key=\"web/s3\",cause=\"hidden\",state=\"at most 40%\"}";
    assert!(
        prometheus.wait_until(Duration::from_secs(30), series, 1, |v| v == 1.0),
        "Prometheus did not see web/s3 capped:\n{}",
        agent.metrics()
    );
    let envs = [
        ("CONSUL_HTTP_TOKEN", MASTER),
        ("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL", &prometheus.url()),
    ];
    let capped = "at most ready 40%: the next identity decides when it gives less (held: hidden from the token) on 1/1 agents";
    let run = writer_env(&consul, &envs, &["get", "web/s3"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says(&format!("agents: {capped}"));
    let run = writer_env(&consul, &envs, &["list"]);
    run.says(&format!("  web/s3: {capped}"));
    drop(prometheus);

    // The agent restarts (no goodbye) with its state file, and HAProxy
    // reloads: the cap is kept, s3 is back at 40%.
    agent.proc().kill();
    drop(agent);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args);
    agent.wait_ready();
    haproxy.reload();
    haproxy.wait_server("web", "s3", CONVERGE, at_weight(40));
    keeps_answering(
        &agent,
        "web/s3 canary",
        "ready 40%\n",
        Duration::from_secs(1),
    );
    server_stays(
        &haproxy,
        "web",
        "s3",
        "at 40%",
        Duration::from_secs(1),
        at_weight(40),
    );
    assert_eq!(status(&agent)["held"]["web/s3"]["cause"], "hidden");

    consul.put("canary", "drain");
    agent.wait_answer("web/s3 canary", "drain 100%\n");
    haproxy.wait_server("web", "s3", CONVERGE, ServerState::is_drain);
    haproxy.wait_server("web", "s4", CONVERGE, ServerState::is_drain);
}
