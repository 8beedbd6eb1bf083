//! The agent's Prometheus metrics: one registry, created once and shared by
//! the watcher, the responder and the HTTP endpoint. Each owner declares its
//! families ([`families::Families`]): the responder's in
//! [`crate::agent::responder::metrics`], the rows seen's in
//! [`crate::agent::seen`], the HTTP port's in [`crate::agent::http::metrics`], the watcher's and the served
//! state's here. Names and units are listed in docs/metrics.md.

pub mod families;

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry, TextEncoder,
};

use crate::agent::http::metrics::HttpMetrics;
use crate::agent::responder::metrics::CheckMetrics;
use crate::agent::seen::{SeenMetrics, SeenSummary};
use crate::consul::ConsulError;
use crate::decision::served::ServedState;
use crate::decision::stale::HoldReason;
use crate::decision::Refused;
use families::Families;

/// Outcomes of one Consul request, the values of the `outcome` label on
/// `gitlab_haproxy_agent_consul_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsulOutcome {
    /// A 200 or 404 whose index moved: a new snapshot was applied.
    Ok,
    /// A 200 or 404 with the same index: the blocking query timed out with no
    /// change.
    NotModified,
    /// A 4xx status (403 for a bad token, 400 for a bad request).
    Http4xx,
    /// A 5xx status (500 `No cluster leader` during elections).
    Http5xx,
    /// The TCP connection failed or was reset, or the TLS handshake failed
    /// (a certificate that did not verify, ours refused).
    ConnectError,
    /// No answer within the wait plus Consul's jitter plus a margin.
    Timeout,
    /// An answer that could not be used: no or bad `X-Consul-Index`,
    /// malformed JSON, bad base64, a 200 with no keys.
    DecodeError,
}

impl From<&ConsulError> for ConsulOutcome {
    /// The outcome a failed request is counted as: transport and token
    /// failures as `connect_error`, statuses by class, unusable answers as
    /// `decode_error`.
    fn from(e: &ConsulError) -> ConsulOutcome {
        match e {
            ConsulError::Connect { .. } | ConsulError::Tls { .. } | ConsulError::Token { .. } => {
                ConsulOutcome::ConnectError
            }
            ConsulError::Timeout { .. } => ConsulOutcome::Timeout,
            ConsulError::Status { status, .. } if status.is_server_error() => {
                ConsulOutcome::Http5xx
            }
            ConsulError::Status { .. } => ConsulOutcome::Http4xx,
            ConsulError::Decode(_) => ConsulOutcome::DecodeError,
        }
    }
}

impl ConsulOutcome {
    /// Every outcome, so each label value exists at 0 from start-up.
    pub const ALL: [ConsulOutcome; 7] = [
        ConsulOutcome::Ok,
        ConsulOutcome::NotModified,
        ConsulOutcome::Http4xx,
        ConsulOutcome::Http5xx,
        ConsulOutcome::ConnectError,
        ConsulOutcome::Timeout,
        ConsulOutcome::DecodeError,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsulOutcome::Ok => "ok",
            ConsulOutcome::NotModified => "not_modified",
            ConsulOutcome::Http4xx => "http_4xx",
            ConsulOutcome::Http5xx => "http_5xx",
            ConsulOutcome::ConnectError => "connect_error",
            ConsulOutcome::Timeout => "timeout",
            ConsulOutcome::DecodeError => "decode_error",
        }
    }
}

