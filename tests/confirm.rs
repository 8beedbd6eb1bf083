//! Confirmation of writes through a real Prometheus scraping two real
//! agents (each asked by its own real HAProxy, as on two load balancers)
//! that follow a real Consul: `--confirm-prometheus` confirms each step
//! when both agents answer from the write's index, and names the agent
//! that lags, exiting 68, when one is stopped. `state status` shows the
//! same fleet.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::prometheus::Prometheus;
use support::{haproxy_config, server_line, Agent, Consul, Haproxy, Run, AGENT_BIN, PREFIX};

/// HAProxy's agent-inter in these tests.
const INTER_MS: u64 = 200;

/// The exit status of a write not confirmed in time (EX_NOHOST).
const NOT_CONFIRMED: i32 = 68;

fn cli(consul: &Consul, args: &[&str]) -> Run {
    let out = Command::new(AGENT_BIN)
        .env_clear()
        // The wait floor follows this HAProxy's agent-inter, so the tests
        // can wait 1 s between steps.
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", format!("{INTER_MS}ms"))
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "100ms")
        // Writes that take servers out need a reason (tests/drain_records.rs
        // tests that and the records); the environment's default gives it.
        .env("GITLAB_HAPROXY_AGENT_REASON", "test")
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .arg("state")
        .args(args)
        .args(["--consul-addr", &consul.url()])
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI");
    Run::from(out)
}

/// A load balancer: an agent and the HAProxy that asks it about two
/// servers, a canary and another.
struct Lb {
    agent: Agent,
    _haproxy: Haproxy,
}

fn lb(consul: &Consul) -> Lb {
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-01", &[], port, INTER_MS));
    backends.push_str(&server_line(
        "web",
        "web-cny-01",
        &["canary"],
        port,
        INTER_MS,
    ));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    Lb {
        agent,
        _haproxy: haproxy,
    }
}

/// The ModifyIndex of `PREFIX + key`.
fn modify_index(consul: &Consul, key: &str) -> u64 {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
    assert_eq!(status, 200, "{key} is absent");
    let v: Value = serde_json::from_slice(&body).unwrap();
    v[0]["ModifyIndex"].as_u64().unwrap()
}

