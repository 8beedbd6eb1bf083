//! The agent-check responder: HAProxy connects every `agent-inter`, sends its
//! agent-send line, reads one reply line and closes (doc configuration.txt
//! "agent-check"). Every connection is bounded in count, bytes and time, and
//! answers come from the in-memory snapshot without waiting on Consul.
//!
//! It runs on its own thread with one edge-triggered epoll set (mio), not on
//! the tokio runtime: at HAProxy's rates every check finds the responder
//! asleep, and a plain epoll wake-up costs less than a runtime's (CPU per
//! check within 1.2x of the bare epoll floor's at 5,000 checks/s, against
//! 1.75x on tokio: BENCHMARKS.md, "Responder cost"). A line already there at accept
//! (the usual case) is answered at once, without registering the socket;
//! only a line still on its way is registered and waited for, until its
//! deadline.

pub mod metrics;

use std::collections::VecDeque;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn};

use crate::agent::shared::Shared;
use crate::model::identity::{check_line, identities, MAX_LINE};
use crate::model::snapshot::Answer;
use crate::model::value::{AnswerKind, ReplyLine};

/// Longest the loop sleeps: 1 s, so it proves it is alive to the systemd
/// watchdog (and sees shutdown) at least once a second even when idle.
const HEARTBEAT: Duration = Duration::from_secs(1);

const LISTENER: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);

/// Responder settings.
#[derive(Debug, Clone, Copy)]
pub struct ResponderConfig {
    /// Connections waiting for their line at once; a connection whose line
    /// is there at accept needs no slot and is answered at the cap too. At
    /// the cap, a connection that has to wait takes the slot of the one that
    /// has waited longest, which is closed unanswered (counted in
    /// `gitlab_haproxy_agent_connections_refused_total`), so silent clients
    /// cannot keep HAProxy's checks out. Default 1024.
    pub max_connections: usize,
    /// Time a client has to send its line. Default 500 ms, well under the
    /// 2 s agent-inter: a silent client cannot hold a slot.
    pub check_timeout: Duration,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        ResponderConfig {
            max_connections: 1024,
            check_timeout: Duration::from_millis(500),
        }
    }
}

/// Binds the agent-check listener on `addr` as the responder wants it:
/// `SO_REUSEADDR`, backlog 128, non-blocking.
///
/// # Errors
///
/// The bind or listen error (address in use, permission denied, ...).
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    Ok(TcpListener::bind(addr)?.into())
}

/// Serves agent-checks on `listener` on a thread of its own (run through
/// `tracker`, so shutdown can wait for it) until `shutdown` is cancelled;
/// then it closes the listener at once, lets the connections in flight
/// finish within their `check_timeout`, and returns. Must be called within
/// a tokio runtime (a task wakes the loop on shutdown).
///
/// # Errors
///
/// Setting up the epoll set or the listener failed (out of descriptors or
/// memory); nothing is served then.
pub fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    config: ResponderConfig,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    let poll = Poll::new()?;
    let waker = Waker::new(poll.registry(), WAKER)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let responder = Responder {
        poll,
        listener: Some(listener),
        shared,
        config,
        shutdown: shutdown.clone(),
        conns: Vec::new(),
        free: Vec::new(),
        open: 0,
        deadlines: DeadlineQueue::default(),
        accept_failures: 0,
        accept_paused_until: None,
        scratch: Box::new([0; MAX_LINE]),
    };
    tracker.spawn(async move {
        shutdown.cancelled().await;
        // The loop also checks the token at least once a second.
        let _ = waker.wake();
    });
    tracker.spawn_blocking(move || responder.run());
    Ok(())
}

/// A connection slot. Its token in the epoll set is its index; its
/// generation tells a deadline of the connection it holds from one of an
/// earlier connection in the same slot.
struct Slot {
    generation: u32,
    /// The connection waiting for its line, if any.
    stream: Option<TcpStream>,
    /// When it was accepted.
    started: Instant,
    /// Bytes of the line received so far, in `buf`.
    filled: usize,
    buf: [u8; MAX_LINE],
}

