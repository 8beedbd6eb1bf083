//! A closed-loop agent-check load generator: each thread connects, sends one
//! agent-send line, reads the reply until the responder closes, closes, and
//! only then starts the next check; optionally paced to a fixed total rate.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one run measured.
#[derive(Debug, Default)]
pub struct LoadResult {
    /// Checks answered with the expected line.
    pub answered: u64,
    /// Checks that failed: connect error, no line, or an unexpected line.
    pub failed: u64,
    /// Latency of each answered check (connect to close), in microseconds,
    /// sorted.
    pub latencies_us: Vec<u32>,
    /// Wall time from the first check to the last thread's end.
    pub elapsed: Duration,
}

impl LoadResult {
    /// Answered checks per second.
    pub fn rate(&self) -> f64 {
        self.answered as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q` quantile (0..=1) of latency in milliseconds (nearest rank).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile(&self.latencies_us, q) as f64 / 1000.0
    }

    /// Adds another run's figures (phases split into rounds).
    pub fn merge(&mut self, other: LoadResult) {
        self.answered += other.answered;
        self.failed += other.failed;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
        self.latencies_us.sort_unstable();
    }
}

/// The `q` quantile of sorted samples (nearest rank); 0 when empty.
pub fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How to load the responder.
#[derive(Clone)]
pub struct LoadSpec {
    /// Client threads, each one check at a time.
    pub threads: usize,
    /// How long to run.
    pub duration: Duration,
    /// Total checks per second across threads; `None` for as fast as the
    /// responder answers.
    pub rate: Option<f64>,
    /// Agent-send lines, LF included; thread `t` sends lines `t`, `t +
    /// threads`, ... in turn.
    pub lines: Arc<Vec<Vec<u8>>>,
    /// The reply every check must get; `None` accepts any line.
    pub expect: Option<&'static [u8]>,
}

/// One check: the reply bytes, or `None` when the connection failed.
pub fn check(addr: SocketAddr, line: &[u8], buf: &mut [u8; 128]) -> Option<usize> {
    let mut s = TcpStream::connect(addr).ok()?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(line).ok()?;
    let mut filled = 0;
    loop {
        match s.read(&mut buf[filled..]) {
            Ok(0) => return Some(filled),
            Ok(n) => {
                filled += n;
                if filled == buf.len() {
                    return Some(filled);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

/// Runs `spec` against `addr`; `stop` ends it early.
pub fn run(addr: SocketAddr, spec: &LoadSpec, stop: &AtomicBool) -> LoadResult {
    let start = Instant::now();
    let deadline = start + spec.duration;
    let results: Vec<LoadResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..spec.threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut r = LoadResult {
                        latencies_us: Vec::with_capacity(1 << 16),
                        ..LoadResult::default()
                    };
                    let period = spec
                        .rate
                        .map(|rate| Duration::from_secs_f64(spec.threads as f64 / rate));
                    // Threads start evenly spread over one period.
                    let mut next = start
                        + period.map_or(Duration::ZERO, |p| p * t as u32 / spec.threads as u32);
                    let mut i = t;
                    let mut buf = [0u8; 128];
                    loop {
                        let now = Instant::now();
                        if now >= deadline || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Some(p) = period {
                            if next > now {
                                std::thread::sleep(next - now);
                            }
                            next += p;
                        }
                        let line = &spec.lines[i % spec.lines.len()];
                        i += spec.threads;
                        let began = Instant::now();
                        let got = check(addr, line, &mut buf);
                        let took = began.elapsed();
                        let ok = match (got, spec.expect) {
                            (Some(n), Some(want)) => &buf[..n] == want,
                            (Some(n), None) => n > 1 && buf[n - 1] == b'\n',
                            (None, _) => false,
                        };
                        if ok {
                            r.answered += 1;
                            r.latencies_us
                                .push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                        } else {
                            r.failed += 1;
                            if got.is_none() {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                    }
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed();
    let mut total = LoadResult {
        elapsed,
        ..LoadResult::default()
    };
    for r in results {
        total.answered += r.answered;
        total.failed += r.failed;
        total.latencies_us.extend(r.latencies_us);
    }
    total.latencies_us.sort_unstable();
    total
}
