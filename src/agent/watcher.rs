//! The watcher: one Consul blocking query at a time on the prefix, following
//! Consul's index rules (api-docs/features/blocking), building a new
//! [`Snapshot`] for every answer whose index moved and swapping it in whole
//! (after the hold rules of [`crate::agent::guard`]).
//! Failures keep the last copy, back off with jitter, and are counted.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::consistency::hold_reason;
use crate::agent::guard::{release_mark, Guard};
use crate::agent::metrics::{ConsulOutcome, RefusedAnswer};
use crate::agent::shared::{ReadyStep, Shared};
use crate::cli::Consistency;
use crate::consul::{ConsulClient, ConsulError, PrefixAnswer, ReadMeta};
use crate::model::snapshot::{build_snapshot, diff, Entry, KeyChange, Snapshot};

/// Watcher settings.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// The watched prefix, ending in `/`.
    pub prefix: String,
    /// Blocking-query wait sent to Consul. Default 60 s; Consul caps it at
    /// 10 minutes.
    pub wait: Duration,
    /// Least time between the starts of two requests, so a Consul that
    /// returns at once (churn, or a broken index) cannot make the loop spin.
    /// Default 100 ms.
    pub min_interval: Duration,
    /// Retry delays after failures.
    pub backoff: Backoff,
    /// Read consistency (`--consistency`). Default [`Consistency::Default`].
    pub consistency: Consistency,
    /// In stale mode, the oldest `X-Consul-LastContact` an answer may have
    /// to be applied without a default read (`--max-stale`). Default
    /// [`crate::agent::consistency::DEFAULT_MAX_STALE`] (5 s).
    pub max_stale: Duration,
}

/// Jittered exponential backoff: the n-th consecutive failure waits a random
/// time in `[d/2, d]` with `d = min(base * 2^(n-1), cap)`. Defaults: 250 ms
/// (as consul-template) doubling to 10 s.
///
/// The cap bounds how long after Consul comes back every agent has read it
/// again: at most 10 s (plus the request), whatever the outage. It costs
/// Consul little: each agent has at most one request in flight, so a
/// fleet of N agents makes at most N requests at once and, at the cap, N /
/// 7.5 s on average; the jitter spreads them over each 5-10 s window, so
/// agents that lost Consul together do not come back together.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first delay. Default 250 ms.
    pub base: Duration,
    /// The largest delay. Default 10 s.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 for the first),
    /// with `unit` a random number in `[0, 1)`.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        let full = self.base.saturating_mul(1u32 << exp).min(self.cap);
        full.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// What an answer's `X-Consul-Index` means for the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexEvent {
    /// The index moved forward (or this is the first answer): rebuild.
    Changed,
    /// Same index: the wait ended with no change. Keep the copy.
    NotModified,
    /// The index went backwards (snapshot restore, tombstone reaping, a new
    /// Consul): apply this answer and count a reset; then re-read from index
    /// 0, unless this answer already was such a full read.
    WentBackwards,
}

/// Consul's index rules for one blocking-query loop.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexTracker {
    /// The index of the copy held, `None` before the first answer.
    current: Option<u64>,
    /// Set after a reset: the next query uses index 0.
    reset: bool,
}

impl IndexTracker {
    /// The index to send with the next query: 0 before the first answer and
    /// after a reset (answers at once), else the last index seen.
    pub fn query_index(&self) -> u64 {
        match self.current {
            Some(i) if !self.reset => i,
            _ => 0,
        }
    }

    /// The index of the copy held, `None` before the first answer.
    pub fn held(&self) -> Option<u64> {
        self.current
    }

    /// Like [`IndexTracker::observe`] for an answer that is already a full
    /// read (the fresh read that confirms a suspect answer): a lower index
    /// is still a reset, but needs no second full read.
    pub fn observe_full_read(&mut self, raw_index: u64) -> IndexEvent {
        let event = self.observe(raw_index);
        self.reset = false;
        event
    }

    /// Makes the next query a full read (index 0) whose answer is applied
    /// whatever its index. Used after a failed request: a Consul that was
    /// restarted or restored meanwhile can come back with the very index the
    /// copy has, but other data.
    pub fn force_full_read(&mut self) {
        if self.current.is_some() {
            self.reset = true;
        }
    }

