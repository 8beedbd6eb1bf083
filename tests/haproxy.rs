//! The agent against a real Consul and a real HAProxy: every desired state
//! ends up in HAProxy's own numeric server state, whatever came before.

mod support;

use std::time::Duration;

use support::{haproxy_config, server_line, Agent, Consul, Haproxy, ServerState};

const INTER_MS: u64 = 200;
/// Enough for one agent-inter plus the agent's own Consul wake-up, with slack
/// for a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(5);

struct Rig {
    consul: Consul,
    agent: Agent,
    haproxy: Haproxy,
}

fn rig() -> Rig {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n    balance roundrobin\n");
    for (server, groups) in [
        ("web-01", &[][..]),
        ("web-02", &[][..]),
        ("web-cny-01", &["canary"][..]),
        ("web-cny-02", &["canary"][..]),
    ] {
        backends.push_str(&server_line("web", server, groups, port, INTER_MS));
    }
    backends.push_str("\nbackend api\n");
    backends.push_str(&server_line(
        "api",
        "api-cny-01",
        &["canary"],
        port,
        INTER_MS,
    ));
    backends.push_str(&server_line("api", "api-01", &[], port, INTER_MS));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    Rig {
        consul,
        agent,
        haproxy,
    }
}

#[derive(Debug, Clone, Copy)]
enum Desired {
    Absent,
    Ready,
    Drain,
    Maint,
    Weight(u32),
}

impl Desired {
    fn value(self) -> Option<String> {
        match self {
            Desired::Absent => None,
            Desired::Ready => Some("ready".into()),
            Desired::Drain => Some("DRAIN".into()),
            Desired::Maint => Some(" maint ".into()),
            Desired::Weight(n) => Some(format!("{n}%")),
        }
    }

    /// HAProxy's numeric state for this desire: admin bits and user weight
    /// for a server configured with `weight 100`.
    fn holds(self, s: &ServerState) -> bool {
        match self {
            Desired::Absent | Desired::Ready => s.admin_state == 0 && s.uweight == 100,
            Desired::Drain => s.admin_state == 0x08 && s.uweight == 100,
            Desired::Maint => s.admin_state == 0x01 && s.uweight == 100,
            Desired::Weight(n) => s.admin_state == 0 && s.uweight == n,
        }
    }
}

fn set(consul: &Consul, key: &str, desired: Desired) {
    match desired.value() {
        Some(v) => consul.put(key, &v),
        None => consul.delete(key),
    }
}

#[test]
fn each_state_is_applied_whatever_came_before() {
    let rig = rig();
    let states = [
        Desired::Ready,
        Desired::Drain,
        Desired::Maint,
        Desired::Weight(50),
        Desired::Weight(0),
        Desired::Absent,
    ];
    // Every ordered pair of distinct states, so each transition is proven.
    for from in states {
        for to in states {
            if std::mem::discriminant(&from) == std::mem::discriminant(&to)
                && !matches!((from, to), (Desired::Weight(a), Desired::Weight(b)) if a != b)
            {
                continue;
            }
            set(&rig.consul, "web/web-01", from);
            rig.haproxy
                .wait_server("web", "web-01", CONVERGE, |s| from.holds(s));
            set(&rig.consul, "web/web-01", to);
            let s = rig
                .haproxy
                .wait_server("web", "web-01", CONVERGE, |s| to.holds(s));
            assert!(to.holds(&s), "{from:?} -> {to:?}: {s:?}");
            // Nothing else moved.
            assert!(rig.haproxy.server("web", "web-02").is_ready_full_weight());
        }
    }
}

#[test]
fn show_stat_reports_agent_states() {
    let rig = rig();
    rig.consul.put("web/web-01", "drain");
    rig.consul.put("web/web-02", "maint");
    rig.consul.put("api/api-01", "0%");
    rig.haproxy
        .wait_server("api", "api-01", CONVERGE, |s| s.uweight == 0);
    rig.haproxy
        .wait_server("web", "web-02", CONVERGE, ServerState::is_maint);
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_drain);
    let stat = rig.haproxy.stat();
    let field = |b: &str, s: &str, f: &str| stat[&(b.to_string(), s.to_string())][f].clone();
    assert_eq!(field("web", "web-01", "status"), "DRAIN (agent)");
    assert_eq!(field("web", "web-02", "status"), "MAINT");
    // Servers here have no health check of their own, so "no check" is
    // HAProxy's word for in service; a 0% weight stays in service.
    assert_eq!(field("api", "api-01", "status"), "no check");
    assert_eq!(field("api", "api-01", "weight"), "0");
    assert_eq!(field("web", "web-cny-01", "status"), "no check");
    assert_eq!(field("web", "web-cny-01", "weight"), "100");
}

