//! Nothing on the way holds a change back: a log sink that stops reading
//! (a FIFO nobody reads as the agent's stderr) and a state folder whose disk
//! stalls (an ext4 file system in a file, frozen with `fsfreeze`), each with
//! a real Consul, a real HAProxy and the agent binary.
//!
//! The freeze test needs root and a loop device; without them it says so
//! and passes. Run alone with `cargo test --test stall`.

mod support;

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, ServerState, TempDir,
};

const INTER_MS: u64 = 200;

fn haproxy(port: u16, servers: &[&str]) -> Haproxy {
    let mut backend = String::from("backend web\n");
    for server in servers {
        backend.push_str(&server_line(
            "web",
            server,
            &[&format!("web/{server}")],
            port,
            INTER_MS,
        ));
    }
    Haproxy::start(&haproxy_config(&backend))
}

/// Whether `web/<server>` reaches `cond` within `timeout`.
fn reaches(
    haproxy: &Haproxy,
    server: &str,
    timeout: Duration,
    cond: impl Fn(&ServerState) -> bool,
) -> bool {
    wait_for(timeout, || {
        cond(&haproxy.server("web", server)).then_some(())
    })
    .is_some()
}

/// An HTTP path of the agent answers within 2 s; its status.
fn answers(agent: &Agent, path: &str) -> u16 {
    let (status, _, _) = support::get_within(agent.http, path, Duration::from_secs(2))
        .unwrap_or_else(|| panic!("{path} did not answer within 2 s"));
    status
}

/// Bytes waiting in the pipe behind `fifo`.
fn queued(fifo: &std::fs::File) -> usize {
    rustix::io::ioctl_fionread(fifo).map_or(0, |n| n as usize)
}

#[test]
fn a_log_sink_that_stops_reading_holds_no_change_back() {
    let consul = Consul::start();
    consul.put("web/s1", "ready");
    consul.put("web/s2", "ready");
    let dir = TempDir::new("log-sink");
    let fifo_path = dir.path().join("stderr.fifo");
    let made = Command::new("mkfifo").arg(&fifo_path).status().unwrap();
    assert!(made.success());
    // The agent's stderr, opened for reading and writing so that its
    // writes never get EPIPE, and blocking as a pipe to journald is; nobody
    // reads it until the end. 4 KiB of pipe: about 20 lines.
    let sink = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo_path)
        .unwrap();
    let size = rustix::pipe::fcntl_setpipe_size(&sink, 4096).unwrap();
    // The test's own end, which never blocks.
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(&fifo_path)
        .unwrap();
    assert!(size <= 8192, "pipe of {size} bytes");
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_stderr(
        &consul.url(),
        port,
        http_port,
        sink,
        &["--log-buffer-lines", "16"],
    );
    agent.wait_ready();
    let haproxy = haproxy(port, &["s1", "s2"]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), |s| {
        s.is_ready_full_weight()
    });

    // Changes of other keys, each a line or more in the log, until the pipe
    // is full.
    let mut n = 0;
    let full = wait_for(Duration::from_secs(60), || {
        n += 1;
        consul.put(
            &format!("other/k{n}"),
            if n % 2 == 0 { "drain" } else { "maint" },
        );
        std::thread::sleep(Duration::from_millis(50));
        (queued(&fifo) + 300 >= size).then_some(())
    });
    assert!(full.is_some(), "the pipe holds {} bytes", queued(&fifo));
    // A few more lines: the agent's queue of 16 lines fills and lines are
    // dropped.
    for i in 0..40 {
        consul.put(&format!("other/more{i}"), "drain");
        std::thread::sleep(Duration::from_millis(20));
    }

    let written = Instant::now();
    consul.put("web/s2", "drain");
    let drained = reaches(
        &haproxy,
        "s2",
        Duration::from_secs(5),
        ServerState::is_drain,
    );
    assert!(
        drained,
        "a drain written while the log sink is not reading was not answered within 5 s"
    );
    eprintln!("drain answered {:?} after the write", written.elapsed());
    assert_eq!(answers(&agent, "/-/healthy"), 200);
    assert_eq!(answers(&agent, "/-/ready"), 200);
    assert_eq!(answers(&agent, "/metrics"), 200);
    let dropped = wait_for(Duration::from_secs(5), || {
        let d = agent.metric("gitlab_haproxy_agent_log_lines_dropped_total");
        (d > 0.0).then_some(d)
    });
    assert!(dropped.is_some(), "no dropped line counted");

    // The sink reads again: one line says how many were dropped.
    let mut text = Vec::new();
    let mut reader = &fifo;
    let said = wait_for(Duration::from_secs(15), || {
        let mut buf = [0u8; 65536];
        while let Ok(k) = reader.read(&mut buf) {
            if k == 0 {
                break;
            }
            text.extend_from_slice(&buf[..k]);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .find(|l| l.contains("log lines were dropped while the log sink was not reading"))
            .map(str::to_string)
    });
    assert!(
        said.is_some(),
        "no line about the dropped lines in:\n{}",
        String::from_utf8_lossy(&text)
    );
    eprintln!("{}", said.unwrap());
    assert!(agent.terminate().is_some_and(|s| s.success()));
}

