//! Group writes checked and confirmed through a real Prometheus scraping
//! real agents asked by real HAProxies, the writer run as from a console
//! node (no haproxy.cfg): a group or zone no load balancer names is
//! refused with the names that exist; a zone drain whose member its row key
//! keeps in service exits non-zero naming it; a node with nothing enrolled
//! confirms by its index and does not block.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::prometheus::Prometheus;
use support::{haproxy_config, server_line, Agent, Consul, Haproxy, Run, AGENT_BIN, PREFIX};

/// HAProxy's agent-inter in these tests.
const INTER_MS: u64 = 200;

/// The writer as on a console node: no HAProxy configuration; Prometheus
/// from `GITLAB_HAPROXY_AGENT_PROMETHEUS_URL` when `prometheus` is given.
fn cli(consul: &Consul, prometheus: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = Command::new(AGENT_BIN);
    cmd.env_clear()
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", format!("{INTER_MS}ms"))
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "100ms")
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .env("GITLAB_HAPROXY_AGENT_CONSUL_ADDR", consul.url())
        // Writes that take servers out carry a reason.
        .env("GITLAB_HAPROXY_AGENT_REASON", "group tests");
    if let Some(url) = prometheus {
        cmd.env("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL", url);
    }
    let out = cmd
        .arg("state")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI");
    Run::from(out)
}

fn absent(consul: &Consul, key: &str) -> bool {
    let (status, _, _) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
    status == 404
}

fn value(consul: &Consul, key: &str) -> String {
    let (_, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}?raw"), b"");
    String::from_utf8_lossy(&body).into_owned()
}

/// An agent and the HAProxy that asks it about `servers` (backend web:
/// name, groups).
fn lb(consul: &Consul, servers: &[(&str, &[&str])]) -> (Agent, Haproxy) {
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    for (name, groups) in servers {
        backends.push_str(&server_line("web", name, groups, port, INTER_MS));
    }
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    (agent, haproxy)
}

