//! Which agent-send lines (one per enrolled server) HAProxy asked about, when,
//! and what it was answered: proof that HAProxy is still asking, without one
//! metric series per server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::model::value::AnswerKind;

/// A row counts in `gitlab_haproxy_agent_rows_seen` if asked within this
/// window: 60 s, thirty times the default agent-inter of 2 s.
pub const SEEN_WINDOW: Duration = Duration::from_secs(60);

/// Rows not asked about for this long are forgotten: 10 minutes.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// At most this many rows are remembered (about ten times the fleet's
/// largest load balancer); lines beyond it are answered but not recorded.
pub const MAX_ROWS: usize = 16_384;

/// One remembered agent-send line.
#[derive(Debug, Clone)]
pub struct SeenRow {
    /// Monotonic time of the last ask.
    pub last_asked: Instant,
    /// Wall-clock time of the last ask.
    pub last_asked_wall: SystemTime,
    /// The reply sent, or `None` when none was (invalid value, unsynced).
    pub answer: Option<String>,
    /// The answer kind.
    pub kind: AnswerKind,
}

/// The rows seen, behind one short-held lock.
#[derive(Debug, Default)]
pub struct Seen {
    rows: Mutex<HashMap<Box<str>, SeenRow>>,
}

impl Seen {
    /// Records that `line` (identities joined by single spaces) was asked
    /// about now and answered `answer`.
    pub fn record(&self, line: &str, kind: AnswerKind, answer: Option<&str>) {
        let now = Instant::now();
        let mut rows = self.rows.lock().unwrap();
        if let Some(row) = rows.get_mut(line) {
            row.last_asked = now;
            row.last_asked_wall = SystemTime::now();
            row.kind = kind;
            if row.answer.as_deref() != answer {
                row.answer = answer.map(str::to_string);
            }
            return;
        }
        if rows.len() >= MAX_ROWS {
            rows.retain(|_, r| now.duration_since(r.last_asked) < FORGET_AFTER);
            if rows.len() >= MAX_ROWS {
                return;
            }
        }
        rows.insert(
            line.into(),
            SeenRow {
                last_asked: now,
                last_asked_wall: SystemTime::now(),
                answer: answer.map(str::to_string),
                kind,
            },
        );
    }

    /// Rows asked about within [`SEEN_WINDOW`]; forgets rows older than
    /// [`FORGET_AFTER`].
    pub fn count_recent(&self) -> usize {
        let now = Instant::now();
        let mut rows = self.rows.lock().unwrap();
        rows.retain(|_, r| now.duration_since(r.last_asked) < FORGET_AFTER);
        rows.values()
            .filter(|r| now.duration_since(r.last_asked) < SEEN_WINDOW)
            .count()
    }

    /// A copy of every remembered row, sorted by line.
    pub fn rows(&self) -> Vec<(String, SeenRow)> {
        let rows = self.rows.lock().unwrap();
        let mut out: Vec<_> = rows
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_updates_rows() {
        let seen = Seen::default();
        seen.record("web/web-01 canary", AnswerKind::Ready, Some("ready 100%"));
        seen.record("web/web-02", AnswerKind::Drain, Some("drain 100%"));
        seen.record("web/web-01 canary", AnswerKind::Invalid, None);
        assert_eq!(seen.count_recent(), 2);
        let rows = seen.rows();
        assert_eq!(rows[0].0, "web/web-01 canary");
        assert_eq!(rows[0].1.answer, None);
        assert_eq!(rows[0].1.kind, AnswerKind::Invalid);
    }
}
