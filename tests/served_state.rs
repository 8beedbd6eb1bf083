//! The served state against a real Consul and a real HAProxy: what the agent
//! answers is kept across its own restarts (`--state-dir`), an invalid key
//! with no valid value known is skipped, a key hidden by the token's policy
//! is held, a store that lost its data is recognised whatever its index
//! (the `~store-id` marker), and the watchdog keeps beating while the reads
//! that confirm an answer are slow (the fake Consul, which can slow them on
//! demand).
//!
//! Each test is one way a drained server once went back into rotation.

mod fake_consul;
mod support;

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fake_consul::FakeConsul;
use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, ServerState, TempDir,
    AGENT_BIN, PREFIX,
};

const MASTER: &str = "3e9d1f27-8b4a-4c6e-a5d2-91f0c7b3e812";

/// `agent-inter` of every server, milliseconds.
const INTER_MS: u64 = 200;

/// The agent's flags for a state directory.
fn state_dir_args(dir: &Path) -> Vec<String> {
    vec!["--state-dir".into(), dir.to_str().unwrap().into()]
}

/// A random store id, as the writer creates it.
fn store_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// Writes the store marker `~store-id` as the writer does before its first
/// write (`cas=0`: only if absent).
fn write_store_marker(consul: &Consul) {
    let (status, _, body) = consul.request(
        "PUT",
        &format!("/v1/kv/{PREFIX}~store-id?cas=0"),
        store_id().as_bytes(),
    );
    assert_eq!((status, body.trim_ascii()), (200, &b"true"[..]));
}

/// A HAProxy with backend `web` whose servers ask the agent on `port` with
/// the given agent-send identities.
fn haproxy(port: u16, servers: &[(&str, &[&str])]) -> Haproxy {
    let mut backend = String::from("backend web\n");
    for (server, ids) in servers {
        backend.push_str(&server_line("web", server, ids, port, INTER_MS));
    }
    Haproxy::start(&haproxy_config(&backend))
}

fn args<'a>(owned: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    owned
        .iter()
        .map(String::as_str)
        .chain(more.iter().copied())
        .collect()
}

