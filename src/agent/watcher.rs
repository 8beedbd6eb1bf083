//! The watcher: performs the Consul requests the decision core
//! ([`crate::decision`]) asks for, one at a time, hands back the answers,
//! and, when the served state changes, writes its runtime copy, swaps the
//! new [`Snapshot`](crate::model::snapshot::Snapshot) in whole and hands the
//! state to the state file's writer, which never holds it back
//! ([`crate::agent::state_copies`]).
//! It decides nothing itself: it waits as the core says (backoff with
//! jitter, the least interval between reads), beats the watchdog while any
//! request is in flight, and turns the core's notes into logs and metrics.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::discovery::Discovery;
use crate::agent::finder::{ClientFactory, Finder};
use crate::agent::log_summary::ForbiddenReads;
use crate::agent::metrics::ConsulOutcome;
use crate::agent::route::{Routes, Step};
use crate::agent::shared::{ReadyStep, Shared};
use crate::agent::state_copies::Copies;
use crate::cli::Consistency;
use crate::consul::ReadMeta;
use crate::consul::{ConsulClient, ConsulError};
use crate::decision::served::ServedState;
use crate::decision::stale::hold_reason;
use crate::decision::{Core, CoreConfig, Delay, IndexCheck, Next, Note, Request, Response, Rules};

mod found;
mod notes;
mod prove;

/// Watcher settings.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// The watched prefix, ending in `/`.
    pub prefix: String,
    /// Blocking-query wait sent to Consul. Default 60 s; Consul caps it at
    /// 10 minutes.
    pub wait: Duration,
    /// Least time between the starts of two prefix reads, so a Consul that
    /// returns at once (churn, or a broken index) cannot make the loop spin.
    /// Default 100 ms.
    pub min_interval: Duration,
    /// Retry delays after failures.
    pub backoff: Backoff,
    /// Read consistency (`--consistency`). Default [`Consistency::Default`].
    pub consistency: Consistency,
    /// In stale mode, the oldest `X-Consul-LastContact` an answer may
    /// have to be applied without a default read (`--max-stale`). Default
    /// [`crate::decision::stale::DEFAULT_MAX_STALE`] (5 s).
    pub max_stale: Duration,
    /// How often an index check is made while a blocking read is parked
    /// (`--index-check`); zero: never. Default 2 s. Each check is also
    /// bounded by it.
    pub index_check: Duration,
    /// Our Consul datacenter (`--consul-datacenter`), against which every
    /// `--consul-fallback-addr` is proven; `None` (the default): the one
    /// `--consul-addr` answers on `/v1/agent/self`.
    pub datacenter: Option<String>,
    /// How fallbacks are found from Consul when no `--consul-fallback-addr`
    /// list is given ([`crate::agent::discovery`]); `None`: a list was
    /// given, or `none`.
    pub discovery: Option<Discovery>,
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

/// How often the watcher proves it is alive while it waits or a request is
/// in flight.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Drives the decision core for one agent.
pub struct Watcher {
    /// The Consul addresses reads may go through: `--consul-addr`, then
    /// each `--consul-fallback-addr` ([`crate::agent::route`]).
    clients: Vec<Arc<ConsulClient>>,
    routes: Routes,
    config: WatcherConfig,
    shared: Arc<Shared>,
    core: Core,
    copies: Option<Arc<Copies>>,
    next: Next,
    last_prefix_start: Option<tokio::time::Instant>,
    /// Direct reads answered 403 for the answer being confirmed, of keys
    /// not held hidden before it.
    forbidden: ForbiddenReads,
    /// Our datacenter, pinned or learned from the primary ([`prove`]).
    datacenter: Option<String>,
    /// Why each address has its proof, for the log and `/status`.
    details: Vec<Option<String>>,
    /// The served state's store id the fallbacks were last proven against.
    store_seen: Option<Option<Box<str>>>,
    /// The reads of the servers, while fallbacks are found from Consul.
    finder: Option<Finder>,
}

