//! Test harness: a real Consul (`consul agent -dev`), a real HAProxy and the
//! agent binary, each on free loopback ports in its own temporary directory,
//! each stopped by its PID when dropped. Every wait is bounded in time.
#![allow(dead_code)]

pub mod cluster;
pub mod lbs;
pub mod netns;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod prometheus;

/// The agent binary built by cargo for these tests.
pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_gitlab-haproxy-agent");

/// The writer CLI, `gitlab-haproxy-agent state ARGS --consul-addr URL`,
/// with a clean environment: a reason (writes that take servers out need
/// one) and no HAProxy configuration to read on this machine.
pub fn state_command(consul_url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(AGENT_BIN);
    cmd.env_clear()
        .env("GITLAB_HAPROXY_AGENT_REASON", "test")
        .env(
            "GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG",
            "/nonexistent/haproxy.cfg",
        )
        .arg("state")
        .args(args)
        .args(["--consul-addr", consul_url]);
    cmd
}

/// A finished run of the binary (the writer CLI): its exit status (-1 when a
/// signal ended it) and its output.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Run {
    fn from(out: std::process::Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Run {
    /// Stdout as JSON; panics with the whole run when it is not.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{self:?}"))
    }

    /// Asserts that stdout contains `text`.
    #[track_caller]
    pub fn says(&self, text: &str) {
        assert!(
            self.stdout.contains(text),
            "stdout lacks {text:?}:\n{}",
            self.stdout
        );
    }

    /// Asserts that stderr contains `text`.
    #[track_caller]
    pub fn warns(&self, text: &str) {
        assert!(
            self.stderr.contains(text),
            "stderr lacks {text:?}:\n{}",
            self.stderr
        );
    }

    /// The table row on stdout that starts with `key`.
    #[track_caller]
    pub fn row(&self, key: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no row for {key}: {}", self.stdout))
    }
}

/// The KV prefix the agent watches by default.
pub const PREFIX: &str = "gitlab-haproxy-agent/state/";

/// The ports [`free_port`] hands out: below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768..=60999 by default), or above it
/// when it starts low. Outgoing connections (Consul's, HAProxy's, the
/// agent's, the tests' own) take their source ports from the ephemeral
/// range, so a port handed out here can never be taken by one of them
/// between the check and the bind.
fn port_range() -> (u16, u16) {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    match ephemeral {
        (lo, _) if lo >= 20_000 => (10_000, lo - 10_000),
        (_, hi) => {
            let lo = hi.saturating_add(1).max(1024);
            (lo, u16::MAX - lo)
        }
    }
}

/// Ports are handed out in blocks of this many; each block belongs to one
/// test process at a time.
const PORT_BLOCK: u16 = 50;

/// This process's block: the next port to try and the block's end.
static PORT_BLOCK_NOW: Mutex<Option<(u16, u16)>> = Mutex::new(None);

/// A loopback TCP port nobody listens on now, outside the ephemeral range
/// (see [`port_range`]). Ports come from blocks of [`PORT_BLOCK`] that this
/// process holds (see [`claim_port_block`]), so tests running at once, as
/// threads of one binary or as processes side by side (cargo-nextest runs
/// each test in its own), never get the same port.
pub fn free_port() -> u16 {
    let (lo, span) = port_range();
    let blocks = span / PORT_BLOCK;
    let mut now = PORT_BLOCK_NOW.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..u32::from(span) {
        let (next, end) = match *now {
            Some((next, end)) if next < end => (next, end),
            _ => {
                let start = claim_port_block(lo, blocks);
                (start, start + PORT_BLOCK)
            }
        };
        *now = Some((next + 1, end));
        if TcpListener::bind(("127.0.0.1", next)).is_ok() {
            return next;
        }
    }
    panic!("no free loopback port found");
}

/// Takes a block of ports no other live process holds, trying them in turn
/// from one chosen by PID: its lock file `$TMPDIR/gha-ports-<first>.lock`
/// names this process (see [`take_lock`]). The lock outlives the process
/// and is taken over once that process is gone.
fn claim_port_block(lo: u16, blocks: u16) -> u16 {
    static TRIED: AtomicU16 = AtomicU16::new(0);
    let first = (std::process::id() % u32::from(blocks)) as u16;
    for _ in 0..blocks {
        let i = (first + TRIED.fetch_add(1, Ordering::SeqCst) % blocks) % blocks;
        let start = lo + i * PORT_BLOCK;
        if take_lock(&std::env::temp_dir().join(format!("gha-ports-{start}.lock"))) {
            return start;
        }
    }
    panic!("every block of test ports is held by a running process");
}

