//! The writer CLI (`gitlab-haproxy-agent state ...`) against a real Consul,
//! and with a real HAProxy and the agent for the drain sequences: what it
//! writes, what it refuses, and what HAProxy ends up doing.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use gitlab_haproxy_agent::model::generation::{Generation, GENERATION_KEY, HISTORY};
use serde_json::Value;
use support::{
    free_port, haproxy_config, kill, server_line, wait_for, Agent, Consul, Haproxy, Run, TempDir,
    AGENT_BIN, PREFIX,
};

const INTER_MS: u64 = 200;
const CONVERGE: Duration = Duration::from_secs(5);

fn command(consul_url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(AGENT_BIN);
    cmd.env_clear()
        // The HAProxy configs here check every 100 ms or less and the agents
        // read at once: a 30 ms wait floor (2 x 10 ms + 10 ms) lets the
        // tests run short waits. The floor itself is tested with defaults.
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", "10ms")
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "10ms")
        // Writes that take servers out need a reason (tests/drain_records.rs
        // tests that and the records); the environment's default gives it.
        .env("GITLAB_HAPROXY_AGENT_REASON", "test")
        .arg("state")
        .args(args)
        .args(["--consul-addr", consul_url])
        // No HAProxy configuration here unless a test names one, as on a
        // console node (this machine may have /etc/haproxy/haproxy.cfg).
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `gitlab-haproxy-agent state ARGS --consul-addr URL` to completion.
fn cli(consul: &Consul, args: &[&str]) -> Run {
    cli_at(&consul.url(), args)
}

fn cli_at(url: &str, args: &[&str]) -> Run {
    let out = command(url, args).output().expect("run the CLI");
    Run::from(out)
}

fn spawn_cli(consul: &Consul, args: &[&str]) -> Child {
    command(&consul.url(), args).spawn().expect("start the CLI")
}

fn finish(child: Child) -> Run {
    let out = child.wait_with_output().unwrap();
    Run::from(out)
}

/// The raw value at `PREFIX + key`, `None` when absent.
fn kv(consul: &Consul, key: &str) -> Option<String> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    let b64 = v[0]["Value"].as_str().unwrap_or("");
    Some(
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        )
        .unwrap(),
    )
}

/// One key as Consul holds it: raw value, Flags, ModifyIndex.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    value: String,
    flags: u64,
    modify_index: u64,
}

/// The value, Flags and ModifyIndex at `PREFIX + key`, read from
/// `/v1/kv/<key>`; `None` when absent.
fn kv_entry(consul: &Consul, key: &str) -> Option<Entry> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    let value = base64::engine::general_purpose::STANDARD
        .decode(v[0]["Value"].as_str().unwrap_or(""))
        .unwrap();
    Some(Entry {
        value: String::from_utf8(value).unwrap(),
        flags: v[0]["Flags"].as_u64().expect("Flags in the answer"),
        modify_index: v[0]["ModifyIndex"].as_u64().unwrap(),
    })
}

/// Writes `value` at `PREFIX + key` with Consul Flags `flags`, as
/// `consul kv put -flags=N` does.
fn put_flags(consul: &Consul, key: &str, value: &str, flags: u64) {
    let (status, _, body) = consul.request(
        "PUT",
        &format!("/v1/kv/{PREFIX}{key}?flags={flags}"),
        value.as_bytes(),
    );
    assert_eq!(status, 200, "PUT {key}: {}", String::from_utf8_lossy(&body));
    assert_eq!(body.trim_ascii(), b"true");
}

/// Every key below the prefix with its raw value.
/// The state keys below the prefix with their values (the agents' control
/// keys such as `~store-id` left out).
fn all_keys(consul: &Consul) -> HashMap<String, String> {
    let (status, _, body) = consul.request("GET", &format!("/v1/kv/{PREFIX}?recurse=true"), b"");
    if status == 404 {
        return HashMap::new();
    }
    let v: Value = serde_json::from_slice(&body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let value = base64::engine::general_purpose::STANDARD
                .decode(p["Value"].as_str().unwrap_or(""))
                .unwrap();
            (
                p["Key"]
                    .as_str()
                    .unwrap()
                    .strip_prefix(PREFIX)
                    .unwrap()
                    .to_string(),
                String::from_utf8(value).unwrap(),
            )
        })
        .filter(|(k, _)| !k.starts_with('~'))
        .collect()
}

/// A server line with extra options (e.g. `slowstart 10s`).
fn line_with(backend: &str, server: &str, groups: &[&str], port: u16, extra: &str) -> String {
    let line = server_line(backend, server, groups, port, INTER_MS);
    format!("{} {extra}\n", line.trim_end())
}

fn config_path(haproxy: &Haproxy) -> String {
    haproxy
        .socket()
        .parent()
        .unwrap()
        .join("haproxy.cfg")
        .to_string_lossy()
        .into_owned()
}

const DRAIN: u32 = 0x08;
const MAINT: u32 = 0x01;

/// The Consul Flags `state drain` writes on row keys: the drain mark.
const MARK: u64 = 1;

