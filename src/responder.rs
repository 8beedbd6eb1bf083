//! The agent-check responder: HAProxy connects every `agent-inter`, sends its
//! agent-send line, reads one reply line and closes (doc configuration.txt
//! "agent-check"). Every connection is bounded in count, bytes and time, and
//! answers come from the in-memory snapshot without waiting on Consul.
//! A line that has already arrived when the connection is accepted (the
//! usual case under load) is answered at once in the accept loop; only a
//! line still on its way costs a task and a wait for readiness.

use std::io::{self, Read as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::shared::Shared;
use crate::state::{validate_identity, Answer, AnswerKind, InvalidIdentity, ReplyLine};

/// Longest agent-send line accepted, LF included: 1 KiB. Real lines are a
/// row key and a few groups.
pub const MAX_LINE: usize = 1024;

/// Most identities accepted on one line.
pub const MAX_IDENTITIES: usize = 16;

/// Responder settings.
#[derive(Debug, Clone, Copy)]
pub struct ResponderConfig {
    /// Connections served at once; more are closed at once, unanswered.
    /// Default 1024.
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

/// Why an agent-send line was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadLine {
    /// No identities.
    #[error("empty agent-send line")]
    Empty,
    /// More than [`MAX_IDENTITIES`].
    #[error("more than {MAX_IDENTITIES} identities")]
    TooMany,
    /// An identity that is not a group or row key.
    #[error(transparent)]
    Identity(#[from] InvalidIdentity),
    /// Not UTF-8.
    #[error("agent-send line is not UTF-8")]
    NotUtf8,
}

/// Parses an agent-send line without its LF (a trailing CR is dropped):
/// identities separated by spaces or tabs, in order (row key first).
///
/// # Errors
///
/// [`BadLine`] for an empty line, too many identities, or an identity that
/// is not a valid group or row key.
pub fn parse_line(line: &[u8]) -> Result<Vec<&str>, BadLine> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| BadLine::NotUtf8)?;
    let mut ids = Vec::with_capacity(4);
    for id in text.split([' ', '\t']).filter(|s| !s.is_empty()) {
        if ids.len() == MAX_IDENTITIES {
            return Err(BadLine::TooMany);
        }
        validate_identity(id)?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Err(BadLine::Empty);
    }
    Ok(ids)
}

/// Serves agent-checks on `listener` until `shutdown` is cancelled; each
/// connection runs on `tracker` so shutdown can wait for answers in flight.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    config: ResponderConfig,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut accept_failures: u32 = 0;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                shared.responder_heartbeat.beat();
                continue;
            }
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                accept_failures = 0;
                stream
            }
            Err(e) => {
                shared.metrics.accept_errors.inc();
                if is_per_connection(&e) {
                    continue;
                }
                // Out of file descriptors or memory: back off and keep going;
                // connections already open finish and free what they hold.
                accept_failures = accept_failures.saturating_add(1);
                if accept_failures == 1 || accept_failures.is_power_of_two() {
                    warn!(error = %e, failures = accept_failures, "accept failed; backing off");
                }
                let pause = Duration::from_millis(10u64 << accept_failures.min(6));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        let started = Instant::now();
        let mut buf = [0u8; MAX_LINE];
        let filled = match read_now(&stream, &mut buf) {
            Early::Line(len) => {
                if let Some(reply) = decide(&buf[..len], &shared) {
                    // The reply is the first data sent on this connection, so
                    // the send buffer is empty and one write takes it whole.
                    let _ = (&*SockRef::from(&stream)).write(reply.as_bytes());
                }
                drop(stream);
                shared
                    .metrics
                    .answer_duration
                    .observe(started.elapsed().as_secs_f64());
                continue;
            }
            Early::Refused => {
                shared.metrics.answers(AnswerKind::BadRequest).inc();
                continue;
            }
            Early::Partial(filled) => filled,
        };
        let shared = shared.clone();
        tracker.spawn(async move {
            shared.metrics.connections_in_flight.inc();
            handle(stream, buf, filled, &shared, config.check_timeout).await;
            shared.metrics.connections_in_flight.dec();
            shared
                .metrics
                .answer_duration
                .observe(started.elapsed().as_secs_f64());
            drop(permit);
        });
    }
}

/// Accept errors that concern one connection only (it was reset before we
/// took it): retry at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// What one read right after accept found.
#[derive(Debug, PartialEq, Eq)]
enum Early {
    /// A whole line of this length (LF excluded) is in the buffer.
    Line(usize),
    /// This many bytes and no LF yet: wait for the rest.
    Partial(usize),
    /// Closed, failed, or a line too long: no answer.
    Refused,
}