#[test]
fn group_key_drains_the_group_and_a_row_key_overrides_it() {
    let rig = rig();
    rig.consul.put("canary", "drain");
    for (b, s) in [
        ("web", "web-cny-01"),
        ("web", "web-cny-02"),
        ("api", "api-cny-01"),
    ] {
        rig.haproxy
            .wait_server(b, s, CONVERGE, |st| st.admin_state == 0x08);
    }
    for (b, s) in [("web", "web-01"), ("web", "web-02"), ("api", "api-01")] {
        assert!(rig.haproxy.server(b, s).is_ready_full_weight(), "{b}/{s}");
    }
    // One canary server overridden to stay in service at half weight.
    rig.consul.put("web/web-cny-02", "50%");
    let s = rig
        .haproxy
        .wait_server("web", "web-cny-02", CONVERGE, |s| s.admin_state == 0);
    assert_eq!(s.uweight, 50);
    assert!(rig.haproxy.server("web", "web-cny-01").is_drain());

    // Deleting the keys restores every server to ready at configured weight.
    rig.consul.delete("canary");
    rig.consul.delete("web/web-cny-02");
    for (b, s) in [
        ("web", "web-cny-01"),
        ("web", "web-cny-02"),
        ("api", "api-cny-01"),
    ] {
        rig.haproxy
            .wait_server(b, s, CONVERGE, ServerState::is_ready_full_weight);
    }
}

#[test]
fn invalid_value_keeps_haproxy_state_and_never_injects_words() {
    let rig = rig();
    rig.consul.put("web/web-01", "drain");
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_drain);
    // A typo is refused: the last valid value is answered (held), so the
    // server stays drained (not ready).
    rig.consul.put("web/web-01", "drian");
    support::wait_for(CONVERGE, || {
        (rig.agent.metric("gitlab_haproxy_agent_invalid_keys") == 1.0).then_some(())
    })
    .expect("invalid key counted");
    assert_eq!(rig.agent.ask("web/web-01"), "drain 100%\n");
    assert_eq!(
        rig.agent.metric("gitlab_haproxy_agent_invalid_held_keys"),
        1.0
    );
    std::thread::sleep(Duration::from_millis(INTER_MS * 5));
    assert!(rig.haproxy.server("web", "web-01").is_drain());

    // Values that would inject reply words are refused too.
    for value in ["ready maxconn:0", "ready\ndown", "down", "maint, up"] {
        rig.consul.put("web/web-02", value);
        support::wait_for(CONVERGE, || {
            (rig.agent.metric("gitlab_haproxy_agent_invalid_keys") == 2.0).then_some(())
        })
        .unwrap_or_else(|| panic!("{value:?} not held as invalid"));
        assert_eq!(rig.agent.ask("web/web-02"), "", "{value:?}");
        std::thread::sleep(Duration::from_millis(INTER_MS * 3));
        let s = rig.haproxy.server("web", "web-02");
        assert!(
            s.is_ready_full_weight() && s.op_state == 2,
            "{value:?}: {s:?}"
        );
        rig.consul.delete("web/web-02");
        support::wait_for(CONVERGE, || {
            (rig.agent.metric("gitlab_haproxy_agent_invalid_keys") == 1.0).then_some(())
        })
        .unwrap();
    }
    // Keys with no valid value before get no answer.
    assert!(
        rig.agent
            .metric("gitlab_haproxy_agent_answers_total{kind=\"invalid\"}")
            >= 1.0
    );
    // The log names the key once per change, not once per check.
    let log = rig.agent.log();
    assert_eq!(log.matches("key=web/web-01 error=").count(), 1, "{log}");
}

