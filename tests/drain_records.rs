//! Who drained a key, why and until when, against a real Consul and the
//! real agent: the writer's record beside a key (`~meta/<key>`) shows on the
//! agent's metrics and `/status`; a key written by hand shows as written
//! outside the writer, its age counted from when the agent first served it,
//! and that count survives a restart of the agent (`--state-dir`).

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::{wait_for, Agent, Consul, TempDir};

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
    assert_eq!(series(&agent, &format!("{UNTIL}{{key=\"web/web-01\"}}")), None);
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
    wait_for(CONVERGE, || series(&agent, &web_since).is_none().then_some(()))
        .expect("web/web-01 no longer out");
}
