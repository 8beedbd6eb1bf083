//! `state drain --until-idle` and `state undrain --ramp` against a real
//! HAProxy (TCP, with its own Prometheus exporter), the agent it asks, a
//! real Consul and a real Prometheus scraping both: the drain ends when the
//! last session through HAProxy has closed (or at the longest wait, naming
//! the server still in session), and the ramp steps through each weight,
//! seen in `show servers state`.

mod support;

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use support::prometheus::Prometheus;
use support::{free_port, kill, wait_for, Agent, Consul, Haproxy, TempDir, AGENT_BIN, PREFIX};

/// HAProxy's agent-inter here; the writer's wait floor follows it
/// (2 x 200 ms + 100 ms read delay = 500 ms).
const INTER_MS: u64 = 200;

/// One load balancer: a backend server the test runs (it holds every
/// connection open until told to stop), HAProxy in TCP mode in front of it
/// with its exporter on `/metrics`, the agent HAProxy asks, and Prometheus
/// scraping the agent (job `gitlab-haproxy-agent`) and the exporter (job
/// `haproxy`).
struct Lb {
    consul: Consul,
    _agent: Agent,
    haproxy: Haproxy,
    prometheus: Prometheus,
    /// HAProxy's frontend: a connection here is a session on web/web-01.
    front: SocketAddr,
    /// HAProxy's exporter: the `instance` label of its series.
    metrics: SocketAddr,
    /// More load balancers in front of the same server and agent (HAProxy,
    /// frontend, exporter), scraped in the same `haproxy` job.
    more: Vec<(Haproxy, SocketAddr, SocketAddr)>,
    stop: Arc<AtomicBool>,
}

impl Drop for Lb {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn lb() -> Lb {
    lb_with(1, "1s")
}

/// An HAProxy in TCP mode sending every connection on `front` to
/// web/web-01 at `backend`, asking `agent` about it, its exporter on
/// `metrics`.
fn haproxy_in_front(
    front: SocketAddr,
    metrics: SocketAddr,
    backend: SocketAddr,
    agent: u16,
) -> Haproxy {
    Haproxy::start(&format!(
        "global\n    stats socket {{SOCKET}} mode 600 level admin\n\n\
         defaults\n    timeout connect 1s\n    timeout client 60s\n    timeout server 60s\n    \
         timeout check 1s\n\n\
         frontend metrics\n    mode http\n    bind {metrics}\n    \
         http-request use-service prometheus-exporter if {{ path /metrics }}\n\n\
         frontend fe\n    mode tcp\n    bind {front}\n    default_backend web\n\n\
         backend web\n    mode tcp\n    server web-01 {backend} weight 100 agent-check \
         agent-addr 127.0.0.1 agent-port {agent} agent-inter {INTER_MS}ms \
         agent-send \"web/web-01 canary\\n\"\n"
    ))
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// `n` load balancers (HAProxys) in front of one server, one agent and one
/// Consul; Prometheus scrapes their exporters every `every`.
fn lb_with(n: usize, every: &str) -> Lb {
    lb_with_agent(n, every, &[])
}

/// [`lb_with`], the agent started with `agent_args`.
fn lb_with_agent(n: usize, every: &str, agent_args: &[&str]) -> Lb {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), agent_args);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // Accepts and holds connections; a closed one is dropped when read.
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        while !s.load(Ordering::Relaxed) {
            if let Ok((c, _)) = listener.accept() {
                c.set_nonblocking(true).unwrap();
                held.push(c);
            }
            held.retain_mut(|c| !matches!(c.read(&mut [0u8; 64]), Ok(0)));
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let port = agent.listen.port();
    let (front, metrics) = (loopback(), loopback());
    let haproxy = haproxy_in_front(front, metrics, backend, port);
    let more: Vec<(Haproxy, SocketAddr, SocketAddr)> = (1..n)
        .map(|_| {
            let (f, m) = (loopback(), loopback());
            (haproxy_in_front(f, m, backend, port), f, m)
        })
        .collect();
    let exporters: Vec<SocketAddr> = std::iter::once(metrics)
        .chain(more.iter().map(|(_, _, m)| *m))
        .collect();
    let prometheus = Prometheus::start_jobs(&[agent.http], &[("haproxy", exporters, every)]);
    let lb = Lb {
        consul,
        _agent: agent,
        haproxy,
        prometheus,
        front,
        metrics,
        more,
        stop,
    };
    assert!(
        lb.prometheus.wait_until(
            Duration::from_secs(30),
            "gitlab_haproxy_agent_rows_seen",
            1,
            |v| v == 1.0
        ),
        "Prometheus does not see the agent asked about its row:\n{}",
        lb.prometheus.log()
    );
    lb
}

impl Lb {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(AGENT_BIN);
        cmd.env_clear()
            .env("GITLAB_HAPROXY_AGENT_AGENT_INTER", format!("{INTER_MS}ms"))
            .env("GITLAB_HAPROXY_AGENT_READ_DELAY", "100ms")
            // Writes that take servers out need a reason (tests/drain_records.rs
            // tests that and the records); the environment's default gives it.
            .env("GITLAB_HAPROXY_AGENT_REASON", "test")
            .env(
                "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
                "/nonexistent/haproxy.cfg",
            )
            .env("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL", self.prometheus.url())
            .arg("state")
            .args(args)
            .args(["--consul-addr", &self.consul.url(), "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().expect("start the CLI")
    }

    fn run(&self, args: &[&str]) -> (i32, Value, String) {
        finish(self.command(args).output().expect("run the CLI"))
    }

    /// The value of `PREFIX + key`, `None` when absent.
    fn kv(&self, key: &str) -> Option<String> {
        let (status, _, body) = self
            .consul
            .request("GET", &format!("/v1/kv/{PREFIX}{key}"), b"");
        if status == 404 {
            return None;
        }
        let v: Value = serde_json::from_slice(&body).unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v[0]["Value"].as_str().unwrap_or(""))
            .unwrap();
        Some(String::from_utf8(raw).unwrap())
    }