#[test]
fn writes_are_confirmed_by_every_agent_and_a_stopped_agent_is_named() {
    let consul = Consul::start();
    let one = lb(&consul);
    let mut two = lb(&consul);
    let prometheus = Prometheus::start(&[one.agent.http, two.agent.http]);
    let prom = prometheus.url();
    // Both scraped, both asked about their two rows.
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_rows_seen",
            2,
            |v| v == 2.0
        ),
        "Prometheus did not scrape both agents asked about 2 rows:\n{}",
        prometheus.log()
    );

    let run = cli(
        &consul,
        &[
            "canary",
            "disable",
            "--drain-wait",
            "1s",
            "--confirm-prometheus",
            &prom,
            "--confirm-timeout",
            "20s",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let maint_index = modify_index(&consul, "canary");
    // The report records each write step's confirmation.
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{report}");
    let drain = &steps[0]["confirmed"];
    assert_eq!(drain["agents_at_index"], 2, "{report}");
    assert_eq!(drain["state"], "drain", "{report}");
    assert_eq!(drain["rows_answered"], 2, "{report}");
    assert!(drain["index"].as_u64().unwrap() < maint_index, "{report}");
    assert!(
        steps[1].get("confirmed").is_none(),
        "a wait is not confirmed"
    );
    let maint = &steps[2]["confirmed"];
    assert_eq!(maint["index"], maint_index, "{report}");
    assert_eq!(maint["state"], "maint", "{report}");
    assert!(maint["waited_seconds"].as_f64().unwrap() < 20.0, "{report}");
    // Each step confirmed by both agents, which answered the canary row of
    // each load balancer from it.
    assert!(
        run.stderr
            .contains("canary disable: drain: confirmed: 2/2 agents at index >= ")
            && run
                .stderr
                .contains("; canary: 2/2 servers naming it answer drain (after "),
        "{run:?}"
    );
    assert!(
        run.stderr.contains(&format!(
            "canary disable: maint: confirmed: 2/2 agents at index >= {maint_index}; canary: 2/2 \
             servers naming it answer maint"
        )),
        "{run:?}"
    );
    // The agents do answer maint for the canary.
    for lb in [&one, &two] {
        assert_eq!(lb.agent.ask("web/web-cny-01 canary"), "maint 100%\n");
    }

    // The fleet view, without writing: every agent at the prefix's index.
    let status = cli(&consul, &["status", "--prometheus", &prom]);
    assert_eq!(status.code, 0, "{status:?}");
    let index = consul.prefix_index();
    assert!(
        status
            .stdout
            .contains(&format!("2/2 agents at index >= {index} ")),
        "{status:?}"
    );
    assert!(status.stdout.contains("1 maint, 1 ready"), "{status:?}");
    // The keys that take servers out, with who wrote them and why.
    let canary = status
        .stdout
        .lines()
        .find(|l| l.trim().starts_with("canary "));
    let canary = canary.unwrap_or_else(|| panic!("no key out: {status:?}"));
    assert!(
        canary.contains("canary maint: by uid ") && canary.ends_with(": test"),
        "{canary}"
    );

    // A removal is confirmed at the prefix's index after it, its rows
    // answered ready (the default).
    let run = cli(
        &consul,
        &[
            "canary",
            "enable",
            "--maint-wait",
            "1s",
            "--confirm-prometheus",
            &prom,
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr
            .contains("canary enable: clear: confirmed: 2/2 agents at index >= ")
            && run
                .stderr
                .contains("; canary: 2/2 servers naming it answer ready (after "),
        "{run:?}"
    );

    // `set --json` reports its confirmation too.
    let run = cli(
        &consul,
        &[
            "set",
            "web/web-01",
            "ready",
            "--confirm-prometheus",
            &prom,
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["confirmed"]["index"],
        modify_index(&consul, "web/web-01"),
        "{report}"
    );
    assert_eq!(report["confirmed"]["agents_at_index"], 2, "{report}");
    // Counts for the selection, never the fleet's: the agents count no
    // rows apart for a row key.
    assert!(report["confirmed"]["rows_answered"].is_null(), "{report}");
    assert!(!run.stderr.contains("rows answered"), "{run:?}");

    // One load balancer's agent stops: the next write is not confirmed,
    // that agent is named, and the command exits 68.
    let stopped = two.agent.http.to_string();
    let running = one.agent.http.to_string();
    two.agent.proc().kill();
    let run = cli(
        &consul,
        &[
            "set",
            "web/web-01",
            "drain",
            "--confirm-prometheus",
            &prom,
            "--confirm-timeout",
            "8s",
        ],
    );
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    let index = modify_index(&consul, "web/web-01");
    assert!(
        run.stderr.contains(&format!(
            "s: 1/2 agents at index >= {index}; 1 agent is behind: {stopped} (lb-2.test): \
             target down (the last scrape failed), index "
        )),
        "{run:?}"
    );
    // The time waited is the timeout, or a little more on a loaded machine.
    assert!(run.stderr.contains("not confirmed after "), "{run:?}");
    assert!(!run.stderr.contains(&running), "{run:?}");
    // The write itself was made, and the running agent answers it.
    assert!(run.stdout.contains("written"), "{run:?}");
    assert_eq!(one.agent.ask("web/web-01"), "drain 100%\n");

    // In a sequence, the step that is not confirmed is the last written:
    // the canary stays at drain, maint is not written.
    let run = cli(
        &consul,
        &[
            "canary",
            "disable",
            "--drain-wait",
            "1s",
            "--confirm-prometheus",
            &prom,
            "--confirm-timeout",
            "5s",
            "--json",
        ],
    );
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "not_confirmed", "{run:?}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains(&stopped), "{message}");
    assert!(message.contains("maint was NOT written"), "{message}");
    let steps: Vec<&Value> = report["steps"].as_array().unwrap().iter().collect();
    assert_eq!(steps[0]["status"], "done", "{report}");
    assert!(steps[0]["confirmed"].is_null(), "{report}");
    assert_eq!(steps[2]["status"], "not_run", "{report}");
    let (_, _, value) = consul.request("GET", &format!("/v1/kv/{PREFIX}canary?raw"), b"");
    assert_eq!(value, b"drain");
    assert_eq!(one.agent.ask("web/web-cny-01 canary"), "drain 100%\n");

    let status = cli(&consul, &["status", "--prometheus", &prom, "--json"]);
    assert_eq!(status.code, NOT_CONFIRMED, "{status:?}");
    let view: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(view["agents_total"], 2);
    assert_eq!(view["agents_at_index"], 1);
    let lagging: Vec<&Value> = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["lag"].is_null())
        .collect();
    assert_eq!(lagging.len(), 1, "{view}");
    assert_eq!(lagging[0]["instance"], stopped.as_str());
    assert_eq!(lagging[0]["lag"], "target_down");
    assert_eq!(view["keys_out"][0]["key"], "canary", "{view}");
    assert_eq!(view["keys_out"][0]["state"], "drain");
    assert_eq!(view["keys_out"][0]["written"]["reason"], "test");

    // A selector Prometheus refuses fails at once; a Prometheus that does
    // not answer fails at the timeout. Both exit 68, the write made.
    let status = cli(
        &consul,
        &["status", "--prometheus", &prom, "--selector", "job=="],
    );
    assert_eq!(status.code, NOT_CONFIRMED, "{status:?}");
    assert!(status.stderr.contains("bad_data"), "{status:?}");
    let started = std::time::Instant::now();
    let run = cli(
        &consul,
        &[
            "set",
            "web/web-01",
            "ready",
            "--confirm-prometheus",
            &prom,
            "--confirm-selector",
            "job==",
            "--confirm-timeout",
            "30s",
        ],
    );
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    assert!(run.stderr.contains("bad_data"), "{run:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a refused selector waited for the timeout"
    );
    // A URL that is not one is refused before anything is written.
    let run = cli(
        &consul,
        &[
            "set",
            "web/web-02",
            "maint",
            "--confirm-prometheus",
            "prometheus:9090",
        ],
    );
    assert_eq!(run.code, 64, "{run:?}");
    let (status, _, _) = consul.request("GET", &format!("/v1/kv/{PREFIX}web/web-02"), b"");
    assert_eq!(status, 404, "written despite the bad URL");

    let nobody = format!("http://127.0.0.1:{}", support::free_port());
    let run = cli(
        &consul,
        &[
            "set",
            "web/web-01",
            "maint",
            "--confirm-prometheus",
            &nobody,
            "--confirm-timeout",
            "2s",
            "--json",
        ],
    );
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "prometheus_unavailable", "{run:?}");
    assert!(report["confirmed"].is_null(), "{report}");
    assert_eq!(report["after"], "maint", "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("Prometheus at {nobody} did not answer")),
        "{run:?}"
    );
}

/// The runbook's confirmation commands (in a `text` block: the runbook test
/// runs every `shell` block, and has no Prometheus) parse with this CLI.
#[test]
fn the_runbook_confirmation_commands_parse() {
    use clap::Parser as _;
    use gitlab_haproxy_agent::cli::Cli;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runbook/procedures.md");
    let runbook = std::fs::read_to_string(path).unwrap();
    let section = runbook
        .split("## Confirming a drain")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the runbook has a section Confirming a drain");
    let commands: Vec<&str> = section
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("gitlab-haproxy-agent state"))
        .collect();
    assert_eq!(commands.len(), 2, "{section}");
    for command in commands {
        // Words as the shell splits them: "..." is one (a --reason).
        let words: Vec<&str> = (command.split('"').enumerate())
            .flat_map(|(i, part)| match i % 2 {
                0 => part.split_whitespace().collect(),
                _ => vec![part],
            })
            .collect();
        let cli = Cli::try_parse_from(words).unwrap_or_else(|e| panic!("{command}\n{e}"));
        assert!(
            cli.command.is_some(),
            "{command} parsed without a subcommand"
        );
    }
}