/// Takes the lock file at `path` for this process: created anew with its
/// PID, or taken over from a PID that no longer runs. False when another
/// live process holds it.
pub fn take_lock(path: &Path) -> bool {
    let me = std::process::id();
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut f) => return f.write_all(me.to_string().as_bytes()).is_ok(),
            Err(_) => {
                let owner = std::fs::read_to_string(path).unwrap_or_default();
                let alive = owner
                    .trim()
                    .parse::<u32>()
                    .is_ok_and(|pid| pid == me || Path::new(&format!("/proc/{pid}")).exists());
                if alive {
                    return owner.trim() == me.to_string();
                }
                let _ = std::fs::remove_file(path);
            }
        }
    }
    false
}

/// A fresh temporary directory (the `tempfile` crate's), removed on drop.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates `$TMPDIR/gha-test-<name>-<random>` (default `/tmp`).
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("gha-test-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for {name}: {e}"));
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Polls `cond` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, cond: impl FnMut() -> Option<T>) -> Option<T> {
    wait_every(timeout, Duration::from_millis(20), cond)
}

/// Polls `cond` every `every` until it returns `Some` or `timeout` passes.
pub fn wait_every<T>(
    timeout: Duration,
    every: Duration,
    mut cond: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Sends `signal` (e.g. `TERM`, `KILL`, `STOP`, `CONT`, `USR2`) to `pid`;
/// false (and a line on stderr) when `kill` could not be run or failed (a
/// process already gone, for one).
pub fn kill(pid: u32, signal: &str) -> bool {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
    let sent = status.as_ref().is_ok_and(|s| s.success());
    if !sent {
        eprintln!("kill -{signal} {pid}: {status:?}");
    }
    sent
}

/// A child process stopped by its PID on drop (SIGKILL, then reaped).
pub struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr into `log`.
    pub fn spawn(cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        Proc::start(cmd, log, out, err)
    }

    /// Starts `cmd` with stdout into `log` and stderr into `stderr` (a
    /// FIFO, say, to stand in for a log sink).
    pub fn spawn_stderr(cmd: Command, log: PathBuf, stderr: std::fs::File) -> Proc {
        let out = std::fs::File::create(&log).unwrap();
        Proc::start(cmd, log, out, stderr)
    }

    fn start(mut cmd: Command, log: PathBuf, out: std::fs::File, err: std::fs::File) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc {
            child: Some(child),
            log,
        }
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_for(timeout, || self.try_wait())
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: &str) {
        kill(self.pid(), signal);
    }

    /// SIGKILLs and reaps the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One GET over a plain socket with `Connection: close`, every step bounded
/// by `timeout` (connect, and each read): (status, head, body), or `None`
/// if the connection failed or closed without a complete answer. For the
/// agent's HTTP port when how long it takes to answer is under test.
pub fn get_within(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Option<(u16, String, Vec<u8>)> {
    let s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    get_on(s, addr, path, timeout)
}

/// Like [`get_within`] from a client socket bound to `source` before it
/// connects, as a mesh sidecar connects from 127.0.0.6.
pub fn get_from(
    source: std::net::IpAddr,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Option<(u16, String, Vec<u8>)> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::new(source, 0).into()).ok()?;
    socket.connect_timeout(&addr.into(), timeout).ok()?;
    get_on(socket.into(), addr, path, timeout)
}

fn get_on(
    mut s: TcpStream,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Option<(u16, String, Vec<u8>)> {
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, head, raw[split + 4..].to_vec()))
}

/// One HTTP/1.1 request to `addr` with no token, as [`Consul::request`]
/// makes it: (status, headers by lower-case name, body); `None` if the
/// connection fails or the answer does not come whole in time.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, HashMap<String, String>, Vec<u8>)> {
    http_request_as(addr, None, method, path, body)
}

/// The HTTP client every harness request goes through (`ureq`, blocking):
/// 2 s to connect, 15 s for each read (a Consul blocking query of up to
/// `wait=10s` plus its jitter answers within it), no proxy from the
/// environment (tests talk only to loopback), no redirects followed, no
/// pooled connections, and every status returned as a response, not an
/// error.
fn http_client() -> &'static ureq::Agent {
    static CLIENT: OnceLock<ureq::Agent> = OnceLock::new();
    CLIENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .max_redirects(0)
            .max_idle_connections(0)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_per_read(Some(Duration::from_secs(15)))
            .build()
            .new_agent()
    })
}

