//! The operator HTTP endpoint: `/metrics` (Prometheus text format),
//! `/-/healthy`, `/-/ready`, `/status` (JSON for humans and tools) and
//! on-demand CPU profiles under `/debug/pprof/` ([`crate::agent::profile`]).

pub mod answer;
pub mod request;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::agent::profile;
use crate::agent::shared::Shared;
use crate::decision::served::ServedState;
use crate::decision::HoldCause;
use crate::model::snapshot::Entry;
use crate::model::value::AnswerKind;
pub use answer::{Answer, PLAIN};
use request::{Method, Read, Request};

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

/// Time a client has, from connecting, to send its whole request head: 2 s.
/// A kubelet probe or a Prometheus scrape sends it at once.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Connections reading their request, oldest first, so the oldest can be
/// closed at [`MAX_HTTP_PENDING`]. A connection cancels its own token once
/// its request is read; cancelled entries are dropped from the front.
#[derive(Default)]
struct Readers(Mutex<VecDeque<CancellationToken>>);

impl Readers {
    fn push(&self) -> CancellationToken {
        let token = CancellationToken::new();
        let mut queue = self.0.lock().unwrap();
        while queue.front().is_some_and(|t| t.is_cancelled()) {
            queue.pop_front();
        }
        queue.push_back(token.clone());
        token
    }

    /// Closes the connection that has been reading longest; false if none is.
    fn close_oldest(&self) -> bool {
        let mut queue = self.0.lock().unwrap();
        while let Some(token) = queue.pop_front() {
            if !token.is_cancelled() {
                token.cancel();
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
    /// The last `/status` body and when its building began; held while one
    /// is built, so requests at once share one build.
    status: tokio::sync::Mutex<Option<(Instant, Arc<[u8]>)>>,
}

/// Serves the operator endpoints on `listener` until `shutdown`.
///
/// One request per connection (`Connection: close`), in three steps, each
/// bounded: the whole request head is read within [`REQUEST_READ_TIMEOUT`]
/// holding no serving slot (at most [`MAX_HTTP_PENDING`] at once, the
/// oldest closed for a new one); then the request takes one of
/// [`MAX_HTTP_CONNECTIONS`] serving slots (probes from the ones kept for
/// them, others waiting at most [`SLOT_WAIT`]); then the answer is written
/// within [`WRITE_TIMEOUT`]. Connections closed with no complete request
/// are counted in `gitlab_haproxy_agent_http_idle_closed_total`, refused
/// requests in `gitlab_haproxy_agent_http_bad_requests_total`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let pending = Arc::new(Semaphore::new(MAX_HTTP_PENDING));
    let readers = Arc::new(Readers::default());
    let port = Arc::new(Port {
        shared,
        shutdown: shutdown.clone(),
        slots: Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS - PROBE_SLOTS)),
        probe_slots: Arc::new(Semaphore::new(PROBE_SLOTS)),
        queued: Arc::new(Semaphore::new(MAX_HTTP_PENDING)),
        status: tokio::sync::Mutex::new(None),
    });
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
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
        let token = readers.push();
        tracker.spawn(serve_connection(stream, reading, token, port.clone()));
    }
}

/// One connection: read its request (holding only `reading`), take a slot,
/// answer, close.
async fn serve_connection(
    mut stream: TcpStream,
    reading: OwnedSemaphorePermit,
    token: CancellationToken,
    port: Arc<Port>,
) {
    let metrics = &port.shared.metrics;
    let read = tokio::select! {
        _ = port.shutdown.cancelled() => return,
        _ = token.cancelled() => Read::Incomplete,
        r = request::read(&mut stream, REQUEST_READ_TIMEOUT) => r,
    };
    token.cancel();
    drop(reading);
    let request = match read {
        Read::Request(request) => request,
        Read::Incomplete => {
            metrics.http_idle_closed.inc();
            return;
        }
        Read::Refused(refusal) => {
            metrics.http_bad_requests.inc();
            let answer = Answer::plain(refusal.status, format!("{}\n", refusal.reason));
            write(&mut stream, &answer, false, &port).await;
            return;
        }
    };
    let slot = take_slot(&request, &port).await;
    let answer = match &slot {
        Some(_) => answer(&request, &port).await,
        None if port.shutdown.is_cancelled() => return,
        None => Answer::plain(503, "every serving slot is busy; try again\n")
            .with_header("Retry-After", "1".into()),
    };
    write(&mut stream, &answer, request.method == Method::Head, &port).await;
    drop(slot);
}

