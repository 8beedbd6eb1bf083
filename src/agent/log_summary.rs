//! One log line for an answer that changes many keys at once (the first
//! Consul answer, a restore, a delete of the prefix), and for the rest of
//! many direct reads refused while one answer is confirmed (a policy that
//! denies many keys), so the journal stays far below journald's default
//! rate limit (10,000 lines per 30 s) at any fleet size; ordinary changes
//! keep one line per key.

use std::collections::BTreeMap;
use std::fmt;

use tracing::{info, warn};

use crate::decision::served::Change;
use crate::model::value::AdminState;

/// An answer changing more keys than this is summarised in one line
/// (the first Consul answer always is).
pub const PER_KEY_LIMIT: usize = 20;

/// Example keys kept per count.
const EXAMPLES: usize = 3;

/// Example keys are cut to this many characters.
const EXAMPLE_CHARS: usize = 64;

/// Keys counted by a label (a state, a cause), with the first few as
/// examples.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally(BTreeMap<&'static str, (usize, Vec<String>)>);

impl Tally {
    fn add(&mut self, label: &'static str, key: &str) {
        let (count, examples) = self.0.entry(label).or_default();
        *count += 1;
        if examples.len() < EXAMPLES {
            examples.push(cut(key));
        }
    }

    fn add_many(&mut self, label: &'static str, n: usize) {
        self.0.entry(label).or_default().0 += n;
    }

    /// How many keys carry `label`.
    pub fn count(&self, label: &str) -> usize {
        self.0.get(label).map_or(0, |(n, _)| *n)
    }

    /// The example keys kept for `label`.
    pub fn examples(&self, label: &str) -> &[String] {
        self.0.get(label).map_or(&[], |(_, e)| e.as_slice())
    }

    /// Every key counted.
    pub fn total(&self) -> usize {
        self.0.values().map(|(n, _)| n).sum()
    }

    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Tally {
    /// `drain 5000 (web/a, web/b, web/c), maint 12`; `-` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (i, (label, (count, examples))) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{label} {count}")?;
            if !examples.is_empty() {
                write!(f, " ({})", examples.join(", "))?;
            }
        }
        Ok(())
    }
}

/// What one applied answer changed, counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The first Consul answer since the start.
    pub first_sync: bool,
    /// Changes in the answer.
    pub changes: usize,
    /// Keys whose answer changed, by the state now answered (`ready`,
    /// `drain`, `maint`, `weight`, or `none`: absent or skipped).
    pub served: Tally,
    /// Holds begun, by cause (`invalid_value`, `rolled_back`, `hidden`).
    pub held: Tally,
    /// Invalid values written: `held` (the last valid value answered) or
    /// `skipped` (none known).
    pub invalid: Tally,
    /// Holds ended, by cause.
    pub released: Tally,
}

/// The summary of `changes` when they are logged as one line: on the first
/// sync (unless nothing changed) and when there are more than
/// [`PER_KEY_LIMIT`]; `None` when each change gets its own line.
pub fn summarise(changes: &[Change], first_sync: bool) -> Option<Summary> {
    if changes.is_empty() || (!first_sync && changes.len() <= PER_KEY_LIMIT) {
        return None;
    }
    let mut s = Summary {
        first_sync,
        changes: changes.len(),
        ..Summary::default()
    };
    for change in changes {
        match change {
            Change::Served { key, to, .. } => s.served.add(state_label(*to), key),
            Change::Invalid { key, held, .. } => s
                .invalid
                .add(if held.is_some() { "held" } else { "skipped" }, key),
            Change::Held { key, cause, .. } => s.held.add(cause.as_str(), key),
            Change::Released { key, cause } => s.released.add(cause.as_str(), key),
            Change::ReleasedAll { keys } => s.released.add_many("release_rollback", *keys),
        }
    }
    Some(s)
}

impl Summary {
    /// What the line says, before its fields.
    pub fn message(&self) -> String {
        let what = if self.first_sync {
            "first Consul answer applied"
        } else {
            "one Consul answer changed many keys"
        };
        format!(
            "{what}: {} changes in one line (one line per key for answers of up to {PER_KEY_LIMIT})",
            self.changes
        )
    }

    /// Logs the summary as one line: a warning when keys are held or
    /// invalid (as their per-key lines would be), else info.
    pub fn log(&self, index: u64) {
        let message = self.message();
        if self.held.is_empty() && self.invalid.is_empty() {
            info!(
                consul_index = index,
                changes = self.changes,
                served = %self.served,
                released = %self.released,
                "{message}"
            );
        } else {
            warn!(
                consul_index = index,
                changes = self.changes,
                served = %self.served,
                held = %self.held,
                invalid = %self.invalid,
                released = %self.released,
                "{message}"
            );
        }
    }
}

