//! A zonal drain from a console node: the cookbook's sample role rendered by
//! its template (one backend's servers in three zones, a server-template, a
//! canary pool), a real HAProxy and the agent on it, a real Consul; the
//! writer CLI runs from an empty directory and, when this machine has an
//! /etc/haproxy, in a mount namespace with a tmpfs over it, so no
//! haproxy.cfg is reachable. `state drain --zone b` must put exactly zone
//! b's servers, template servers included, in DRAIN then MAINT, and `state
//! undrain --zone b` bring them back through MAINT at full weight.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{free_port, Agent, Consul, Haproxy, TempDir, AGENT_BIN, PREFIX};

/// agent-inter rendered into the sample.
const INTER: &str = "200ms";
const SOCKET_SENTINEL: &str = "/nonexistent/zones/admin.sock";
const DRAIN: u32 = 0x08;
const MAINT: u32 = 0x01;

/// The servers the sample role puts in zone b.
const ZONE_B: [(&str, &str); 4] = [
    ("web", "web-01"),
    ("web", "web-tpl1"),
    ("web", "web-tpl2"),
    ("canary_web", "web-cny-01"),
];

type Key = (String, String);

/// Each server's distinct (admin state, user weight) sequence.
type Seen = HashMap<Key, Vec<(u32, u32)>>;

/// The sample role rendered by `render_sample.rb`, servers on a closed port
/// (their health does not matter here: the agent sets admin state).
fn sample_config(agent_port: u16) -> String {
    let script: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "cookbook/gitlab-haproxy-agent/test/render_sample.rb",
    ]
    .iter()
    .collect();
    let mut cmd = Command::new("ruby");
    cmd.arg(&script)
        .args(["--server-addr", "127.0.0.1:1"])
        .args(["--agent-port", &agent_port.to_string()])
        .args(["--agent-inter", INTER, "--stats-socket", SOCKET_SENTINEL]);
    for frontend in ["main", "registry_http", "pages_tcp"] {
        cmd.arg("--bind")
            .arg(format!("{frontend}=127.0.0.1:{}", free_port()));
    }
    let out = cmd.output().expect("ruby runs render_sample.rb");
    assert!(
        out.status.success(),
        "render_sample.rb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = String::from_utf8(out.stdout).unwrap();
    assert!(cfg.contains("server-template web-tpl 2 "), "{cfg}");
    cfg.replace(SOCKET_SENTINEL, "{SOCKET}")
}

/// `gitlab-haproxy-agent state ARGS` as on a console node: from an empty
/// directory, no `GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG`, and /etc/haproxy (if
/// any) hidden under a tmpfs in a mount namespace of its own (as root; else
/// the default configuration is named as a file that does not exist).
fn console_cli(consul: &Consul, cwd: &Path, args: &[&str]) -> Child {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let hidden = root && Path::new("/etc/haproxy").is_dir();
    let mut cmd = if hidden {
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs none /etc/haproxy && test ! -e /etc/haproxy/haproxy.cfg && exec \"$0\" \"$@\"",
            AGENT_BIN,
        ]);
        c
    } else {
        Command::new(AGENT_BIN)
    };
    cmd.env_clear();
    // Writes that take servers out need a reason (tests/drain_records.rs
    // tests that and the records); the environment's default gives it.
    cmd.env("GITLAB_HAPROXY_AGENT_REASON", "test");
    if !hidden {
        // Not root: a mount namespace is out of reach; name a file that
        // does not exist as the default configuration instead.
        cmd.env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            cwd.join("no-haproxy.cfg"),
        );
    }
    cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir(cwd)
        .arg("state")
        .args(args)
        .args(["--consul-addr", &consul.url()])
        // The sample checks every 200 ms: the wait floor follows.
        .args(["--agent-inter", INTER, "--agent-read-delay", "100ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start the CLI")
}

/// The raw value at `PREFIX + key`, `None` when absent.
fn raw(consul: &Consul, key: &str) -> Option<String> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}?raw"), b"");
    (status == 200).then(|| String::from_utf8_lossy(&body).into_owned())
}

