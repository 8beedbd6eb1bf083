//! Hostile and broken clients for the benchmark, all on loopback: idle
//! connections to the agent-check port, clients that send one byte of an
//! HTTP request and stop, clients that ask for `/status` and never read,
//! and a stream of agent-send lines never seen before. Each kind reconnects
//! when the agent closes it, as a persistent client would. And a prober
//! that times `/-/ready` and `/-/healthy` as a kubelet would.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much junk, and where.
#[derive(Clone, Copy)]
pub struct JunkSpec {
    /// Idle connections held on the agent-check port.
    pub idle: usize,
    /// Clients holding one byte of an HTTP request on the HTTP port.
    pub one_byte: usize,
    /// Clients that ask for `/status` and never read the answer.
    pub slow_readers: usize,
    /// New, never-seen agent-send lines per second.
    pub unique_lines_per_sec: f64,
}

/// The junk, running until dropped.
pub struct Junk {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Connections made in all (reconnections included).
    pub connections: Arc<AtomicU64>,
    /// Unique lines sent.
    pub lines: Arc<AtomicU64>,
}

/// How long a slow reader keeps its connection before opening a new one:
/// past the agent's 10 s write timeout, so each is cut first.
const SLOW_READER_AGE: Duration = Duration::from_secs(11);

/// Holds `n` connections to `addr`, each having sent `bytes`, and opens
/// again any the peer closed (checked every 20 ms). With `slow_reader`,
/// each has a 4 KiB receive buffer, never reads, and is opened again after
/// [`SLOW_READER_AGE`] (unread data hides the peer's close).
fn hold(
    addr: SocketAddr,
    n: usize,
    bytes: &'static [u8],
    slow_reader: bool,
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let open = || -> Option<(TcpStream, Instant)> {
            let s = if slow_reader {
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .ok()?;
                sock.set_recv_buffer_size(4096).ok()?;
                sock.connect_timeout(&addr.into(), Duration::from_secs(1))
                    .ok()?;
                TcpStream::from(sock)
            } else {
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?
            };
            made.fetch_add(1, Ordering::Relaxed);
            (&s).write_all(bytes).ok()?;
            s.set_nonblocking(true).ok()?;
            Some((s, Instant::now()))
        };
        let mut conns: Vec<Option<(TcpStream, Instant)>> = (0..n).map(|_| open()).collect();
        let mut buf = [0u8; 64];
        while !stop.load(Ordering::Relaxed) {
            for c in conns.iter_mut() {
                let closed = match c {
                    None => true,
                    Some((_, opened)) if slow_reader => opened.elapsed() > SLOW_READER_AGE,
                    Some((s, _)) => loop {
                        match s.read(&mut buf) {
                            Ok(0) => break true,
                            Ok(_) => continue,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                            Err(_) => break true,
                        }
                    },
                };
                if closed && !stop.load(Ordering::Relaxed) {
                    *c = open();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

impl Junk {
    /// Starts `spec` against the agent's agent-check port `listen` and HTTP
    /// port `http`.
    pub fn start(listen: SocketAddr, http: SocketAddr, spec: JunkSpec) -> Junk {
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicU64::new(0));
        let lines = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        // Idle connections in four threads, so each is seen closed soon.
        let per = spec.idle.div_ceil(4);
        for _ in 0..4 {
            threads.push(hold(
                listen,
                per,
                b"",
                false,
                stop.clone(),
                connections.clone(),
            ));
        }
        threads.push(hold(
            http,
            spec.one_byte,
            b"G",
            false,
            stop.clone(),
            connections.clone(),
        ));
        threads.push(hold(
            http,
            spec.slow_readers,
            b"GET /status HTTP/1.1\r\nHost: agent\r\n\r\n",
            true,
            stop.clone(),
            connections.clone(),
        ));
        {
            let stop = stop.clone();
            let lines = lines.clone();
            let period = Duration::from_secs_f64(1.0 / spec.unique_lines_per_sec);
            threads.push(std::thread::spawn(move || {
                let start = Instant::now();
                let mut next = start;
                let mut n = 0u64;
                let mut buf = [0u8; 128];
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += period;
                    n += 1;
                    let line = format!("junk/j-{n:09} g-{n}\n");
                    let _ = super::load::check(listen, line.as_bytes(), &mut buf);
                    lines.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        Junk {
            stop,
            threads,
            connections,
            lines,
        }
    }
}

impl Drop for Junk {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Probes `/-/ready` and `/-/healthy` in turn every `every` until `stop`,
/// each with a 2 s timeout; returns the latencies in microseconds (sorted)
/// and the number that failed or timed out.
pub fn probe(
    http: SocketAddr,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<u32>, u64)> {
    std::thread::spawn(move || {
        let mut latencies = Vec::new();
        let mut failed = 0;
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let path = if i % 2 == 0 { "/-/ready" } else { "/-/healthy" };
            i += 1;
            let began = Instant::now();
            if probe_once(http, path) {
                latencies.push(began.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            } else {
                failed += 1;
            }
            std::thread::sleep(every);
        }
        latencies.sort_unstable();
        (latencies, failed)
    })
}

fn probe_once(http: SocketAddr, path: &str) -> bool {
    let timeout = Duration::from_secs(2);
    let Ok(mut s) = TcpStream::connect_timeout(&http, timeout) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(timeout));
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).is_ok() && out.starts_with(b"HTTP/1.1 200 ")
}
