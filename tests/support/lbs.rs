//! Load balancers under a Consul partition: each one a real HAProxy with one
//! enrolled server (`web/web-01`) and its own agent; a writer that sets the
//! server's weight to a new, ever higher value through `state set`; and a
//! watcher that samples every load balancer's `show servers state` and the
//! agent's own word on Consul (`/status` `consul_current`, the
//! `gitlab_haproxy_agent_consul_unconfirmed_seconds` gauge). Write k sets
//! weight `k%`, so a load balancer that shows a weight of k or more has
//! served write k: the time from a write's acknowledgement to every load
//! balancer showing it is read from the samples afterwards.
#![allow(dead_code)]

use std::io::{Read, Write as _};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{haproxy_config, http_request, server_line, wait_every, Agent, Haproxy, TempDir};

/// The one enrolled server's row key.
pub const ROW: &str = "web/web-01";
/// HAProxy's agent-inter for it: a load balancer shows a served write
/// within this of the agent serving it.
pub const AGENT_INTER_MS: u64 = 500;
/// How often the watcher samples every load balancer.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// One load balancer: HAProxy and the agent it asks.
pub struct Lb {
    /// e.g. `lb1 default via c1`.
    pub name: String,
    pub agent: Agent,
    pub haproxy: Haproxy,
}

impl Lb {
    /// Starts the agent `bin` on `consul_url` with `--wait 60s` (the
    /// default: what a parked query on a cut server costs) and `extra`,
    /// waits for it to be ready, then starts HAProxy asking it.
    pub fn start(bin: &Path, name: &str, consul_url: &str, extra: &[&str]) -> Lb {
        let mut args = vec!["--wait", "60s"];
        args.extend_from_slice(extra);
        let agent = Agent::spawn_bin(
            bin,
            consul_url,
            super::free_port(),
            super::free_port(),
            &[],
            &args,
        );
        agent.wait_ready_within(Duration::from_secs(30));
        let backend = format!(
            "backend web\n    balance roundrobin\n{}",
            server_line("web", "web-01", &[], agent.listen.port(), AGENT_INTER_MS)
        );
        let haproxy = Haproxy::start(&haproxy_config(&backend));
        Lb {
            name: name.to_string(),
            agent,
            haproxy,
        }
    }

    fn probe(&self) -> Probe {
        Probe {
            socket: self.haproxy.socket(),
            http: self.agent.http,
        }
    }
}

/// What the watcher needs of a load balancer (plain data, for its thread).
#[derive(Clone)]
struct Probe {
    socket: PathBuf,
    http: SocketAddr,
}

/// One sample of one load balancer.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: Instant,
    /// `srv_uweight` of web/web-01 (`None`: the socket did not answer).
    pub weight: Option<u32>,
    /// `/status` `consul_current` (`None`: no answer or no such field).
    pub current: Option<bool>,
    /// `gitlab_haproxy_agent_consul_unconfirmed_seconds` (`None`: absent).
    pub unconfirmed: Option<f64>,
}

/// `srv_uweight` of web/web-01 from `show servers state` on `socket`.
pub fn weight_of(socket: &Path) -> Option<u32> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"show servers state web\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    // Columns: be_id be_name srv_id srv_name srv_addr srv_op_state
    // srv_admin_state srv_uweight ...
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&"web") && f.get(3) == Some(&"web-01"))
        .and_then(|f| f.get(7)?.parse().ok())
}

fn sample(p: &Probe) -> Sample {
    let at = Instant::now();
    let weight = weight_of(&p.socket);
    let current = http_request(p.http, "GET", "/status", b"")
        .filter(|(s, _, _)| *s == 200)
        .and_then(|(_, _, body)| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .and_then(|v| v.get("consul_current")?.as_bool());
    let unconfirmed = http_request(p.http, "GET", "/metrics", b"")
        .filter(|(s, _, _)| *s == 200)
        .and_then(|(_, _, body)| {
            String::from_utf8_lossy(&body).lines().find_map(|l| {
                l.strip_prefix("gitlab_haproxy_agent_consul_unconfirmed_seconds ")?
                    .trim()
                    .parse()
                    .ok()
            })
        });
    Sample {
        at,
        weight,
        current,
        unconfirmed,
    }
}

/// Samples every load balancer every [`SAMPLE_EVERY`] in its own thread
/// until stopped.
pub struct Watch {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<Sample>>>,
}

impl Watch {
    pub fn start(lbs: &[Lb]) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = lbs
            .iter()
            .map(|lb| {
                let (probe, stop) = (lb.probe(), stop.clone());
                std::thread::spawn(move || {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        samples.push(sample(&probe));
                        std::thread::sleep(SAMPLE_EVERY);
                    }
                    samples
                })
            })
            .collect();
        Watch { stop, handles }
    }

    /// Stops sampling; the samples of each load balancer, in order.
    pub fn stop(self) -> Vec<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handles
            .into_iter()
            .map(|h| h.join().expect("watch thread"))
            .collect()
    }
}

