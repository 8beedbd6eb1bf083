//! Upgrading a store written by an earlier writer, whose records of who
//! wrote each key, why and until when lie below the prefix
//! (`<prefix>~meta/<key>`, downloaded by every agent with each write): the
//! new writer reads them, moves a key's record to the sibling prefix
//! (`gitlab-haproxy-agent/state~meta/`) when it writes the key, and `state
//! migrate-records` moves the rest; agents of the earlier and of this
//! version, side by side on one Consul, serve the same answers throughout,
//! and who, why and until when survive.
//!
//! The earlier version is the binary named by
//! `GITLAB_HAPROXY_AGENT_OLD_BIN` (scripts/test.sh builds commit 89740e7's);
//! without it the test says so and passes without running.

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use support::{free_port, wait_for, Agent, Consul, Run, AGENT_BIN, PREFIX};

const OLD_BIN_ENV: &str = "GITLAB_HAPROXY_AGENT_OLD_BIN";
const RECORDS: &str = "gitlab-haproxy-agent/state~meta/";

/// The lines both agents are asked, with what each key makes them answer.
const LINES: [&str; 4] = [
    "web/web-01 zone-b",
    "web/web-02 canary",
    "web/web-03 zone-c",
    "web/web-04",
];

fn old_bin() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(OLD_BIN_ENV)?);
    path.is_file().then_some(path)
}

/// `BIN state ARGS` against `consul` as `user`, with a reason.
fn writer(bin: &std::path::Path, consul: &Consul, user: &str, args: &[&str]) -> Run {
    let out = Command::new(bin)
        .env_clear()
        .env("USER", user)
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", "10ms")
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "10ms")
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .arg("state")
        .args(args)
        .args(["--consul-addr", &consul.url()])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the writer");
    let run = Run::from(out);
    assert_eq!(run.code, 0, "{} state {args:?}: {run:?}", bin.display());
    run
}

/// The raw value at `key` (full), `None` when absent.
fn raw(consul: &Consul, key: &str) -> Option<String> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{key}?raw"), b"");
    (status == 200).then(|| String::from_utf8_lossy(&body).into_owned())
}

/// Keys below `prefix` (full), none when it is empty.
fn keys_below(consul: &Consul, prefix: &str) -> Vec<String> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{prefix}?keys"), b"");
    match status {
        404 => Vec::new(),
        _ => serde_json::from_slice(&body).unwrap(),
    }
}

/// Both agents answer every line alike, and as `want` says; waits for
/// both to take the last write.
#[track_caller]
fn same_answers(old: &Agent, new: &Agent, want: [&str; 4]) {
    for (line, want) in LINES.iter().zip(want) {
        old.wait_answer(line, want);
        new.wait_answer(line, want);
    }
}

/// What `state get KEY --json` says of who wrote the key.
fn written(consul: &Consul, key: &str) -> Value {
    writer(
        AGENT_BIN.as_ref(),
        consul,
        "nobody",
        &["get", key, "--json"],
    )
    .json()["written"]
        .clone()
}

