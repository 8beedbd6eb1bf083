//! `--consul-fallback-addr` is read through only once it is proven the same
//! Consul as `--consul-addr` (its datacenter on `/v1/agent/self` and the
//! store id under the prefix, read with the agent's token), against real
//! Consuls and the agent binary:
//!
//! - a second Consul started `-datacenter dc2`, with its own store id and a
//!   drain and a maint nobody wrote here: refused at start-up and named
//!   (`/status`, the metric, the log); with the primary stopped the agent
//!   never reads through it and keeps answering its last state;
//! - a client agent and the servers of one cluster: the servers are
//!   proven, and while the client agent hangs (SIGSTOP) a drain is served
//!   through them;
//! - ACLs on, the primary a client agent whose default token reads, the
//!   fallback the server, where the agent has no token: refused as
//!   `denied` and named; its ACL-filtered answers confirm nothing and it is
//!   never read through;
//! - a `--consul-addr` that accepts and never answers at start-up, with
//!   `--consul-datacenter`: the agent is ready from the fallback within
//!   `--startup-timeout` (5 s); without it nothing can be proven and the
//!   agent exits naming why;
//! - no list given: the servers are found through the client agent
//!   (`/v1/status/peers`), a server that joins and one that leaves are
//!   followed without a restart, and a drain is served through one found
//!   while the client agent hangs; `none` finds nothing.
//!
//! About 90 s.

mod support;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::{free_port, wait_for, Agent, Consul, Proc, TempDir, PREFIX};

/// How long the tests watch an agent whose primary is gone: long enough for
/// several index checks, failed reads and their backoff (at 2 s checks).
const WATCH: Duration = Duration::from_secs(12);

