//! HAProxy's reload as the cookbook's systemd drop-in runs it (its
//! ExecReload= lines in order, stopping at the first that fails, with
//! `$CONFIG`, `$EXTRAOPTS` and `$MAINPID` as systemd sets them) against a
//! real HAProxy in master-worker mode, a real agent and Consul: a reload
//! while the agent is down would put every drained and maint server in
//! service, so it is refused; with the agent answering (from Consul, or
//! from its state file while Consul is away) it goes through and the agent
//! puts the states back; a fresh override file lets it through, a
//! stale one does not.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use support::{
    free_port, haproxy_bin, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy,
    ServerState, TempDir,
};

const INTER_MS: u64 = 200;
const CONVERGE: Duration = Duration::from_secs(5);
const AGENT_BIN: &str = env!("CARGO_BIN_EXE_gitlab-haproxy-agent");

/// The drop-in rendered by the cookbook for these ports, its ExecReload=
/// commands after the reset line.
fn exec_reload(agent_port: u16, http_port: u16, override_file: &Path) -> Vec<String> {
    exec_lines(agent_port, http_port, override_file, None, "ExecReload=")
}

/// The drop-in's lines starting with `key` (`ExecReload=` after its reset
/// line), rendered with `started_file` as the marker of a first start.
fn exec_lines(
    agent_port: u16,
    http_port: u16,
    override_file: &Path,
    started_file: Option<&Path>,
    key: &str,
) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cookbook/gitlab-haproxy-agent/test/render_sample.rb");
    let out = Command::new("ruby")
        .arg(script)
        .args(["--reload-guard", "--agent-port", &agent_port.to_string()])
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .args(["--agent-bin", AGENT_BIN, "--haproxy-bin", &haproxy_bin()])
        .arg("--override-file")
        .arg(override_file)
        .args(started_file.map(|f| format!("--started-file={}", f.display())))
        .output()
        .expect("ruby runs render_sample.rb");
    assert!(
        out.status.success(),
        "render_sample.rb --reload-guard: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(key)).collect();
    if key != "ExecReload=" {
        return lines.iter().map(|l| l.to_string()).collect();
    }
    assert_eq!(
        lines.first(),
        Some(&""),
        "the drop-in resets ExecReload= first:\n{text}"
    );
    lines[1..].iter().map(|l| l.to_string()).collect()
}