#[test]
fn a_store_written_by_the_earlier_writer_moves_its_records_and_both_agents_answer_alike() {
    let Some(old_bin) = old_bin() else {
        eprintln!(
            "SKIPPED: set {OLD_BIN_ENV} to the agent binary of commit 89740e7 (scripts/test.sh \
             builds it) to run the upgrade test"
        );
        return;
    };
    let consul = Consul::start();
    let old = |user, args: &[&str]| writer(&old_bin, &consul, user, args);
    // The earlier writer: records below the prefix.
    old(
        "alice",
        &[
            "drain",
            "--zone",
            "b",
            "--drain-wait",
            "50ms",
            "--reason",
            "kernel upgrade CHG-1",
            "--until",
            "2h",
        ],
    );
    old(
        "bob",
        &["set", "canary", "drain", "--reason", "canary bake CHG-2"],
    );
    old("carol", &["set", "web/web-04", "50%"]);
    assert!(raw(&consul, &format!("{PREFIX}~meta/zone-b")).is_some());
    assert!(keys_below(&consul, RECORDS).is_empty());
    let zone_b = written(&consul, "zone-b");
    assert_eq!(zone_b["by"], "alice", "{zone_b}");
    assert_eq!(zone_b["reason"], "kernel upgrade CHG-1");
    let until = zone_b["until"].as_u64().expect("an until");

    let old_agent = Agent::spawn_bin(&old_bin, &consul.url(), free_port(), free_port(), &[], &[]);
    old_agent.wait_ready();
    let new_agent = Agent::start(&consul.url(), &[]);
    let mut want = [
        "maint 100%\n",
        "drain 100%\n",
        "ready 100%\n",
        "ready 50%\n",
    ];
    same_answers(&old_agent, &new_agent, want);
    // The new agent shows the earlier writer's records, from its answer.
    let status: Value = serde_json::from_str(&new_agent.http_get("/status").unwrap().1).unwrap();
    assert_eq!(
        status["keys"]["zone-b"]["written"]["by"], "alice",
        "{status}"
    );
    assert_eq!(status["keys"]["zone-b"]["written"]["until"], until);

    // The new writer's write of a key moves its record, in its transaction.
    writer(
        AGENT_BIN.as_ref(),
        &consul,
        "dave",
        &["set", "canary", "maint", "--reason", "canary broke CHG-3"],
    );
    want[1] = "maint 100%\n";
    same_answers(&old_agent, &new_agent, want);
    assert_eq!(raw(&consul, &format!("{PREFIX}~meta/canary")), None);
    let record: Value = serde_json::from_str(
        &raw(&consul, &format!("{RECORDS}canary")).expect("the record moved beside the prefix"),
    )
    .unwrap();
    assert_eq!(
        (&record["by"], &record["value"]),
        (&"dave".into(), &"maint".into())
    );
    assert_eq!(written(&consul, "canary")["reason"], "canary broke CHG-3");
    assert_eq!(written(&consul, "zone-b")["by"], "alice", "not moved yet");
    // The new agent reads the moved record when /status asks.
    let by = wait_for(std::time::Duration::from_secs(10), || {
        let s: Value = serde_json::from_str(&new_agent.http_get("/status").unwrap().1).ok()?;
        (s["keys"]["canary"]["written"]["by"] == "dave").then_some(())
    });
    assert!(by.is_some(), "/status shows the moved record");

    // The documented command moves every other record.
    let run = writer(AGENT_BIN.as_ref(), &consul, "nobody", &["migrate-records"]);
    run.says("2 records moved");
    assert_eq!(
        keys_below(&consul, &format!("{PREFIX}~meta/")),
        Vec::<String>::new(),
        "nothing left below the prefix"
    );
    let mut moved = keys_below(&consul, RECORDS);
    moved.sort();
    assert_eq!(
        moved,
        ["canary", "web/web-04", "zone-b"].map(|k| format!("{RECORDS}{k}"))
    );
    same_answers(&old_agent, &new_agent, want);
    // Who, why and until when survive the move, for the writer and the new
    // agent (its /status and the until its metrics export for the alerts).
    let zone_b = written(&consul, "zone-b");
    assert_eq!(
        (&zone_b["by"], &zone_b["reason"], zone_b["until"].as_u64()),
        (&"alice".into(), &"kernel upgrade CHG-1".into(), Some(until))
    );
    let list = writer(AGENT_BIN.as_ref(), &consul, "nobody", &["list", "--json"]).json();
    let web_04 = (list["keys"].as_array().unwrap().iter())
        .find(|k| k["key"] == "web/web-04")
        .expect("web/web-04 listed")
        .clone();
    assert_eq!(web_04["written"]["by"], "carol", "{list}");
    let until_series = r#"gitlab_haproxy_agent_key_until_timestamp_seconds{key="zone-b"}"#;
    let exported = wait_for(std::time::Duration::from_secs(10), || {
        new_agent.metrics().lines().find_map(|l| {
            let v = l.strip_prefix(until_series)?.trim();
            v.parse::<f64>().ok()
        })
    });
    assert_eq!(exported, Some(until as f64));
    let status: Value = serde_json::from_str(&new_agent.http_get("/status").unwrap().1).unwrap();
    assert_eq!(
        status["keys"]["zone-b"]["written"]["reason"],
        "kernel upgrade CHG-1"
    );
    assert_eq!(status["records"]["prefix"], RECORDS, "{status}");

    // The earlier writer keeps working on the migrated store, and both
    // agents follow it.
    old("alice", &["undrain", "--zone", "b", "--maint-wait", "50ms"]);
    want[0] = "ready 100%\n";
    same_answers(&old_agent, &new_agent, want);
    old("bob", &["clear", "canary"]);
    want[1] = "ready 100%\n";
    same_answers(&old_agent, &new_agent, want);
}
