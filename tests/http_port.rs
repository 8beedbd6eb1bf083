//! The operator HTTP port: CPU profiles on `/debug/pprof/` (read back with
//! Go's `go tool pprof`), a port that idle connections cannot lock
//! out of `/-/ready` and `/metrics`, a default listen address the
//! fleet's Prometheus can scrape, and `/status` and `/debug/pprof/` kept
//! from a mesh sidecar's connections (127.0.0.6).

mod support;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::prometheus::{Prometheus, JOB};
use support::{check_load, free_port, netns, Agent, Consul, Proc, TempDir, AGENT_BIN};

use support::get_from;
use support::get_within as get;

fn go_tool_pprof_top(profile: &std::path::Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=500"])
        .arg(profile)
        .env("HOME", profile.parent().unwrap())
        .output()
        .expect("go tool pprof runs (Debian golang-go, scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn a_profile_under_agent_check_load_names_the_agents_functions() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let clients = check_load(agent.listen, 2, &stop);

    let (status, head, body) = get(
        agent.http,
        "/debug/pprof/profile?seconds=3",
        Duration::from_secs(30),
    )
    .expect("a profile");
    stop.store(true, Ordering::Relaxed);
    let answered: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(status, 200, "{head}\n{}", String::from_utf8_lossy(&body));
    assert!(answered > 100, "only {answered} agent-checks answered");

    let dir = TempDir::new("pprof");
    let file = dir.path().join("cpu.pb");
    std::fs::write(&file, &body).unwrap();
    let top = go_tool_pprof_top(&file);
    assert!(top.contains("Type: cpu"), "{top}");
    assert!(
        top.contains("gitlab_haproxy_agent::agent::responder"),
        "the agent-check path is not in the profile:\n{top}"
    );
    assert!(
        agent
            .metrics()
            .contains("gitlab_haproxy_agent_profiles_total{outcome=\"ok\"} 1"),
        "{}",
        agent.metrics()
    );
}

#[test]
fn one_profile_at_a_time_for_a_bounded_time_and_a_flame_graph() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let http = agent.http;

    for bad in ["seconds=0", "seconds=61", "seconds=ten"] {
        let (status, _, body) = get(
            http,
            &format!("/debug/pprof/profile?{bad}"),
            Duration::from_secs(5),
        )
        .expect("an answer");
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let clients = check_load(agent.listen, 1, &stop);
    let first = std::thread::spawn(move || {
        get(
            http,
            "/debug/pprof/flamegraph?seconds=8",
            Duration::from_secs(30),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let (status, head, _) = get(
        http,
        "/debug/pprof/profile?seconds=1",
        Duration::from_secs(5),
    )
    .expect("an answer");
    assert_eq!(status, 409, "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
    // At once, not once the first profile is done (7.5 s later): a
    // bound with room for a loaded machine, where the profiler's signals
    // and other work slow every answer.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "409 after {:?}",
        started.elapsed()
    );
    // Other endpoints are served meanwhile.
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);

    let (status, head, svg) = first.join().unwrap().expect("the flame graph");
    stop.store(true, Ordering::Relaxed);
    clients.into_iter().for_each(|c| drop(c.join()));
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("image/svg+xml"), "{head}");
    let svg = String::from_utf8_lossy(&svg);
    assert!(svg.contains("<svg"), "{svg}");
    assert!(
        svg.contains("gitlab_haproxy_agent::agent::responder"),
        "{svg}"
    );

    let metrics = agent.metrics();
    for (outcome, n) in [("ok", 1), ("busy", 1), ("bad_request", 3)] {
        let line = format!("gitlab_haproxy_agent_profiles_total{{outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "no {line}:\n{metrics}");
    }
}

/// Holds `n` idle connections to `addr`: half never send a byte, half sent
/// one complete keep-alive request and then stay idle. Every 250 ms, any
/// the agent closed is opened again, as a client that reconnects would.
fn hold_idle(addr: SocketAddr, n: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let open = |i: usize| -> Option<TcpStream> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
            if i % 2 == 1 {
                let _ = write!(s, "GET /-/healthy HTTP/1.1\r\nHost: {addr}\r\n\r\n");
            }
            s.set_nonblocking(true).ok()?;
            Some(s)
        };
        support::hold_connections(n, open, &stop, Duration::from_millis(250))
    })
}

