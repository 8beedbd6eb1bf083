//! The operator HTTP endpoint: `/metrics` (Prometheus text format),
//! `/-/healthy`, `/-/ready` and `/status` (JSON for humans and tools).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::agent::guard::{HeldKeys, HoldCause};
use crate::agent::shared::Shared;
use crate::model::snapshot::Entry;

/// HTTP connections served at once: 64. Scrapers and humans, not traffic.
pub const MAX_HTTP_CONNECTIONS: usize = 64;

/// Time a client has to send its request headers: 10 s.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the operator endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(MAX_HTTP_CONNECTIONS));
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
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&req, &shared)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
                }
            }
            drop(permit);
        });
    }
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

/// The `held` object of `/status`: each key answered with a held value
/// (see [`crate::agent::guard`]), with the state answered and why. Keys
/// held for an invalid value are also added to `invalid`, since that is
/// their value.
fn held_json(held: &HeldKeys, invalid: &mut serde_json::Map<String, Value>) -> Value {
    let mut out = serde_json::Map::new();
    for (key, h) in held {
        let detail = match &h.cause {
            HoldCause::InvalidValue(e) => {
                invalid.insert(
                    key.to_string(),
                    json!({"reason": e.to_string(), "modify_index": h.consul_modify_index, "held": h.state.to_string()}),
                );
                format!("current value is invalid: {e}")
            }
            HoldCause::RolledBack => match h.consul_modify_index {
                None => "Consul's data went backwards and the key is gone; release with `state release-rollback` or a new write".to_string(),
                Some(_) => "Consul's data went backwards and the key is ready; release with `state release-rollback` or a new write".to_string(),
            },
        };
        out.insert(
            key.to_string(),
            json!({
                "state": h.state.to_string(),
                "reply": String::from_utf8_lossy(h.state.reply().as_bytes()).trim_end(),
                "cause": h.cause.as_str(),
                "detail": detail,
                "consul_modify_index": h.consul_modify_index,
                "since": unix(h.since),
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
    let held_keys = shared.held.lock().unwrap().clone();
    let held = held_json(&held_keys, &mut invalid);
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
        "rows": rows,
    })
}