/// What `systemctl reload` does with the unit's ExecReload= lines: each in
/// turn, the first failure ends the reload. Ok, or the failing command's
/// output.
fn systemd_reload(commands: &[String], config: &Path, main_pid: u32) -> Result<(), String> {
    for command in commands {
        let out = Command::new("sh")
            .args(["-c", command])
            .env("CONFIG", config)
            .env("EXTRAOPTS", "")
            .env("MAINPID", main_pid.to_string())
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(format!(
                "{command}: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(())
}

fn drained(s: &ServerState) -> bool {
    s.is_drain() && !s.is_maint()
}

fn maint(s: &ServerState) -> bool {
    s.is_maint()
}

fn touch(path: &Path, age: Duration) {
    let f = std::fs::File::create(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn a_reload_that_would_undrain_is_refused_unless_overridden() {
    let consul = Consul::start();
    consul.put("web/web-01", "drain");
    consul.put("web/web-02", "maint");
    let (port, http_port) = (free_port(), free_port());
    let state = TempDir::new("reload-guard-state");
    let state_dir = state.path().to_str().unwrap();
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &["--state-dir", state_dir]);
    agent.wait_ready();
    let mut backends = String::from("backend web\n");
    for s in ["web-01", "web-02", "web-03"] {
        backends.push_str(&server_line("web", s, &[], port, INTER_MS));
    }
    let mut haproxy = Haproxy::start(&haproxy_config(&backends));
    let config: PathBuf = haproxy.socket().with_file_name("haproxy.cfg");
    let master = haproxy.proc().pid();
    haproxy.wait_server("web", "web-01", CONVERGE, drained);
    haproxy.wait_server("web", "web-02", CONVERGE, maint);

    let dir = TempDir::new("reload-guard");
    let override_file = dir.path().join("allow-haproxy-reload");
    let reload = exec_reload(port, http_port, &override_file);

    // Agent ready and answering: the reload goes through, and the agent
    // puts the states back on the new worker.
    let worker = haproxy.worker_pid();
    systemd_reload(&reload, &config, master).expect("reload with the agent ready");
    let new = wait_for(Duration::from_secs(10), || {
        haproxy.worker_pid().filter(|p| Some(*p) != worker)
    });
    assert!(new.is_some(), "the reload started a new worker");
    haproxy.wait_server("web", "web-01", CONVERGE, drained);
    haproxy.wait_server("web", "web-02", CONVERGE, maint);

    // Agent restarted while Consul is unreachable: it answers from its
    // state file, as it would have through the outage had it kept running,
    // so the reload goes through and the states come back.
    assert!(agent.terminate().is_some());
    let dead_consul = format!("http://127.0.0.1:{}", free_port());
    let mut restored = Agent::spawn_on(
        &dead_consul,
        port,
        http_port,
        &["--on-startup-timeout", "retry", "--state-dir", state_dir],
    );
    assert!(
        wait_for(CONVERGE, || restored
            .http_get("/-/answering")
            .filter(|r| r.0 == 200 && r.1.contains("state file")))
        .is_some(),
        "the agent answers from its state file:\n{}",
        restored.log()
    );
    assert_eq!(restored.http_get("/-/ready").map(|r| r.0), Some(503));
    let worker = haproxy.worker_pid();
    systemd_reload(&reload, &config, master).expect("reload with the agent on its state file");
    let new = wait_for(Duration::from_secs(10), || {
        haproxy.worker_pid().filter(|p| Some(*p) != worker)
    });
    assert!(new.is_some(), "the reload started a new worker");
    haproxy.wait_server("web", "web-01", CONVERGE, drained);
    haproxy.wait_server("web", "web-02", CONVERGE, maint);
    assert!(restored.terminate().is_some());

    // Agent up with no state at all (no state file, Consul unreachable):
    // refused.
    let mut unsynced = Agent::spawn_on(
        &dead_consul,
        port,
        http_port,
        &["--on-startup-timeout", "retry"],
    );
    assert!(
        wait_for(CONVERGE, || unsynced
            .http_get("/-/ready")
            .filter(|r| r.0 == 503))
        .is_some(),
        "the agent serves /-/ready (503) while unsynced:\n{}",
        unsynced.log()
    );
    let worker = haproxy.worker_pid();
    let refused = systemd_reload(&reload, &config, master).expect_err("refused while unsynced");
    assert!(refused.contains("check-ready"), "{refused}");
    assert!(refused.contains("not answering"), "{refused}");
    assert!(refused.contains("503"), "{refused}");
    assert!(unsynced.terminate().is_some());

    // Agent stopped: refused, the message says why and how to override, no
    // new worker, and the servers keep their states.
    let refused = systemd_reload(&reload, &config, master).expect_err("refused while stopped");
    assert!(refused.contains("refused"), "{refused}");
    assert!(refused.contains("cannot be reached"), "{refused}");
    assert!(
        refused.contains(&format!("touch {}", override_file.display())),
        "{refused}"
    );
    // An override file left behind long ago does not count.
    touch(&override_file, Duration::from_secs(2 * 3600));
    let refused = systemd_reload(&reload, &config, master).expect_err("a stale override");
    assert!(refused.contains("ignored"), "{refused}");
    std::thread::sleep(Duration::from_millis(3 * INTER_MS));
    assert_eq!(haproxy.worker_pid(), worker, "no reload happened");
    assert!(drained(&haproxy.server("web", "web-01")));
    assert!(maint(&haproxy.server("web", "web-02")));

    // A fresh override lets the reload through (with a warning): and that
    // reload does what the check is there to prevent.
    touch(&override_file, Duration::ZERO);
    systemd_reload(&reload, &config, master).expect("reload with an override");
    let new = wait_for(Duration::from_secs(10), || {
        haproxy.worker_pid().filter(|p| Some(*p) != worker)
    });
    assert!(new.is_some(), "the overridden reload started a new worker");
    std::thread::sleep(Duration::from_millis(3 * INTER_MS));
    for s in ["web-01", "web-02"] {
        assert!(
            haproxy.server("web", s).is_ready_full_weight(),
            "{s} is READY after a reload with no agent"
        );
    }
}

/// `systemctl restart haproxy` is a stop and a start: systemd has no hook
/// before the stop, so the drop-in's ExecStartPre= checks the agent on
/// every start after HAProxy's first since boot (its ExecStartPost= marks
/// it under /run), and a refused restart leaves HAProxy stopped rather than
/// serving drained servers. The first start after boot is not checked.
#[test]
fn a_restart_is_checked_as_a_reload_but_the_first_start_after_boot_is_not() {
    let consul = Consul::start();
    consul.put("web/web-01", "drain");
    let (port, http_port) = (free_port(), free_port());
    let dir = TempDir::new("restart-guard");
    let override_file = dir.path().join("allow-haproxy-reload");
    let started = dir.path().join("haproxy-started");
    let lines = |key| exec_lines(port, http_port, &override_file, Some(&started), key);
    let (pre, post) = (lines("ExecStartPre="), lines("ExecStartPost="));
    assert_eq!((pre.len(), post.len()), (1, 1), "{pre:?} {post:?}");
    let config = dir.path().join("haproxy.cfg");
    let run = |commands: &[String]| systemd_reload(commands, &config, 0);

    // Boot: no agent answering yet, HAProxy not started since boot: the
    // start goes through and marks it.
    run(&pre).expect("the first start after boot is not checked");
    run(&post).expect("ExecStartPost= marks the start");
    assert!(started.exists());

    // A restart with the agent stopped: refused, HAProxy stays stopped.
    let refused = run(&pre).expect_err("a restart with the agent stopped");
    assert!(refused.contains("cannot be reached"), "{refused}");
    assert!(
        refused.contains(&format!("touch {}", override_file.display())),
        "{refused}"
    );

    // An agent with no state (Consul unreachable, no state file): refused.
    let dead_consul = format!("http://127.0.0.1:{}", free_port());
    let mut unsynced = Agent::spawn_on(
        &dead_consul,
        port,
        http_port,
        &["--on-startup-timeout", "retry"],
    );
    assert!(wait_for(CONVERGE, || unsynced
        .http_get("/-/ready")
        .filter(|r| r.0 == 503))
    .is_some());
    let refused = run(&pre).expect_err("a restart with the agent unsynced");
    assert!(refused.contains("not answering"), "{refused}");
    assert!(unsynced.terminate().is_some());

    // The agent ready and answering: the restart goes through.
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &[]);
    agent.wait_ready();
    run(&pre).expect("a restart with the agent answering");
    assert!(agent.terminate().is_some());

    // The override lets a restart through as it does a reload.
    touch(&override_file, Duration::ZERO);
    run(&pre).expect("a restart with a fresh override");
}