/// The loop's state, owned by its thread.
struct Responder {
    poll: Poll,
    /// `None` once shutdown has begun: new connections are refused.
    listener: Option<TcpListener>,
    shared: Arc<Shared>,
    config: ResponderConfig,
    shutdown: CancellationToken,
    /// Connections waiting for their line; free slots are reused, so after
    /// warm-up a check allocates nothing.
    conns: Vec<Slot>,
    free: Vec<usize>,
    /// Slots in use.
    open: usize,
    deadlines: DeadlineQueue<(usize, u32)>,
    /// Consecutive accept failures for lack of descriptors or memory.
    accept_failures: u32,
    /// Accepting is paused until then after such a failure.
    accept_paused_until: Option<Instant>,
    /// Where a line already there at accept is read.
    scratch: Box<[u8; MAX_LINE]>,
}

impl Responder {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_beat = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next_beat {
                self.shared.responder_heartbeat.beat();
                next_beat = now + HEARTBEAT;
            }
            self.expire(now);
            if self.shutdown.is_cancelled() {
                // Closing the listener refuses new connections at once;
                // those in flight finish within their deadline.
                self.listener = None;
                self.accept_paused_until = None;
                if self.open == 0 {
                    return;
                }
            }
            if self.accept_paused_until.is_some_and(|until| now >= until) {
                // Edge-triggered: connections that queued up meanwhile
                // raise no new event.
                self.accept_paused_until = None;
                self.accept_all();
            }
            let mut wake = next_beat;
            if let Some(at) = self.next_deadline() {
                wake = wake.min(at);
            }
            if let Some(at) = self.accept_paused_until {
                wake = wake.min(at);
            }
            let timeout = wake.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    error!(error = %e, "epoll_wait failed; retrying in 100 ms");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    LISTENER => {
                        if self.accept_paused_until.is_none() {
                            self.accept_all();
                        }
                    }
                    Token(slot) => self.on_readable(slot),
                }
            }
        }
    }

    /// Accepts until the backlog is empty, or pauses accepting after a
    /// failure that is not the connection's own.
    fn accept_all(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, _peer)) => {
                    self.accept_failures = 0;
                    self.take(stream);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.shared.metrics.checks.accept_errors.inc();
                    if is_per_connection(&e) {
                        continue;
                    }
                    // Out of file descriptors or memory: pause accepting and
                    // keep serving; connections already open finish and free
                    // what they hold.
                    self.accept_failures = self.accept_failures.saturating_add(1);
                    let failures = self.accept_failures;
                    if failures == 1 || failures.is_power_of_two() {
                        warn!(error = %e, failures, "accept failed; backing off");
                    }
                    self.accept_paused_until = Some(Instant::now() + accept_pause(failures));
                    return;
                }
            }
        }
    }

    /// Serves a connection just accepted: answered at once if its line is
    /// already there (it needs no slot, so even at the cap), else registered
    /// to wait for it, or refused when every slot is taken.
    fn take(&mut self, stream: TcpStream) {
        let started = Instant::now();
        let mut filled = 0;
        match read_line(&mut &stream, &mut self.scratch[..], &mut filled) {
            Progress::Line(len) => answer(&stream, &self.scratch[..len], &self.shared),
            Progress::Refused => self
                .shared
                .metrics
                .checks
                .answers(AnswerKind::BadRequest)
                .inc(),
            Progress::Pending => {
                if self.open >= self.config.max_connections && !self.close_oldest() {
                    // No slot and none to free (a cap of zero).
                    self.shared.metrics.checks.connections_refused.inc();
                    return;
                }
                return self.wait_for_line(stream, started, filled);
            }
        }
        drop(stream);
        observe(&self.shared, started);
    }

    /// Registers a connection whose line has not (fully) arrived; the first
    /// `filled` bytes of it are in the scratch buffer.
    fn wait_for_line(&mut self, mut stream: TcpStream, started: Instant, filled: usize) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(Slot {
                generation: 0,
                stream: None,
                started,
                filled: 0,
                buf: [0; MAX_LINE],
            });
            self.conns.len() - 1
        });
        let registered =
            self.poll
                .registry()
                .register(&mut stream, Token(slot), Interest::READABLE);
        if let Err(e) = registered {
            debug!(error = %e, "cannot wait for an agent-send line");
            self.free.push(slot);
            self.shared
                .metrics
                .checks
                .answers(AnswerKind::BadRequest)
                .inc();
            observe(&self.shared, started);
            return;
        }
        let entry = &mut self.conns[slot];
        entry.buf[..filled].copy_from_slice(&self.scratch[..filled]);
        entry.filled = filled;
        entry.started = started;
        entry.stream = Some(stream);
        self.deadlines.push(
            started + self.config.check_timeout,
            (slot, entry.generation),
        );
        self.open += 1;
        self.shared.metrics.checks.connections_in_flight.inc();
    }

    /// Reads what arrived on a waiting connection; answers and closes it once
    /// its line is complete, closes it unanswered if the line cannot be.
    fn on_readable(&mut self, slot: usize) {
        let Some(entry) = self.conns.get_mut(slot) else {
            return;
        };
        let Some(stream) = &entry.stream else {
            return;
        };
        match read_line(&mut &*stream, &mut entry.buf, &mut entry.filled) {
            Progress::Pending => return,
            Progress::Line(len) => answer(stream, &entry.buf[..len], &self.shared),
            Progress::Refused => self
                .shared
                .metrics
                .checks
                .answers(AnswerKind::BadRequest)
                .inc(),
        }
        self.close(slot);
    }

    /// Closes connections whose deadline has passed, unanswered.
    fn expire(&mut self, now: Instant) {
        while let Some((slot, generation)) = self.deadlines.pop_expired(now) {
            if self.is_live(slot, generation) {
                self.shared
                    .metrics
                    .checks
                    .answers(AnswerKind::BadRequest)
                    .inc();
                self.close(slot);
            }
        }
    }

    /// Closes, unanswered, the connection that has waited longest for its
    /// line, to make room at the cap: it has had the most time to send a
    /// line and has not, while HAProxy sends its line right after
    /// connecting. Counted in `connections_refused_total`. Returns false if
    /// no connection is waiting.
    fn close_oldest(&mut self) -> bool {
        // Every connection gets the same timeout from its accept, so the
        // earliest live deadline is the oldest waiting connection's.
        if self.next_deadline().is_none() {
            return false;
        }
        let Some((slot, _)) = self.deadlines.pop_front() else {
            return false;
        };
        self.shared.metrics.checks.connections_refused.inc();
        self.close(slot);
        true
    }

    /// The earliest deadline of a connection still waiting.
    fn next_deadline(&mut self) -> Option<Instant> {
        let conns = &self.conns;
        self.deadlines.next(|(slot, generation)| {
            conns[slot].generation == generation && conns[slot].stream.is_some()
        })
    }

    fn is_live(&self, slot: usize, generation: u32) -> bool {
        let entry = &self.conns[slot];
        entry.generation == generation && entry.stream.is_some()
    }

    /// Closes a waiting connection (which also takes it out of the epoll
    /// set) and frees its slot.
    fn close(&mut self, slot: usize) {
        let entry = &mut self.conns[slot];
        entry.stream = None;
        entry.generation = entry.generation.wrapping_add(1);
        let started = entry.started;
        self.free.push(slot);
        self.open -= 1;
        self.shared.metrics.checks.connections_in_flight.dec();
        observe(&self.shared, started);
    }
}