impl Watcher {
    /// A watcher that reads through `clients` (the primary first, then
    /// the fallbacks; at least one) and publishes into `shared`, starting
    /// from `restored` (the state read from the state file or its runtime
    /// copy, served at once) and keeping every change in `copies`. With
    /// [`WatcherConfig::discovery`], the fallbacks are found from Consul
    /// and `make` builds the client of each address found.
    pub fn new(
        clients: Vec<Arc<ConsulClient>>,
        config: WatcherConfig,
        shared: Arc<Shared>,
        copies: Option<Arc<Copies>>,
        restored: Option<ServedState>,
        make: ClientFactory,
    ) -> Self {
        let mut core = Core::new(
            CoreConfig {
                prefix: config.prefix.clone(),
                stale: config.consistency == Consistency::Stale,
                max_stale: config.max_stale,
                rules: Rules::default(),
            },
            restored,
        );
        if let Some(served) = core.served_shared() {
            publish(&shared, &served, true);
            info!(
                keys = served.keys.len(),
                consul_index = served.index,
                "answering from the state file until the first Consul answer"
            );
        }
        let next = core.start();
        assert!(!clients.is_empty(), "a watcher needs a Consul address");
        let store_seen = core.served().map(|s| s.store_id.clone());
        let finder = config.discovery.clone().map(|d| Finder::new(d, make));
        let fallbacks_from = match (&finder, clients.len()) {
            (Some(_), _) => "found",
            (None, 1) => "none",
            (None, _) => "listed",
        };
        let watcher = Watcher {
            routes: Routes::new(clients.len()),
            details: vec![None; clients.len()],
            datacenter: config.datacenter.clone(),
            clients,
            config,
            shared,
            copies,
            core,
            next,
            last_prefix_start: None,
            forbidden: ForbiddenReads::default(),
            store_seen,
            finder,
        };
        {
            let mut sync = watcher.shared.sync.lock().unwrap();
            sync.datacenter = watcher.datacenter.clone();
            sync.fallbacks_from = fallbacks_from;
        }
        watcher.publish_proofs();
        watcher
    }

