//! Which agent-send lines (one per enrolled server) HAProxy asked about, when,
//! what it was answered and from which snapshot: proof that HAProxy is still
//! asking, and that it was answered from a given Consul index, without one
//! metric series per server.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use lru::LruCache;

use crate::model::value::AnswerKind;

/// A row counts in `gitlab_haproxy_agent_rows_seen` if asked within this
/// window: 60 s, thirty times the default agent-inter of 2 s.
pub const SEEN_WINDOW: Duration = Duration::from_secs(60);

/// Rows not asked about for this long are forgotten: 10 minutes.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// At most this many rows are remembered: 16,384, about ten times the
/// fleet's largest load balancer. A new line beyond it pushes out the row
/// asked about least recently, in constant time, so a flood of unique
/// lines costs each check no more than a known line does. HAProxy asks
/// about every enrolled row each agent-inter, so its rows stay unless more
/// than this many new lines arrive within one agent-inter.
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
    /// X-Consul-Index of the snapshot the last answer came from; 0 when no
    /// snapshot was applied yet.
    pub index: u64,
}

/// What the rows asked about within [`SEEN_WINDOW`] were last answered,
/// computed at scrape time for the `rows_seen`, `rows_answered` and
/// `answered_index` gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeenSummary {
    /// Rows asked about within the window.
    pub rows: usize,
    /// Those rows by the kind of their last answer, indexed by
    /// `AnswerKind as usize` ([`AnswerKind::ALL`] order).
    pub by_kind: [usize; AnswerKind::ALL.len()],
    /// The lowest snapshot index among their last answers: every one of
    /// them was last answered from a snapshot at or past it. `None` when no
    /// row was asked about within the window.
    pub lowest_index: Option<u64>,
}

/// The rows seen, least recently asked first, behind one short-held lock.
#[derive(Debug)]
pub struct Seen {
    rows: Mutex<LruCache<Box<str>, SeenRow>>,
}

impl Default for Seen {
    fn default() -> Self {
        let cap = NonZeroUsize::new(MAX_ROWS).expect("MAX_ROWS is not zero");
        Seen {
            rows: Mutex::new(LruCache::new(cap)),
        }
    }
}

impl Seen {
    /// Records that `line` (identities joined by single spaces) was asked
    /// about now and answered `answer` from the snapshot at `index` (0:
    /// none yet). Constant time: at [`MAX_ROWS`] the row asked about least
    /// recently is forgotten to make room.
    pub fn record(&self, line: &str, kind: AnswerKind, answer: Option<&str>, index: u64) {
        let now = Instant::now();
        let mut rows = self.rows.lock().unwrap();
        if let Some(row) = rows.get_mut(line) {
            row.last_asked = now;
            row.last_asked_wall = SystemTime::now();
            row.kind = kind;
            row.index = index;
            if row.answer.as_deref() != answer {
                row.answer = answer.map(str::to_string);
            }
            return;
        }
        rows.push(
            line.into(),
            SeenRow {
                last_asked: now,
                last_asked_wall: SystemTime::now(),
                answer: answer.map(str::to_string),
                kind,
                index,
            },
        );
    }

    /// Rows asked about within [`SEEN_WINDOW`]; forgets rows older than
    /// [`FORGET_AFTER`].
    pub fn count_recent(&self) -> usize {
        self.summary().rows
    }

