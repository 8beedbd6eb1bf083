//! Which agent-send lines (one per enrolled server) HAProxy asked about, when,
//! what it was answered and from which snapshot: proof that HAProxy is still
//! asking, and that it was answered from a given Consul index, without one
//! metric series per server. It also says which rows answered drain or
//! maint HAProxy has stopped asking about (those servers are back in
//! traffic), and which groups the rows name.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use lru::LruCache;

use crate::agent::metrics::families::Families;
use crate::model::value::AnswerKind;
use prometheus::{IntGauge, IntGaugeVec};

/// A row counts in `gitlab_haproxy_agent_rows_seen` if asked within this
/// window: 60 s, thirty times the default agent-inter of 2 s.
pub const SEEN_WINDOW: Duration = Duration::from_secs(60);

/// Rows not asked about for this long are forgotten: 10 minutes.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// A row last answered drain or maint, not asked for this long, is
/// remembered past [`FORGET_AFTER`] while the current state still answers
/// it drain or maint, so the page about it does not clear on its own: 24 h.
pub const OUT_FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A row is "not asked" when silent for more than three of its observed
/// ask intervals, and never for less than this: 10 s (five default
/// agent-inters of 2 s; a reload restarts HAProxy's checks at a random point
/// of their interval).
pub const NOT_ASKED_FLOOR: Duration = Duration::from_secs(10);

/// How many observed intervals of silence make a row "not asked": 3.
pub const NOT_ASKED_INTERVALS: u32 = 3;

/// The deadline of a row asked only once (no interval observed yet): 30 s.
pub const NOT_ASKED_UNKNOWN: Duration = Duration::from_secs(30);

/// At most this many groups are exported with their own label value: 200.
/// The rest are counted in `gitlab_haproxy_agent_groups_over_cap`, so a
/// misconfigured fleet naming a group per server cannot blow up the series
/// count.
pub const MAX_GROUPS: usize = 200;

/// At most this many (row, deciding key) pairs are exported per group in
/// `gitlab_haproxy_agent_group_overridden_rows`: 10, so that the series stay
/// bounded by the number of groups; the writer names them and counts the
/// rest from `group_rows` and `group_decided_rows`.
pub const MAX_OVERRIDDEN_PER_GROUP: usize = 10;

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
    /// Position on the line of the identity whose key decided the last
    /// answer; `None` when none did (default, unsynced).
    pub decided_by: Option<u16>,
    /// Observed ask interval: a moving average (weight 1/4 to the newest
    /// gap, each gap capped at four intervals) of the gaps between asks;
    /// `None` until asked twice.
    pub interval: Option<Duration>,
}

impl SeenRow {
    /// How long this row may stay silent before it counts as not asked:
    /// [`NOT_ASKED_INTERVALS`] observed intervals, at least
    /// [`NOT_ASKED_FLOOR`]; [`NOT_ASKED_UNKNOWN`] before an interval is known.
    pub fn deadline(&self) -> Duration {
        self.interval.map_or(NOT_ASKED_UNKNOWN, |i| {
            (i * NOT_ASKED_INTERVALS).max(NOT_ASKED_FLOOR)
        })
    }

    /// Whether the last answer took the server out of rotation.
    pub fn answered_out(&self) -> bool {
        matches!(self.kind, AnswerKind::Drain | AnswerKind::Maint)
    }
}

/// Rows naming one group, asked about within [`SEEN_WINDOW`], by the kind of
/// their last answer ([`AnswerKind::ALL`] order).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupRows {
    /// Rows whose line names the group.
    pub naming: [usize; AnswerKind::ALL.len()],
    /// Rows whose last answer the group's key decided.
    pub decided: [usize; AnswerKind::ALL.len()],
    /// Rows naming the group whose last answer another key decided (their
    /// row key, or a group earlier on the line): (the line's first
    /// identity, the deciding identity, the answer it gave, rows), at most
    /// [`MAX_OVERRIDDEN_PER_GROUP`], sorted.
    pub overridden: Vec<(String, String, AnswerKind, usize)>,
}

impl GroupRows {
    fn total(&self) -> usize {
        self.naming.iter().sum()
    }
}