/// A serving slot for `request`: probes from the kept slots (or a free
/// ordinary one), others waiting at most [`SLOT_WAIT`] (counted in
/// `gitlab_haproxy_agent_http_busy_total` when none came). `None` when no
/// slot came in time, or at shutdown.
async fn take_slot(request: &Request, port: &Arc<Port>) -> Option<OwnedSemaphorePermit> {
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
        port.shared.metrics.http_busy.inc();
    }
    slot
}

/// The answer to a request that parsed.
async fn answer(request: &Request, port: &Port) -> Answer {
    let (get, head) = (
        request.method == Method::Get,
        request.method == Method::Head,
    );
    if get {
        if let Some(format) = profile::Format::for_path(&request.path) {
            return profile::serve(
                format,
                request.query.as_deref(),
                &port.shared,
                &port.shutdown,
            )
            .await;
        }
    }
    if !get && !head {
        return Answer::plain(405, "GET only\n").with_header("Allow", "GET, HEAD".into());
    }
    if request.path == "/status" {
        return status_answer(port).await;
    }
    route(&request.path, &port.shared)
}

/// `/status`, built off the async workers (for 45,000 keys it is a few MB
/// of JSON) and at most one at a time: a request that finds a body whose
/// building began after it arrived takes that one, so it is never older
/// than the request and a crowd of requests costs one build.
async fn status_answer(port: &Port) -> Answer {
    let arrived = Instant::now();
    let mut last = port.status.lock().await;
    if let Some((began, body)) = last.as_ref() {
        if *began >= arrived {
            return Answer::new(200, "application/json", Vec::new()).with_shared_body(body.clone());
        }
    }
    let began = Instant::now();
    let shared = port.shared.clone();
    let built = tokio::task::spawn_blocking(move || {
        let mut body =
            serde_json::to_vec_pretty(&status(&shared)).expect("a JSON value always serialises");
        body.push(b'\n');
        Arc::<[u8]>::from(body)
    })
    .await;
    match built {
        Ok(body) => {
            *last = Some((began, body.clone()));
            Answer::new(200, "application/json", Vec::new()).with_shared_body(body)
        }
        Err(e) => Answer::plain(500, format!("building the status failed: {e}\n")),
    }
}

/// Writes `answer` (without its body for HEAD) within [`WRITE_TIMEOUT`],
/// then closes the sending side.
async fn write(stream: &mut TcpStream, answer: &Answer, head_only: bool, port: &Port) {
    let writing = async {
        stream.write_all(answer.head().as_bytes()).await?;
        if !head_only {
            stream.write_all(&answer.body).await?;
        }
        stream.shutdown().await
    };
    tokio::pin!(writing);
    let written = tokio::select! {
        r = tokio::time::timeout(WRITE_TIMEOUT, &mut writing) => r,
        _ = port.shutdown.cancelled() => tokio::time::timeout(SHUTDOWN_WRITE_GRACE, &mut writing).await,
    };
    if written.is_err() {
        port.shared.metrics.http_write_timeouts.inc();
    }
}

/// The rows seen, judged against the state served now: a silent row counts
/// as out only while the current snapshot still answers it drain or maint.
fn seen_summary(shared: &Shared) -> crate::agent::seen::SeenSummary {
    let snapshot = shared.snapshot.load();
    shared.seen.summary(|line| {
        snapshot.as_ref().as_ref().is_none_or(|s| {
            matches!(
                s.lookup(crate::model::identity::identities(line)).kind(),
                AnswerKind::Drain | AnswerKind::Maint
            )
        })
    })
}

