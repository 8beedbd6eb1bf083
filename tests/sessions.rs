//! Keys held by a Consul session, against a real Consul (and, for the
//! server's state, a real HAProxy and the agent): a value the writer CLI
//! writes over an automation's lock outlives the session, `get`, `list` and
//! `explain` name the session, and a lock taken between the writer's read
//! and its write is a conflict, not overwritten.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use support::{haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, Run};
use support::{kill, PREFIX};

/// `state ARGS --consul-addr URL`, with the short agent timings and the
/// default reason of tests/writer.rs.
fn command(consul: &Consul, args: &[&str]) -> Command {
    let mut cmd = support::state_command(&consul.url(), args);
    cmd.env("GITLAB_HAPROXY_AGENT_AGENT_INTER", "10ms")
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "10ms")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn cli(consul: &Consul, args: &[&str]) -> Run {
    Run::from(command(consul, args).output().expect("run the CLI"))
}

/// Creates a session named `name` with `behavior` (`delete` or `release`),
/// tied to the dev agent's node, retried for up to 10 s while that node is
/// not registered yet (Consul answers 500 "Missing node registration" just
/// after its start); returns its ID.
fn session(consul: &Consul, name: &str, behavior: &str) -> String {
    let body = serde_json::json!({"Name": name, "Behavior": behavior, "LockDelay": "0s"});
    let created = wait_for(Duration::from_secs(10), || {
        let answer = consul.request("PUT", "/v1/session/create", body.to_string().as_bytes());
        (answer.0 == 200).then_some(answer.2)
    });
    let body = created.expect("no session created within 10 s");
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["ID"].as_str().unwrap().to_string()
}

/// `PUT ?acquire=ID` of `value` at `PREFIX + key`, as an automation takes
/// its lock.
fn acquire(consul: &Consul, key: &str, value: &str, id: &str) {
    let path = format!("/v1/kv/{PREFIX}{key}?acquire={id}");
    let (status, _, body) = consul.request("PUT", &path, value.as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body.trim_ascii(), b"true", "lock of {key} not acquired");
}

