//! What each request on the HTTP port is answered: health, readiness,
//! metrics, `/status` and the CPU profiles, by method and path.

use std::sync::Arc;

use hyper::Method;
use tokio_util::sync::CancellationToken;

use super::answer::Answer;
use super::profile;
use super::status::{seen_summary, StatusCache};
use crate::agent::shared::Shared;

/// A request that was read, as far as the routes care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    /// The method.
    pub method: Method,
    /// The path of the target, before any `?`.
    pub path: String,
    /// The query after the first `?`, if any (not decoded).
    pub query: Option<String>,
}

impl Request {
    /// The method and target of a request hyper read.
    pub fn of<B>(request: &hyper::Request<B>) -> Request {
        Request {
            method: request.method().clone(),
            path: request.uri().path().to_string(),
            query: request.uri().query().map(str::to_string),
        }
    }

    /// Whether this is a probe (`/-/ready`, `/-/healthy`, `/-/answering`),
    /// which is served from a slot kept for probes.
    pub fn is_probe(&self) -> bool {
        (self.method == Method::GET || self.method == Method::HEAD)
            && matches!(
                self.path.as_str(),
                "/-/ready" | "/-/healthy" | "/-/answering"
            )
    }
}

/// The answer to a request that was read and holds a serving slot.
pub(super) async fn answer(
    request: &Request,
    shared: &Arc<Shared>,
    status: &StatusCache,
    shutdown: &CancellationToken,
) -> Answer {
    let (get, head) = (
        request.method == Method::GET,
        request.method == Method::HEAD,
    );
    if get {
        if let Some(format) = profile::Format::for_path(&request.path) {
            return profile::serve(format, request.query.as_deref(), shared, shutdown).await;
        }
    }
    if !get && !head {
        return Answer::plain(405, "GET only\n").with_header("Allow", "GET, HEAD".into());
    }
    if request.path == "/status" {
        refresh_records(shared).await;
        return status.answer(shared).await;
    }
    if request.path == "/metrics" {
        // Who wrote the keys out and until when, for the until alerts:
        // read when asked, bounded, never on the way to HAProxy.
        if let Some(served) = refresh_records(shared).await {
            let filled = shared.records.fill(&served);
            shared
                .metrics
                .observe_out_keys(filled.as_ref().unwrap_or(&served));
        }
    }
    route(&request.path, shared)
}

/// Reads the writer's records if the state served has keys they may
/// describe and the cache does not ([`crate::agent::records`]); the state
/// served.
async fn refresh_records(shared: &Shared) -> Option<Arc<crate::decision::served::ServedState>> {
    let served = shared.served.lock().unwrap().clone()?;
    shared.records.refresh(&served).await;
    Some(served)
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