/// One HTTP/1.1 request (`Connection: close`, `Content-Length` always
/// sent, even for an empty body) with an optional `X-Consul-Token`:
/// (status, headers by lower-case name, body). `None` if the connection
/// fails or the answer does not come whole in time.
fn http_request_as(
    addr: SocketAddr,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, HashMap<String, String>, Vec<u8>)> {
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("Connection", "close");
    if let Some(token) = token {
        request = request.header("X-Consul-Token", token);
    }
    let mut response = http_client().run(request.body(body).ok()?).ok()?;
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).trim().to_string();
            (k.as_str().to_string(), v)
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .ok()?;
    Some((response.status().as_u16(), headers, body))
}

/// A real Consul agent in dev mode (in-memory, single server) on loopback.
pub struct Consul {
    proc: Proc,
    ports: [u16; 6],
    dir: TempDir,
    extra_args: Vec<String>,
    token: Option<String>,
}

impl Consul {
    /// Starts Consul on free ports and waits (up to 30 s) until it has a
    /// leader and accepts KV writes.
    pub fn start() -> Consul {
        Self::start_with(&[])
    }

    /// Starts Consul with extra arguments (e.g. `-config-file`).
    pub fn start_with(extra: &[&str]) -> Consul {
        Self::start_on(free_port(), extra)
    }

    /// Starts Consul with its HTTP API on `http_port` (other listeners on
    /// free ports), e.g. to bring up Consul where an agent already looks.
    pub fn start_on(http_port: u16, extra: &[&str]) -> Consul {
        let extra_args = extra.iter().map(|s| s.to_string()).collect();
        Self::launch(http_port, TempDir::new("consul"), extra_args, None)
    }

    /// Starts Consul with ACLs enabled, default policy deny, and
    /// `master_token` as the management token the harness then uses for its
    /// own requests.
    pub fn start_acl(master_token: &str) -> Consul {
        let dir = TempDir::new("consul-acl");
        let cfg = dir.path().join("acl.json");
        std::fs::write(
            &cfg,
            format!(
                r#"{{"primary_datacenter":"dc1","acl":{{"enabled":true,"default_policy":"deny","down_policy":"extend-cache","tokens":{{"master":"{master_token}","agent":"{master_token}"}}}}}}"#
            ),
        )
        .unwrap();
        let extra_args = vec![format!("-config-file={}", cfg.display())];
        Self::launch(free_port(), dir, extra_args, Some(master_token.to_string()))
    }

    /// Spawns Consul (HTTP on `http_port`, other listeners on free ports)
    /// and waits for a leader. If Consul exits because one of its ports
    /// was taken between [`free_port`] and its bind, it is started again
    /// on fresh ports (at most three times).
    fn launch(
        http_port: u16,
        dir: TempDir,
        extra_args: Vec<String>,
        token: Option<String>,
    ) -> Consul {
        let fresh_ports = || {
            [
                http_port,
                free_port(),
                free_port(),
                free_port(),
                free_port(),
                free_port(),
            ]
        };
        let ports = fresh_ports();
        let proc = Self::spawn(&ports, &dir, &extra_args);
        let mut consul = Consul {
            proc,
            ports,
            dir,
            extra_args,
            token,
        };
        for _ in 0..3 {
            match consul.try_wait_leader() {
                Ok(()) => return consul,
                Err(_) if consul.lost_a_port() => {
                    consul.ports = fresh_ports();
                    consul.proc = Self::spawn(&consul.ports, &consul.dir, &consul.extra_args);
                }
                Err(e) => panic!("{e}"),
            }
        }
        consul.wait_leader();
        consul
    }

    /// Whether Consul has exited because a port it was given was in use.
    fn lost_a_port(&mut self) -> bool {
        self.proc.try_wait().is_some() && self.proc.log().contains("address already in use")
    }

    fn spawn(ports: &[u16; 6], dir: &TempDir, extra: &[String]) -> Proc {
        let mut cmd = Command::new("consul");
        cmd.args([
            "agent",
            "-dev",
            "-bind",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
        ])
        .arg(format!("-http-port={}", ports[0]))
        .arg(format!("-dns-port={}", ports[1]))
        .arg(format!("-serf-lan-port={}", ports[2]))
        .arg(format!("-serf-wan-port={}", ports[3]))
        .arg(format!("-server-port={}", ports[4]))
        .arg(format!("-grpc-port={}", ports[5]))
        .args(extra);
        Proc::spawn(cmd, dir.path().join("consul.log"))
    }

