//! The exact sd_notify sequence on a real NOTIFY_SOCKET: nothing that says
//! READY before the first Consul sync, READY after, WATCHDOG pings while
//! healthy, STOPPING on SIGTERM.

mod support;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use support::{free_port, Agent, Consul, TempDir};

/// Reads every datagram that arrives within `within`.
fn drain(socket: &UnixDatagram, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match socket.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).to_string()),
            Err(_) => break,
        }
    }
    out
}

/// Reads datagrams until one satisfies `want`, for at most `within`.
fn until(socket: &UnixDatagram, within: Duration, want: impl Fn(&str) -> bool) -> Vec<String> {
    try_until(socket, within, want)
        .unwrap_or_else(|seen| panic!("no matching notification within {within:?}; got {seen:?}"))
}

/// Reads datagrams until one satisfies `want`, for at most `within`: all
/// read, or (as the error) all read when none did.
fn try_until(
    socket: &UnixDatagram,
    within: Duration,
    want: impl Fn(&str) -> bool,
) -> Result<Vec<String>, Vec<String>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok(n) = socket.recv(&mut buf) else { break };
        let msg = String::from_utf8_lossy(&buf[..n]).to_string();
        let done = want(&msg);
        seen.push(msg);
        if done {
            return Ok(seen);
        }
    }
    Err(seen)
}

#[test]
fn notifies_ready_only_after_first_sync_then_watchdog_then_stopping() {
    let dir = TempDir::new("notify");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let consul_port = free_port();
    let mut agent = Agent::spawn_env(
        &format!("http://127.0.0.1:{consul_port}"),
        free_port(),
        free_port(),
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "1000000"),
        ],
        &["--startup-timeout", "60s"],
    );

    // Consul held back: the agent says what it is doing (within about
    // 30 ms of its start when the machine is idle; the bound is for a
    // loaded one), then keeps retrying, never READY.
    let started = Instant::now();
    let mut early = try_until(&socket, Duration::from_secs(20), |m| {
        m.contains("STATUS=Consul reads failing")
    })
    .unwrap_or_else(|seen| {
        panic!(
            "no STATUS of failing reads within 20 s; got {seen:?}; agent exited: {:?}; log:\n{}",
            agent.proc().try_wait(),
            agent.log()
        )
    });
    let said = started.elapsed();
    early.extend(drain(&socket, Duration::from_millis(1500)));
    eprintln!("first STATUS {said:?} after the agent was started");
    assert!(
        early.iter().all(|m| !m.lines().any(|l| l == "READY=1")),
        "{early:?}"
    );
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 503);

    let _consul = Consul::start_on(consul_port, &[]);
    let seen = until(&socket, Duration::from_secs(20), |m| {
        m.lines().any(|l| l == "READY=1")
    });
    let ready = seen.last().unwrap();
    assert!(ready.contains("STATUS=synced, "), "{ready}");
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 200);

    // Watchdog pings every half WATCHDOG_USEC (0.5 s) while both loops
    // beat: at least two in 3 s, however loaded the machine.
    let after = drain(&socket, Duration::from_secs(3));
    let pings = after
        .iter()
        .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
        .count();
    assert!(pings >= 2, "{after:?}");

    agent.proc().signal("TERM");
    until(&socket, Duration::from_secs(5), |m| {
        m.lines().any(|l| l == "STOPPING=1")
    });
    let status = agent
        .proc()
        .wait_exit(Duration::from_secs(10))
        .expect("exits");
    assert!(status.success());
}

/// While the first read is retried (Consul down, backoff growing past the
/// watchdog's half period), the agent keeps pinging: a start-up timeout
/// longer than `WatchdogSec=` must end in exit 1, not in SIGABRT.
#[test]
fn watchdog_keeps_beating_while_the_first_read_is_retried() {
    let dir = TempDir::new("notify-retry");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    // Nothing listens on this port: every try is refused at once, and the
    // backoff reaches 4-8 s sleeps within the window watched.
    let consul_port = free_port();
    let mut agent = Agent::spawn_env(
        &format!("http://127.0.0.1:{consul_port}"),
        free_port(),
        free_port(),
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "4000000"),
        ],
        &["--startup-timeout", "30s"],
    );
    let start = Instant::now();
    let mut last_ping = start;
    let mut longest = Duration::ZERO;
    let mut buf = [0u8; 4096];
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while start.elapsed() < Duration::from_secs(18) {
        if let Ok(n) = socket.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]);
            if msg.lines().any(|l| l == "WATCHDOG=1") {
                longest = longest.max(last_ping.elapsed());
                last_ping = Instant::now();
            }
        }
    }
    longest = longest.max(last_ping.elapsed());
    // Pings every 2 s (half of 4 s); systemd would kill after 4 s of
    // silence. Allow one late ping.
    assert!(
        longest < Duration::from_millis(3500),
        "watchdog silent for {longest:?} while retrying:\n{}",
        agent.log()
    );
    agent.proc().signal("TERM");
    agent
        .proc()
        .wait_exit(Duration::from_secs(10))
        .expect("exits");
}

/// An agent restarted with its state file while Consul is away answers from
/// the file at once, tells systemd READY (it serves what it would through
/// any Consul outage) while `/-/ready` stays 503, and outlives
/// `--startup-timeout` instead of exiting.
#[test]
fn a_restart_from_the_state_file_is_ready_to_systemd_without_consul() {
    let dir = TempDir::new("notify-state");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let consul_port = free_port();
    {
        let consul = Consul::start_on(consul_port, &[]);
        consul.put("canary", "drain");
        let mut first = Agent::spawn_env(
            &consul.url(),
            free_port(),
            free_port(),
            &[],
            &["--state-dir", state.to_str().unwrap()],
        );
        first.wait_ready();
        assert_eq!(first.ask("web/web-cny-01 canary"), "drain 100%\n");
        first.proc().signal("TERM");
        first
            .proc()
            .wait_exit(Duration::from_secs(10))
            .expect("exits");
    }
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let mut agent = Agent::spawn_env(
        &format!("http://127.0.0.1:{consul_port}"),
        free_port(),
        free_port(),
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
        &[
            "--state-dir",
            state.to_str().unwrap(),
            "--startup-timeout",
            "1s",
        ],
    );
    let seen = until(&socket, Duration::from_secs(10), |m| {
        m.lines().any(|l| l == "READY=1")
    });
    assert!(
        seen.last()
            .unwrap()
            .contains("STATUS=answering from the state file"),
        "{seen:?}"
    );
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    assert_eq!(agent.http_get("/-/ready").unwrap().0, 503);
    // Past --startup-timeout: still up, still answering.
    std::thread::sleep(Duration::from_secs(3));
    assert!(agent.proc().try_wait().is_none(), "{}", agent.log());
    assert_eq!(agent.ask("web/web-cny-01 canary"), "drain 100%\n");
    agent.proc().signal("TERM");
    agent
        .proc()
        .wait_exit(Duration::from_secs(10))
        .expect("exits");
}
