//! Harness pieces for the fault-schedule test: a one-server Consul that keeps
//! its data across restarts (not `-dev`), with ACLs on, and a sampler that
//! reads HAProxy's `show servers state` over the stats socket every ~100 ms
//! in its own thread.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{free_port, http_request_as, wait_every, Proc, TempDir};

/// A one-server Consul cluster (`consul agent -server -bootstrap-expect 1
/// -data-dir D`) on loopback with ACLs enabled (default policy deny) and
/// `master` as its management token. Its KV store, ACL policies and tokens
/// live in the data directory, so [`DurableConsul::restart`] brings back the
/// same data with an index that never goes backwards: a restart is an outage,
/// not a rollback. `raft_multiplier` 1 makes it elect itself in about 2 s
/// (Consul's production default of 5 takes about 9 s).
pub struct DurableConsul {
    proc: Proc,
    /// HTTP, serf LAN, serf WAN, server RPC.
    ports: [u16; 4],
    dir: TempDir,
    master: String,
    starts: u32,
}

/// How to stop Consul in [`DurableConsul::restart`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM: a graceful stop (a server does not leave the cluster on it).
    Term,
    /// SIGKILL: a crash.
    Kill,
}

impl DurableConsul {
    /// Starts Consul on free ports and waits (up to 30 s) until it has a
    /// leader and accepts KV writes with the management token. Retried on
    /// fresh ports (at most three times) if a port was taken meanwhile.
    pub fn start(master: &str) -> DurableConsul {
        let dir = TempDir::new("consul-durable");
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            format!(
                r#"{{"primary_datacenter":"dc1","performance":{{"raft_multiplier":1}},"acl":{{"enabled":true,"default_policy":"deny","down_policy":"extend-cache","tokens":{{"master":"{master}","agent":"{master}"}}}}}}"#
            ),
        )
        .unwrap();
        let fresh = || [free_port(), free_port(), free_port(), free_port()];
        let ports = fresh();
        let proc = Self::spawn(&ports, &dir, 0);
        let mut consul = DurableConsul {
            proc,
            ports,
            dir,
            master: master.to_string(),
            starts: 1,
        };
        for _ in 0..3 {
            match consul.try_wait_leader() {
                Ok(()) => return consul,
                Err(_)
                    if consul.proc.try_wait().is_some()
                        && consul.proc.log().contains("address already in use") =>
                {
                    consul.ports = fresh();
                    consul.proc = Self::spawn(&consul.ports, &consul.dir, consul.starts);
                    consul.starts += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        if let Err(e) = consul.try_wait_leader() {
            panic!("{e}");
        }
        consul
    }

    fn spawn(ports: &[u16; 4], dir: &TempDir, n: u32) -> Proc {
        let mut cmd = Command::new("consul");
        cmd.args([
            "agent",
            "-server",
            "-bootstrap-expect",
            "1",
            "-node",
            "fault-schedule",
            "-bind",
            "127.0.0.1",
            "-advertise",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
            "-dns-port",
            "-1",
            "-grpc-port",
            "-1",
        ])
        .arg("-data-dir")
        .arg(dir.path().join("data"))
        .arg(format!("-http-port={}", ports[0]))
        .arg(format!("-serf-lan-port={}", ports[1]))
        .arg(format!("-serf-wan-port={}", ports[2]))
        .arg(format!("-server-port={}", ports[3]))
        .arg(format!(
            "-config-file={}",
            dir.path().join("config.json").display()
        ));
        Proc::spawn(cmd, dir.path().join(format!("consul-{n}.log")))
    }

    /// Waits (up to 30 s, less if Consul exits) for a leader and a KV write
    /// accepted with the management token (ACLs are initialised just after
    /// the election).
    fn try_wait_leader(&mut self) -> Result<(), String> {
        let addr = self.addr();
        let master = self.master.clone();
        let ok = wait_every(Duration::from_secs(30), Duration::from_millis(50), || {
            if self.proc.try_wait().is_some() {
                return Some(false);
            }
            let (status, _, body) =
                http_request_as(addr, Some(&master), "PUT", "/v1/kv/gha-test-ping", b"1")?;
            (status == 200 && body.trim_ascii() == b"true").then_some(true)
        });
        if ok == Some(true) {
            Ok(())
        } else {
            Err(format!(
                "Consul did not elect a leader and accept writes:\n{}",
                self.proc.log()
            ))
        }
    }

    /// Stops Consul with `signal` (SIGKILL after 10 s if SIGTERM did not
    /// end it), keeps it down for `down`, starts it again on the same ports
    /// and data directory, and waits for a leader and a write. Panics if it
    /// does not come back within 30 s.
    pub fn restart(&mut self, signal: StopSignal, down: Duration) {
        match signal {
            StopSignal::Term => {
                self.proc.signal("TERM");
                if self.proc.wait_exit(Duration::from_secs(10)).is_none() {
                    self.proc.kill();
                }
            }
            StopSignal::Kill => self.proc.kill(),
        }
        self.proc.kill(); // reaps it
        std::thread::sleep(down);
        self.proc = Self::spawn(&self.ports, &self.dir, self.starts);
        self.starts += 1;
        if let Err(e) = self.try_wait_leader() {
            panic!("{e}");
        }
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The current Consul process's output.
    pub fn log(&self) -> String {
        self.proc.log()
    }

    /// One request with the management token; `None` if Consul did not
    /// answer.
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Option<(u16, HashMap<String, String>, Vec<u8>)> {
        http_request_as(self.addr(), Some(&self.master), method, path, body)
    }

    /// One request with the management token; panics if Consul does not
    /// answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, HashMap<String, String>, Vec<u8>) {
        self.try_request(method, path, body)
            .unwrap_or_else(|| panic!("Consul did not answer {method} {path}"))
    }

    /// A request that must answer 200; returns the body as JSON.
    pub fn request_json(&self, method: &str, path: &str, body: &[u8]) -> serde_json::Value {
        let (status, _, answer) = self.request(method, path, body);
        assert_eq!(
            status,
            200,
            "{method} {path}: {}",
            String::from_utf8_lossy(&answer)
        );
        serde_json::from_slice(&answer).unwrap_or(serde_json::Value::Null)
    }

    /// The `X-Consul-Index` of a recursive read of `prefix`.
    pub fn prefix_index(&self, prefix: &str) -> u64 {
        let (_, headers, _) = self.request("GET", &format!("/v1/kv/{prefix}?recurse=true"), b"");
        headers["x-consul-index"].parse().unwrap()
    }
}

/// One server as `show servers state` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// `srv_admin_state`: 0x01 forced maint, 0x08 forced drain.
    pub admin: u32,
    /// `srv_uweight`: the weight now.
    pub uweight: u32,
}

impl Row {
    /// Neither forced maint nor forced drain: in rotation.
    pub fn is_ready(&self) -> bool {
        self.admin & 0x09 == 0
    }

