//! Consul's data going backwards for real, and Consul only looking as if it
//! did, against a real Consul, HAProxy and the agent:
//!
//! - a snapshot restore undoes a drain, and a write follows it: the index
//!   is past the one served again and the store id is the snapshot's, so
//!   only the write generation tells that the drain was lost; the agent
//!   keeps answering it (held, cause `rolled_back`), whether it watched the
//!   restore or was stopped through it;
//! - a tombstone reap after a delete lowers the prefix's index without any
//!   key changing: nothing is held and nothing is said to have gone
//!   backwards, for an agent that was stopped through the delete and the
//!   reap and for one that watched a delete by hand and its reap.
//!
//! Run alone with `cargo nextest run --test lost_data` (or `cargo test
//! --test lost_data`). The reap test waits for Consul's tombstone reap,
//! about 15 minutes on 1.8.7 whatever its configuration (see
//! `Consul::delete_and_wait_for_reap`), so it is `#[ignore]`d: no ordinary
//! run has it, and `scripts/test.sh` runs it in the background from the
//! start of the Rust tests to the end of the other suites, as a suite of
//! its own ("consul tombstone reap (background)"), under nextest's `reap`
//! profile (stopped after 25 minutes, not 10). By hand:
//! `cargo nextest run --profile reap --run-ignored only --test lost_data`
//! (or `cargo test --test lost_data -- --ignored`).

mod support;

use std::time::{Duration, Instant};

use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, ServerState, TempDir,
};

/// `agent-inter` of every server, milliseconds.
const INTER_MS: u64 = 200;

/// The longest the reap test waits for Consul's reap.
const REAP_WAIT: Duration = Duration::from_secs(17 * 60);

/// The longest the reap test waits for an agent to serve the index Consul
/// answers after the reap. The reap wakes no blocking query: a query parked
/// across it returns at its timeout with what it read before the reap
/// (Consul 1.8.7 does not read again when the wait runs out), and the next
/// one, at the lower index, is held a whole wait too. The watching agent's
/// index check (every 2 s) sees the index below its query's and reads
/// again from 0 (Consul's reset rule), so it serves the reap within a
/// check or two of it (measured: 2.1 s after the test saw it); before that
/// rule it took 5 to about 10.6 s at
/// `--wait 5s` (measured: 6.6 to 9.5 s), a whole `--wait` or two at the
/// default. The rest is slack for a loaded machine.
const SEE_REAP: Duration = Duration::from_secs(60);

/// `state ARGS --consul-addr URL` with the writer CLI; panics unless it
/// exits 0.
#[track_caller]
fn writer(consul: &Consul, args: &[&str]) {
    let out = support::state_command(&consul.url(), args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "state {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The agent with a state directory, on the given ports.
fn agent(consul: &Consul, state: &TempDir, port: u16, http_port: u16) -> Agent {
    let dir = state.path().to_str().unwrap();
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &["--state-dir", dir]);
    agent.wait_ready();
    agent
}

/// A HAProxy with backend `web` whose servers ask the agent on `port`.
fn haproxy(port: u16, servers: &[(&str, &[&str])]) -> Haproxy {
    let mut backend = String::from("backend web\n");
    for (server, ids) in servers {
        backend.push_str(&server_line("web", server, ids, port, INTER_MS));
    }
    Haproxy::start(&haproxy_config(&backend))
}

fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `/status` `consul_index`: the index of the copy the agent serves.
fn consul_index(agent: &Agent) -> Option<u64> {
    status(agent)["consul_index"].as_u64()
}

/// `gitlab_haproxy_agent_held_keys{cause="rolled_back"}`.
fn rolled_back(agent: &Agent) -> f64 {
    agent.metric("gitlab_haproxy_agent_held_keys{cause=\"rolled_back\"}")
}

/// The agent's WARN lines that say Consul's data or index went backwards.
fn went_backwards(agent: &Agent) -> Vec<String> {
    agent
        .log()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("went backwards"))
        .map(str::to_string)
        .collect()
}

