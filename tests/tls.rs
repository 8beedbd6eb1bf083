//! TLS to Consul, against real Consul 1.8.7 agents whose HTTP API is HTTPS
//! only (`ports { http = -1, https = N }`) with `verify_incoming` (which in
//! 1.8 covers HTTPS too), certificates made by `consul tls ca create` and
//! `consul tls cert create -server` / `-client`, a real HAProxy and the
//! agent binary:
//!
//! - a server and a client agent joined to it: through the client agent
//!   the agent follows writes (HAProxy applies them) and the writer drains
//!   with `--haproxy-socket`, confirming DRAIN and MAINT in HAProxy; the
//!   Consul CLI's variables (`CONSUL_HTTP_SSL`, `CONSUL_CACERT`, ...) work
//!   as the options do; with the client agent killed, a write through the
//!   server reaches HAProxy through the agent's proven `https://`
//!   `--consul-fallback-addr`;
//! - a CA that did not sign Consul's certificate, a server name that is
//!   not the certificate's, no client certificate: clear errors naming the
//!   address (writer exit 69; the agent logs it, counts it as
//!   `connect_error` and is never ready); plain `http://` to the HTTPS port
//!   is refused by Consul; verification turned off takes any certificate;
//! - a CA file that cannot be read: exit 64 naming the option or variable.
//!
//! About 5 s.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Haproxy, Proc, Run, TempDir, AGENT_BIN,
};

/// HAProxy's agent-inter here: short, so HAProxy follows within a second.
const INTER_MS: u64 = 200;

/// Certificates made by the Consul CLI in a folder of their own.
struct Certs {
    dir: TempDir,
}

impl Certs {
    /// A CA with a server and a client certificate for dc1 (`with_leaves`),
    /// or a CA alone.
    fn make(name: &str, with_leaves: bool) -> Certs {
        let dir = TempDir::new(name);
        let mut steps: Vec<&[&str]> = vec![&["tls", "ca", "create"]];
        if with_leaves {
            steps.push(&["tls", "cert", "create", "-server", "-dc", "dc1"]);
            steps.push(&["tls", "cert", "create", "-client", "-dc", "dc1"]);
        }
        for args in steps {
            let out = Command::new("consul")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "consul {args:?}: {out:?}");
        }
        Certs { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn ca(&self) -> String {
        self.file("consul-agent-ca.pem")
    }

    fn client(&self) -> (String, String) {
        (
            self.file("dc1-client-consul-0.pem"),
            self.file("dc1-client-consul-0-key.pem"),
        )
    }

    /// `--consul-ca-file`, `--consul-client-cert`, `--consul-client-key`.
    fn options(&self) -> Vec<String> {
        let (cert, key) = self.client();
        [
            "--consul-ca-file",
            &self.ca(),
            "--consul-client-cert",
            &cert,
            "--consul-client-key",
            &key,
        ]
        .map(String::from)
        .to_vec()
    }
}

/// A Consul agent serving its HTTP API over HTTPS only, verifying clients.
struct TlsConsul {
    proc: Proc,
    https: u16,
    serf_lan: u16,
    _dir: TempDir,
}

impl TlsConsul {
    /// A dev server (`join`: `None`), or a client agent joined to the
    /// server whose serf LAN port is `join`, with `certs`' server or
    /// client certificate; waits (up to 60 s) until a KV write through it
    /// succeeds.
    fn start(certs: &Certs, join: Option<u16>) -> TlsConsul {
        let dir = TempDir::new("tls-consul");
        let (https, serf_lan) = (free_port(), free_port());
        let leaf = if join.is_some() { "client" } else { "server" };
        let mut ports = format!(
            r#""http": -1, "https": {https}, "dns": -1, "grpc": -1, "serf_lan": {serf_lan}"#
        );
        if join.is_none() {
            ports.push_str(&format!(
                r#", "serf_wan": {}, "server": {}"#,
                free_port(),
                free_port()
            ));
        }
        let cfg = dir.path().join("tls.json");
        std::fs::write(
            &cfg,
            format!(
                r#"{{"ports": {{{ports}}}, "verify_incoming": true, "verify_outgoing": true,
                "ca_file": "{}", "cert_file": "{}", "key_file": "{}"}}"#,
                certs.ca(),
                certs.file(&format!("dc1-{leaf}-consul-0.pem")),
                certs.file(&format!("dc1-{leaf}-consul-0-key.pem")),
            ),
        )
        .unwrap();
        let mut cmd = Command::new("consul");
        cmd.args(["agent", "-bind", "127.0.0.1", "-client", "127.0.0.1"])
            .arg(format!("-node=tls-{leaf}-{https}"))
            .arg(format!("-config-file={}", cfg.display()));
        match join {
            None => {
                cmd.arg("-dev");
            }
            Some(port) => {
                cmd.arg(format!("-data-dir={}", dir.path().join("data").display()))
                    .arg(format!("-retry-join=127.0.0.1:{port}"))
                    .arg("-retry-interval=200ms");
            }
        }
        let proc = Proc::spawn(cmd, dir.path().join("consul.log"));
        let consul = TlsConsul {
            proc,
            https,
            serf_lan,
            _dir: dir,
        };
        let (cert, key) = certs.client();
        let up = wait_for(Duration::from_secs(60), || {
            let out = Command::new("consul")
                .args(["kv", "put"])
                .arg(format!("-http-addr={}", consul.url()))
                .arg(format!("-ca-file={}", certs.ca()))
                .arg(format!("-client-cert={cert}"))
                .arg(format!("-client-key={key}"))
                .args(["gha-tls-ping", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .ok()?;
            out.success().then_some(())
        });
        assert!(up.is_some(), "Consul over HTTPS:\n{}", consul.proc.log());
        consul
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.https)
    }
}

