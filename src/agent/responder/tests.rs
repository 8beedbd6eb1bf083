//! The responder on real sockets: answers, limits and slow or hostile
//! clients.

use super::*;

use std::collections::HashMap;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream as Client;
use tokio_util::sync::DropGuard;

use crate::model::snapshot::{Entry, KeyState, Snapshot};
use crate::model::value::AdminState;

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
    shared.snapshot.store(Some(Arc::new(Snapshot {
        index: 1,
        keys,
        provisional: false,
    })));
    shared
}

/// A responder serving on its own thread. Dropping it cancels it too (a
/// failed test does not leave the thread behind).
struct Running {
    shutdown: CancellationToken,
    tracker: TaskTracker,
    _cancel_on_drop: DropGuard,
}

impl Running {
    /// Shuts down and waits (at most 5 s) for the loop to return.
    async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.close();
        let wait = tokio::time::timeout(Duration::from_secs(5), self.tracker.wait());
        assert!(wait.await.is_ok(), "the responder did not stop");
    }
}

fn start(
    listener: std::net::TcpListener,
    shared: &Arc<Shared>,
    config: ResponderConfig,
) -> Running {
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    serve(
        listener,
        shared.clone(),
        config,
        shutdown.clone(),
        tracker.clone(),
    )
    .unwrap();
    Running {
        _cancel_on_drop: shutdown.clone().drop_guard(),
        shutdown,
        tracker,
    }
}

fn timeout(check_timeout: Duration) -> ResponderConfig {
    ResponderConfig {
        check_timeout,
        ..ResponderConfig::default()
    }
}

fn bound() -> (std::net::TcpListener, SocketAddr) {
    let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Everything the responder sent before closing (empty: no answer).
async fn reply(mut client: Client) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out));
    assert!(read.await.is_ok(), "the responder did not close");
    String::from_utf8_lossy(&out).into_owned()
}

