//! The operator HTTP port: `/metrics` (Prometheus text format),
//! `/-/healthy`, `/-/ready`, and, for clients at 127.0.0.1 and ::1 unless
//! [`DebugAccess::Anyone`], `/status` (JSON for humans and tools) and
//! on-demand CPU profiles under `/debug/pprof/` (`profile`). hyper reads
//! and writes HTTP/1.1; this module bounds what each connection may hold
//! ([`serve`]), `routes` says what each request is answered.

mod answer;
pub mod metrics;
mod profile;
mod routes;
mod status;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::agent::shared::Shared;
use answer::Answer;
use routes::Request;
use status::StatusCache;

/// Requests answered at once (an answer being built or written): 64, one
/// of which is kept for probes ([`PROBE_SLOTS`]). Scrapers, probes and
/// humans, not traffic.
pub const MAX_HTTP_CONNECTIONS: usize = 64;

/// Serving slots kept for `/-/ready` and `/-/healthy`: 1. A probe's answer
/// is a few bytes written at once, so one slot serves every probe within
/// milliseconds, whatever holds the other slots.
pub const PROBE_SLOTS: usize = 1;

/// Connections whose request is being read at once: 512. They hold no
/// serving slot. At this many, the one that has been reading longest is
/// closed to make room for a new one (counted in
/// `gitlab_haproxy_agent_http_idle_closed_total`), so connections that send
/// nothing, or one byte, cannot keep a probe out.
pub const MAX_HTTP_PENDING: usize = 512;

/// Time a client has, from connecting, to send its whole request head: 2 s
/// (hyper's header read timeout). A kubelet probe or a Prometheus scrape
/// sends it at once.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest request head accepted (request line and headers): 8 KiB,
/// hyper's read buffer limit (and its smallest). A kubelet probe or a
/// Prometheus scrape sends a few hundred bytes; a larger head is answered
/// 431.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Time a request other than a probe waits for a serving slot before it is
/// answered 503 with `Retry-After: 1`: 2 s.
pub const SLOT_WAIT: Duration = Duration::from_secs(2);

/// Time the client has to read the whole answer: 10 s (a 5 MB `/status`
/// takes milliseconds on a LAN). A client that reads slower is cut off and
/// counted in `gitlab_haproxy_agent_http_write_timeouts_total`, so slow
/// readers hold a slot for at most this long.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long answers being written may go on once shutdown begins: 2 s.
const SHUTDOWN_WRITE_GRACE: Duration = Duration::from_secs(2);

/// Who may read `/status` and `/debug/pprof/` (`--http-remote-debug`).
/// The other endpoints are for the fleet's Prometheus and the kubelet and
/// answer anyone, as node_exporter's do; these two stay on the node, as
/// linkerd2-proxy keeps its admin actions to loopback clients: `/status`
/// lists every key and every server HAProxy asks about, and a profile
/// costs CPU for up to a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DebugAccess {
    /// Clients at 127.0.0.1 or ::1 only (also 127.0.0.1 mapped to IPv6 on
    /// a `[::]` listener); others, the rest of 127.0.0.0/8 included, are
    /// answered 403 and counted in
    /// `gitlab_haproxy_agent_http_forbidden_total`. A loopback peer is no
    /// proof of a local operator: Istio's sidecar hands every inbound
    /// connection to the application from 127.0.0.6 (its passthrough bind
    /// address, `InboundPassthroughClusterIpv4` in istio/istio), so any pod
    /// of the mesh would reach a port open to 127.0.0.0/8. `curl
    /// 127.0.0.1:9778`, `kubectl exec` and `kubectl port-forward` connect
    /// from 127.0.0.1.
    #[default]
    Loopback,
    /// Every client.
    Anyone,
}

impl DebugAccess {
    /// Whether a client at `peer` may be answered `path`.
    pub fn allows(self, path: &str, peer: IpAddr) -> bool {
        !is_debug(path) || self == DebugAccess::Anyone || is_node_operator(peer)
    }
}

/// Paths served only as [`DebugAccess`] allows.
fn is_debug(path: &str) -> bool {
    path == "/status" || path.starts_with("/debug/pprof/")
}

/// 127.0.0.1 or ::1 (or 127.0.0.1 mapped to IPv6): the address a command
/// run on the node connects from, and not one a proxy or mesh sidecar on
/// the node uses for the connections it hands on.
fn is_node_operator(peer: IpAddr) -> bool {
    match peer.to_canonical() {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    }
}

/// One connection still reading its request: closed by [`Readers`] to
/// make room, or marked read by the connection itself.
#[derive(Default)]
struct Reader {
    /// Set once the request is read, or when the reader is closed.
    done: AtomicBool,
    /// Cancelled to close the connection before its request is read.
    close: CancellationToken,
}

