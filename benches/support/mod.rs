//! Benchmark harness: the integration-test harness (`tests/support`: a
//! real Consul, real HAProxy and the agent binary as child processes on free
//! loopback ports, each stopped by its PID when dropped) plus what only the
//! benchmark needs: agents of a given binary on their own prefix, bulk KV
//! writes by transaction, readers of /proc for CPU time, resident memory,
//! open descriptors and context switches, a counting proxy for Consul
//! traffic, and the machine description and recording every run shares.
#![allow(dead_code)]

pub mod floor;
pub mod junk;
pub mod load;
pub mod proxy;
pub mod report;

#[path = "../../tests/support/mod.rs"]
mod harness;

use base64::Engine as _;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Deref;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use harness::{free_port, wait_every, Haproxy, Proc, TempDir};

/// A real Consul agent in dev mode (in-memory, single server) on loopback;
/// keys here are full keys (the benchmark writes under several prefixes).
pub struct Consul(harness::Consul);

impl Consul {
    /// Starts Consul (`-log-level warn`) on free ports; waits for a leader
    /// and a successful KV write.
    pub fn start() -> Consul {
        Consul(harness::Consul::start_with(&["-log-level", "warn"]))
    }

    /// Starts Consul with ACLs on (default policy deny) and
    /// `master_token` as the management token the harness's own requests
    /// carry.
    pub fn start_acl(master_token: &str) -> Consul {
        Consul(harness::Consul::start_acl(master_token))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// The HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Any HTTP request (with the management token when ACLs are on):
    /// (status, headers by lower-case name, body).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, HashMap<String, String>, Vec<u8>) {
        self.0.request(method, path, body)
    }

    /// Deletes the full key `key`.
    pub fn delete(&self, key: &str) {
        let (status, _, body) = self.0.request("DELETE", &format!("/v1/kv/{key}"), b"");
        assert!(
            status == 200 && body.trim_ascii() == b"true",
            "DELETE {key}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// Writes `value` at the full key `key`.
    pub fn put(&self, key: &str, value: &str) {
        let (status, _, body) = self
            .0
            .request("PUT", &format!("/v1/kv/{key}"), value.as_bytes());
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
            let ops: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(k, v)| {
                    serde_json::json!({"KV": {
                        "Verb": "set",
                        "Key": k,
                        "Value": base64::engine::general_purpose::STANDARD.encode(v),
                    }})
                })
                .collect();
            let body = serde_json::to_vec(&ops).expect("JSON");
            let (status, _, answer) = self.0.request("PUT", "/v1/txn", &body);
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
            let ops: Vec<serde_json::Value> = chunk
                .iter()
                .map(|k| serde_json::json!({"KV": {"Verb": "delete", "Key": k}}))
                .collect();
            let body = serde_json::to_vec(&ops).expect("JSON");
            let (status, _, _) = self.0.request("PUT", "/v1/txn", &body);
            assert_eq!(status, 200, "txn delete");
        }
    }

    /// A full recursive read of `prefix`, as the agent makes it: (body
    /// bytes, time taken).
    pub fn read_prefix(&self, prefix: &str) -> (usize, Duration) {
        let started = Instant::now();
        let (status, _, body) =
            self.0
                .request("GET", &format!("/v1/kv/{prefix}?recurse=true"), b"");
        let took = started.elapsed();
        assert!(status == 200 || status == 404, "read {prefix}: {status}");
        (body.len(), took)
    }
}

/// The agent binary, running: `--wait 60s`, `RUST_LOG=warn`.
pub struct Agent(harness::Agent);

impl Agent {
    /// Starts `bin` against `consul_url` watching `prefix` on free ports;
    /// does not wait for readiness.
    pub fn spawn(bin: &Path, consul_url: &str, prefix: &str, extra: &[&str]) -> Agent {
        let mut args = vec!["--prefix", prefix, "--wait", "60s"];
        args.extend_from_slice(extra);
        Agent(harness::Agent::spawn_bin(
            bin,
            consul_url,
            free_port(),
            free_port(),
            &[("RUST_LOG", "warn")],
            &args,
        ))
    }

    /// Waits up to `timeout` for `/-/ready`; panics with the log if not.
    pub fn wait_ready(&self, timeout: Duration) {
        self.0.wait_ready_within(timeout);
    }

    /// The sum of every sample of `name` (all label values).
    pub fn metric_sum(&self, name: &str) -> f64 {
        metric_sum(&self.metrics(), name)
    }

    /// Sends `line` (LF added) and returns what the agent wrote before
    /// closing; empty if it could not connect.
    pub fn ask(&self, line: &str) -> String {
        ask(self.listen, line)
    }
}

impl Deref for Agent {
    type Target = harness::Agent;

    fn deref(&self) -> &harness::Agent {
        &self.0
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

/// What the benchmark reads from HAProxy beyond the harness.
pub trait AdminStates {
    /// `srv_admin_state` of every row of `show servers state`, keyed by
    /// `backend/server`; empty while the socket does not answer.
    fn admin_states(&self) -> HashMap<String, u32>;
}

impl AdminStates for Haproxy {
    fn admin_states(&self) -> HashMap<String, u32> {
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