/// The writer CLI with `args`, `--consul-addr url` and `tls` options; the
/// HAProxy checks here are 200 ms apart, so short waits are allowed.
fn writer(url: &str, tls: &[String], args: &[&str]) -> Run {
    let mut cmd = support::state_command(url, args);
    cmd.args(tls)
        .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", "10ms")
        .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "10ms")
        .stdin(Stdio::null());
    Run::from(cmd.output().unwrap())
}

/// `/status` as JSON.
fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn through_an_https_only_consul_the_agent_follows_the_writer_confirms_and_a_fallback_serves() {
    let certs = Certs::make("tls-certs", true);
    let server = TlsConsul::start(&certs, None);
    let mut client = TlsConsul::start(&certs, Some(server.serf_lan));
    let tls = certs.options();

    let port = free_port();
    let haproxy = Haproxy::start(&haproxy_config(&format!(
        "backend web\n{}",
        server_line("web", "s1", &[], port, INTER_MS)
    )));
    let socket = haproxy.socket().display().to_string();
    // The store's first write, which gives it its store id.
    let run = writer(&client.url(), &tls, &["set", "web/s1", "ready"]);
    assert_eq!(run.code, 0, "{run:?}");
    let mut extra: Vec<&str> = tls.iter().map(String::as_str).collect();
    let fallback = server.url();
    extra.extend(["--consul-fallback-addr", &fallback]);
    let agent = Agent::spawn_on(&client.url(), port, free_port(), &extra);
    agent.wait_ready();
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| {
        s.is_ready_full_weight()
    });

    // The writer drains through the client agent and confirms in HAProxy
    // that the server is in DRAIN, then in MAINT.
    let run = writer(
        &client.url(),
        &tls,
        &[
            "drain",
            "--backend",
            "web",
            "--server",
            "s1",
            "--haproxy-socket",
            &socket,
            "--drain-wait",
            "300ms",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    run.warns("in DRAIN");
    run.warns("in MAINT");
    assert!(haproxy.server("web", "s1").is_maint());

    // The Consul CLI's variables, as `consul` itself reads them: no scheme
    // in CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL=true.
    let (cert, key) = certs.client();
    let out = Command::new(AGENT_BIN)
        .env_clear()
        .env("CONSUL_HTTP_ADDR", format!("127.0.0.1:{}", client.https))
        .env("CONSUL_HTTP_SSL", "true")
        .env("CONSUL_CACERT", certs.ca())
        .env("CONSUL_CLIENT_CERT", &cert)
        .env("CONSUL_CLIENT_KEY", &key)
        .env("CONSUL_TLS_SERVER_NAME", "client.dc1.consul")
        .args(["state", "get", "web/s1", "--json"])
        .output()
        .unwrap();
    let run = Run::from(out);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["value"], "maint", "{run:?}");

    // The client agent gone, the fallback over https:// is proven (the
    // store id is served now) and read through: a write through the server
    // reaches HAProxy.
    client.proc.kill();
    let run = writer(&server.url(), &tls, &["set", "web/s1", "drain"]);
    assert_eq!(run.code, 0, "{run:?}");
    agent.wait_answer("web/s1", "drain 100%\n");
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| s.is_drain());
    assert!(agent.metric("gitlab_haproxy_agent_consul_route") > 0.0);
    let status = status(&agent);
    assert_eq!(
        status["consul_fallbacks"][0]["state"], "proven",
        "{status:#}"
    );
    assert_eq!(status["consul_fallback_in_use"], fallback.as_str());
}

