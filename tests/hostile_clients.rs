//! Both ports against broken and hostile clients on the node, and the CPU
//! profile's account of the time: clients that send one byte and stop,
//! clients that ask for a large `/status` and never read it, silent
//! connections at the agent-check cap, and a profiler whose temporary
//! directory was missing. Everything on 127.0.0.1, each test on its own
//! ports; every process is stopped by its PID when the test ends.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{check_load, Agent, Consul, TempDir};

/// Held by the tests that load the machine or measure CPU time, so they do
/// not run beside each other (a profile's account of the CPU time degrades
/// when the machine is overloaded).
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a probe may take: well under the kubelet's 1 s timeout.
const PROBE_BOUND: Duration = Duration::from_millis(100);

/// One GET with `Connection: close`: (status, body), or `None` if no whole
/// answer came within `timeout`.
fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, Vec<u8>)> {
    support::get_within(addr, path, timeout).map(|(status, _, body)| (status, body))
}

/// Probes `/-/ready` and `/-/healthy` every 100 ms for `span`, each with a
/// 2 s timeout; returns each probe's latency, or `None` for a probe that
/// failed or timed out.
fn probe_for(addr: SocketAddr, span: Duration) -> Vec<(&'static str, Option<Duration>)> {
    let mut out = Vec::new();
    let end = Instant::now() + span;
    while Instant::now() < end {
        for path in ["/-/ready", "/-/healthy"] {
            let t = Instant::now();
            let ok = matches!(get(addr, path, Duration::from_secs(2)), Some((200, _)));
            out.push((path, ok.then(|| t.elapsed())));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out
}

/// Asserts that at least 95% of the probes answered within
/// [`PROBE_BOUND`] and every one within 1 s (a kubelet probe's timeout).
fn assert_probes_fast(probes: &[(&str, Option<Duration>)], beside: &str) {
    let slow: Vec<_> = probes
        .iter()
        .filter(|(_, d)| d.is_none_or(|d| d > PROBE_BOUND))
        .collect();
    let failed: Vec<_> = probes
        .iter()
        .filter(|(_, d)| d.is_none_or(|d| d > Duration::from_secs(1)))
        .collect();
    let slowest = probes.iter().filter_map(|(_, d)| *d).max();
    eprintln!(
        "{} probes beside {beside}: {} over {PROBE_BOUND:?}, slowest {slowest:?}",
        probes.len(),
        slow.len()
    );
    assert!(
        failed.is_empty() && slow.len() * 20 <= probes.len(),
        "probes beside {beside}: {} of {} over {PROBE_BOUND:?}, {} over 1 s or failed, e.g. {:?}",
        slow.len(),
        probes.len(),
        failed.len(),
        &slow[..slow.len().min(4)]
    );
}

/// `n` clients that each send `bytes` and then nothing; one the agent
/// closes connects again at once (at most every 20 ms per client). Returns
/// how many connections were made in all.
fn stallers(
    addr: SocketAddr,
    n: usize,
    bytes: &'static [u8],
    stop: &Arc<AtomicBool>,
) -> JoinHandle<usize> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let open = |_| -> Option<TcpStream> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
            s.write_all(bytes).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        };
        n + support::hold_connections(n, open, &stop, Duration::from_millis(20))
    })
}