    /// `MAINT`, `DRAIN` or `READY`, and the weight.
    pub fn describe(&self) -> String {
        let state = if self.admin & 0x01 != 0 {
            "MAINT"
        } else if self.admin & 0x08 != 0 {
            "DRAIN"
        } else {
            "READY"
        };
        format!("{state} weight {}", self.uweight)
    }
}

/// Parses `show servers state` into rows by `backend/server`; `None` if the
/// text is not a complete answer (version line, header, rows).
pub fn parse_servers_state(text: &str) -> Option<HashMap<String, Row>> {
    let mut lines = text.lines();
    lines.next()?;
    let header: Vec<&str> = lines
        .next()?
        .trim_start_matches('#')
        .split_whitespace()
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (be, sv, admin, uw) = (
        col("be_name")?,
        col("srv_name")?,
        col("srv_admin_state")?,
        col("srv_uweight")?,
    );
    let mut rows = HashMap::new();
    for line in lines.filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < header.len() {
            return None;
        }
        rows.insert(
            format!("{}/{}", f[be], f[sv]),
            Row {
                admin: f[admin].parse().ok()?,
                uweight: f[uw].parse().ok()?,
            },
        );
    }
    Some(rows)
}

/// Sends one command to a stats socket; `None` if it cannot connect or
/// answer within 2 s.
pub fn stats_command(socket: &Path, command: &str) -> Option<String> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(command.as_bytes()).ok()?;
    s.write_all(b"\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// One reading of every server.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the command was sent, since the sampler's epoch. HAProxy's
    /// answer shows the state at this time or later.
    pub at: Duration,
    /// Rows by `backend/server`.
    pub rows: HashMap<String, Row>,
}

/// Reads `show servers state` every `every` in a thread until stopped.
/// Readings that fail (the socket changing hands during a reload) are
/// skipped and counted.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(Vec<Sample>, u64)>>,
}

impl Sampler {
    /// Starts sampling `socket`; times are measured from `epoch`.
    pub fn start(socket: PathBuf, epoch: Instant, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut failed = 0;
            while !flag.load(Ordering::SeqCst) {
                let at = epoch.elapsed();
                match stats_command(&socket, "show servers state")
                    .as_deref()
                    .and_then(parse_servers_state)
                {
                    Some(rows) if !rows.is_empty() => samples.push(Sample { at, rows }),
                    _ => failed += 1,
                }
                let next = at + every;
                std::thread::sleep(next.saturating_sub(epoch.elapsed()));
            }
            (samples, failed)
        });
        Sampler {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the thread; returns the samples and the count of failed
    /// readings.
    pub fn finish(mut self) -> (Vec<Sample>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