    /// Classifies an answer's index and remembers it. An index of 0 is
    /// clamped to 1 (a 0 would make every query return at once).
    pub fn observe(&mut self, raw_index: u64) -> IndexEvent {
        let index = raw_index.max(1);
        let previous = self.current.replace(index);
        let was_reset = std::mem::take(&mut self.reset);
        match previous {
            None => IndexEvent::Changed,
            // This answer is already a full read from index 0, so the loop
            // goes on blocking from it; a lower index than before (a Consul
            // restored or restarted during an outage) is still a reset.
            Some(p) if was_reset && index < p => IndexEvent::WentBackwards,
            Some(_) if was_reset => IndexEvent::Changed,
            Some(p) if index > p => IndexEvent::Changed,
            Some(p) if index == p => IndexEvent::NotModified,
            Some(_) => {
                self.reset = true;
                IndexEvent::WentBackwards
            }
        }
    }
}

/// Logs the differences between two snapshots, one line per key changed,
/// and returns how many keys changed. Invalid values are logged once per
/// change of their key (a new ModifyIndex), not per answer.
pub fn log_changes(old: Option<&Snapshot>, new: &Snapshot) -> usize {
    let changes = diff(old, new);
    for change in &changes {
        match *change {
            KeyChange::Set { key, state, prev } => {
                let previous = prev.map(|p| describe(&p.entry));
                match &state.entry {
                    Entry::Valid(s) => info!(
                        key = %key,
                        value = %s,
                        previous = previous.as_deref().unwrap_or("none"),
                        consul_index = new.index,
                        modify_index = state.modify_index,
                        "desired state applied"
                    ),
                    Entry::Invalid(e) => warn!(
                        key = %key,
                        error = %e,
                        consul_index = new.index,
                        modify_index = state.modify_index,
                        "invalid value held; servers it decides get no answer and keep their state"
                    ),
                }
            }
            KeyChange::Removed { key, prev } => info!(
                key = %key,
                previous = %describe(&prev.entry),
                consul_index = new.index,
                "key removed; servers fall back to their next key or ready"
            ),
        }
    }
    changes.len()
}

fn describe(entry: &Entry) -> String {
    match entry {
        Entry::Valid(s) => s.to_string(),
        Entry::Invalid(e) => format!("invalid ({e})"),
    }
}

/// Drives the blocking-query loop for one agent.
pub struct Watcher {
    client: Arc<ConsulClient>,
    config: WatcherConfig,
    shared: Arc<Shared>,
    tracker: IndexTracker,
    failures: u32,
    last_start: Option<tokio::time::Instant>,
    guard: Guard,
    /// Stale mode: the next read is a default-consistency one (the first
    /// read, and after a held answer).
    confirm: bool,
}

/// How often the watcher proves it is alive while a blocking query is held.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

impl Watcher {
    /// A watcher that publishes into `shared`.
    pub fn new(client: Arc<ConsulClient>, config: WatcherConfig, shared: Arc<Shared>) -> Self {
        Watcher {
            client,
            config,
            shared,
            tracker: IndexTracker::default(),
            failures: 0,
            last_start: None,
            guard: Guard::default(),
            confirm: true,
        }
    }