/// Asks `line` every 100 ms for `during`; every answer must be `want`.
fn keeps_answering(agent: &Agent, line: &str, want: &str, during: Duration) {
    let until = Instant::now() + during;
    while Instant::now() < until {
        let got = agent.ask(line);
        assert_eq!(got, want, "{line:?}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads the server every 50 ms for `during`; `cond` must hold each time.
fn server_stays(
    haproxy: &Haproxy,
    server: &str,
    what: &str,
    during: Duration,
    cond: impl Fn(&ServerState) -> bool,
) {
    let until = Instant::now() + during;
    while Instant::now() < until {
        let row = haproxy.server("web", server);
        assert!(cond(&row), "web/{server} is not {what}: {row:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status(agent: &Agent) -> serde_json::Value {
    let (code, body) = agent.http_get("/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits up to 20 s until `/status` shows `key` held with `cause`.
fn wait_held(agent: &Agent, key: &str, cause: &str) {
    let ok = wait_for(Duration::from_secs(20), || {
        (status(agent)["held"][key]["cause"] == cause).then_some(())
    });
    assert!(
        ok.is_some(),
        "{key} not held as {cause}: {}\n{}",
        status(agent),
        agent.log()
    );
}

/// `state ARGS --consul-addr URL` with the writer CLI: (exit code, stdout
/// and stderr).
fn writer(consul_url: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(AGENT_BIN)
        .env_clear()
        // Writes that take servers out need a reason (tests/drain_records.rs
        // tests that and the records); the environment's default gives it.
        .env("GITLAB_HAPROXY_AGENT_REASON", "test")
        .arg("state")
        .args(args)
        .args(["--consul-addr", consul_url])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Path 1 (a): Consul comes back without its data (a `-dev` restart) while
/// the agent holds `canary` = drain and `web/s5` = maint as rolled back;
/// then the agent restarts with the same state directory. It must keep
/// answering drain and maint, before and after a HAProxy reload.
#[test]
fn rolled_back_holds_survive_an_agent_restart() {
    let mut consul = Consul::start();
    write_store_marker(&consul);
    consul.put("canary", "drain");
    consul.put("web/s5", "maint");
    // Move the index well past where a restarted dev Consul starts, so the
    // index going backwards tells the loss too.
    for i in 0..10 {
        consul.put("web/s9", if i % 2 == 0 { "drain" } else { "ready" });
    }
    let state = TempDir::new("served-state");
    let dir_args = state_dir_args(state.path());
    let (port, http_port) = (free_port(), free_port());
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"]), ("s5", &["web/s5"])]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_drain);
    haproxy.wait_server("web", "s5", Duration::from_secs(10), ServerState::is_maint);

    consul.restart();
    wait_held(&agent, "canary", "rolled_back");
    wait_held(&agent, "web/s5", "rolled_back");
    assert_eq!(agent.ask("web/s1 canary"), "drain 100%\n");
    assert_eq!(agent.ask("web/s5"), "maint 100%\n");

    // An upgrade restarts the agent: same state directory.
    let mut agent = agent;
    assert!(agent.terminate().is_some_and(|s| s.success()));
    drop(agent);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    keeps_answering(
        &agent,
        "web/s1 canary",
        "drain 100%\n",
        Duration::from_secs(2),
    );
    assert_eq!(agent.ask("web/s5"), "maint 100%\n", "{}", agent.log());
    wait_held(&agent, "canary", "rolled_back");
    server_stays(&haproxy, "s1", "DRAIN", Duration::from_secs(1), |r| {
        r.is_drain()
    });
    server_stays(&haproxy, "s5", "MAINT", Duration::from_secs(1), |r| {
        r.is_maint()
    });
    haproxy.reload();
    haproxy.wait_server("web", "s1", Duration::from_secs(5), ServerState::is_drain);
    haproxy.wait_server("web", "s5", Duration::from_secs(5), ServerState::is_maint);
    server_stays(&haproxy, "s1", "DRAIN", Duration::from_secs(2), |r| {
        r.is_drain()
    });
    server_stays(&haproxy, "s5", "MAINT", Duration::from_secs(2), |r| {
        r.is_maint()
    });
}

/// Path 1 (b): `web/s1` = maint, then `mantenance`: the agent holds maint;
/// it is killed and restarted with the same state directory, and HAProxy
/// reloads (so only a maint answer keeps s1 out). s1 stays MAINT.
#[test]
fn an_invalid_value_hold_survives_an_agent_restart_and_a_reload() {
    let consul = Consul::start();
    write_store_marker(&consul);
    consul.put("web/s1", "maint");
    let state = TempDir::new("served-state");
    let dir_args = state_dir_args(state.path());
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1"])]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_maint);

    consul.put("web/s1", "mantenance");
    wait_held(&agent, "web/s1", "invalid_value");
    assert_eq!(agent.ask("web/s1"), "maint 100%\n");

    // The watchdog, the OOM killer or a reboot: no goodbye.
    agent.proc().kill();
    drop(agent);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    keeps_answering(&agent, "web/s1", "maint 100%\n", Duration::from_secs(1));
    haproxy.reload();
    haproxy.wait_server("web", "s1", Duration::from_secs(5), ServerState::is_maint);
    server_stays(&haproxy, "s1", "MAINT", Duration::from_secs(2), |r| {
        r.is_maint()
    });
    wait_held(&agent, "web/s1", "invalid_value");
}

/// Path 2: `canary` = drain and the first value ever written to `web/s1`
/// is `mantenance`. The invalid row key, with no valid value to hold, is
/// skipped: `canary` decides. On a line with no later identity there is no
/// answer. The key stays flagged on `/status`.
#[test]
fn an_invalid_key_with_no_valid_value_is_skipped_for_the_next_identity() {
    let consul = Consul::start();
    write_store_marker(&consul);
    consul.put("canary", "drain");
    consul.put("web/s1", "mantenance");
    let (port, http_port) = (free_port(), free_port());
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &[]);
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"])]);

    agent.wait_answer("web/s1 canary", "drain 100%\n");
    assert_eq!(agent.ask("web/s1"), "", "{}", agent.log());
    assert!(
        status(&agent)["invalid"]["web/s1"].is_object(),
        "{}",
        status(&agent)
    );
    haproxy.wait_server("web", "s1", Duration::from_secs(5), ServerState::is_drain);
    haproxy.reload();
    haproxy.wait_server("web", "s1", Duration::from_secs(5), ServerState::is_drain);
    server_stays(&haproxy, "s1", "DRAIN", Duration::from_secs(2), |r| {
        r.is_drain()
    });
}

/// Path 3: the token keeps `key_prefix ".../state/" read` and gains `key
/// ".../state/canary" deny`. Recursive reads now leave `canary` out, as a
/// delete would; a direct read of it is a 403. After unrelated writes
/// `canary` still answers drain, held as `hidden`.
#[test]
fn a_key_denied_to_the_token_is_held_as_hidden() {
    let consul = Consul::start_acl(MASTER);
    let read = format!(r#"key_prefix "{PREFIX}" {{ policy = "read" }}"#);
    let policy = consul.put_policy("agent-read", &read);
    let dir = TempDir::new("token");
    let token_file = dir.path().join("consul-token");
    std::fs::write(&token_file, token_for(&consul, "agent-read")).unwrap();

    let (status_code, _, _) = consul.request(
        "PUT",
        &format!("/v1/kv/{PREFIX}~store-id?cas=0"),
        store_id().as_bytes(),
    );
    assert_eq!(status_code, 200);
    consul.put("canary", "drain");
    consul.put("web/s2", "maint");
    let (port, http_port) = (free_port(), free_port());
    let agent = Agent::spawn_on(
        &consul.url(),
        port,
        http_port,
        &["--consul-token-file", token_file.to_str().unwrap()],
    );
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"])]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_drain);

    // The same policy, plus a deny on the one key.
    let rules = format!(r#"{read} key "{PREFIX}canary" {{ policy = "deny" }}"#);
    let body = serde_json::json!({"ID": policy, "Name": "agent-read", "Rules": rules});
    let (status_code, _, answer) = consul.request(
        "PUT",
        &format!("/v1/acl/policy/{policy}"),
        body.to_string().as_bytes(),
    );
    assert_eq!(status_code, 200, "{}", String::from_utf8_lossy(&answer));
    // A parked blocking query keeps the authorizer it started with: the
    // first write may still show `canary`, the second cannot.
    consul.put("web/s2", "drain");
    agent.wait_answer("web/s2", "drain 100%\n");
    consul.put("web/s3", "50%");
    agent.wait_answer("web/s3", "ready 50%\n");
    keeps_answering(
        &agent,
        "web/s1 canary",
        "drain 100%\n",
        Duration::from_secs(2),
    );
    wait_held(&agent, "canary", "hidden");
    server_stays(&haproxy, "s1", "DRAIN", Duration::from_secs(1), |r| {
        r.is_drain()
    });
}

/// A TCP relay on loopback that forwards each new connection to a target
/// that can be switched, so one Consul can be replaced by another at the
/// same address only once the new one is ready. Counts the connections made
/// to each target.
struct Relay {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    connections: Arc<Mutex<HashMap<SocketAddr, usize>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let connections = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, c, s) = (target.clone(), connections.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => continue,
                };
                let to = *t.lock().unwrap();
                let Ok(upstream) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) else {
                    continue;
                };
                *c.lock().unwrap().entry(to).or_insert(0) += 1;
                let _ = client.set_nonblocking(false);
                pipe(client, upstream);
            }
        });
        Relay {
            addr,
            target,
            connections,
            stop,
            handle: Some(handle),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn switch(&self, to: SocketAddr) {
        *self.target.lock().unwrap() = to;
    }

    fn connections_to(&self, to: SocketAddr) -> usize {
        self.connections
            .lock()
            .unwrap()
            .get(&to)
            .copied()
            .unwrap_or(0)
    }
}

/// Copies both ways; when either side ends, both connections are shut.
fn pipe(a: TcpStream, b: TcpStream) {
    let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    let one_way = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    };
    one_way(a, b);
    one_way(b2, a2);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Path 4: the copy has `canary` = drain and the store marker; Consul is
/// replaced by an empty store whose KV index is already higher (other
/// services wrote to it first). The missing marker tells the loss: `canary`
/// stays drain (held as rolled back), also after a write under the prefix,
/// until `state release-rollback`.
#[test]
fn a_store_rebuilt_at_a_higher_index_is_recognised_by_its_marker() {
    let mut old = Consul::start();
    write_store_marker(&old);
    old.put("canary", "drain");
    let relay = Relay::start(old.addr());
    let (port, http_port) = (free_port(), free_port());
    let agent = Agent::spawn_on(&relay.url(), port, http_port, &[]);
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"])]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_drain);
    let copy_index = old.prefix_index();

    let rebuilt = Consul::start();
    for i in 0.. {
        if rebuilt.prefix_index() > copy_index + 10 {
            break;
        }
        let (code, _, _) = rebuilt.request("PUT", "/v1/kv/other/x", i.to_string().as_bytes());
        assert_eq!(code, 200);
        assert!(i < 1000, "the rebuilt store's index does not move");
    }
    assert!(rebuilt.prefix_index() > copy_index);
    relay.switch(rebuilt.addr());
    old.stop();
    // The blocking query parked on the old Consul dies with it; the agent
    // reads the rebuilt one.
    let reached = wait_for(Duration::from_secs(20), || {
        (relay.connections_to(rebuilt.addr()) > 0).then_some(())
    });
    assert!(reached.is_some(), "the agent never read the rebuilt store");
    std::thread::sleep(Duration::from_millis(500));
    keeps_answering(
        &agent,
        "web/s1 canary",
        "drain 100%\n",
        Duration::from_secs(2),
    );
    wait_held(&agent, "canary", "rolled_back");
    server_stays(&haproxy, "s1", "DRAIN", Duration::from_secs(1), |r| {
        r.is_drain()
    });

    // A write under the prefix on the rebuilt store: followed, and still
    // no marker, so `canary` stays held.
    rebuilt.put("web/s7", "drain");
    agent.wait_answer("web/s7", "drain 100%\n");
    assert_eq!(agent.ask("web/s1 canary"), "drain 100%\n");

    let (code, out) = writer(&relay.url(), &["release-rollback"]);
    assert_eq!(code, 0, "{out}");
    agent.wait_answer("web/s1 canary", "ready 100%\n");
    haproxy.wait_server("web", "s1", Duration::from_secs(5), |r| {
        r.is_ready_full_weight()
    });
}

/// Reads notifications until `deadline`; returns the times of the
/// `WATCHDOG=1` ones and whether `READY=1` came (and when).
fn watch_notifications(
    socket: &UnixDatagram,
    deadline: Instant,
    pings: &mut Vec<Instant>,
    ready: &mut Option<Instant>,
) {
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let msg = String::from_utf8_lossy(&buf[..n]);
        if msg.lines().any(|l| l == "WATCHDOG=1") {
            pings.push(Instant::now());
        }
        if ready.is_none() && msg.lines().any(|l| l == "READY=1") {
            *ready = Some(Instant::now());
        }
    }
}

/// Path 5: once the agent is ready, every non-blocking read of a key, key
/// list or token takes 9 s, and of the whole prefix 4.5 s (within the 5 s
/// the agent gives such a read), and each succeeds; the watchdog is 20 s as
/// in the unit. Keys the agent holds are deleted, so answers lack them and
/// the agent reads them directly (ACLs on); while those reads are in flight
/// the `WATCHDOG=1` pings go on: no silence of 20 s.
#[test]
fn the_watchdog_keeps_beating_while_confirming_reads_are_slow() {
    let fake = FakeConsul::start(PREFIX, 10);
    fake.set_acl_enabled(true);
    fake.put("canary", b"drain");
    fake.put("web/s1", b"maint");
    fake.put("web/s2", b"drain");
    let dir = TempDir::new("served-state-watchdog");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let (port, http_port) = (free_port(), free_port());
    let agent = Agent::spawn_env(
        &fake.url(),
        port,
        http_port,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "20000000"),
        ],
        &["--startup-timeout", "60s"],
    );
    let haproxy = haproxy(port, &[("s1", &["web/s1", "canary"])]);

    let mut pings = Vec::new();
    let mut ready = None;
    let start = Instant::now();
    while ready.is_none() && start.elapsed() < Duration::from_secs(30) {
        watch_notifications(
            &socket,
            Instant::now() + Duration::from_millis(200),
            &mut pings,
            &mut ready,
        );
    }
    let ready = ready.unwrap_or_else(|| panic!("no READY=1 within 30 s:\n{}", agent.log()));
    haproxy.wait_server("web", "s1", Duration::from_secs(5), ServerState::is_maint);
    fake.set_slow_reads(
        Some(Duration::from_secs(9)),
        Some(Duration::from_millis(4500)),
    );

    // A change every 12 s for 48 s, then 12 s more: each answer lacks a key
    // the agent holds (or brings a new one).
    let first_change = Instant::now();
    let changes: [(&str, Option<&[u8]>); 4] = [
        ("web/s2", None),
        ("web/s1", None),
        ("web/s3", Some(b"drain")),
        ("canary", None),
    ];
    for (key, value) in changes {
        match value {
            Some(v) => fake.put(key, v),
            None => fake.delete(key),
        }
        watch_notifications(
            &socket,
            Instant::now() + Duration::from_secs(12),
            &mut pings,
            &mut Some(ready),
        );
    }
    watch_notifications(
        &socket,
        Instant::now() + Duration::from_secs(12),
        &mut pings,
        &mut Some(ready),
    );
    let end = Instant::now();

    let slow = fake.slow_reads();
    let reads: Vec<String> = slow
        .iter()
        .map(|r| {
            format!(
                "{:.1}s-{} {}",
                (r.at - ready).as_secs_f64(),
                r.answered_at.map_or("pending".into(), |a| format!(
                    "{:.1}s",
                    (a - ready).as_secs_f64()
                )),
                r.target
            )
        })
        .collect();
    let mut last = ready;
    let mut longest = (Duration::ZERO, ready);
    for &p in pings.iter().filter(|p| **p >= ready) {
        if p - last > longest.0 {
            longest = (p - last, last);
        }
        last = p;
    }
    if end - last > longest.0 {
        longest = (end - last, last);
    }
    assert!(
        longest.0 < Duration::from_secs(20),
        "no WATCHDOG=1 for {:?} from {:.1}s after READY (WatchdogSec 20 s); reads that took 9 s: {reads:#?}\n{}",
        longest.0,
        (longest.1 - ready).as_secs_f64(),
        agent.log()
    );
    // The changes did make the agent read slowly (else this proves
    // nothing), and the deletes were applied in the end.
    assert!(
        slow.iter()
            .any(|r| r.at >= first_change && r.answered_at.is_some()),
        "no slow read answered after the first change: nothing exercised; slow reads: {reads:#?}\n{}",
        agent.log()
    );
    // Reads fast again (a read in flight still takes its 9 s): on a loaded
    // machine the chain of 9 s direct reads after the last delete could
    // outlast any fixed wait.
    fake.set_slow_reads(None, None);
    agent.wait_answer("web/s1 canary", "ready 100%\n");
}

/// Moves the state folder `state` to `aside` and puts a file at its path,
/// which stops writes (no temporary file can be made in it, root too) and
/// reads (`ENOTDIR`).
fn block_folder(state: &Path, aside: &Path) {
    std::fs::rename(state, aside).unwrap();
    std::fs::write(state, "not a folder").unwrap();
}

/// Undoes [`block_folder`]: the folder back at its path, as it was.
fn unblock_folder(state: &Path, aside: &Path) {
    std::fs::remove_file(state).unwrap();
    std::fs::rename(aside, state).unwrap();
}

/// The state file's JSON.
fn saved_state(file: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

/// A state-file write fails (the disk full, the folder unwritable: here the
/// state folder is moved aside and a file put at its path, which stops root
/// too) while `web/s1` goes ready -> maint. The agent is killed and starts
/// again while Consul is down, from the file that still says ready (the
/// folder back in place): it answers nothing for s1 (HAProxy keeps it
/// MAINT) until Consul answers maint. A write that fails so is retried once
/// the folder is back, without a new change.
#[test]
fn a_lagging_state_file_keeps_drained_servers_out_and_its_write_is_retried() {
    let consul = Consul::start();
    write_store_marker(&consul);
    consul.put("web/s1", "ready");
    consul.put("web/s2", "drain");
    // The state folder inside a folder of the test's, so that it can be
    // moved aside.
    let root = TempDir::new("served-state");
    let state = root.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let dir_args = state_dir_args(&state);
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s1", &["web/s1"]), ("s2", &["web/s2"])]);
    haproxy.wait_server("web", "s2", Duration::from_secs(10), ServerState::is_drain);
    let file = state.join("served-state.json");
    assert!(std::fs::read_to_string(&file).unwrap().contains("web/s1"));

    // The folder's path taken by a file: no temporary file can be made in
    // it. `block` and `unblock` swap the folder and the file.
    let aside = root.path().join("aside");
    let block = || block_folder(&state, &aside);
    let unblock = || unblock_folder(&state, &aside);
    block();
    consul.put("web/s1", "maint");
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_maint);
    let behind = || agent.metric("gitlab_haproxy_agent_state_file_behind");
    assert_eq!(behind(), 1.0, "{}", agent.log());
    assert!(status(&agent)["state_file"]["write_error"].is_string());

    // No goodbye, and no Consul to come back to (an address where nothing
    // listens).
    agent.proc().kill();
    drop(agent);
    unblock();
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let mut agent = Agent::spawn_on(&nowhere, port, http_port, &args(&dir_args, &[]));
    let answering = wait_for(Duration::from_secs(10), || {
        (agent.http_get("/-/answering").map(|r| r.0) == Some(200)).then_some(())
    });
    assert!(answering.is_some(), "{}", agent.log());
    // The file's ready is withheld; its drain is answered.
    keeps_answering(&agent, "web/s1", "", Duration::from_secs(1));
    assert_eq!(agent.ask("web/s2"), "drain 100%\n");
    server_stays(&haproxy, "s1", "MAINT", Duration::from_secs(1), |r| {
        r.is_maint()
    });

    // Consul again: maint applies and is written.
    agent.proc().kill();
    drop(agent);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    agent.wait_answer("web/s1", "maint 100%\n");
    let behind = |want: f64| {
        wait_for(Duration::from_secs(15), || {
            (agent.metric("gitlab_haproxy_agent_state_file_behind") == want).then_some(())
        })
        .is_some()
    };
    assert!(behind(0.0), "{}", agent.log());
    // The next change's write fails (the folder's path taken again), and
    // is retried once the folder is back, with no change after it.
    block();
    consul.put("web/s2", "maint");
    agent.wait_answer("web/s2", "maint 100%\n");
    assert!(behind(1.0), "{}", agent.log());
    assert!(status(&agent)["state_file"]["write_error"].is_string());
    unblock();
    assert!(behind(0.0), "{}", agent.log());
    let saved = saved_state(&file);
    assert_eq!(saved["keys"]["web/s1"]["value"], "maint", "{saved}");
    assert_eq!(saved["keys"]["web/s2"]["value"], "maint", "{saved}");
    assert!(status(&agent)["state_file"]["write_error"].is_null());
}

/// A previous agent leaves a state file with `web/s1` = ready; the next one
/// starts while its state folder cannot be read (a file at its path), so
/// it knows no serial of it; s1 goes to maint; the folder comes back with
/// the old file. The agent must write maint over it (its serials come from
/// the clock, above the old file's), and the gauge `state_file_behind` may
/// read 0 only once the file holds maint. Restarted with Consul stopped, the
/// agent answers maint for s1 from the file.
#[test]
fn a_state_file_left_by_a_previous_agent_is_written_over_after_an_unreadable_start() {
    previous_agents_file_written_over(None);
}

/// As above, the previous agent's clock an hour ahead of this one's (or
/// stepped back since): its file's serial is above this agent's serials
/// from the clock. The agent finds the higher serial when it writes, and
/// writes the state served again above it.
#[test]
fn a_state_file_from_an_agent_whose_clock_ran_ahead_is_written_over_too() {
    let hour_ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        + 3_600_000_000;
    previous_agents_file_written_over(Some(u64::try_from(hour_ahead).unwrap()));
}

/// The two tests above: `serial`, when given, replaces the previous
/// agent's serial in its file.
fn previous_agents_file_written_over(serial: Option<u64>) {
    let mut consul = Consul::start();
    write_store_marker(&consul);
    consul.put("web/s1", "ready");
    let root = TempDir::new("served-state");
    let state = root.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let file = state.join("served-state.json");
    let dir_args = state_dir_args(&state);
    let (port, http_port) = (free_port(), free_port());

    // The previous agent: a few changes, so that its serial counted from 1
    // is above the next agent's first ones.
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    for weight in ["10%", "20%", "30%", "40%", "50%", "60%"] {
        consul.put("web/s2", weight);
        agent.wait_answer("web/s2", &format!("ready {weight}\n"));
    }
    assert!(agent.terminate().is_some_and(|s| s.success()));
    drop(agent);
    let mut old = saved_state(&file);
    assert_eq!(old["keys"]["web/s1"]["value"], "ready", "{old}");
    if let Some(serial) = serial {
        let text = std::fs::read_to_string(&file).unwrap();
        let (head, rest) = text.split_once(',').unwrap();
        assert!(head.starts_with("{\"serial\":"), "{text}");
        std::fs::write(&file, format!("{{\"serial\":{serial},{rest}")).unwrap();
        old = saved_state(&file);
    }
    let old_serial = old["serial"].as_u64().expect("a serial");

    // The next agent starts with the folder unreadable.
    let aside = root.path().join("aside");
    block_folder(&state, &aside);
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    agent.wait_ready();
    consul.put("web/s1", "maint");
    agent.wait_answer("web/s1", "maint 100%\n");
    let behind = || agent.metric("gitlab_haproxy_agent_state_file_behind");
    assert_eq!(behind(), 1.0, "{}", agent.log());

    // The folder back, with the previous agent's file: the retry (every
    // 5 s) writes maint over it; only then is the file not behind.
    unblock_folder(&state, &aside);
    let caught_up = wait_for(Duration::from_secs(20), || (behind() == 0.0).then_some(()));
    assert!(caught_up.is_some(), "{}", agent.log());
    let saved = saved_state(&file);
    assert_eq!(
        saved["keys"]["web/s1"]["value"], "maint",
        "state_file_behind is 0 while the file holds the previous agent's state (serial {old_serial}): {saved}\n{}",
        agent.log()
    );
    assert!(saved["serial"].as_u64().unwrap() > old_serial, "{saved}");

    // Restarted while Consul is down: maint, from the file.
    let mut agent = agent;
    assert!(agent.terminate().is_some_and(|s| s.success()));
    drop(agent);
    consul.stop();
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &args(&dir_args, &[]));
    let answering = wait_for(Duration::from_secs(10), || {
        (agent.http_get("/-/answering").map(|r| r.0) == Some(200)).then_some(())
    });
    assert!(answering.is_some(), "{}", agent.log());
    keeps_answering(&agent, "web/s1", "maint 100%\n", Duration::from_secs(1));
}

/// Creates a client token with the one policy `policy`; returns its secret.
fn token_for(consul: &Consul, policy: &str) -> String {
    consul.token_with(policy).1
}

/// A key denied to the token (`key ".../web/s2" deny` under a readable
/// prefix, which the read check cannot see) that the agent never saw: a new
/// load balancer, or an agent that lost its state file. The writer's record
/// of the key (`~meta/web/s2`, an earlier writer's, below the prefix)
/// names it: the agent reads it directly (403) and holds it as hidden at
/// the maint the record names, so s2 stays in MAINT rather than taking
/// `canary`'s ready.
#[test]
fn a_key_denied_to_a_fresh_agent_is_found_by_its_record_and_held_at_its_maint() {
    let consul = Consul::start_acl(MASTER);
    let read = format!(r#"key_prefix "{PREFIX}" {{ policy = "read" }}"#);
    consul.put_policy("all-read", &read);
    consul.put_policy(
        "deny-s2",
        &format!(r#"{read} key "{PREFIX}web/s2" {{ policy = "deny" }}"#),
    );
    let dir = TempDir::new("token");
    let token_file = dir.path().join("consul-token");
    std::fs::write(&token_file, token_for(&consul, "all-read")).unwrap();
    write_store_marker(&consul);
    consul.put("canary", "ready");
    consul.put("web/s2", "maint");
    let record = serde_json::json!({"by": "alice", "reason": "disk", "at": 1_700_000_000u64, "value": "maint"});
    consul.put("~meta/web/s2", &record.to_string());

    let (port, http_port) = (free_port(), free_port());
    let token_args = ["--consul-token-file", token_file.to_str().unwrap()];
    let mut agent = Agent::spawn_on(&consul.url(), port, http_port, &token_args);
    agent.wait_ready();
    let haproxy = haproxy(port, &[("s2", &["web/s2", "canary"])]);
    haproxy.wait_server("web", "s2", Duration::from_secs(10), ServerState::is_maint);

    // The same node's agent starts again without its state file, with a
    // token that is denied web/s2.
    agent.proc().kill();
    drop(agent);
    std::fs::write(&token_file, token_for(&consul, "deny-s2")).unwrap();
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &token_args);
    agent.wait_ready();
    wait_held(&agent, "web/s2", "hidden");
    keeps_answering(
        &agent,
        "web/s2 canary",
        "maint 100%\n",
        Duration::from_secs(1),
    );
    server_stays(&haproxy, "s2", "MAINT", Duration::from_secs(1), |r| {
        r.is_maint()
    });
    assert_eq!(agent.ask("web/s1 canary"), "ready 100%\n");
    // Unrelated writes: web/s2 is read again each time and stays hidden.
    for weight in ["50%", "60%", "70%"] {
        consul.put("web/s3", weight);
        agent.wait_answer("web/s3", &format!("ready {weight}\n"));
        assert_eq!(
            agent.ask("web/s2 canary"),
            "maint 100%\n",
            "{}",
            agent.log()
        );
    }
    wait_held(&agent, "web/s2", "hidden");
    server_stays(&haproxy, "s2", "MAINT", Duration::from_secs(1), |r| {
        r.is_maint()
    });
}