/// How long accepting pauses after `failures` consecutive failures for lack
/// of descriptors or memory: 20 ms doubling up to 640 ms.
fn accept_pause(failures: u32) -> Duration {
    Duration::from_millis(10u64 << failures.min(6))
}

/// Accept errors that concern one connection only (it was reset before we
/// took it): retry at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Records the time from accept to close in the answer-duration histogram.
fn observe(shared: &Shared, started: Instant) {
    shared
        .metrics
        .checks
        .answer_duration
        .observe(started.elapsed().as_secs_f64());
}

/// Decides on a complete line and writes the reply, if any. The reply is
/// the first data sent on this connection, so the send buffer is empty and
/// one write takes it whole; closing the socket then sends FIN right after.
fn answer(stream: &TcpStream, line: &[u8], shared: &Shared) {
    if let Some(reply) = decide(line, shared) {
        let _ = (&*stream).write(reply.as_bytes());
    }
}

/// What reading a connection so far has given.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    /// A whole line of this length (LF excluded) is in the buffer.
    Line(usize),
    /// No LF yet and nothing more to read for now: wait for readiness.
    Pending,
    /// Closed, failed, or a line too long: no answer.
    Refused,
}

/// Reads from a non-blocking `stream` into `buf` after the `filled` bytes
/// already there (which hold no LF) until an LF arrives, the stream has
/// nothing more for now, or `buf` is full. Edge-triggered readiness needs
/// the stream read until it would block, unless the line is complete.
fn read_line<R: io::Read>(stream: &mut R, buf: &mut [u8], filled: &mut usize) -> Progress {
    loop {
        if *filled == buf.len() {
            return Progress::Refused;
        }
        match stream.read(&mut buf[*filled..]) {
            Ok(0) => return Progress::Refused,
            Ok(n) => {
                let new = &buf[*filled..*filled + n];
                if let Some(pos) = new.iter().position(|&b| b == b'\n') {
                    return Progress::Line(*filled + pos);
                }
                *filled += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::Pending,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Progress::Refused,
        }
    }
}

/// Parses one agent-send line (LF excluded), looks it up in the snapshot,
/// counts and records it, and returns the reply to send, if any.
fn decide(line: &[u8], shared: &Shared) -> Option<ReplyLine> {
    let text = match check_line(line) {
        Ok(text) => text,
        Err(e) => {
            debug!(error = %e, "bad agent-send line");
            shared.metrics.checks.answers(AnswerKind::BadRequest).inc();
            return None;
        }
    };
    let row = text.trim();
    if row == crate::check_ready::PROBE_IDENTITY {
        return probe_reply(shared);
    }
    shared.metrics.checks.last_check_timestamp.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    );
    let snapshot = shared.snapshot.load();
    let Some(snapshot) = snapshot.as_ref() else {
        shared.metrics.checks.answers(AnswerKind::Unsynced).inc();
        shared.seen.record(row, AnswerKind::Unsynced, None, 0, None);
        return None;
    };
    let answer = snapshot.lookup(identities(text));
    let kind = answer.kind();
    shared.metrics.checks.answers(kind).inc();
    match answer {
        Answer::Invalid { decided_by } => {
            shared
                .seen
                .record(row, kind, None, snapshot.index, Some(decided_by));
            None
        }
        Answer::Withheld { decided_by, .. } => {
            shared
                .seen
                .record(row, kind, None, snapshot.index, decided_by);
            None
        }
        Answer::State { state, decided_by } => {
            let reply = state.reply();
            let text = std::str::from_utf8(reply.as_bytes()).unwrap_or_default();
            shared
                .seen
                .record(row, kind, Some(text.trim_end()), snapshot.index, decided_by);
            Some(reply)
        }
    }
}