/// The reload guard's probe line (`check-ready`, run by every HAProxy
/// reload) is no row: a write made after it is confirmed at once (the probe
/// does not hold the agent's answered index at the snapshot it was answered
/// from), it is not on `/status`, in the rows seen or in the group names,
/// and a drain of the group `check-ready` is refused.
#[test]
fn the_reload_guard_probe_is_no_row() {
    let consul = Consul::start();
    let one = lb(&consul);
    let prometheus = Prometheus::start(&[one.agent.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_rows_seen",
            1,
            |v| v == 2.0
        ),
        "Prometheus did not scrape the agent asked about 2 rows:\n{}",
        prometheus.log()
    );
    let run = cli(
        &consul,
        &["set", "web/web-01", "drain", "--prometheus", &prom],
    );
    assert_eq!(run.code, 0, "{run:?}");

    // What `systemctl reload haproxy` runs first.
    let guard = Command::new(AGENT_BIN)
        .env_clear()
        .args(["check-ready", "--agent-addr"])
        .arg(one.agent.listen.to_string())
        .arg("--http-addr")
        .arg(one.agent.http.to_string())
        .args(["--override-file", "/nonexistent/override"])
        .stdin(Stdio::null())
        .output()
        .expect("run check-ready");
    let guard = Run::from(guard);
    assert_eq!(guard.code, 0, "{guard:?}");
    // Scraped at least once after the probe.
    std::thread::sleep(Duration::from_millis(2500));

    let run = cli(
        &consul,
        &[
            "set",
            "web/web-cny-01",
            "drain",
            "--prometheus",
            &prom,
            "--confirm-timeout",
            "10s",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("confirmed: 1/1 agents at index >= "),
        "{run:?}"
    );

    let (code, status) = one.agent.http_get("/status").expect("/status");
    assert_eq!(code, 200);
    assert!(!status.contains("check-ready"), "{status}");
    assert_eq!(one.agent.metric("gitlab_haproxy_agent_rows_seen"), 2.0);
    let probe = prometheus.values(r#"gitlab_haproxy_agent_group_rows{group="check-ready"}"#);
    assert!(probe.is_empty(), "{probe:?}");
    assert_eq!(
        prometheus
            .values(r#"gitlab_haproxy_agent_group_rows{group="canary"}"#)
            .len(),
        1,
        "the group query works"
    );

    // Not a group to write, whatever Prometheus says.
    for extra in [&[][..], &["--new-group"][..]] {
        let mut args = vec!["drain", "--group", "check-ready", "--dry-run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--prometheus", &prom]);
        let run = cli(&consul, &args);
        assert_eq!(run.code, 65, "{run:?}");
        assert!(
            run.stderr
                .contains("check-ready is the line the reload guard"),
            "{run:?}"
        );
    }
}

/// `state status` is a verdict: not ok (exit 68) while an agent holds keys
/// (an invalid value), has a row answered maint that HAProxy no longer asks
/// about (its HAProxy stopped), or follows a store without an id (an
/// emptied store, followed by an agent restarted without a state file);
/// with Consul down it still shows every agent, Consul's index unknown,
/// and exits 69.
#[test]
fn status_is_a_verdict_and_shows_the_fleet_without_consul() {
    let mut consul = Consul::start();
    let mut one = lb(&consul);
    let mut two = lb(&consul);
    let prometheus = Prometheus::start(&[one.agent.http, two.agent.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_rows_seen",
            2,
            |v| v == 2.0
        ),
        "Prometheus did not scrape both agents asked about 2 rows:\n{}",
        prometheus.log()
    );
    let run = cli(
        &consul,
        &["set", "web/web-01", "maint", "--prometheus", &prom],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let status = |consul: &Consul, json: bool| {
        let mut args = vec!["status", "--prometheus", &prom];
        if json {
            args.push("--json");
        }
        cli(consul, &args)
    };
    // Every agent at the index, nothing held: ok.
    let ok = support::wait_for(Duration::from_secs(20), || {
        let run = status(&consul, false);
        (run.code == 0).then_some(run)
    });
    let ok = ok.unwrap_or_else(|| panic!("never ok: {:?}", status(&consul, false)));
    assert!(ok.stdout.contains("2/2 agents at index >= "), "{ok:?}");
    let held = "sum by (instance) (gitlab_haproxy_agent_held_keys)";

    // A typo over the maint: both agents hold the maint.
    consul.put("web/web-01", "mantenance");
    assert!(
        prometheus.wait_until(Duration::from_secs(20), held, 2, |v| v == 1.0),
        "no hold scraped"
    );
    let run = status(&consul, false);
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    assert!(run.stdout.contains(" held_keys\n"), "{run:?}");
    assert!(
        run.stdout
            .contains("1 key held, answered with another state"),
        "{run:?}"
    );
    assert!(run.stdout.contains("Verdict: NOT OK"), "{run:?}");
    assert!(run.stderr.contains("2 agents are not ok: "), "{run:?}");
    assert!(ok.stdout.contains("Verdict: ok."), "{ok:?}");
    consul.put("web/web-01", "maint");
    assert!(
        prometheus.wait_until(Duration::from_secs(20), held, 2, |v| v == 0.0),
        "the hold did not end"
    );

    // One load balancer's HAProxy stops asking: its maint row is no
    // longer asked about (after the 10 s floor).
    one._haproxy.proc().kill();
    let not_asked = format!(
        "gitlab_haproxy_agent_out_rows_not_asked{{instance=\"{}\"}}",
        one.agent.http
    );
    assert!(
        prometheus.wait_until(Duration::from_secs(30), &not_asked, 1, |v| v == 1.0),
        "the row not asked was not scraped"
    );
    let run = status(&consul, true);
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    let view = run.json();
    assert_eq!(view["ok"], false, "{view}");
    assert_eq!(view["error"]["kind"], "not_ok", "{view}");
    let agent = |view: &Value, lb: &Lb| {
        view["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["instance"] == lb.agent.http.to_string())
            .cloned()
            .unwrap_or_else(|| panic!("{} not shown: {view}", lb.agent.http))
    };
    assert_eq!(agent(&view, &one)["status"], "rows_not_asked", "{view}");
    assert_eq!(agent(&view, &two)["status"], "ok", "{view}");

    // The store is emptied, and the second agent restarts without a state
    // file: it follows the empty store, which has no id.
    let (code, _, _) = consul.request("DELETE", &format!("/v1/kv/{PREFIX}?recurse"), b"");
    assert_eq!(code, 200);
    let (port, http) = (two.agent.listen.port(), two.agent.http.port());
    two.agent.terminate();
    two.agent = support::Agent::spawn_on(&consul.url(), port, http, &[]);
    two.agent.wait_ready();
    let store = format!(
        "gitlab_haproxy_agent_store_id_present{{instance=\"{}\"}}",
        two.agent.http
    );
    assert!(
        prometheus.wait_until(Duration::from_secs(20), &store, 1, |v| v == 0.0),
        "the agent following the empty store was not scraped"
    );
    let run = status(&consul, true);
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    let view = run.json();
    let problems = agent(&view, &two)["problems"].clone();
    assert!(
        problems
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["kind"] == "no_store_id"),
        "{view}"
    );

    // Consul down: every agent still shown, Consul's index unknown, exit 69.
    consul.stop();
    let run = status(&consul, false);
    assert_eq!(run.code, 69, "{run:?}");
    for lb in [&one, &two] {
        assert!(
            run.stdout.contains(&lb.agent.http.to_string()),
            "{} not shown: {run:?}",
            lb.agent.http
        );
    }
    assert!(run.stdout.contains("Consul's index is unknown"), "{run:?}");
    assert!(run.stdout.contains("Keys out: unknown"), "{run:?}");
    let run = status(&consul, true);
    assert_eq!(run.code, 69, "{run:?}");
    let view = run.json();
    assert!(view["consul_index"].is_null(), "{view}");
    assert_eq!(view["agents"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["ok"], false, "{view}");
}

/// A server its row key keeps in service while its group is drained is
/// named once, with the load balancers that keep it, not once per load
/// balancer, and counted as one server; a write of a row key reports no
/// fleet totals.
#[test]
fn an_overridden_server_is_one_entry_listing_its_load_balancers() {
    let consul = Consul::start();
    let one = lb(&consul);
    let two = lb(&consul);
    let prometheus = Prometheus::start(&[one.agent.http, two.agent.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_rows_seen",
            2,
            |v| v == 2.0
        ),
        "Prometheus did not scrape both agents asked about 2 rows:\n{}",
        prometheus.log()
    );
    let run = cli(
        &consul,
        &["set", "web/web-cny-01", "ready", "--prometheus", &prom],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let run = cli(
        &consul,
        &[
            "canary",
            "disable",
            "--drain-wait",
            "1s",
            "--prometheus",
            &prom,
            "--confirm-timeout",
            "20s",
        ],
    );
    assert_eq!(run.code, NOT_CONFIRMED, "{run:?}");
    assert!(
        run.stderr
            .contains("1 server naming canary is kept in service by another key"),
        "{run:?}"
    );
    assert_eq!(
        run.stderr.matches("web/web-cny-01 (decided by").count(),
        1,
        "{run:?}"
    );
    assert!(
        run.stderr.contains(&format!(
            "web/web-cny-01 (decided by web/web-cny-01: ready, on 2 load balancers: {} \
             (lb-1.test), {} (lb-2.test))",
            one.agent.http, two.agent.http
        )),
        "{run:?}"
    );

    // Clearing one row key: no fleet totals in its confirmation.
    let run = cli(
        &consul,
        &["clear", "web/web-cny-01", "--prometheus", &prom, "--json"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("rows answered"), "{run:?}");
    assert!(
        run.json()["confirmed"]["rows_answered"].is_null(),
        "{run:?}"
    );
}
