//! Runs every command of the runbook's ```shell blocks (runbook/README.md,
//! then each page in the order of [`PAGES`]), in order, against a real
//! Consul, a real HAProxy and the agent, and checks what each procedure did
//! to HAProxy's servers, so the runbook cannot rot.
//!
//! They run as written on a console node set up as the runbook's "Console
//! node" section says: each command runs in a shell that first runs that
//! section's ```shell block, with nothing else in its environment but
//! `PATH` and `HOME` (and no `/etc/default/gitlab-haproxy-agent`:
//! `GITLAB_HAPROXY_AGENT_DEFAULTS_FILE` names a file that does not exist).
//! Only Consul, the agent's HTTP port and the Prometheus that scrapes the
//! agent are reachable, from an empty directory, with no HAProxy
//! configuration and no stats socket; no ```shell command may name either.
//! Only addresses are rewritten, to the test's: `127.0.0.1:9778` (the
//! agent's HTTP port), `127.0.0.1:8500` (Consul) and
//! `http://prometheus:9090`. Waits run as written (`--drain-wait 60s`,
//! `sleep 60`): the test takes about ten minutes. Every write (a `state`
//! command that is not a dry run) runs with a HAProxy reload in the middle,
//! made as the cookbook's drop-in makes it (check-ready first): the
//! confirmations and what each procedure did must hold through it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::prometheus::Prometheus;
use support::{haproxy_config, Agent, Consul, Haproxy, ServerState, TempDir};

const INTER_MS: u64 = 200;

/// The runbook's pages in the order their commands run: the index, then a
/// page per area, the procedures last (they rely on the 50% the "Invalid
/// values" section of keys.md writes).
const PAGES: &[&str] = &[
    "README.md",
    "agent.md",
    "consul.md",
    "keys.md",
    "haproxy.md",
    "procedures.md",
];
const CONVERGE: Duration = Duration::from_secs(10);

/// The ```shell blocks of a Markdown text, each with the heading above it.
fn shell_blocks(markdown: &str) -> Vec<(String, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        match &mut current {
            Some(lines) if line.trim_start().starts_with("```") => {
                blocks.push((heading.clone(), std::mem::take(lines)));
                current = None;
            }
            Some(lines) if !line.trim().is_empty() && !line.trim_start().starts_with('#') => {
                lines.push(line.trim().to_string());
            }
            Some(_) => {}
            None if line.trim_start().starts_with("```shell") => current = Some(Vec::new()),
            None if line.starts_with('#') => heading = line.trim_start_matches('#').trim().into(),
            None => {}
        }
    }
    blocks
}

/// A server line, enrolled or not, with the zone and groups on agent-send.
fn server(name: &str, groups: &[&str], agent_port: u16, enrolled: bool) -> String {
    if !enrolled {
        return format!("    server {name} 127.0.0.1:1 weight 100\n");
    }
    support::server_line("web", name, groups, agent_port, INTER_MS)
        .replace(" weight 100 ", " weight 100 slowstart 2s ")
}