/// Reads what has already arrived, straight from the socket (the stream is
/// non-blocking): tokio's readiness for a socket just registered is not
/// known yet, so going through it would always wait for an epoll round.
fn read_now(stream: &TcpStream, buf: &mut [u8; MAX_LINE]) -> Early {
    match (&*SockRef::from(stream)).read(buf) {
        Ok(0) => Early::Refused,
        Ok(n) => match buf[..n].iter().position(|&b| b == b'\n') {
            Some(pos) => Early::Line(pos),
            None if n == MAX_LINE => Early::Refused,
            None => Early::Partial(n),
        },
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            Early::Partial(0)
        }
        Err(_) => Early::Refused,
    }
}

/// Waits (up to `timeout`) for the rest of a line whose first `filled`
/// bytes are in `buf`, then answers it. Dropping the stream closes it, which
/// sends FIN right after the reply.
async fn handle(
    mut stream: TcpStream,
    mut buf: [u8; MAX_LINE],
    filled: usize,
    shared: &Shared,
    timeout: Duration,
) {
    let read = read_line(&mut stream, &mut buf, filled);
    let line_len = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(Some(n))) => n,
        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
            shared.metrics.answers(AnswerKind::BadRequest).inc();
            return;
        }
    };
    if let Some(reply) = decide(&buf[..line_len], shared) {
        let _ = tokio::time::timeout(timeout, stream.write_all(reply.as_bytes())).await;
    }
}

/// Parses one agent-send line (LF excluded), looks it up in the snapshot,
/// counts and records it, and returns the reply to send, if any.
fn decide(line: &[u8], shared: &Shared) -> Option<ReplyLine> {
    let identities = match parse_line(line) {
        Ok(ids) => ids,
        Err(e) => {
            debug!(error = %e, "bad agent-send line");
            shared.metrics.answers(AnswerKind::BadRequest).inc();
            return None;
        }
    };
    shared
        .metrics
        .last_check_timestamp
        .set(crate::metrics::unix_now());
    // parse_line accepted the line, so it is UTF-8.
    let row = std::str::from_utf8(line).unwrap_or_default().trim();
    let Some(snapshot) = shared.snapshot.load_full() else {
        shared.metrics.answers(AnswerKind::Unsynced).inc();
        shared.seen.record(row, AnswerKind::Unsynced, None);
        return None;
    };
    let answer = snapshot.lookup(identities.iter().copied());
    let kind = answer.kind();
    shared.metrics.answers(kind).inc();
    match answer {
        Answer::Invalid { .. } => {
            shared.seen.record(row, kind, None);
            None
        }
        Answer::State { state, .. } => {
            let reply = state.reply();
            let text = std::str::from_utf8(reply.as_bytes()).unwrap_or_default();
            shared.seen.record(row, kind, Some(text.trim_end()));
            Some(reply)
        }
    }
}