fn route(path: &str, shared: &Shared) -> Answer {
    match path {
        "/metrics" => {
            shared.metrics.observe_seen(&seen_summary(shared));
            Answer::new(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                shared.metrics.render(shared.started_at).into_bytes(),
            )
        }
        "/-/healthy" => Answer::plain(200, "OK\n"),
        "/-/ready" => {
            if shared.readiness.is_ready() {
                Answer::plain(200, "ready\n")
            } else {
                Answer::plain(503, "not ready: waiting for the first Consul sync\n")
            }
        }
        "/-/answering" => match (
            shared.snapshot.load().is_some(),
            shared.readiness.is_ready(),
        ) {
            (true, true) => Answer::plain(200, "answering from Consul\n"),
            (true, false) => Answer::plain(
                200,
                format!(
                    "{}; Consul not reached since the start\n",
                    crate::check_ready::FROM_STATE_FILE
                ),
            ),
            (false, _) => Answer::plain(
                503,
                "not answering: no state file and no Consul answer yet\n",
            ),
        },
        _ => Answer::plain(404, "not found\n"),
    }
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The `held` object of `/status`: each key answered with another state
/// than Consul's, with the state answered and why. Keys held for an invalid
/// value are also added to `invalid`, since that is their value.
fn held_json(served: &ServedState, invalid: &mut serde_json::Map<String, Value>) -> Value {
    let mut out = serde_json::Map::new();
    for (key, record) in &served.keys {
        let Some(hold) = record.hold else {
            continue;
        };
        let state_text = record.served.map_or("none".to_string(), |s| s.to_string());
        let reply = record
            .served
            .map_or("none (the key is not answered)".to_string(), |s| {
                String::from_utf8_lossy(s.reply().as_bytes())
                    .trim_end()
                    .to_string()
            });
        let consul_modify_index = record.consul.as_ref().map(|c| c.modify_index);
        let detail = match hold.cause {
            HoldCause::InvalidValue => {
                let reason = match record.consul.as_ref().map(|c| &c.entry) {
                    Some(Entry::Invalid(e)) => e.to_string(),
                    _ => String::new(),
                };
                invalid.insert(
                    key.to_string(),
                    json!({"reason": reason, "modify_index": consul_modify_index, "held": state_text}),
                );
                format!("current value is invalid: {reason}")
            }
            HoldCause::RolledBack => match consul_modify_index {
                None => "Consul lost its data and the key is gone; release with `state release-rollback` or a new write".to_string(),
                Some(_) => "Consul lost its data and the key's value there would put servers back in rotation; release with `state release-rollback` or a new write".to_string(),
            },
            HoldCause::Hidden => "the token may not read the key (403); its last state is answered until it can".to_string(),
        };
        out.insert(
            key.to_string(),
            json!({
                "state": state_text,
                "reply": reply,
                "cause": hold.cause.as_str(),
                "answer": crate::decision::held_answer(record.served, hold.cause),
                "detail": detail,
                "consul_modify_index": consul_modify_index,
                "since": hold.since as f64,
            }),
        );
    }
    Value::Object(out)
}

/// The `/status` document: sync state, keys held with their parsed state,
/// invalid keys with the reason, and the rows HAProxy asked about.
pub fn status(shared: &Shared) -> Value {
    let snapshot = shared.snapshot.load_full();
    let sync = shared.sync.lock().unwrap().clone();
    let now = SystemTime::now();
    let mut keys = serde_json::Map::new();
    let mut invalid = serde_json::Map::new();
    let served = shared.served.lock().unwrap().clone();
    if let Some(snap) = &snapshot {
        let mut sorted: Vec<_> = snap.keys.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        for (key, state) in sorted {
            match &state.entry {
                Entry::Valid(s) => {
                    let record = served.as_deref().and_then(|v| v.keys.get(key));
                    let meta = record.and_then(|r| r.meta.as_deref());
                    keys.insert(
                        key.to_string(),
                        json!({
                            "state": s.to_string(),
                            "reply": String::from_utf8_lossy(s.reply().as_bytes()).trim_end(),
                            "modify_index": state.modify_index,
                            "served_since": record.map(|r| r.since),
                            "written": crate::model::meta::written_json(meta),
                        }),
                    );
                }
                Entry::Invalid(e) => {
                    invalid.insert(
                        key.to_string(),
                        json!({"reason": e.to_string(), "modify_index": state.modify_index}),
                    );
                }
                // Listed under `held` (hidden, no value known).
                Entry::Unreadable => {}
            }
        }
    }
    let held = served
        .as_deref()
        .map_or_else(|| json!({}), |s| held_json(s, &mut invalid));
    let state_file = shared.state_file.lock().unwrap().clone();
    let summary = seen_summary(shared);
    let rows: Vec<Value> = shared
        .seen
        .rows()
        .into_iter()
        .map(|(line, row)| {
            let silent = row.last_asked.elapsed();
            json!({
                "agent_send": line,
                "last_asked": unix(row.last_asked_wall),
                "last_asked_age_seconds": silent.as_secs_f64(),
                "answer": row.answer,
                "kind": row.kind.as_str(),
                "decided_by": row.decided_by.and_then(|p| crate::model::identity::identities(&line).nth(usize::from(p))),
                "ask_interval_seconds": row.interval.map(|i| i.as_secs_f64()),
                "not_asked": silent > row.deadline(),
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "synced": snapshot.is_some(),
        "ready": shared.readiness.is_ready(),
        "consul_addr": shared.consul_addr,
        "prefix": shared.prefix,
        "consul_index": snapshot.as_ref().map(|s| s.index),
        "last_sync": sync.last_sync.map(unix),
        "last_sync_age_seconds": sync.last_sync.and_then(|t| now.duration_since(t).ok()).map(|d| d.as_secs_f64()),
        "consul_failing_for_seconds": sync.failing_since.map(|t| t.elapsed().as_secs_f64()),
        "last_error": sync.last_error,
        "consul_current": sync.unconfirmed_for().is_some_and(|d| d <= crate::agent::shared::CURRENT_WITHIN),
        "consul_unconfirmed_seconds": sync.unconfirmed_for().map(|d| d.as_secs_f64()),
        "keys": keys,
        "invalid": invalid,
        "held": held,
        "store_id": served.as_ref().and_then(|s| s.store_id.as_deref().map(str::to_string)),
        "state_file": {
            "path": state_file.path,
            "loaded": state_file.loaded,
            "load_error": state_file.load_error,
            "write_error": state_file.write_error,
        },
        "rows": rows,
        "out_rows_not_asked": summary.out_not_asked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use tokio::io::AsyncReadExt as _;

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
        shutdown.cancel();
        server.await.unwrap();
        tracker.close();
        tracker.wait().await;
        (out, shared)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any bytes over TCP: the port answers a request it reads with a
        /// well-formed answer, refuses anything else with 400, 413, 431 or
        /// 505 counted in `http_bad_requests_total`, or closes without an
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
            let expected = match request::head_end(&bytes) {
                None if bytes.len() >= request::MAX_REQUEST_HEAD => Some(Read::Refused(request::Refusal { status: 431, reason: "" })),
                None => None,
                Some(end) => Some(request::parse(&bytes[..end])),
            };
            match expected {
                None => {
                    prop_assert!(out.is_empty());
                    prop_assert_eq!(m.http_idle_closed.get(), 1);
                }
                Some(Read::Refused(r)) => {
                    let status_line = format!("HTTP/1.1 {} ", r.status);
                    prop_assert!(out.starts_with(status_line.as_bytes()), "{:?}", String::from_utf8_lossy(&out));
                    prop_assert_eq!(m.http_bad_requests.get(), 1);
                }
                Some(Read::Request(req)) => {
                    let text = String::from_utf8_lossy(&out);
                    prop_assert!(text.starts_with("HTTP/1.1 "), "{}", text);
                    prop_assert!(text.contains("\r\nConnection: close\r\n"), "{}", text);
                    let status: u16 = text[9..12].parse().unwrap();
                    let want = match (&req.method, req.path.as_str()) {
                        (Method::Other(_), _) => 405,
                        (_, "/-/healthy" | "/metrics" | "/status") => 200,
                        (_, "/-/ready" | "/-/answering") => 503,
                        (Method::Get, p) if profile::Format::for_path(p).is_some() => status,
                        _ => 404,
                    };
                    prop_assert_eq!(status, want, "{}", text);
                    prop_assert_eq!(m.http_bad_requests.get() + m.http_idle_closed.get(), 0);
                }
                Some(Read::Incomplete) => unreachable!(),
            }
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
}