#[test]
fn a_mistyped_zone_or_group_is_refused_with_the_names_that_exist() {
    let consul = Consul::start();
    let (agent, _haproxy) = lb(
        &consul,
        &[
            ("web-01", &["zone-us-east1-b"]),
            ("web-02", &["zone-us-east1-c"]),
            ("web-cny-01", &["canary", "zone-us-east1-b"]),
        ],
    );
    let prometheus = Prometheus::start(&[agent.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "count by (instance) (gitlab_haproxy_agent_group_rows)",
            1,
            |v| v == 3.0
        ),
        "Prometheus did not see the three groups:\n{}",
        prometheus.log()
    );

    // The zone is us-east1-b: nothing written, the real names listed,
    // closest first.
    let run = cli(
        &consul,
        Some(&prom),
        &["drain", "--zone", "us-east-1b", "--drain-wait", "1s"],
    );
    assert_eq!(run.code, 65, "{run:?}");
    assert!(
        run.stderr
            .contains("no load balancer names the group zone-us-east-1b")
            && run.stderr.contains(
                "The groups that exist, closest first: zone-us-east1-b, zone-us-east1-c, canary"
            )
            && run.stderr.contains("--new-group"),
        "{run:?}"
    );
    assert!(absent(&consul, "zone-us-east-1b"), "written: {run:?}");

    let run = cli(
        &consul,
        Some(&prom),
        &["drain", "--group", "canray", "--drain-wait", "1s", "--json"],
    );
    assert_eq!(run.code, 65, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["error"]["kind"], "unknown_group", "{report}");
    assert!(run.stderr.contains("closest first: canary, "), "{run:?}");
    assert!(absent(&consul, "canray"));

    // `set` of a group key, and the former option name.
    let run = cli(
        &consul,
        None,
        &[
            "set",
            "zone-us-east-1b",
            "maint",
            "--confirm-prometheus",
            &prom,
        ],
    );
    assert_eq!(run.code, 65, "{run:?}");
    assert!(absent(&consul, "zone-us-east-1b"));

    // A new group, said so: written, and confirmed by index alone (no
    // server names it yet).
    let run = cli(
        &consul,
        Some(&prom),
        &["set", "zone-us-east1-d", "drain", "--new-group"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(value(&consul, "zone-us-east1-d"), "drain");
    assert!(
        run.stderr
            .contains("zone-us-east1-d: 0/0 servers naming it answer drain"),
        "{run:?}"
    );

    // The real zone passes the check.
    let run = cli(
        &consul,
        Some(&prom),
        &["drain", "--zone", "us-east1-b", "--dry-run"],
    );
    assert_eq!(run.code, 0, "{run:?}");

    // Without Prometheus, and with a Prometheus that does not answer: the
    // group is not checked, a warning says so, the write goes on.
    let run = cli(
        &consul,
        None,
        &["drain", "--zone", "us-east-1b", "--dry-run"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains(
            "warning: could not check that a load balancer names the group zone-us-east-1b: no \
             Prometheus is set"
        ),
        "{run:?}"
    );
    let nobody = format!("http://127.0.0.1:{}", support::free_port());
    let run = cli(
        &consul,
        Some(&nobody),
        &["drain", "--zone", "us-east-1b", "--dry-run"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("could not check")
            && run
                .stderr
                .contains(&format!("Prometheus at {nobody} did not answer")),
        "{run:?}"
    );
}

#[test]
fn a_zone_drain_kept_from_a_server_by_its_row_key_fails_and_an_empty_node_does_not_block() {
    let consul = Consul::start();
    consul.put("web/web-01", "ready");
    let (one, haproxy) = lb(&consul, &[("web-01", &["zone-b"]), ("web-02", &["zone-b"])]);
    // A node with nothing enrolled yet: its agent runs, no HAProxy asks it.
    let two = Agent::start(&consul.url(), &[]);
    let prometheus = Prometheus::start(&[one.http, two.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_group_rows{group=\"zone-b\"}",
            1,
            |v| v == 2.0
        ),
        "Prometheus did not see zone-b:\n{}",
        prometheus.log()
    );

    let run = cli(
        &consul,
        Some(&prom),
        &[
            "drain",
            "--zone",
            "b",
            "--drain-wait",
            "1s",
            "--confirm-timeout",
            "20s",
        ],
    );
    assert_eq!(run.code, 68, "{run:?}");
    assert!(
        run.stderr
            .contains("1 server naming zone-b is kept in service by another key")
            && run.stderr.contains(&format!(
                "web/web-01 (decided by web/web-01: ready, on {} (lb-1.test))",
                one.http
            ))
            && run.stderr.contains("--accept-overridden"),
        "{run:?}"
    );
    // The drain step is in Consul; maint was not written.
    assert_eq!(value(&consul, "zone-b"), "drain");
    assert!(haproxy.server("web", "web-01").is_ready_full_weight());

    // Accepted: the sequence goes on; the empty node confirms by index.
    let run = cli(
        &consul,
        Some(&prom),
        &[
            "drain",
            "--zone",
            "b",
            "--drain-wait",
            "1s",
            "--confirm-timeout",
            "20s",
            "--accept-overridden",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(value(&consul, "zone-b"), "maint");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    // Already at drain: the plan waits again, then writes maint.
    let maint = &report["steps"].as_array().unwrap().last().unwrap()["confirmed"];
    assert_eq!(maint["group"]["key"], "zone-b", "{report}");
    assert_eq!(maint["group"]["servers_naming"], 2, "{report}");
    assert_eq!(maint["group"]["servers_answering"], 1, "{report}");
    assert_eq!(maint["group"]["servers_overridden"], 1, "{report}");
    assert_eq!(
        maint["group"]["overridden"][0]["decided_by"], "web/web-01",
        "{report}"
    );
    assert_eq!(
        maint["confirmed_by_index_only"][0],
        format!("{} (lb-2.test)", two.http),
        "{report}"
    );
    assert!(
        run.stderr
            .contains("zone-b: 1/2 servers naming it answer maint")
            && run.stderr.contains(&format!(
                "confirmed by index alone (their HAProxy names no server with zone-b): {} \
                 (lb-2.test)",
                two.http
            )),
        "{run:?}"
    );

    // A row key: the node HAProxy asks nothing does not block either (and
    // no fleet totals are counted for a row key).
    let run = cli(&consul, Some(&prom), &["set", "web/web-02", "ready"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains(&format!(
            "2/2 agents at index >= {}; confirmed by index alone (HAProxy asked them nothing in \
             the last 60 s): {} (lb-2.test)",
            consul.prefix_index(),
            two.http
        )) && !run.stderr.contains("rows answered"),
        "{run:?}"
    );
    // So does `state status`, which shows it not asked.
    let run = cli(&consul, Some(&prom), &["status"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("not_asked")
            && run.stdout.contains(&format!(
                "2/2 agents at index >= {} (the prefix's X-Consul-Index now); confirmed by index \
                 alone (HAProxy asked them nothing in the last 60 s): {} (lb-2.test); rows",
                consul.prefix_index(),
                two.http
            )),
        "{run:?}"
    );
}

fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `canary` = `maintenance` (a break-glass typo) while the agents knew
/// `maint`: the agent answers the held `maint 100%`, and `/status`, `state
/// list`, `get`, `explain` and `status` all say so in the same words; after
/// Consul loses its data, `release-rollback --dry-run` names what it would
/// release. Without Prometheus the writer says it cannot know.
#[test]
fn every_surface_tells_what_the_agents_hold_in_the_same_words() {
    let mut consul = Consul::start();
    consul.put("~store-id", "5f0c2a9e8d7b4c31a6e2f90b1d4c7e58");
    consul.put("canary", "maint");
    consul.put("web/web-02", "drain");
    // Past where a restarted dev Consul starts, so the loss shows.
    for i in 0..10 {
        consul.put("web/web-09", if i % 2 == 0 { "drain" } else { "ready" });
    }
    let (agent, haproxy) = lb(&consul, &[("web-cny-01", &["canary"]), ("web-02", &[])]);
    haproxy.wait_server("web", "web-cny-01", Duration::from_secs(10), |s| {
        s.is_maint()
    });
    consul.put("canary", "maintenance");
    let held = "maint 100% (held: invalid value)";
    let ok = support::wait_for(Duration::from_secs(10), || {
        (status(&agent)["held"]["canary"]["answer"] == held).then_some(())
    });
    assert!(ok.is_some(), "{}", status(&agent));
    assert_eq!(agent.ask("web/web-cny-01 canary"), "maint 100%\n");
    let prometheus = Prometheus::start(&[agent.http]);
    let prom = prometheus.url();
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_held_key{key=\"canary\",cause=\"invalid_value\",state=\"maint\"}",
            1,
            |v| v == 1.0
        ),
        "Prometheus did not see canary held:\n{}",
        prometheus.log()
    );
    let on_all = format!("{held} on 1/1 agents");

    let run = cli(&consul, Some(&prom), &["list"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "Held by the agents (Prometheus at {prom}, 1 agent):"
        )) && run.stdout.contains(&format!("  canary: {on_all}")),
        "{run:?}"
    );
    let run = cli(&consul, Some(&prom), &["get", "canary"]);
    assert!(run.stdout.contains(&format!("agents: {on_all}")), "{run:?}");
    let run = cli(
        &consul,
        Some(&prom),
        &["explain", "web/web-cny-01", "canary"],
    );
    assert!(
        run.stdout
            .contains(&format!("agents: key canary: {on_all}")),
        "{run:?}"
    );
    let run = cli(&consul, Some(&prom), &["status"]);
    assert!(
        run.stdout.contains(&format!("  canary: {on_all}")),
        "{run:?}"
    );
    let run = cli(&consul, Some(&prom), &["release-rollback", "--dry-run"]);
    assert!(run.stdout.contains("it would release nothing"), "{run:?}");

    // Without Prometheus: said, not guessed.
    let run = cli(&consul, None, &["list"]);
    assert!(
        run.stdout.contains(
            "What the agents hold is not known here: no Prometheus is set (--prometheus URL or \
             GITLAB_HAPROXY_AGENT_PROMETHEUS_URL)"
        ) && run.stdout.contains(
            "  canary: an agent that knew a valid value answers it (held: invalid value); one \
             that did not skips the key"
        ),
        "{run:?}"
    );

    // Consul loses its data: the agent holds web/web-02 at drain.
    consul.restart();
    let ok = support::wait_for(Duration::from_secs(20), || {
        (status(&agent)["held"]["web/web-02"]["cause"] == "rolled_back").then_some(())
    });
    assert!(ok.is_some(), "{}", status(&agent));
    assert!(
        prometheus.wait_until(
            Duration::from_secs(20),
            "gitlab_haproxy_agent_held_key{key=\"web/web-02\",cause=\"rolled_back\"}",
            1,
            |v| v == 1.0
        ),
        "Prometheus did not see web/web-02 held"
    );
    // Gone from the store, the key may be gone for good: it caps what the
    // next identity answers at its drain.
    let capped =
        "at most drain 100%: the next identity decides when it gives less (held: rolled back)";
    let run = cli(&consul, Some(&prom), &["release-rollback", "--dry-run"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains(&format!("  web/web-02: {capped} on 1/1 agents")),
        "{run:?}"
    );
    assert_eq!(status(&agent)["held"]["web/web-02"]["answer"], capped);
    // The release itself names what it released, as seen just before.
    let run = cli(&consul, Some(&prom), &["release-rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("released, as Prometheus showed them just before:")
            && run
                .stdout
                .contains(&format!("  web/web-02: {capped} on 1/1 agents")),
        "{run:?}"
    );
    let ok = support::wait_for(Duration::from_secs(10), || {
        status(&agent)["held"]["web/web-02"].is_null().then_some(())
    });
    assert!(ok.is_some(), "{}", status(&agent));
}

/// `--help` of the commands on-call types puts the command's own options
/// (the selectors first) before the options every `state` command takes,
/// which stand under their own heading.
#[test]
fn help_lists_the_selectors_first_and_the_global_options_apart() {
    for cmd in [
        &["drain"][..],
        &["undrain"],
        &["canary", "disable"],
        &["canary", "enable"],
        &["set"],
    ] {
        let out = Command::new(AGENT_BIN)
            .env_clear()
            .arg("state")
            .args(cmd)
            .arg("--help")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{cmd:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        let at = |what: &str| {
            help.find(what)
                .unwrap_or_else(|| panic!("{cmd:?}: no {what} in\n{help}"))
        };
        let global = at("\nGlobal options:\n");
        for own in ["      --dry-run", "      --new-group"] {
            assert!(at(own) < global, "{cmd:?}: {own} after the global options");
        }
        for g in [
            "  --consul-addr <URL>",
            "  --prometheus <URL>",
            "      --json",
            "  --agent-inter <",
            "  --prefix <",
        ] {
            assert!(
                at(g) > global,
                "{cmd:?}: {g} before the global options\n{help}"
            );
        }
        if cmd[0].ends_with("drain") {
            let selectors = [
                at("  --zone <ZONE>"),
                at("  --group <GROUP>"),
                at("  --backend <BACKEND>"),
                at("  --server <NAME|GLOB>"),
            ];
            assert!(selectors.windows(2).all(|w| w[0] < w[1]), "{help}");
            assert!(selectors[3] < at("      --dry-run"), "{help}");
            assert!(at("Options:\n") < selectors[0], "{help}");
        }
    }
}