/// A reload as the cookbook's drop-in for HAProxy's unit runs it: the
/// agent's check-ready (which must pass), then SIGUSR2 to the master.
fn reload_as_systemd(agent: &Agent, haproxy: &Haproxy) {
    let out = Command::new(support::AGENT_BIN)
        .args(["check-ready", "--agent-addr", &agent.listen.to_string()])
        .args(["--http-addr", &agent.http.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check-ready refused the reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    haproxy.reload();
}

#[test]
fn every_runbook_command_runs_and_procedures_do_what_they_say() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backend = String::from("backend web\n");
    backend += &server("web-01-sv-gprd", &["zone-us-east1-b"], port, true);
    backend += &server("web-02-sv-gprd", &["zone-us-east1-c"], port, true);
    // As the cookbook renders them: row key, zone, then the backend's
    // groups; a server-template's servers have no row key.
    backend += &server(
        "web-cny-01-sv-gprd",
        &["zone-us-east1-b", "canary"],
        port,
        true,
    );
    backend += &server(
        "web-cny-02-sv-gprd",
        &["zone-us-east1-c", "canary"],
        port,
        true,
    );
    backend += &server("web-03-sv-gprd", &[], port, false);
    backend += &format!(
        "    server-template web-tpl 2 127.0.0.1:1 weight 100 slowstart 2s agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter {INTER_MS}ms agent-send \"zone-us-east1-b\\n\"\n"
    );
    let haproxy = Haproxy::start(&haproxy_config(&backend));
    let console = TempDir::new("runbook-console");
    // The Prometheus every console node is configured with, scraping the
    // fleet (this one agent) once it names its groups.
    let prometheus = Prometheus::start(&[agent.http]);
    assert!(
        prometheus.wait_until(
            Duration::from_secs(30),
            "count by (instance) (gitlab_haproxy_agent_group_rows)",
            1,
            |v| v >= 3.0
        ),
        "Prometheus did not see the agent's groups:\n{}",
        prometheus.log()
    );
    // No package on this console node: the shell set-up is the runbook's.
    let defaults = console.path().join("no-default-gitlab-haproxy-agent");

    let bin = TempDir::new("runbook-bin");
    std::os::unix::fs::symlink(support::AGENT_BIN, bin.path().join("gitlab-haproxy-agent"))
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runbook");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = PAGES.iter().map(|p| p.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "every runbook page is in PAGES");
    let runbook: String = PAGES
        .iter()
        .map(|p| std::fs::read_to_string(dir.join(p)).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let blocks = shell_blocks(&runbook);
    // Addresses are the only thing rewritten.
    let addresses = |text: &str| {
        text.replace("127.0.0.1:9778", &agent.http.to_string())
            .replace("127.0.0.1:8500", &consul.addr().to_string())
            .replace("http://prometheus:9090", &prometheus.url())
    };
    let setup = blocks
        .iter()
        .find(|(heading, _)| heading == "Console node")
        .map(|(_, lines)| addresses(&lines.join("\n")))
        .expect("the runbook has a Console node section with a shell block");
    assert!(
        setup.contains("export GITLAB_HAPROXY_AGENT_PROMETHEUS_URL="),
        "{setup}"
    );
    let state = |s: &str| haproxy.server("web", s);
    let wait = |s: &str, cond: fn(&ServerState) -> bool| {
        haproxy.wait_server("web", s, CONVERGE, cond);
    };
    let mut ran = 0;
    let mut checked = 0;
    let mut reloads = 0;
    let all = [
        "web-01-sv-gprd",
        "web-02-sv-gprd",
        "web-cny-01-sv-gprd",
        "web-cny-02-sv-gprd",
        "web-03-sv-gprd",
        "web-tpl1",
        "web-tpl2",
    ];
    let admin = |s: &str| {
        let st = state(s);
        (st.admin_state, st.uweight)
    };
    // web-01's 50% (its row key) outranks the zone key, so a zone drain
    // leaves it as it is. HAProxy takes the 50% again at the first
    // agent-check after the reload made in the middle of the write: a
    // reload starts every server at its configured weight.
    let web_01_keeps_its_fifty = || {
        let fifty = support::wait_for(Duration::from_secs(10), || {
            (admin("web-01-sv-gprd") == (0, 50)).then_some(())
        });
        assert!(fifty.is_some(), "{:?}", admin("web-01-sv-gprd"));
    };
    for (heading, commands) in &blocks {
        // Let HAProxy apply what the previous block wrote.
        std::thread::sleep(Duration::from_millis(INTER_MS * 3));
        let before: Vec<_> = all.iter().map(|s| admin(s)).collect();
        for command in commands {
            assert!(
                !command.contains("/etc/haproxy") && !command.contains("/run/haproxy"),
                "[{heading}] {command}: a console node has no HAProxy (put it in a text block)"
            );
            let rewritten = format!("set -e\n{setup}\nset +e\n{}", addresses(command));
            let child = Command::new("bash")
                .arg("-c")
                .arg(&rewritten)
                .current_dir(console.path())
                .env_clear()
                .env("PATH", &path)
                .env("HOME", console.path())
                .env("GITLAB_HAPROXY_AGENT_DEFAULTS_FILE", &defaults)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // Every write is run with a HAProxy reload in the middle, as
            // the cookbook's drop-in makes it: check-ready, then the reload.
            if command.contains("gitlab-haproxy-agent state ") && !command.contains("--dry-run") {
                std::thread::sleep(Duration::from_millis(200));
                reload_as_systemd(&agent, &haproxy);
                reloads += 1;
            }
            let out = child.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            // The one example that shows a refused compare-and-set; the
            // zone drain that web-01's 50% row key keeps from it, which the
            // confirmation names and stops before maint.
            let expected = if command.contains("--cas 4242") {
                75
            } else if command.contains("state drain --zone us-east1-b --drain-wait 60s")
                && !command.contains("--accept-overridden")
            {
                assert!(
                    stderr.contains(
                        "1 server naming zone-us-east1-b is kept in service by another key, \
                         so this write does not move it: web/web-01-sv-gprd (decided by \
                         web/web-01-sv-gprd: weight, on "
                    ),
                    "[{heading}] {command}\n{stderr}"
                );
                68
            } else {
                0
            };
            // Writes of a group are checked and confirmed through the
            // Prometheus of the defaults file.
            if command.contains("state canary disable --drain-wait 60s")
                && !command.contains("--dry-run")
            {
                assert!(
                    stderr.contains("canary disable: maint: confirmed: 1/1 agents at index >= ")
                        && stderr.contains("; canary: 2/2 servers naming it answer maint"),
                    "[{heading}] {command}\n{stderr}"
                );
            }
            if command == "gitlab-haproxy-agent state status" {
                assert!(stdout.contains("1/1 agents at index >= "), "{stdout}");
            }
            assert_eq!(
                out.status.code(),
                Some(expected),
                "[{heading}] {command}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            );
            ran += 1;
        }
        let joined = commands.join("\n");
        // What each procedure must have done to HAProxy: the servers it
        // names reach the state, and no other server moved.
        let (targets, cond): (&[&str], fn(&ServerState) -> bool) =
            if joined.contains("state canary disable --drain-wait 60s --reason") {
                (
                    &["web-cny-01-sv-gprd", "web-cny-02-sv-gprd"],
                    ServerState::is_maint,
                )
            } else if joined.contains("state canary enable") {
                (
                    &["web-cny-01-sv-gprd", "web-cny-02-sv-gprd"],
                    ServerState::is_ready_full_weight,
                )
            } else if joined.contains("state drain --zone us-east1-b --drain-wait 60s")
                && joined.contains("--accept-overridden")
            {
                // Accepted: the drain goes on to maint without web-01.
                web_01_keeps_its_fifty();
                (
                    &["web-cny-01-sv-gprd", "web-tpl1", "web-tpl2"],
                    ServerState::is_maint,
                )
            } else if joined.contains("state drain --zone us-east1-b --drain-wait") {
                // web-01 is in the zone, but the 50% set on its row key under
                // "Invalid values" decides first: it stays as it is, as the
                // runbook says; the confirmation names it and the drain stops
                // at drain.
                web_01_keeps_its_fifty();
                (
                    &["web-cny-01-sv-gprd", "web-tpl1", "web-tpl2"],
                    ServerState::is_drain,
                )
            } else if joined.contains("state undrain --zone us-east1-b") {
                (
                    &["web-cny-01-sv-gprd", "web-tpl1", "web-tpl2"],
                    ServerState::is_ready_full_weight,
                )
            } else if joined.contains("state drain --backend web --server web-02-sv-gprd") {
                (&["web-02-sv-gprd"], ServerState::is_maint)
            } else if joined.contains("state undrain --backend web --server web-02-sv-gprd") {
                (&["web-02-sv-gprd"], ServerState::is_ready_full_weight)
            } else if joined.ends_with("consul kv put gitlab-haproxy-agent/state/canary maint") {
                (
                    &["web-cny-01-sv-gprd", "web-cny-02-sv-gprd"],
                    ServerState::is_maint,
                )
            } else if joined.contains("consul kv delete gitlab-haproxy-agent/state/canary") {
                (
                    &["web-cny-01-sv-gprd", "web-cny-02-sv-gprd"],
                    ServerState::is_ready_full_weight,
                )
            } else if joined.contains("state clear web/web-02-sv-gprd") {
                (&["web-02-sv-gprd"], ServerState::is_ready_full_weight)
            } else if joined.contains(
                "consul kv put -flags=1 gitlab-haproxy-agent/state/web/web-01-sv-gprd maint",
            ) {
                (&["web-01-sv-gprd"], ServerState::is_maint)
            } else if joined.contains("state undrain --backend web --server web-01-sv-gprd") {
                // Released by undrain only because the raw writes carried the
                // drain mark.
                (&["web-01-sv-gprd"], ServerState::is_ready_full_weight)
            } else {
                continue;
            };
        for t in targets {
            eprintln!("[{heading}] waiting for {t}");
            wait(t, cond);
        }
        // A server the procedure did not name is as it was, once HAProxy
        // has asked the agent again after the reload made in the middle.
        for (server, was) in all.iter().zip(&before) {
            if !targets.contains(server) {
                let back = support::wait_for(Duration::from_secs(10), || {
                    (admin(server) == *was).then_some(())
                });
                assert!(
                    back.is_some(),
                    "[{heading}] {server} moved: {:?}, was {was:?}",
                    admin(server)
                );
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 12, "procedures checked");
    assert!(reloads >= 15, "{reloads} reloads during writes");
    assert!(blocks.len() >= 10, "{} shell blocks", blocks.len());
    assert!(ran >= 30, "{ran} commands");
    // The procedures ran: everything is back to ready.
    for s in [
        "web-01-sv-gprd",
        "web-02-sv-gprd",
        "web-cny-01-sv-gprd",
        "web-cny-02-sv-gprd",
        "web-tpl1",
        "web-tpl2",
    ] {
        wait(s, ServerState::is_ready_full_weight);
    }
}
