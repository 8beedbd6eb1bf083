//! A counting HTTP/1.1 proxy on 127.0.0.1 between one Consul client and
//! Consul: it forwards every request unchanged (hyper; one connection to
//! Consul per client connection, so the client's connection pattern is
//! kept), records each request's method, path and query, and counts the
//! bytes each way as they cross the sockets: what the client sent, and what
//! Consul sent back as Consul encoded it (gzip included).
//!
//! Bytes are HTTP bytes (status or request line, headers, body, chunk
//! framing) on the TCP stream; TCP/IP framing is not counted.
//!
//! Each request also carries its own bytes: what the client sent on its
//! connection since the previous request there began (its request line and
//! headers; a body that arrives after the request was forwarded counts with
//! the next request on that connection), and what Consul sent on that
//! connection while it was the latest. The agent's index checks
//! (`?keys&separator=/`) are counted apart from every other request, so a
//! figure per change leaves out the checks that happened to fall in it.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One request the client made through the proxy.
#[derive(Clone, Debug)]
pub struct Forwarded {
    pub method: String,
    /// Path and query as the client sent them.
    pub path_and_query: String,
    /// Whether the request carried `Accept-Encoding` with `gzip`.
    pub asked_gzip: bool,
    /// Consul's status, once its answer began.
    pub status: Option<u16>,
    /// Whether Consul's answer was `Content-Encoding: gzip`.
    pub gzip_answer: bool,
    pub started: Instant,
    /// When Consul's status line and headers came back.
    pub answered: Option<Instant>,
    /// Bytes the client sent for this request (see the module's notes).
    pub to_consul: u64,
    /// Bytes Consul sent for this request.
    pub from_consul: u64,
}

impl Forwarded {
    /// Whether the query has a `stale` parameter (`?stale`, `&stale=`): a
    /// read any server may answer. Every other read is served by the leader.
    pub fn is_stale(&self) -> bool {
        self.path_and_query
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|p| p.split('=').next() == Some("stale")))
    }

    /// Whether this is the agent's index check: a `?keys` read with a
    /// `separator` (`GET /v1/kv/<prefix>?keys&separator=/&stale`).
    pub fn is_index_check(&self) -> bool {
        self.path_and_query.split_once('?').is_some_and(|(_, q)| {
            let has = |name: &str| q.split('&').any(|p| p.split('=').next() == Some(name));
            has("keys") && has("separator")
        })
    }
}

/// Counters at one moment; subtract two for a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests the client began, index checks apart (so are all the
    /// figures below but `connections` and the `checks` ones).
    pub requests: u64,
    /// Of those, requests without `stale` in their query.
    pub leader_requests: u64,
    /// Of those, requests that asked for gzip.
    pub asked_gzip: u64,
    /// Answers Consul sent gzipped.
    pub gzip_answers: u64,
    /// TCP connections the client opened to the proxy.
    pub connections: u64,
    /// Bytes the client sent (request lines, headers, bodies).
    pub to_consul: u64,
    /// Bytes Consul sent (status lines, headers, bodies as encoded).
    pub from_consul: u64,
    /// Index checks the client began.
    pub checks: u64,
    /// Bytes the client sent for its index checks.
    pub checks_to_consul: u64,
    /// Bytes Consul sent for the index checks.
    pub checks_from_consul: u64,
}

impl std::ops::Sub for Totals {
    type Output = Totals;

    fn sub(self, before: Totals) -> Totals {
        Totals {
            requests: self.requests - before.requests,
            leader_requests: self.leader_requests - before.leader_requests,
            asked_gzip: self.asked_gzip - before.asked_gzip,
            gzip_answers: self.gzip_answers - before.gzip_answers,
            connections: self.connections - before.connections,
            to_consul: self.to_consul - before.to_consul,
            from_consul: self.from_consul - before.from_consul,
            checks: self.checks - before.checks,
            checks_to_consul: self.checks_to_consul - before.checks_to_consul,
            checks_from_consul: self.checks_from_consul - before.checks_from_consul,
        }
    }
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, other: Totals) {
        self.requests += other.requests;
        self.leader_requests += other.leader_requests;
        self.asked_gzip += other.asked_gzip;
        self.gzip_answers += other.gzip_answers;
        self.connections += other.connections;
        self.to_consul += other.to_consul;
        self.from_consul += other.from_consul;
        self.checks += other.checks;
        self.checks_to_consul += other.checks_to_consul;
        self.checks_from_consul += other.checks_from_consul;
    }
}

#[derive(Default)]
struct Shared {
    to_consul: AtomicU64,
    from_consul: AtomicU64,
    connections: AtomicU64,
    log: Mutex<Vec<Forwarded>>,
    last_activity: Mutex<Option<Instant>>,
}

impl Shared {
    fn touch(&self) {
        *self.last_activity.lock().unwrap() = Some(Instant::now());
    }
}