#[test]
fn one_byte_clients_do_not_delay_probes() {
    let _heavy = heavy();
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    // Twice the serving slots, each sending the first byte of a request.
    let clients = stallers(agent.http, 128, b"G", &stop);
    std::thread::sleep(Duration::from_millis(300));
    // Over 3 s: one and a half request timeouts, so the clients are closed
    // and come back meanwhile.
    let probes = probe_for(agent.http, Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let made = clients.join().unwrap();
    assert_probes_fast(&probes, "128 one-byte clients");
    assert!(made >= 256, "the one-byte clients were not closed: {made}");
    assert!(agent.metric("gitlab_haproxy_agent_http_idle_closed_total") >= 128.0);
}

/// `n` unique agent-send lines of about 1,000 bytes, each asked once, so
/// that `/status` lists them all (about `n` KB).
fn ask_long_lines(agent: &Agent, n: usize) {
    let pad = |c: char, i: usize| format!("{c}{i:06}-{}", "x".repeat(240));
    for i in 0..n {
        let line = format!(
            "web/{} {} {} {}\n",
            pad('s', i),
            pad('a', i),
            pad('b', i),
            pad('c', i)
        );
        assert!(line.len() < 1024);
        let reply = support::ask_raw(agent.listen, line.as_bytes());
        assert_eq!(reply, "ready 100%\n");
    }
}

#[test]
fn slow_readers_of_a_large_status_do_not_delay_probes() {
    let _heavy = heavy();
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    ask_long_lines(&agent, 6_000);
    let (status, body) = get(agent.http, "/status", Duration::from_secs(10)).expect("/status");
    assert_eq!(status, 200);
    assert!(body.len() > 6_000_000, "/status is {} bytes", body.len());

    // 64 clients ask for /status with a small receive buffer and never read.
    let readers: Vec<TcpStream> = (0..64)
        .map(|_| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.connect_timeout(&agent.http.into(), Duration::from_secs(2))
                .unwrap();
            let mut s: TcpStream = sock.into();
            write!(s, "GET /status HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let probes = probe_for(agent.http, Duration::from_secs(3));
    assert_probes_fast(&probes, "64 slow readers of a 6 MB /status");
    drop(readers);
}

#[test]
fn at_the_connection_cap_silent_connections_make_room_for_checks() {
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &["--max-connections", "4"]);
    for round in 0..5 {
        let silent: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(agent.listen).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // A check that sends its line right after connecting: accepted
        // before the line is there, so it needs a slot to wait in.
        let mut check = TcpStream::connect(agent.listen).unwrap();
        check
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        check.write_all(b"web/web-01 canary\n").unwrap();
        let mut reply = String::new();
        let _ = check.read_to_string(&mut reply);
        assert_eq!(reply, "drain 100%\n", "round {round}");
        drop(silent);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(agent.metric("gitlab_haproxy_agent_connections_refused_total") >= 5.0);
}

/// Run time of a process so far (all threads, user and system), the exact
/// sum of `/proc/PID/task/*/schedstat`.
fn cpu_time(pid: u32) -> Duration {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("schedstat");
        if let Ok(text) = std::fs::read_to_string(path) {
            ns += text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

/// The CPU time in `readings` at `at`, interpolated between the readings
/// around it.
fn cpu_at(readings: &[(SystemTime, Duration)], at: SystemTime) -> Duration {
    let after = readings
        .iter()
        .position(|(t, _)| *t >= at)
        .unwrap_or_else(|| panic!("no CPU reading after {at:?}"));
    assert!(after > 0, "no CPU reading before {at:?}");
    let ((t0, c0), (t1, c1)) = (readings[after - 1], readings[after]);
    let span = t1.duration_since(t0).unwrap().as_secs_f64();
    let part = at.duration_since(t0).unwrap().as_secs_f64() / span.max(1e-9);
    c0 + (c1 - c0).mul_f64(part.clamp(0.0, 1.0))
}

/// When a profile's sampling began and how long it ran, from `go tool
/// pprof -raw` ("Time: 2026-12-01 15:10:46.56141942 +0000 UTC",
/// "Duration: 3.00").
fn profile_window(profile: &[u8]) -> (SystemTime, Duration) {
    let dir = TempDir::new("pprof-raw");
    let file = dir.path().join("cpu.pb");
    std::fs::write(&file, profile).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&file)
        .env("HOME", dir.path())
        .output()
        .expect("go tool pprof runs");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |name: &str| {
        raw.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in\n{raw}"))
            .trim()
            .to_string()
    };
    let time = field("Time:");
    let length = Duration::from_secs_f64(field("Duration:").parse().unwrap());
    // "YYYY-MM-DD HH:MM:SS.fraction +0000 UTC"
    let mut parts = time.split_whitespace();
    let (date, clock) = (parts.next().unwrap(), parts.next().unwrap());
    assert_eq!(parts.next(), Some("+0000"), "{time}");
    let d: Vec<i64> = date.split('-').map(|v| v.parse().unwrap()).collect();
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, "0"));
    let t: Vec<u64> = hms.split(':').map(|v| v.parse().unwrap()).collect();
    let nanos: u32 = format!("{fraction:0<9}")[..9].parse().unwrap();
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
    // days_from_civil).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe - 719_468) as u64;
    let secs = days * 86_400 + t[0] * 3_600 + t[1] * 60 + t[2];
    (UNIX_EPOCH + Duration::new(secs, nanos), length)
}

/// `go tool pprof -top`'s "Total samples" of a profile.
fn total_samples(profile: &[u8]) -> (Duration, String) {
    let dir = TempDir::new("pprof");
    let file = dir.path().join("cpu.pb");
    std::fs::write(&file, profile).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=500"])
        .arg(&file)
        .env("HOME", dir.path())
        .output()
        .expect("go tool pprof runs (Debian golang-go, scripts/install-deps.sh)");
    let top = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{top}");
    let total = top
        .split("Total samples = ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no total in\n{top}"));
    let (number, unit) = total.split_at(total.find(|c: char| c.is_alphabetic()).unwrap());
    let number: f64 = number.parse().unwrap();
    let secs = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "us" => number / 1e6,
        other => panic!("unit {other} in\n{top}"),
    };
    (Duration::from_secs_f64(secs), top)
}