/// Polls `f` every 10 ms for up to 5 s.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_lines_that_arrived_before_the_accept() {
    let (listener, addr) = bound();
    let shared = synced();
    // The kernel completes the handshakes and queues the lines before
    // the responder accepts: they are answered without waiting.
    let mut a = Client::connect(addr).await.unwrap();
    a.write_all(b"web/web-01 canary\n").await.unwrap();
    let mut b = Client::connect(addr).await.unwrap();
    b.write_all(b"web/web-02\r\n").await.unwrap();
    let running = start(listener, &shared, timeout(Duration::from_millis(500)));
    assert_eq!(reply(a).await, "drain 100%\n");
    assert_eq!(reply(b).await, "ready 100%\n");
    assert_eq!(shared.metrics.checks.answers(AnswerKind::Drain).get(), 1);
    assert_eq!(shared.metrics.checks.answers(AnswerKind::Ready).get(), 1);
    assert!(eventually(|| shared.metrics.checks.answer_duration.get_sample_count() == 2).await);
    assert_eq!(shared.seen.rows()[0].0, "web/web-01 canary");
    // Answered from the snapshot at index 1.
    assert_eq!(shared.seen.rows()[0].1.index, 1);
    assert!(shared.metrics.checks.last_check_timestamp.get() > 0.0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_guard_probe_is_answered_and_is_no_row() {
    let (listener, addr) = bound();
    let shared = synced();
    let running = start(listener, &shared, timeout(Duration::from_millis(500)));
    let mut probe = Client::connect(addr).await.unwrap();
    probe
        .write_all(crate::check_ready::PROBE_LINE)
        .await
        .unwrap();
    assert_eq!(reply(probe).await, "ready 100%\n");
    assert!(shared.seen.rows().is_empty(), "{:?}", shared.seen.rows());
    assert_eq!(shared.metrics.checks.answers(AnswerKind::Ready).get(), 0);
    assert_eq!(shared.metrics.checks.last_check_timestamp.get(), 0.0);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_line_that_arrives_after_the_accept_in_pieces() {
    let (listener, addr) = bound();
    let shared = synced();
    let running = start(listener, &shared, timeout(Duration::from_millis(1000)));
    let mut client = Client::connect(addr).await.unwrap();
    // Accepted with nothing to read: it waits for the line.
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 1).await);
    client.write_all(b"web/web-01 ca").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(b"nary\n").await.unwrap();
    assert_eq!(reply(client).await, "drain 100%\n");
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 0).await);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completes_a_line_begun_before_the_accept() {
    let (listener, addr) = bound();
    let shared = synced();
    let mut client = Client::connect(addr).await.unwrap();
    client.write_all(b"web/web-01 can").await.unwrap();
    let running = start(listener, &shared, timeout(Duration::from_millis(1000)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.write_all(b"ary\n").await.unwrap();
    assert_eq!(reply(client).await, "drain 100%\n");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_overlong_and_closed_clients_get_no_answer() {
    let (listener, addr) = bound();
    let shared = synced();
    let mut closed = Client::connect(addr).await.unwrap();
    closed.shutdown().await.unwrap();
    let mut overlong = Client::connect(addr).await.unwrap();
    overlong.write_all(&[b'a'; MAX_LINE]).await.unwrap();
    let silent = Client::connect(addr).await.unwrap();
    let mut bad = Client::connect(addr).await.unwrap();
    bad.write_all(b"web/web-01 $HOME\n").await.unwrap();
    let running = start(listener, &shared, timeout(Duration::from_millis(100)));
    let begun = Instant::now();
    assert_eq!(reply(closed).await, "");
    assert_eq!(reply(silent).await, "");
    assert!(begun.elapsed() >= Duration::from_millis(100));
    assert_eq!(reply(bad).await, "");
    // Closed with unread bytes: a reset or an empty read, never a line.
    let mut out = Vec::new();
    let _ = overlong.read_to_end(&mut out).await;
    assert!(out.is_empty());
    // The loop counts a connection after closing it, so the client can
    // see the close first.
    assert!(eventually(|| shared.metrics.checks.answers(AnswerKind::BadRequest).get() == 4).await);
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 0).await);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_before_the_first_sync() {
    let (listener, addr) = bound();
    let shared = Shared::new("http://127.0.0.1:1", "p/");
    let mut client = Client::connect(addr).await.unwrap();
    client.write_all(b"web/web-01 canary\n").await.unwrap();
    let running = start(listener, &shared, timeout(Duration::from_millis(500)));
    assert_eq!(reply(client).await, "");
    assert_eq!(shared.metrics.checks.answers(AnswerKind::Unsynced).get(), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_oldest_silent_connection_makes_room() {
    let (listener, addr) = bound();
    let shared = synced();
    let config = ResponderConfig {
        max_connections: 2,
        check_timeout: Duration::from_secs(2),
    };
    let running = start(listener, &shared, config);
    let oldest = Client::connect(addr).await.unwrap();
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 1).await);
    let mut second = Client::connect(addr).await.unwrap();
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 2).await);
    // A check accepted before its line arrives needs a slot: the oldest
    // connection, silent since, is closed to free one.
    let mut check = Client::connect(addr).await.unwrap();
    assert_eq!(reply(oldest).await, "");
    assert!(eventually(|| shared.metrics.checks.connections_refused.get() == 1).await);
    check.write_all(b"canary\n").await.unwrap();
    assert_eq!(reply(check).await, "drain 100%\n");
    // The second one kept its slot.
    second.write_all(b"web/web-01\n").await.unwrap();
    assert_eq!(reply(second).await, "ready 100%\n");
    assert_eq!(shared.metrics.checks.connections_refused.get(), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_and_finishes_connections_in_flight() {
    let (listener, addr) = bound();
    let shared = synced();
    let running = start(listener, &shared, timeout(Duration::from_secs(2)));
    let mut pending = Client::connect(addr).await.unwrap();
    assert!(eventually(|| shared.metrics.checks.connections_in_flight.get() == 1).await);
    running.shutdown.cancel();
    // The listener closes at once.
    let refused = eventually(|| std::net::TcpStream::connect(addr).is_err());
    assert!(refused.await, "still accepting after shutdown");
    pending.write_all(b"web/web-01 canary\n").await.unwrap();
    assert_eq!(reply(pending).await, "drain 100%\n");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beats_while_idle() {
    let (listener, _addr) = bound();
    let shared = synced();
    let running = start(listener, &shared, ResponderConfig::default());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(shared.responder_heartbeat.age() < Duration::from_millis(1500));
    running.stop().await;
}

/// A non-blocking stream that yields `chunks`, then would block (or
/// reports end of stream when `eof`).
struct Chunks {
    chunks: VecDeque<&'static [u8]>,
    eof: bool,
}

impl io::Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.chunks.pop_front() {
            Some(chunk) => {
                buf[..chunk.len()].copy_from_slice(chunk);
                Ok(chunk.len())
            }
            None if self.eof => Ok(0),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

fn chunks(chunks: &[&'static [u8]], eof: bool) -> Chunks {
    Chunks {
        chunks: chunks.iter().copied().collect(),
        eof,
    }
}

#[test]
fn reads_a_line_across_reads_and_waits_for_the_rest() {
    let mut buf = [0u8; MAX_LINE];
    let mut filled = 0;
    let mut stream = chunks(&[b"web/we", b"b-01 can"], false);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Pending
    );
    assert_eq!(filled, 14);
    let mut stream = chunks(&[b"ary\nignored"], false);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Line(17)
    );
    assert_eq!(&buf[..17], b"web/web-01 canary");
    // A whole line in the first read: no second read.
    let mut filled = 0;
    let mut stream = chunks(&[b"canary\n", b"never read"], false);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Line(6)
    );
    assert_eq!(stream.chunks.len(), 1);
}

#[test]
fn refuses_closed_and_overlong_lines() {
    let mut buf = [0u8; 8];
    let mut filled = 0;
    let mut stream = chunks(&[b"web"], true);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Refused
    );
    let mut filled = 0;
    let mut stream = chunks(&[b"web/web-", b"01\n"], false);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Refused
    );
    // Seven bytes and the LF fit.
    let mut filled = 0;
    let mut stream = chunks(&[b"web/w01\n"], false);
    assert_eq!(
        read_line(&mut stream, &mut buf, &mut filled),
        Progress::Line(7)
    );
}

#[test]
fn deadlines_expire_in_order_and_finished_ones_are_skipped() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut q = DeadlineQueue::default();
    assert_eq!(q.next(|_| true), None);
    q.push(t0 + ms(10), 1);
    q.push(t0 + ms(20), 2);
    q.push(t0 + ms(30), 3);
    // 1 finished early: the next wake-up is 2's deadline.
    assert_eq!(q.next(|k| k != 1), Some(t0 + ms(20)));
    assert_eq!(q.pop_expired(t0 + ms(19)), None);
    assert_eq!(q.pop_expired(t0 + ms(25)), Some(2));
    assert_eq!(q.pop_expired(t0 + ms(25)), None);
    assert_eq!(q.next(|_| true), Some(t0 + ms(30)));
    assert_eq!(q.pop_expired(t0 + ms(30)), Some(3));
    assert_eq!(q.next(|_| true), None);
}

#[test]
fn accept_pauses_double_up_to_640_ms() {
    assert_eq!(accept_pause(1), Duration::from_millis(20));
    assert_eq!(accept_pause(2), Duration::from_millis(40));
    assert_eq!(accept_pause(6), Duration::from_millis(640));
    assert_eq!(accept_pause(1000), Duration::from_millis(640));
}