fn destroy(consul: &Consul, id: &str) {
    let (status, _, body) = consul.request("PUT", &format!("/v1/session/destroy/{id}"), b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// The value and the session of `PREFIX + key`, `None` when absent.
fn entry(consul: &Consul, key: &str) -> Option<(String, Option<String>)> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    let value = base64::engine::general_purpose::STANDARD
        .decode(v[0]["Value"].as_str().unwrap_or(""))
        .unwrap();
    let session = v[0]["Session"].as_str().map(str::to_string);
    Some((String::from_utf8(value).unwrap(), session))
}

/// How long after a session ends its keys are surely gone: Consul deletes
/// them in the same Raft operation; 3 s covers a loaded machine.
const SETTLE: Duration = Duration::from_secs(3);

#[test]
fn maint_written_over_a_session_held_drain_outlives_the_session() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let backends = format!(
        "backend web\n{}{}",
        server_line("web", "s1", &[], agent.listen.port(), 100),
        server_line("web", "s2", &[], agent.listen.port(), 100),
    );
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let id = session(&consul, "deploy-automation", "delete");
    acquire(&consul, "web/s1", "drain", &id);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| s.is_drain());

    let run = cli(&consul, &["set", "web/s1", "maint", "--reason", "x"]);
    assert_eq!(run.code, 0, "{run:?}");
    // The automation's session ends: Consul would delete the keys it holds.
    destroy(&consul, &id);
    std::thread::sleep(SETTLE);
    assert_eq!(
        entry(&consul, "web/s1"),
        Some(("maint".into(), None)),
        "the operator's maint was deleted with the automation's session"
    );
    // Several agent-inter (100 ms) later, HAProxy still holds it in MAINT.
    for _ in 0..20 {
        let s1 = haproxy.server("web", "s1");
        assert!(
            s1.is_maint(),
            "web/s1 left MAINT after the session ended: {s1:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The output names the session it released the key from.
    run.warns(&format!("released web/s1 from Consul session {id}"));
    run.warns("name \"deploy-automation\"");
    run.warns("behavior delete");
    // The write's record says so too.
    let records = "gitlab-haproxy-agent/state~meta/";
    let (_, _, record) = consul.request("GET", &format!("/v1/kv/{records}web/s1?raw"), b"");
    let record: Value = serde_json::from_slice(&record).unwrap();
    assert_eq!(record["value"], "maint", "{record}");
    assert_eq!(record["released_session"]["id"], id.as_str(), "{record}");
    assert_eq!(
        record["released_session"]["info"]["name"], "deploy-automation",
        "{record}"
    );
}

#[test]
fn drain_releases_a_held_key_and_a_dry_run_says_it_would() {
    let consul = Consul::start();
    let drain = |server: &str, extra: &[&str]| {
        let args = ["drain", "--backend", "web", "--server", server];
        let run = cli(
            &consul,
            &[&args[..], &["--drain-wait", "100ms"], extra].concat(),
        );
        assert_eq!(run.code, 0, "{run:?}");
        run
    };
    let id = session(&consul, "rollout", "delete");
    acquire(&consul, "web/s1", "ready", &id);
    let run = drain("s1", &["--json"]);
    destroy(&consul, &id);
    std::thread::sleep(SETTLE);
    assert_eq!(
        entry(&consul, "web/s1"),
        Some(("maint".into(), None)),
        "the drain's maint was deleted with the session"
    );
    run.warns(&format!("released web/s1 from Consul session {id}"));
    let v = run.json();
    assert_eq!(v["released_sessions"][0]["key"], "web/s1", "{v}");
    assert_eq!(v["released_sessions"][0]["session"]["id"], id.as_str());

    // A dry run says which keys the drain would release, and releases none.
    let id = session(&consul, "rollout", "delete");
    acquire(&consul, "web/s3", "ready", &id);
    let v = drain("s3", &["--dry-run", "--json"]).json();
    assert_eq!(v["released_sessions"][0]["key"], "web/s3", "{v}");
    assert_eq!(v["released_sessions"][0]["session"]["id"], id.as_str());
    assert_eq!(v["sessions"], serde_json::json!([]), "{v}");
    assert_eq!(entry(&consul, "web/s3").unwrap().1.as_deref(), Some(&*id));

    // A key a sequence leaves alone stays held, and the report says so.
    let id = session(&consul, "repair-bot", "delete");
    acquire(&consul, "web/s2", "maint", &id);
    let run = drain("s2", &[]);
    run.says(&format!("web/s2 is held by Consul session {id}"));
    run.says("Consul deletes the key when the session ends");
    run.says("`state set web/s2 VALUE` writes the key and releases it");
}

#[test]
fn get_list_and_explain_name_the_session_holding_a_key() {
    let consul = Consul::start();
    let id = session(&consul, "deploy-automation", "delete");
    acquire(&consul, "web/s1", "drain", &id);
    consul.put("web/s2", "maint");
    let released = session(&consul, "lb-rotation", "release");
    acquire(&consul, "web/s3", "50%", &released);

    let list = cli(&consul, &["list"]);
    assert_eq!(list.code, 0, "{list:?}");
    list.says(&format!(
        "web/s1 is held by Consul session {id} (name \"deploy-automation\", node "
    ));
    list.says("behavior delete): Consul deletes the key when the session ends");
    list.says(&format!("web/s3 is held by Consul session {released}"));
    list.says("behavior release): Consul unbinds the key when the session ends");
    assert!(!list.stdout.contains("web/s2 is held"), "{}", list.stdout);
    let v = cli(&consul, &["list", "--json"]).json();
    let key = |k: &str| {
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == k)
            .cloned()
            .unwrap()
    };
    assert_eq!(key("web/s1")["session"]["id"], id.as_str(), "{v}");
    assert_eq!(key("web/s1")["session"]["info"]["behavior"], "delete");
    assert_eq!(key("web/s3")["session"]["info"]["behavior"], "release");
    assert_eq!(key("web/s2")["session"], Value::Null, "{v}");

    let get = cli(&consul, &["get", "web/s1"]);
    get.says(&format!("web/s1 is held by Consul session {id}"));
    let v = cli(&consul, &["get", "web/s1", "--json"]).json();
    assert_eq!(v["session"]["info"]["name"], "deploy-automation", "{v}");

    let explain = cli(&consul, &["explain", "web/s1", "canary"]);
    assert_eq!(explain.code, 0, "{explain:?}");
    explain.says(&format!("web/s1 is held by Consul session {id}"));
    let v = cli(&consul, &["explain", "web/s1", "canary", "--json"]).json();
    assert_eq!(v["identities"][0]["session"]["id"], id.as_str(), "{v}");
    assert_eq!(v["identities"][1]["session"], Value::Null, "{v}");
}