/// The proxy, serving on its own thread until dropped.
pub struct CountingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl CountingProxy {
    /// Listens on `127.0.0.1:0` (a port of its own) and forwards to
    /// `upstream`, which must be on loopback.
    pub fn start(upstream: SocketAddr) -> CountingProxy {
        assert!(
            upstream.ip().is_loopback(),
            "the proxy forwards to loopback only"
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let shutdown = CancellationToken::new();
        let thread = {
            let (shared, shutdown) = (shared.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("proxy-{}", addr.port()))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("proxy runtime");
                    rt.block_on(accept_loop(listener, upstream, shared, shutdown));
                    // Dropping the runtime drops every connection task, so
                    // the client's and Consul's sockets close with it.
                })
                .expect("proxy thread")
        };
        CountingProxy {
            addr,
            shared,
            shutdown,
            thread: Some(thread),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The counters now.
    pub fn totals(&self) -> Totals {
        let log = self.shared.log.lock().unwrap();
        let count = |f: &dyn Fn(&Forwarded) -> bool| {
            log.iter().filter(|r| !r.is_index_check() && f(r)).count() as u64
        };
        let checks = || log.iter().filter(|r| r.is_index_check());
        let checks_to_consul: u64 = checks().map(|r| r.to_consul).sum();
        let checks_from_consul: u64 = checks().map(|r| r.from_consul).sum();
        Totals {
            requests: count(&|_| true),
            leader_requests: count(&|r| !r.is_stale()),
            asked_gzip: count(&|r| r.asked_gzip),
            gzip_answers: count(&|r| r.gzip_answer),
            connections: self.shared.connections.load(Ordering::SeqCst),
            to_consul: self.shared.to_consul.load(Ordering::SeqCst) - checks_to_consul,
            from_consul: self.shared.from_consul.load(Ordering::SeqCst) - checks_from_consul,
            checks: checks().count() as u64,
            checks_to_consul,
            checks_from_consul,
        }
    }

    /// Every request so far, in the order they began.
    pub fn requests(&self) -> Vec<Forwarded> {
        self.shared.log.lock().unwrap().clone()
    }

    /// How long the client has been parked: `Some(t)` when at least one of
    /// its requests is waiting for Consul and nothing was sent or answered
    /// for `t`; `None` while it is busy or has nothing in flight.
    pub fn parked_for(&self) -> Option<Duration> {
        let waiting = self
            .shared
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.answered.is_none());
        let last = (*self.shared.last_activity.lock().unwrap())?;
        waiting.then(|| last.elapsed())
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((client, _)) => {
                shared.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_client(client, upstream, shared.clone()));
            }
            // EMFILE and the like: the benchmark's own limits; pause briefly.
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// One client connection: one connection to Consul, each request sent on
/// it in turn (HTTP/1.1 answers in order anyway).
async fn serve_client(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    let Ok(consul) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = consul.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let share = Arc::new(Conn::default());
    let consul = Counted::new(consul, shared.clone(), share.clone(), Direction::FromConsul);
    let Ok((sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(consul)).await
    else {
        return;
    };
    // Ends when the sender is dropped (the client's connection closed) or
    // Consul closes.
    tokio::spawn(conn);
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let client = Counted::new(client, shared.clone(), share.clone(), Direction::ToConsul);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (sender, shared, conn) = (sender.clone(), shared.clone(), share.clone());
        async move { Ok::<_, hyper::Error>(forward(req, &sender, &shared, &conn).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
}

/// Sends `req` to Consul as it came and returns Consul's answer, its body
/// streamed through unchanged; a 502 if Consul's connection failed.
async fn forward(
    req: Request<Incoming>,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    shared: &Shared,
    conn: &Conn,
) -> Response<ProxyBody> {
    let asked_gzip = req
        .headers()
        .get_all(hyper::header::ACCEPT_ENCODING)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("gzip")));
    let slot = {
        let mut log = shared.log.lock().unwrap();
        log.push(Forwarded {
            method: req.method().to_string(),
            path_and_query: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), |p| p.to_string()),
            asked_gzip,
            status: None,
            gzip_answer: false,
            started: Instant::now(),
            answered: None,
            to_consul: conn.pending_to.swap(0, Ordering::SeqCst),
            from_consul: 0,
        });
        let slot = log.len() - 1;
        *conn.current.lock().unwrap() = Some(slot);
        slot
    };
    shared.touch();
    let answer = sender.lock().await.send_request(req).await;
    let response = match answer {
        Ok(response) => response.map(|b| b.boxed()),
        Err(e) => Response::builder()
            .status(502)
            .body(
                Full::new(Bytes::from(format!("proxy: {e}\n")))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .expect("a 502"),
    };
    {
        let mut log = shared.log.lock().unwrap();
        let record = &mut log[slot];
        record.status = Some(response.status().as_u16());
        record.gzip_answer = response
            .headers()
            .get(hyper::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        record.answered = Some(Instant::now());
    }
    shared.touch();
    response
}

/// Which counter a socket's reads add to.
#[derive(Clone, Copy)]
enum Direction {
    /// The client's socket: what it reads is what the client sent.
    ToConsul,
    /// Consul's socket: what it reads is what Consul sent.
    FromConsul,
}

/// One client connection's share of the bytes: what the client sent since
/// its latest request began, and which request Consul is answering.
#[derive(Default)]
struct Conn {
    pending_to: AtomicU64,
    current: Mutex<Option<usize>>,
}

/// A socket that counts the bytes read from it.
struct Counted {
    inner: TcpStream,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    direction: Direction,
}

impl Counted {
    fn new(
        inner: TcpStream,
        shared: Arc<Shared>,
        conn: Arc<Conn>,
        direction: Direction,
    ) -> Counted {
        Counted {
            inner,
            shared,
            conn,
            direction,
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            let counter = match self.direction {
                Direction::ToConsul => &self.shared.to_consul,
                Direction::FromConsul => &self.shared.from_consul,
            };
            counter.fetch_add(n, Ordering::SeqCst);
            match self.direction {
                Direction::ToConsul => {
                    self.conn.pending_to.fetch_add(n, Ordering::SeqCst);
                }
                Direction::FromConsul => {
                    if let Some(slot) = *self.conn.current.lock().unwrap() {
                        self.shared.log.lock().unwrap()[slot].from_consul += n;
                    }
                }
            }
            self.shared.touch();
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
