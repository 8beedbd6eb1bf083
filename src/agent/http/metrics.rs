//! The HTTP port's metric families.

use prometheus::{IntCounter, IntCounterVec};

use crate::agent::metrics::families::Families;

/// The HTTP port's metric families.
pub struct HttpMetrics {
    /// `gitlab_haproxy_agent_profiles_total{outcome}`: requests for a CPU
    /// profile or flame graph on `/debug/pprof/`, by outcome: `ok`, `busy`
    /// (another profile was running), `bad_request` (bad `seconds`),
    /// `failed` (the profiler could not start or report).
    pub profiles: IntCounterVec,
    /// `gitlab_haproxy_agent_http_idle_closed_total`: HTTP connections closed
    /// because no complete request came within
    /// [`super::REQUEST_READ_TIMEOUT`].
    pub idle_closed: IntCounter,
    /// `gitlab_haproxy_agent_http_bad_requests_total`: HTTP requests refused
    /// as malformed, too large or carrying a body (answered 400, 413 or 431
    /// and closed).
    pub bad_requests: IntCounter,
    /// `gitlab_haproxy_agent_http_write_timeouts_total`: HTTP answers cut
    /// off because the client had not read them within
    /// [`super::WRITE_TIMEOUT`].
    pub write_timeouts: IntCounter,
    /// `gitlab_haproxy_agent_http_busy_total`: HTTP requests answered 503
    /// because every serving slot stayed taken for
    /// [`super::SLOT_WAIT`].
    pub busy: IntCounter,
    /// `gitlab_haproxy_agent_http_forbidden_total`: requests for `/status`
    /// or `/debug/pprof/` answered 403 because the client was not at
    /// 127.0.0.1 or ::1 ([`super::DebugAccess::Loopback`]): a mesh peer, a
    /// node-local proxy or a remote client.
    pub forbidden: IntCounter,
}

impl HttpMetrics {
    /// Declares the families in `f`.
    pub fn new(f: &Families) -> HttpMetrics {
        let profiles = f.int_counter_vec(
            "profiles_total",
            "CPU profile and flame graph requests on /debug/pprof/, by outcome.",
            &["outcome"],
            &["ok", "busy", "bad_request", "failed"],
        );
        let idle_closed = f.int_counter(
            "http_idle_closed_total",
            "HTTP connections closed because no complete request came within the request timeout.",
        );
        let bad_requests = f.int_counter(
            "http_bad_requests_total",
            "HTTP requests refused as malformed, too large or carrying a body.",
        );
        let write_timeouts = f.int_counter(
            "http_write_timeouts_total",
            "HTTP answers cut off because the client did not read them within the write timeout.",
        );
        let busy = f.int_counter(
            "http_busy_total",
            "HTTP requests answered 503 because every serving slot stayed taken for 2 s.",
        );
        let forbidden = f.int_counter(
            "http_forbidden_total",
            "Requests for /status or /debug/pprof/ answered 403: the client was not at 127.0.0.1 or ::1.",
        );
        HttpMetrics {
            profiles,
            idle_closed,
            bad_requests,
            write_timeouts,
            busy,
            forbidden,
        }
    }
}