/// Connections reading their request, oldest first, so the oldest can be
/// closed at [`MAX_HTTP_PENDING`]. Entries done are dropped from the front.
#[derive(Default)]
struct Readers(Mutex<VecDeque<Arc<Reader>>>);

impl Readers {
    fn push(&self) -> Arc<Reader> {
        let reader = Arc::new(Reader::default());
        let mut queue = self.0.lock().unwrap();
        while queue
            .front()
            .is_some_and(|r| r.done.load(Ordering::Acquire))
        {
            queue.pop_front();
        }
        queue.push_back(reader.clone());
        reader
    }

    /// Closes the connection that has been reading longest; false if none is.
    fn close_oldest(&self) -> bool {
        let mut queue = self.0.lock().unwrap();
        while let Some(reader) = queue.pop_front() {
            if !reader.done.swap(true, Ordering::AcqRel) {
                reader.close.cancel();
                return true;
            }
        }
        false
    }
}

/// What every connection task shares.
struct Port {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    /// Serving slots for every request but probes.
    slots: Arc<Semaphore>,
    /// The slots kept for probes.
    probe_slots: Arc<Semaphore>,
    /// Requests read and waiting for a slot.
    queued: Arc<Semaphore>,
    status: StatusCache,
    http1: http1::Builder,
    debug: DebugAccess,
}

/// One connection's state, shared by its task and the request it serves.
struct Exchange {
    /// The client's address.
    peer: IpAddr,
    reader: Arc<Reader>,
    /// The reading permit, released once the request is read.
    reading: Mutex<Option<OwnedSemaphorePermit>>,
    /// The serving slot, held until the answer is written.
    slot: Mutex<Option<OwnedSemaphorePermit>>,
    /// Set when a request was read (hyper called the service).
    requested: AtomicBool,
    /// Cancelled once the answer is handed to hyper to write.
    answered: CancellationToken,
}

/// Serves the operator endpoints on `listener` until `shutdown`.
///
/// One request per connection (keep-alive off, `Connection: close`), in
/// three steps, each bounded: hyper reads the whole request head within
/// [`REQUEST_READ_TIMEOUT`] and [`MAX_REQUEST_HEAD`], holding no serving
/// slot (at most [`MAX_HTTP_PENDING`] at once, the oldest closed for a new
/// one); then the request takes one of [`MAX_HTTP_CONNECTIONS`] serving
/// slots (probes from the ones kept for them, others waiting at most
/// [`SLOT_WAIT`]); then the answer is written within [`WRITE_TIMEOUT`].
/// Connections closed with no complete request are counted in
/// `gitlab_haproxy_agent_http_idle_closed_total`, refused requests (hyper's
/// 400 and 431, and 413 for a body) in
/// `gitlab_haproxy_agent_http_bad_requests_total`. `/status` and
/// `/debug/pprof/` answer as `debug` allows (403 counted in
/// `gitlab_haproxy_agent_http_forbidden_total`).
pub async fn serve(
    listener: TcpListener,
    debug: DebugAccess,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let pending = Arc::new(Semaphore::new(MAX_HTTP_PENDING));
    let readers = Arc::new(Readers::default());
    let port = Arc::new(Port::new(debug, shared, shutdown.clone()));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "HTTP accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let reading = match pending.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => unreachable!("the semaphore is never closed"),
            Err(TryAcquireError::NoPermits) => {
                // Make room: the oldest reader closes and frees its permit.
                readers.close_oldest();
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    p = pending.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                }
            }
        };
        let exchange = Arc::new(Exchange {
            peer: peer.ip(),
            reader: readers.push(),
            reading: Mutex::new(Some(reading)),
            slot: Mutex::new(None),
            requested: AtomicBool::new(false),
            answered: CancellationToken::new(),
        });
        tracker.spawn(serve_connection(stream, exchange, port.clone()));
    }
}

impl Port {
    fn new(debug: DebugAccess, shared: Arc<Shared>, shutdown: CancellationToken) -> Port {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(REQUEST_READ_TIMEOUT)
            .max_buf_size(MAX_REQUEST_HEAD)
            .keep_alive(false)
            // A client may close its sending side once its request is sent
            // (`printf ... | nc -N`) and still read the answer.
            .half_close(true)
            .title_case_headers(true);
        Port {
            shared,
            shutdown,
            slots: Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS - PROBE_SLOTS)),
            probe_slots: Arc::new(Semaphore::new(PROBE_SLOTS)),
            queued: Arc::new(Semaphore::new(MAX_HTTP_PENDING)),
            status: StatusCache::default(),
            http1,
            debug,
        }
    }
}

