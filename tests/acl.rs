//! The Consul token against a real Consul with ACLs on (default deny): read
//! from a file, re-read when Consul answers 403 and on SIGHUP, so rotation
//! needs no restart.

mod support;

use std::time::{Duration, Instant};

use support::{wait_for, Agent, Consul, TempDir};

const MASTER: &str = "7f1c9a52-3c1e-4b9e-9a6b-6d2f0a9e1c01";

/// Creates a token that may read the state prefix; returns (accessor, secret).
fn read_token(consul: &Consul) -> (String, String) {
    consul.token_with("agent-read")
}

/// Starts an agent whose token (in a file in the returned folder) has the
/// one policy `policy`.
fn agent_with_token(consul: &Consul, policy: &str) -> (Agent, TempDir) {
    agent_with_token_and(consul, policy, &[])
}

/// [`agent_with_token`], with `extra` options.
fn agent_with_token_and(consul: &Consul, policy: &str, extra: &[&str]) -> (Agent, TempDir) {
    let dir = TempDir::new("token");
    let token_file = dir.path().join("consul-token");
    std::fs::write(&token_file, consul.token_with(policy).1).unwrap();
    let mut args = vec!["--consul-token-file", token_file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let agent = Agent::start(&consul.url(), &args);
    (agent, dir)
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
    policies(&consul);
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
    // A blocking query keeps the token it started with: the 403 can come
    // with the request after the one that brought maint.
    let refused = wait_for(Duration::from_secs(5), || {
        (agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}") >= 1.0)
            .then_some(())
    });
    assert!(refused.is_some(), "{}", agent.log());

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

/// Creates the policies `agent-read` (read on the state prefix) and three
/// that read less: `elsewhere` (another prefix only), `folder-key` (the
/// prefix's folder key alone: `key` where `key_prefix` was meant) and
/// `one-backend` (the `web/` folder below the prefix only).
fn policies(consul: &Consul) {
    for body in [
        &br#"{"Name":"agent-read","Rules":"key_prefix \"gitlab-haproxy-agent/state/\" { policy = \"read\" }"}"#[..],
        br#"{"Name":"elsewhere","Rules":"key_prefix \"other/\" { policy = \"read\" }"}"#,
        br#"{"Name":"folder-key","Rules":"key \"gitlab-haproxy-agent/state/\" { policy = \"read\" }"}"#,
        br#"{"Name":"one-backend","Rules":"key_prefix \"gitlab-haproxy-agent/state/web/\" { policy = \"read\" }"}"#,
    ] {
        let (status, _, answer) = consul.request("PUT", "/v1/acl/policy", body);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    }
}

/// Consul answers a recursive read by a token that may read nothing under
/// the prefix with the same 404 as an empty prefix, and one that may read
/// part of it with that part; taken as they are, the hidden keys would
/// answer ready.
#[test]
fn a_token_that_cannot_read_the_prefix_is_refused_not_taken_for_an_empty_prefix() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("canary", "drain");
    consul.put("web/web-01", "maint");
    let dir = TempDir::new("token");
    let token_file = dir.path().join("consul-token");

    // At start: no sync, no answer, exit 1 naming the refusal. The first
    // two see a 404, the third a 200 with web/web-01 alone.
    for policy in ["elsewhere", "folder-key", "one-backend"] {
        let (_, secret) = consul.token_with(policy);
        std::fs::write(&token_file, &secret).unwrap();
        let mut agent = Agent::spawn(
            &consul.url(),
            &[
                "--consul-token-file",
                token_file.to_str().unwrap(),
                "--startup-timeout",
                "3s",
            ],
        );
        let status = agent
            .proc()
            .wait_exit(Duration::from_secs(15))
            .expect("agent exits");
        assert_eq!(status.code(), Some(1), "{policy}: {}", agent.log());
        assert!(agent.log().contains("403"), "{policy}: {}", agent.log());
    }
    let (_, folder_key) = consul.token_with("folder-key");

    // Running: the token is swapped for one that cannot read the prefix.
    // The agent keeps serving its last copy (drain), never ready.
    let (reader, secret) = read_token(&consul);
    std::fs::write(&token_file, &secret).unwrap();
    let agent = Agent::start(
        &consul.url(),
        &["--consul-token-file", token_file.to_str().unwrap()],
    );
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    let refused =
        || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}");
    std::fs::write(&token_file, &folder_key).unwrap();
    delete_token(&consul, &reader);
    consul.put("canary", "maint");
    let seen = wait_for(Duration::from_secs(20), || (refused() >= 2.0).then_some(()));
    assert!(seen.is_some(), "no refusal counted:\n{}", agent.log());
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(
            agent.ask("web/web-cny-01 canary"),
            "drain 100%\n",
            "{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = agent.http_get("/status").expect("/status").1;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        status["last_error"].as_str().unwrap_or("").contains("403"),
        "{status}"
    );
}