/// (admin_state, uweight, iweight) of every server.
fn view(h: &Haproxy) -> HashMap<Key, (u32, u32, u32)> {
    h.servers_state()
        .into_iter()
        .map(|(k, s)| (k, (s.admin_state, s.uweight, s.iweight)))
        .collect()
}

/// Polls HAProxy every 25 ms while `child` runs and until every server of
/// zone b has `end` admin state (at most 10 s more), recording each server's
/// distinct (admin state, user weight) sequence; returns it with the CLI's
/// exit code and stdout.
fn watch(h: &Haproxy, mut child: Child, end: u32) -> (Seen, i32, Value) {
    let mut seen: Seen = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut exited: Option<Instant> = None;
    loop {
        let now = view(h);
        for (k, (admin, uw, _)) in &now {
            let v = seen.entry(k.clone()).or_default();
            if v.last() != Some(&(*admin, *uw)) {
                v.push((*admin, *uw));
            }
        }
        if exited.is_none() && child.try_wait().unwrap().is_some() {
            exited = Some(Instant::now());
        }
        let settled = ZONE_B
            .iter()
            .all(|(b, s)| now[&(b.to_string(), s.to_string())].0 == end);
        if exited.is_some_and(|t| {
            (settled && t.elapsed() >= Duration::from_millis(1000))
                || t.elapsed() >= Duration::from_secs(10)
        }) || Instant::now() > deadline
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (seen, out.status.code().unwrap_or(-1), json)
}

#[test]
fn a_zone_drain_from_a_console_node_moves_that_zone_only_template_servers_included() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let haproxy = Haproxy::start(&sample_config(agent.listen.port()));
    let console = TempDir::new("zones-console");
    let zone_b: Vec<Key> = ZONE_B
        .iter()
        .map(|(b, s)| (b.to_string(), s.to_string()))
        .collect();
    let before = view(&haproxy);
    assert!(zone_b.iter().all(|k| before.contains_key(k)), "{before:?}");
    // Three zones in `web`, and servers in no zone elsewhere.
    for k in [("web", "web-02"), ("web", "web-03"), ("api", "api-01")] {
        assert!(before.contains_key(&(k.0.to_string(), k.1.to_string())));
    }
    assert!(before.values().all(|(a, uw, iw)| *a == 0 && uw == iw));

    let child = console_cli(
        &consul,
        console.path(),
        // Several agent-inter rounds of DRAIN, so that every HAProxy check
        // (even one delayed on a loaded machine) answers it before maint.
        &["drain", "--zone", "b", "--drain-wait", "3s", "--json"],
    );
    let (seen, code, v) = watch(&haproxy, child, MAINT);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["outcome"], "done", "{v}");
    assert_eq!(v["source"], Value::Null, "no configuration was read: {v}");
    assert_eq!(v["group"], "zone-b");
    assert_eq!(raw(&consul, "zone-b").as_deref(), Some("maint"));
    for (server, states) in &seen {
        let iw = before[server].2;
        if zone_b.contains(server) {
            assert_eq!(
                states,
                &vec![(0, iw), (DRAIN, iw), (MAINT, iw)],
                "{server:?}: READY, then DRAIN, then MAINT"
            );
        } else {
            assert_eq!(states, &vec![(0, iw)], "{server:?} must not move");
        }
    }

    let child = console_cli(
        &consul,
        console.path(),
        &["undrain", "--zone", "b", "--maint-wait", "3s", "--json"],
    );
    let (seen, code, v) = watch(&haproxy, child, 0);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["outcome"], "done", "{v}");
    assert_eq!(raw(&consul, "zone-b"), None);
    for (server, states) in &seen {
        let iw = before[server].2;
        if zone_b.contains(server) {
            assert_eq!(
                states,
                &vec![(MAINT, iw), (0, iw)],
                "{server:?}: from MAINT back to READY at full weight"
            );
        } else {
            assert_eq!(states, &vec![(0, iw)], "{server:?} must not move");
        }
    }
    assert_eq!(view(&haproxy), before, "every server as it was");
}