/// The restore: `web/s2` = maint, a snapshot, `web/s1` = drain (served),
/// the snapshot restored (no `web/s1`), then `web/s3` = drain written. With
/// `stopped`, the agent is stopped from before the restore to after the
/// write. `web/s1` must still answer drain, held as rolled back.
fn a_drain_undone_by_a_restore_stays_held(stopped: bool) {
    let consul = Consul::start();
    let state = TempDir::new("lost-data-restore");
    let (port, http_port) = (free_port(), free_port());
    let mut agent = agent(&consul, &state, port, http_port);
    let servers: [(&str, &[&str]); 3] = [
        ("s1", &["web/s1"]),
        ("s2", &["web/s2"]),
        ("s3", &["web/s3"]),
    ];
    let haproxy = haproxy(port, &servers);
    writer(&consul, &["set", "web/s2", "maint"]);
    agent.wait_answer("web/s2", "maint 100%\n");
    let snap = state.path().join("before-s1.snap");
    consul.snapshot("save", &snap);
    writer(&consul, &["set", "web/s1", "drain"]);
    agent.wait_answer("web/s1", "drain 100%\n");
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_drain);

    if stopped {
        assert!(agent.terminate().is_some_and(|s| s.success()));
    }
    consul.snapshot("restore", &snap);
    writer(&consul, &["set", "web/s3", "drain"]);
    if stopped {
        agent = self::agent(&consul, &state, port, http_port);
    }
    agent.wait_answer("web/s3", "drain 100%\n");
    assert_eq!(agent.ask("web/s2"), "maint 100%\n");
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(
            agent.ask("web/s1"),
            "drain 100%\n",
            "web/s1's drain, undone by the restore, is kept\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = &status(&agent)["held"]["web/s1"];
    assert_eq!(held["cause"], "rolled_back", "{}", status(&agent));
    assert!(rolled_back(&agent) >= 1.0);
    assert!(haproxy.server("web", "s1").is_drain());
}

#[test]
fn a_drain_undone_by_a_restore_stays_held_after_the_next_write() {
    a_drain_undone_by_a_restore_stays_held(false);
}

#[test]
fn a_drain_undone_by_a_restore_stays_held_for_an_agent_stopped_through_it() {
    a_drain_undone_by_a_restore_stays_held(true);
}

/// The bound on seeing a restore under a parked query, from the end of
/// `consul snapshot restore`: the next index check (every 2 s by default)
/// sees the lower index and the read starts again from 0. The parked read
/// itself is held by Consul until its wait ends (60 s by default).
const SEE_RESTORE: Duration = Duration::from_secs(5);

/// The agent watching with the default `--wait 60s` and `--index-check
/// 2s`: `web/s1` = drain, a snapshot, `web/s1` cleared (served ready), the
/// snapshot restored. Consul holds the drain again and the index went
/// below the parked read's: the agent serves the drain, and HAProxy shows
/// it, within [`SEE_RESTORE`] (a drain that comes back is less traffic: the
/// loss rules apply it). On 89740e7 the agent served ready for the whole
/// wait (60.5 s), its checks counted `current`.
#[test]
fn a_restore_under_a_parked_read_is_served_within_seconds_whatever_the_wait() {
    let consul = Consul::start();
    let state = TempDir::new("lost-data-parked");
    let (port, http_port) = (free_port(), free_port());
    let dir = state.path().to_str().unwrap();
    let agent = Agent::spawn_on(
        &consul.url(),
        port,
        http_port,
        &["--state-dir", dir, "--wait", "60s"],
    );
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1"])]);
    writer(&consul, &["set", "web/s1", "drain"]);
    agent.wait_answer("web/s1", "drain 100%\n");
    let snap = state.path().join("s1-drained.snap");
    consul.snapshot("save", &snap);
    writer(&consul, &["clear", "web/s1"]);
    agent.wait_answer("web/s1", "ready 100%\n");
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| {
        !s.is_drain() && !s.is_maint()
    });
    // Let the next blocking read park at the cleared index.
    std::thread::sleep(Duration::from_secs(1));

    consul.snapshot("restore", &snap);
    let restored = Instant::now();
    let served = wait_for(SEE_RESTORE, || {
        (agent.ask("web/s1") == "drain 100%\n").then(|| restored.elapsed())
    });
    let shown = served.and_then(|_| {
        wait_for(Duration::from_secs(2), || {
            haproxy
                .server("web", "s1")
                .is_drain()
                .then(|| restored.elapsed())
        })
    });
    eprintln!("restore served after {served:?}, shown by HAProxy after {shown:?}");
    assert!(
        served.is_some(),
        "web/s1's drain, back with the restore, not served within {SEE_RESTORE:?} (answers {:?})\n{}",
        agent.ask("web/s1"),
        agent.log()
    );
    assert!(
        shown.is_some_and(|t| t <= SEE_RESTORE + Duration::from_secs(1)),
        "HAProxy: {:?} after {shown:?}",
        haproxy.server("web", "s1")
    );
    assert!(agent.metric("gitlab_haproxy_agent_index_checks_total{result=\"below\"}") >= 1.0);
    assert!(!went_backwards(&agent).is_empty(), "the restore is said");
}

