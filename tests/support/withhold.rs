//! A proxy in front of a real Consul that, while told to, withholds every
//! blocking read (a `GET` with `index=N`, N > 0): it never forwards it and
//! never answers, and keeps the connection open until the client drops
//! it. Every other request (full reads, index checks, key reads, the ACL
//! probe) is forwarded on a connection of its own and answered. That is
//! what an overloaded server, or a proxy that holds long polls, looks like
//! from the agent: index checks pass while its blocking read goes nowhere.
//!
//! Threads on `127.0.0.1:0`, stopped when dropped; each forwarded request
//! is bounded by [`UPSTREAM_TIMEOUT`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a forwarded request may take (past Consul's longest wait).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(11 * 60);

/// How often idle threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Flags {
    withhold: AtomicBool,
    stop: AtomicBool,
    withheld: AtomicUsize,
    forwarded: AtomicUsize,
}

/// The proxy; see the module documentation.
pub struct WithholdingProxy {
    addr: SocketAddr,
    flags: Arc<Flags>,
    thread: Option<JoinHandle<()>>,
}

impl WithholdingProxy {
    /// A proxy to the Consul HTTP API at `upstream`, withholding nothing yet.
    pub fn start(upstream: SocketAddr) -> WithholdingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let flags = Arc::new(Flags::default());
        let f = Arc::clone(&flags);
        let thread = std::thread::spawn(move || {
            while !f.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let f = Arc::clone(&f);
                        std::thread::spawn(move || serve(conn, upstream, &f));
                    }
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        WithholdingProxy {
            addr,
            flags,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Withhold blocking reads that arrive from now on, or forward them.
    pub fn withhold(&self, on: bool) {
        self.flags.withhold.store(on, Ordering::SeqCst);
    }

    /// Blocking reads withheld so far.
    pub fn withheld(&self) -> usize {
        self.flags.withheld.load(Ordering::SeqCst)
    }

    /// Requests forwarded so far.
    pub fn forwarded(&self) -> usize {
        self.flags.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for WithholdingProxy {
    fn drop(&mut self) {
        self.flags.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves one client connection: one request, forwarded and answered
/// (then the connection closes), or withheld until the client drops it.
fn serve(mut conn: TcpStream, upstream: SocketAddr, flags: &Flags) {
    let _ = conn.set_read_timeout(Some(POLL));
    let mut buf = Vec::new();
    let Some(end) = read_head(&mut conn, &mut buf, flags) else {
        return;
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let body_len = header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < end + body_len {
        if !read_more(&mut conn, &mut buf, flags) {
            return;
        }
    }
    let line = head.lines().next().unwrap_or_default();
    if flags.withhold.load(Ordering::SeqCst) && blocking(line) {
        flags.withheld.fetch_add(1, Ordering::SeqCst);
        // Held: read (and drop) until the client gives up.
        while read_more(&mut conn, &mut buf, flags) {}
        return;
    }
    if let Some(answer) = forward(&buf[..end + body_len], end, upstream, flags) {
        flags.forwarded.fetch_add(1, Ordering::SeqCst);
        let _ = conn.write_all(&answer);
    }
    let _ = conn.shutdown(Shutdown::Both);
}

/// Reads until `buf` holds a whole request head; its length.
fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>, flags: &Flags) -> Option<usize> {
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(p + 4);
        }
        if !read_more(conn, buf, flags) {
            return None;
        }
    }
}

/// One read into `buf`; false once the client closed or the proxy stops.
fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>, flags: &Flags) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        if flags.stop.load(Ordering::SeqCst) {
            return false;
        }
        match conn.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return true;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return false,
        }
    }
}

/// Whether the request line is a blocking read: `index=N` with N > 0.
fn blocking(line: &str) -> bool {
    let Some(query) = line
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.split_once('?'))
    else {
        return false;
    };
    query.1.split('&').any(|p| {
        p.strip_prefix("index=")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|i| i > 0)
    })
}

/// A header's value (the first with that name, case-insensitive).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends `request` (its head `head_len` bytes) to `upstream` with
/// `Connection: close` and returns the whole answer; `None` if it fails,
/// takes longer than [`UPSTREAM_TIMEOUT`], or the proxy stops.
fn forward(
    request: &[u8],
    head_len: usize,
    upstream: SocketAddr,
    flags: &Flags,
) -> Option<Vec<u8>> {
    let head = String::from_utf8_lossy(&request[..head_len - 2]);
    let mut out = String::new();
    for l in head.split("\r\n").filter(|l| !l.is_empty()) {
        if !l.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut up = TcpStream::connect_timeout(&upstream, UPSTREAM_TIMEOUT).ok()?;
    up.write_all(out.as_bytes()).ok()?;
    up.write_all(&request[head_len..]).ok()?;
    up.set_read_timeout(Some(POLL)).ok()?;
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16384];
    while started.elapsed() < UPSTREAM_TIMEOUT && !flags.stop.load(Ordering::SeqCst) {
        match up.read(&mut chunk) {
            Ok(0) => return Some(answer),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
    None
}
