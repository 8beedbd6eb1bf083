//! Benchmark harness: a real Consul (`consul agent -dev`), real HAProxy and
//! the release agent binary as child processes on free loopback ports, each
//! stopped by its PID when dropped; plus readers of /proc for CPU time,
//! resident memory, open descriptors and context switches.
#![allow(dead_code)]

pub mod floor;
pub mod load;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A loopback TCP port nobody listens on now, below the ephemeral range so
/// the load generator's client ports never take it. Never hands out the
/// same port twice in one run.
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(|| Mutex::new(HashSet::new()));
    let _ = NEXT.compare_exchange(
        0,
        10_000 + (std::process::id() % 200) as u16 * 100,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..20_000 {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 10_000 + (n - 10_000) % 22_000;
        if given.lock().unwrap().contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.lock().unwrap().insert(port);
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `/tmp/gha-bench-<name>-<pid>-<n>`.
    pub fn new(name: &str) -> Self {
        static N: AtomicU16 = AtomicU16::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gha-bench-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `cond` every `every` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(
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

/// A child process killed (SIGKILL) and reaped by its PID on drop.
pub struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr into `log`.
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
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

    /// Wraps a child started elsewhere.
    pub fn from_child(child: Child, log: PathBuf) -> Proc {
        Proc {
            child: Some(child),
            log,
        }
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

/// One HTTP/1.1 request with `Connection: close`: (status, headers, body).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, HashMap<String, String>, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .ok()?;
    let _ = stream.set_nodelay(true);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut headers = HashMap::new();
    let mut chunked = false;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            if k == "transfer-encoding" && v.trim().eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
            headers.insert(k, v.trim().to_string());
        }
    }
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body);
    }
    Some((status, headers, body))
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(pos) = data.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..pos]).trim(), 16).unwrap_or(0);
        if size == 0 || data.len() < pos + 2 + size {
            break;
        }
        out.extend_from_slice(&data[pos + 2..pos + 2 + size]);
        data = data.get(pos + 2 + size + 2..).unwrap_or_default();
    }
    out
}

/// Standard padded base64, for `PUT /v1/txn` values.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A real Consul agent in dev mode (in-memory, single server) on loopback.
pub struct Consul {
    proc: Proc,
    http_port: u16,
    _dir: TempDir,
}