/// A snapshot from before the store had a write generation (keys written
/// by hand), restored after the writer made one: the restore is a loss
/// (the generation vanished, the index went back). The writer's next
/// transaction starts a new generation on the absent key, which the agent
/// cannot tell from a store rebuilt ahead: a loss again, held on the lower
/// side. What it wrote is served: `web/s3` at 50%, which caps its line. On
/// 89740e7 `web/s3` was held "rolled back" with no answer (full weight)
/// while the writer had set it to 50%.
#[test]
fn a_write_after_restoring_a_snapshot_from_before_the_generation_is_served() {
    let consul = Consul::start();
    let state = TempDir::new("lost-data-pregen");
    let agent = agent(&consul, &state, free_port(), free_port());
    consul.put("web/s1", "drain");
    agent.wait_answer("web/s1", "drain 100%\n");
    let snap = state.path().join("before-generation.snap");
    consul.snapshot("save", &snap);
    writer(&consul, &["set", "web/s2", "maint"]);
    agent.wait_answer("web/s2", "maint 100%\n");

    consul.snapshot("restore", &snap);
    // The restore: web/s2's maint, undone, is held.
    let held = wait_for(Duration::from_secs(15), || {
        (status(&agent)["held"]["web/s2"]["cause"] == "rolled_back").then_some(())
    });
    assert!(held.is_some(), "{}\n{}", status(&agent), agent.log());
    let warnings = went_backwards(&agent).len();
    assert!(warnings >= 1);

    writer(&consul, &["set", "web/s3", "50%"]);
    let index = consul.prefix_index();
    let seen = wait_for(Duration::from_secs(15), || {
        consul_index(&agent).filter(|i| *i >= index)
    });
    assert!(seen.is_some(), "{}", agent.log());
    assert_eq!(
        agent.ask("web/s3"),
        "ready 50%\n",
        "the writer's write is served\n{}\n{}",
        status(&agent),
        agent.log()
    );
    let status = status(&agent);
    assert_eq!(status["held"]["web/s3"]["cap"], "50%", "{status}");
    assert_eq!(status["held"]["web/s2"]["cause"], "rolled_back", "{status}");
    // `state release-rollback` takes Consul's values.
    writer(&consul, &["release-rollback"]);
    let released = wait_for(Duration::from_secs(15), || {
        (self::status(&agent)["held"]
            .as_object()
            .is_some_and(|h| h.is_empty()))
        .then_some(())
    });
    assert!(
        released.is_some(),
        "{}\n{}",
        self::status(&agent),
        agent.log()
    );
    assert_eq!(agent.ask("web/s3"), "ready 50%\n");
    assert_eq!(agent.ask("web/s2"), "ready 100%\n");
}