    /// A TCP connection through HAProxy to web/web-01, once Prometheus
    /// sees the session on it.
    fn session(&self) -> TcpStream {
        let c = TcpStream::connect(self.front).unwrap();
        self.wait_sessions(1.0);
        c
    }

    fn wait_sessions(&self, n: f64) {
        let expr = r#"haproxy_server_current_sessions{job="haproxy",proxy="web",server="web-01"}"#;
        assert!(
            self.prometheus
                .wait_until(Duration::from_secs(20), expr, 1, |v| v == n),
            "Prometheus does not see {n} session(s) on web/web-01: {:?}",
            self.prometheus.values(expr)
        );
    }

    /// Waits until the key holds `value` (`None`: absent); returns when.
    fn wait_kv(&self, key: &str, value: Option<&str>, timeout: Duration) -> Instant {
        wait_for(timeout, || {
            (self.kv(key).as_deref() == value).then(Instant::now)
        })
        .unwrap_or_else(|| panic!("{key} is not {value:?} after {timeout:?}"))
    }
}

fn finish(out: Output) -> (i32, Value, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), report, stderr)
}

#[test]
fn until_idle_waits_for_the_last_session_or_names_the_server_still_in_session() {
    let lb = lb();
    let cfg = lb.haproxy.socket().with_file_name("haproxy.cfg");
    let cfg = cfg.to_str().unwrap();
    let idle = |max: &'static str| {
        vec![
            "--until-idle",
            max,
            "--sessions-selector",
            r#"job="haproxy""#,
        ]
    };

    // A session kept open: the drain goes to maint at the longest wait and
    // names the server and the load balancer still in session.
    let client = lb.session();
    let mut args = vec!["drain", "--backend", "web", "--server", "web-01"];
    args.extend(idle("4s"));
    let started = Instant::now();
    let (code, report, stderr) = lb.run(&args);
    let took = started.elapsed();
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert!(took >= Duration::from_secs(4), "ended after {took:?}");
    assert_eq!(lb.kv("web/web-01").as_deref(), Some("maint"));
    let until = &report["until_idle"];
    assert_eq!(until["idle"], false, "{report}");
    assert_eq!(
        until["still_in_session"],
        serde_json::json!([{
            "server": "web/web-01",
            "instance": lb.metrics.to_string(),
            "sessions": 1,
        }]),
        "{report}"
    );
    assert_eq!(report["steps"][1]["for"], "idle", "{report}");
    drop(client);
    lb.wait_sessions(0.0);
    let (code, report, stderr) = lb.run(&[
        "undrain",
        "--backend",
        "web",
        "--server",
        "web-01",
        "--maint-wait",
        "1s",
    ]);
    assert_eq!(code, 0, "{report}\n{stderr}");

    // A session that closes during the wait: maint follows within a scrape
    // interval (1 s) plus a poll (500 ms) and slack, long before the longest
    // wait; the group's servers come from the HAProxy configuration.
    let client = lb.session();
    let mut args = vec!["canary", "disable", "--haproxy-config", cfg];
    args.extend(idle("60s"));
    let child = lb.spawn(&args);
    lb.wait_kv("canary", Some("drain"), Duration::from_secs(20));
    // Drained, not yet maint: the session holds the wait past its floor.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        lb.kv("canary").as_deref(),
        Some("drain"),
        "maint written with a session open"
    );
    assert!(lb.haproxy.server("web", "web-01").is_drain());
    let closed = Instant::now();
    drop(client);
    let maint = lb.wait_kv("canary", Some("maint"), Duration::from_secs(20));
    let after = maint - closed;
    assert!(
        after < Duration::from_millis(2500),
        "maint {after:?} after the last session closed"
    );
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], true, "{report}");
    assert_eq!(
        report["until_idle"]["still_in_session"],
        serde_json::json!([])
    );
    assert!(
        report["until_idle"]["waited_seconds"].as_u64().unwrap() < 30,
        "{report}"
    );
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| s.is_maint());

    // Without Prometheus: exit 64 before anything is written.
    let out = lb
        .command(&[
            "drain",
            "--backend",
            "web",
            "--server",
            "web-02",
            "--until-idle",
            "1m",
        ])
        .env_remove("GITLAB_HAPROXY_AGENT_PROMETHEUS_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--until-idle needs Prometheus"));
    assert_eq!(lb.kv("web/web-02"), None);
}