#[test]
fn the_profile_accounts_for_the_cpu_time_the_agent_used() {
    let _heavy = heavy();
    let consul = Consul::start();
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let clients = check_load(agent.listen, 2, &stop);
    std::thread::sleep(Duration::from_millis(500));

    // The agent's CPU time, read every 5 ms around the profile, so it can
    // be read over exactly the profile's window (its start and length are
    // in the profile).
    let pid = agent.pid();
    let done = Arc::new(AtomicBool::new(false));
    let readings = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            // Bounded: the profile request times out after 60 s.
            let end = Instant::now() + Duration::from_secs(70);
            while !done.load(Ordering::Relaxed) && Instant::now() < end {
                out.push((SystemTime::now(), cpu_time(pid)));
                std::thread::sleep(Duration::from_millis(5));
            }
            out
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let (status, body) = get(
        agent.http,
        "/debug/pprof/profile?seconds=5",
        Duration::from_secs(60),
    )
    .expect("a profile");
    done.store(true, Ordering::Relaxed);
    let readings = readings.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let answered: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(answered > 100, "only {answered} agent-checks answered");

    let (sampled, top) = total_samples(&body);
    let (start, length) = profile_window(&body);
    let used = cpu_at(&readings, start + length) - cpu_at(&readings, start);
    eprintln!(
        "agent used {used:?} of CPU over the profile's {length:?}; it shows {sampled:?}\n{top}"
    );
    // The profiler samples on SIGPROF from setitimer(ITIMER_PROF), whose
    // clock the kernel advances by whole ticks charged to the thread
    // running at each tick, while the reference here is the exact run time.
    // On an overloaded machine (more runnable tasks than twice the cores)
    // the two drift apart: measured on 2 cores at a 1-minute load average of
    // 8 to 12, the profile showed 62% to 100% of the exact time, run to run.
    // The defect this guards against (samples in libc dropped) showed 1% to
    // 12% at any load, so 60% still tells them apart.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let load: f64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let share = if load > 2.0 * cores { 0.6 } else { 0.9 };
    eprintln!("1-minute load average {load} on {cores} cores: at least {share} required");
    assert!(
        sampled.as_secs_f64() >= share * used.as_secs_f64(),
        "the profile shows {sampled:?} of the {used:?} the agent used (load average {load}):\n{top}"
    );
    assert!(
        top.contains("gitlab_haproxy_agent::agent::responder"),
        "{top}"
    );
}

#[test]
fn the_profiler_recovers_once_its_temporary_directory_is_there() {
    let consul = Consul::start();
    let dir = TempDir::new("profile-tmp");
    let tmp = dir.path().join("missing");
    let tmp_str = tmp.to_str().unwrap().to_string();
    let agent = Agent::spawn_env(
        &consul.url(),
        support::free_port(),
        support::free_port(),
        &[("TMPDIR", &tmp_str)],
        &[],
    );
    agent.wait_ready();
    let (status, body) = get(
        agent.http,
        "/debug/pprof/profile?seconds=1",
        Duration::from_secs(20),
    )
    .expect("an answer");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 500, "{body}");
    assert!(
        agent
            .metrics()
            .contains("gitlab_haproxy_agent_profiles_total{outcome=\"failed\"} 1"),
        "{}",
        agent.metrics()
    );

    std::fs::create_dir(&tmp).unwrap();
    for format in ["profile", "flamegraph"] {
        let (status, answer) = get(
            agent.http,
            &format!("/debug/pprof/{format}?seconds=1"),
            Duration::from_secs(20),
        )
        .expect("an answer");
        assert_eq!(
            status,
            200,
            "{format}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert!(
        body.contains(&tmp_str),
        "the 500 does not name the directory: {body}"
    );
}