/// The answer to the reload guard's probe line (`check-ready`): what the
/// snapshot answers it, like any line, but the probe is no server HAProxy
/// asks about, so it is neither counted as an agent-check nor remembered as
/// a row (a row asked once would hold `answered_index` at the probe's
/// snapshot for a minute, and offer `check-ready` as a group).
fn probe_reply(shared: &Shared) -> Option<ReplyLine> {
    let snapshot = shared.snapshot.load();
    match snapshot
        .as_ref()?
        .lookup(identities(crate::check_ready::PROBE_IDENTITY))
    {
        Answer::State { state, .. } => Some(state.reply()),
        Answer::Invalid { .. } | Answer::Withheld { .. } => None,
    }
}

/// Connection deadlines in the order they were set. Every connection gets
/// the same timeout from its accept, so insertion order is expiry order and
/// a FIFO gives the next one. Entries of connections that finished early
/// stay until they reach the front.
#[derive(Debug)]
struct DeadlineQueue<K> {
    queue: VecDeque<(Instant, K)>,
}

impl<K> Default for DeadlineQueue<K> {
    fn default() -> Self {
        DeadlineQueue {
            queue: VecDeque::new(),
        }
    }
}

impl<K: Copy> DeadlineQueue<K> {
    /// Adds a deadline no earlier than any already queued.
    fn push(&mut self, at: Instant, key: K) {
        debug_assert!(self.queue.back().is_none_or(|(last, _)| *last <= at));
        self.queue.push_back((at, key));
    }

    /// The earliest deadline whose key `live` accepts, dropping the entries
    /// in front of it that it refuses (so a finished connection never wakes
    /// the loop).
    fn next(&mut self, mut live: impl FnMut(K) -> bool) -> Option<Instant> {
        while let Some(&(at, key)) = self.queue.front() {
            if live(key) {
                return Some(at);
            }
            self.queue.pop_front();
        }
        None
    }

    /// Removes and returns the key of the earliest deadline, due or not.
    fn pop_front(&mut self) -> Option<K> {
        self.queue.pop_front().map(|(_, key)| key)
    }

    /// Removes and returns the key of the earliest deadline if it is at or
    /// before `now`.
    fn pop_expired(&mut self, now: Instant) -> Option<K> {
        match self.queue.front() {
            Some(&(at, key)) if at <= now => {
                self.queue.pop_front();
                Some(key)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