#[test]
fn ramp_steps_through_each_weight_and_an_interrupted_ramp_stops_at_a_valid_one() {
    let lb = lb();
    let server = ["--backend", "web", "--server", "web-01"];
    let (code, report, stderr) = lb.run(&[&["drain", "--drain-wait", "1s"][..], &server].concat());
    assert_eq!(code, 0, "{report}\n{stderr}");
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| s.is_maint());

    // Watch `show servers state` while the ramp runs.
    let watch = |lb: &Lb, child: &mut Child| {
        let mut seen: Vec<(u32, u32)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            let s = lb.haproxy.server("web", "web-01");
            if seen.last() != Some(&(s.admin_state, s.uweight)) {
                seen.push((s.admin_state, s.uweight));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    };
    let ramp = [
        "undrain",
        "--ramp",
        "25%,50%,100%",
        "--ramp-every",
        "2s",
        "--maint-wait",
        "1s",
    ];
    let mut child = lb.spawn(&[&ramp[..], &server].concat());
    let seen = watch(&lb, &mut child);
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    // From MAINT, to ready at 25, then 50, then the full weight (100).
    let ready: Vec<u32> = seen
        .iter()
        .filter(|(admin, _)| *admin == 0)
        .map(|(_, w)| *w)
        .collect();
    assert_eq!(ready, [25, 50, 100], "show servers state went {seen:?}");
    let steps = report["steps"].as_array().unwrap();
    let writes: Vec<&str> = steps.iter().filter_map(|s| s["write"].as_str()).collect();
    assert_eq!(writes, ["25%", "50%", "clear"], "{report}");
    for s in steps.iter().filter(|s| s["write"].is_string()) {
        assert_eq!(s["confirmed"]["agents_at_index"], 1, "{report}");
    }
    assert_eq!(lb.kv("web/web-01"), None);

    // Interrupted after the first step: 25% stays in Consul (a valid value,
    // with the drain mark) and is reported; running it again goes on to
    // 50% and then removes the key.
    let (code, report, stderr) = lb.run(&[&["drain", "--drain-wait", "1s"][..], &server].concat());
    assert_eq!(code, 0, "{report}\n{stderr}");
    let slow = ["undrain", "--ramp", "25%,50%", "--ramp-every", "30s"];
    let child = lb.spawn(&[&slow[..], &server].concat());
    lb.wait_kv("web/web-01", Some("25%"), Duration::from_secs(20));
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| {
            s.admin_state == 0 && s.uweight == 25
        });
    kill(child.id(), "INT");
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 130, "{report}\n{stderr}");
    assert_eq!(lb.kv("web/web-01").as_deref(), Some("25%"));
    assert_eq!(report["keys"][0]["now"], "25%", "{report}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("wrote web/web-01 = 25%"), "{message}");
    assert!(message.contains("50% was NOT written"), "{message}");
    let fast = ["undrain", "--ramp", "25%,50%", "--ramp-every", "1s"];
    let (code, report, stderr) = lb.run(&[&fast[..], &server].concat());
    assert_eq!(code, 0, "{report}\n{stderr}");
    let writes: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["write"].as_str())
        .collect();
    assert_eq!(writes, ["50%", "clear"], "{report}");
    assert_eq!(lb.kv("web/web-01"), None);
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| {
            s.is_ready_full_weight()
        });

    // A list that does not increase, or goes past 100%: exit 64.
    for bad in ["50%,25%", "0%,50%", "25%,150%", "25"] {
        let out = lb
            .command(&[&["undrain", "--ramp", bad][..], &server].concat())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad}");
    }
}