/// The direct reads answered 403 while one answer is confirmed, of keys
/// not held hidden before it (the watcher does not add a key already held
/// hidden, which every answer that lacks it reads again): the first
/// [`PER_KEY_LIMIT`] get a line each, the rest are counted, with a few
/// examples, for one line when the answer is done.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ForbiddenReads {
    count: usize,
    examples: Vec<String>,
}

impl ForbiddenReads {
    /// Counts a read of `key` answered 403; true when it gets its own line.
    pub fn add(&mut self, key: &str) -> bool {
        self.count += 1;
        if self.count <= PER_KEY_LIMIT {
            return true;
        }
        if self.examples.len() < EXAMPLES {
            self.examples.push(cut(key));
        }
        false
    }

    /// Ends the answer's reads: the summary of those not logged one per
    /// line (`None` when every one was), and a count from zero for the next
    /// answer.
    pub fn end(&mut self) -> Option<ForbiddenSummary> {
        let ForbiddenReads { count, examples } = std::mem::take(self);
        (count > PER_KEY_LIMIT).then_some(ForbiddenSummary { count, examples })
    }
}

/// Many reads refused while one answer was confirmed, counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForbiddenSummary {
    /// Every read added, the ones logged one per line included.
    pub count: usize,
    /// The first few keys not logged one per line.
    pub examples: Vec<String>,
}

impl ForbiddenSummary {
    /// What the line says, before its fields.
    pub fn message(&self) -> String {
        format!(
            "the token may no longer read {} keys an answer lacked: answering their last state (held, hidden); the first {PER_KEY_LIMIT} have a line each, the other {} only this one",
            self.count,
            self.count.saturating_sub(PER_KEY_LIMIT),
        )
    }

    /// Logs the summary as one warning, as the lines it replaces.
    pub fn log(&self) {
        warn!(
            forbidden = self.count,
            examples = %self.examples.join(", "),
            "{}",
            self.message()
        );
    }
}

fn state_label(state: Option<AdminState>) -> &'static str {
    match state {
        None => "none",
        Some(AdminState::Ready) => "ready",
        Some(AdminState::Drain) => "drain",
        Some(AdminState::Maint) => "maint",
        Some(AdminState::Weight(_)) => "weight",
    }
}