/// An ext4 file system in a file, loop-mounted; thawed and unmounted on
/// drop, even on a panic.
struct Frozen {
    image: PathBuf,
    mount: PathBuf,
    frozen: bool,
}

impl Frozen {
    /// `None`, with a line saying why, when this machine cannot make one.
    fn make(dir: &Path) -> Option<Frozen> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: not root: no loop mount to freeze");
            return None;
        }
        let image = dir.join("disk.img");
        let mount = dir.join("state");
        std::fs::create_dir(&mount).unwrap();
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(32 << 20).unwrap();
        let mkfs = Command::new("mkfs.ext4").arg("-q").arg(&image).status();
        if !mkfs.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: mkfs.ext4 failed or is missing");
            return None;
        }
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount)
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: no loop device to mount an ext4 image on");
            return None;
        }
        Some(Frozen {
            image,
            mount,
            frozen: false,
        })
    }

    fn freeze(&mut self, on: bool) {
        let flag = if on { "-f" } else { "-u" };
        let ok = Command::new("fsfreeze")
            .arg(flag)
            .arg(&self.mount)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok || !on, "fsfreeze {flag} failed");
        self.frozen = on;
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).status();
        }
        // Writers stuck on the frozen disk finish once thawed; then the
        // file system is not busy.
        let unmounted = wait_for(Duration::from_secs(10), || {
            Command::new("umount")
                .arg(&self.mount)
                .status()
                .is_ok_and(|s| s.success())
                .then_some(())
        });
        if unmounted.is_none() {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// The `"serial"` at the start of a copy of the state served.
fn serial(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let Some(rest) = text.strip_prefix("{\"serial\":") else {
        return 0;
    };
    rest.split(',').next().unwrap().parse().unwrap()
}

/// WATCHDOG=1 pings that arrive within `within`.
fn pings(socket: &UnixDatagram, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut n = 0;
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match socket.recv(&mut buf) {
            Ok(k) => n += usize::from(String::from_utf8_lossy(&buf[..k]).contains("WATCHDOG=1")),
            Err(_) => break,
        }
    }
    n
}

