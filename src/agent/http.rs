//! The operator HTTP endpoint: `/metrics` (Prometheus text format),
//! `/-/healthy`, `/-/ready`, `/status` (JSON for humans and tools) and
//! on-demand CPU profiles under `/debug/pprof/` ([`crate::agent::profile`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::agent::profile;
use crate::agent::shared::Shared;
use crate::decision::served::ServedState;
use crate::decision::HoldCause;
use crate::model::snapshot::Entry;

/// HTTP connections served at once (a request being read or answered): 64.
/// Scrapers, probes and humans, not traffic.
pub const MAX_HTTP_CONNECTIONS: usize = 64;

/// Connections accepted but not yet sending (no byte of a request yet): 512.
/// They hold no serving slot, so idle connections cannot lock the port
/// out; past this many, new connections wait in the listen backlog (and are
/// accepted as soon as one of these is closed) rather than being dropped.
pub const MAX_HTTP_PENDING: usize = 512;

/// Time a client has, from connecting, to send its first byte, and then its
/// complete request headers: 2 s each. A kubelet probe or a Prometheus scrape
/// sends its request at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves the operator endpoints on `listener` until `shutdown`.
///
/// One request per connection (`Connection: close`), so no keep-alive
/// connection holds a slot between requests. Each connection waits, holding
/// no serving slot, until its first byte arrives (at most
/// [`HEADER_READ_TIMEOUT`]); then it waits for one of
/// [`MAX_HTTP_CONNECTIONS`] slots and has [`HEADER_READ_TIMEOUT`] more for its
/// headers. Connections closed for sending nothing in time are counted in
/// `gitlab_haproxy_agent_http_idle_closed_total`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let pending = Arc::new(Semaphore::new(MAX_HTTP_PENDING));
    let slots = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
    loop {
        // Wait for room rather than dropping a connection at the cap.
        let waiting = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = pending.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
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
        tracker.spawn(serve_connection(
            stream,
            waiting,
            slots.clone(),
            shared.clone(),
            shutdown.clone(),
        ));
    }
}

/// One connection: wait (holding only `waiting`) for its first byte, then
/// for a serving slot, then serve one request.
async fn serve_connection(
    stream: TcpStream,
    waiting: OwnedSemaphorePermit,
    slots: Arc<Semaphore>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    // peek, not readable(): readiness can be reported before any byte is
    // there; a peek returns only once one is (or at EOF, with 0).
    let mut byte = [0u8; 1];
    let first_byte = tokio::select! {
        _ = shutdown.cancelled() => return,
        r = tokio::time::timeout(HEADER_READ_TIMEOUT, stream.peek(&mut byte)) => r,
    };
    if !matches!(first_byte, Ok(Ok(1))) {
        shared.metrics.http_idle_closed.inc();
        return;
    }
    let permit = tokio::select! {
        _ = shutdown.cancelled() => return,
        p = slots.acquire_owned() => p.expect("the semaphore is never closed"),
    };
    drop(waiting);
    let service = {
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let shared = shared.clone();
            let shutdown = shutdown.clone();
            async move {
                let profile = match *req.method() {
                    Method::GET => profile::Format::for_path(req.uri().path()),
                    _ => None,
                };
                Ok::<_, Infallible>(match profile {
                    Some(format) => {
                        profile::serve(format, req.uri().query(), &shared, &shutdown).await
                    }
                    None => route(&req, &shared),
                })
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if r.is_err_and(|e| e.is_timeout()) {
                shared.metrics.http_idle_closed.inc();
            }
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
        }
    }
    drop(permit);
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn route(req: &Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            shared.metrics.observe_seen(&shared.seen.summary());
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                shared.metrics.render(shared.started_at),
            )
        }
        "/-/healthy" => text(StatusCode::OK, PLAIN, "OK\n".into()),
        "/-/ready" => {
            if shared.readiness.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "not ready: waiting for the first Consul sync\n".into(),
                )
            }
        }
        "/status" => {
            let mut body = serde_json::to_string_pretty(&status(shared))
                .expect("a JSON value always serialises");
            body.push('\n');
            text(StatusCode::OK, "application/json", body)
        }
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
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
    if let Some(snap) = &snapshot {
        let mut sorted: Vec<_> = snap.keys.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        for (key, state) in sorted {
            match &state.entry {
                Entry::Valid(s) => {
                    keys.insert(
                        key.to_string(),
                        json!({"state": s.to_string(), "reply": String::from_utf8_lossy(s.reply().as_bytes()).trim_end(), "modify_index": state.modify_index}),
                    );
                }
                Entry::Invalid(e) => {
                    invalid.insert(
                        key.to_string(),
                        json!({"reason": e.to_string(), "modify_index": state.modify_index}),
                    );
                }
            }
        }
    }
    let served = shared.served.lock().unwrap().clone();
    let held = served
        .as_deref()
        .map_or_else(|| json!({}), |s| held_json(s, &mut invalid));
    let state_file = shared.state_file.lock().unwrap().clone();
    let rows: Vec<Value> = shared
        .seen
        .rows()
        .into_iter()
        .map(|(line, row)| {
            json!({
                "agent_send": line,
                "last_asked": unix(row.last_asked_wall),
                "last_asked_age_seconds": row.last_asked.elapsed().as_secs_f64(),
                "answer": row.answer,
                "kind": row.kind.as_str(),
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
    })
}