    fn wait_leader(&mut self) {
        if let Err(e) = self.try_wait_leader() {
            panic!("{e}");
        }
    }

    /// Waits (up to 30 s, less if Consul exits) for a leader, then (up to
    /// 10 s) for a KV write to succeed; the error carries Consul's log.
    fn try_wait_leader(&mut self) -> Result<(), String> {
        let ok = wait_for(Duration::from_secs(30), || {
            if self.proc.try_wait().is_some() {
                return Some(false);
            }
            let (status, _, body) = http_request_as(
                self.addr(),
                self.token.as_deref(),
                "GET",
                "/v1/status/leader",
                b"",
            )?;
            (status == 200 && body.len() > 4).then_some(true)
        });
        if ok != Some(true) {
            return Err(format!(
                "Consul did not elect a leader:\n{}",
                self.proc.log()
            ));
        }
        let ok = wait_for(Duration::from_secs(10), || {
            let (status, _, _) = http_request_as(
                self.addr(),
                self.token.as_deref(),
                "PUT",
                "/v1/kv/gha-test-ping",
                b"1",
            )?;
            (status == 200).then_some(())
        });
        if ok.is_none() {
            return Err(format!(
                "Consul does not accept writes:\n{}",
                self.proc.log()
            ));
        }
        Ok(())
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[0]))
    }

    /// The DNS port (UDP and TCP on 127.0.0.1).
    pub fn dns_port(&self) -> u16 {
        self.ports[1]
    }

    /// The serf LAN port (on 127.0.0.1), for a client agent to join.
    pub fn serf_lan_port(&self) -> u16 {
        self.ports[2]
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The process.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Stops Consul (SIGKILL).
    pub fn stop(&mut self) {
        self.proc.kill();
    }

    /// Starts Consul again on the same ports (dev mode: an empty store, so
    /// indexes start over).
    pub fn restart(&mut self) {
        self.proc.kill();
        self.proc = Self::spawn(&self.ports, &self.dir, &self.extra_args);
        self.wait_leader();
    }

    /// Any HTTP request to Consul; panics if Consul does not answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, HashMap<String, String>, Vec<u8>) {
        http_request_as(self.addr(), self.token.as_deref(), method, path, body)
            .unwrap_or_else(|| panic!("Consul did not answer {method} {path}"))
    }

    /// Writes `value` at `PREFIX + key`.
    pub fn put(&self, key: &str, value: &str) {
        let (status, _, body) =
            self.request("PUT", &format!("/v1/kv/{PREFIX}{key}"), value.as_bytes());
        assert_eq!(status, 200, "PUT {key}: {}", String::from_utf8_lossy(&body));
        assert_eq!(body.trim_ascii(), b"true");
    }

    /// Deletes `PREFIX + key`.
    pub fn delete(&self, key: &str) {
        let (status, _, _) = self.request("DELETE", &format!("/v1/kv/{PREFIX}{key}"), b"");
        assert_eq!(status, 200);
    }

    /// Creates (or replaces, by name) the ACL policy `name` with `rules`
    /// (HCL); returns its ID.
    pub fn put_policy(&self, name: &str, rules: &str) -> String {
        let body = serde_json::json!({"Name": name, "Rules": rules});
        let (status, _, answer) =
            self.request("PUT", "/v1/acl/policy", body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        v["ID"].as_str().unwrap().to_string()
    }

    /// Creates a client token with the one policy `policy`; returns
    /// (accessor, secret).
    pub fn token_with(&self, policy: &str) -> (String, String) {
        let body = serde_json::json!({"Description": "agent", "Policies": [{"Name": policy}]});
        let (status, _, answer) = self.request("PUT", "/v1/acl/token", body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        (
            v["AccessorID"].as_str().unwrap().to_string(),
            v["SecretID"].as_str().unwrap().to_string(),
        )
    }

    /// `consul snapshot save|restore FILE` against this Consul; panics
    /// unless it exits 0.
    #[track_caller]
    pub fn snapshot(&self, verb: &str, file: &Path) {
        let out = Command::new("consul")
            .args(["snapshot", verb, &format!("-http-addr={}", self.url())])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "consul snapshot {verb}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The `X-Consul-Index` of the prefix.
    pub fn prefix_index(&self) -> u64 {
        self.index_of(PREFIX)
    }

    /// The `X-Consul-Index` of a recursive read of `prefix`.
    pub fn index_of(&self, prefix: &str) -> u64 {
        let (_, headers, _) = self.request("GET", &format!("/v1/kv/{prefix}?recurse=true"), b"");
        headers["x-consul-index"].parse().unwrap()
    }

    /// Writes two keys by hand below a prefix of their own
    /// (`gha-reap-probe/`), deletes one, and waits (up to `timeout`, polling
    /// every second) until Consul reaps its tombstone: that prefix's index
    /// drops from the delete's back to the kept key's. Returns how long
    /// after the delete the reap showed, or `None` if it did not in time.
    /// A reap removes every tombstone up to an index, so the tombstones of
    /// deletes made before this call are gone by then too.
    ///
    /// Consul 1.8.7 reaps a tombstone 15 minutes after its delete, plus up
    /// to its 30 s granularity (`TombstoneTTL: 15 * time.Minute`,
    /// `TombstoneTTLGranularity: 30 * time.Second` in
    /// `agent/consul/config.go` `DefaultConfig()`), and nothing shortens
    /// it: the agent's configuration has no key for either (no
    /// `tombstone_ttl` in the 1.8.7 binary; the hidden `consul {}` block
    /// sets coordinate, raft and server timing only) and `-dev`
    /// (`DevSource`, `DevConsulSource` in `agent/config/default.go`)
    /// leaves both alone. Measured here on `-dev`: 906 s. Tests that wait
    /// for a reap are therefore `#[ignore]`d, and `scripts/test.sh` runs
    /// them in the background beside its other suites (nextest profile
    /// `reap`, `--run-ignored only`).
    pub fn delete_and_wait_for_reap(&self, timeout: Duration) -> Option<Duration> {
        const PROBE: &str = "gha-reap-probe/";
        for key in ["kept", "deleted"] {
            let (status, _, _) = self.request("PUT", &format!("/v1/kv/{PROBE}{key}"), b"1");
            assert_eq!(status, 200);
        }
        let (status, _, _) = self.request("DELETE", &format!("/v1/kv/{PROBE}deleted"), b"");
        assert_eq!(status, 200);
        let deleted = Instant::now();
        let at_delete = self.index_of(PROBE);
        wait_every(timeout, Duration::from_secs(1), || {
            (self.index_of(PROBE) < at_delete).then(|| deleted.elapsed())
        })
    }
}

/// One row of HAProxy's `show servers state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerState {
    /// Backend name.
    pub backend: String,
    /// Server name.
    pub server: String,
    /// `srv_op_state`: 0 stopped, 1 starting, 2 running, 3 stopping.
    pub op_state: u32,
    /// `srv_admin_state` bit field: 0x01 forced maint, 0x08 forced drain.
    pub admin_state: u32,
    /// `srv_uweight`: the user weight now.
    pub uweight: u32,
    /// `srv_iweight`: the configured weight.
    pub iweight: u32,
}

impl ServerState {
    /// Forced maintenance (agent or CLI), bit 0x01.
    pub fn is_maint(&self) -> bool {
        self.admin_state & 0x01 != 0
    }

    /// Forced drain (agent or CLI), bit 0x08.
    pub fn is_drain(&self) -> bool {
        self.admin_state & 0x08 != 0
    }

    /// Neither maint nor drain, at the configured weight.
    pub fn is_ready_full_weight(&self) -> bool {
        self.admin_state == 0 && self.uweight == self.iweight
    }
}

/// The HAProxy binary the tests run: `$GITLAB_HAPROXY_AGENT_TEST_HAPROXY`,
/// default `haproxy` from `PATH` (Debian bookworm's 2.6). scripts/test.sh
/// reruns the HAProxy-facing tests with it set to the 3.0 and 3.2 wrappers
/// that scripts/haproxy-chroots.sh installs.
pub fn haproxy_bin() -> String {
    std::env::var("GITLAB_HAPROXY_AGENT_TEST_HAPROXY")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "haproxy".to_string())
}

