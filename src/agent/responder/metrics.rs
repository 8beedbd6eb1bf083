//! The agent-check responder's metric families.

use prometheus::{Gauge, Histogram, IntCounter, IntGauge};

use crate::agent::metrics::families::Families;
use crate::model::value::AnswerKind;

/// The agent-check responder's metric families. Cheap to update from the
/// hot path: counters and gauges are atomics.
pub struct CheckMetrics {
    /// One counter per [`AnswerKind`], in [`AnswerKind::ALL`] order, resolved
    /// once so the responder's hot path does no label lookup.
    answers: [IntCounter; AnswerKind::ALL.len()],
    /// `gitlab_haproxy_agent_answer_duration_seconds`: from accept to the
    /// reply written (or the connection closed without one).
    pub answer_duration: Histogram,
    /// `gitlab_haproxy_agent_connections_in_flight`: agent-check connections
    /// being served.
    pub connections_in_flight: IntGauge,
    /// `gitlab_haproxy_agent_connections_refused_total`: agent-check
    /// connections closed unanswered at the `--max-connections` cap: the one
    /// that had waited longest for its line, to make room for a new one.
    pub connections_refused: IntCounter,
    /// `gitlab_haproxy_agent_accept_errors_total`: failed accepts (EMFILE and
    /// the like), after each of which the responder backs off briefly.
    pub accept_errors: IntCounter,
    /// `gitlab_haproxy_agent_last_check_timestamp_seconds`: Unix time of the
    /// last agent-check received.
    pub last_check_timestamp: Gauge,
}

impl CheckMetrics {
    /// Declares the families in `f`.
    pub fn new(f: &Families) -> CheckMetrics {
        let answers = f.int_counter_vec(
            "answers_total",
            "Agent-check answers by kind.",
            &["kind"],
            &[],
        );
        let answers = AnswerKind::ALL.map(|k| answers.with_label_values(&[k.as_str()]));
        let answer_duration = f.histogram(
            "answer_duration_seconds",
            "Time from accepting an agent-check connection to the answer.",
            vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
            ],
        );
        let connections_in_flight = f.int_gauge(
            "connections_in_flight",
            "Agent-check connections being served.",
        );
        let connections_refused = f.int_counter("connections_refused_total", "Agent-check connections closed unanswered at the connection cap: the one that had waited longest for its line, to make room.");
        let accept_errors = f.int_counter(
            "accept_errors_total",
            "Failed accepts on the agent-check listener (e.g. out of file descriptors).",
        );
        let last_check_timestamp = f.gauge(
            "last_check_timestamp_seconds",
            "Unix time of the last agent-check received.",
        );
        CheckMetrics {
            answers,
            answer_duration,
            connections_in_flight,
            connections_refused,
            accept_errors,
            last_check_timestamp,
        }
    }

    /// The counter for one answer kind.
    pub fn answers(&self, kind: AnswerKind) -> &IntCounter {
        &self.answers[kind as usize]
    }
}