/// The policy on the agent's own token is narrowed while it runs (to the
/// `web/` folder), then a key under `web/` is written: Consul's answer to
/// the blocking query drops `canary`, as a delete would. The direct read of
/// `canary` answers 403: it is held (hidden), the token's read access is
/// checked again, refused on 403, and the served state kept: `canary` stays
/// drained; the refusal is counted and shown.
#[test]
fn a_policy_narrowed_while_running_is_refused_not_taken_for_deletes() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("canary", "drain");
    consul.put("web/web-01", "maint");
    let (agent, _token) = agent_with_token(&consul, "agent-read");
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    let refused =
        || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}");
    assert_eq!(refused(), 0.0);

    // Narrow the policy of the very token the agent holds.
    narrow_agent_read(&consul);
    consul.put("web/web-02", "drain");

    let seen = wait_for(Duration::from_secs(20), || (refused() >= 1.0).then_some(()));
    assert!(seen.is_some(), "no refusal counted:\n{}", agent.log());
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(
            agent.ask("web/web-cny-01 canary"),
            "drain 100%\n",
            "{}",
            agent.log()
        );
        assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = agent.http_get("/status").expect("/status").1;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        status["last_error"].as_str().unwrap_or("").contains("403"),
        "{status}"
    );
    assert!(!agent.log().contains("key removed"), "{}", agent.log());
}

/// The copy holds only keys the narrowed policy still shows, and a key
/// outside it is written: Consul's answer hides it, but its index moves
/// past every ModifyIndex shown. That answer is checked too, and refused.
#[test]
fn a_write_hidden_by_a_narrowed_policy_is_noticed_and_refused() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("web/web-01", "maint");
    let (agent, _token) = agent_with_token(&consul, "agent-read");
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
    narrow_agent_read(&consul);
    consul.put("canary", "drain");
    let refused =
        || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"http_4xx\"}");
    let seen = wait_for(Duration::from_secs(20), || (refused() >= 1.0).then_some(()));
    assert!(seen.is_some(), "hidden write not noticed:\n{}", agent.log());
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
    let status = agent.http_get("/status").expect("/status").1;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        status["last_error"].as_str().unwrap_or("").contains("403"),
        "{status}"
    );
}