/// A real HAProxy (master-worker, foreground) on a config written to its own
/// directory, with an admin stats socket there. The binary is [`haproxy_bin`].
pub struct Haproxy {
    proc: Proc,
    dir: TempDir,
}

impl Haproxy {
    /// Writes `config` (where `{SOCKET}` is replaced by the stats socket path)
    /// and starts HAProxy; waits up to 10 s for the stats socket.
    pub fn start(config: &str) -> Haproxy {
        let dir = TempDir::new("haproxy");
        let socket = dir.path().join("admin.sock");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config.replace("{SOCKET}", socket.to_str().unwrap())).unwrap();
        let check = Command::new(haproxy_bin())
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "haproxy -c failed:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let mut cmd = Command::new(haproxy_bin());
        cmd.args(["-W", "-db", "-f"]).arg(&cfg);
        let proc = Proc::spawn(cmd, dir.path().join("haproxy.log"));
        let h = Haproxy { proc, dir };
        let ok = wait_for(Duration::from_secs(10), || {
            h.try_command("show info").filter(|s| s.contains("Pid:"))
        });
        assert!(ok.is_some(), "HAProxy did not start:\n{}", h.proc.log());
        h
    }

    /// The master process.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// The stats socket path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    /// Sends one command to the stats socket; `None` if it cannot connect.
    pub fn try_command(&self, command: &str) -> Option<String> {
        let mut s = UnixStream::connect(self.socket()).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(command.as_bytes()).ok()?;
        s.write_all(b"\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// Sends one command to the stats socket.
    pub fn command(&self, command: &str) -> String {
        self.try_command(command).unwrap_or_else(|| {
            panic!(
                "stats socket did not answer {command:?}:\n{}",
                self.proc.log()
            )
        })
    }

    /// The worker's PID from `show info`.
    pub fn worker_pid(&self) -> Option<u32> {
        let info = self.try_command("show info")?;
        info.lines()
            .find_map(|l| l.strip_prefix("Pid: "))
            .and_then(|p| p.trim().parse().ok())
    }

    /// Parses `show servers state` into rows keyed by (backend, server).
    pub fn servers_state(&self) -> HashMap<(String, String), ServerState> {
        let out = self.command("show servers state");
        let mut lines = out.lines();
        let _version = lines.next();
        let header: Vec<&str> = lines
            .next()
            .expect("header")
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (be, sv, op, admin, uw, iw) = (
            col("be_name"),
            col("srv_name"),
            col("srv_op_state"),
            col("srv_admin_state"),
            col("srv_uweight"),
            col("srv_iweight"),
        );
        lines
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let row = ServerState {
                    backend: f[be].into(),
                    server: f[sv].into(),
                    op_state: f[op].parse().unwrap(),
                    admin_state: f[admin].parse().unwrap(),
                    uweight: f[uw].parse().unwrap(),
                    iweight: f[iw].parse().unwrap(),
                };
                ((row.backend.clone(), row.server.clone()), row)
            })
            .collect()
    }

    /// One server's state.
    pub fn server(&self, backend: &str, server: &str) -> ServerState {
        self.servers_state()
            .remove(&(backend.to_string(), server.to_string()))
            .unwrap_or_else(|| panic!("no server {backend}/{server}"))
    }

    /// `show stat` rows by (backend, server), each a map from column name
    /// (`status`, `weight`, ...) to value.
    pub fn stat(&self) -> HashMap<(String, String), HashMap<String, String>> {
        let out = self.command("show stat");
        let mut lines = out.lines();
        let header: Vec<String> = lines
            .next()
            .unwrap()
            .trim_start_matches("# ")
            .split(',')
            .map(str::to_string)
            .collect();
        lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                let row = header
                    .iter()
                    .zip(f.iter())
                    .map(|(h, v)| (h.clone(), v.to_string()))
                    .collect();
                ((f[0].to_string(), f[1].to_string()), row)
            })
            .collect()
    }

    /// Waits up to `timeout` for `cond` to hold on one server.
    pub fn wait_server(
        &self,
        backend: &str,
        server: &str,
        timeout: Duration,
        cond: impl Fn(&ServerState) -> bool,
    ) -> ServerState {
        let found = wait_for(timeout, || Some(self.server(backend, server)).filter(&cond));
        found.unwrap_or_else(|| {
            panic!(
                "{backend}/{server} did not reach the expected state in {timeout:?}; now {:?}",
                self.server(backend, server)
            )
        })
    }

    /// Reloads HAProxy (SIGUSR2 to the master): a new worker starts from the
    /// configuration, with no server-state file. Waits for the new worker.
    /// A master that shows no reload within 5 s (no new worker; seen once
    /// on a loaded machine, the signal lost before it reached the master)
    /// is signalled once more, said on stderr with the master's pending
    /// signals, before the test fails.
    pub fn reload(&self) {
        let old = self.worker_pid();
        for attempt in 1..=2 {
            self.proc.signal("USR2");
            let new = wait_for(Duration::from_secs(5), || {
                self.worker_pid().filter(|p| Some(*p) != old)
            });
            if new.is_some() {
                return;
            }
            let status = std::fs::read_to_string(format!("/proc/{}/status", self.proc.pid()));
            let pending: Vec<String> = status
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("SigPnd") || l.starts_with("ShdPnd"))
                .map(str::to_string)
                .collect();
            eprintln!("HAProxy: no new worker 5 s after SIGUSR2 #{attempt}; master {pending:?}");
        }
        panic!("HAProxy did not reload:\n{}", self.proc.log());
    }
}

