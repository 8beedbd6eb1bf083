//! The Consul token against a real Consul with ACLs on (default deny): read
//! from a file, re-read when Consul answers 403 and on SIGHUP, so rotation
//! needs no restart.

mod support;

use std::time::Duration;

use support::{wait_for, Agent, Consul, TempDir};

const MASTER: &str = "7f1c9a52-3c1e-4b9e-9a6b-6d2f0a9e1c01";

/// Creates a token that may read the state prefix; returns (accessor, secret).
fn read_token(consul: &Consul) -> (String, String) {
    let (status, _, body) = consul.request(
        "PUT",
        "/v1/acl/token",
        br#"{"Description":"agent","Policies":[{"Name":"agent-read"}]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    (
        v["AccessorID"].as_str().unwrap().to_string(),
        v["SecretID"].as_str().unwrap().to_string(),
    )
}

fn delete_token(consul: &Consul, accessor: &str) {
    let (status, _, _) = consul.request("DELETE", &format!("/v1/acl/token/{accessor}"), b"");
    assert_eq!(status, 200);
}

fn wait_answer(agent: &Agent, line: &str, want: &str) {
    let ok = wait_for(Duration::from_secs(20), || {
        (agent.ask(line) == want).then_some(())
    });
    assert!(ok.is_some(), "wanted {want:?}\n{}", agent.log());
}

#[test]
fn token_is_reread_on_403_and_on_sighup() {
    let consul = Consul::start_acl(MASTER);
    let (status, _, body) = consul.request(
        "PUT",
        "/v1/acl/policy",
        br#"{"Name":"agent-read","Rules":"key_prefix \"gitlab-haproxy-agent/state/\" { policy = \"read\" }"}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    consul.put("canary", "drain");

    let dir = TempDir::new("token");
    let token_file = dir.path().join("consul-token");
    let (first_accessor, first_secret) = read_token(&consul);
    std::fs::write(&token_file, format!("{first_secret}\n")).unwrap();
    let agent = Agent::start(
        &consul.url(),
        &["--consul-token-file", token_file.to_str().unwrap()],
    );
    // The deny-by-default prefix is readable only with the token.
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    assert!(!agent.log().contains(&first_secret), "token logged");

    // Rotation without a signal: the new token is in the file, the old one
    // is deleted; the next request gets 403, the file is read again.
    let (second_accessor, second_secret) = read_token(&consul);
    std::fs::write(&token_file, &second_secret).unwrap();
    delete_token(&consul, &first_accessor);
    consul.put("canary", "maint");
    wait_answer(&agent, "web/web-cny-01 canary", "maint 100%\n");
    assert!(
        agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}") >= 1.0
    );

    // Rotation with SIGHUP: the token is read again before the old one goes,
    // so no request is refused.
    let refused = agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}");
    let (_, third_secret) = read_token(&consul);
    std::fs::write(&token_file, &third_secret).unwrap();
    agent.proc_ref().signal("HUP");
    wait_for(Duration::from_secs(5), || {
        agent.log().contains("SIGHUP").then_some(())
    })
    .expect("SIGHUP logged");
    // Wake the blocking query so the next one carries the new token.
    consul.put("canary", "50%");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 50%\n");
    delete_token(&consul, &second_accessor);
    consul.put("canary", "ready");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 100%\n");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}"),
        refused
    );
    let log = agent.log();
    for secret in [&first_secret, &second_secret, &third_secret] {
        assert!(!log.contains(secret.as_str()), "token logged");
    }
}