impl Consul {
    /// Starts Consul on free ports; waits up to 30 s for a leader and a
    /// successful KV write.
    pub fn start() -> Consul {
        let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        let dir = TempDir::new("consul");
        let mut cmd = Command::new("consul");
        cmd.args([
            "agent",
            "-dev",
            "-bind",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
            "-log-level",
            "warn",
        ])
        .arg(format!("-http-port={}", ports[0]))
        .arg(format!("-dns-port={}", ports[1]))
        .arg(format!("-serf-lan-port={}", ports[2]))
        .arg(format!("-serf-wan-port={}", ports[3]))
        .arg(format!("-server-port={}", ports[4]))
        .arg(format!("-grpc-port={}", ports[5]));
        let proc = Proc::spawn(cmd, dir.path().join("consul.log"));
        let consul = Consul {
            proc,
            http_port: ports[0],
            _dir: dir,
        };
        let ok = wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            let (status, _, body) = http_request(consul.addr(), "GET", "/v1/status/leader", b"")?;
            (status == 200 && body.len() > 4).then_some(())
        })
        .and_then(|()| {
            wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
                let (status, _, _) = http_request(consul.addr(), "PUT", "/v1/kv/bench-ping", b"1")?;
                (status == 200).then_some(())
            })
        });
        assert!(ok.is_some(), "Consul did not start:\n{}", consul.proc.log());
        consul
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http_port))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Any request; panics if Consul does not answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, HashMap<String, String>, Vec<u8>) {
        http_request(self.addr(), method, path, body)
            .unwrap_or_else(|| panic!("Consul did not answer {method} {path}"))
    }

    /// Writes `value` at the full key `key`.
    pub fn put(&self, key: &str, value: &str) {
        let (status, _, body) = self.request("PUT", &format!("/v1/kv/{key}"), value.as_bytes());
        assert!(
            status == 200 && body.trim_ascii() == b"true",
            "PUT {key}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Writes every (full key, value) pair with `PUT /v1/txn`, 64 operations
    /// per transaction (the 1.8.7 limit).
    pub fn put_many(&self, pairs: &[(String, String)]) {
        for chunk in pairs.chunks(64) {
            let ops: Vec<String> = chunk
                .iter()
                .map(|(k, v)| {
                    format!(
                        r#"{{"KV":{{"Verb":"set","Key":"{k}","Value":"{}"}}}}"#,
                        base64(v.as_bytes())
                    )
                })
                .collect();
            let body = format!("[{}]", ops.join(","));
            let (status, _, answer) = self.request("PUT", "/v1/txn", body.as_bytes());
            assert_eq!(
                status,
                200,
                "txn: {}",
                String::from_utf8_lossy(&answer[..answer.len().min(400)])
            );
        }
    }

    /// Deletes every full key with `PUT /v1/txn`, 64 per transaction.
    pub fn delete_many(&self, keys: &[String]) {
        for chunk in keys.chunks(64) {
            let ops: Vec<String> = chunk
                .iter()
                .map(|k| format!(r#"{{"KV":{{"Verb":"delete","Key":"{k}"}}}}"#))
                .collect();
            let body = format!("[{}]", ops.join(","));
            let (status, _, _) = self.request("PUT", "/v1/txn", body.as_bytes());
            assert_eq!(status, 200, "txn delete");
        }
    }

    /// A full recursive read of `prefix`, as the agent makes it: (body
    /// bytes, time taken).
    pub fn read_prefix(&self, prefix: &str) -> (usize, Duration) {
        let started = Instant::now();
        let (status, _, body) = self.request("GET", &format!("/v1/kv/{prefix}?recurse=true"), b"");
        let took = started.elapsed();
        assert!(status == 200 || status == 404, "read {prefix}: {status}");
        (body.len(), took)
    }
}

/// The agent binary, running.
pub struct Agent {
    proc: Proc,
    /// The agent-check listener.
    pub listen: SocketAddr,
    /// The HTTP listener.
    pub http: SocketAddr,
    _dir: TempDir,
}

impl Agent {
    /// Starts `bin` against `consul_url` watching `prefix` with `--wait 60s`
    /// on free ports; does not wait for readiness.
    pub fn spawn(bin: &Path, consul_url: &str, prefix: &str, extra: &[&str]) -> Agent {
        let dir = TempDir::new("agent");
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .env("RUST_LOG", "warn")
            .arg("--consul-addr")
            .arg(consul_url)
            .arg("--prefix")
            .arg(prefix)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--http-listen")
            .arg(http.to_string())
            .args(["--wait", "60s", "--log-format", "text"])
            .args(extra);
        let proc = Proc::spawn(cmd, dir.path().join("agent.log"));
        Agent {
            proc,
            listen,
            http,
            _dir: dir,
        }
    }

    /// Waits up to `timeout` for `/-/ready`; panics with the log if not.
    pub fn wait_ready(&self, timeout: Duration) {
        let ok = wait_for(timeout, Duration::from_millis(50), || {
            let (status, _, _) = http_request(self.http, "GET", "/-/ready", b"")?;
            (status == 200).then_some(())
        });
        assert!(ok.is_some(), "agent not ready:\n{}", self.proc.log());
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// `/metrics` as text.
    pub fn metrics(&self) -> String {
        let (_, _, body) = http_request(self.http, "GET", "/metrics", b"").expect("metrics answer");
        String::from_utf8_lossy(&body).to_string()
    }

    /// The sum of every sample of `name` (all label values).
    pub fn metric_sum(&self, name: &str) -> f64 {
        metric_sum(&self.metrics(), name)
    }

    /// Sends `line` (LF added) and returns what the agent wrote before
    /// closing.
    pub fn ask(&self, line: &str) -> String {
        ask(self.listen, line)
    }
}

/// The sum of every sample of `name` in Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = if let Some(labels) = rest.strip_prefix('{') {
                labels.split_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// Connects to `addr`, sends `line` and LF, and reads until close (at most
/// 2 s); empty if nothing came back.
pub fn ask(addr: SocketAddr, line: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return String::new();
    };
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(format!("{line}\n").as_bytes());
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

/// A real HAProxy (master-worker, foreground) with an admin stats socket.
pub struct Haproxy {
    proc: Proc,
    dir: TempDir,
}

impl Haproxy {
    /// Writes `config` (`{SOCKET}` replaced by the socket path), checks it
    /// with `haproxy -c`, starts HAProxy and waits up to 15 s for the socket.
    pub fn start(config: &str) -> Haproxy {
        let dir = TempDir::new("haproxy");
        let socket = dir.path().join("admin.sock");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config.replace("{SOCKET}", socket.to_str().unwrap())).unwrap();
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-q")
            .arg("-f")
            .arg(&cfg)
            .output()
            .expect("haproxy -c");
        assert!(
            check.status.success(),
            "haproxy -c failed:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        let mut cmd = Command::new("haproxy");
        cmd.args(["-W", "-db", "-f"]).arg(&cfg);
        let proc = Proc::spawn(cmd, dir.path().join("haproxy.log"));
        let h = Haproxy { proc, dir };
        let ok = wait_for(Duration::from_secs(15), Duration::from_millis(50), || {
            h.try_command("show info").filter(|s| s.contains("Pid:"))
        });
        assert!(ok.is_some(), "HAProxy did not start:\n{}", h.proc.log());
        h
    }

    /// Sends one command to the stats socket.
    pub fn try_command(&self, command: &str) -> Option<String> {
        let mut s = UnixStream::connect(self.dir.path().join("admin.sock")).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{command}\n").as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// `srv_admin_state` of every row of `show servers state`, keyed by
    /// `backend/server`.
    pub fn admin_states(&self) -> HashMap<String, u32> {
        let out = self.try_command("show servers state").unwrap_or_default();
        let mut lines = out.lines();
        let _version = lines.next();
        let Some(header) = lines.next() else {
            return HashMap::new();
        };
        let header: Vec<&str> = header.trim_start_matches('#').split_whitespace().collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (Some(be), Some(sv), Some(admin)) =
            (col("be_name"), col("srv_name"), col("srv_admin_state"))
        else {
            return HashMap::new();
        };
        lines
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((
                    format!("{}/{}", f.get(be)?, f.get(sv)?),
                    f.get(admin)?.parse().ok()?,
                ))
            })
            .collect()
    }
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
pub fn clock_ticks() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100)
    })
}

/// utime + stime of `pid` (every thread, live or exited), in microseconds,
/// from /proc/PID/stat (clock-tick resolution).
pub fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, the 12th and 13th after the name.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 1_000_000 / clock_ticks()
}

/// Time on CPU of the live threads of `pid`, in nanoseconds, from
/// /proc/PID/task/*/schedstat: exact, where utime + stime move in clock
/// ticks (for idle figures, where a tick is most of the signal).
pub fn cpu_ns_threads(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A `kB` field of /proc/PID/status (`VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Voluntary plus involuntary context switches summed over the live threads
/// of `pid`: how often it was woken.
pub fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Threads of `pid`.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The 1-minute load average.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}