#[test]
fn two_hundred_idle_connections_do_not_lock_out_readiness_and_metrics() {
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let holder = hold_idle(agent.http, 200, stop.clone());
    std::thread::sleep(Duration::from_millis(500));

    // Like a kubelet probe (timeoutSeconds 1) and a scrape, over 6 s: three
    // header timeouts' worth of idle connections being closed and reopened.
    let bound = Duration::from_secs(1);
    let mut slowest = Duration::ZERO;
    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut asked = 0;
    while Instant::now() < deadline {
        for path in ["/-/ready", "/metrics"] {
            asked += 1;
            let t = Instant::now();
            match get(agent.http, path, bound) {
                Some((200, head, _)) => {
                    slowest = slowest.max(t.elapsed());
                    assert!(
                        head.to_ascii_lowercase().contains("connection: close"),
                        "one request per connection: {head}"
                    );
                }
                other => failures.push(format!(
                    "{path}: {:?} after {:?}",
                    other.map(|o| o.0),
                    t.elapsed()
                )),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let reopened = holder.join().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {asked} requests not answered within {bound:?} beside 200 idle connections, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(4)]
    );
    eprintln!(
        "{asked} requests beside 200 idle connections, slowest {slowest:?}; {reopened} reopened"
    );
    assert!(
        reopened >= 200,
        "the idle connections were not closed: {reopened} reopened"
    );
    let metrics = agent.metrics();
    let idle_closed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gitlab_haproxy_agent_http_idle_closed_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(idle_closed >= 100.0, "idle closes not counted:\n{metrics}");
}

/// With no `--http-listen` (nor its environment variable), a Prometheus
/// that reaches the node by an address other than 127.0.0.1 (here
/// 127.0.0.2, as a fleet's Prometheus reaches a node by its own address)
/// scrapes the agent on port 9778: `up` is 1 and the agent's metrics are
/// stored for that target; `/status` still answers a client on 127.0.0.1.
/// Run in a private network namespace, whose own loopback has port 9778
/// free. Fails while the default is 127.0.0.1:9778 (`up` 0 for the target).
#[test]
fn the_default_http_address_is_scraped_by_a_prometheus_beyond_127_0_0_1() {
    let name = "the_default_http_address_is_scraped_by_a_prometheus_beyond_127_0_0_1";
    if !netns::enter(
        &[name, "--exact", "--nocapture", "--test-threads=1"],
        Duration::from_secs(120),
    ) {
        return;
    }
    let consul = Consul::start();
    consul.put("canary", "drain");
    let dir = TempDir::new("agent");
    let mut cmd = Command::new(AGENT_BIN);
    // env_clear: no GITLAB_HAPROXY_AGENT_HTTP_LISTEN from this environment.
    cmd.env_clear()
        .env("RUST_LOG", "info")
        .arg("--consul-addr")
        .arg(consul.url())
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .args(["--wait", "5s", "--log-format", "text"]);
    let agent = Proc::spawn(cmd, dir.path().join("agent.log"));

    let target = SocketAddr::from(([127, 0, 0, 2], 9778));
    let prometheus = Prometheus::start(&[target]);
    let scraped = prometheus.wait_until(
        Duration::from_secs(30),
        &format!("up{{job=\"{JOB}\",instance=\"{target}\"}}"),
        1,
        |v| v == 1.0,
    );
    assert!(
        scraped,
        "Prometheus did not scrape the agent at {target}: up = {:?}\nagent:\n{}",
        prometheus.values(&format!("up{{instance=\"{target}\"}}")),
        agent.log()
    );
    let synced = prometheus.wait_until(
        Duration::from_secs(15),
        &format!("gitlab_haproxy_agent_consul_index{{instance=\"{target}\"}}"),
        1,
        |v| v > 0.0,
    );
    assert!(synced, "no agent metric stored for {target}");

    let local = SocketAddr::from(([127, 0, 0, 1], 9778));
    let status = get(local, "/status", Duration::from_secs(5));
    let (code, head, body) = status.expect("/status answers on 127.0.0.1:9778");
    assert_eq!(code, 200, "{head}");
    assert!(String::from_utf8_lossy(&body).contains("canary"), "{head}");
}

/// Istio's sidecar hands every inbound connection to the application from
/// 127.0.0.6, and a node-local proxy from whatever 127.x address it binds:
/// neither is the node's operator. From 127.0.0.6 and 127.0.0.2 the real
/// agent refuses `/status` and `/debug/pprof/` with 403 and a one-line
/// reason, counted in `gitlab_haproxy_agent_http_forbidden_total`, while
/// `/metrics` and the probes answer; from 127.0.0.1 `/status` answers.
/// Fails while every address of 127.0.0.0/8 counts as local (200).
#[test]
fn a_mesh_sidecars_address_gets_metrics_and_probes_but_not_status_or_profiles() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    let bound = Duration::from_secs(5);
    let mut refused = 0;
    for source in [Ipv4Addr::new(127, 0, 0, 6), Ipv4Addr::new(127, 0, 0, 2)] {
        let source = IpAddr::V4(source);
        for (path, want) in [
            ("/metrics", 200),
            ("/-/healthy", 200),
            ("/-/ready", 200),
            ("/-/answering", 200),
            ("/status", 403),
            ("/debug/pprof/profile?seconds=1", 403),
            ("/debug/pprof/flamegraph?seconds=1", 403),
        ] {
            let (status, head, body) = get_from(source, agent.http, path, bound)
                .unwrap_or_else(|| panic!("no answer to {path} from {source}"));
            let body = String::from_utf8_lossy(&body);
            assert_eq!(status, want, "{path} from {source}: {head}\n{body}");
            if want == 403 {
                refused += 1;
                assert_eq!(body.lines().count(), 1, "{body}");
                assert!(
                    body.contains("127.0.0.1 and ::1") && body.contains(&source.to_string()),
                    "{body}"
                );
                assert!(!body.contains("canary"), "{body}");
            }
        }
    }
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let (status, head, body) = get_from(local, agent.http, "/status", bound).expect("/status");
    assert_eq!(status, 200, "{head}");
    assert!(String::from_utf8_lossy(&body).contains("canary"), "{head}");
    assert_eq!(
        agent.metric("gitlab_haproxy_agent_http_forbidden_total"),
        f64::from(refused)
    );
}