/// A ramp interrupted at its first step, then a plain `canary enable` (no
/// `--ramp`): the ramp is finished (the key removed, the server back at its
/// full weight), not left at 25% with "nothing to do".
#[test]
fn a_plain_enable_finishes_an_interrupted_ramp() {
    let lb = lb();
    let (code, report, stderr) = lb.run(&["canary", "disable", "--drain-wait", "1s"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| s.is_maint());
    let slow = [
        "canary",
        "enable",
        "--ramp",
        "25%,50%",
        "--ramp-every",
        "30s",
        "--maint-wait",
        "1s",
    ];
    let child = lb.spawn(&slow);
    lb.wait_kv("canary", Some("25%"), Duration::from_secs(20));
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| {
            s.admin_state == 0 && s.uweight == 25
        });
    kill(child.id(), "INT");
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 130, "{report}\n{stderr}");
    assert_eq!(lb.kv("canary").as_deref(), Some("25%"));

    let (code, report, stderr) = lb.run(&["canary", "enable", "--maint-wait", "1s"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(lb.kv("canary"), None, "{report}");
    assert_eq!(report["keys"][0]["before"], "25%", "{report}");
    let note = report["keys"][0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("interrupted ramp"), "{report}");
    lb.haproxy
        .wait_server("web", "web-01", Duration::from_secs(5), |s| {
            s.is_ready_full_weight()
        });
}

/// `drain --until-idle MAX` on web/web-01 with the exporters of job
/// `haproxy`; its report.
fn drain_until_idle(lb: &Lb, max: &str) -> Child {
    lb.spawn(&[
        "drain",
        "--backend",
        "web",
        "--server",
        "web-01",
        "--until-idle",
        max,
        "--sessions-selector",
        r#"job="haproxy""#,
    ])
}

/// The load balancers the report names as still in session, with why.
fn still_in_session(report: &Value) -> Vec<(String, String)> {
    let all = report["until_idle"]["still_in_session"].as_array().cloned();
    all.unwrap_or_default()
        .iter()
        .map(|s| {
            let field = |k: &str| s[k].as_str().unwrap_or("").to_string();
            (field("instance"), field("why"))
        })
        .collect()
}

/// A reload during the wait moves no session: the old worker keeps it,
/// and the new worker's exporter says 0. The load balancer stays in
/// session until the longest wait, named as reloaded.
#[test]
fn until_idle_counts_a_load_balancer_reloaded_after_the_drain_as_in_session() {
    let lb = lb();
    let client = lb.session();
    let old = lb.haproxy.worker_pid().unwrap();
    let child = drain_until_idle(&lb, "8s");
    lb.wait_kv("web/web-01", Some("drain"), Duration::from_secs(20));
    lb.haproxy.reload();
    // The new worker's exporter: no session on web/web-01.
    lb.wait_sessions(0.0);
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], false, "{report}");
    assert_eq!(
        still_in_session(&report),
        [(lb.metrics.to_string(), "reloaded_after_drain".to_string())],
        "{report}"
    );
    // The session is still open, on the old worker.
    assert!(
        std::path::Path::new(&format!("/proc/{old}")).exists(),
        "the old worker {old} is gone"
    );
    assert!(TcpStream::peer_addr(&client).is_ok());
    drop(client);
}

/// Two load balancers; the one holding the session stops answering its
/// scrape (its worker stopped): its series go stale, the other says 0.
/// The server is not idle there: it reported the server before the drain.
#[test]
fn until_idle_counts_a_load_balancer_whose_exporter_is_not_scraped_as_in_session() {
    let lb = lb_with(2, "1s");
    let (second, front, metrics) = &lb.more[0];
    let expr = r#"haproxy_server_current_sessions{job="haproxy",proxy="web",server="web-01"}"#;
    let client = TcpStream::connect(front).unwrap();
    let on_second = || {
        let v = lb.prometheus.values(expr);
        v.iter()
            .any(|(i, n)| *i == metrics.to_string() && *n == 1.0)
            && v.len() == 2
    };
    assert!(wait_for(Duration::from_secs(20), || on_second().then_some(())).is_some());
    let worker = second.worker_pid().unwrap();
    assert!(kill(worker, "STOP"));
    let stale = wait_for(Duration::from_secs(20), || {
        let v = lb.prometheus.values(expr);
        (v.len() == 1 && v[0].0 == lb.metrics.to_string()).then_some(())
    });
    let child = drain_until_idle(&lb, "5s");
    let out = child.wait_with_output().unwrap();
    assert!(kill(worker, "CONT"));
    assert!(stale.is_some(), "{:?}", lb.prometheus.values(expr));
    let (code, report, stderr) = finish(out);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], false, "{report}");
    assert_eq!(
        still_in_session(&report),
        [(metrics.to_string(), "not_reported_since_drain".to_string())],
        "{report}"
    );
    drop(client);
}