#[test]
fn reload_without_state_file_converges_within_one_interval() {
    let rig = rig();
    rig.consul.put("canary", "maint");
    rig.consul.put("web/web-01", "drain");
    rig.haproxy
        .wait_server("web", "web-cny-01", CONVERGE, ServerState::is_maint);
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_drain);
    rig.haproxy.reload();
    // The new worker starts from the config (all ready) and asks the agent
    // at its first agent-inter.
    let start = std::time::Instant::now();
    rig.haproxy
        .wait_server("web", "web-cny-01", CONVERGE, ServerState::is_maint);
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_drain);
    assert!(
        start.elapsed() < Duration::from_millis(INTER_MS * 2 + 1000),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn agent_away_freezes_state_and_a_restarted_agent_says_nothing_before_sync() {
    let mut rig = rig();
    rig.consul.put("web/web-01", "drain");
    rig.consul.put("web/web-02", "maint");
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_drain);
    rig.haproxy
        .wait_server("web", "web-02", CONVERGE, ServerState::is_maint);
    let (port, http_port) = (rig.agent.listen.port(), rig.agent.http.port());
    assert!(rig.agent.terminate().expect("exits").success());

    // Agent gone: HAProxy keeps the state for many intervals.
    std::thread::sleep(Duration::from_millis(INTER_MS * 6));
    assert!(rig.haproxy.server("web", "web-01").is_drain());
    assert!(rig.haproxy.server("web", "web-02").is_maint());

    // Restarted against a Consul that accepts connections but never answers:
    // the agent stays unsynced and answers nobody, so nothing flips to ready.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole = format!("http://{}", black_hole.local_addr().unwrap());
    let mut stuck = Agent::spawn_on(&hole, port, http_port, &["--startup-timeout", "30s"]);
    support::wait_for(CONVERGE, || {
        let m = stuck.http_get("/metrics")?.1;
        m.contains("gitlab_haproxy_agent_answers_total{kind=\"unsynced\"} ")
            .then_some(())
            .filter(|_| !m.contains("gitlab_haproxy_agent_answers_total{kind=\"unsynced\"} 0"))
    })
    .expect("HAProxy asked the unsynced agent");
    assert_eq!(stuck.http_get("/-/ready").unwrap().0, 503);
    std::thread::sleep(Duration::from_millis(INTER_MS * 4));
    assert!(rig.haproxy.server("web", "web-01").is_drain());
    assert!(rig.haproxy.server("web", "web-02").is_maint());
    stuck.proc().kill();
    drop(black_hole);

    // A normal restart picks up and keeps the desired state.
    let agent = Agent::spawn_on(&rig.consul.url(), port, http_port, &[]);
    agent.wait_ready();
    rig.consul.put("web/web-02", "ready");
    rig.haproxy
        .wait_server("web", "web-02", CONVERGE, ServerState::is_ready_full_weight);
    assert!(rig.haproxy.server("web", "web-01").is_drain());
}

/// `web/web-01`=maint, then a typo, then HAProxy reloads: the new worker
/// starts from the config (ready), so only an answer keeps the server out.
/// While the agent runs it answers the key's last valid value (held), shows
/// it on /status and counts it; an agent restarted with no valid value known
/// answers nothing for it, as before.
#[test]
fn an_invalid_value_after_a_valid_one_keeps_the_server_out_through_a_reload() {
    let mut rig = rig();
    rig.consul.put("web/web-01", "maint");
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_maint);
    rig.consul.put("web/web-01", "mantenance");
    support::wait_for(CONVERGE, || {
        (rig.agent.metric("gitlab_haproxy_agent_invalid_keys") == 1.0).then_some(())
    })
    .expect("invalid key counted");
    rig.haproxy.reload();
    std::thread::sleep(Duration::from_millis(INTER_MS * 2));
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_maint);
    // And it stays there.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(INTER_MS));
        let s = rig.haproxy.server("web", "web-01");
        assert!(s.is_maint(), "{s:?}\n{}", rig.agent.log());
    }
    assert_eq!(rig.agent.ask("web/web-01"), "maint 100%\n");
    assert_eq!(
        rig.agent.metric("gitlab_haproxy_agent_invalid_held_keys"),
        1.0
    );
    let status: serde_json::Value =
        serde_json::from_str(&rig.agent.http_get("/status").unwrap().1).unwrap();
    let held = &status["held"]["web/web-01"];
    assert_eq!(held["state"], "maint", "{status}");
    assert_eq!(held["cause"], "invalid_value", "{status}");
    assert!(
        status["invalid"]["web/web-01"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("mantenance"),
        "{status}"
    );
    let log = rig.agent.log();
    assert!(log.contains("last valid value (held)"), "{log}");

    // A restarted agent knows no valid value: no answer, as before.
    let (port, http_port) = (rig.agent.listen.port(), rig.agent.http.port());
    assert!(rig.agent.terminate().expect("exits").success());
    rig.agent = Agent::spawn_on(&rig.consul.url(), port, http_port, &[]);
    rig.agent.wait_ready();
    assert_eq!(rig.agent.ask("web/web-01"), "");
    // A valid value ends it.
    rig.consul.put("web/web-01", "ready");
    rig.haproxy
        .wait_server("web", "web-01", CONVERGE, ServerState::is_ready_full_weight);
}