    /// Runs the core until its first Consul answer is applied or `timeout`
    /// passes.
    ///
    /// # Errors
    ///
    /// The last Consul error when no answer could be had in time, naming the
    /// Consul address.
    pub async fn first_sync(&mut self, timeout: Duration) -> Result<(), ConsulError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let _ = tokio::time::timeout_at(deadline, self.find_at_start()).await;
        let _ = tokio::time::timeout_at(deadline, self.prove_at_start()).await;
        let mut last_error = None;
        while !self.core.synced() {
            match tokio::time::timeout_at(deadline, self.step()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    return Err(last_error.unwrap_or_else(|| ConsulError::Timeout {
                        addr: self.client().addr().to_string(),
                        after: timeout,
                    }))
                }
            }
        }
        Ok(())
    }

    /// Runs the loop until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.step() => {}
            }
        }
        self.end_forbidden();
    }

    /// The client of the address reads go through now.
    fn client(&self) -> &Arc<ConsulClient> {
        &self.clients[self.routes.current()]
    }

    /// Sleeps for `delay`, beating the watchdog.
    async fn beating_sleep(&self, delay: Duration) {
        let _ = self.beating(tokio::time::sleep(delay)).await;
    }

    /// Awaits `work`, beating the watchdog every [`HEARTBEAT_EVERY`] while it
    /// runs: every request, blocking or not, however slow Consul is.
    async fn beating<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(work);
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        let out = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = tick.tick() => self.beat(),
            }
        };
        self.beat();
        out
    }

    /// Proves the loop alive, and exports how long the state served has
    /// gone unconfirmed and how long the state file has lagged it.
    fn beat(&self) {
        self.shared.watcher_heartbeat.beat();
        if let Some(copies) = &self.copies {
            copies.export(&self.shared);
        }
        let unconfirmed = self.shared.sync.lock().unwrap().unconfirmed_for();
        if let Some(d) = unconfirmed {
            self.shared.metrics.consul_unconfirmed.set(d.as_secs_f64());
        }
    }

    /// Awaits a blocking read, with an index check every `--index-check`
    /// (one at a time, each bounded by the interval) whose findings go to
    /// the core, and to the [`Routes`] that say which Consul address reads
    /// go through. `None`: the read was re-issued (now in `self.next`), by
    /// the core or through another address; the parked one is dropped,
    /// which closes its connection.
    async fn parked(&mut self, request: &Request) -> Option<Result<Response, ConsulError>> {
        let every = self.config.index_check;
        let work = perform(
            Arc::clone(self.client()),
            self.config.prefix.clone(),
            self.config.wait,
            request.clone(),
        );
        tokio::pin!(work);
        let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
        let mut due = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = None;
        let same = Next {
            request: request.clone(),
            delay: Delay::None,
        };
        loop {
            tokio::select! {
                r = &mut work => {
                    self.beat();
                    return Some(r);
                }
                _ = beat.tick() => {
                    self.beat();
                    self.find_due();
                }
                answer = self.found(), if check.is_none() && self.finding() => {
                    if self.apply_found(answer) {
                        // The read in flight went through an address that
                        // left the list or moved in it: sent again.
                        self.next = same;
                        return None;
                    }
                }
                _ = due.tick(), if check.is_none() => {
                    let route = self.routes.next_check();
                    let client = Arc::clone(&self.clients[route]);
                    let prefix = self.config.prefix.clone();
                    check = Some(Box::pin(async move { (route, client.check_index(&prefix, every).await) }));
                }
                (route, result) = async { check.as_mut().expect("a check in flight").await }, if check.is_some() => {
                    check = None;
                    let fresh = self.fresh(&result);
                    if route != self.routes.current() {
                        // The primary, asked while reads go through a
                        // fallback: it decides the address alone.
                        if let Step::Switch(to) = self.routes.on_check(route, fresh) {
                            self.switched(to, "the Consul agent at --consul-addr answers fresh again");
                            self.next = same;
                            return None;
                        }
                        continue;
                    }
                    // A list with no key where the served state has a store
                    // id confirms nothing: the token sees no key there.
                    let found = match result {
                        Ok((index, meta, empty)) if !(empty && self.expects_store_id()) => {
                            IndexCheck::Answered { index, meta }
                        }
                        _ => IndexCheck::Failed,
                    };
                    let out = self.core.on_index_check(found);
                    for note in &out.notes {
                        let result = match note {
                            Note::Confirmed { .. } => "current",
                            Note::ParkedBehind { .. } => "behind",
                            Note::IndexBelow { .. } => "below",
                            Note::Unconfirmed { reason } => reason.as_str(),
                            _ => continue,
                        };
                        self.shared.metrics.index_check(result);
                        self.note(note);
                    }
                    let mut reissue = out.reissue;
                    let step = if out.reroute {
                        // The read went unanswered through this address
                        // while its checks passed: like a failed request.
                        self.routes.on_failure(route)
                    } else {
                        self.routes.on_check(route, fresh)
                    };
                    let step = match step {
                        Step::Probe { check, prove } => {
                            let found = self.probe(&check, &prove).await;
                            self.routes.on_probes(found)
                        }
                        step => step,
                    };
                    if let Step::Switch(to) = step {
                        let why = if out.reroute {
                            "a re-issued blocking read went unanswered while index checks passed"
                        } else {
                            "an index check through the Consul address in use could not confirm (failed, no leader, or out of contact)"
                        };
                        self.switched(to, why);
                        reissue.get_or_insert(same.clone());
                    }
                    if let Some(next) = reissue {
                        self.next = next;
                        return None;
                    }
                }
            }
        }
    }

    /// Whether an index check answered fresh: from a server that knows its
    /// leader and heard from it within `--max-stale` (the stale rules of
    /// [`crate::decision::stale`]), listing a key where the served state
    /// has a store id.
    fn fresh(&self, check: &Result<(u64, ReadMeta, bool), ConsulError>) -> bool {
        matches!(check, Ok((index, meta, empty))
            if !(*empty && self.expects_store_id())
                && hold_reason(None, *index, meta, self.config.max_stale).is_none())
    }

    /// A request through address `route` failed with `error`, refused by
    /// the ACLs or not: reads may move ([`Routes::on_refused`],
    /// [`Routes::on_failure`], which may probe the others first). A
    /// fallback that refused the token is named.
    async fn reroute(&mut self, route: usize, error: &ConsulError, refused: bool) {
        let mut step = if refused {
            self.routes.on_refused(route)
        } else {
            self.routes.on_failure(route)
        };
        if route != 0 && self.routes.proof(route) != crate::agent::route::Proof::Proven {
            let detail = if refused {
                format!("a request through it was refused (403: {error}): that Consul does not know the token or denies it the prefix")
            } else {
                format!(
                    "a request through it failed ({error}); proven again before it is used again"
                )
            };
            self.record(
                route,
                crate::agent::route::Verdict {
                    proof: self.routes.proof(route),
                    detail,
                },
            );
        }
        if let Step::Probe { check, prove } = step {
            let found = self.probe(&check, &prove).await;
            step = self.routes.on_probes(found);
        }
        if let Step::Switch(to) = step {
            let why = format!(
                "a request through {} failed ({error})",
                self.clients[route].addr()
            );
            self.switched(to, &why);
        }
    }

    /// Reads now go through address `to`: logged, counted and shown.
    fn switched(&self, to: usize, why: &str) {
        let addr = self.clients[to].addr();
        if to == 0 {
            info!(consul_addr = %addr, "{why}: reads go through it again");
        } else {
            warn!(
                consul_addr = %addr,
                primary = %self.clients[0].addr(),
                "{why}: reads go through --consul-fallback-addr"
            );
        }
        let metrics = &self.shared.metrics;
        metrics
            .consul_route
            .set(i64::try_from(to).unwrap_or(i64::MAX));
        metrics.consul_route_switches.inc();
        self.shared.sync.lock().unwrap().reading_through = (to != 0).then(|| addr.to_string());
    }

    /// Waits as the core said, performs its request, and hands the answer
    /// back. The error is the failed request's.
    async fn step(&mut self) -> Result<(), ConsulError> {
        // The fallbacks found change only here and between index checks,
        // where no request holds an address's index.
        self.apply_found_if_done().await;
        self.find_due();
        let Next { request, delay } = self.next.clone();
        let wait = match delay {
            Delay::None => Duration::ZERO,
            Delay::Backoff(failures) => self.config.backoff.delay(failures, fastrand::f64()),
            Delay::MinInterval => self.last_prefix_start.map_or(Duration::ZERO, |last| {
                (last + self.config.min_interval)
                    .saturating_duration_since(tokio::time::Instant::now())
            }),
        };
        if !wait.is_zero() {
            self.beating_sleep(wait).await;
        }
        if matches!(request, Request::Prefix { .. }) {
            self.last_prefix_start = Some(tokio::time::Instant::now());
        }
        let started = Instant::now();
        let mut route = self.routes.current();
        let blocking = matches!(request, Request::Prefix { index, .. } if index > 0);
        let result = if blocking && !self.config.index_check.is_zero() && self.core.parked() {
            match self.parked(&request).await {
                Some(result) => result,
                None => return Ok(()),
            }
        } else if blocking {
            let work = perform(
                Arc::clone(self.client()),
                self.config.prefix.clone(),
                self.config.wait,
                request.clone(),
            );
            self.beating(work).await
        } else {
            let (through, result) = self.unparked(&request).await;
            route = through;
            result
        };
        let shared = Arc::clone(&self.shared);
        let metrics = &shared.metrics;
        metrics
            .consul_request_duration
            .observe(started.elapsed().as_secs_f64());
        let (response, error) = match result {
            Ok(Response::ReadCheck { allowed: false }) => {
                // Refused like a failed read: counted, shown as the last
                // error, and the served state kept.
                let e = ConsulError::Status {
                    status: reqwest::StatusCode::FORBIDDEN,
                    body: format!(
                        "read check: the token may not read every key under {}",
                        self.config.prefix
                    ),
                };
                metrics.consul_request(ConsulOutcome::from(&e));
                self.reroute(route, &e, true).await;
                (Response::ReadCheck { allowed: false }, Some(e))
            }
            Ok(response) => (response, None),
            Err(e) => {
                metrics.consul_request(ConsulOutcome::from(&e));
                let forbidden = e.is_forbidden();
                self.reroute(route, &e, forbidden).await;
                (Response::Failed { forbidden }, Some(e))
            }
        };
        let mut confirmed = None;
        if let Response::Prefix { meta, .. } = &response {
            if let Some(age) = meta.last_contact {
                metrics.consul_last_contact.set(age.as_secs_f64());
            }
            // The leader's answer is current; a stale one as of its
            // server's last contact, unless the core holds it.
            confirmed = Some(match request {
                Request::Prefix { stale: true, .. } => meta.last_contact.unwrap_or_default(),
                _ => Duration::ZERO,
            });
        }
        let ok = error.is_none();
        let output = self.core.on_response(response, unix_now_secs());
        if output.reload_token {
            // A rotated token: read the file again before the next try.
            for client in &self.clients {
                client.token().invalidate();
            }
        }
        if let Some(last_contact) = confirmed {
            if !output
                .notes
                .iter()
                .any(|n| matches!(n, Note::StaleHeld { .. }))
            {
                self.note(&Note::Confirmed { last_contact });
            }
        }
        let mut applied = false;
        for note in &output.notes {
            applied |= matches!(note, Note::Applied { .. });
            self.note(note);
        }
        if !confirming(&output.next.request) {
            // The answer was applied, refused or dropped.
            self.end_forbidden();
        }
        if ok && !output.notes.iter().any(|n| matches!(n, Note::NotModified)) {
            metrics.consul_request(ConsulOutcome::Ok);
        }
        // The first Consul answer ends the provisional snapshot read from
        // the state file, even when it changed nothing.
        let first_sync = output.notes.contains(&Note::FirstSync);
        if output.served_changed || first_sync {
            if let Some(served) = self.core.served_shared() {
                let mut job = None;
                if output.served_changed {
                    if let Some(copies) = &self.copies {
                        job = Some(copies.before_serving(&self.shared, &served).await);
                    }
                }
                // A state changes only by an answer applied: Consul's.
                publish(&self.shared, &served, false);
                if let (Some(copies), Some(job)) = (&self.copies, job) {
                    copies.to_disk(job);
                    copies.export(&self.shared);
                }
            }
        }
        if first_sync {
            // Ready only once what the first answer decided is answered
            // and exported.
            self.shared.readiness.set(ReadyStep::Synced);
        }
        if applied {
            self.on_sync();
        }
        if let Some(e) = &error {
            self.on_failure(e);
        }
        self.next = output.next;
        let store = self.core.served().map(|s| s.store_id.clone());
        if store != self.store_seen {
            // The fallbacks were proven against another store id.
            if self.store_seen.is_some() {
                self.routes.on_identity_changed();
                self.publish_proofs();
            }
            self.store_seen = store;
        }
        error.map_or(Ok(()), Err)
    }

    /// Performs a request Consul answers at once (not a blocking read)
    /// through the address in use. With fallbacks and index checks on, one
    /// not answered within `--index-check` counts as a check that cannot
    /// confirm: the other addresses are probed, and through the first
    /// proven one that answers fresh the request is sent again (a
    /// `--consul-addr` that accepts and never answers, at start-up or
    /// later). Returns the address that answered, and its answer.
    async fn unparked(&mut self, request: &Request) -> (usize, Result<Response, ConsulError>) {
        let every = self.config.index_check;
        loop {
            let route = self.routes.current();
            let work = perform(
                Arc::clone(self.client()),
                self.config.prefix.clone(),
                self.config.wait,
                request.clone(),
            );
            if every.is_zero() || self.routes.count() == 1 {
                return (route, self.beating(work).await);
            }
            tokio::pin!(work);
            let slow = tokio::time::sleep(every);
            tokio::pin!(slow);
            let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
            let mut probed = false;
            loop {
                tokio::select! {
                    r = &mut work => {
                        self.beat();
                        return (route, r);
                    }
                    _ = beat.tick() => self.beat(),
                    _ = &mut slow, if !probed => {
                        probed = true;
                        if let Step::Probe { check, prove } = self.routes.on_check(route, false) {
                            let found = self.probe(&check, &prove).await;
                            if let Step::Switch(to) = self.routes.on_probes(found) {
                                self.switched(to, "a request through the Consul address in use was not answered within --index-check");
                                break;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Logs the reads answered 403 for the answer just confirmed that had
    /// no line of their own, in one line.
    fn end_forbidden(&mut self) {
        if let Some(summary) = self.forbidden.end() {
            summary.log();
        }
    }
}

/// True for the requests the core makes while it confirms an answer (its
/// read check and direct reads), false for those that start the next one.
fn confirming(request: &Request) -> bool {
    matches!(
        request,
        Request::Key { .. }
            | Request::ReadCheck { .. }
            | Request::RecordNames { .. }
            | Request::Record { .. }
    )
}

/// Performs one request of the core, with owned inputs so that the watcher
/// can hand the core index checks while it is in flight.
async fn perform(
    client: Arc<ConsulClient>,
    prefix: String,
    wait: Duration,
    request: Request,
) -> Result<Response, ConsulError> {
    let consistency = |stale: bool| {
        if stale {
            Consistency::Stale
        } else {
            Consistency::Default
        }
    };
    let prefix = &prefix;
    Ok(match &request {
        Request::AclProbe => Response::Acl {
            enabled: client.acl_enabled().await?,
        },
        Request::Prefix { index, stale } => {
            let (answer, meta) = client
                .read_prefix(prefix, *index, wait, consistency(*stale))
                .await?;
            Response::Prefix {
                answer,
                meta,
                token_load: client.token().loads(),
            }
        }
        Request::Key { key, stale } => {
            let (read, index) = client
                .read_key(&format!("{prefix}{key}"), consistency(*stale))
                .await?;
            Response::Key { read, index }
        }
        Request::ReadCheck { stale } => Response::ReadCheck {
            allowed: client.read_check(prefix, *stale).await?,
        },
        Request::Record { key } => {
            let full = crate::model::meta::record_key(prefix, key);
            let (read, index) = client.read_key(&full, Consistency::Default).await?;
            Response::Key { read, index }
        }
        Request::RecordNames { stale } => {
            let (names, index) = client.record_names(prefix, *stale).await?;
            Response::RecordNames { names, index }
        }
    })
}

fn unix_now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Swaps the served state in: the snapshot the responder answers from, the
/// state `/status` shows, and the gauges. `provisional`: the state comes
/// from the state file and no Consul answer was applied since the start
/// ([`Snapshot::provisional`](crate::model::snapshot::Snapshot::provisional):
/// `ready` is not answered).
pub fn publish(shared: &Shared, served: &Arc<ServedState>, provisional: bool) {
    use crate::decision::HoldCause;
    let metrics = &shared.metrics;
    metrics.consul_index.set(served.index as i64);
    metrics.keys.set(served.consul_key_count() as i64);
    metrics.invalid_keys.set(served.invalid_count() as i64);
    for cause in HoldCause::ALL {
        metrics
            .held_keys
            .with_label_values(&[cause.as_str()])
            .set(served.held_count(cause) as i64);
    }
    metrics.held_key.reset();
    let held = served
        .keys
        .iter()
        .filter_map(|(key, record)| Some((key, record, record.hold?)));
    for (key, record, hold) in held.take(crate::agent::metrics::MAX_HELD_KEYS_EXPORTED) {
        let state = crate::decision::held_state(record.served, record.capping());
        metrics
            .held_key
            .with_label_values(&[key, hold.cause.as_str(), &state])
            .set(1);
    }
    metrics
        .invalid_held_keys
        .set(served.held_count(HoldCause::InvalidValue) as i64);
    metrics
        .rollback_held_keys
        .set(served.held_count(HoldCause::RolledBack) as i64);
    metrics
        .store_id_present
        .set(i64::from(served.store_id.is_some()));
    // With the records already read (a scrape reads newer ones).
    let filled = shared.records.fill(served);
    metrics.observe_out_keys(filled.as_ref().unwrap_or(served));
    *shared.served.lock().unwrap() = Some(Arc::clone(served));
    let mut snapshot = served.snapshot();
    snapshot.provisional = provisional;
    shared.snapshot.store(Some(Arc::new(snapshot)));
}

#[cfg(test)]
mod tests;