/// The reap: `canary` = maint, served by two agents; one is stopped, the
/// writer clears `canary`; the other watches `web/s2` set to drain and
/// deleted by hand (no generation written with that delete, so its reap
/// lowers the prefix's index); both tombstones are reaped. Neither agent
/// holds anything or says anything went backwards, and the stopped one,
/// started again, answers ready for the canary.
#[test]
#[ignore = "waits about 15 minutes for Consul's tombstone reap: scripts/test.sh runs it in the background (--run-ignored only)"]
fn a_tombstone_reap_after_a_delete_holds_nothing() {
    let consul = Consul::start();
    let (watching_state, stopped_state) =
        (TempDir::new("lost-data-w"), TempDir::new("lost-data-s"));
    let (port, http_port) = (free_port(), free_port());
    let watching = agent(&consul, &watching_state, free_port(), free_port());
    let mut stopped = agent(&consul, &stopped_state, port, http_port);
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"])]);
    writer(&consul, &["set", "canary", "maint"]);
    for a in [&watching, &stopped] {
        a.wait_answer("web/s1 canary", "maint 100%\n");
    }
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_maint);

    assert!(stopped.terminate().is_some_and(|s| s.success()));
    writer(&consul, &["clear", "canary"]);
    let cleared = consul.prefix_index();
    watching.wait_answer("web/s1 canary", "ready 100%\n");
    consul.put("web/s2", "drain");
    watching.wait_answer("web/s2", "drain 100%\n");
    consul.delete("web/s2");
    watching.wait_answer("web/s2", "ready 100%\n");
    let before = consul.prefix_index();

    let took = consul.delete_and_wait_for_reap(REAP_WAIT);
    eprintln!("tombstones reaped {took:?} after the probe's delete");
    assert!(took.is_some(), "no reap within {REAP_WAIT:?}");
    let seen = Instant::now();
    let after = consul.prefix_index();
    assert!(
        after < before,
        "the reap lowers the prefix's index: {before} -> {after}"
    );

    // Everything is checked on both agents before failing: a reap takes a
    // quarter of an hour to come again. Each agent is checked once it
    // serves Consul's index after the reap (`/status` `consul_index`): the
    // watching one after up to two waits of its blocking query (see
    // SEE_REAP); the stopped one, started again, once its first read
    // replaced the state file's copy.
    let stopped = agent(&consul, &stopped_state, port, http_port);
    let mut wrong = Vec::new();
    for (name, a) in [("watching", &watching), ("stopped", &stopped)] {
        if wait_for(SEE_REAP, || (consul_index(a) == Some(after)).then_some(())).is_none() {
            wrong.push(format!(
                "{name}: serves index {:?}, not the reaped prefix's {after}, after {SEE_REAP:?}",
                consul_index(a)
            ));
        }
        eprintln!(
            "{name}: serves index {:?} {:?} after the reap was seen",
            consul_index(a),
            seen.elapsed()
        );
        let (canary, s2) = (a.ask("web/s1 canary"), a.ask("web/s2"));
        if canary != "ready 100%\n" || s2 != "ready 100%\n" {
            wrong.push(format!("{name}: answers canary {canary:?}, web/s2 {s2:?}"));
        }
        let held = status(a)["held"].clone();
        if held.as_object().is_some_and(|h| !h.is_empty()) {
            wrong.push(format!("{name}: holds {held}"));
        }
        if rolled_back(a) != 0.0 {
            wrong.push(format!("{name}: {} keys held rolled back", rolled_back(a)));
        }
        for line in went_backwards(a) {
            wrong.push(format!("{name}: logged {line}"));
        }
    }
    let s1 = wait_for(Duration::from_secs(10), || {
        Some(haproxy.server("web", "s1")).filter(ServerState::is_ready_full_weight)
    });
    if s1.is_none() {
        wrong.push(format!("HAProxy: {:?}", haproxy.server("web", "s1")));
    }
    // The writer's delete wrote the generation in the same transaction: once
    // its tombstone is reaped too, the prefix's index is still that
    // transaction's.
    if after != cleared {
        wrong.push(format!(
            "the prefix's index after the reaps is {after}, not the writer's delete's {cleared}"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