/// The agent binary, running.
pub struct Agent {
    proc: Proc,
    /// The agent-check listener.
    pub listen: SocketAddr,
    /// The HTTP listener.
    pub http: SocketAddr,
    dir: TempDir,
}

impl Agent {
    /// Starts the agent against `consul_url` with `extra` arguments (and
    /// `--wait 5s` and `--log-format text` unless they set them), on free
    /// ports; does not wait for readiness.
    pub fn spawn(consul_url: &str, extra: &[&str]) -> Agent {
        Self::spawn_on(consul_url, free_port(), free_port(), extra)
    }

    /// Like [`Agent::spawn`] on the given ports (to restart in place).
    pub fn spawn_on(consul_url: &str, port: u16, http_port: u16, extra: &[&str]) -> Agent {
        Self::spawn_env(consul_url, port, http_port, &[], extra)
    }

    /// Like [`Agent::spawn_on`] with extra environment variables.
    pub fn spawn_env(
        consul_url: &str,
        port: u16,
        http_port: u16,
        envs: &[(&str, &str)],
        extra: &[&str],
    ) -> Agent {
        Self::spawn_bin(
            Path::new(AGENT_BIN),
            consul_url,
            port,
            http_port,
            envs,
            extra,
        )
    }

    /// Like [`Agent::spawn_env`] with the agent binary at `bin` (the
    /// benchmark runs the release build it is given).
    pub fn spawn_bin(
        bin: &Path,
        consul_url: &str,
        port: u16,
        http_port: u16,
        envs: &[(&str, &str)],
        extra: &[&str],
    ) -> Agent {
        Self::spawn_with(bin, consul_url, port, http_port, envs, extra, None)
    }