/// One connection: hyper reads its request (holding only the reading
/// permit), the request takes a slot and is answered, hyper writes the
/// answer within [`WRITE_TIMEOUT`], and the connection closes.
async fn serve_connection<S>(stream: S, exchange: Arc<Exchange>, port: Arc<Port>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let metrics = &port.shared.metrics.http;
    let service = {
        let (exchange, port) = (exchange.clone(), port.clone());
        service_fn(move |request| {
            let (exchange, port) = (exchange.clone(), port.clone());
            async move { Ok::<_, Infallible>(handle(request, &exchange, &port).await) }
        })
    };
    let connection = port.http1.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        r = connection.as_mut() => r,
        _ = exchange.reader.close.cancelled() => {
            metrics.idle_closed.inc();
            return;
        }
        _ = exchange.answered.cancelled() => {
            let written = tokio::select! {
                r = tokio::time::timeout(WRITE_TIMEOUT, connection.as_mut()) => r,
                _ = port.shutdown.cancelled() => {
                    tokio::time::timeout(SHUTDOWN_WRITE_GRACE, connection.as_mut()).await
                }
            };
            if written.is_err() {
                metrics.write_timeouts.inc();
            }
            return;
        }
        _ = port.shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_WRITE_GRACE, connection.as_mut()).await;
            return;
        }
    };
    drop(exchange.slot.lock().unwrap().take());
    if !exchange.requested.load(Ordering::Acquire) {
        // hyper answered a request it could not read (400, 431), or
        // the connection ended before a whole request came.
        exchange.reader.done.store(true, Ordering::Release);
        match ended {
            Err(e) if e.is_parse() => metrics.bad_requests.inc(),
            _ => metrics.idle_closed.inc(),
        }
    }
}

/// The service hyper calls with the request it read: release the reading
/// permit, take a serving slot, answer.
async fn handle(
    request: hyper::Request<hyper::body::Incoming>,
    exchange: &Exchange,
    port: &Arc<Port>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    use hyper::body::Body as _;
    exchange.requested.store(true, Ordering::Release);
    exchange.reader.done.store(true, Ordering::Release);
    drop(exchange.reading.lock().unwrap().take());
    let answer = if !request.body().is_end_stream() {
        port.shared.metrics.http.bad_requests.inc();
        Answer::plain(413, "request bodies are not accepted\n")
    } else {
        let request = Request::of(&request);
        if !port.debug.allows(&request.path, exchange.peer) {
            port.shared.metrics.http.forbidden.inc();
            let answer = Answer::plain(
                403,
                format!(
                    "/status and /debug/pprof/ answer only clients at 127.0.0.1 and ::1, not {} \
                     (a mesh sidecar or node-local proxy connects from another address; \
                     --http-remote-debug serves every client)\n",
                    exchange.peer.to_canonical()
                ),
            );
            exchange.answered.cancel();
            return answer.into_response();
        }
        let slot = take_slot(&request, port).await;
        let answer = match slot {
            Some(_) => routes::answer(&request, &port.shared, &port.status, &port.shutdown).await,
            None if port.shutdown.is_cancelled() => Answer::plain(503, "shutting down\n"),
            None => Answer::plain(503, "every serving slot is busy; try again\n")
                .with_header("Retry-After", "1".into()),
        };
        *exchange.slot.lock().unwrap() = slot;
        answer
    };
    exchange.answered.cancel();
    answer.into_response()
}