#[test]
fn a_frozen_state_disk_holds_no_change_back_and_a_restart_serves_the_newest_state() {
    let dir = TempDir::new("frozen-disk");
    let Some(mut disk) = Frozen::make(dir.path()) else {
        return;
    };
    let mut consul = Consul::start();
    consul.put("web/s1", "drain");
    consul.put("web/s2", "ready");
    let runtime = dir.path().join("runtime");
    let mount = disk.mount.clone();
    let notify = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    let dirs = [
        "--state-dir",
        mount.to_str().unwrap(),
        "--runtime-dir",
        runtime.to_str().unwrap(),
    ];
    let (port, http_port) = (free_port(), free_port());
    let mut agent = Agent::spawn_env(
        &consul.url(),
        port,
        http_port,
        &[
            ("NOTIFY_SOCKET", notify.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
        ],
        &dirs,
    );
    agent.wait_ready();
    let haproxy = haproxy(port, &["s1", "s2"]);
    haproxy.wait_server("web", "s1", Duration::from_secs(10), ServerState::is_drain);
    let file = disk.mount.join("served-state.json");
    let copy = runtime.join("served-state.json");
    let on_disk = wait_for(Duration::from_secs(5), || {
        let s = serial(&file);
        (s > 0 && s >= serial(&copy)).then_some(s)
    })
    .unwrap_or_else(|| panic!("no state file written:\n{}", agent.log()));

    disk.freeze(true);
    let frozen_at = Instant::now();
    consul.put("web/s2", "maint");
    let answered = reaches(
        &haproxy,
        "s2",
        Duration::from_secs(5),
        ServerState::is_maint,
    );
    assert!(
        answered,
        "maint written during the freeze not answered within 5 s:\n{}",
        agent.log()
    );
    eprintln!("maint answered {:?} into the freeze", frozen_at.elapsed());
    // The loops go on: the watchdog is pinged (every second at
    // WATCHDOG_USEC 2 s) and the HTTP port answers.
    let _ = pings(&socket, Duration::from_millis(100));
    let pinged = pings(&socket, Duration::from_secs(4));
    assert!(
        pinged >= 2,
        "{pinged} watchdog pings in 4 s of the freeze:\n{}",
        agent.log()
    );
    assert_eq!(answers(&agent, "/-/healthy"), 200);
    let behind = agent.metric("gitlab_haproxy_agent_state_file_behind_seconds");
    assert!(behind >= 1.0, "state file behind {behind} s");
    assert_eq!(agent.metric("gitlab_haproxy_agent_state_file_behind"), 1.0);
    assert_eq!(serial(&file), on_disk, "the disk copy lags");
    let status = agent.http_get("/status").unwrap().1;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        status["state_file"]["behind_seconds"].as_f64() >= Some(1.0),
        "{status}"
    );

    // A crash during the freeze, with Consul gone. The killed agent is gone
    // at once (nothing of it waits on the frozen disk, which would keep it,
    // and its ports, until the thaw); the new agent starts at once on the
    // same ports and answers the newest state, from the runtime copy, not
    // the disk copy (where web/s2 is ready, withheld).
    consul.stop();
    agent.proc().signal("KILL");
    if agent.proc().wait_exit(Duration::from_secs(5)).is_none() {
        disk.freeze(false);
        panic!("the SIGKILLed agent did not exit within 5 s of the freeze (something of it waits on the frozen disk)");
    }
    drop(agent);
    let started = Instant::now();
    let agent = Agent::spawn_on(&consul.url(), port, http_port, &dirs);
    let maint = wait_for(Duration::from_secs(5), || {
        agent.http_get("/-/answering")?;
        agent.ask("web/s2").starts_with("maint").then_some(())
    });
    assert!(
        maint.is_some(),
        "the restarted agent answered {:?} for web/s2:\n{}",
        agent.ask("web/s2"),
        agent.log()
    );
    eprintln!(
        "restarted agent answered maint {:?} after its start",
        started.elapsed()
    );
    assert!(agent.ask("web/s1").starts_with("drain"));
    assert!(
        agent
            .log()
            .contains("the runtime copy is newer than the state file"),
        "{}",
        agent.log()
    );
    assert!(haproxy.server("web", "s2").is_maint());
    let status = agent.http_get("/status").unwrap().1;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["state_file"]["loaded_runtime_copy"], true,
        "{status}"
    );
    assert_eq!(answers(&agent, "/-/healthy"), 200);
    assert!(serial(&copy) > on_disk);
    let runtime_text = std::fs::read_to_string(&copy).unwrap();
    assert!(runtime_text.contains("maint"), "{runtime_text}");

    // Thawed after about 20 s: the disk copy catches up with the runtime
    // copy, by itself.
    let left = Duration::from_secs(20).saturating_sub(frozen_at.elapsed());
    std::thread::sleep(left);
    disk.freeze(false);
    let caught_up = wait_for(Duration::from_secs(15), || {
        (serial(&file) >= serial(&copy)).then_some(())
    });
    assert!(
        caught_up.is_some(),
        "the state file (serial {}) did not catch up with the runtime copy ({}):\n{}",
        serial(&file),
        serial(&copy),
        agent.log()
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("maint"), "{text}");
    let current = wait_for(Duration::from_secs(10), || {
        (agent.metric("gitlab_haproxy_agent_state_file_behind_seconds") == 0.0).then_some(())
    });
    assert!(current.is_some(), "{}", agent.log());
}