/// `state ARGS --consul-addr URL` with the writer CLI (with the token in
/// `token_file`, if any); panics unless it exits 0.
#[track_caller]
fn writer(url: &str, token_file: Option<&std::path::Path>, args: &[&str]) {
    let mut cmd = support::state_command(url, args);
    if let Some(file) = token_file {
        cmd.arg("--consul-token-file").arg(file);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "state {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/status` as JSON.
fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The `state` of the n-th `--consul-fallback-addr` on `/status`.
fn fallback_state(agent: &Agent, n: usize) -> String {
    status(agent)["consul_fallbacks"][n]["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// For `WATCH`, every 250 ms: `lines` are answered as they were at the
/// start; panics naming the first that changed.
#[track_caller]
fn answers_stay(agent: &Agent, lines: &[&str]) {
    let before: Vec<String> = lines.iter().map(|l| agent.ask(l)).collect();
    let until = Instant::now() + WATCH;
    while Instant::now() < until {
        for (line, was) in lines.iter().zip(&before) {
            let now = agent.ask(line);
            assert_eq!(
                &now,
                was,
                "{line:?} changed with the primary gone\n{}",
                agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Reads never went through a fallback.
#[track_caller]
fn never_rerouted(agent: &Agent) {
    assert_eq!(agent.metric("gitlab_haproxy_agent_consul_route"), 0.0);
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_route_switches_total"),
        0.0,
        "{}",
        agent.log()
    );
    assert!(
        !agent
            .log()
            .contains("reads go through --consul-fallback-addr"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_fallback_of_another_datacenter_is_refused_named_and_never_read_through() {
    let mut dc1 = Consul::start();
    let dc2 = Consul::start_with(&["-datacenter", "dc2"]);
    writer(&dc1.url(), None, &["set", "web/s1", "40%"]);
    writer(&dc2.url(), None, &["set", "web/s1", "maint"]);
    writer(&dc2.url(), None, &["set", "web/s2", "drain"]);
    let agent = Agent::start(&dc1.url(), &["--consul-fallback-addr", &dc2.url()]);
    let weight = agent.ask("web/s1");
    assert!(weight.contains("40%"), "{weight:?}");

    dc1.stop();
    answers_stay(&agent, &["web/s1", "web/s2", "web/s3"]);
    never_rerouted(&agent);

    // Named: /status, the metric, the log.
    let s = status(&agent);
    assert_eq!(s["consul_datacenter"], "dc1", "{s:#}");
    let fallback = &s["consul_fallbacks"][0];
    assert_eq!(fallback["addr"], dc2.url().as_str(), "{s:#}");
    assert_eq!(fallback["state"], "other_datacenter", "{s:#}");
    let detail = fallback["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"dc2\"") && detail.contains("\"dc1\""),
        "{detail}"
    );
    assert_eq!(s["consul_current"], false, "{s:#}");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_fallback_refused{reason=\"other_datacenter\"}"),
        1.0
    );
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(&dc2.url())
            && l.contains("other_datacenter")
            && l.contains("dc2")),
        "{log}"
    );
    assert!(!log.contains("went backwards"), "{log}");
}

#[test]
fn a_fallback_into_the_same_datacenter_is_proven_and_read_through_while_the_primary_hangs() {
    let cluster = Cluster::start(1);
    let (s1, s2, c1) = (&cluster.servers[0], &cluster.servers[1], cluster.client(0));
    writer(&s1.url(), None, &["set", "web/s1", "ready"]);
    let fallbacks = format!("{},{}", s1.url(), s2.url());
    let agent = Agent::start(&c1.url(), &["--consul-fallback-addr", &fallbacks]);
    // A fresh agent proves them at its first probe: at start-up it serves
    // no store id yet to prove them by.
    assert_eq!(fallback_state(&agent, 0), "unproven");
    assert_eq!(status(&agent)["consul_datacenter"], "dc1");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_fallback_refused{reason=\"denied\"}"),
        0.0
    );

    // The client agent accepts connections (the kernel does) and answers
    // nothing.
    c1.pause();
    let start = Instant::now();
    writer(&s1.url(), None, &["set", "web/s1", "drain"]);
    agent.wait_answer("web/s1", "drain 100%\n");
    let served = start.elapsed();
    c1.resume();
    eprintln!("drain served through a fallback {served:?} after the client agent hung");
    assert!(served < Duration::from_secs(10), "{served:?}");
    assert!(agent.metric("gitlab_haproxy_agent_consul_route") > 0.0);
    let in_use = status(&agent)["consul_fallback_in_use"].clone();
    assert!(
        (0..2).any(|i| fallback_state(&agent, i) == "proven"),
        "{:#}",
        status(&agent)
    );
    assert!(in_use.is_string(), "{in_use}");
}

/// A Consul client agent on 127.0.0.1 joined to `server`, with ACLs on and
/// `default_token` as its default token (used for requests that carry
/// none); waits (up to 30 s) until it reads the prefix's read-check key
/// without a 403.
fn acl_client(server: &Consul, master: &str, default_token: &str) -> (Proc, String, TempDir) {
    let dir = TempDir::new("consul-client");
    let cfg = dir.path().join("acl.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"primary_datacenter":"dc1","acl":{{"enabled":true,"default_policy":"deny","down_policy":"extend-cache","tokens":{{"agent":"{master}","default":"{default_token}"}}}}}}"#
        ),
    )
    .unwrap();
    let http = free_port();
    let mut cmd = Command::new("consul");
    cmd.args(["agent", "-bind", "127.0.0.1", "-client", "127.0.0.1"])
        .arg(format!("-http-port={http}"))
        .arg(format!("-serf-lan-port={}", free_port()))
        .args(["-dns-port=-1", "-grpc-port=-1"])
        .arg(format!("-node=fallback-client-{http}"))
        .arg(format!("-data-dir={}", dir.path().join("data").display()))
        .arg(format!("-retry-join=127.0.0.1:{}", server.serf_lan_port()))
        .arg(format!("-config-file={}", cfg.display()));
    let proc = Proc::spawn(cmd, dir.path().join("client.log"));
    let url = format!("http://127.0.0.1:{http}");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    let reads = wait_for(Duration::from_secs(30), || {
        let path = format!("/v1/kv/{PREFIX}~read-check");
        let (code, _, _) = support::http_request(addr, "GET", &path, b"")?;
        (code == 404).then_some(())
    });
    assert!(reads.is_some(), "client agent:\n{}", proc.log());
    (proc, url, dir)
}

#[test]
fn a_fallback_that_does_not_know_the_token_is_refused_named_and_never_read_through() {
    const MASTER: &str = "5c4e0a4e-6a43-4b9b-9a39-3b0c7a1e0f01";
    let server = Consul::start_acl(MASTER);
    server.put_policy(
        "agent-read",
        r#"key_prefix "gitlab-haproxy-agent/state/" { policy = "read" }
agent_prefix "" { policy = "read" }"#,
    );
    let (_, read_token) = server.token_with("agent-read");
    let (mut client, client_url, _client_dir) = acl_client(&server, MASTER, &read_token);
    let tokens = TempDir::new("token");
    let master_file = tokens.path().join("master");
    std::fs::write(&master_file, MASTER).unwrap();
    writer(&server.url(), Some(&master_file), &["set", "web/s1", "40%"]);
    writer(
        &server.url(),
        Some(&master_file),
        &["set", "web/s2", "drain"],
    );

    // No token file: the client agent's default token reads; the server
    // knows the agent as anonymous, which may read nothing.
    let agent = Agent::start(&client_url, &["--consul-fallback-addr", &server.url()]);
    let weight = agent.ask("web/s1");
    assert!(weight.contains("40%"), "{weight:?}\n{}", agent.log());

    client.kill();
    answers_stay(&agent, &["web/s1", "web/s2"]);
    never_rerouted(&agent);
    let s = status(&agent);
    assert_eq!(s["consul_fallbacks"][0]["state"], "denied", "{s:#}");
    let detail = s["consul_fallbacks"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("403"), "{detail}");
    assert_eq!(s["consul_current"], false, "{s:#}");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_fallback_refused{reason=\"denied\"}"),
        1.0
    );
    let log = agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&server.url()) && l.contains("403")),
        "{log}"
    );
    assert!(!log.contains("went backwards"), "{log}");
}