/// Every metric the agent exports. Cheap to update from any task: counters
/// and gauges are atomics.
pub struct Metrics {
    registry: Registry,
    /// `gitlab_haproxy_agent_synced`: 1 once the first snapshot is applied.
    pub synced: IntGauge,
    /// `gitlab_haproxy_agent_last_sync_timestamp_seconds`: Unix time of the
    /// last Consul answer that was applied or confirmed the copy current.
    pub last_sync_timestamp: Gauge,
    /// `gitlab_haproxy_agent_last_sync_age_seconds`: seconds since then,
    /// computed at scrape time.
    last_sync_age: Gauge,
    consul_requests: IntCounterVec,
    /// `gitlab_haproxy_agent_consul_request_duration_seconds`: how long each
    /// Consul request took, blocking queries included.
    pub consul_request_duration: Histogram,
    /// `gitlab_haproxy_agent_consul_index`: index of the copy served.
    pub consul_index: IntGauge,
    /// `gitlab_haproxy_agent_consul_index_resets_total`: times the index went
    /// backwards and the watcher re-read from 0.
    pub consul_index_resets: IntCounter,
    consul_answers_refused: IntCounterVec,
    /// `gitlab_haproxy_agent_keys`: keys held below the prefix.
    pub keys: IntGauge,
    /// `gitlab_haproxy_agent_invalid_keys`: keys held with an invalid value.
    pub invalid_keys: IntGauge,
    /// `gitlab_haproxy_agent_invalid_held_keys`: keys whose current value is
    /// invalid, answered with their last valid value.
    pub invalid_held_keys: IntGauge,
    /// `gitlab_haproxy_agent_rollback_held_keys`: keys answered with their
    /// value from before Consul's index went backwards, until written again
    /// or released (`state release-rollback`).
    pub rollback_held_keys: IntGauge,
    /// `gitlab_haproxy_agent_state_changes_total`: key changes applied
    /// (added, changed or removed).
    pub state_changes: IntCounter,
    /// `gitlab_haproxy_agent_stale_answers_held_total{reason}`: stale-mode
    /// answers held, not applied, until a default read confirmed the copy.
    stale_answers_held: IntCounterVec,
    /// `gitlab_haproxy_agent_consul_last_contact_seconds`: the last
    /// answer's `X-Consul-LastContact` (0 from the leader).
    pub consul_last_contact: Gauge,
    /// `gitlab_haproxy_agent_consul_unconfirmed_seconds`: seconds since the
    /// state served was last confirmed to be Consul's latest (by an answer
    /// or an index check), counted from the answering server's last
    /// contact with the leader; -1 before the first confirmation.
    pub consul_unconfirmed: Gauge,
    /// `gitlab_haproxy_agent_consul_route`: the Consul address reads go
    /// through: 0 for `--consul-addr`, n for the n-th
    /// `--consul-fallback-addr` ([`crate::agent::route`]).
    pub consul_route: IntGauge,
    /// `gitlab_haproxy_agent_consul_route_switches_total`: times reads moved
    /// to another Consul address.
    pub consul_route_switches: IntCounter,
    /// `gitlab_haproxy_agent_consul_fallback_refused{reason}`: the
    /// `--consul-fallback-addr` refused by their proof now, by reason:
    /// `other_datacenter`, `other_store`, `denied`
    /// ([`crate::agent::route::judge`]).
    pub consul_fallback_refused: IntGaugeVec,
    /// `gitlab_haproxy_agent_consul_fallbacks_found`: the fallback
    /// addresses found from Consul's raft peers in the list now
    /// ([`crate::agent::discovery`]); 0 with a `--consul-fallback-addr`
    /// list or `none`.
    pub consul_fallbacks_found: IntGauge,
    /// `gitlab_haproxy_agent_consul_fallback_discovery_failures_total{reason}`:
    /// reads of the servers that gave nothing (`request`: no answer or an
    /// error), and peer entries that are not `ip:port` (`bad_peer`, each).
    pub consul_fallback_discovery_failures: IntCounterVec,
    /// `gitlab_haproxy_agent_index_checks_total{result}`: index checks made
    /// while a blocking read was parked, by result: `current`, `behind`
    /// (the read was re-issued), `failed`, `no_leader`, `too_old`.
    index_checks: IntCounterVec,
    /// `gitlab_haproxy_agent_generation_lost_total`: answers whose write
    /// generation did not descend from the one served (a restored snapshot).
    pub generation_lost: IntCounter,
    /// `gitlab_haproxy_agent_consul_tombstones_reaped_total`: times the
    /// index went back with nothing moved (a reaped tombstone, not a loss).
    pub tombstones_reaped: IntCounter,
    /// `gitlab_haproxy_agent_held_keys{cause}`: keys answered with another
    /// state than Consul's, by cause (`invalid_value`, `rolled_back`,
    /// `hidden`).
    pub held_keys: IntGaugeVec,
    /// `gitlab_haproxy_agent_held_key{key,cause,state}`: 1 per held key,
    /// the first [`MAX_HELD_KEYS_EXPORTED`] by key; `state` is the state
    /// answered (`none`: held absent).
    pub held_key: IntGaugeVec,
    /// `gitlab_haproxy_agent_key_reads_total{result}`: direct reads of keys
    /// an answer lacked, by result (`present`, `absent`, `forbidden`).
    pub key_reads: IntCounterVec,
    /// `gitlab_haproxy_agent_filtered_answers_total`: answers Consul marked
    /// as filtered by the token's ACL (`X-Consul-Results-Filtered-By-ACLs`).
    pub filtered_answers: IntCounter,
    /// `gitlab_haproxy_agent_store_changes_total`: answers whose store id
    /// (`~store-id`) vanished or changed: Consul lost its data.
    pub store_changes: IntCounter,
    /// `gitlab_haproxy_agent_store_id_present`: 1 when the served state has
    /// a store id (a store rebuilt at a higher index is then recognised).
    pub store_id_present: IntGauge,
    /// `gitlab_haproxy_agent_key_since_timestamp_seconds{key,state}`: per
    /// key served drain, maint or a weight, Unix time since when (the
    /// writer's record, else when this agent first served it); at most
    /// [`MAX_OUT_KEYS`] keys, oldest first.
    key_since: GaugeVec,
    /// `gitlab_haproxy_agent_key_until_timestamp_seconds{key}`: the
    /// `--until` of those keys whose record has one.
    key_until: GaugeVec,
    /// `gitlab_haproxy_agent_out_keys_over_cap`: keys left out of the two
    /// above beyond [`MAX_OUT_KEYS`].
    out_keys_over_cap: IntGauge,
    /// `gitlab_haproxy_agent_invalid_meta_keys`: writer records (`~meta/`)
    /// in the last answer that could not be used.
    invalid_meta_keys: IntGauge,
    /// `gitlab_haproxy_agent_state_file_loaded`: 1 when the agent started
    /// from its state file, 0 when it had none or could not use it.
    pub state_file_loaded: IntGauge,
    /// `gitlab_haproxy_agent_state_file_writes_total{result}`: writes of
    /// the state file, `ok` or `error`.
    pub state_file_writes: IntCounterVec,
    /// `gitlab_haproxy_agent_state_file_behind`: 1 while the state served is
    /// not in the state file (its write failed; retried every 5 s), 0
    /// otherwise. A restart then would start from an older state.
    pub state_file_behind: IntGauge,
    /// `gitlab_haproxy_agent_state_file_behind_seconds`: how long the state
    /// file has not held the state served (a write failing, or stalled on
    /// its disk), in seconds; 0 when it holds it.
    pub state_file_behind_seconds: Gauge,
    /// `gitlab_haproxy_agent_runtime_copy_writes_total{result}`: writes of
    /// the runtime copy (`--runtime-dir`), `ok` or `error`.
    pub runtime_copy_writes: IntCounterVec,
    /// `gitlab_haproxy_agent_log_lines_dropped_total`: log lines dropped
    /// because the log sink (stderr, the journal) was not reading and the
    /// queue (`--log-buffer-lines`) was full.
    pub log_lines_dropped: IntCounter,
    /// `gitlab_haproxy_agent_haproxy_old_workers`: HAProxy workers left by
    /// a reload and still running (they keep their sessions until those
    /// close or `hard-stop-after`), counted from /proc under the master of
    /// `--haproxy-pid-file`; -1 when that cannot be told.
    pub haproxy_old_workers: IntGauge,
    /// The agent-check responder's families.
    pub checks: CheckMetrics,
    /// The families of the rows seen, set at scrape time.
    pub seen: SeenMetrics,
    /// The HTTP port's families.
    pub http: HttpMetrics,
}