/// A key as an example: at most [`EXAMPLE_CHARS`] characters.
fn cut(key: &str) -> String {
    match key.char_indices().nth(EXAMPLE_CHARS) {
        Some((at, _)) => format!("{}...", &key[..at]),
        None => key.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::served::HoldCause;

    fn served(key: &str, to: Option<AdminState>) -> Change {
        Change::Served {
            key: key.into(),
            from: None,
            to,
        }
    }

    fn held(key: &str, cause: HoldCause) -> Change {
        Change::Held {
            key: key.into(),
            state: Some(AdminState::Drain),
            cause,
        }
    }

    #[test]
    fn ordinary_changes_get_a_line_each() {
        let changes: Vec<Change> = (0..PER_KEY_LIMIT)
            .map(|i| served(&format!("web/s{i}"), Some(AdminState::Drain)))
            .collect();
        assert_eq!(summarise(&changes, false), None);
        assert_eq!(summarise(&[], false), None);
        // Even the first answer, when it changed nothing.
        assert_eq!(summarise(&[], true), None);
    }

    #[test]
    fn the_first_answer_is_one_line_whatever_its_size() {
        let s = summarise(&[served("canary", Some(AdminState::Drain))], true).unwrap();
        assert!(s.first_sync);
        assert_eq!(s.served.count("drain"), 1);
        assert_eq!(s.served.examples("drain"), ["canary"]);
        assert!(s
            .message()
            .starts_with("first Consul answer applied: 1 changes"));
    }

    #[test]
    fn a_large_answer_is_counted_by_state_served_with_a_few_examples() {
        let mut changes = Vec::new();
        for i in 0..20_000 {
            let to = match i % 5 {
                0 => Some(AdminState::Drain),
                1 => Some(AdminState::Maint),
                2 => Some(AdminState::Ready),
                3 => Some(AdminState::Weight(50)),
                _ => None,
            };
            changes.push(served(&format!("web/s{i:05}"), to));
        }
        let s = summarise(&changes, false).unwrap();
        assert_eq!(s.changes, 20_000);
        for label in ["drain", "maint", "ready", "weight", "none"] {
            assert_eq!(s.served.count(label), 4_000, "{label}");
            assert_eq!(s.served.examples(label).len(), EXAMPLES);
        }
        assert_eq!(
            s.served.examples("drain"),
            ["web/s00000", "web/s00005", "web/s00010"]
        );
        assert!(s.held.is_empty() && s.invalid.is_empty());
        let line = s.served.to_string();
        assert!(
            line.starts_with("drain 4000 (web/s00000, web/s00005, web/s00010), maint 4000"),
            "{line}"
        );
        // The line stays short however many keys changed.
        assert!(line.len() < 400, "{}", line.len());
        assert!(s.message().contains("20000 changes"));
    }

    #[test]
    fn a_delete_of_the_prefix_is_counted_by_hold_cause() {
        let mut changes: Vec<Change> = (0..12_000)
            .map(|i| held(&format!("web/s{i:05}"), HoldCause::RolledBack))
            .collect();
        changes.push(served("web/ready-one", None));
        changes.push(Change::Invalid {
            key: "web/typo".into(),
            error: "drian".parse::<AdminState>().unwrap_err(),
            held: Some(AdminState::Maint),
        });
        changes.push(Change::Invalid {
            key: "web/new-typo".into(),
            error: "drian".parse::<AdminState>().unwrap_err(),
            held: None,
        });
        let s = summarise(&changes, false).unwrap();
        assert_eq!(s.held.count("rolled_back"), 12_000);
        assert_eq!(s.held.total(), 12_000);
        assert_eq!(s.served.count("none"), 1);
        assert_eq!(s.invalid.count("held"), 1);
        assert_eq!(s.invalid.count("skipped"), 1);
        assert_eq!(s.invalid.examples("skipped"), ["web/new-typo"]);
    }

    #[test]
    fn releases_are_counted_and_a_release_of_all_counts_its_keys() {
        let mut changes: Vec<Change> = (0..30)
            .map(|i| Change::Released {
                key: format!("k{i}").into(),
                cause: HoldCause::Hidden,
            })
            .collect();
        changes.push(Change::ReleasedAll { keys: 500 });
        let s = summarise(&changes, false).unwrap();
        assert_eq!(s.released.count("hidden"), 30);
        assert_eq!(s.released.count("release_rollback"), 500);
        assert!(s.released.examples("release_rollback").is_empty());
        assert_eq!(
            s.released.to_string(),
            "hidden 30 (k0, k1, k2), release_rollback 500"
        );
        assert_eq!(Tally::default().to_string(), "-");
    }

    #[test]
    fn long_keys_are_cut_in_examples() {
        let long = "é".repeat(100);
        let s = summarise(&[served(&long, Some(AdminState::Ready))], true).unwrap();
        let example = &s.served.examples("ready")[0];
        assert_eq!(example.chars().count(), EXAMPLE_CHARS + 3);
        assert!(example.ends_with("..."));
    }

    #[test]
    fn many_forbidden_reads_are_one_line_after_the_first_few() {
        let mut reads = ForbiddenReads::default();
        let own_line: Vec<bool> = (0..60)
            .map(|i| reads.add(&format!("web/s{i:02}")))
            .collect();
        assert!(own_line[..PER_KEY_LIMIT].iter().all(|own| *own));
        assert!(own_line[PER_KEY_LIMIT..].iter().all(|own| !*own));
        let s = reads.end().unwrap();
        assert_eq!(s.count, 60);
        assert_eq!(s.examples, ["web/s20", "web/s21", "web/s22"]);
        assert!(
            s.message()
                .starts_with("the token may no longer read 60 keys an answer lacked"),
            "{}",
            s.message()
        );
        assert!(s
            .message()
            .ends_with("the first 20 have a line each, the other 40 only this one"));
        // The next answer counts from zero.
        assert_eq!(reads.end(), None);
        assert!(reads.add("web/s00"));
    }

    #[test]
    fn a_few_forbidden_reads_need_no_summary() {
        let mut reads = ForbiddenReads::default();
        for i in 0..PER_KEY_LIMIT {
            assert!(reads.add(&format!("k{i}")));
        }
        assert_eq!(reads.end(), None);
        assert_eq!(reads, ForbiddenReads::default());
    }

    #[test]
    fn a_summary_of_thousands_of_reads_stays_short() {
        let mut reads = ForbiddenReads::default();
        for i in 0..20_000 {
            reads.add(&format!("{}{i}", "x".repeat(200)));
        }
        let s = reads.end().unwrap();
        assert_eq!(s.count, 20_000);
        assert_eq!(s.examples.len(), EXAMPLES);
        assert!(s.examples.join(", ").len() < 250);
    }
}