#[test]
fn a_hung_consul_addr_at_start_moves_to_a_proven_fallback_within_the_startup_timeout() {
    let consul = Consul::start();
    writer(&consul.url(), None, &["set", "web/s1", "drain"]);
    // Bound, never accepted: the kernel completes every connection and
    // nothing ever answers.
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());

    // The agent served this store before (its state file holds the store
    // id a fallback is proven by), and restarts while --consul-addr hangs.
    let state = TempDir::new("fallback-hung");
    let dir = state.path().to_str().unwrap();
    let mut before = Agent::spawn(&consul.url(), &["--state-dir", dir]);
    before.wait_ready();
    assert_eq!(before.ask("web/s1"), "drain 100%\n");
    assert!(before.terminate().is_some_and(|s| s.success()));
    drop(before);

    let started = Instant::now();
    let agent = Agent::spawn(
        &hung_url,
        &[
            "--consul-fallback-addr",
            &consul.url(),
            "--consul-datacenter",
            "dc1",
            "--state-dir",
            dir,
        ],
    );
    let ready = wait_for(Duration::from_secs(8), || {
        (agent.http_get("/-/ready")?.0 == 200).then(|| started.elapsed())
    });
    let ready = ready.unwrap_or_else(|| panic!("not ready:\n{}", agent.log()));
    eprintln!("ready through the fallback {ready:?} after the start");
    assert!(ready < Duration::from_millis(5500), "{ready:?}");
    assert_eq!(agent.ask("web/s1"), "drain 100%\n");
    let s = status(&agent);
    assert_eq!(s["consul_fallback_in_use"], consul.url().as_str(), "{s:#}");
    assert_eq!(s["consul_fallbacks"][0]["state"], "proven", "{s:#}");

    // Without --consul-datacenter our datacenter cannot be known while
    // --consul-addr does not answer, nor without a state served the store
    // id: nothing is proven, nothing is read, and the agent exits after
    // --startup-timeout saying why.
    let mut unpinned = Agent::spawn(&hung_url, &["--consul-fallback-addr", &consul.url()]);
    let exit = unpinned.proc().wait_exit(Duration::from_secs(15));
    assert_eq!(exit.and_then(|e| e.code()), Some(1), "{}", unpinned.log());
    let log = unpinned.log();
    assert!(log.contains("--consul-datacenter"), "{log}");
    assert!(
        !log.contains("reads go through --consul-fallback-addr"),
        "{log}"
    );
    drop(hung);
}