#[test]
fn reads_show_parsed_state_and_flag_invalid_values() {
    let consul = Consul::start();
    consul.put("canary", "DRAIN");
    consul.put("web/web-01", "50%");
    consul.put("web/web-02", "drian");
    consul.put("a/b/c", "drain");

    let run = cli(&consul, &["list", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["invalid"], 2);
    let keys: HashMap<String, &Value> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].as_str().unwrap().to_string(), k))
        .collect();
    assert_eq!(keys["canary"]["state"], "drain");
    assert_eq!(keys["canary"]["reply"], "drain 100%");
    assert_eq!(keys["web/web-01"]["reply"], "ready 50%");
    assert_eq!(keys["web/web-02"]["valid"], false);
    assert!(keys["web/web-02"]["error"]
        .as_str()
        .unwrap()
        .contains("drian"));
    assert_eq!(
        keys["a/b/c"]["valid"], false,
        "a key no agent-send can name"
    );

    let run = cli(&consul, &["list"]);
    assert_eq!(run.code, 0);
    run.says("INVALID");
    run.says("4 keys, 2 invalid");
    assert!(
        run.row("web/web-02")
            .contains("last valid value (held), or skipped"),
        "{}",
        run.stdout
    );
    assert!(
        run.row("a/b/c")
            .contains("none (no agent-send can name this key)"),
        "{}",
        run.stdout
    );

    let run = cli(&consul, &["get", "web/web-01", "--json"]);
    assert_eq!(run.code, 0);
    assert_eq!(run.json()["state"], "50%");
    assert!(run.json()["modify_index"].as_u64().unwrap() > 0);
    let run = cli(&consul, &["get", "nothing-here"]);
    assert_eq!(run.code, 0);
    run.says("no key");
    // The options of the daemon are accepted before `state` too.
    let out = Command::new(AGENT_BIN)
        .env_clear()
        .args(["--consul-addr", &consul.url(), "state", "get", "canary"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("drain 100%"));

    // One key is one key.
    for key in ["web/web-01", "web/web-02", "a/b/c"] {
        consul.delete(key);
    }
    let run = cli(&consul, &["list"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says("\n1 key, 0 invalid. Consul index");
}

#[test]
fn writes_are_validated_compare_and_set_and_can_be_dry_runs() {
    let consul = Consul::start();
    let index = consul.prefix_index();

    // Invalid values and keys: refused, nothing written.
    for args in [
        &["set", "canary", "drian"][..],
        &["set", "canary", "up"],
        &["set", "canary", "50"],
        &["set", "canary", "drain maxconn:0"],
        &["set", "web/web-01/x", "drain"],
        &["set", "web/web 01", "drain"],
        &["set", "../x", "drain"],
        &["set", "./canary", "drain"],
        &["clear", "a/b/c"],
    ] {
        let run = cli(&consul, args);
        assert_eq!(run.code, 65, "{args:?}: {run:?}");
        assert!(run.stderr.contains("nothing written"), "{run:?}");
    }
    assert_eq!(kv(&consul, "canary"), None);
    assert_eq!(consul.prefix_index(), index, "nothing was written at all");

    // --dry-run writes nothing.
    let run = cli(&consul, &["set", "canary", "drain", "--dry-run"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says("dry run");
    assert_eq!(kv(&consul, "canary"), None);

    // A valid value is written in its canonical spelling.
    let run = cli(&consul, &["set", "canary", " DRAIN ", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["written"], true);
    assert_eq!(kv(&consul, "canary").as_deref(), Some("drain"));
    let index = cli(&consul, &["get", "canary", "--json"]).json()["modify_index"]
        .as_u64()
        .unwrap();

    // Compare-and-set: a stale --cas is refused and the value survives.
    consul.put("canary", "maint");
    let run = cli(
        &consul,
        &["set", "canary", "ready", "--cas", &index.to_string()],
    );
    assert_eq!(run.code, 75, "{run:?}");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
    let run = cli(&consul, &["set", "web/web-01", "drain", "--cas", "0"]);
    assert_eq!(run.code, 0, "--cas 0 writes an absent key: {run:?}");
    let run = cli(&consul, &["set", "web/web-01", "maint", "--cas", "0"]);
    assert_eq!(run.code, 75, "--cas 0 refuses an existing key: {run:?}");
    assert_eq!(kv(&consul, "web/web-01").as_deref(), Some("drain"));

    // Clearing a drain warns that slowstart is skipped.
    let run = cli(&consul, &["clear", "web/web-01"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("slowstart"), "{run:?}");
    assert_eq!(kv(&consul, "web/web-01"), None);
    let run = cli(&consul, &["clear", "web/web-01"]);
    assert_eq!(run.code, 0, "clearing an absent key is done: {run:?}");
}

#[test]
fn exit_codes_for_usage_and_unreachable_consul() {
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let run = cli_at(&nowhere, &["get", "canary"]);
    assert_eq!(run.code, 69, "{run:?}");
    let run = cli_at(
        &nowhere,
        &["canary", "disable", "--drain-wait", "1s", "--json"],
    );
    assert_eq!(run.code, 69, "{run:?}");
    assert_eq!(run.json()["error"]["kind"], "unavailable");
    for args in [
        &["set", "canary"][..],
        &["drain"],
        &["drain", "--server", "web-*"],
        &["drain", "--zone", "b", "--haproxy-socket", "/nonexistent"],
        &["canary", "disable", "--drain-wait", "60"],
        &["no-such-command"],
    ] {
        let run = cli_at(&nowhere, args);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
    }
    // Bad selector combinations are the writer's own checks: with --json
    // they print the error object like every other failure.
    for (args, says) in [
        (&["drain", "--json"][..], "--zone, --group or --backend"),
        (
            &["drain", "--zone", "b", "--backend", "web", "--json"],
            "not with --backend",
        ),
        (
            &["drain", "--server", "web-*", "--json"],
            "--server needs --backend",
        ),
        (
            &[
                "undrain",
                "--zone",
                "b",
                "--haproxy-socket",
                "/nonexistent",
                "--json",
            ],
            "need the HAProxy configuration too",
        ),
        // Errors clap finds too, before the writer runs.
        (&["set", "canary", "--json"], "<VALUE>"),
        (
            &["get", "canary", "--no-such-flag", "--json"],
            "--no-such-flag",
        ),
        (
            &["canary", "disable", "--drain-wait", "60", "--json"],
            "--drain-wait",
        ),
    ] {
        let run = cli_at(&nowhere, args);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        let v = run.json();
        assert_eq!(v["ok"], false, "{args:?}");
        assert_eq!(v["error"]["kind"], "usage", "{args:?}");
        assert_eq!(v["error"]["exit_code"], 64, "{args:?}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
    }
    let run = cli_at(
        &nowhere,
        &[
            "drain",
            "--zone",
            "b",
            "--haproxy-config",
            "/nonexistent/haproxy.cfg",
        ],
    );
    assert_eq!(run.code, 66, "{run:?}");
    let run = cli_at(&nowhere, &["--help"]);
    assert_eq!(run.code, 0);
    for code in ["64", "65", "69", "75", "77", "129", "130", "143"] {
        assert!(run.stdout.contains(code), "--help documents exit {code}");
    }
}

/// Debian's `haproxy` package installs a sample /etc/haproxy/haproxy.cfg
/// that lists no server. On a console node with that package, the writer
/// does not read it (runbook: Console node): a server named exactly is
/// written as named, and a whole backend asks for a configuration and says
/// why the sample is not one. The same file given by `--haproxy-config` is
/// read.
#[test]
fn a_default_configuration_that_lists_no_server_is_not_read() {
    let consul = Consul::start();
    let dir = TempDir::new("sample-cfg");
    let sample = dir.path().join("haproxy.cfg");
    std::fs::write(
        &sample,
        "global\n\tlog /dev/log local0\n\tdaemon\n\ndefaults\n\tmode http\n\
         \ttimeout connect 5000\n\ttimeout client 50000\n\ttimeout server 50000\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = command(&consul.url(), args)
            .env("GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG", &sample)
            .output()
            .expect("run the CLI");
        Run::from(out)
    };
    let group = run(&["drain", "--zone", "b", "--dry-run"]);
    assert_eq!(group.code, 0, "{group:?}");
    assert!(!group.stdout.contains("Servers read from"), "{group:?}");
    assert!(!group.stdout.contains("No server in"), "{group:?}");
    let backend = run(&["drain", "--backend", "web", "--dry-run"]);
    assert_eq!(backend.code, 64, "{backend:?}");
    assert!(backend.stderr.contains("lists no server"), "{backend:?}");
    let sample = sample.to_str().unwrap();
    let given = run(&[
        "drain",
        "--zone",
        "b",
        "--dry-run",
        "--haproxy-config",
        sample,
    ]);
    assert_eq!(given.code, 0, "{given:?}");
    assert!(given.stdout.contains("Servers read from"), "{given:?}");
}

#[test]
fn permission_denied_is_77_and_writes_nothing() {
    const MASTER: &str = "3c5d2a41-9b7e-4f0a-8e21-5a6c7d8e9f01";
    let consul = Consul::start_acl(MASTER);
    let (status, _, body) = consul.request(
        "PUT",
        "/v1/acl/policy",
        br#"{"Name":"state-read","Rules":"key_prefix \"gitlab-haproxy-agent/state/\" { policy = \"read\" }"}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, _, body) = consul.request(
        "PUT",
        "/v1/acl/token",
        br#"{"Policies":[{"Name":"state-read"}]}"#,
    );
    assert_eq!(status, 200);
    let secret = serde_json::from_slice::<Value>(&body).unwrap()["SecretID"]
        .as_str()
        .unwrap()
        .to_string();
    consul.put("canary", "ready");
    let dir = TempDir::new("writer-token");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &secret).unwrap();
    let token = token_file.to_str().unwrap();

    // Reads work with the read token.
    let run = cli(&consul, &["get", "canary", "--consul-token-file", token]);
    assert_eq!(run.code, 0, "{run:?}");
    // Writes do not: a KV PUT answers 403, a transaction 409 "Permission
    // denied"; both are 77, and nothing changes.
    let run = cli(
        &consul,
        &["set", "canary", "drain", "--consul-token-file", token],
    );
    assert_eq!(run.code, 77, "{run:?}");
    assert!(!run.stderr.contains(&secret), "token shown: {run:?}");
    let run = cli(
        &consul,
        &[
            "canary",
            "disable",
            "--drain-wait",
            "1s",
            "--consul-token-file",
            token,
            "--json",
        ],
    );
    assert_eq!(run.code, 77, "{run:?}");
    assert_eq!(run.json()["error"]["kind"], "permission_denied");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("ready"));
    // No token at all: 403 on the read.
    let run = cli(&consul, &["get", "canary"]);
    assert_eq!(run.code, 77, "{run:?}");
    // The consul CLI's own variables work as on a console node: a management
    // token in $CONSUL_HTTP_TOKEN may write; $CONSUL_HTTP_TOKEN_FILE is read
    // first and a flag wins over both.
    let with_env = |envs: &[(&str, &str)], args: &[&str]| {
        let out = command(&consul.url(), args)
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        out.status.code().unwrap_or(-1)
    };
    assert_eq!(
        with_env(
            &[("CONSUL_HTTP_TOKEN", MASTER)],
            &["set", "canary", "maint"]
        ),
        0
    );
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
    assert_eq!(
        with_env(
            &[
                ("CONSUL_HTTP_TOKEN", MASTER),
                ("CONSUL_HTTP_TOKEN_FILE", token)
            ],
            &["set", "canary", "drain"]
        ),
        77
    );
    let master_file = dir.path().join("master");
    std::fs::write(&master_file, MASTER).unwrap();
    assert_eq!(
        with_env(
            &[("CONSUL_HTTP_TOKEN_FILE", master_file.to_str().unwrap())],
            &["set", "canary", "ready", "--consul-token-file", token]
        ),
        77
    );
    assert_eq!(
        with_env(
            &[("CONSUL_HTTP_TOKEN_FILE", master_file.to_str().unwrap())],
            &["set", "canary", "ready"]
        ),
        0
    );
    // A token file that cannot be read.
    let run = cli(
        &consul,
        &["get", "canary", "--consul-token-file", "/nonexistent/token"],
    );
    assert_eq!(run.code, 77, "{run:?}");
}

#[test]
fn explain_agrees_with_the_running_agent() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    consul.put("canary", "drain");
    consul.put("web/web-cny-02", "25%");
    consul.put("web/web-03", "drian");
    consul.put("zone-b", "maint");
    for line in [
        "web/web-cny-01 canary zone-b",
        "web/web-cny-02 canary",
        "web/web-01 zone-b",
        "web/web-02 zone-c",
        "web/web-03 canary",
    ] {
        let ids: Vec<&str> = line.split(' ').collect();
        let run = cli(&consul, &[&["explain", "--json"][..], &ids].concat());
        assert_eq!(run.code, 0, "{run:?}");
        let v = run.json();
        let want = match v["reply"].as_str() {
            Some(r) => format!("{r}\n"),
            None => String::new(),
        };
        let got = wait_for(CONVERGE, || {
            let a = agent.ask(line);
            (a == want).then_some(a)
        });
        assert!(
            got.is_some(),
            "{line}: explain says {want:?}, agent {:?}",
            agent.ask(line)
        );
    }
    let run = cli(&consul, &["explain", "web/web-cny-01", "canary", "zone-b"]);
    run.says("decided by key canary = drain");
    let run = cli(&consul, &["explain", "web/web-03", "canary"]);
    run.says("key web/web-03 holds an invalid value");
    run.says("decided by key canary = drain");
    let run = cli(&consul, &["explain", "web/web-01/x"]);
    assert_eq!(run.code, 65, "{run:?}");

    // One row key alone, with no value and no configuration: its groups
    // decide and are not known here, so no answer is stated.
    let run = cli(&consul, &["explain", "web/web-cny-01", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["answer"], "unknown", "{v}");
    assert_eq!(v["reply"], Value::Null, "{v}");
    let text = cli(&consul, &["explain", "web/web-cny-01"]);
    text.says("answer: unknown");
    text.says("Group keys set: canary = drain, zone-b = maint");
    text.says("--haproxy-config");
    // A row key with a value decides: that is known.
    let v = cli(&consul, &["explain", "web/web-cny-02", "--json"]).json();
    assert_eq!(v["reply"], "ready 25%", "{v}");
    // With the configuration, the server's own line is read from it.
    let dir = TempDir::new("writer-explain");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        "backend web\n    server web-cny-01 127.0.0.1:1 agent-check agent-send \"web/web-cny-01 zone-b canary\\n\"\n    server-template web-tpl 2 127.0.0.1:1 agent-check agent-send \"zone-b\\n\"\n",
    )
    .unwrap();
    let v = cli(
        &consul,
        &[
            "explain",
            "web/web-cny-01",
            "--haproxy-config",
            cfg.to_str().unwrap(),
            "--json",
        ],
    )
    .json();
    assert_eq!(v["line"], "web/web-cny-01 zone-b canary", "{v}");
    assert_eq!(
        (v["reply"].as_str(), v["decided_by"].as_str()),
        (Some("maint 100%"), Some("zone-b"))
    );
    // The default configuration (this load balancer's) found it too; a
    // server it does not list is another's: answered as with none.
    let with_default = |args: &[&str]| -> Value {
        let out = command(&consul.url(), args)
            .env("GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG", &cfg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = with_default(&["explain", "web/web-cny-01", "--json"]);
    assert_eq!(v["reply"], "maint 100%", "{v}");
    let v = with_default(&["explain", "web/web-elsewhere", "--json"]);
    assert_eq!(v["answer"], "unknown", "{v}");
    // A server-template server has no row key: found by its name.
    let v = cli(
        &consul,
        &[
            "explain",
            "web/web-tpl2",
            "--haproxy-config",
            cfg.to_str().unwrap(),
            "--json",
        ],
    )
    .json();
    assert_eq!(v["line"], "zone-b", "{v}");
    assert_eq!(v["reply"], "maint 100%", "{v}");
    let got = wait_for(CONVERGE, || {
        let a = agent.ask("web/web-cny-01 zone-b canary");
        (a == "maint 100%\n").then_some(a)
    });
    assert!(got.is_some());
}

/// Polls HAProxy every 25 ms while `child` runs and afterwards until every
/// server in `end` is in maint (at most 10 s more), recording each server's
/// distinct (admin state, user weight) sequence. Drain and maint at once is
/// not recorded: HAProxy 2.6 showed both flags for an instant, on its way
/// from drain to maint, when an agent's `maint` followed its `drain` (one
/// 25 ms poll landed there once in a full test run); the sequence is what
/// settles.
fn watch(
    haproxy: &Haproxy,
    child: &mut Child,
    end: &[(String, String)],
) -> HashMap<(String, String), Vec<(u32, u32)>> {
    let mut seen: HashMap<(String, String), Vec<(u32, u32)>> = HashMap::new();
    let mut exited_at: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let states = haproxy.servers_state();
        for (id, s) in &states {
            let v = seen.entry(id.clone()).or_default();
            let now = (s.admin_state, s.uweight);
            if now.0 != DRAIN | MAINT && v.last() != Some(&now) {
                v.push(now);
            }
        }
        if exited_at.is_none() && child.try_wait().unwrap().is_some() {
            exited_at = Some(Instant::now());
        }
        let settled = end.iter().all(|id| states[id].admin_state == MAINT);
        // A little more after settling, to see that nothing else moves.
        if exited_at.is_some_and(|t| {
            (settled && t.elapsed() >= Duration::from_millis(1000))
                || t.elapsed() >= Duration::from_secs(10)
        }) || Instant::now() > deadline
        {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn id(backend: &str, server: &str) -> (String, String) {
    (backend.to_string(), server.to_string())
}

#[test]
fn canary_disable_drains_then_maints_only_the_canaries_and_enable_ramps_them() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n    balance roundrobin\n");
    backends.push_str(&line_with(
        "web",
        "web-01",
        &["zone-b"],
        port,
        "slowstart 10s",
    ));
    backends.push_str(&line_with("web", "web-02", &[], port, "slowstart 10s"));
    backends.push_str(&line_with(
        "web",
        "web-cny-01",
        &["canary"],
        port,
        "slowstart 10s",
    ));
    backends.push_str(&line_with(
        "web",
        "web-cny-02",
        &["canary", "zone-b"],
        port,
        "slowstart 10s",
    ));
    backends.push_str("\nbackend api\n");
    backends.push_str(&line_with(
        "api",
        "api-cny-01",
        &["canary"],
        port,
        "slowstart 10s",
    ));
    backends.push_str(&line_with("api", "api-01", &[], port, ""));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let canaries = [
        id("web", "web-cny-01"),
        id("web", "web-cny-02"),
        id("api", "api-cny-01"),
    ];
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    let mut child = spawn_cli(&consul, &["canary", "disable", "--drain-wait", "2s"]);
    let seen = watch(&haproxy, &mut child, &canaries);
    let run = finish(child);
    assert_eq!(run.code, 0, "{run:?}");
    run.says("canary disable: done");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
    // The canary key has no set-by-hand rule: SET-BY shows `-`.
    let list = cli(&consul, &["list"]);
    assert!(list.row("canary").ends_with(" -"), "{list:?}");
    let v = cli(&consul, &["get", "canary", "--json"]).json();
    assert_eq!(v["set_by"], "-", "{v}");
    assert_eq!(v["by_drain"], false, "{v}");
    for (server, states) in &seen {
        if canaries.contains(server) {
            assert_eq!(
                states,
                &vec![(0, 100), (DRAIN, 100), (MAINT, 100)],
                "{server:?}: ready, then DRAIN, then MAINT"
            );
        } else {
            assert_eq!(states, &vec![(0, 100)], "{server:?} must not change");
        }
    }

    // Enable: out of MAINT through slowstart. `show servers state` keeps the
    // user weight at 100; the effective weight in `show stat` ramps.
    let run = cli(&consul, &["canary", "enable"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv(&consul, "canary"), None);
    let mut weights: HashMap<(String, String), Vec<u32>> = HashMap::new();
    let ramped = wait_for(Duration::from_secs(20), || {
        let stat = haproxy.stat();
        for c in &canaries {
            let row = &stat[c];
            if row["status"].starts_with("MAINT") {
                continue;
            }
            let w: u32 = row["weight"].parse().unwrap();
            let v = weights.entry(c.clone()).or_default();
            if v.last() != Some(&w) {
                v.push(w);
            }
        }
        canaries
            .iter()
            .all(|c| weights.get(c).and_then(|v| v.last()) == Some(&100))
            .then_some(())
    });
    assert!(ramped.is_some(), "canaries back to weight 100: {weights:?}");
    for c in &canaries {
        let v = &weights[c];
        assert!(
            v.iter().any(|w| *w > 0 && *w < 100) && v.windows(2).all(|p| p[0] <= p[1]),
            "{c:?} ramps up through slowstart rather than jumping to 100: {v:?}"
        );
        let s = haproxy.server(&c.0, &c.1);
        assert!(s.is_ready_full_weight(), "{s:?}");
    }
    for (b, s) in [("web", "web-01"), ("web", "web-02"), ("api", "api-01")] {
        assert!(haproxy.server(b, s).is_ready_full_weight());
    }
}

#[test]
fn zonal_drain_writes_one_group_key_and_a_configuration_previews_its_servers() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-a-01", &["zone-a"], port, INTER_MS));
    backends.push_str(&server_line("web", "web-b-01", &["zone-b"], port, INTER_MS));
    backends.push_str(&server_line("web", "web-b-02", &["zone-b"], port, INTER_MS));
    backends.push_str(
        "    server web-b-03 127.0.0.1:1 weight 100 agent-send \"web/web-b-03 zone-b\\n\"\n",
    );
    backends.push_str("    server web-x-04 127.0.0.1:1 weight 100\n");
    let agent_opts =
        format!("agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter {INTER_MS}ms");
    // The agent never answers these two lines.
    backends.push_str(&format!(
        "    server web-b-04 127.0.0.1:1 weight 100 {agent_opts} agent-send \"web/web-b-04 zone-b\"\n"
    ));
    backends.push_str(&format!(
        "    server web-b-06 127.0.0.1:1 weight 100 {agent_opts} agent-send \"web/web-b-06 zone-b {}\\n\"\n",
        ["g"; 16].join(" ")
    ));
    // Answered from a group first, and a template: both through zone-b.
    backends.push_str(&format!(
        "    server web-b-05 127.0.0.1:1 weight 100 {agent_opts} agent-send \"canary web/web-b-05 zone-b\\n\"\n"
    ));
    backends.push_str(&format!(
        "    server-template web-t 2 127.0.0.1:1 weight 100 {agent_opts} agent-send \"zone-b\\n\"\n"
    ));
    backends.push_str("\nbackend api\n");
    backends.push_str(&server_line(
        "api",
        "api-a-01",
        &["canary", "zone-a"],
        port,
        INTER_MS,
    ));
    backends.push_str(&server_line(
        "api",
        "api-b-01",
        &["canary", "zone-b"],
        port,
        INTER_MS,
    ));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let cfg = config_path(&haproxy);
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }
    let zone_b = [
        id("web", "web-b-01"),
        id("web", "web-b-02"),
        id("web", "web-b-05"),
        id("web", "web-t1"),
        id("web", "web-t2"),
        id("api", "api-b-01"),
    ];

    // Dry run first: the plan, nothing written.
    let run = cli(
        &consul,
        &[
            "drain",
            "--zone",
            "b",
            "--haproxy-config",
            &cfg,
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["outcome"], "dry_run");
    assert!(all_keys(&consul).is_empty());

    let mut child = spawn_cli(
        &consul,
        &[
            "drain",
            "--zone",
            "b",
            "--haproxy-config",
            &cfg,
            "--drain-wait",
            "1s",
            "--json",
        ],
    );
    let seen = watch(&haproxy, &mut child, &zone_b);
    let run = finish(child);
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["outcome"], "done");
    assert_eq!(v["group"], "zone-b");
    let servers: Vec<&str> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server"].as_str().unwrap())
        .collect();
    assert_eq!(
        servers,
        vec![
            "web/web-b-01",
            "web/web-b-02",
            "web/web-b-05",
            "web/web-t1",
            "web/web-t2",
            "api/api-b-01"
        ]
    );
    for s in v["servers"].as_array().unwrap() {
        assert_eq!(s["agent_answer"], "maint 100%", "{s}");
        assert_eq!(s["decided_by"], "zone-b", "{s}");
    }
    let not_written: HashMap<&str, &str> = v["not_written"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["server"].as_str().unwrap(), s["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(not_written.len(), 3, "{not_written:?}");
    assert_eq!(not_written["web/web-b-03"], "no agent-check");
    assert_eq!(
        not_written["web/web-b-04"],
        "agent-send does not end with \\n: the agent never answers it"
    );
    assert!(
        not_written["web/web-b-06"].contains("more than 16 identities"),
        "{not_written:?}"
    );
    assert_eq!(
        all_keys(&consul),
        HashMap::from([("zone-b".to_string(), "maint".to_string())]),
        "one group key"
    );
    let e = kv_entry(&consul, "zone-b").unwrap();
    assert_eq!(e.flags, 0, "a group key has no drain mark");
    for (server, states) in &seen {
        if zone_b.contains(server) {
            assert_eq!(
                states,
                &vec![(0, 100), (DRAIN, 100), (MAINT, 100)],
                "{server:?}"
            );
        } else {
            assert_eq!(states, &vec![(0, 100)], "{server:?} is untouched");
        }
    }

    // Undrain with no configuration: the group key goes, every server back.
    let run = cli(&consul, &["undrain", "--zone", "b", "--maint-wait", "30ms"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says("undrain: done");
    assert!(all_keys(&consul).is_empty());
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    // With the configuration, the stats socket is where HAProxy is checked:
    // every server of the zone, template servers included, in DRAIN before
    // maint is written, and in MAINT after.
    let socket = haproxy.socket().to_string_lossy().into_owned();
    let run = cli(
        &consul,
        &[
            "drain",
            "--zone",
            "b",
            "--haproxy-config",
            &cfg,
            "--haproxy-socket",
            &socket,
            "--drain-wait",
            "300ms",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.warns("shows 6 servers in DRAIN");
    run.warns("shows 6 servers in MAINT");
    assert_eq!(run.json()["row_keys_assumed"], false);
    // Without it, the socket cannot say who is in the zone.
    let run = cli(
        &consul,
        &["undrain", "--zone", "b", "--haproxy-socket", &socket],
    );
    assert_eq!(run.code, 64, "{run:?}");
    run.warns("need the HAProxy configuration too");
    let run = cli(&consul, &["undrain", "--zone", "b", "--maint-wait", "30ms"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(all_keys(&consul).is_empty());
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    // By backend and server glob, servers read from the stats socket.
    let run = cli(
        &consul,
        &socket_args(
            "drain",
            "web",
            &socket,
            &["--server", "web-[ab]-0[12]", "--drain-wait", "30ms"],
        ),
    );
    assert_eq!(run.code, 0, "{run:?}");
    let keys = all_keys(&consul);
    let mut names: Vec<&String> = keys.keys().collect();
    names.sort();
    assert_eq!(names, vec!["web/web-a-01", "web/web-b-01", "web/web-b-02"]);
    haproxy.wait_server("web", "web-a-01", CONVERGE, |s| s.is_maint());
    assert!(haproxy.server("api", "api-a-01").is_ready_full_weight());

    // A glob or a whole backend with nothing to expand it: 64, named.
    for args in [
        &["drain", "--backend", "web"][..],
        &["undrain", "--backend", "web", "--server", "web-*"][..],
    ] {
        let run = cli(&consul, args);
        assert_eq!(run.code, 64, "{run:?}");
        run.warns("give --haproxy-config PATH");
    }
    // A configuration named but missing: 66.
    let run = cli(
        &consul,
        &[
            "drain",
            "--zone",
            "b",
            "--haproxy-config",
            "/nonexistent/x.cfg",
        ],
    );
    assert_eq!(run.code, 66, "{run:?}");
    // A zone no server of this configuration names: written for the fleet,
    // and said.
    let run = cli(
        &consul,
        &[
            "drain",
            "--zone",
            "nowhere",
            "--haproxy-config",
            &cfg,
            "--dry-run",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.says("No server in");
    assert_eq!(all_keys(&consul).len(), 3);
}

#[test]
fn a_drain_from_the_stats_socket_stops_before_maint_when_haproxy_does_not_drain_a_server() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-01", &[], port, INTER_MS));
    // Its agent-send names another row key than `<backend>/<server>`.
    backends.push_str(&server_line("legacy", "web-02", &[], port, INTER_MS));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }
    let socket = haproxy.socket().to_string_lossy().into_owned();

    let run = cli(
        &consul,
        &socket_args("drain", "web", &socket, &["--drain-wait", "30ms", "--json"]),
    );
    assert_eq!(run.code, 65, "{run:?}");
    run.warns("row keys are assumed to be <backend>/<server>");
    run.warns("not drained by the agent");
    let v = run.json();
    assert_eq!(v["outcome"], "not_drained", "{v}");
    assert_eq!(v["row_keys_assumed"], true);
    assert_eq!(v["not_drained"], serde_json::json!(["web/web-02"]));
    assert_eq!(v["error"]["exit_code"], 65);
    let statuses: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["done", "done", "not_run"], "{v}");
    // Drain written to both, maint to neither.
    for key in ["web/web-01", "web/web-02"] {
        let e = kv_entry(&consul, key).unwrap();
        assert_eq!((e.value.as_str(), e.flags), ("drain", MARK), "{key}");
    }
    assert!(haproxy.server("web", "web-01").is_drain());
    assert!(haproxy.server("web", "web-02").is_ready_full_weight());

    // Undrain takes the drain back.
    let run = cli(&consul, &socket_args("undrain", "web", &socket, &[]));
    assert_eq!(run.code, 0, "{run:?}");
    run.says("Row keys are assumed to be <backend>/<server>");
    assert!(all_keys(&consul).is_empty());
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.is_ready_full_weight());

    // Every server drained: the drain goes on to maint.
    let run = cli(
        &consul,
        &socket_args(
            "drain",
            "web",
            &socket,
            &["--server", "web-01", "--drain-wait", "30ms", "--json"],
        ),
    );
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["outcome"], "done");
    assert_eq!(v["row_keys_assumed"], true);
    assert_eq!(v["not_drained"], serde_json::json!([]));
    assert_eq!(kv(&consul, "web/web-01").as_deref(), Some("maint"));
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.is_maint());
}

#[test]
fn a_drain_from_the_stats_socket_fails_when_haproxy_does_not_put_a_server_in_maint() {
    // web-01 is decided by `canary` first: at drain, it shows DRAIN before
    // its row key is written, and stays in DRAIN once maint is.
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&format!(
        "    server web-01 127.0.0.1:1 weight 100 agent-check agent-addr 127.0.0.1 agent-port {port} agent-inter {INTER_MS}ms agent-send \"canary web/web-01\\n\"\n"
    ));
    backends.push_str(&server_line("web", "web-02", &[], port, INTER_MS));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }
    consul.put("canary", "drain");
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.is_drain());
    let socket = haproxy.socket().to_string_lossy().into_owned();

    let run = cli(
        &consul,
        &socket_args("drain", "web", &socket, &["--drain-wait", "30ms", "--json"]),
    );
    assert_eq!(run.code, 65, "{run:?}");
    run.warns("not in maint");
    let v = run.json();
    assert_eq!(v["outcome"], "not_in_maint", "{v}");
    assert_eq!(v["not_in_maint"], serde_json::json!(["web/web-01"]));
    assert_eq!(v["not_drained"], serde_json::json!([]));
    assert_eq!(v["error"]["exit_code"], 65);
    let statuses: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["done", "done", "done"], "{v}");
    for key in ["web/web-01", "web/web-02"] {
        assert_eq!(kv(&consul, key).as_deref(), Some("maint"), "{key}");
    }
    assert!(haproxy.server("web", "web-01").is_drain());
    assert!(haproxy.server("web", "web-02").is_maint());
}

#[test]
fn a_backend_undrain_leaves_the_servers_a_zone_drain_holds_in_maint() {
    // Overlapping drains write different keys: the zone its group key, the
    // backend its row keys. Undoing one leaves the other's servers out.
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-a-01", &["zone-a"], port, INTER_MS));
    backends.push_str(&server_line("web", "web-b-01", &["zone-b"], port, INTER_MS));
    backends.push_str("\nbackend api\n");
    backends.push_str(&server_line("api", "api-b-01", &["zone-b"], port, INTER_MS));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let cfg = config_path(&haproxy);
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    let run = cli(&consul, &["drain", "--zone", "b", "--drain-wait", "30ms"]);
    assert_eq!(run.code, 0, "{run:?}");
    let run = cli(
        &consul,
        &backend_args("drain", "web", &cfg, &["--drain-wait", "30ms"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv(&consul, "web/web-b-01").as_deref(), Some("maint"));
    assert_eq!(kv(&consul, "zone-b").as_deref(), Some("maint"));
    haproxy.wait_server("web", "web-a-01", CONVERGE, |s| s.is_maint());

    // The backend undrain clears its row keys; web-b-01 falls back to
    // zone-b and stays in MAINT.
    let run = cli(
        &consul,
        &backend_args("undrain", "web", &cfg, &["--maint-wait", "30ms", "--json"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    let answers: HashMap<&str, (&str, &str)> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["server"].as_str().unwrap(),
                (
                    s["agent_answer"].as_str().unwrap(),
                    s["decided_by"].as_str().unwrap_or("-"),
                ),
            )
        })
        .collect();
    assert_eq!(answers["web/web-b-01"], ("maint 100%", "zone-b"), "{v}");
    assert_eq!(answers["web/web-a-01"], ("ready 100%", "-"), "{v}");
    assert_eq!(
        all_keys(&consul),
        HashMap::from([("zone-b".to_string(), "maint".to_string())])
    );
    haproxy.wait_server("web", "web-a-01", CONVERGE, |s| s.is_ready_full_weight());
    std::thread::sleep(Duration::from_millis(5 * INTER_MS));
    assert_eq!(haproxy.server("web", "web-b-01").admin_state, MAINT);
    assert_eq!(haproxy.server("api", "api-b-01").admin_state, MAINT);

    // The zone undrain brings them back.
    let run = cli(&consul, &["undrain", "--zone", "b", "--maint-wait", "30ms"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(all_keys(&consul).is_empty());
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    // One server by exact name needs no configuration: its row key.
    let run = cli(
        &consul,
        &[
            "drain",
            "--backend",
            "web",
            "--server",
            "web-b-01",
            "--drain-wait",
            "30ms",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.says("Row key written as named");
    // A configuration that does not list the server (another load
    // balancer's) does not stop it either.
    let run = cli(
        &consul,
        &backend_args(
            "drain",
            "web",
            &cfg,
            &["--server", "web-z-09", "--dry-run", "--json"],
        ),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["keys"][0]["key"], "web/web-z-09");
    // Several names at once, no configuration.
    let run = cli(
        &consul,
        &[
            "drain",
            "--backend",
            "web",
            "--server",
            "web-a-01",
            "--server",
            "web-b-01",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    let keys: Vec<&str> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["web/web-a-01", "web/web-b-01"]);
    let e = kv_entry(&consul, "web/web-b-01").unwrap();
    assert_eq!((e.value.as_str(), e.flags), ("maint", MARK));
    haproxy.wait_server("web", "web-b-01", CONVERGE, |s| s.is_maint());
    let run = cli(
        &consul,
        &["undrain", "--backend", "web", "--server", "web-b-01"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(all_keys(&consul).is_empty());
    haproxy.wait_server("web", "web-b-01", CONVERGE, |s| s.is_ready_full_weight());
}

/// `VERB --backend BACKEND --haproxy-config CFG EXTRA...`.
fn backend_args<'a>(
    verb: &'a str,
    backend: &'a str,
    cfg: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    [
        &[verb, "--backend", backend, "--haproxy-config", cfg][..],
        extra,
    ]
    .concat()
}

/// `VERB --backend BACKEND --haproxy-socket SOCKET EXTRA...`.
fn socket_args<'a>(
    verb: &'a str,
    backend: &'a str,
    socket: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    [
        &[verb, "--backend", backend, "--haproxy-socket", socket][..],
        extra,
    ]
    .concat()
}

/// The `set_by_hand` servers of a JSON report.
fn set_by_hand(v: &Value) -> Vec<&str> {
    v["set_by_hand"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["server"].as_str().unwrap())
        .collect()
}

/// A server put in maint by hand whose key then got a typo (`mantenance`,
/// Flags 0): the agents hold maint. A drain and an undrain of its backend
/// must leave the key alone, so the server stays out; taking the key over
/// handed it to the undrain, which cleared it and put the server back.
#[test]
fn drain_and_undrain_leave_a_typo_set_by_hand_alone() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    for s in ["web-01", "web-02"] {
        backends.push_str(&server_line("web", s, &[], port, INTER_MS));
    }
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let cfg = config_path(&haproxy);
    consul.put("web/web-02", "maint");
    haproxy.wait_server("web", "web-02", CONVERGE, |s| s.admin_state == MAINT);
    consul.put("web/web-02", "mantenance");
    let typo = kv_entry(&consul, "web/web-02").unwrap();

    let run = cli(
        &consul,
        &backend_args("drain", "web", &cfg, &["--drain-wait", "1s", "--json"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(set_by_hand(&run.json()), vec!["web/web-02"], "{run:?}");
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.admin_state == MAINT);
    let run = cli(
        &consul,
        &backend_args("undrain", "web", &cfg, &["--maint-wait", "1s"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.is_ready_full_weight());
    assert_eq!(kv_entry(&consul, "web/web-02").unwrap(), typo, "untouched");
    std::thread::sleep(Duration::from_millis(3 * INTER_MS));
    let state = &haproxy.servers_state()[&("web".to_string(), "web-02".to_string())];
    assert_eq!(state.admin_state, MAINT, "web-02 went back in service");
}

#[test]
fn drain_and_undrain_leave_keys_set_by_hand_alone() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    for s in ["web-01", "web-02", "web-03", "web-04", "web-05"] {
        backends.push_str(&server_line("web", s, &["zone-b"], port, INTER_MS));
    }
    backends.push_str("\nbackend api\n");
    backends.push_str(&server_line("api", "api-01", &["zone-b"], port, INTER_MS));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    let cfg = config_path(&haproxy);
    for (b, s) in haproxy.servers_state().keys() {
        haproxy.wait_server(b, s, CONVERGE, |s| s.is_ready_full_weight());
    }

    // By hand: web-03 to maint for a disk swap (`state set`), web-04 to
    // drain with a plain KV PUT (as `consul kv put` writes it: Flags 0),
    // web-05 out of rotation at weight 0 (UP, no traffic).
    let run = cli(&consul, &["set", "web/web-03", "maint"]);
    assert_eq!(run.code, 0, "{run:?}");
    consul.put("web/web-04", "drain");
    consul.put("web/web-05", "0%");
    haproxy.wait_server("web", "web-03", CONVERGE, |s| s.admin_state == MAINT);
    haproxy.wait_server("web", "web-04", CONVERGE, |s| s.admin_state == DRAIN);
    haproxy.wait_server("web", "web-05", CONVERGE, |s| {
        s.admin_state == 0 && s.uweight == 0
    });
    let web03 = kv_entry(&consul, "web/web-03").unwrap();
    let web04 = kv_entry(&consul, "web/web-04").unwrap();
    let web05 = kv_entry(&consul, "web/web-05").unwrap();
    assert_eq!((web03.value.as_str(), web03.flags), ("maint", 0));
    assert_eq!((web04.value.as_str(), web04.flags), ("drain", 0));
    assert_eq!((web05.value.as_str(), web05.flags), ("0%", 0));

    // The dry run already names them.
    let run = cli(&consul, &backend_args("drain", "web", &cfg, &["--dry-run"]));
    assert_eq!(run.code, 0, "{run:?}");
    run.says("3 servers left alone");

    // Drain the backend: web-01 and web-02 go DRAIN then MAINT; the two set
    // by hand are not written and HAProxy keeps them as they are.
    let mut child = spawn_cli(
        &consul,
        &backend_args("drain", "web", &cfg, &["--drain-wait", "1s", "--json"]),
    );
    let seen = watch(
        &haproxy,
        &mut child,
        &[id("web", "web-01"), id("web", "web-02")],
    );
    let run = finish(child);
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["outcome"], "done");
    assert_eq!(
        set_by_hand(&v),
        vec!["web/web-03", "web/web-04", "web/web-05"]
    );
    for k in v["keys"].as_array().unwrap() {
        let hand = ["web/web-03", "web/web-04", "web/web-05"].contains(&k["key"].as_str().unwrap());
        assert_eq!(k["set_by_hand"], hand, "{k}");
        assert_eq!(k["flags"], 0, "{k}");
        assert_eq!(k["by_drain"], false, "{k}");
    }
    for step in v["steps"].as_array().unwrap() {
        if step.get("write").is_some() {
            assert_eq!(step["flags"], MARK, "{step}");
            assert_eq!(
                step["keys"],
                serde_json::json!(["web/web-01", "web/web-02"])
            );
        }
    }
    assert_eq!(
        seen[&id("web", "web-01")],
        vec![(0, 100), (DRAIN, 100), (MAINT, 100)]
    );
    assert_eq!(
        seen[&id("web", "web-02")],
        vec![(0, 100), (DRAIN, 100), (MAINT, 100)]
    );
    assert_eq!(seen[&id("web", "web-03")], vec![(MAINT, 100)]);
    assert_eq!(seen[&id("web", "web-04")], vec![(DRAIN, 100)]);
    assert_eq!(seen[&id("web", "web-05")], vec![(0, 0)], "UP at weight 0");
    assert_eq!(seen[&id("api", "api-01")], vec![(0, 100)]);
    for key in ["web/web-01", "web/web-02"] {
        let e = kv_entry(&consul, key).unwrap();
        assert_eq!((e.value.as_str(), e.flags), ("maint", MARK), "{key}");
    }
    assert_eq!(kv_entry(&consul, "web/web-03").unwrap(), web03, "untouched");
    assert_eq!(kv_entry(&consul, "web/web-04").unwrap(), web04, "untouched");
    assert_eq!(kv_entry(&consul, "web/web-05").unwrap(), web05, "untouched");

    // The mark shows in reads.
    let v = cli(&consul, &["list", "--json"]).json();
    let by_drain: HashMap<&str, (u64, bool)> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap(),
                (
                    k["flags"].as_u64().unwrap(),
                    k["by_drain"].as_bool().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(by_drain["web/web-01"], (MARK, true));
    assert_eq!(by_drain["web/web-03"], (0, false));
    let v = cli(&consul, &["get", "web/web-04", "--json"]).json();
    assert_eq!(
        (v["flags"].as_u64(), v["by_drain"].as_bool()),
        (Some(0), Some(false))
    );
    let run = cli(&consul, &["list"]);
    assert!(
        run.stdout.starts_with("KEY ") && run.stdout.lines().next().unwrap().ends_with("SET-BY")
    );
    assert!(run.row("web/web-01").ends_with(" drain"), "{}", run.stdout);
    assert!(run.row("web/web-03").ends_with(" hand"), "{}", run.stdout);

    // Drain again: nothing to do, the two still named.
    let run = cli(
        &consul,
        &backend_args("drain", "web", &cfg, &["--drain-wait", "30ms"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.says("drain: nothing to do; 3 servers set by hand left alone");

    // Undrain the backend: web-01 and web-02 back in service; web-03 stays
    // in MAINT, web-04 in DRAIN and web-05 at weight 0, their keys untouched.
    let run = cli(&consul, &backend_args("undrain", "web", &cfg, &[]));
    assert_eq!(run.code, 0, "{run:?}");
    run.says("undrain: done; 3 servers set by hand left alone");
    run.says("3 servers left alone");
    run.says("state clear KEY");
    for s in ["web/web-03", "web/web-04", "web/web-05"] {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{s} ")) && l.contains("set by hand"))
            .unwrap_or_else(|| panic!("no note for {s}: {}", run.stdout));
        assert!(line.contains("left alone"), "{line}");
    }
    assert_eq!(kv_entry(&consul, "web/web-01"), None);
    assert_eq!(kv_entry(&consul, "web/web-02"), None);
    assert_eq!(kv_entry(&consul, "web/web-03").unwrap(), web03, "untouched");
    assert_eq!(kv_entry(&consul, "web/web-04").unwrap(), web04, "untouched");
    assert_eq!(kv_entry(&consul, "web/web-05").unwrap(), web05, "untouched");
    haproxy.wait_server("web", "web-01", CONVERGE, |s| s.is_ready_full_weight());
    haproxy.wait_server("web", "web-02", CONVERGE, |s| s.is_ready_full_weight());
    // Several agent-check intervals later, still out.
    std::thread::sleep(Duration::from_millis(5 * INTER_MS));
    assert_eq!(haproxy.server("web", "web-03").admin_state, MAINT);
    assert_eq!(haproxy.server("web", "web-04").admin_state, DRAIN);
    let s = haproxy.server("web", "web-05");
    assert_eq!((s.admin_state, s.uweight), (0, 0), "{s:?}");

    // Break glass: a key put with -flags=1 is one `state undrain` releases.
    put_flags(&consul, "web/web-03", "maint", 1);
    let run = cli(&consul, &backend_args("undrain", "web", &cfg, &["--json"]));
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(set_by_hand(&run.json()), vec!["web/web-04", "web/web-05"]);
    assert_eq!(kv_entry(&consul, "web/web-03"), None);
    haproxy.wait_server("web", "web-03", CONVERGE, |s| s.is_ready_full_weight());
    assert_eq!(kv_entry(&consul, "web/web-04").unwrap(), web04, "untouched");

    // `state set` takes over a key `state drain` wrote, even to the same
    // value: it is then set by hand and undrain leaves it.
    let run = cli(
        &consul,
        &backend_args(
            "drain",
            "web",
            &cfg,
            &["--server", "web-01", "--drain-wait", "30ms"],
        ),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv_entry(&consul, "web/web-01").unwrap().flags, MARK);
    let run = cli(&consul, &["set", "web/web-01", "maint", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["written"], true, "{run:?}");
    run.warns("now set by hand");
    let e = kv_entry(&consul, "web/web-01").unwrap();
    assert_eq!((e.value.as_str(), e.flags), ("maint", 0));
    let run = cli(&consul, &backend_args("undrain", "web", &cfg, &["--json"]));
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        set_by_hand(&run.json()),
        vec!["web/web-01", "web/web-04", "web/web-05"]
    );
    assert_eq!(kv_entry(&consul, "web/web-01").unwrap(), e, "untouched");
}

#[test]
fn drains_of_many_servers_use_several_transactions() {
    let consul = Consul::start();
    let dir = TempDir::new("writer-many");
    let cfg = dir.path().join("haproxy.cfg");
    let mut text = String::from("defaults\n    default-server agent-check agent-port 9777\n");
    text.push_str("backend be0\n");
    for s in 0..150 {
        text.push_str(&format!(
            "    server s{s} 127.0.0.1:1 agent-send \"be0/s{s} zone-c\\n\"\n"
        ));
    }
    text.push_str("backend be1\n    server s0 127.0.0.1:1 agent-send \"be1/s0 zone-c\\n\"\n");
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.to_str().unwrap();
    consul.put("be0/s1", "50%");
    consul.put("be0/s2", "maint");

    let run = cli(
        &consul,
        &backend_args("drain", "be0", cfg, &["--drain-wait", "30ms", "--json"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    // 21 keys per transaction: each key's record, the delete of an earlier
    // writer's record below the prefix and the write generation are in the
    // same one, and Consul 1.8 takes 64 operations.
    run.warns("(8 transactions)");
    let v = run.json();
    let hand: Vec<&str> = v["set_by_hand"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(hand, vec!["be0/s2"], "the maint put by hand is reported");
    let keys = all_keys(&consul);
    assert_eq!(keys.len(), 150);
    assert!(keys.values().all(|v| v == "maint"));
    assert!(!keys.contains_key("be1/s0"), "other backend untouched");

    let run = cli(
        &consul,
        &backend_args("undrain", "be0", cfg, &["--maint-wait", "30ms"]),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        all_keys(&consul),
        HashMap::from([("be0/s2".to_string(), "maint".to_string())]),
        "only the maint put by hand is left"
    );
}

/// Runs `state ARGS`, waits until it has written `canary` = `value`, lets
/// it reach its wait, sends `signal`, and returns its run and when the signal
/// was sent.
fn interrupt_once_written(
    consul: &Consul,
    args: &[&str],
    value: &str,
    signal: &str,
) -> (Run, Instant) {
    interrupt_once_written_at(consul, args, "canary", value, signal)
}

/// As [`interrupt_once_written`], waiting for `key` = `value`.
fn interrupt_once_written_at(
    consul: &Consul,
    args: &[&str],
    key: &str,
    value: &str,
    signal: &str,
) -> (Run, Instant) {
    let child = spawn_cli(consul, args);
    let pid = child.id();
    wait_for(CONVERGE, || {
        (kv(consul, key).as_deref() == Some(value)).then_some(())
    })
    .unwrap_or_else(|| panic!("{key} = {value} written"));
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    kill(pid, signal);
    (finish(child), started)
}

#[test]
fn sigint_during_the_drain_wait_leaves_drain_and_rerunning_finishes() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let (run, started) = interrupt_once_written(
        &consul,
        &["canary", "disable", "--drain-wait", "30s", "--json"],
        "drain",
        "INT",
    );
    assert!(started.elapsed() < Duration::from_secs(5), "stops at once");
    assert_eq!(run.code, 130, "{run:?}");
    run.warns("maint was NOT written");
    let v = run.json();
    assert_eq!(v["outcome"], "interrupted");
    assert_eq!(v["keys"][0]["now"], "drain");
    assert_eq!(v["steps"][2]["status"], "not_run");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("drain"));
    assert!(wait_for(CONVERGE, || (agent.ask("web/web-cny-01 canary")
        == "drain 100%\n")
        .then_some(()))
    .is_some());

    // Re-running waits again and finishes; once more is nothing to do.
    let run = cli(&consul, &["canary", "disable", "--drain-wait", "1s"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
    let run = cli(&consul, &["canary", "disable", "--drain-wait", "1s"]);
    assert_eq!(run.code, 0, "{run:?}");
    run.says("nothing to do");

    // SIGINT while enable holds maint: maint stays, the key is not cleared.
    consul.put("canary", "drain");
    let (run, _) = interrupt_once_written(
        &consul,
        &["canary", "enable", "--maint-wait", "30s"],
        "maint",
        "INT",
    );
    assert_eq!(run.code, 130, "{run:?}");
    run.warns("clear was NOT written");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
}

#[test]
fn an_interrupted_zonal_drain_or_undrain_is_finished_by_running_it_again() {
    // The group key an interrupted run left is taken over by re-running; a
    // row key set by hand next to it stays.
    let consul = Consul::start();
    consul.put("web/b", "maint");
    let by_hand = kv_entry(&consul, "web/b").unwrap();
    let zone_b = |verb: &'static str, wait_flag: &'static str, wait: &'static str| {
        vec![verb, "--zone", "b", wait_flag, wait]
    };
    let drain = |wait| zone_b("drain", "--drain-wait", wait);
    let undrain = |wait| zone_b("undrain", "--maint-wait", wait);
    let (run, _) = interrupt_once_written_at(&consul, &drain("30s"), "zone-b", "drain", "INT");
    assert_eq!(run.code, 130, "{run:?}");
    assert_eq!(kv(&consul, "zone-b").as_deref(), Some("drain"));
    let run = cli(&consul, &drain("1s"));
    assert_eq!(run.code, 0, "{run:?}");
    run.says("already drain: waits again");
    assert_eq!(kv(&consul, "zone-b").as_deref(), Some("maint"));
    assert_eq!(kv_entry(&consul, "web/b").unwrap(), by_hand);

    // Undrain interrupted while maint is held: maint stays.
    consul.put("zone-b", "drain");
    let (run, _) = interrupt_once_written_at(&consul, &undrain("30s"), "zone-b", "maint", "INT");
    assert_eq!(run.code, 130, "{run:?}");
    assert_eq!(kv(&consul, "zone-b").as_deref(), Some("maint"));
    let run = cli(&consul, &undrain("1s"));
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv_entry(&consul, "zone-b"), None);
    assert_eq!(kv_entry(&consul, "web/b").unwrap(), by_hand);
}

#[test]
fn sighup_during_the_drain_wait_reports_and_exits_129() {
    // A dropped SSH session: stop between steps like SIGINT, report what
    // was written, exit 128 + SIGHUP.
    let consul = Consul::start();
    let (run, started) = interrupt_once_written(
        &consul,
        &["canary", "disable", "--drain-wait", "30s", "--json"],
        "drain",
        "HUP",
    );
    assert!(started.elapsed() < Duration::from_secs(5), "stops at once");
    assert_eq!(run.code, 129, "{run:?}");
    run.warns("interrupted by SIGHUP");
    run.warns("wrote canary = drain");
    run.warns("maint was NOT written");
    let v = run.json();
    assert_eq!(v["outcome"], "interrupted");
    assert_eq!(v["error"]["exit_code"], 129);
    assert_eq!(v["keys"][0]["now"], "drain");
    assert_eq!(v["steps"][1]["status"], "interrupted");
    assert_eq!(v["steps"][2]["status"], "not_run");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("drain"));

    // Text output too (the report goes to stdout, the message to stderr).
    consul.put("canary", "drain");
    let (run, _) = interrupt_once_written(
        &consul,
        &["canary", "enable", "--maint-wait", "30s"],
        "maint",
        "HUP",
    );
    assert_eq!(run.code, 129, "{run:?}");
    run.says("stopped (interrupted)");
    assert!(
        run.stderr.contains("wrote canary = maint") && run.stderr.contains("clear was NOT written"),
        "{}",
        run.stderr
    );
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
}

/// The row of `key` in a text report's KEY table: its cells.
fn report_row<'a>(stdout: &'a str, key: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("KEY "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&key))
        .unwrap_or_else(|| panic!("no row for {key}:\n{stdout}"))
}

/// Runs `args`; once the canary key holds `written.0` puts `written.1`
/// there, as another writer would; then checks the run stops with 75, its
/// report row starts with `row` (it shows the other writer's value), its
/// message says each of `says` (what this run wrote, what the key holds
/// now, what was not written), and the other value is kept.
fn canary_changes_during_the_wait(
    consul: &Consul,
    args: &[&str],
    written: (&str, &str),
    row: [&str; 3],
    says: &[&str],
) {
    let child = spawn_cli(consul, args);
    wait_for(CONVERGE, || {
        (kv(consul, "canary").as_deref() == Some(written.0)).then_some(())
    })
    .unwrap_or_else(|| panic!("{} written", written.0));
    consul.put("canary", written.1);
    let run = finish(child);
    assert_eq!(run.code, 75, "{run:?}");
    run.warns("conflict");
    assert_eq!(
        report_row(&run.stdout, "canary")[..3],
        row,
        "{}",
        run.stdout
    );
    for text in says {
        run.warns(text);
    }
    assert!(!run.stderr.contains("left in place"), "{}", run.stderr);
    assert_eq!(kv(consul, "canary").as_deref(), Some(written.1));
}

#[test]
fn a_concurrent_change_makes_the_sequence_stop_without_overwriting() {
    let consul = Consul::start();
    // Canary: someone sets 50% while the CLI waits to write maint.
    canary_changes_during_the_wait(
        &consul,
        &["canary", "disable", "--drain-wait", "5s"],
        ("drain", "50%"),
        ["canary", "absent", "50%"],
        &[
            "wrote canary = drain",
            "then canary changed to 50% by someone else; nothing overwritten",
            "maint was NOT written to 1 key",
        ],
    );

    // Enable: someone puts drain back while maint is held.
    consul.put("canary", "drain");
    canary_changes_during_the_wait(
        &consul,
        &["canary", "enable", "--maint-wait", "5s"],
        ("maint", "drain"),
        ["canary", "drain", "drain"],
        &[
            "wrote canary = maint",
            "then canary changed to drain by someone else; nothing overwritten",
            "clear was NOT written to 1 key",
        ],
    );

    // Row keys: one key changes during the wait; the maint transaction is
    // rolled back whole, so no key is overwritten and none goes to maint.
    let dir = TempDir::new("writer-cas");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        "backend web\n    server a 127.0.0.1:1 agent-check agent-send \"web/a zone-b\\n\"\n    server b 127.0.0.1:1 agent-check agent-send \"web/b zone-b\\n\"\n",
    )
    .unwrap();
    let child = spawn_cli(
        &consul,
        &backend_args(
            "drain",
            "web",
            cfg.to_str().unwrap(),
            &["--drain-wait", "5s", "--json"],
        ),
    );
    wait_for(CONVERGE, || {
        (kv(&consul, "web/b").as_deref() == Some("drain")).then_some(())
    })
    .expect("drain written");
    consul.put("web/b", "25%");
    let run = finish(child);
    assert_eq!(run.code, 75, "{run:?}");
    let v = run.json();
    assert_eq!(v["error"]["kind"], "conflict");
    let message = v["error"]["message"].as_str().unwrap();
    for says in [
        "wrote web/a = drain, web/b = drain",
        "then web/b changed to 25% by someone else; nothing overwritten",
        "maint was NOT written to 2 keys",
    ] {
        assert!(message.contains(says), "{says:?}: {message}");
    }
    let now: HashMap<&str, &str> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].as_str().unwrap(), k["now"].as_str().unwrap()))
        .collect();
    assert_eq!(now["web/a"], "drain");
    assert_eq!(now["web/b"], "25%");
    assert_eq!(kv(&consul, "web/b").as_deref(), Some("25%"));
    assert_eq!(kv(&consul, "web/a").as_deref(), Some("drain"));
}

#[test]
fn undrain_refuses_to_guess_over_an_invalid_value() {
    let consul = Consul::start();
    consul.put("canary", "drian");
    let index = consul.prefix_index();
    let run = cli(&consul, &["canary", "enable"]);
    assert_eq!(run.code, 65, "{run:?}");
    run.warns("drian");
    assert_eq!(consul.prefix_index(), index);
    // Disable replaces it: taking servers out is what was asked.
    let run = cli(&consul, &["canary", "disable", "--drain-wait", "30ms"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("maint"));
}

/// Splits a shell command line on blanks, honouring single and double quotes.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[test]
fn runbook_commands_parse_with_this_cli() {
    use clap::Parser as _;
    use gitlab_haproxy_agent::cli::{Cli, Command as Sub};
    let mut checked = 0;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    for dir in ["docs", "runbook"] {
        let mut pages: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        pages.sort();
        docs.extend(pages);
    }
    for path in &docs {
        let doc = path.strip_prefix(root).unwrap().display();
        let text = std::fs::read_to_string(path).unwrap();
        // Commands in ```shell blocks, as on-call copies them, and in
        // ```text blocks (those run on a load balancer).
        let mut in_shell = false;
        let mut in_block = false;
        for line in text.lines().map(str::trim) {
            if let Some(lang) = line.strip_prefix("```") {
                in_block = !in_block;
                in_shell = in_block && (lang == "shell" || lang == "text");
                continue;
            }
            // `...` marks a placeholder (the diagram), not a command.
            if !in_shell || !line.starts_with("gitlab-haproxy-agent state") || line.contains("...")
            {
                continue;
            }
            let cli = Cli::try_parse_from(shell_words(line))
                .unwrap_or_else(|e| panic!("{doc}: {line}\n{e}"));
            let Some(Sub::State(state)) = &cli.command else {
                panic!("{doc}: {line} is not a state command");
            };
            // What the docs show taking servers out says why, as it must.
            if let Err(e) = gitlab_haproxy_agent::writer::author::of(&state.command) {
                panic!("{doc}: {line}\n{e}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 25, "only {checked} commands found");
}

/// Waits shorter than the floor (2 x --agent-inter + --agent-read-delay, 5 s
/// with the defaults) are refused with exit 64 before anything is written:
/// `--maint-wait 0s` would write maint and clear it at once, and agents that
/// read at most every --min-query-interval would merge the two writes, so
/// servers leave DRAIN without slowstart.
#[test]
fn waits_below_the_floor_are_refused_before_anything_is_written() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    consul.put("web/web-01", "drain");
    let index = consul.prefix_index();
    let defaults = |args: &[&str]| {
        let out = command(&consul.url(), args)
            .env_remove("GITLAB_HAPROXY_AGENT_AGENT_INTER")
            .env_remove("GITLAB_HAPROXY_AGENT_READ_DELAY")
            .output()
            .unwrap();
        Run::from(out)
    };
    for args in [
        &["canary", "enable", "--maint-wait", "30ms"][..],
        &["canary", "enable", "--maint-wait", "4999ms"],
        &["canary", "disable", "--drain-wait", "30ms"],
        &["drain", "--backend", "web", "--drain-wait", "30ms"],
        &["undrain", "--backend", "web", "--maint-wait", "1s"],
        // A tiny fleet timing must not switch the floor off either.
        &[
            "canary",
            "enable",
            "--maint-wait",
            "0s",
            "--agent-inter",
            "0s",
        ],
    ] {
        let run = defaults(args);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        assert!(run.stderr.contains("is below"), "{args:?}: {run:?}");
    }
    let run = defaults(&["canary", "enable", "--maint-wait", "1s", "--json"]);
    assert_eq!(run.code, 64, "{run:?}");
    assert_eq!(run.json()["error"]["kind"], "usage");
    assert!(
        run.stderr.contains("below 5s"),
        "the floor is named: {run:?}"
    );
    assert_eq!(consul.prefix_index(), index, "nothing written");
    assert_eq!(kv(&consul, "canary").as_deref(), Some("drain"));

    // At the floor it runs; a fleet that checks faster may say so.
    let run = defaults(&["canary", "enable", "--maint-wait", "5s", "--dry-run"]);
    assert_eq!(run.code, 0, "{run:?}");
    let run = defaults(&[
        "canary",
        "enable",
        "--maint-wait",
        "300ms",
        "--agent-inter",
        "100ms",
        "--agent-read-delay",
        "100ms",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(kv(&consul, "canary"), None);

    // --help says the floor.
    let help = defaults(&["canary", "enable", "--help"]);
    assert!(help.stdout.contains("2 x --agent-inter"), "{help:?}");
}

/// `--until` takes RFC 3339 in full (offsets, lowercase `t`/`z`) and
/// refuses a time without a zone rather than take it as UTC; with no login
/// in the environment (`USER`, `LOGNAME`, `SUDO_USER` unset, as under cron)
/// the record names the uid and the host, not `unknown`.
#[test]
fn until_takes_rfc3339_offsets_and_an_author_without_a_login_is_named() {
    let consul = Consul::start();
    let record = |key: &str| -> Value {
        let path = format!("/v1/kv/gitlab-haproxy-agent/state~meta/{key}?raw");
        let (status, _, body) = consul.request("GET", &path, b"");
        assert_eq!(status, 200, "a record of {key}");
        serde_json::from_slice(&body).unwrap()
    };
    // 2030-01-01T09:00:00Z, written three ways.
    for (key, until) in [
        ("web/s1", "2030-01-01T10:00:00+01:00"),
        ("web/s2", "2030-01-01t04:00:00-05:00"),
        ("web/s3", "2030-01-01t09:00:00z"),
    ] {
        let run = cli(&consul, &["set", key, "drain", "--until", until]);
        assert_eq!(run.code, 0, "{until}: {run:?}");
        let r = record(key);
        assert_eq!(r["until"], 1_893_488_400_u64, "{until}: {r}");
        let by = r["by"].as_str().unwrap();
        assert!(by.starts_with("uid ") && by.contains(" on host "), "{by}");
    }
    let run = cli(&consul, &["get", "web/s1"]);
    assert!(!run.stdout.contains("by unknown"), "{run:?}");
    assert!(run.stdout.contains("by uid "), "{run:?}");
    // No zone: refused, nothing written.
    let run = cli(
        &consul,
        &["set", "web/s4", "drain", "--until", "2030-01-01T09:00:00"],
    );
    assert_eq!(run.code, 64, "{run:?}");
    assert!(run.stderr.contains("has no time zone"), "{run:?}");
    assert_eq!(kv(&consul, "web/s4"), None);
}

/// A backend balanced by a static algorithm (`balance source`): HAProxy
/// applies only 0% and 100% there, so a weight the agent answers is not
/// applied (shown on a real HAProxy). The writer, reading the same
/// configuration, refuses a weight and a ramp there, writing nothing.
#[test]
fn weights_and_ramps_on_a_static_algorithm_are_refused() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let mut backends = String::from("backend web\n    balance source\n");
    backends.push_str(&server_line(
        "web",
        "s1",
        &["canary"],
        agent.listen.port(),
        100,
    ));
    backends.push_str("\nbackend api\n    balance roundrobin\n");
    backends.push_str(&server_line("api", "a1", &[], agent.listen.port(), 100));
    let config = haproxy_config(&backends);
    let haproxy = Haproxy::start(&config);
    let dir = TempDir::new("static-algo");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg, &config).unwrap();
    let cfg = cfg.to_str().unwrap();

    // What HAProxy does with a weight there: the agent answers it, HAProxy
    // keeps the full weight (api, roundrobin, applies it).
    consul.put("web/s1", "25%");
    consul.put("api/a1", "25%");
    haproxy.wait_server("api", "a1", CONVERGE, |s| s.uweight == 25);
    assert_eq!(agent.ask("web/s1 canary"), "ready 25%\n");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(haproxy.server("web", "s1").uweight, 100);
    consul.delete("web/s1");
    consul.delete("api/a1");

    let with_config = |args: &[&str]| {
        let out = command(&consul.url(), args)
            .env("GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG", cfg)
            .output()
            .unwrap();
        Run::from(out)
    };
    for args in [
        &["set", "web/s1", "25%"][..],
        &["set", "canary", "50%", "--new-group"][..],
        &[
            "undrain",
            "--backend",
            "web",
            "--server",
            "s1",
            "--ramp",
            "25%,50%",
        ][..],
        &["canary", "enable", "--ramp", "25%,50%"][..],
    ] {
        let run = with_config(args);
        assert_eq!(run.code, 65, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains("web (balance source)")
                && run
                    .stderr
                    .contains("HAProxy applies only 0% and 100% there"),
            "{args:?}: {run:?}"
        );
    }
    assert_eq!(kv(&consul, "web/s1"), None);
    assert_eq!(kv(&consul, "canary"), None);
    // Where the algorithm applies weights, and 0% / 100% anywhere: written.
    for args in [&["set", "api/a1", "25%"][..], &["set", "web/s1", "0%"][..]] {
        let run = with_config(args);
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
    }
}

/// The write generation below the prefix, parsed, and its ModifyIndex;
/// `None` when absent.
fn generation(consul: &Consul) -> Option<(Generation, u64)> {
    let e = kv_entry(consul, GENERATION_KEY)?;
    let g = Generation::parse(e.value.as_bytes())
        .unwrap_or_else(|e| panic!("{GENERATION_KEY} is not a generation: {e}"));
    Some((g, e.modify_index))
}

/// How many transactions a run says it wrote: the sum of the `(N
/// transaction[s])` its write steps end with on stderr.
fn transactions(run: &Run) -> u64 {
    run.stderr
        .lines()
        .filter(|l| l.contains(" written to ") && l.ends_with(')'))
        .filter_map(|l| {
            l.rsplit_once('(')?
                .1
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Asserts that `now` is `before` advanced by `n` transactions: the number
/// `n` more, `n` new ids in front of the ones `before` had (cut to the
/// history's length).
#[track_caller]
fn advanced(before: Option<&Generation>, now: &Generation, n: u64) {
    let (number, ids) = before.map_or((0, &[][..]), |g| (g.number, &g.ids[..]));
    assert_eq!(now.number, number + n, "{now} after {before:?}");
    let n = n as usize;
    let kept = ids.len().min(HISTORY.saturating_sub(n));
    assert_eq!(now.ids.len(), (n + ids.len()).min(HISTORY), "{now}");
    assert_eq!(&now.ids[n..n + kept], &ids[..kept], "history kept: {now}");
}

#[test]
fn every_write_advances_the_generation_by_one_per_transaction_and_keeps_its_history() {
    let consul = Consul::start();
    assert!(generation(&consul).is_none());
    let mut last: Option<Generation> = None;
    let many = TempDir::new("writer-generation");
    let cfg = many.path().join("haproxy.cfg");
    let mut text = String::from("defaults\n    default-server agent-check agent-port 9777\n");
    text.push_str("backend be0\n");
    for s in 0..40 {
        text.push_str(&format!(
            "    server s{s} 127.0.0.1:1 agent-send \"be0/s{s}\\n\"\n"
        ));
    }
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.to_str().unwrap();
    let commands: Vec<Vec<&str>> = vec![
        vec!["set", "canary", "drain"],
        vec!["set", "web/web-01", "50%"],
        vec!["clear", "canary"],
        vec!["canary", "disable", "--drain-wait", "30ms"],
        vec!["canary", "enable", "--maint-wait", "30ms"],
        backend_args("drain", "be0", cfg, &["--drain-wait", "30ms"]),
        backend_args("undrain", "be0", cfg, &["--maint-wait", "30ms"]),
        vec!["clear", "web/web-01"],
    ];
    for args in &commands {
        let run = cli(&consul, args);
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
        let n = transactions(&run);
        assert!(n >= 1, "{args:?} wrote: {run:?}");
        let (now, index) = generation(&consul).expect("a generation after a write");
        advanced(last.as_ref(), &now, n);
        // The generation is written in the same transaction as the keys:
        // the prefix's index is its ModifyIndex, a delete's included.
        assert_eq!(consul.prefix_index(), index, "{args:?}");
        last = Some(now);
    }
    // 40 keys and their records are two transactions (31 + 9): with the
    // generation, 63 operations of the 64 Consul 1.8 takes.
    let drain = cli(
        &consul,
        &backend_args("drain", "be0", cfg, &["--drain-wait", "30ms"]),
    );
    assert_eq!(drain.code, 0, "{drain:?}");
    drain.warns("written to 40 keys (2 transactions)");
    assert_eq!(transactions(&drain), 4, "drain, then maint: {drain:?}");
    let (now, _) = generation(&consul).unwrap();
    advanced(last.as_ref(), &now, 4);
    last = Some(now);

    // Nothing to change: no transaction, no new generation.
    let run = cli(&consul, &["set", "canary", "ready"]);
    assert_eq!((run.code, transactions(&run)), (0, 1), "{run:?}");
    let (now, _) = generation(&consul).unwrap();
    advanced(last.as_ref(), &now, 1);
    last = Some(now);
    let run = cli(&consul, &["clear", "zone-x"]);
    assert_eq!((run.code, transactions(&run)), (0, 0), "{run:?}");
    assert_eq!(generation(&consul).unwrap().0, *last.as_ref().unwrap());

    // release-rollback writes its key in one transaction with it.
    let run = cli(&consul, &["release-rollback"]);
    assert_eq!(run.code, 0, "{run:?}");
    let (now, index) = generation(&consul).unwrap();
    advanced(last.as_ref(), &now, 1);
    assert_eq!(
        kv_entry(&consul, "~release-rollback").unwrap().modify_index,
        index
    );
    last = Some(now);

    // Past the history's length, the oldest ids drop off.
    for i in 0..HISTORY {
        let value = if i % 2 == 0 { "drain" } else { "maint" };
        assert_eq!(cli(&consul, &["set", "zone-c", value]).code, 0);
    }
    let (now, _) = generation(&consul).unwrap();
    advanced(last.as_ref(), &now, HISTORY as u64);
}

/// What a [`TxnRelay`] runs before the first transaction, and how many it
/// passed on.
#[derive(Default)]
struct TxnHook {
    before_first: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
    txns: std::sync::atomic::AtomicUsize,
}

/// A TCP relay to Consul on a free loopback port that, the first time a
/// client sends `PUT /v1/txn`, runs a function before passing the request
/// on, and counts the transactions it passes on.
struct TxnRelay {
    addr: std::net::SocketAddr,
    hook: std::sync::Arc<TxnHook>,
}

impl TxnRelay {
    fn start(
        target: std::net::SocketAddr,
        before_first_txn: impl FnOnce() + Send + 'static,
    ) -> Self {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        let listener = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let addr = listener.local_addr().unwrap();
        let hook = std::sync::Arc::new(TxnHook::default());
        *hook.before_first.lock().unwrap() = Some(Box::new(before_first_txn));
        let pipe =
            |mut from: TcpStream, mut to: TcpStream, hook: Option<std::sync::Arc<TxnHook>>| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        if let Some(h) = hook.as_ref().filter(|_| buf.starts_with(b"PUT /v1/txn")) {
                            if let Some(f) = h.before_first.lock().unwrap().take() {
                                f();
                            }
                            h.txns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            };
        let shared = hook.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(target)) else {
                    continue;
                };
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(c, s, Some(shared.clone()));
                pipe(server, client, None);
            }
        });
        TxnRelay { addr, hook }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many transactions clients sent through the relay.
    fn txns(&self) -> usize {
        self.hook.txns.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn two_writers_at_once_both_write_and_the_generation_advances_twice() {
    let consul = Consul::start();
    assert_eq!(cli(&consul, &["set", "zone-a", "drain"]).code, 0);
    let (start, _) = generation(&consul).unwrap();
    // The second writer's whole run falls between the first one's read of
    // the generation and its transaction: the first one's compare-and-set
    // of the generation fails, and it sends its transaction again.
    let url = consul.url();
    let second: std::sync::Arc<std::sync::Mutex<Option<Run>>> = Default::default();
    let slot = second.clone();
    let relay = TxnRelay::start(consul.addr(), move || {
        *slot.lock().unwrap() = Some(cli_at(&url, &["set", "web/web-02", "maint"]));
    });
    let first = cli_at(&relay.url(), &["set", "web/web-01", "drain"]);
    let second = second
        .lock()
        .unwrap()
        .take()
        .expect("the second writer ran");
    assert_eq!(second.code, 0, "{second:?}");
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(kv(&consul, "web/web-01").as_deref(), Some("drain"));
    assert_eq!(kv(&consul, "web/web-02").as_deref(), Some("maint"));
    let (now, _) = generation(&consul).unwrap();
    advanced(Some(&start), &now, 2);
    assert_eq!(
        relay.txns(),
        2,
        "the first writer sent its transaction again"
    );

    // Writers started together, without a relay: all write, one
    // generation each.
    let (before, _) = generation(&consul).unwrap();
    let children: Vec<Child> = (0..4)
        .map(|i| spawn_cli(&consul, &["set", &format!("web/web-1{i}"), "drain"]))
        .collect();
    for child in children {
        let run = finish(child);
        assert_eq!(run.code, 0, "{run:?}");
    }
    let (now, _) = generation(&consul).unwrap();
    advanced(Some(&before), &now, 4);
}

#[test]
fn a_generation_written_by_hand_is_refused_with_how_to_fix_it() {
    let consul = Consul::start();
    consul.put("~generation", "hello");
    let run = cli(&consul, &["set", "canary", "drain", "--json"]);
    assert_eq!(run.code, 65, "{run:?}");
    let key = format!("{PREFIX}~generation");
    run.warns(&format!("{key} holds \"hello\""));
    run.warns(&format!("`consul kv delete {key}`"));
    run.warns("lost data");
    assert_eq!(run.json()["error"]["kind"], "invalid");
    assert_eq!(kv(&consul, "canary"), None, "nothing written");
    assert_eq!(kv(&consul, "~generation").as_deref(), Some("hello"));
    // The fix the message gives: the next write starts a new history.
    consul.delete("~generation");
    let run = cli(&consul, &["set", "canary", "drain"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(generation(&consul).unwrap().0.number, 1);
}

#[test]
fn a_token_that_may_not_write_the_generation_writes_nothing() {
    const MASTER: &str = "5b1e7c30-2d4f-4a8b-9c6e-0f1a2b3c4d5e";
    let consul = Consul::start_acl(MASTER);
    consul.put_policy(
        "state-but-generation",
        &format!(
            "key_prefix \"{PREFIX}\" {{ policy = \"write\" }}\nkey \"{PREFIX}~generation\" {{ policy = \"read\" }}"
        ),
    );
    let (_, secret) = consul.token_with("state-but-generation");
    let dir = TempDir::new("writer-generation-token");
    let token = dir.path().join("token");
    std::fs::write(&token, &secret).unwrap();
    let run = cli(
        &consul,
        &[
            "set",
            "canary",
            "drain",
            "--consul-token-file",
            token.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code, 77, "{run:?}");
    run.warns(&format!("may not write {PREFIX}~generation"));
    assert_eq!(kv(&consul, "canary"), None);
}

/// The Prometheus URL of `/etc/default/gitlab-haproxy-agent` (here the file
/// `$GITLAB_HAPROXY_AGENT_DEFAULTS_FILE` names) is used when neither a flag
/// nor the environment gives one: flag > environment > file > none, an
/// empty variable meaning none. Each URL is a closed port, so the zone
/// drain's group check names the one it asked.
#[test]
fn the_defaults_file_gives_prometheus_below_the_environment_and_the_flag() {
    let consul = Consul::start();
    let dir = TempDir::new("defaults-file");
    let [file, env, flag] = [(); 3].map(|()| format!("http://127.0.0.1:{}", free_port()));
    let defaults = dir.path().join("gitlab-haproxy-agent");
    std::fs::write(
        &defaults,
        format!("# settings\nGITLAB_HAPROXY_AGENT_PROMETHEUS_URL={file}\n"),
    )
    .unwrap();
    let drain = ["drain", "--zone", "b", "--dry-run"];
    let asked = |env_value: Option<&str>, extra: &[&str]| {
        let mut cmd = command(&consul.url(), &[&drain[..], extra].concat());
        cmd.env("GITLAB_HAPROXY_AGENT_DEFAULTS_FILE", &defaults);
        if let Some(v) = env_value {
            cmd.env("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL", v);
        }
        let run = Run::from(cmd.output().expect("run the CLI"));
        assert_eq!(run.code, 0, "{run:?}");
        run.stderr
    };
    let did_not_answer = |url: &str| format!("Prometheus at {url} did not answer");
    let stderr = asked(None, &[]);
    assert!(stderr.contains(&did_not_answer(&file)), "{stderr}");
    let stderr = asked(Some(&env), &[]);
    assert!(stderr.contains(&did_not_answer(&env)), "{stderr}");
    let stderr = asked(Some(&env), &["--prometheus", &flag]);
    assert!(stderr.contains(&did_not_answer(&flag)), "{stderr}");
    let stderr = asked(Some(""), &[]);
    assert!(stderr.contains("no Prometheus is set"), "{stderr}");
}