/// Reads until the first LF, after the `filled` bytes already in `buf`
/// (which hold none). Returns the line length without the LF, or `None` when
/// the peer closed first or the line exceeds [`MAX_LINE`].
async fn read_line(
    stream: &mut TcpStream,
    buf: &mut [u8; MAX_LINE],
    mut filled: usize,
) -> io::Result<Option<usize>> {
    loop {
        if filled == buf.len() {
            return Ok(None);
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(pos) = buf[filled..filled + n].iter().position(|&b| b == b'\n') {
            return Ok(Some(filled + pos));
        }
        filled += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;
    use std::net::SocketAddr;

    use crate::state::{AdminState, Entry, KeyState, Snapshot};

    /// A synced state where `canary` is drained.
    fn synced() -> Arc<Shared> {
        let shared = Shared::new("http://127.0.0.1:1", "p/");
        let mut keys = HashMap::new();
        keys.insert(
            "canary".into(),
            KeyState {
                entry: Entry::Valid(AdminState::Drain),
                modify_index: 1,
            },
        );
        shared
            .snapshot
            .store(Some(Arc::new(Snapshot { index: 1, keys })));
        shared
    }

    fn start(listener: TcpListener, shared: &Arc<Shared>, check_timeout: Duration) {
        let config = ResponderConfig {
            check_timeout,
            ..ResponderConfig::default()
        };
        tokio::spawn(serve(
            listener,
            shared.clone(),
            config,
            CancellationToken::new(),
            TaskTracker::new(),
        ));
    }

    async fn bound() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    /// Everything the responder sent before closing (empty: no answer).
    async fn reply(mut client: TcpStream) -> String {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out));
        assert!(read.await.is_ok(), "the responder did not close");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_lines_that_arrived_before_the_accept() {
        let (listener, addr) = bound().await;
        let shared = synced();
        // The kernel completes the handshakes and queues the lines before
        // the responder accepts: they are answered in the accept loop.
        let mut a = TcpStream::connect(addr).await.unwrap();
        a.write_all(b"web/web-01 canary\n").await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        b.write_all(b"web/web-02\r\n").await.unwrap();
        start(listener, &shared, Duration::from_millis(500));
        assert_eq!(reply(a).await, "drain 100%\n");
        assert_eq!(reply(b).await, "ready 100%\n");
        assert_eq!(shared.metrics.answers(AnswerKind::Drain).get(), 1);
        assert_eq!(shared.metrics.answers(AnswerKind::Ready).get(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_for_a_line_that_arrives_after_the_accept_in_pieces() {
        let (listener, addr) = bound().await;
        let shared = synced();
        start(listener, &shared, Duration::from_millis(1000));
        let mut client = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Accepted with nothing to read: a task waits for the line.
        assert_eq!(shared.metrics.connections_in_flight.get(), 1);
        client.write_all(b"web/web-01 ca").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.write_all(b"nary\n").await.unwrap();
        assert_eq!(reply(client).await, "drain 100%\n");
        assert_eq!(shared.metrics.connections_in_flight.get(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn completes_a_line_begun_before_the_accept() {
        let (listener, addr) = bound().await;
        let shared = synced();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"web/web-01 can").await.unwrap();
        start(listener, &shared, Duration::from_millis(1000));
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.write_all(b"ary\n").await.unwrap();
        assert_eq!(reply(client).await, "drain 100%\n");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_overlong_and_closed_clients_get_no_answer() {
        let (listener, addr) = bound().await;
        let shared = synced();
        let mut closed = TcpStream::connect(addr).await.unwrap();
        closed.shutdown().await.unwrap();
        let mut overlong = TcpStream::connect(addr).await.unwrap();
        overlong.write_all(&[b'a'; MAX_LINE]).await.unwrap();
        let silent = TcpStream::connect(addr).await.unwrap();
        let mut bad = TcpStream::connect(addr).await.unwrap();
        bad.write_all(b"web/web-01 $HOME\n").await.unwrap();
        start(listener, &shared, Duration::from_millis(100));
        assert_eq!(reply(closed).await, "");
        assert_eq!(reply(silent).await, "");
        assert_eq!(reply(bad).await, "");
        // Closed with unread bytes: a reset or an empty read, never a line.
        let mut out = Vec::new();
        let _ = overlong.read_to_end(&mut out).await;
        assert!(out.is_empty());
        assert_eq!(shared.metrics.answers(AnswerKind::BadRequest).get(), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_nobody_before_the_first_sync() {
        let (listener, addr) = bound().await;
        let shared = Shared::new("http://127.0.0.1:1", "p/");
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"web/web-01 canary\n").await.unwrap();
        start(listener, &shared, Duration::from_millis(500));
        assert_eq!(reply(client).await, "");
        assert_eq!(shared.metrics.answers(AnswerKind::Unsynced).get(), 1);
    }

    #[test]
    fn parses_identities_in_order() {
        assert_eq!(
            parse_line(b"web/web-cny-01 canary"),
            Ok(vec!["web/web-cny-01", "canary"])
        );
        assert_eq!(
            parse_line(b"web/web-01\tcanary  zone:b\r"),
            Ok(vec!["web/web-01", "canary", "zone:b"])
        );
    }

    #[test]
    fn refuses_bad_lines() {
        assert_eq!(parse_line(b""), Err(BadLine::Empty));
        assert_eq!(parse_line(b" \t\r"), Err(BadLine::Empty));
        assert_eq!(parse_line(b"\xff\xfe"), Err(BadLine::NotUtf8));
        assert!(matches!(
            parse_line(b"web/web-01 $HOME"),
            Err(BadLine::Identity(_))
        ));
        assert!(matches!(parse_line(b"a/b/c"), Err(BadLine::Identity(_))));
        let many = vec!["g"; MAX_IDENTITIES + 1].join(" ");
        assert_eq!(parse_line(many.as_bytes()), Err(BadLine::TooMany));
    }
}