/// A serving slot for `request`: probes from the kept slots (or a free
/// ordinary one), others waiting at most [`SLOT_WAIT`] (counted in
/// `gitlab_haproxy_agent_http_busy_total` when none came). `None` when no
/// slot came in time, or at shutdown.
async fn take_slot(request: &Request, port: &Port) -> Option<OwnedSemaphorePermit> {
    if request.is_probe() {
        if let Ok(slot) = port.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        return tokio::select! {
            _ = port.shutdown.cancelled() => None,
            p = port.probe_slots.clone().acquire_owned() => p.ok(),
        };
    }
    let waiting = port.queued.clone().try_acquire_owned().ok();
    let slot = match waiting {
        None => None,
        Some(_waiting) => tokio::select! {
            _ = port.shutdown.cancelled() => return None,
            r = tokio::time::timeout(SLOT_WAIT, port.slots.clone().acquire_owned()) => r.ok().and_then(Result::ok),
        },
    };
    if slot.is_none() {
        port.shared.metrics.http.busy.inc();
    }
    slot
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// Sends `bytes` to a fresh port, closes the sending side, and returns
    /// what came back, with the port's shared state.
    async fn exchange(bytes: Vec<u8>) -> (Vec<u8>, Arc<Shared>) {
        let shared = Shared::new("http://127.0.0.1:1", "p/");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let server = tokio::spawn(serve(
            listener,
            DebugAccess::Loopback,
            shared.clone(),
            shutdown.clone(),
            tracker.clone(),
        ));
        let mut client = TcpStream::connect(addr).await.unwrap();
        // The server may answer and close before all is sent.
        let _ = client.write_all(&bytes).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut out));
        assert!(read.await.is_ok(), "no close within 5 s");
        // The connection task counts once hyper is done with it.
        tracker.close();
        tracker.wait().await;
        shutdown.cancel();
        server.await.unwrap();
        (out, shared)
    }

    /// The status of an answer, if `out` is one answer with
    /// `Connection: close`.
    fn status_of(out: &[u8]) -> Option<u16> {
        let text = String::from_utf8_lossy(out);
        if !text.starts_with("HTTP/1.")
            || !text
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n")
        {
            return None;
        }
        text.get(9..12)?.parse().ok()
    }

    async fn status_for(bytes: &[u8]) -> (u16, Arc<Shared>) {
        let (out, shared) = exchange(bytes.to_vec()).await;
        let status = status_of(&out)
            .unwrap_or_else(|| panic!("not an answer: {:?}", String::from_utf8_lossy(&out)));
        (status, shared)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any bytes over TCP: the port answers a request it reads with a
        /// well-formed answer, refuses anything else with 400, 413, 414 or
        /// 431 counted in `http_bad_requests_total`, or closes without an
        /// answer counted in `http_idle_closed_total`; it never panics.
        #[test]
        fn any_bytes_are_answered_or_refused_and_counted(
            prefix in proptest::sample::select(vec![&b""[..], b"GET /-/healthy HTTP/1.1\r\n", b"GET /metrics HTTP/1.0\n", b"HEAD /status HTTP/1.1\r\n"]),
            tail in proptest::collection::vec(
                prop_oneof![
                    4 => proptest::sample::select(b"GET /HTP1.:\r\n a".to_vec()),
                    1 => any::<u8>(),
                ],
                0..600,
            ),
        ) {
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&tail);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (out, shared) = rt.block_on(exchange(bytes.clone()));
            let m = &shared.metrics;
            let (bad, idle) = (m.http.bad_requests.get(), m.http.idle_closed.get());
            let text = String::from_utf8_lossy(&out);
            match status_of(&out) {
                None => {
                    prop_assert!(out.is_empty(), "{}", text);
                    prop_assert_eq!((bad, idle), (0, 1));
                }
                Some(status) if bad == 1 => {
                    prop_assert!([400, 413, 414, 431].contains(&status), "{}", text);
                    prop_assert_eq!(idle, 0);
                }
                Some(status) => {
                    prop_assert!([200, 404, 405, 503].contains(&status), "{}", text);
                    prop_assert_eq!((bad, idle), (0, 0));
                }
            }
        }
    }

    #[tokio::test]
    async fn answers_what_probes_scrapers_and_curl_send() {
        for (request, want) in [
            (&b"GET /-/healthy HTTP/1.1\r\nHost: 10.0.0.1:9778\r\nUser-Agent: kube-probe/1.30\r\nAccept: */*\r\nConnection: close\r\n\r\n"[..], 200),
            (b"GET /metrics HTTP/1.0\n\n", 200),
            (b"GET /-/ready HTTP/1.1\r\nHost: a\r\n\r\n", 503),
            (b"GET /status?x=1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 200),
            (b"GET /nothing HTTP/1.1\r\n\r\n", 404),
            (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
        ] {
            let (status, shared) = status_for(request).await;
            assert_eq!(status, want, "{}", String::from_utf8_lossy(request));
            let m = &shared.metrics;
            assert_eq!(m.http.bad_requests.get() + m.http.idle_closed.get(), 0);
        }
    }

    #[tokio::test]
    async fn refuses_bodies_bad_heads_and_other_versions_and_counts_them() {
        let large = format!(
            "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_REQUEST_HEAD)
        );
        for (request, want) in [
            (&b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\n"[..], 413),
            (
                b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                413,
            ),
            (
                b"GET /x HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n",
                400,
            ),
            (b"GET /x HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
            (b"GET /x HTTP/2.0\r\n\r\n", 400),
            (b"GET /x\r\n\r\n", 400),
            (b"GET /x HTTP/1.1\r\n folded\r\n\r\n", 400),
            (b"GET /x HTTP/1.1\r\nNo colon\r\n\r\n", 400),
            (b"GET /x HTTP/1.1\r\nA: b\x00c\r\n\r\n", 400),
            (b"G\xffT /x HTTP/1.1\r\n\r\n", 400),
            (large.as_bytes(), 431),
        ] {
            let (status, shared) = status_for(request).await;
            let shown = String::from_utf8_lossy(&request[..request.len().min(80)]).to_string();
            assert_eq!(status, want, "{shown}");
            assert_eq!(shared.metrics.http.bad_requests.get(), 1, "{shown}");
            assert_eq!(shared.metrics.http.idle_closed.get(), 0, "{shown}");
        }
    }

    #[tokio::test]
    async fn closes_unanswered_and_counts_a_connection_with_no_whole_request() {
        for bytes in [&b""[..], b"G", b"GET /metrics HTTP/1.1\r\nHost: a\r\n"] {
            let (out, shared) = exchange(bytes.to_vec()).await;
            assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
            assert_eq!(shared.metrics.http.idle_closed.get(), 1);
            assert_eq!(shared.metrics.http.bad_requests.get(), 0);
        }
    }

    #[tokio::test]
    async fn head_answers_carry_the_length_but_no_body() {
        let (out, _) = exchange(b"HEAD /-/healthy HTTP/1.1\r\n\r\n".to_vec()).await;
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "{text}");
    }

    #[test]
    fn status_and_profiles_are_for_127_0_0_1_and_ipv6_loopback_unless_allowed() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let local = ["127.0.0.1", "::1", "::ffff:127.0.0.1"];
        // 127.0.0.6: Istio's sidecar; the rest of 127.0.0.0/8 is a proxy's
        // too, never the address a command on the node connects from.
        let remote = [
            "127.0.0.6",
            "127.0.0.2",
            "127.1.2.3",
            "::ffff:127.0.0.6",
            "10.0.0.1",
            "192.0.2.7",
            "::ffff:10.0.0.1",
            "2001:db8::1",
            "::",
            "0.0.0.0",
        ];
        let debug = ["/status", "/debug/pprof/profile", "/debug/pprof/flamegraph"];
        let public = [
            "/metrics",
            "/-/healthy",
            "/-/ready",
            "/-/answering",
            "/nothing",
        ];
        for peer in local.iter().chain(&remote) {
            for path in public {
                assert!(
                    DebugAccess::Loopback.allows(path, ip(peer)),
                    "{peer} {path}"
                );
            }
            for path in debug {
                let is_local = local.contains(peer);
                assert_eq!(
                    DebugAccess::Loopback.allows(path, ip(peer)),
                    is_local,
                    "{peer} {path}"
                );
                assert!(DebugAccess::Anyone.allows(path, ip(peer)), "{peer} {path}");
            }
        }
    }

    /// One request from a client at `peer` over an in-memory stream (no
    /// network: the peer address is what accept would have given).
    async fn from_peer(peer: &str, debug: DebugAccess, request: &str) -> u16 {
        let shared = Shared::new("http://127.0.0.1:1", "p/");
        let port = Arc::new(Port::new(debug, shared, CancellationToken::new()));
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let reading = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let exchange = Arc::new(Exchange {
            peer: peer.parse().unwrap(),
            reader: Readers::default().push(),
            reading: Mutex::new(Some(reading)),
            slot: Mutex::new(None),
            requested: AtomicBool::new(false),
            answered: CancellationToken::new(),
        });
        let task = tokio::spawn(serve_connection(server, exchange, port));
        client.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        status_of(&out).unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&out)))
    }

    #[tokio::test]
    async fn a_client_beyond_loopback_gets_metrics_but_not_status_or_profiles() {
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: 10.0.0.5:9778\r\n\r\n");
        for peer in ["10.0.0.1", "127.0.0.6"] {
            for (path, want) in [
                ("/metrics", 200),
                ("/-/healthy", 200),
                ("/-/ready", 503),
                ("/status", 403),
                ("/debug/pprof/profile?seconds=1", 403),
                ("/debug/pprof/flamegraph?seconds=1", 403),
            ] {
                assert_eq!(
                    from_peer(peer, DebugAccess::Loopback, &get(path)).await,
                    want,
                    "{peer} {path}"
                );
            }
        }
        for peer in ["127.0.0.1", "::ffff:127.0.0.1"] {
            assert_eq!(
                from_peer(peer, DebugAccess::Loopback, &get("/status")).await,
                200,
                "{peer}"
            );
        }
        assert_eq!(
            from_peer("10.0.0.1", DebugAccess::Anyone, &get("/status")).await,
            200
        );
    }
}