/// One write of the writer.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    /// The weight written (`N%`), higher than every earlier one.
    pub weight: u32,
    pub sent: Instant,
    /// When `state set` exited 0; `None`: refused or timed out (killed).
    pub acked: Option<Instant>,
}

/// Runs `bin state set web/web-01 <weight>% --consul-addr <url>`, killed
/// by its PID after `timeout`.
pub fn write_weight(bin: &Path, url: &str, weight: u32, timeout: Duration) -> Write {
    let sent = Instant::now();
    let dir = TempDir::new("writer");
    let mut child = Command::new(bin)
        .env_clear()
        .args([
            "state",
            "set",
            ROW,
            &format!("{weight}%"),
            "--consul-addr",
            url,
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the writer");
    let status = wait_every(timeout, Duration::from_millis(10), || {
        child.try_wait().ok().flatten()
    });
    let acked = match status {
        Some(s) if s.success() => Some(Instant::now()),
        Some(_) => None,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    };
    Write {
        weight,
        sent,
        acked,
    }
}

/// Writes weights `first`, `first + 1`, ... one every `every` (or right
/// after the previous one when it took longer), until stopped, each
/// bounded by `timeout`, through the first of `urls`, moving to the next
/// after a failed write: a follower that still forwards to a leader cut
/// off holds a write for 10 s (its dial timeout), while the quorum's new
/// leader, one of `urls`, takes it at once.
pub struct Writer {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Write>>,
}

impl Writer {
    pub fn start(
        bin: &Path,
        urls: &[String],
        first: u32,
        every: Duration,
        timeout: Duration,
    ) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (bin, urls, stop2) = (bin.to_path_buf(), urls.to_vec(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut writes = Vec::new();
            let (mut weight, mut url) = (first, 0);
            while !stop2.load(Ordering::Relaxed) && weight <= 256 {
                let w = write_weight(&bin, &urls[url % urls.len()], weight, timeout);
                if w.acked.is_none() {
                    url += 1;
                }
                writes.push(w);
                weight += 1;
                let next = w.sent + every;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                }
            }
            writes
        });
        Writer { stop, handle }
    }

    /// Stops after the write in flight; every write made.
    pub fn stop(self) -> Vec<Write> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("writer thread")
    }
}

/// For each acknowledged write, how long after its acknowledgement a load
/// balancer first showed it (a weight at or above it) in `samples`; zero
/// when it showed it before the acknowledgement. `None`: never shown.
pub fn delays(writes: &[Write], samples: &[Sample]) -> Vec<(Write, Option<Duration>)> {
    writes
        .iter()
        .filter(|w| w.acked.is_some())
        .map(|w| {
            let shown = samples
                .iter()
                .find(|s| s.weight.is_some_and(|x| x >= w.weight))
                .map(|s| s.at.saturating_duration_since(w.acked.unwrap()));
            (*w, shown)
        })
        .collect()
}

/// The first sample from `from` to `until` where the agent says it is not
/// current (`consul_current` false and the gauge above 0), as a delay
/// from `from`.
pub fn says_unconfirmed(samples: &[Sample], from: Instant, until: Instant) -> Option<Duration> {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at <= until)
        .find(|s| s.current == Some(false) && s.unconfirmed.is_some_and(|u| u > 0.0))
        .map(|s| s.at - from)
}

/// Waits up to `timeout` until every load balancer shows `weight` or more;
/// false if one does not.
pub fn wait_all_show(lbs: &[Lb], weight: u32, timeout: Duration) -> bool {
    wait_every(timeout, SAMPLE_EVERY, || {
        lbs.iter()
            .all(|lb| weight_of(&lb.haproxy.socket()).is_some_and(|w| w >= weight))
            .then_some(())
    })
    .is_some()
}

/// The `q`-quantile (0..=1, nearest rank) of `d`, which it sorts.
pub fn quantile(d: &mut [Duration], q: f64) -> Option<Duration> {
    if d.is_empty() {
        return None;
    }
    d.sort();
    let rank = ((q * d.len() as f64).ceil() as usize).clamp(1, d.len());
    Some(d[rank - 1])
}
