//! HAProxy's runtime commands on an enrolled server, on a real HAProxy (2.6,
//! or 3.0 and 3.2 through `GITLAB_HAPROXY_AGENT_TEST_HAPROXY`), with the
//! agent answering from a real Consul, as docs/kv-contract.md and the runbook
//! say:
//! - `set server B/S state maint|drain` by hand is undone by the next reply;
//! - `set server B/S agent down` is never undone by a reply (`ready` or
//!   `drain`): only `agent up` ends it, and `state explain
//!   --haproxy-socket` reports it;
//! - `set server B/S health down` is undone by the next passing health checks;
//! - a reload ends a forced-down agent check.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, ServerState};

const INTER_MS: u64 = 200;
const CONVERGE: Duration = Duration::from_secs(5);
const AGENT_BIN: &str = env!("CARGO_BIN_EXE_gitlab-haproxy-agent");

fn status(h: &Haproxy, backend: &str, server: &str) -> String {
    h.stat()
        .remove(&(backend.to_string(), server.to_string()))
        .and_then(|mut row| row.remove("status"))
        .unwrap_or_default()
}

fn explain(consul: &Consul, h: &Haproxy, row_key: &str, json: bool) -> String {
    let mut cmd = Command::new(AGENT_BIN);
    cmd.env_clear()
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .args(["--consul-addr", &consul.url(), "state", "explain", row_key])
        .arg("--haproxy-socket")
        .arg(h.socket());
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "state explain: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn runtime_agent_down_is_not_undone_by_replies_and_explain_reports_it() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    // web-02 has a health check too, against a port that accepts (the
    // agent's HTTP port): rise 1, fall 1.
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-01", &[], port, INTER_MS));
    backends.push_str(&server_line("web", "web-02", &[], port, INTER_MS).replace(
        "127.0.0.1:1 ",
        &format!(
            "127.0.0.1:{} check inter 200ms rise 1 fall 1 ",
            agent.http.port()
        ),
    ));
    let h = Haproxy::start(&haproxy_config(&backends));
    h.wait_server("web", "web-01", CONVERGE, |s| s.op_state == 2);
    h.wait_server("web", "web-02", CONVERGE, |s| s.op_state == 2);

    // An admin state set by hand lasts until the next reply.
    h.command("set server web/web-01 state maint");
    h.wait_server("web", "web-01", CONVERGE, ServerState::is_ready_full_weight);

    // Agent forced down: DOWN through many replies, ready or drain.
    let out = h.command("set server web/web-01 agent down");
    assert!(out.trim().is_empty(), "set server agent down: {out}");
    let down = wait_for(CONVERGE, || {
        Some(h.server("web", "web-01")).filter(|s| s.op_state == 0)
    });
    assert!(down.is_some(), "web-01 went DOWN");
    for value in ["ready", "drain"] {
        consul.put("web/web-01", value);
        for _ in 0..8 {
            std::thread::sleep(Duration::from_millis(INTER_MS));
            let s = h.server("web", "web-01");
            assert_eq!(s.op_state, 0, "still DOWN with {value} in KV: {s:?}");
        }
        let now = status(&h, "web", "web-01");
        assert!(now.starts_with("DOWN"), "show stat status {now}");
    }
    assert!(
        h.server("web", "web-01").is_drain(),
        "the admin state still applies"
    );

    let text = explain(&consul, &h, "web/web-01", false);
    assert!(text.contains("forced DOWN"), "{text}");
    assert!(text.contains("set server web/web-01 agent up"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&explain(&consul, &h, "web/web-01", true)).expect("explain --json");
    assert_eq!(json["haproxy"]["agent_down"], true, "{json}");
    assert_eq!(json["haproxy"]["server"], "web/web-01", "{json}");

    // Only `agent up` ends it.
    h.command("set server web/web-01 agent up");
    h.wait_server("web", "web-01", CONVERGE, |s| {
        s.op_state == 2 && s.is_drain()
    });
    let json: serde_json::Value =
        serde_json::from_str(&explain(&consul, &h, "web/web-01", true)).unwrap();
    assert_eq!(json["haproxy"]["agent_down"], false, "{json}");
    let text = explain(&consul, &h, "web/web-01", false);
    assert!(!text.contains("forced DOWN"), "{text}");

    // Health forced down: the next passing checks bring it back.
    let out = h.command("set server web/web-02 health down");
    assert!(out.trim().is_empty(), "set server health down: {out}");
    let back = wait_for(CONVERGE, || {
        Some(h.server("web", "web-02")).filter(|s| s.op_state == 2)
    });
    assert!(back.is_some(), "web-02 back UP after its health checks");

    // A reload starts every server fresh: a forced-down agent check too.
    h.command("set server web/web-01 agent down");
    h.wait_server("web", "web-01", CONVERGE, |s| s.op_state == 0);
    h.reload();
    h.wait_server("web", "web-01", CONVERGE, |s| {
        s.op_state == 2 && s.is_drain()
    });
}