/// Two unrelated Consuls, both `dc1` (Consul's default name), neither
/// written by the writer (no store id): the fallback, ahead in index,
/// holds `ready` where the primary holds a drain by hand. With the primary
/// stopped, nothing proves the fallback the same Consul, so it is never
/// read through and the drain stays. Before the store id was required on
/// both sides, the datacenter name alone proved it and `ready 100%` was
/// served.
#[test]
fn an_unrelated_consul_of_the_same_name_without_a_store_id_is_never_read_through() {
    let mut primary = Consul::start();
    primary.put("web/s1", "drain");
    let other = Consul::start();
    for i in 0..20 {
        other.put("web/s1", if i % 2 == 0 { "maint" } else { "ready" });
    }
    assert!(other.prefix_index() > primary.prefix_index());
    let agent = Agent::start(
        &primary.url(),
        &[
            "--consul-fallback-addr",
            &other.url(),
            "--index-check",
            "1s",
        ],
    );
    assert_eq!(agent.ask("web/s1"), "drain 100%\n");

    primary.stop();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert_eq!(agent.ask("web/s1"), "drain 100%\n", "{}", agent.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    let s = status(&agent);
    assert_eq!(s["consul_fallbacks"][0]["state"], "unproven", "{s:#}");
    assert!(s["consul_fallback_in_use"].is_null(), "{s:#}");
    assert_eq!(agent.metric("gitlab_haproxy_agent_consul_route"), 0.0);
}

/// The addresses `/status` lists as fallbacks, sorted.
fn fallback_addrs(agent: &Agent) -> Vec<String> {
    let mut addrs: Vec<String> = status(agent)["consul_fallbacks"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["addr"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    addrs.sort();
    addrs
}

/// With no `--consul-fallback-addr`, an agent reading through a client
/// agent finds the cluster's servers (`/v1/status/peers`, on the client
/// agent's port), follows a server that joins and one that leaves without
/// a restart, and reads through one it found while the client agent hangs;
/// `none` finds nothing.
#[test]
fn servers_are_found_without_a_list_as_they_join_and_leave_and_read_through() {
    let mut cluster = Cluster::start(1);
    writer(&cluster.servers[0].url(), None, &["set", "web/s1", "ready"]);
    let c1 = cluster.client(0).url();
    let agent = Agent::start(&c1, &["--consul-fallback-refresh", "1s"]);
    let off = Agent::start(&c1, &["--consul-fallback-addr", "none"]);
    let urls = |cluster: &Cluster| -> Vec<String> {
        let mut u: Vec<String> = cluster
            .servers
            .iter()
            .filter(|s| s.is_running())
            .map(|s| s.url())
            .collect();
        u.sort();
        u
    };
    let within = Duration::from_secs(15);
    let follows = |cluster: &Cluster, what: &str| {
        let want = urls(cluster);
        let seen = wait_for(within, || (fallback_addrs(&agent) == want).then_some(()));
        assert!(
            seen.is_some(),
            "{what}: fallbacks {:?}, servers {want:?}\n{:#}\n{}",
            fallback_addrs(&agent),
            status(&agent),
            agent.log()
        );
        assert_eq!(
            agent.metric("gitlab_haproxy_agent_consul_fallbacks_found"),
            want.len() as f64
        );
    };
    follows(&cluster, "at start-up");
    let s = status(&agent);
    assert_eq!(s["consul_fallbacks_from"], "found", "{s:#}");
    assert_eq!(
        s["consul_fallback_discovery"]["found_through"],
        c1.as_str(),
        "{s:#}"
    );
    let s = status(&off);
    assert_eq!(s["consul_fallbacks_from"], "none", "{s:#}");
    assert_eq!(s["consul_fallbacks"], serde_json::json!([]), "{s:#}");
    assert!(s["consul_fallback_discovery"].is_null(), "{s:#}");

    let s4 = cluster.add_server();
    follows(&cluster, "a server joined");
    cluster.leave(0);
    follows(&cluster, "a server left");
    assert!(!fallback_addrs(&agent).contains(&cluster.servers[0].url()));

    // The client agent hangs: a drain is served through a server found.
    cluster.client(0).pause();
    writer(
        &cluster.servers[s4].url(),
        None,
        &["set", "web/s1", "drain"],
    );
    agent.wait_answer("web/s1", "drain 100%\n");
    let in_use = status(&agent)["consul_fallback_in_use"].clone();
    cluster.client(0).resume();
    assert!(
        in_use
            .as_str()
            .is_some_and(|a| urls(&cluster).iter().any(|u| u == a)),
        "{in_use}"
    );
}