/// At most this many held keys get a `gitlab_haproxy_agent_held_key`
/// series: 100, so a rollback that holds thousands of keys stays cheap to
/// scrape; `gitlab_haproxy_agent_held_keys{cause}` counts them all.
pub const MAX_HELD_KEYS_EXPORTED: usize = 100;

/// At most this many keys served drain, maint or a weight get their own
/// `key_since_timestamp_seconds` series (the oldest; each agent exports
/// them): 500. The rest are counted in `out_keys_over_cap`.
pub const MAX_OUT_KEYS: usize = 500;

impl Metrics {
    /// Creates and registers every metric, label values pre-created at 0,
    /// plus the standard `process_*` metrics (Linux only).
    ///
    /// # Panics
    ///
    /// Only on a programming error (a duplicate or malformed metric name).
    pub fn new() -> Self {
        let registry = Registry::new();
        let f = Families(&registry);
        f.int_gauge_vec("build_info", "Build of the agent; always 1.", &["version"])
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("metric names are unique");
        let synced = f.int_gauge("synced", "1 once the first Consul answer is applied, 0 before (also while answering from the state file).");
        let last_sync_timestamp = f.gauge(
            "last_sync_timestamp_seconds",
            "Unix time of the last successful Consul sync (new snapshot or confirmed current).",
        );
        let last_sync_age = f.gauge(
            "last_sync_age_seconds",
            "Seconds since the last successful Consul sync; since start-up before the first.",
        );
        let consul_requests = f.int_counter_vec(
            "consul_requests_total",
            "Consul KV requests by outcome.",
            &["outcome"],
            &ConsulOutcome::ALL.map(ConsulOutcome::as_str),
        );
        let consul_request_duration = f.histogram(
            "consul_request_duration_seconds",
            "Duration of Consul KV requests, blocking queries included.",
            vec![
                0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            ],
        );
        let consul_index = f.int_gauge(
            "consul_index",
            "X-Consul-Index of the snapshot being served.",
        );
        let consul_index_resets = f.int_counter(
            "consul_index_resets_total",
            "Times X-Consul-Index went backwards and the watcher re-read from 0.",
        );
        let consul_answers_refused = f.int_counter_vec("consul_answers_refused_total", "Consul answers not applied because they may hide a write, by reason; one fresh read is applied instead.", &["reason"], &Refused::ALL.map(Refused::as_str));
        let keys = f.int_gauge("keys", "Keys held below the prefix.");
        let invalid_keys = f.int_gauge(
            "invalid_keys",
            "Keys whose value in Consul is invalid (held at their last valid state, or skipped).",
        );
        let invalid_held_keys = f.int_gauge(
            "invalid_held_keys",
            "Keys whose current value is invalid, answered with their last valid value.",
        );
        let rollback_held_keys = f.int_gauge("rollback_held_keys", "Keys answered with their state from before Consul lost its data (drain or maint that would be undone, or a ready or weight that appeared), until written again or released.");
        let state_changes = f.int_counter(
            "state_changes_total",
            "Key changes applied from Consul (added, changed or removed keys).",
        );
        let stale_answers_held = f.int_counter_vec("stale_answers_held_total", "Stale-mode Consul answers held until a default-consistency read confirmed the copy, by reason.", &["reason"], &HoldReason::ALL.map(HoldReason::as_str));
        let consul_last_contact = f.gauge("consul_last_contact_seconds", "X-Consul-LastContact of the last Consul answer: how long its server had not heard from the leader.");
        let consul_unconfirmed = f.gauge(
            "consul_unconfirmed_seconds",
            "Seconds since the state served was last confirmed to be Consul's latest (by an answer or an index check); -1 before the first.",
        );
        consul_unconfirmed.set(-1.0);
        let consul_route = f.int_gauge(
            "consul_route",
            "The Consul address reads go through: 0 for --consul-addr, n for the n-th --consul-fallback-addr.",
        );
        let consul_route_switches = f.int_counter(
            "consul_route_switches_total",
            "Times reads moved to another Consul address (an index check could not confirm, or a request failed).",
        );
        let consul_fallback_refused = f.int_gauge_vec(
            "consul_fallback_refused",
            "--consul-fallback-addr refused now by their proof of being the same Consul, by reason: other_datacenter, other_store, denied (the token refused).",
            &["reason"],
        );
        for reason in crate::agent::route::Proof::REFUSED {
            consul_fallback_refused
                .with_label_values(&[reason.as_str()])
                .set(0);
        }
        let consul_fallbacks_found = f.int_gauge(
            "consul_fallbacks_found",
            "Fallback addresses found from Consul's raft peers (/v1/status/peers) in the list now; 0 with a --consul-fallback-addr list or none.",
        );
        let consul_fallback_discovery_failures = f.int_counter_vec(
            "consul_fallback_discovery_failures_total",
            "Reads of the Consul servers for fallbacks that gave nothing (request), and peer entries that are not ip:port (bad_peer).",
            &["reason"],
            &["request", "bad_peer"],
        );
        let index_checks = f.int_counter_vec(
            "index_checks_total",
            "Index checks made while a blocking read was parked, by result (current, behind, below, failed, no_leader, too_old).",
            &["result"],
            &["current", "behind", "below", "failed", "no_leader", "too_old"],
        );
        let generation_lost = f.int_counter(
            "generation_lost_total",
            "Consul answers whose write generation did not descend from the one served (a restored snapshot): drain and maint that would be undone are held.",
        );
        let tombstones_reaped = f.int_counter(
            "consul_tombstones_reaped_total",
            "Times the prefix index went back with nothing moved: a reaped tombstone, not a loss.",
        );
        let held_keys = f.int_gauge_vec("held_keys", "Keys answered with another state than Consul's, by cause: invalid_value, rolled_back, hidden.", &["cause"]);
        let held_key = f.int_gauge_vec(
            "held_key",
            "1 per key answered with another state than Consul's: its cause and the state \
                 answered (none: held absent); at most 100 keys, the rest counted in held_keys.",
            &["key", "cause", "state"],
        );
        let key_reads = f.int_counter_vec("key_reads_total", "Direct reads of keys a Consul answer lacked, by result: present, absent (a delete), forbidden (hidden from the token).", &["result"], &["present", "absent", "forbidden"]);
        let filtered_answers = f.int_counter("filtered_answers_total", "Consul answers marked as filtered by the token's ACL (X-Consul-Results-Filtered-By-ACLs).");
        let store_changes = f.int_counter(
            "store_changes_total",
            "Consul answers whose store id vanished or changed: the store lost its data.",
        );
        let store_id_present = f.int_gauge(
            "store_id_present",
            "1 when the served state has a store id (~store-id), 0 when not.",
        );
        let key_since = f.gauge_vec(
            "key_since_timestamp_seconds",
            "Per key served drain, maint or a weight: Unix time since when (the writer's record, \
                 else when this agent first served it).",
            &["key", "state"],
        );
        let key_until = f.gauge_vec(
            "key_until_timestamp_seconds",
            "Per key served drain, maint or a weight: the Unix time its writer's record gives as \
                 until (a reminder, never an automatic undo).",
            &["key"],
        );
        let out_keys_over_cap = f.int_gauge(
            "out_keys_over_cap",
            "Keys served drain, maint or a weight left out of key_since_timestamp_seconds beyond \
             the cap (the newest).",
        );
        let invalid_meta_keys = f.int_gauge(
            "invalid_meta_keys",
            "Writer records (~meta/) in the last applied answer that could not be used (malformed \
             or below no valid key); their keys show as written outside the writer.",
        );
        let state_file_loaded = f.int_gauge(
            "state_file_loaded",
            "1 when the agent started from its state file, 0 when it had none or could not use it.",
        );
        let state_file_writes = f.int_counter_vec(
            "state_file_writes_total",
            "Writes of the state file, by result: ok, error.",
            &["result"],
            &["ok", "error"],
        );
        let state_file_behind = f.int_gauge("state_file_behind", "1 while the state served is not in the state file (its write failed and is retried every 5 s).");
        let state_file_behind_seconds = f.gauge(
            "state_file_behind_seconds",
            "Seconds the state file has not held the state served (its write failing or stalled \
             on the disk); 0 when it holds it.",
        );
        let runtime_copy_writes = f.int_counter_vec(
            "runtime_copy_writes_total",
            "Writes of the runtime copy of the state file (--runtime-dir), by result: ok, error.",
            &["result"],
            &["ok", "error"],
        );
        let log_lines_dropped = f.int_counter(
            "log_lines_dropped_total",
            "Log lines dropped because the log sink (stderr, the journal) was not reading and \
             --log-buffer-lines were queued.",
        );
        let haproxy_old_workers = f.int_gauge(
            "haproxy_old_workers",
            "HAProxy workers left by a reload and still running (holding sessions the exporter \
             does not count), under the master of --haproxy-pid-file; -1 when unknown.",
        );
        haproxy_old_workers.set(-1);
        let held_keys_family = held_keys;
        for c in crate::decision::HoldCause::ALL {
            held_keys_family.with_label_values(&[c.as_str()]);
        }
        Metrics {
            checks: CheckMetrics::new(&f),
            seen: SeenMetrics::new(&f),
            http: HttpMetrics::new(&f),
            registry,
            synced,
            last_sync_timestamp,
            last_sync_age,
            consul_requests,
            consul_request_duration,
            consul_index,
            consul_index_resets,
            consul_answers_refused,
            keys,
            invalid_keys,
            invalid_held_keys,
            rollback_held_keys,
            state_changes,
            stale_answers_held,
            consul_last_contact,
            consul_unconfirmed,
            consul_route,
            consul_route_switches,
            consul_fallback_refused,
            consul_fallbacks_found,
            consul_fallback_discovery_failures,
            index_checks,
            generation_lost,
            tombstones_reaped,
            held_keys: held_keys_family,
            held_key,
            key_reads,
            filtered_answers,
            store_changes,
            store_id_present,
            key_since,
            key_until,
            out_keys_over_cap,
            invalid_meta_keys,
            state_file_loaded,
            state_file_writes,
            state_file_behind,
            state_file_behind_seconds,
            runtime_copy_writes,
            log_lines_dropped,
            haproxy_old_workers,
        }
    }

