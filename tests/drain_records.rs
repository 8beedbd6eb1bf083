//! Who drained a key, why and until when, against a real Consul and the
//! real agent: the writer's record of a key (`gitlab-haproxy-agent/state~meta/<key>`,
//! or below the prefix, `~meta/<key>`, as earlier writers kept it) shows on the
//! agent's metrics and `/status`; a key written by hand shows as written
//! outside the writer, its age counted from when the agent first served it,
//! and that count survives a restart of the agent (`--state-dir`).

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{wait_for, Agent, Consul, Run, TempDir};

const CONVERGE: Duration = Duration::from_secs(10);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn status(agent: &Agent) -> Value {
    serde_json::from_str(&agent.http_get("/status").unwrap().1).unwrap()
}

/// The value of a series, or `None` when the agent does not export it.
fn series(agent: &Agent, name: &str) -> Option<f64> {
    agent.metrics().lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|v| v.trim().parse().unwrap())
    })
}

const SINCE: &str = "gitlab_haproxy_agent_key_since_timestamp_seconds";
const UNTIL: &str = "gitlab_haproxy_agent_key_until_timestamp_seconds";

#[test]
fn records_show_on_metrics_and_status_and_hand_writes_show_as_unknown() {
    let consul = Consul::start();
    consul.put("~store-id", "0b5e7c1d9a2f4e68b3c07d1e5f9a2b46");
    consul.put("canary", "drain");
    // The record after the key: it describes the key's write.
    let at = 1_700_000_000;
    let record = serde_json::json!({"by": "alice", "reason": "kernel upgrade", "at": at,
        "until": at + 7200, "value": "drain"});
    consul.put("~meta/canary", &record.to_string());
    consul.put("web/web-01", "maint");
    // A malformed record and one for no valid key: counted, never keys.
    consul.put("~meta/web/web-02", "drain");
    consul.put("~meta/a/b/c", &record.to_string());
    let state = TempDir::new("state");
    let args = ["--state-dir", state.path().to_str().unwrap()];
    let before = now();
    let mut agent = Agent::start(&consul.url(), &args);

    let canary_since = format!("{SINCE}{{key=\"canary\",state=\"drain\"}}");
    assert_eq!(series(&agent, &canary_since), Some(at as f64));
    assert_eq!(
        series(&agent, &format!("{UNTIL}{{key=\"canary\"}}")),
        Some((at + 7200) as f64)
    );
    let web_since = format!("{SINCE}{{key=\"web/web-01\",state=\"maint\"}}");
    let first_seen = series(&agent, &web_since).expect("web/web-01 is out");
    assert!(
        (before as f64..=now() as f64).contains(&first_seen),
        "{first_seen}: since the agent first served it"
    );
    assert_eq!(
        series(&agent, &format!("{UNTIL}{{key=\"web/web-01\"}}")),
        None
    );
    assert_eq!(agent.metric("gitlab_haproxy_agent_keys"), 2.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_invalid_keys"), 0.0);
    assert_eq!(agent.metric("gitlab_haproxy_agent_invalid_meta_keys"), 2.0);
    let s = status(&agent);
    assert_eq!(s["keys"]["canary"]["written"]["by"], "alice");
    assert_eq!(s["keys"]["canary"]["written"]["reason"], "kernel upgrade");
    assert_eq!(s["keys"]["canary"]["written"]["until"], at + 7200);
    assert_eq!(
        s["keys"]["web/web-01"]["written"],
        "unknown, written outside the writer"
    );
    assert_eq!(s["invalid"], serde_json::json!({}));

    // Break glass: `consul kv put` of another value moves the key past its
    // record.
    consul.put("canary", "maint");
    let maint_since = format!("{SINCE}{{key=\"canary\",state=\"maint\"}}");
    let since = wait_for(CONVERGE, || series(&agent, &maint_since)).expect("canary in maint");
    assert!(since >= before as f64, "{since}");
    assert_eq!(series(&agent, &canary_since), None);
    assert_eq!(series(&agent, &format!("{UNTIL}{{key=\"canary\"}}")), None);
    assert_eq!(
        status(&agent)["keys"]["canary"]["written"],
        "unknown, written outside the writer"
    );

    // A restart answers from the state file: the first-seen time of a key
    // with no record is the one from before, not the restart's.
    agent.terminate().expect("agent exits");
    std::thread::sleep(Duration::from_millis(1100));
    let agent = Agent::start(&consul.url(), &args);
    assert_eq!(series(&agent, &web_since), Some(first_seen));
    assert_eq!(series(&agent, &maint_since), Some(since));
    // Undrained: the series go.
    consul.delete("web/web-01");
    wait_for(CONVERGE, || {
        series(&agent, &web_since).is_none().then_some(())
    })
    .expect("web/web-01 no longer out");
}

/// `gitlab-haproxy-agent state ARGS` against `consul`, with a clean
/// environment plus `envs` (short waits allowed, no HAProxy configuration).
fn writer(consul: &Consul, envs: &[(&str, &str)], args: &[&str]) -> Run {
    let out = std::process::Command::new(support::AGENT_BIN)
        .env_clear()
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", "10ms")
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "10ms")
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .envs(envs.iter().copied())
        .arg("state")
        .args(args)
        .args(["--consul-addr", &consul.url()])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the writer");
    Run::from(out)
}