    /// Like [`Agent::spawn_env`] with the agent's stderr into `stderr`
    /// (its log then is not in [`Agent::log`]).
    pub fn spawn_stderr(
        consul_url: &str,
        port: u16,
        http_port: u16,
        stderr: std::fs::File,
        extra: &[&str],
    ) -> Agent {
        let bin = Path::new(AGENT_BIN);
        Self::spawn_with(bin, consul_url, port, http_port, &[], extra, Some(stderr))
    }

    fn spawn_with(
        bin: &Path,
        consul_url: &str,
        port: u16,
        http_port: u16,
        envs: &[(&str, &str)],
        extra: &[&str],
        stderr: Option<std::fs::File>,
    ) -> Agent {
        let dir = TempDir::new("agent");
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let http = SocketAddr::from(([127, 0, 0, 1], http_port));
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .env("RUST_LOG", "info")
            .arg("--consul-addr")
            .arg(consul_url)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--http-listen")
            .arg(http.to_string())
            .args(if extra.contains(&"--log-format") {
                &[][..]
            } else {
                &["--log-format", "text"][..]
            })
            .args(if extra.contains(&"--wait") {
                &[][..]
            } else {
                &["--wait", "5s"][..]
            })
            .args(extra)
            .envs(envs.iter().copied());
        let log = dir.path().join("agent.log");
        let proc = match stderr {
            Some(stderr) => Proc::spawn_stderr(cmd, log, stderr),
            None => Proc::spawn(cmd, log),
        };
        Agent {
            proc,
            listen,
            http,
            dir,
        }
    }

    /// Starts the agent and waits (up to 15 s) for `/-/ready`.
    pub fn start(consul_url: &str, extra: &[&str]) -> Agent {
        let agent = Self::spawn(consul_url, extra);
        agent.wait_ready();
        agent
    }

    /// Waits up to 15 s for `/-/ready` to answer 200.
    pub fn wait_ready(&self) {
        self.wait_ready_within(Duration::from_secs(15));
    }