    /// Retries until the first snapshot is applied or `timeout` passes.
    ///
    /// # Errors
    ///
    /// The last Consul error when no snapshot could be had in time, naming the
    /// Consul address.
    pub async fn first_sync(&mut self, timeout: Duration) -> Result<(), ConsulError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_error = None;
        loop {
            let result = tokio::time::timeout_at(deadline, self.step()).await;
            match result {
                Ok(Ok(())) if self.shared.readiness.is_synced() => return Ok(()),
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Err(e);
                    }
                    // Back off, but never past the deadline: the last try
                    // is cut short there and reports this error.
                    let delay = self.config.backoff.delay(self.failures, fastrand::f64());
                    last_error = Some(e);
                    // Beating: the systemd watchdog runs from the start, and
                    // backoff sleeps grow past its period.
                    self.beating_sleep(delay.min(deadline - now)).await;
                }
                Err(_) => {
                    return Err(last_error.unwrap_or_else(|| ConsulError::Timeout {
                        addr: self.client.addr().to_string(),
                        after: timeout,
                    }))
                }
            }
        }
    }

    /// Runs the loop until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let step = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.step() => r,
            };
            if step.is_err() {
                let delay = self.config.backoff.delay(self.failures, fastrand::f64());
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.beating_sleep(delay) => {}
                }
            }
        }
    }

    async fn beating_sleep(&self, delay: Duration) {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        loop {
            tokio::select! {
                _ = &mut sleep => return,
                _ = tick.tick() => self.shared.watcher_heartbeat.beat(),
            }
        }
    }

    /// One rate-limited request and its handling.
    async fn step(&mut self) -> Result<(), ConsulError> {
        if let Some(last) = self.last_start {
            self.beating_sleep(
                (last + self.config.min_interval)
                    .saturating_duration_since(tokio::time::Instant::now()),
            )
            .await;
        }
        self.last_start = Some(tokio::time::Instant::now());
        let index = self.tracker.query_index();
        let consistency = self.read_consistency();
        let started = Instant::now();
        let result = {
            let request = self.client.list_prefix_as(
                &self.config.prefix,
                index,
                self.config.wait,
                consistency,
            );
            tokio::pin!(request);
            let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
            loop {
                tokio::select! {
                    r = &mut request => break r,
                    _ = tick.tick() => self.shared.watcher_heartbeat.beat(),
                }
            }
        };
        self.shared.watcher_heartbeat.beat();
        let metrics = &self.shared.metrics;
        metrics
            .consul_request_duration
            .observe(started.elapsed().as_secs_f64());
        if let Ok((_, meta)) = &result {
            if let Some(age) = meta.last_contact {
                metrics.consul_last_contact.set(age.as_secs_f64());
            }
        }
        // Three gates stand between an answer and the copy served, in this
        // order. 1. The stale hold (stale mode only): an answer that could
        // move the copy backwards is not applied at all, so it is neither
        // read-checked nor shown to the guard; the default-consistency full
        // read that replaces it goes through the gates below like any
        // answer. 2. The filtered-view check (`verify_not_filtered`): an
        // answer that may be a filtered view (drops keys, empty, hides
        // writes, or lacks a key `?keys` shows) is refused and replaced by
        // a default-consistency read without an index between two read
        // checks, whatever the mode (a 403 fails the step and the copy is
        // kept). 3. The guard
        // (in `apply`): invalid values and data gone backwards keep the
        // values served before. Holding first means the read check and the
        // guard judge only answers that are at least as new as the copy, or
        // came from the leader.
        let result = match result {
            Ok((answer, meta)) => {
                if self.hold_stale(consistency, &answer, &meta) {
                    return Ok(());
                }
                self.verify_not_filtered(answer).await
            }
            Err(e) => Err(e),
        };
        let metrics = &self.shared.metrics;
        match result {
            Ok((answer, full_read)) => {
                self.on_answer(answer, full_read);
                if consistency == Consistency::Default {
                    // A default-consistency answer (or the default fresh
                    // read that replaced it) was applied: stale reads may
                    // resume. A stale answer replaced by a fresh read needs
                    // nothing here: stale reads were already on.
                    self.confirm = false;
                }
                Ok(())
            }
            Err(e) => {
                metrics.consul_request(ConsulOutcome::from(&e));
                self.on_failure(&e);
                Err(e)
            }
        }
    }

    /// The consistency of the next read: stale in stale mode, unless a
    /// default read must confirm the copy first.
    fn read_consistency(&self) -> Consistency {
        match self.config.consistency {
            Consistency::Stale if !self.confirm => Consistency::Stale,
            _ => Consistency::Default,
        }
    }

    /// Holds a stale answer that could move the copy backwards (see
    /// [`crate::agent::consistency`]): counts it, and makes the next read a
    /// default-consistency full read. True when held. A default answer is
    /// never held; once applied it clears the need to confirm (in `step`).
    fn hold_stale(
        &mut self,
        consistency: Consistency,
        answer: &PrefixAnswer,
        meta: &ReadMeta,
    ) -> bool {
        if consistency == Consistency::Default {
            return false;
        }
        let metrics = &self.shared.metrics;
        let held = self.tracker.held();
        let Some(reason) = hold_reason(held, answer.index, meta, self.config.max_stale) else {
            return false;
        };
        metrics.stale_held(reason);
        metrics.consul_request(ConsulOutcome::NotModified);
        info!(
            consul_index = answer.index,
            held_index = held.unwrap_or(0),
            last_contact_ms = meta.last_contact.map(|d| d.as_millis() as u64),
            known_leader = meta.known_leader,
            reason = reason.as_str(),
            "stale answer held; confirming with a default-consistency read"
        );
        self.confirm = true;
        self.tracker.force_full_read();
        true
    }

    /// Consul filters a recursive read by the token's ACL rules, so an
    /// answer from a token narrowed while the agent runs looks like deletes,
    /// or hides new writes. And it filters a blocking query with the ACL the
    /// token had when the query *started* (agent/consul/kvs_endpoint.go
    /// resolves the token once, before `blockingQuery`): after a policy
    /// narrowed and restored, a query parked meanwhile answers the next
    /// write with the narrowed view, while a read check made now passes.
    ///
    /// So an answer that may be a filtered view is never taken as it is:
    /// one that drops keys the copy holds, a 404 (no key) whose index moved
    /// or that follows a copy with keys, or one whose index moved past every
    /// ModifyIndex it shows (Consul's index counts the keys it filters out;
    /// the other cause is a delete's tombstone). Such an answer is refused
    /// (counted in `gitlab_haproxy_agent_consul_answers_refused_total{reason}`)
    /// and replaced by a fresh read without an index (evaluated under the
    /// token's policy now) between two read checks
    /// ([`ConsulClient::check_read_access`]); only that fresh read is
    /// applied. Any other answer whose index moved can still hide new keys,
    /// so the names of the keys (`?keys`, a few bytes a key) are read
    /// between two read checks, and an answer lacking one is refused the
    /// same way (`hides_keys`; a key written just after counts too). The
    /// same holds for answers without an index (after a failure): a policy
    /// restored between such a read and a check after it would pass a
    /// filtered view, so the check must come before a read, too. Any failure
    /// (403 from a check) keeps the last copy. A real delete looks like a
    /// filtered view and is confirmed the same way: it costs two or three
    /// more requests and applies within milliseconds.
    ///
    /// Returns the answer to apply and whether it is such a fresh read.
    async fn verify_not_filtered(
        &self,
        answer: PrefixAnswer,
    ) -> Result<(PrefixAnswer, bool), ConsulError> {
        let Some(copy) = self.shared.snapshot.load_full() else {
            return Ok((answer, false));
        };
        let prefix = &self.config.prefix;
        let reason = match possibly_filtered(prefix, &copy, &answer) {
            Some(reason) => reason,
            None if answer.index <= copy.index => return Ok((answer, false)),
            None => {
                // Every key the copy holds is shown, and the index is a
                // shown key's: new keys can still be hidden (a transaction
                // gives a hidden group key and a visible row key one
                // index). The names of the keys the token may read now
                // tell, for a few bytes a key.
                self.client.check_read_access(prefix).await?;
                let names = self.client.list_keys(prefix).await?;
                self.client.check_read_access(prefix).await?;
                let shown: std::collections::HashSet<&str> =
                    answer.pairs.iter().map(|p| p.key.as_str()).collect();
                if names.iter().all(|k| shown.contains(k.as_str())) {
                    return Ok((answer, false));
                }
                RefusedAnswer::HidesKeys
            }
        };
        self.shared.metrics.consul_answer_refused(reason);
        // A 404 was read-checked by list_prefix already, just now.
        if !answer.pairs.is_empty() {
            self.client.check_read_access(prefix).await?;
        }
        let fresh = self.client.list_prefix(prefix, 0, self.config.wait).await?;
        if !fresh.pairs.is_empty() {
            self.client.check_read_access(prefix).await?;
        }
        let shown = |a: &PrefixAnswer| {
            a.pairs
                .iter()
                .map(|p| p.key.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let (old, new) = (shown(&answer), shown(&fresh));
        if new.difference(&old).next().is_some() {
            warn!(
                consul_index = answer.index,
                fresh_index = fresh.index,
                hidden = new.difference(&old).count(),
                reason = reason.as_str(),
                "a blocking-query answer hid keys a fresh read shows (filtered by the ACL the query started with); applied the fresh read"
            );
        }
        Ok((fresh, true))
    }

    /// `full_read`: the answer is the fresh read that replaced a suspect
    /// blocking answer.
    fn on_answer(&mut self, answer: PrefixAnswer, full_read: bool) {
        let shared = self.shared.clone();
        let metrics = &shared.metrics;
        let served_index = self.shared.snapshot.load().as_ref().map(|s| s.index);
        let event = if full_read {
            self.tracker.observe_full_read(answer.index)
        } else {
            self.tracker.observe(answer.index)
        };
        match event {
            IndexEvent::NotModified => metrics.consul_request(ConsulOutcome::NotModified),
            IndexEvent::Changed | IndexEvent::WentBackwards => {
                if event == IndexEvent::WentBackwards {
                    metrics.consul_index_resets.inc();
                    warn!(
                        consul_index = answer.index,
                        "X-Consul-Index went backwards; {}",
                        if full_read {
                            "applying the full read that shows it"
                        } else {
                            "re-reading the prefix from index 0"
                        }
                    );
                }
                metrics.consul_request(ConsulOutcome::Ok);
                // Backwards, or a full read after a failure whose index did
                // not move: Consul may have come back without its data.
                let rolled_back = event == IndexEvent::WentBackwards
                    || served_index.is_some_and(|i| answer.index.max(1) <= i);
                let mark = release_mark(&self.config.prefix, &answer);
                self.apply(
                    build_snapshot(&self.config.prefix, answer.index, &answer.pairs),
                    mark,
                    rolled_back,
                );
            }
        }
        self.failures = 0;
        let mut sync = self.shared.sync.lock().unwrap();
        if let Some(since) = sync.failing_since.take() {
            info!(
                consul_addr = %self.client.addr(),
                outage_seconds = since.elapsed().as_secs(),
                "Consul reachable again"
            );
        }
        sync.last_error = None;
        sync.last_sync = Some(SystemTime::now());
        drop(sync);
        metrics
            .last_sync_timestamp
            .set(crate::agent::metrics::unix_now());
    }

    fn apply(&mut self, raw: Snapshot, mark: Option<u64>, rolled_back: bool) {
        let metrics = &self.shared.metrics;
        let old = self.shared.snapshot.load_full();
        let (keys, invalid) = (raw.keys.len(), raw.invalid_count());
        let snapshot = self.guard.apply(old.as_deref(), raw, mark, rolled_back);
        let changed = log_changes(old.as_deref(), &snapshot);
        metrics.state_changes.inc_by(changed as u64);
        metrics.consul_index.set(snapshot.index as i64);
        metrics.keys.set(keys as i64);
        metrics.invalid_keys.set(invalid as i64);
        metrics
            .invalid_held_keys
            .set(self.guard.invalid_count() as i64);
        metrics
            .rollback_held_keys
            .set(self.guard.rollback_count() as i64);
        *self.shared.held.lock().unwrap() = Arc::new(self.guard.held().clone());
        let status = format!("synced, {keys} keys, index {}", snapshot.index);
        let first = old.is_none();
        self.shared.snapshot.store(Some(Arc::new(snapshot)));
        if first {
            metrics.synced.set(1);
            self.shared.readiness.set(ReadyStep::Synced);
            info!(consul_addr = %self.client.addr(), "first Consul sync applied; answering agent-checks");
        }
        crate::agent::notify::status(&status);
    }

    fn on_failure(&mut self, error: &ConsulError) {
        self.failures = self.failures.saturating_add(1);
        self.tracker.force_full_read();
        if error.is_forbidden() {
            // A rotated token: read the file again before the next try.
            self.client.token().invalidate();
        }
        let mut sync = self.shared.sync.lock().unwrap();
        let since = *sync.failing_since.get_or_insert_with(Instant::now);
        let first_failure = sync.last_error.is_none();
        sync.last_error = Some(error.to_string());
        drop(sync);
        if first_failure {
            let note = outage_note(self.shared.readiness.is_synced());
            warn!(consul_addr = %self.client.addr(), error = %error, "Consul request failed; {note}");
        }
        let copy = if self.shared.readiness.is_synced() {
            "serving last copy"
        } else {
            "not synced yet, not answering"
        };
        crate::agent::notify::status(&format!(
            "Consul reads failing for {}s, {copy}: {error}",
            since.elapsed().as_secs()
        ));
    }
}

/// Why `answer` may be a view filtered by the token's ACL, compared with
/// `copy` (the copy served): `None` if it cannot be (it shows every key the
/// copy holds, and a key whose ModifyIndex is its index, or its index did
/// not move).
pub fn possibly_filtered(
    prefix: &str,
    copy: &Snapshot,
    answer: &PrefixAnswer,
) -> Option<RefusedAnswer> {
    let moved = answer.index > copy.index;
    if answer.pairs.is_empty() {
        return (moved || !copy.keys.is_empty()).then_some(RefusedAnswer::Empty);
    }
    let present: std::collections::HashSet<&str> = answer
        .pairs
        .iter()
        .filter_map(|p| p.key.strip_prefix(prefix))
        .collect();
    if !copy.keys.keys().all(|k| present.contains(&**k)) {
        return Some(RefusedAnswer::DropsKeys);
    }
    let latest_shown = answer.pairs.iter().map(|p| p.modify_index).max();
    if moved && latest_shown.is_some_and(|m| answer.index > m) {
        return Some(RefusedAnswer::HidesWrites);
    }
    None
}

/// What HAProxy gets while Consul cannot be read, for the log line that
/// opens an outage: the last copy once synced, no answer before the first
/// sync (a restarted agent has no copy to serve).
fn outage_note(synced: bool) -> &'static str {
    if synced {
        "serving the last copy"
    } else {
        "not synced yet, answering nobody"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::KvPair;

    #[test]
    fn index_rules_follow_consul_docs() {
        let mut t = IndexTracker::default();
        assert_eq!(t.query_index(), 0);
        assert_eq!(t.observe(10), IndexEvent::Changed);
        assert_eq!(t.query_index(), 10);
        assert_eq!(t.observe(10), IndexEvent::NotModified);
        assert_eq!(t.observe(12), IndexEvent::Changed);
        assert_eq!(t.query_index(), 12);
        // Backwards: apply, then re-read from 0, then block on the new index.
        assert_eq!(t.observe(5), IndexEvent::WentBackwards);
        assert_eq!(t.query_index(), 0);
        assert_eq!(t.observe(5), IndexEvent::Changed);
        assert_eq!(t.query_index(), 5);
    }

    #[test]
    fn a_failure_makes_the_next_answer_a_full_read_applied_whatever_its_index() {
        let mut t = IndexTracker::default();
        t.force_full_read();
        assert_eq!(t.query_index(), 0);
        assert_eq!(t.observe(13), IndexEvent::Changed);
        t.force_full_read();
        assert_eq!(t.query_index(), 0);
        // A restarted Consul at the same index: still applied.
        assert_eq!(t.observe(13), IndexEvent::Changed);
        assert_eq!(t.query_index(), 13);
        assert_eq!(t.observe(13), IndexEvent::NotModified);
        // Back after an outage with a lower index: a reset, counted, but no
        // second full read (this answer was one).
        t.force_full_read();
        assert_eq!(t.observe(7), IndexEvent::WentBackwards);
        assert_eq!(t.query_index(), 7);
        assert_eq!(t.observe(8), IndexEvent::Changed);
    }

    #[test]
    fn a_confirming_full_read_needs_no_second_one() {
        let mut t = IndexTracker::default();
        assert_eq!(t.observe(10), IndexEvent::Changed);
        assert_eq!(t.observe_full_read(12), IndexEvent::Changed);
        assert_eq!(t.query_index(), 12);
        assert_eq!(t.observe_full_read(12), IndexEvent::NotModified);
        // Backwards: a reset, but the loop blocks on it at once.
        assert_eq!(t.observe_full_read(7), IndexEvent::WentBackwards);
        assert_eq!(t.query_index(), 7);
    }

    #[test]
    fn an_outage_before_the_first_sync_is_not_logged_as_serving_a_copy() {
        assert_eq!(outage_note(true), "serving the last copy");
        assert_eq!(outage_note(false), "not synced yet, answering nobody");
    }

    #[test]
    fn zero_index_is_clamped_to_one() {
        let mut t = IndexTracker::default();
        assert_eq!(t.observe(0), IndexEvent::Changed);
        assert_eq!(t.query_index(), 1);
        assert_eq!(t.observe(0), IndexEvent::NotModified);
        assert_eq!(t.query_index(), 1);
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let b = Backoff::default();
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(250));
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(125));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(1000));
        assert_eq!(b.delay(6, 1.0), Duration::from_secs(8));
        assert_eq!(b.delay(100, 1.0), Duration::from_secs(10));
        assert_eq!(b.delay(100, 0.0), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_sleeps_are_what_delay_says() {
        let b = Backoff::default();
        let start = tokio::time::Instant::now();
        for failures in 1..=8 {
            tokio::time::sleep(b.delay(failures, 1.0)).await;
        }
        // 0.25 + 0.5 + 1 + 2 + 4 + 8 + 10 + 10 (capped)
        assert_eq!(start.elapsed(), Duration::from_millis(35_750));
    }

    fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            modify_index,
            flags: 0,
        }
    }

    fn answer(index: u64, pairs: Vec<KvPair>) -> PrefixAnswer {
        PrefixAnswer {
            index,
            pairs,
            body_bytes: 0,
        }
    }

    #[test]
    fn answers_that_may_be_filtered_views_are_named() {
        let copy = build_snapshot(
            "p/",
            5,
            &[pair("p/canary", "drain", 2), pair("p/web/x", "maint", 5)],
        );
        let same = || vec![pair("p/canary", "drain", 2), pair("p/web/x", "maint", 5)];
        // Every key shown, the index is a key's ModifyIndex: taken.
        let mut more = same();
        more.push(pair("p/web/y", "drain", 6));
        assert_eq!(possibly_filtered("p/", &copy, &answer(6, more)), None);
        assert_eq!(possibly_filtered("p/", &copy, &answer(5, same())), None);
        // A key the copy holds is missing.
        assert_eq!(
            possibly_filtered(
                "p/",
                &copy,
                &answer(
                    6,
                    vec![pair("p/web/x", "maint", 5), pair("p/web/y", "drain", 6)]
                )
            ),
            Some(RefusedAnswer::DropsKeys)
        );
        // The index moved past every key shown.
        assert_eq!(
            possibly_filtered("p/", &copy, &answer(7, same())),
            Some(RefusedAnswer::HidesWrites)
        );
        // A 404 after keys, and a 404 whose index moved on an empty copy.
        assert_eq!(
            possibly_filtered("p/", &copy, &answer(5, vec![])),
            Some(RefusedAnswer::Empty)
        );
        let empty = build_snapshot("p/", 5, &[]);
        assert_eq!(
            possibly_filtered("p/", &empty, &answer(9, vec![])),
            Some(RefusedAnswer::Empty)
        );
        assert_eq!(possibly_filtered("p/", &empty, &answer(5, vec![])), None);
    }

    #[test]
    fn changes_are_counted_per_key() {
        let a = build_snapshot(
            "p/",
            5,
            &[pair("p/canary", "drain", 2), pair("p/x", "maint", 3)],
        );
        let b = build_snapshot(
            "p/",
            6,
            &[pair("p/canary", "maint", 6), pair("p/y", "bad", 6)],
        );
        assert_eq!(log_changes(None, &a), 2);
        assert_eq!(log_changes(Some(&a), &a), 0);
        // canary changed, y added, x removed.
        assert_eq!(log_changes(Some(&a), &b), 3);
    }
}