    /// Counts one stale answer held for `reason`.
    pub fn stale_held(&self, reason: HoldReason) {
        self.stale_answers_held
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Counts one Consul request.
    pub fn consul_request(&self, outcome: ConsulOutcome) {
        self.consul_requests
            .with_label_values(&[outcome.as_str()])
            .inc();
    }

    /// Counts one Consul answer replaced by a fresh read.
    pub fn consul_answer_refused(&self, reason: Refused) {
        self.consul_answers_refused
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Sets the families of the rows seen from `summary` (at scrape time).
    pub fn observe_seen(&self, summary: &SeenSummary) {
        self.seen.observe(summary);
    }

    /// Sets the per-key gauges (`key_since_timestamp_seconds`,
    /// `key_until_timestamp_seconds`, `out_keys_over_cap`) and
    /// `invalid_meta_keys` from the state served: timestamps, not ages, so
    /// they change only when the state does.
    pub fn observe_out_keys(&self, served: &ServedState) {
        let out = served.out_keys();
        self.key_since.reset();
        self.key_until.reset();
        for k in out.iter().take(MAX_OUT_KEYS) {
            self.key_since
                .with_label_values(&[k.key, k.state.kind().as_str()])
                .set(k.since as f64);
            if let Some(until) = k.until {
                self.key_until.with_label_values(&[k.key]).set(until as f64);
            }
        }
        self.out_keys_over_cap
            .set(out.len().saturating_sub(MAX_OUT_KEYS) as i64);
        self.invalid_meta_keys.set(served.invalid_meta as i64);
    }

    /// Counts one index check by its result label.
    pub fn index_check(&self, result: &str) {
        self.index_checks.with_label_values(&[result]).inc();
    }

    /// Renders the registry in the Prometheus text format, version 0.0.4.
    /// `started_at` (Unix seconds) is the age origin before the first sync.
    pub fn render(&self, started_at: f64) -> String {
        let last = self.last_sync_timestamp.get();
        let origin = if last > 0.0 { last } else { started_at };
        self.last_sync_age.set((unix_now() - origin).max(0.0));
        let mut out = Vec::with_capacity(8192);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the Unix epoch, as a float.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::seen::ROWS_ANSWERED_STATES;
    use crate::consul::client::status_error;
    use crate::model::value::AnswerKind;
    use reqwest::StatusCode;

    #[test]
    fn every_label_value_exists_from_start() {
        let m = Metrics::new();
        let text = m.render(unix_now());
        for o in ConsulOutcome::ALL {
            let line = format!(
                "gitlab_haproxy_agent_consul_requests_total{{outcome=\"{}\"}} 0",
                o.as_str()
            );
            assert!(text.contains(&line), "missing {line}");
        }
        for k in AnswerKind::ALL {
            let line = format!(
                "gitlab_haproxy_agent_answers_total{{kind=\"{}\"}} 0",
                k.as_str()
            );
            assert!(text.contains(&line), "missing {line}");
        }
        assert!(text.contains("gitlab_haproxy_agent_build_info{version=\""));
        assert!(text.contains("process_start_time_seconds"));
    }

    #[test]
    fn answer_counters_are_indexed_by_kind() {
        let m = Metrics::new();
        for (i, k) in AnswerKind::ALL.into_iter().enumerate() {
            assert_eq!(k as usize, i);
            m.checks.answers(k).inc_by(i as u64 + 1);
        }
        let text = m.render(unix_now());
        for (i, k) in AnswerKind::ALL.into_iter().enumerate() {
            let line = format!(
                "gitlab_haproxy_agent_answers_total{{kind=\"{}\"}} {}",
                k.as_str(),
                i + 1
            );
            assert!(text.contains(&line), "missing {line}");
        }
    }

    #[test]
    fn rows_answered_and_answered_index_follow_the_summary() {
        let m = Metrics::new();
        let text = m.render(unix_now());
        for k in ROWS_ANSWERED_STATES {
            let line = format!(
                "gitlab_haproxy_agent_rows_answered{{state=\"{}\"}} 0",
                k.as_str()
            );
            assert!(text.contains(&line), "missing {line}");
        }
        assert!(text.contains("gitlab_haproxy_agent_answered_index 0\n"));
        let mut summary = SeenSummary {
            rows: 3,
            lowest_index: Some(42),
            ..SeenSummary::default()
        };
        summary.by_kind[AnswerKind::Drain as usize] = 2;
        summary.by_kind[AnswerKind::Unsynced as usize] = 1;
        m.observe_seen(&summary);
        let text = m.render(unix_now());
        assert!(text.contains("gitlab_haproxy_agent_rows_seen 3\n"));
        assert!(text.contains("gitlab_haproxy_agent_answered_index 42\n"));
        assert!(text.contains("gitlab_haproxy_agent_rows_answered{state=\"drain\"} 2\n"));
        assert!(text.contains("gitlab_haproxy_agent_rows_answered{state=\"unsynced\"} 1\n"));
        assert!(text.contains("gitlab_haproxy_agent_rows_answered{state=\"ready\"} 0\n"));
        assert!(text.contains("gitlab_haproxy_agent_out_rows_not_asked 0\n"));
    }

    #[test]
    fn group_gauges_follow_the_summary_and_drop_groups_gone() {
        use crate::agent::seen::GroupRows;
        let m = Metrics::new();
        let mut zone = GroupRows::default();
        zone.naming[AnswerKind::Drain as usize] = 2;
        zone.naming[AnswerKind::Ready as usize] = 1;
        zone.decided[AnswerKind::Drain as usize] = 2;
        zone.overridden = vec![("web/s2".into(), "web/s2".into(), AnswerKind::Ready, 1)];
        let summary = SeenSummary {
            rows: 3,
            out_not_asked: 1,
            groups: vec![("zone-b".to_string(), zone)],
            groups_over_cap: 4,
            ..SeenSummary::default()
        };
        m.observe_seen(&summary);
        let text = m.render(unix_now());
        for line in [
            "gitlab_haproxy_agent_out_rows_not_asked 1\n",
            "gitlab_haproxy_agent_groups_over_cap 4\n",
            "gitlab_haproxy_agent_group_rows{answer=\"drain\",group=\"zone-b\"} 2\n",
            "gitlab_haproxy_agent_group_rows{answer=\"ready\",group=\"zone-b\"} 1\n",
            "gitlab_haproxy_agent_group_decided_rows{answer=\"drain\",group=\"zone-b\"} 2\n",
            "gitlab_haproxy_agent_group_overridden_rows{answer=\"ready\",group=\"zone-b\",key=\"web/s2\",row=\"web/s2\"} 1\n",
        ] {
            assert!(text.contains(line), "missing {line}");
        }
        assert!(!text.contains("group_decided_rows{answer=\"ready\""));
        m.observe_seen(&SeenSummary::default());
        assert!(!m.render(unix_now()).contains("zone-b"));
    }

    #[test]
    fn out_keys_export_since_and_until_up_to_the_cap() {
        let m = Metrics::new();
        let mut keys = serde_json::Map::new();
        keys.insert(
            "canary".into(),
            serde_json::json!({"value": "drain", "modify_index": 5, "served": "drain",
                "since": 900, "meta": {"by": "alice", "reason": "r", "at": 800,
                "until": 7200, "value": "drain"}}),
        );
        keys.insert(
            "web/from-an-older-file".into(),
            serde_json::json!({"value": "maint", "modify_index": 5, "served": "maint"}),
        );
        keys.insert(
            "zone".into(),
            serde_json::json!({"value": "ready", "modify_index": 5, "served": "ready", "since": 1}),
        );
        for i in 0..MAX_OUT_KEYS {
            keys.insert(
                format!("web/s{i}"),
                serde_json::json!({"value": "maint", "modify_index": 5, "served": "maint",
                    "since": 1000 + i}),
            );
        }
        let file = serde_json::json!({"version": 1, "prefix": "p/", "index": 5,
            "store_id": null, "release_mark": null, "keys": keys});
        let served = ServedState::from_file("p/", &file.to_string()).unwrap();
        m.observe_out_keys(&served);
        let text = m.render(unix_now());
        for line in [
            "gitlab_haproxy_agent_key_since_timestamp_seconds{key=\"canary\",state=\"drain\"} 800\n",
            "gitlab_haproxy_agent_key_until_timestamp_seconds{key=\"canary\"} 7200\n",
            "gitlab_haproxy_agent_key_since_timestamp_seconds{key=\"web/s0\",state=\"maint\"} 1000\n",
            "gitlab_haproxy_agent_out_keys_over_cap 1\n",
        ] {
            assert!(text.contains(line), "missing {line}");
        }
        assert!(!text.contains("key=\"zone\""), "ready keys are not out");
        assert!(
            !text.contains("from-an-older-file"),
            "since unknown: not 1970"
        );
        let last = format!("key=\"web/s{}\"", MAX_OUT_KEYS - 1);
        assert!(!text.contains(&last), "the newest is left out at the cap");
        m.observe_out_keys(&ServedState::default());
        let text = m.render(unix_now());
        assert!(!text.contains("key=\"canary\""), "undrained keys go");
        assert!(text.contains("gitlab_haproxy_agent_out_keys_over_cap 0\n"));
    }

    #[test]
    fn sync_age_counts_from_start_until_first_sync() {
        let m = Metrics::new();
        let text = m.render(unix_now() - 30.0);
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("gitlab_haproxy_agent_last_sync_age_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((29.0..40.0).contains(&age), "age {age}");
    }

    #[test]
    fn status_errors_map_to_outcomes() {
        let e = status_error(StatusCode::INTERNAL_SERVER_ERROR, b"No cluster leader");
        assert_eq!(ConsulOutcome::from(&e), ConsulOutcome::Http5xx);
        assert_eq!(
            e.to_string(),
            "Consul answered 500 Internal Server Error: No cluster leader"
        );
        let e = status_error(StatusCode::FORBIDDEN, b"ACL not found");
        assert_eq!(ConsulOutcome::from(&e), ConsulOutcome::Http4xx);
        assert!(e.is_forbidden());
    }
}