/// The exporter scraped every 30 s: a session opened after the last
/// scrape, and the drain. The last sample (0 sessions) is from before the
/// drain: it is not trusted, the wait ends at its longest.
#[test]
fn until_idle_does_not_trust_a_sample_from_before_the_drain() {
    let lb = lb_with(1, "30s");
    let expr = r#"haproxy_server_current_sessions{job="haproxy",proxy="web",server="web-01"}"#;
    assert!(lb
        .prometheus
        .wait_until(Duration::from_secs(45), expr, 1, |v| v == 0.0));
    let client = TcpStream::connect(lb.front).unwrap();
    let (code, report, stderr) = finish(drain_until_idle(&lb, "5s").wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], false, "{report}");
    let named = still_in_session(&report);
    assert_eq!(named.len(), 1, "{report}");
    assert_eq!(named[0].0, lb.metrics.to_string(), "{report}");
    drop(client);
}

/// A reload 4 s before the drain (as every guarded deploy makes one): the
/// session stays on the old worker and the new worker's exporter says 0
/// before the drain. The agent counts the old worker from its master's
/// PID file: the drain names the load balancer and why at its longest
/// wait, and a second drain waits until the session closes (the old
/// worker exits), then writes maint. Fails while only a reload after the
/// drain counts (exit 0 at the first poll, idle).
#[test]
fn until_idle_waits_for_an_old_worker_left_by_a_reload_before_the_drain() {
    let dir = TempDir::new("haproxy-pid");
    let pid_file = dir.path().join("haproxy.pid");
    let mut lb = lb_with_agent(1, "1s", &["--haproxy-pid-file", pid_file.to_str().unwrap()]);
    std::fs::write(&pid_file, format!("{}\n", lb.haproxy.proc().pid())).unwrap();
    let old_workers = |n: f64| {
        let expr = "gitlab_haproxy_agent_haproxy_old_workers";
        assert!(
            lb.prometheus
                .wait_until(Duration::from_secs(20), expr, 1, |v| v == n),
            "Prometheus does not see {n} old worker(s): {:?}",
            lb.prometheus.values(expr)
        );
    };
    old_workers(0.0);
    let client = lb.session();
    let old = lb.haproxy.worker_pid().unwrap();
    lb.haproxy.reload();
    let reloaded = Instant::now();
    lb.wait_sessions(0.0);
    old_workers(1.0);
    std::thread::sleep(Duration::from_secs(4).saturating_sub(reloaded.elapsed()));

    // The longest wait: maint written, the load balancer named with why.
    let (code, report, stderr) = finish(drain_until_idle(&lb, "5s").wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], false, "{report}");
    assert_eq!(
        still_in_session(&report),
        [(lb.metrics.to_string(), "old_workers_running".to_string())],
        "{report}"
    );
    assert!(std::path::Path::new(&format!("/proc/{old}")).exists());
    let (code, report, stderr) = lb.run(&[
        "undrain",
        "--backend",
        "web",
        "--server",
        "web-01",
        "--maint-wait",
        "1s",
    ]);
    assert_eq!(code, 0, "{report}\n{stderr}");

    // The session closes during the wait: the old worker exits, the agent
    // says so, and maint follows.
    let child = drain_until_idle(&lb, "60s");
    lb.wait_kv("web/web-01", Some("drain"), Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        lb.kv("web/web-01").as_deref(),
        Some("drain"),
        "maint written while the old worker holds the session"
    );
    let closed = Instant::now();
    drop(client);
    let maint = lb.wait_kv("web/web-01", Some("maint"), Duration::from_secs(30));
    let (code, report, stderr) = finish(child.wait_with_output().unwrap());
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["until_idle"]["idle"], true, "{report}");
    assert!(
        !std::path::Path::new(&format!("/proc/{old}")).exists(),
        "the old worker {old} is still there"
    );
    eprintln!("maint {:?} after the session closed", maint - closed);
}