/// Narrows the `agent-read` policy, in place, to the `web/` folder below
/// the prefix.
fn narrow_agent_read(consul: &Consul) {
    let (status, _, body) = consul.request("GET", "/v1/acl/policy/name/agent-read", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let policy: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id = policy["ID"].as_str().unwrap();
    let (status, _, body) = consul.request(
        "PUT",
        &format!("/v1/acl/policy/{id}"),
        format!(
            r#"{{"ID":"{id}","Name":"agent-read","Rules":"key_prefix \"gitlab-haproxy-agent/state/web/\" {{ policy = \"read\" }}"}}"#
        )
        .as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// Sets the rules of the `agent-read` policy to `rules` and waits until the
/// agent's blocking query (started under the rules before) ends with no
/// change: the agent must run with `--wait 2s`. The next query starts
/// within `--min-query-interval` (100 ms) under `rules`, and is parked for
/// about 2 s more when this returns.
fn park_under(agent: &Agent, consul: &Consul, rules: &str) {
    let unchanged =
        || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"not_modified\"}");
    let before = unchanged();
    set_agent_read(consul, rules);
    let ended = wait_for(Duration::from_secs(5), || {
        (unchanged() > before).then_some(())
    });
    assert!(ended.is_some(), "{}", agent.log());
    std::thread::sleep(Duration::from_millis(300));
}

/// Sets the rules of the `agent-read` policy, in place.
fn set_agent_read(consul: &Consul, rules: &str) {
    let (status, _, body) = consul.request("GET", "/v1/acl/policy/name/agent-read", b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let policy: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id = policy["ID"].as_str().unwrap();
    let body = serde_json::json!({"ID": id, "Name": "agent-read", "Rules": rules});
    let (status, _, answer) = consul.request(
        "PUT",
        &format!("/v1/acl/policy/{id}"),
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
}

/// Consul filters a blocking query with the ACL its token had when the
/// query started. The policy is narrowed and the agent's blocking query
/// (still under the whole-prefix ACL) ends with no change, so the next one
/// starts under the narrowed policy; the policy is restored; the next write makes that
/// parked query answer a filtered view: `canary` gone (one-backend) or a
/// 404 (elsewhere), while a read check made now passes. The agent must
/// not take it for deletes: it reads each key it lacks directly, which
/// shows `canary`, and keeps answering drain.
#[test]
fn an_answer_filtered_by_the_acl_a_blocking_query_started_with_is_not_applied() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("canary", "drain");
    consul.put("web/web-01", "maint");
    // A short wait: a blocking query that ends with no change starts the
    // next one under the policy of the moment.
    let (agent, _token) = agent_with_token_and(&consul, "agent-read", &["--wait", "2s"]);
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    // Past --min-query-interval: the blocking query is parked.
    std::thread::sleep(Duration::from_millis(500));
    let full = r#"key_prefix "gitlab-haproxy-agent/state/" { policy = "read" }"#;
    for (narrowed, reason, reads) in [
        (
            r#"key_prefix "gitlab-haproxy-agent/state/web/" { policy = "read" }"#,
            "drops_keys",
            1.0,
        ),
        (r#"key_prefix "other/" { policy = "read" }"#, "empty", 3.0),
    ] {
        park_under(&agent, &consul, narrowed);
        set_agent_read(&consul, full);
        consul.put("web/web-02", "maint");
        wait_answer(&agent, "web/web-02", "maint 100%\n");
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            assert_eq!(
                agent.ask("web/web-cny-01 canary"),
                "drain 100%\n",
                "{narrowed}: {}",
                agent.log()
            );
            assert_eq!(agent.ask("web/web-01"), "maint 100%\n", "{narrowed}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!agent.log().contains("key removed"), "{}", agent.log());
        // The keys the filtered answer lacked were read directly.
        let read = agent.metric("gitlab_haproxy_agent_key_reads_total{result=\"present\"}");
        assert!(read >= reads, "{reason}: {read}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The policy is narrowed to `web/` and one transaction writes `canary`
/// (hidden) and `web/web-02` (shown) at one index: the answer shows every
/// key the copy holds and its index is a shown key's ModifyIndex, so only
/// the names of the keys the token may read tell. The answer is refused
/// (403 on the read check); once the policy is restored the agent reads
/// `canary` without waiting for another write.
#[test]
fn a_key_hidden_in_a_transaction_with_a_shown_key_is_read_once_the_policy_is_restored() {
    use base64::Engine as _;
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("web/web-01", "maint");
    let (agent, _token) = agent_with_token_and(&consul, "agent-read", &["--wait", "2s"]);
    assert_eq!(agent.ask("web/web-cny-01 canary"), "ready 100%\n");
    std::thread::sleep(Duration::from_millis(500));
    // The query that sees the transaction runs under the narrowed policy.
    park_under(
        &agent,
        &consul,
        r#"key_prefix "gitlab-haproxy-agent/state/web/" { policy = "read" }"#,
    );
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let txn = serde_json::json!([
        {"KV": {"Verb": "set", "Key": "gitlab-haproxy-agent/state/canary", "Value": b64("drain")}},
        {"KV": {"Verb": "set", "Key": "gitlab-haproxy-agent/state/web/web-02", "Value": b64("drain")}},
    ]);
    let (status, _, body) = consul.request("PUT", "/v1/txn", txn.to_string().as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    std::thread::sleep(Duration::from_secs(1));
    set_agent_read(
        &consul,
        r#"key_prefix "gitlab-haproxy-agent/state/" { policy = "read" }"#,
    );
    wait_answer(&agent, "web/web-cny-01 canary", "drain 100%\n");
    assert_eq!(agent.ask("web/web-02"), "drain 100%\n");
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n");
}

/// With the writer's store id in place (written first, so its ModifyIndex
/// is below the prefix's index: Consul answers a read of a present key with
/// its ModifyIndex as `X-Consul-Index`), a delete costs a direct read and a
/// read of the store id, and applies; so do the release of rolled-back holds
/// and a drain written after it. None of it makes the watcher spin.
#[test]
fn with_the_store_id_in_place_deletes_and_releases_apply_without_spinning() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("~store-id", "a1b2c3");
    consul.put("canary", "drain");
    consul.put("web/web-01", "maint");
    let (agent, _token) = agent_with_token(&consul, "agent-read");
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    let requests = || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"ok\"}");
    // At most this many requests in 2 s once a change is applied: the
    // blocking query parked, nothing else (a spinning watcher makes
    // hundreds).
    let settled = |what: &str| {
        std::thread::sleep(Duration::from_millis(500));
        let before = requests();
        std::thread::sleep(Duration::from_secs(2));
        let made = requests() - before;
        assert!(
            made <= 2.0,
            "{what}: {made} requests in 2 s\n{}",
            agent.log()
        );
    };

    consul.delete("canary");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 100%\n");
    settled("after a delete");

    // Consul loses the prefix: maint is held. The writer's release (a new
    // store id, then the release mark) lets it go, and a drain written
    // after it applies.
    let (status, _, _) = consul.request(
        "DELETE",
        &format!("/v1/kv/{}?recurse", support::PREFIX),
        b"",
    );
    assert_eq!(status, 200);
    settled("after the prefix was deleted");
    assert_eq!(agent.ask("web/web-01"), "maint 100%\n", "{}", agent.log());
    consul.put("~store-id", "d4e5f6");
    consul.put("~release-rollback", "1");
    wait_answer(&agent, "web/web-01", "ready 100%\n");
    consul.put("web/web-02", "drain");
    wait_answer(&agent, "web/web-02", "drain 100%\n");
    settled("after the release and a drain");
}

/// A token that may read the prefix but not the writer's store id (`key
/// ".../~store-id" deny`): no answer shows the id, and its read after a
/// direct read is a 403. A delete still applies, and the watcher settles.
#[test]
fn a_token_denied_the_store_id_still_applies_deletes_without_spinning() {
    let consul = Consul::start_acl(MASTER);
    let prefix = support::PREFIX;
    consul.put_policy(
        "no-store-id",
        &format!(
            r#"key_prefix "{prefix}" {{ policy = "read" }} key "{prefix}~store-id" {{ policy = "deny" }}"#
        ),
    );
    consul.put("~store-id", "a1b2c3");
    consul.put("canary", "drain");
    let (agent, _token) = agent_with_token(&consul, "no-store-id");
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    consul.delete("canary");
    wait_answer(&agent, "web/web-cny-01 canary", "ready 100%\n");
    std::thread::sleep(Duration::from_millis(500));
    let requests = || agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"ok\"}");
    let before = requests();
    std::thread::sleep(Duration::from_secs(2));
    let made = requests() - before;
    assert!(made <= 2.0, "{made} requests in 2 s\n{}", agent.log());
}

/// A key the token may no longer read whose last value was `ready` is
/// skipped, not held: it may have been cleared unseen, and held it would
/// outrank a group's maint on the agent-send line (before, `web/web-01
/// canary` answered `ready 100%` while `canary = maint` decided it). A
/// hidden maint is still held.
#[test]
fn a_hidden_ready_is_skipped_and_does_not_outrank_a_group_maint() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    consul.put("web/web-01", "ready");
    consul.put("web/web-02", "maint");
    let (agent, _token) = agent_with_token(&consul, "agent-read");
    assert_eq!(agent.ask("web/web-01 canary"), "ready 100%\n");
    let p = support::PREFIX;
    set_agent_read(
        &consul,
        &format!(
            r#"key_prefix "{p}" {{ policy = "read" }}
key "{p}web/web-01" {{ policy = "deny" }}
key "{p}web/web-02" {{ policy = "deny" }}"#
        ),
    );
    // Unrelated writes until the agent has read both keys directly (403):
    // the query parked under the old policy answers the first.
    let hidden = || agent.metric("gitlab_haproxy_agent_held_keys{cause=\"hidden\"}");
    let mut n = 0;
    let held = wait_for(Duration::from_secs(20), || {
        n += 1;
        consul.put("zone-z", &format!("{n}%"));
        std::thread::sleep(Duration::from_millis(300));
        (hidden() >= 2.0).then_some(())
    });
    assert!(held.is_some(), "{}", agent.log());
    // web/web-01 cleared (unseen by the token), then canary disabled.
    consul.delete("web/web-01");
    consul.put("canary", "maint");
    wait_answer(&agent, "web/web-01 canary", "maint 100%\n");
    assert_eq!(agent.ask("web/web-02 canary"), "maint 100%\n");
    assert_eq!(agent.ask("web/web-02"), "maint 100%\n");
}

/// A policy change that denies many keys at once: each is read directly
/// (403) and held hidden. The first `PER_KEY_LIMIT` get a warning line
/// each and the rest one line with their count, so a change that denies
/// thousands of keys stays far below journald's rate limit. Every later
/// write under the prefix reads them again: those reads are counted but
/// log nothing, as the keys were already held hidden.
#[test]
fn many_keys_denied_at_once_are_logged_in_a_few_lines() {
    use gitlab_haproxy_agent::agent::log_summary::PER_KEY_LIMIT;
    const DENIED: usize = 60;
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    for i in 0..DENIED {
        consul.put(&format!("web/s{i:02}"), "maint");
    }
    consul.put("canary", "ready");
    let (agent, _token) = agent_with_token_and(&consul, "agent-read", &["--wait", "2s"]);
    assert_eq!(agent.ask("web/s07"), "maint 100%\n");
    std::thread::sleep(Duration::from_millis(500));
    let p = support::PREFIX;
    // The next query runs under the narrowed policy, and one write ends it.
    park_under(
        &agent,
        &consul,
        &format!(
            r#"key_prefix "{p}" {{ policy = "read" }}
key_prefix "{p}web/" {{ policy = "deny" }}"#
        ),
    );
    consul.put("canary", "drain");
    wait_answer(&agent, "web/web-cny-01 canary", "drain 100%\n");
    let hidden = || agent.metric("gitlab_haproxy_agent_held_keys{cause=\"hidden\"}");
    let held = wait_for(Duration::from_secs(10), || {
        (hidden() >= DENIED as f64).then_some(())
    });
    assert!(held.is_some(), "{}", agent.log());
    assert_eq!(agent.ask("web/s07"), "maint 100%\n");
    let forbidden = agent.metric("gitlab_haproxy_agent_key_reads_total{result=\"forbidden\"}");
    assert_eq!(forbidden, DENIED as f64, "{}", agent.log());

    let log = agent.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("may no longer read"))
        .collect();
    let per_key = lines.iter().filter(|l| l.contains("this key")).count();
    assert_eq!(per_key, PER_KEY_LIMIT, "{log}");
    assert_eq!(lines.len(), PER_KEY_LIMIT + 1, "{log}");
    let summary = lines.iter().find(|l| !l.contains("this key")).unwrap();
    assert!(summary.contains(&format!("{DENIED} keys")), "{summary}");

    // Unrelated writes, each applied before the next: every answer lacks
    // the hidden keys, which are read again (403) and logged no more.
    let applied = || -> u64 {
        let (_, body) = agent.http_get("/status").unwrap();
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        status["consul_index"].as_u64().unwrap_or(0)
    };
    const WRITES: [&str; 3] = ["maint", "drain", "maint"];
    for value in WRITES {
        consul.put("canary", value);
        let index = consul.prefix_index();
        let done = wait_for(Duration::from_secs(10), || {
            (applied() >= index).then_some(())
        });
        assert!(done.is_some(), "index {index}\n{}", agent.log());
    }
    let forbidden = agent.metric("gitlab_haproxy_agent_key_reads_total{result=\"forbidden\"}");
    assert!(
        forbidden >= ((1 + WRITES.len()) * DENIED) as f64,
        "{forbidden}\n{}",
        agent.log()
    );
    let log = agent.log();
    let lines = log.lines().filter(|l| l.contains("may no longer read"));
    assert_eq!(lines.count(), PER_KEY_LIMIT + 1, "{log}");
    assert_eq!(hidden(), DENIED as f64);
}

/// The writer keeps its records beside the prefix, out of the agents'
/// answer. A drain it writes to a key the agent's token may not read (a
/// `deny` on the key) shows in no answer, whose index is the write
/// generation's (written in the same transaction): only the record's name
/// tells. The agent lists the records' names after the writer's
/// transaction, reads the key (403), then its record, and holds it hidden
/// at the drain the record names, not the next identity's `ready`.
#[test]
fn a_drain_the_writer_writes_to_a_key_the_token_may_not_read_is_held_from_its_record() {
    let consul = Consul::start_acl(MASTER);
    policies(&consul);
    let p = support::PREFIX;
    set_agent_read(
        &consul,
        &format!(
            r#"key_prefix "{p}" {{ policy = "read" }}
key_prefix "gitlab-haproxy-agent/state~meta/" {{ policy = "read" }}
key "{p}web/web-01" {{ policy = "deny" }}"#
        ),
    );
    consul.put("canary", "ready");
    let (agent, _token) = agent_with_token(&consul, "agent-read");
    wait_answer(&agent, "web/web-01 canary", "ready 100%\n");

    let dir = TempDir::new("writer-token");
    let token = dir.path().join("token");
    std::fs::write(&token, MASTER).unwrap();
    let args = [
        "set",
        "web/web-01",
        "drain",
        "--consul-token-file",
        token.to_str().unwrap(),
    ];
    let out = support::state_command(&consul.url(), &args)
        .output()
        .expect("run the writer");
    assert!(out.status.success(), "{out:?}");
    let (status, _, _) = consul.request(
        "GET",
        "/v1/kv/gitlab-haproxy-agent/state~meta/web/web-01",
        b"",
    );
    assert_eq!(status, 200, "the record beside the prefix");

    let hidden = || agent.metric("gitlab_haproxy_agent_held_keys{cause=\"hidden\"}");
    let held = wait_for(Duration::from_secs(20), || (hidden() >= 1.0).then_some(()));
    assert!(
        held.is_some(),
        "the hidden drain was not found\n{}",
        agent.log()
    );
    assert_eq!(
        agent.ask("web/web-01 canary"),
        "drain 100%\n",
        "the drain its record names, not canary's ready\n{}",
        agent.log()
    );
    assert_eq!(agent.ask("canary"), "ready 100%\n");
}