    /// What the rows asked about within [`SEEN_WINDOW`] were last answered;
    /// forgets rows older than [`FORGET_AFTER`]. One pass over the rows,
    /// at scrape time: the agent-check path pays nothing for it.
    pub fn summary(&self) -> SeenSummary {
        let now = Instant::now();
        let mut rows = self.rows.lock().unwrap();
        // Least recently asked first: the rows to forget are at that end.
        while rows
            .peek_lru()
            .is_some_and(|(_, r)| now.duration_since(r.last_asked) >= FORGET_AFTER)
        {
            rows.pop_lru();
        }
        let mut summary = SeenSummary::default();
        for (_, row) in rows.iter() {
            if now.duration_since(row.last_asked) >= SEEN_WINDOW {
                continue;
            }
            summary.rows += 1;
            summary.by_kind[row.kind as usize] += 1;
            summary.lowest_index =
                Some(summary.lowest_index.map_or(row.index, |i| i.min(row.index)));
        }
        summary
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
        seen.record(
            "web/web-01 canary",
            AnswerKind::Ready,
            Some("ready 100%"),
            7,
        );
        seen.record("web/web-02", AnswerKind::Drain, Some("drain 100%"), 9);
        seen.record("web/web-01 canary", AnswerKind::Invalid, None, 12);
        assert_eq!(seen.count_recent(), 2);
        let rows = seen.rows();
        assert_eq!(rows[0].0, "web/web-01 canary");
        assert_eq!(rows[0].1.answer, None);
        assert_eq!(rows[0].1.kind, AnswerKind::Invalid);
        assert_eq!(rows[0].1.index, 12);
    }

    /// Time to record each of `lines` once (the fastest of three rounds).
    fn record_time(seen: &Seen, lines: &[String]) -> std::time::Duration {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                for line in lines {
                    seen.record(line, AnswerKind::Ready, Some("ready 100%"), 1);
                }
                t.elapsed()
            })
            .min()
            .unwrap()
    }

    #[test]
    fn a_flood_of_new_lines_costs_no_more_than_known_ones_when_full() {
        let seen = Seen::default();
        let known: Vec<String> = (0..MAX_ROWS).map(|i| format!("web/web-{i}")).collect();
        for line in &known {
            seen.record(line, AnswerKind::Ready, Some("ready 100%"), 1);
        }
        let asked_again = record_time(&seen, &known[..2_000]);
        let mut n = 0;
        let new_lines: Vec<String> = (0..6_000)
            .map(|_| {
                n += 1;
                format!("flood/f-{n}")
            })
            .collect();
        let flood = (0..3)
            .map(|round| record_time(&seen, &new_lines[round * 2_000..][..2_000]))
            .min()
            .unwrap();
        assert!(
            flood < asked_again * 4 + std::time::Duration::from_millis(5),
            "2,000 new lines took {flood:?}, 2,000 known ones {asked_again:?}"
        );
        // Bounded all the same.
        assert!(seen.rows().len() <= MAX_ROWS);
    }

    #[test]
    fn summary_counts_last_answers_and_the_lowest_index() {
        let seen = Seen::default();
        assert_eq!(seen.summary(), SeenSummary::default());
        seen.record(
            "web/web-01 canary",
            AnswerKind::Ready,
            Some("ready 100%"),
            7,
        );
        seen.record("web/web-02", AnswerKind::Drain, Some("drain 100%"), 9);
        seen.record("web/web-03", AnswerKind::Drain, Some("drain 100%"), 9);
        let summary = seen.summary();
        assert_eq!(summary.rows, 3);
        assert_eq!(summary.lowest_index, Some(7));
        assert_eq!(summary.by_kind[AnswerKind::Drain as usize], 2);
        assert_eq!(summary.by_kind[AnswerKind::Ready as usize], 1);
        // web-01 answered again from a newer snapshot: the lowest moves up,
        // and its last answer is what counts.
        seen.record(
            "web/web-01 canary",
            AnswerKind::Maint,
            Some("maint 100%"),
            11,
        );
        let summary = seen.summary();
        assert_eq!(summary.lowest_index, Some(9));
        assert_eq!(summary.by_kind[AnswerKind::Ready as usize], 0);
        assert_eq!(summary.by_kind[AnswerKind::Maint as usize], 1);
        // A row asked before the first sync holds the lowest at 0.
        seen.record("web/web-04", AnswerKind::Unsynced, None, 0);
        assert_eq!(seen.summary().lowest_index, Some(0));
    }
}