#[test]
fn a_certificate_that_fails_verification_is_a_clear_error_naming_the_address() {
    let certs = Certs::make("tls-certs", true);
    let other = Certs::make("tls-other-ca", false);
    let server = TlsConsul::start(&certs, None);
    let url = server.url();
    let (cert, key) = certs.client();
    let client_cert =
        ["--consul-client-cert", &cert, "--consul-client-key", &key].map(String::from);
    let with = |ca: &str, more: &[&str]| {
        let mut v = vec!["--consul-ca-file".to_string(), ca.to_string()];
        v.extend(client_cert.iter().cloned());
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };

    // A CA that did not sign Consul's certificate.
    let run = writer(&url, &with(&other.ca(), &[]), &["list"]);
    assert_eq!(run.code, 69, "{run:?}");
    run.warns(&format!("TLS to Consul at {url} failed"));
    run.warns("check --consul-ca-file");
    // A server name the certificate does not hold, then one it holds.
    let wrong_name = with(&certs.ca(), &["--consul-tls-server-name", "db.example"]);
    let run = writer(&url, &wrong_name, &["list"]);
    assert_eq!(run.code, 69, "{run:?}");
    run.warns("check --consul-tls-server-name");
    let run = writer(
        &url,
        &with(
            &certs.ca(),
            &["--consul-tls-server-name", "server.dc1.consul"],
        ),
        &["list"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    // Verification off takes the certificate any CA would refuse.
    let run = writer(
        &url,
        &with(&other.ca(), &["--consul-http-ssl-verify", "false"]),
        &["list"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    // No client certificate: Consul (verify_incoming) refuses us.
    let run = writer(&url, &["--consul-ca-file".into(), certs.ca()], &["list"]);
    assert_eq!(run.code, 69, "{run:?}");
    run.warns(&format!("TLS to Consul at {url} failed"));
    // Plain HTTP to the HTTPS port: Consul refuses it, nothing is read.
    let plain = url.replace("https://", "http://");
    let run = writer(&plain, &[], &["list"]);
    assert_ne!(run.code, 0, "{run:?}");
    run.warns("HTTP request to an HTTPS server");

    // The agent: the error in its log and in the existing error metric,
    // never ready.
    let wrong: Vec<String> = with(&other.ca(), &["--on-startup-timeout", "retry"]);
    let wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
    let agent = Agent::spawn(&url, &wrong);
    let logged = wait_for(Duration::from_secs(20), || {
        let log = agent.log();
        (log.contains(&format!("TLS to Consul at {url} failed")) && log.contains("UnknownIssuer"))
            .then_some(())
    });
    assert!(logged.is_some(), "{}", agent.log());
    let errors = wait_for(Duration::from_secs(10), || {
        let n =
            agent.metric("gitlab_haproxy_agent_consul_requests_total{outcome=\"connect_error\"}");
        (n >= 1.0).then_some(n)
    });
    assert!(errors.is_some(), "{}", agent.metrics());
    assert_eq!(agent.http_get("/-/ready").map(|r| r.0), Some(503));
}

#[test]
fn a_tls_file_that_cannot_be_read_exits_64_naming_the_option() {
    let dir = TempDir::new("tls-bad-files");
    let missing: PathBuf = dir.path().join("missing-ca.pem");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let url = "https://127.0.0.1:1";

    let run = writer(url, &["--consul-ca-file".into(), path(&missing)], &["list"]);
    assert_eq!(run.code, 64, "{run:?}");
    run.warns("invalid --consul-ca-file");
    let mut cmd = support::state_command(url, &["list"]);
    cmd.env("CONSUL_CACERT", &junk);
    let run = Run::from(cmd.output().unwrap());
    assert_eq!(run.code, 64, "{run:?}");
    run.warns("invalid $CONSUL_CACERT");
    run.warns("no PEM certificate");

    for args in [
        ["--consul-ca-file".to_string(), path(&missing)],
        ["--consul-client-cert".to_string(), path(&junk)],
    ] {
        let out = Command::new(AGENT_BIN)
            .env_clear()
            .args(["--consul-addr", url, "--listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let run = Run::from(out);
        assert_eq!(run.code, 64, "{args:?}: {run:?}");
        run.warns(&format!("invalid {}", args[0]));
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}