    /// Waits up to `timeout` for `/-/ready` to answer 200.
    pub fn wait_ready_within(&self, timeout: Duration) {
        let ok = wait_for(timeout, || {
            (self.http_get("/-/ready")?.0 == 200).then_some(())
        });
        assert!(ok.is_some(), "agent not ready:\n{}", self.proc.log());
    }

    /// The process.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The process, read-only (to signal it).
    pub fn proc_ref(&self) -> &Proc {
        &self.proc
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }

    /// GET on the HTTP listener: (status, body).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let (status, _, body) = http_request(self.http, "GET", path, b"")?;
        Some((status, String::from_utf8_lossy(&body).to_string()))
    }

    /// `/metrics` as text.
    pub fn metrics(&self) -> String {
        self.http_get("/metrics").expect("metrics answer").1
    }

    /// The value of one sample line, e.g.
    /// `gitlab_haproxy_agent_answers_total{kind="drain"}`.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.metrics();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Sends one agent-send line (LF added) and returns what the agent wrote
    /// before closing (empty: no answer).
    pub fn ask(&self, line: &str) -> String {
        ask_raw(self.listen, format!("{line}\n").as_bytes())
    }

    /// Waits up to 20 s for `line` to be answered `want`; panics with the
    /// last answer and the agent's log otherwise.
    #[track_caller]
    pub fn wait_answer(&self, line: &str, want: &str) {
        let ok = wait_for(Duration::from_secs(20), || {
            (self.ask(line) == want).then_some(())
        });
        assert!(
            ok.is_some(),
            "{line:?}: wanted {want:?}, got {:?}\n{}",
            self.ask(line),
            self.log()
        );
    }

    /// SIGTERM, then waits up to 10 s for the exit status.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        self.proc.signal("TERM");
        self.proc.wait_exit(Duration::from_secs(10))
    }
}

/// Connects to `addr`, writes `bytes`, and reads until the agent closes
/// (at most 5 s).
pub fn ask_raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to agent");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

/// One HAProxy `server` line enrolled with the agent: no traffic is sent to
/// `127.0.0.1:1`; `agent-inter` is short so tests converge fast.
pub fn server_line(
    backend: &str,
    server: &str,
    groups: &[&str],
    agent_port: u16,
    inter_ms: u64,
) -> String {
    let mut send = format!("{backend}/{server}");
    for g in groups {
        send.push(' ');
        send.push_str(g);
    }
    format!(
        "    server {server} 127.0.0.1:1 weight 100 agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter {inter_ms}ms agent-send \"{send}\\n\"\n"
    )
}

/// A minimal HAProxy config: an admin stats socket, no state file, and the
/// given backend sections.
pub fn haproxy_config(backends: &str) -> String {
    format!(
        "global\n    stats socket {{SOCKET}} mode 600 level admin\n\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n    timeout check 1s\n\n{backends}"
    )
}

pub mod schedule;
pub mod withhold;

/// Keeps `n` connections made by `open(i)` (set non-blocking) open until
/// `stop`: every `every`, each is drained of what the agent sent, and one the
/// agent closed is opened again, as a client that reconnects would. Returns
/// how many connections were opened again.
pub fn hold_connections(
    n: usize,
    open: impl Fn(usize) -> Option<std::net::TcpStream>,
    stop: &std::sync::atomic::AtomicBool,
    every: Duration,
) -> usize {
    use std::io::{ErrorKind, Read};
    let mut conns: Vec<_> = (0..n).map(&open).collect();
    let mut reopened = 0;
    let mut buf = [0u8; 4096];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for (i, c) in conns.iter_mut().enumerate() {
            let closed = match c {
                None => true,
                Some(s) => loop {
                    match s.read(&mut buf) {
                        Ok(0) => break true,
                        Ok(_) => continue,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                        Err(_) => break true,
                    }
                },
            };
            if closed {
                *c = open(i);
                reopened += 1;
            }
        }
        std::thread::sleep(every);
    }
    reopened
}

/// Agent-checks on `addr` as fast as `threads` clients can send them (a
/// new connection each, `web/web-T-N canary`), until `stop`; each thread
/// returns how many were answered `drain 100%`.
pub fn check_load(
    addr: SocketAddr,
    threads: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..threads)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut answered = 0u64;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    let _ = writeln!(s, "web/web-{t}-{} canary", i % 500);
                    let mut out = String::new();
                    if s.read_to_string(&mut out).is_ok() && out == "drain 100%\n" {
                        answered += 1;
                    }
                }
                answered
            })
        })
        .collect()
}