/// The writer's record of `key`, beside the prefix, `None` when absent.
fn record(consul: &Consul, key: &str) -> Option<Value> {
    kv_at(consul, &format!("gitlab-haproxy-agent/state~meta/{key}"))
}

/// The raw value at `PREFIX + key`, `None` when absent.
fn kv(consul: &Consul, key: &str) -> Option<Value> {
    kv_at(consul, &format!("{}{key}", support::PREFIX))
}

/// The raw value at `key` (full), `None` when absent.
fn kv_at(consul: &Consul, key: &str) -> Option<Value> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{key}"), b"");
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    Some(v[0].clone())
}

#[test]
fn a_drain_with_reason_and_until_shows_in_get_list_and_the_agents_metrics() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let before = now();
    let run = writer(
        &consul,
        &[("USER", "alice")],
        &[
            "drain",
            "--zone",
            "b",
            "--drain-wait",
            "50ms",
            "--reason",
            "kernel upgrade CHG-1234",
            "--until",
            "2h",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let after = now();

    let get = writer(&consul, &[], &["get", "zone-b", "--json"]).json();
    let written = &get["written"];
    assert_eq!(written["by"], "alice", "{get}");
    assert_eq!(written["reason"], "kernel upgrade CHG-1234");
    let since = written["since"].as_u64().unwrap();
    assert!((before..=after).contains(&since), "{since}");
    let until = written["until"].as_u64().unwrap();
    assert!((before + 7200..=after + 7200).contains(&until), "{until}");
    let text = writer(&consul, &[], &["get", "zone-b"]);
    assert!(
        text.stdout.contains("by alice, since") && text.stdout.contains("kernel upgrade CHG-1234"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("until "), "{}", text.stdout);

    let list = writer(&consul, &[], &["list", "--json"]).json();
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "records are not keys: {list}");
    assert_eq!(keys[0]["key"], "zone-b");
    assert_eq!(keys[0]["written"], *written);
    let text = writer(&consul, &[], &["list"]);
    assert!(
        text.stdout.contains("kernel upgrade CHG-1234"),
        "{}",
        text.stdout
    );

    // The agents see the same record.
    let key_since = format!("{SINCE}{{key=\"zone-b\",state=\"maint\"}}");
    let seen = wait_for(CONVERGE, || series(&agent, &key_since)).expect("agent exports it");
    assert_eq!(seen, since as f64);
    assert_eq!(
        series(&agent, &format!("{UNTIL}{{key=\"zone-b\"}}")),
        Some(until as f64)
    );

    // Undrained: key and record go together.
    let run = writer(
        &consul,
        &[],
        &["undrain", "--zone", "b", "--maint-wait", "50ms"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(kv(&consul, "zone-b"), None);
    assert_eq!(record(&consul, "zone-b"), None);
    wait_for(CONVERGE, || {
        series(&agent, &key_since).is_none().then_some(())
    })
    .expect("the agent no longer exports it");
}

#[test]
fn a_hand_write_shows_as_written_outside_the_writer() {
    let consul = Consul::start();
    let run = writer(
        &consul,
        &[("SUDO_USER", "bob"), ("USER", "root")],
        &["set", "canary", "drain", "--reason", "bad canary"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let get = writer(&consul, &[], &["get", "canary", "--json"]).json();
    assert_eq!(
        get["written"]["by"], "bob",
        "the sudo user, not root: {get}"
    );
    // The record and the key share one ModifyIndex.
    let written = record(&consul, "canary").expect("a record");
    assert_eq!(written["ModifyIndex"], get["modify_index"]);
    assert_eq!(kv(&consul, "~meta/canary"), None, "off the agents' path");

    // Break glass.
    consul.put("canary", "maint");
    let get = writer(&consul, &[], &["get", "canary", "--json"]).json();
    assert_eq!(get["written"], "unknown, written outside the writer");
    let text = writer(&consul, &[], &["get", "canary"]);
    assert!(
        text.stdout.contains("unknown, written outside the writer"),
        "{}",
        text.stdout
    );
    // A key never written by the writer.
    consul.put("web/web-01", "drain");
    let list = writer(&consul, &[], &["list", "--json"]).json();
    for k in list["keys"].as_array().unwrap() {
        assert_eq!(k["written"], "unknown, written outside the writer", "{k}");
    }
    // The writer again, on the value the key already holds: Consul keeps
    // the key's ModifyIndex, the newer record describes it.
    let run = writer(
        &consul,
        &[],
        &[
            "set",
            "canary",
            "maint",
            "--reason",
            "still bad",
            "--by",
            "chatops (carol)",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let get = writer(&consul, &[], &["get", "canary", "--json"]).json();
    assert_eq!(get["written"]["by"], "chatops (carol)", "{get}");
    assert_eq!(get["written"]["reason"], "still bad");
}

#[test]
fn taking_servers_out_without_a_reason_exits_64_and_writes_nothing() {
    let consul = Consul::start();
    let index = consul.prefix_index();
    for args in [
        &["drain", "--zone", "b", "--drain-wait", "50ms"][..],
        &[
            "drain",
            "--backend",
            "web",
            "--server",
            "web-01",
            "--reason",
            " ",
        ],
        &["canary", "disable", "--drain-wait", "50ms"],
        &["set", "web/web-01", "maint"],
        &["set", "web/web-01", "DRAIN"],
        &["set", "web/web-01", "maint", "--dry-run"],
    ] {
        let run = writer(&consul, &[("USER", "alice")], args);
        assert_eq!(run.code, 64, "{args:?}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stderr.contains("--reason"), "{args:?}: {}", run.stderr);
        assert_eq!(consul.prefix_index(), index, "{args:?} wrote");
    }
    let run = writer(&consul, &[], &["canary", "disable", "--json"]);
    assert_eq!(run.code, 64);
    assert_eq!(run.json()["error"]["kind"], "usage", "{}", run.stdout);

    // Bringing servers back or a weight needs none; the record says who.
    let run = writer(&consul, &[("USER", "alice")], &["set", "web/web-01", "50%"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let get = writer(&consul, &[], &["get", "web/web-01", "--json"]).json();
    assert_eq!(get["written"]["by"], "alice");
    assert_eq!(get["written"]["reason"], "");
    // The environment's default reason (a ChatOps deployment sets one).
    let run = writer(
        &consul,
        &[("GITLAB_HAPROXY_AGENT_REASON", "chatops canary rollout")],
        &["canary", "disable", "--drain-wait", "50ms"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let get = writer(&consul, &[], &["get", "canary", "--json"]).json();
    assert_eq!(get["written"]["reason"], "chatops canary rollout");
    let by = get["written"]["by"].as_str().unwrap();
    assert!(
        by.starts_with("uid ") && by.contains(" on host "),
        "no login in a clean environment: {by}"
    );
}

#[test]
fn a_drain_of_many_row_keys_writes_every_record_in_its_key_transaction() {
    let consul = Consul::start();
    let names: Vec<String> = (1..=40).map(|i| format!("web-{i:02}")).collect();
    let mut args = vec!["drain", "--backend", "web", "--drain-wait", "50ms"];
    for n in &names {
        args.extend(["--server", n.as_str()]);
    }
    args.extend(["--reason", "rack 7 power work", "--json"]);
    let run = writer(&consul, &[("USER", "alice")], &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for n in &names {
        let key = kv(&consul, &format!("web/{n}")).expect("key written");
        let written = record(&consul, &format!("web/{n}")).expect("record written");
        assert_eq!(written["ModifyIndex"], key["ModifyIndex"], "{n}");
    }
    let list = writer(&consul, &[], &["list", "--json"]).json();
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 40);
    assert!(keys
        .iter()
        .all(|k| k["written"]["reason"] == "rack 7 power work"));
}