/// What the rows asked about within [`SEEN_WINDOW`] were last answered,
/// computed at scrape time for the `rows_seen`, `rows_answered` and
/// `answered_index` gauges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
    /// Rows last answered drain or maint, still answered so by the current
    /// state, and silent past their deadline ([`SeenRow::deadline`]):
    /// servers HAProxy is likely serving again.
    pub out_not_asked: usize,
    /// Groups (identities without `/`) named by rows asked about within
    /// the window, the [`MAX_GROUPS`] named by the most rows (ties by
    /// name), sorted by name.
    pub groups: Vec<(String, GroupRows)>,
    /// Groups beyond [`MAX_GROUPS`], left out of `groups`.
    pub groups_over_cap: usize,
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
    /// none yet), decided by the identity at position `decided_by`.
    /// Constant time: at [`MAX_ROWS`] the row asked about least recently is
    /// forgotten to make room.
    pub fn record(
        &self,
        line: &str,
        kind: AnswerKind,
        answer: Option<&str>,
        index: u64,
        decided_by: Option<usize>,
    ) {
        self.record_at(Instant::now(), line, kind, answer, index, decided_by);
    }

    fn record_at(
        &self,
        now: Instant,
        line: &str,
        kind: AnswerKind,
        answer: Option<&str>,
        index: u64,
        decided_by: Option<usize>,
    ) {
        let decided_by = decided_by.and_then(|p| u16::try_from(p).ok());
        let mut rows = self.rows.lock().unwrap();
        if let Some(row) = rows.get_mut(line) {
            // A silence is not a rhythm: a gap counts for at most four
            // intervals (the first for at most the floor), so a row asked
            // again after an outage keeps its short deadline, while a longer
            // agent-inter is still followed within a few asks.
            let gap = now.saturating_duration_since(row.last_asked);
            row.interval = Some(match row.interval {
                None => gap.min(NOT_ASKED_FLOOR),
                Some(i) => (i * 3 + gap.min(i * 4)) / 4,
            });
            row.last_asked = now;
            row.last_asked_wall = SystemTime::now();
            row.kind = kind;
            row.index = index;
            row.decided_by = decided_by;
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
                decided_by,
                interval: None,
            },
        );
    }

    /// Rows asked about within [`SEEN_WINDOW`]; forgets rows older than
    /// [`FORGET_AFTER`].
    pub fn count_recent(&self) -> usize {
        self.summary(|_| false).rows
    }

    /// What the rows asked about within [`SEEN_WINDOW`] were last answered,
    /// which groups they name, and how many rows answered drain or maint
    /// are no longer asked about. `still_out(line)` tells whether the
    /// current state still answers `line` drain or maint: a row brought
    /// back (or whose key was cleared) after HAProxy stopped asking is not
    /// counted. Forgets rows older than [`FORGET_AFTER`], except those
    /// still out, kept up to [`OUT_FORGET_AFTER`]. One pass over the rows,
    /// at scrape time: the agent-check path pays nothing for it.
    pub fn summary(&self, still_out: impl Fn(&str) -> bool) -> SeenSummary {
        self.summary_at(Instant::now(), still_out)
    }

    fn summary_at(&self, now: Instant, still_out: impl Fn(&str) -> bool) -> SeenSummary {
        let mut rows = self.rows.lock().unwrap();
        let mut summary = SeenSummary::default();
        let mut forget = Vec::new();
        let mut groups: HashMap<&str, GroupRows> = HashMap::new();
        for (line, row) in rows.iter() {
            let silent = now.saturating_duration_since(row.last_asked);
            // Asked only about rows the deadline has passed for: a lookup
            // per silent out row, not per row.
            let out = row.answered_out() && silent > row.deadline() && still_out(line);
            if silent >= FORGET_AFTER && !(out && silent < OUT_FORGET_AFTER) {
                forget.push(line.clone());
                continue;
            }
            if out {
                summary.out_not_asked += 1;
            }
            if silent >= SEEN_WINDOW {
                continue;
            }
            summary.rows += 1;
            summary.by_kind[row.kind as usize] += 1;
            summary.lowest_index =
                Some(summary.lowest_index.map_or(row.index, |i| i.min(row.index)));
            let identities: Vec<&str> = crate::model::identity::identities(line).collect();
            for (pos, identity) in identities.iter().enumerate() {
                if identity.contains('/') {
                    continue;
                }
                let g = groups.entry(identity).or_default();
                g.naming[row.kind as usize] += 1;
                match row.decided_by.map(usize::from) {
                    Some(d) if d == pos => g.decided[row.kind as usize] += 1,
                    // Decided earlier on the line: name the row and the key.
                    Some(d) if d < pos => {
                        let by = identities[d];
                        let first = identities[0];
                        let full = g.overridden.len() >= MAX_OVERRIDDEN_PER_GROUP;
                        let kind = row.kind;
                        let same = |o: &&mut (String, String, AnswerKind, usize)| {
                            o.0 == first && o.1 == by && o.2 == kind
                        };
                        match g.overridden.iter_mut().find(same) {
                            Some(o) => o.3 += 1,
                            None if !full => {
                                g.overridden
                                    .push((first.to_string(), by.to_string(), kind, 1))
                            }
                            None => {}
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut groups: Vec<(&str, GroupRows)> = groups.into_iter().collect();
        if groups.len() > MAX_GROUPS {
            groups.sort_by(|a, b| b.1.total().cmp(&a.1.total()).then(a.0.cmp(b.0)));
            summary.groups_over_cap = groups.len() - MAX_GROUPS;
            groups.truncate(MAX_GROUPS);
        }
        groups.sort_by(|a, b| a.0.cmp(b.0));
        summary.groups = groups
            .into_iter()
            .map(|(name, mut g)| {
                g.overridden
                    .sort_by(|a, b| (&a.0, &a.1, a.2 as usize).cmp(&(&b.0, &b.1, b.2 as usize)));
                (name.to_string(), g)
            })
            .collect();
        for line in forget {
            rows.pop(&line);
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

/// The `state` label values of `gitlab_haproxy_agent_rows_answered`: every
/// answer kind a seen row can have (a bad request is never a row).
pub const ROWS_ANSWERED_STATES: [AnswerKind; 6] = [
    AnswerKind::Ready,
    AnswerKind::Drain,
    AnswerKind::Maint,
    AnswerKind::Weight,
    AnswerKind::Invalid,
    AnswerKind::Unsynced,
];

/// The metric families of the rows seen, set from a [`SeenSummary`] at
/// scrape time.
pub struct SeenMetrics {
    /// `gitlab_haproxy_agent_rows_seen`: distinct agent-send lines (servers)
    /// seen in the last [`SEEN_WINDOW`].
    rows_seen: IntGauge,
    /// `gitlab_haproxy_agent_rows_answered{state}`: those rows by the kind
    /// of their last answer, in [`ROWS_ANSWERED_STATES`] order.
    rows_answered: [IntGauge; ROWS_ANSWERED_STATES.len()],
    /// `gitlab_haproxy_agent_out_rows_not_asked`: rows last answered drain
    /// or maint, still so in the current state, that HAProxy stopped asking
    /// about ([`SeenRow::deadline`]).
    out_rows_not_asked: IntGauge,
    /// `gitlab_haproxy_agent_group_rows{group,answer}`: rows asked about in
    /// the last 60 s whose line names the group, by their last answer;
    /// only non-zero series.
    group_rows: IntGaugeVec,
    /// `gitlab_haproxy_agent_group_decided_rows{group,answer}`: those of
    /// them whose last answer the group's key decided; only non-zero series.
    group_decided_rows: IntGaugeVec,
    /// `gitlab_haproxy_agent_group_overridden_rows{group,row,key,answer}`: rows
    /// naming the group whose answer another key decided, at most
    /// [`MAX_OVERRIDDEN_PER_GROUP`] per group.
    group_overridden_rows: IntGaugeVec,
    /// `gitlab_haproxy_agent_groups_over_cap`: groups left out of the two
    /// above beyond [`MAX_GROUPS`].
    groups_over_cap: IntGauge,
    /// `gitlab_haproxy_agent_answered_index`: the lowest snapshot index
    /// among the last answers to those rows (0 when there are none).
    answered_index: IntGauge,
}

impl SeenMetrics {
    /// Declares the families in `f`.
    pub fn new(f: &Families) -> SeenMetrics {
        let rows_seen = f.int_gauge(
            "rows_seen",
            "Distinct agent-send lines (enrolled servers) received in the last 60 seconds.",
        );
        let rows_answered_vec = f.int_gauge_vec(
            "rows_answered",
            "Rows received in the last 60 seconds, by the state of their last answer.",
            &["state"],
        );
        let out_rows_not_asked = f.int_gauge("out_rows_not_asked", "Rows last answered drain or maint (and still so in Consul) that HAProxy stopped asking \
             about: silent for more than 3 of their ask intervals, at least 10 s. HAProxy is likely \
             serving those servers again.");
        let group_rows = f.int_gauge_vec(
            "group_rows",
            "Rows received in the last 60 seconds whose agent-send line names the group, by their \
                 last answer (non-zero series only).",
            &["group", "answer"],
        );
        let group_decided_rows = f.int_gauge_vec(
            "group_decided_rows",
            "Rows received in the last 60 seconds whose last answer the group's key decided, by \
                 answer (non-zero series only).",
            &["group", "answer"],
        );
        let group_overridden_rows = f.int_gauge_vec(
            "group_overridden_rows",
            "Rows received in the last 60 seconds whose agent-send line names the group but \
                 whose last answer another key decided: row is the line's first identity, key the \
                 identity that decided, answer what it answered (at most 10 per group).",
            &["group", "row", "key", "answer"],
        );
        let groups_over_cap = f.int_gauge(
            "groups_over_cap",
            "Groups named by rows received in the last 60 seconds but left out of group_rows and \
             group_decided_rows beyond the cap of 200 groups.",
        );
        let answered_index = f.int_gauge(
            "answered_index",
            "Lowest snapshot X-Consul-Index among the last answers to the rows received in the \
             last 60 seconds; 0 when there are none.",
        );
        let rows_answered =
            ROWS_ANSWERED_STATES.map(|k| rows_answered_vec.with_label_values(&[k.as_str()]));
        SeenMetrics {
            rows_seen,
            rows_answered,
            out_rows_not_asked,
            group_rows,
            group_decided_rows,
            group_overridden_rows,
            groups_over_cap,
            answered_index,
        }
    }

    /// Sets `rows_seen`, `rows_answered`, `answered_index`,
    /// `out_rows_not_asked` and the group gauges from the rows seen (at
    /// scrape time).
    pub fn observe(&self, summary: &SeenSummary) {
        self.out_rows_not_asked.set(summary.out_not_asked as i64);
        self.groups_over_cap.set(summary.groups_over_cap as i64);
        self.group_rows.reset();
        self.group_decided_rows.reset();
        self.group_overridden_rows.reset();
        for (group, rows) in &summary.groups {
            for (row, key, answer, n) in &rows.overridden {
                self.group_overridden_rows
                    .with_label_values(&[group, row, key, answer.as_str()])
                    .set(*n as i64);
            }
            for kind in ROWS_ANSWERED_STATES {
                let (naming, decided) = (rows.naming[kind as usize], rows.decided[kind as usize]);
                if naming > 0 {
                    self.group_rows
                        .with_label_values(&[group, kind.as_str()])
                        .set(naming as i64);
                }
                if decided > 0 {
                    self.group_decided_rows
                        .with_label_values(&[group, kind.as_str()])
                        .set(decided as i64);
                }
            }
        }
        self.rows_seen.set(summary.rows as i64);
        for (gauge, kind) in self.rows_answered.iter().zip(ROWS_ANSWERED_STATES) {
            gauge.set(summary.by_kind[kind as usize] as i64);
        }
        let lowest = summary.lowest_index.unwrap_or(0);
        self.answered_index
            .set(i64::try_from(lowest).unwrap_or(i64::MAX));
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
            None,
        );
        seen.record("web/web-02", AnswerKind::Drain, Some("drain 100%"), 9, None);
        seen.record("web/web-01 canary", AnswerKind::Invalid, None, 12, None);
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
                    seen.record(line, AnswerKind::Ready, Some("ready 100%"), 1, None);
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
            seen.record(line, AnswerKind::Ready, Some("ready 100%"), 1, None);
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
        assert_eq!(seen.summary(|_| false), SeenSummary::default());
        seen.record(
            "web/web-01 canary",
            AnswerKind::Ready,
            Some("ready 100%"),
            7,
            None,
        );
        seen.record("web/web-02", AnswerKind::Drain, Some("drain 100%"), 9, None);
        seen.record("web/web-03", AnswerKind::Drain, Some("drain 100%"), 9, None);
        let summary = seen.summary(|_| false);
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
            None,
        );
        let summary = seen.summary(|_| false);
        assert_eq!(summary.lowest_index, Some(9));
        assert_eq!(summary.by_kind[AnswerKind::Ready as usize], 0);
        assert_eq!(summary.by_kind[AnswerKind::Maint as usize], 1);
        // A row asked before the first sync holds the lowest at 0.
        seen.record("web/web-04", AnswerKind::Unsynced, None, 0, None);
        assert_eq!(seen.summary(|_| false).lowest_index, Some(0));
    }

    /// Records `line` as asked at `t0 + secs` seconds.
    fn ask(seen: &Seen, t0: Instant, secs: u64, line: &str, kind: AnswerKind, by: Option<usize>) {
        let at = t0 + Duration::from_secs(secs);
        seen.record_at(at, line, kind, Some(kind.as_str()), 5, by);
    }

    #[test]
    fn an_out_row_is_not_asked_past_three_of_its_intervals() {
        let seen = Seen::default();
        let t0 = Instant::now();
        // Asked every 2 s until 20 s: its deadline is the 10 s floor.
        for s in (0..=20).step_by(2) {
            ask(&seen, t0, s, "api/api-01", AnswerKind::Maint, Some(0));
            ask(&seen, t0, s, "api/api-02", AnswerKind::Ready, None);
        }
        // Asked twice 20 s apart: a first gap counts for at most the floor,
        // so its interval is 10 s and its deadline 30 s.
        for s in [0, 20] {
            ask(
                &seen,
                t0,
                s,
                "web/web-01 zone-b",
                AnswerKind::Drain,
                Some(1),
            );
        }
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(seen.summary_at(at(30), |_| true).out_not_asked, 0);
        // 11 s silent: past api-01's 10 s, not web-01's 30 s; a ready row
        // is never counted.
        assert_eq!(seen.summary_at(at(31), |_| true).out_not_asked, 1);
        assert_eq!(seen.summary_at(at(49), |_| true).out_not_asked, 1);
        assert_eq!(seen.summary_at(at(51), |_| true).out_not_asked, 2);
        // Brought back (the current state answers it ready): not counted.
        let back = seen.summary_at(at(51), |line| line != "api/api-01");
        assert_eq!(back.out_not_asked, 1);
        // Past FORGET_AFTER an out row still out is kept and still counted,
        // the ready one is forgotten.
        let late = seen.summary_at(at(20 + 700), |_| true);
        assert_eq!(late.out_not_asked, 2);
        assert_eq!(seen.rows().len(), 2);
        // Once its key is cleared it is forgotten.
        let cleared = seen.summary_at(at(20 + 701), |line| line != "api/api-01");
        assert_eq!(cleared.out_not_asked, 1);
        assert_eq!(seen.rows().len(), 1);
        // And past OUT_FORGET_AFTER even a row still out goes.
        let day = seen.summary_at(at(20) + OUT_FORGET_AFTER, |_| true);
        assert_eq!(day.out_not_asked, 0);
        assert!(seen.rows().is_empty());
    }

    #[test]
    fn a_row_asked_once_has_the_unknown_deadline() {
        let seen = Seen::default();
        let t0 = Instant::now();
        ask(&seen, t0, 0, "api/api-01", AnswerKind::Drain, Some(0));
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(seen.summary_at(at(30), |_| true).out_not_asked, 0);
        assert_eq!(seen.summary_at(at(31), |_| true).out_not_asked, 1);
    }

    #[test]
    fn the_interval_follows_the_asks() {
        let seen = Seen::default();
        let t0 = Instant::now();
        for s in (0..=40).step_by(2) {
            ask(&seen, t0, s, "web/web-01", AnswerKind::Drain, None);
        }
        // A longer agent-inter: after a few asks the deadline follows it.
        for s in (70..=550).step_by(30) {
            ask(&seen, t0, s, "web/web-01", AnswerKind::Drain, None);
        }
        let row = &seen.rows()[0].1;
        let i = row.interval.unwrap();
        assert!(
            i > Duration::from_secs(25) && i < Duration::from_secs(31),
            "{i:?}"
        );
        assert!(row.deadline() > Duration::from_secs(75));
    }

    #[test]
    fn an_outage_does_not_stretch_the_deadline() {
        let seen = Seen::default();
        let t0 = Instant::now();
        for s in (0..=40).step_by(2) {
            ask(&seen, t0, s, "api/api-01", AnswerKind::Maint, None);
        }
        // Five minutes silent (a wrong agent-port), then asked again.
        for s in (340..=344).step_by(2) {
            ask(&seen, t0, s, "api/api-01", AnswerKind::Maint, None);
        }
        assert_eq!(seen.rows()[0].1.deadline(), NOT_ASKED_FLOOR);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(seen.summary_at(at(355), |_| true).out_not_asked, 1);
    }

    #[test]
    fn groups_count_the_rows_naming_them_and_those_they_decide() {
        let seen = Seen::default();
        let t0 = Instant::now();
        // zone-b decides s1 (drain); s2's row key decides it (ready) though
        // it names zone-b; s3 names canary and zone-b, canary decides maint.
        ask(&seen, t0, 0, "web/s1 zone-b", AnswerKind::Drain, Some(1));
        ask(&seen, t0, 0, "web/s2 zone-b", AnswerKind::Ready, Some(0));
        ask(
            &seen,
            t0,
            0,
            "web/s3 canary zone-b",
            AnswerKind::Maint,
            Some(1),
        );
        let summary = seen.summary_at(t0 + Duration::from_secs(1), |_| true);
        assert_eq!(summary.groups_over_cap, 0);
        let names: Vec<&str> = summary.groups.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["canary", "zone-b"]);
        let zone = &summary.groups[1].1;
        let k = |kind: AnswerKind| kind as usize;
        assert_eq!(zone.naming[k(AnswerKind::Drain)], 1);
        assert_eq!(zone.naming[k(AnswerKind::Ready)], 1);
        assert_eq!(zone.naming[k(AnswerKind::Maint)], 1);
        assert_eq!(zone.decided[k(AnswerKind::Drain)], 1);
        assert_eq!(zone.decided.iter().sum::<usize>(), 1);
        assert_eq!(
            zone.overridden,
            [
                ("web/s2".into(), "web/s2".into(), AnswerKind::Ready, 1),
                ("web/s3".into(), "canary".into(), AnswerKind::Maint, 1)
            ]
        );
        let canary = &summary.groups[0].1;
        assert_eq!(canary.decided[k(AnswerKind::Maint)], 1);
        assert!(canary.overridden.is_empty());
    }

    #[test]
    fn groups_are_capped_and_the_overflow_counted() {
        let seen = Seen::default();
        let t0 = Instant::now();
        for i in 0..MAX_GROUPS + 50 {
            ask(
                &seen,
                t0,
                0,
                &format!("web/s{i} g{i:04}"),
                AnswerKind::Ready,
                None,
            );
        }
        // A group named by many rows is kept whatever its name.
        for i in 0..5 {
            ask(
                &seen,
                t0,
                0,
                &format!("api/a{i} zzz"),
                AnswerKind::Ready,
                None,
            );
        }
        let summary = seen.summary_at(t0, |_| true);
        assert_eq!(summary.groups.len(), MAX_GROUPS);
        assert_eq!(summary.groups_over_cap, 51);
        assert!(summary
            .groups
            .iter()
            .any(|(n, g)| n == "zzz" && g.total() == 5));
    }
}