#[test]
fn a_lock_taken_between_the_read_and_the_write_is_a_conflict() {
    let consul = Consul::start();
    consul.put("web/s1", "ready");
    let id = session(&consul, "deploy-automation", "delete");
    // The drain wait is the gap between the read the maint is planned
    // from and its write: an automation locks the key there.
    let mut child = command(
        &consul,
        &[
            "drain",
            "--backend",
            "web",
            "--server",
            "s1",
            "--drain-wait",
            "5s",
        ],
    )
    .spawn()
    .expect("start the CLI");
    let drained = wait_for(Duration::from_secs(10), || {
        (entry(&consul, "web/s1")?.0 == "drain").then_some(())
    });
    assert!(drained.is_some(), "the drain was never written");
    acquire(&consul, "web/s1", "drain", &id);
    if wait_for(Duration::from_secs(20), || child.try_wait().unwrap()).is_none() {
        kill(child.id(), "KILL");
        panic!("the drain did not finish");
    }
    let run = Run::from(child.wait_with_output().unwrap());
    assert_eq!(run.code, 75, "{run:?}");
    run.warns(&format!("held by Consul session {id}"));
    run.warns("Not overwritten");
    assert_eq!(
        entry(&consul, "web/s1"),
        Some(("drain".into(), Some(id.clone()))),
        "the automation's lock was overwritten"
    );
}

/// The writer's token needs no session rule: `unlock` asks for write on the
/// key only (checked on Consul 1.8.7). Without `session:read` the session
/// is named by its ID alone.
#[test]
fn a_token_with_key_write_only_releases_and_names_the_session_by_id() {
    const MASTER: &str = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
    let consul = Consul::start_acl(MASTER);
    consul.put_policy(
        "state-write",
        r#"key_prefix "gitlab-haproxy-agent/state/" { policy = "write" }"#,
    );
    let (_, secret) = consul.token_with("state-write");
    let dir = support::TempDir::new("sessions-token");
    let token = dir.path().join("token");
    std::fs::write(&token, &secret).unwrap();
    let id = session(&consul, "deploy-automation", "delete");
    acquire(&consul, "web/s1", "drain", &id);

    let token = token.to_str().unwrap();
    let run = cli(
        &consul,
        &["set", "web/s1", "maint", "--consul-token-file", token],
    );
    assert_eq!(run.code, 0, "{run:?}");
    destroy(&consul, &id);
    std::thread::sleep(SETTLE);
    assert_eq!(
        entry(&consul, "web/s1"),
        Some(("maint".into(), None)),
        "the maint was deleted with the session"
    );
    run.warns(&format!(
        "released web/s1 from Consul session {id} (gone, or not readable with this token)"
    ));
    // A token that may not write the records beside the prefix (granted
    // before they moved there) still writes, its records below the prefix.
    run.warns("warning: records written below the prefix");
    let (status, _, _) = consul.request("GET", &format!("/v1/kv/{PREFIX}~meta/web/s1"), b"");
    assert_eq!(status, 200, "the record below the prefix");
}
