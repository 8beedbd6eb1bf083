//! The proofs that a `--consul-fallback-addr` is the same Consul as
//! `--consul-addr` ([`crate::agent::route::judge`]): the reads they take,
//! made at start-up and in every probe, and what is said of them (the log,
//! `/status`, `gitlab_haproxy_agent_consul_fallback_refused`).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::{info, warn};

use super::{Watcher, HEARTBEAT_EVERY};
use crate::agent::route::{judge, Expected, Proof, Seen, Step, Verdict};
use crate::cli::Consistency;
use crate::consul::{ConsulClient, ConsulError, ReadMeta};
use crate::decision::KeyRead;
use crate::model::identity::STORE_ID_KEY;

/// What one task of a probe found.
enum Found {
    /// An index check through an address.
    Check(usize, Result<(u64, ReadMeta, bool), ConsulError>),
    /// A fallback's datacenter and store id.
    Proof(usize, Seen<String>, Seen<Option<String>>),
    /// The primary's datacenter.
    Datacenter(Seen<String>),
}

/// An answer as a proof sees it: 403 is the token refused, any other error
/// or a timeout no answer.
fn seen<T>(result: Result<Result<T, ConsulError>, tokio::time::error::Elapsed>) -> Seen<T> {
    match result {
        Ok(Ok(value)) => Seen::Answered(value),
        Ok(Err(e)) if e.is_forbidden() => Seen::Denied,
        _ => Seen::Failed,
    }
}

/// The datacenter of the Consul agent at `client`, within `timeout`.
async fn datacenter(client: &ConsulClient, timeout: Duration) -> Seen<String> {
    seen(tokio::time::timeout(timeout, client.datacenter(timeout)).await)
}

/// The store id under `prefix` through `client`, read `?stale` (the id is
/// written once, so any server that has it answers it, and a server cut
/// off from its leader answers at once), within `timeout`.
async fn store_id(client: &ConsulClient, prefix: &str, timeout: Duration) -> Seen<Option<String>> {
    let key = format!("{prefix}{STORE_ID_KEY}");
    let read = tokio::time::timeout(timeout, client.read_key(&key, Consistency::Stale)).await;
    match read {
        Ok(Ok((KeyRead::Present(pair), _))) => Seen::Answered(Some(
            String::from_utf8_lossy(&pair.value).trim().to_string(),
        )),
        Ok(Ok((KeyRead::Absent, _))) => Seen::Answered(None),
        Ok(Ok((KeyRead::Forbidden, _))) => Seen::Denied,
        other => seen(other.map(|r| r.map(|_| None))),
    }
}

impl Watcher {
    /// How long a proof or a probe's check may take: `--index-check`,
    /// between 500 ms and 5 s (2 s with the checks off).
    pub(super) fn proof_timeout(&self) -> Duration {
        if self.config.index_check.is_zero() {
            return Duration::from_secs(2);
        }
        self.config
            .index_check
            .clamp(Duration::from_millis(500), Duration::from_secs(5))
    }

    /// The identity a fallback must show: our datacenter and the served
    /// state's store id.
    fn expected_store(&self) -> Option<Option<String>> {
        self.core
            .served()
            .map(|s| s.store_id.as_deref().map(str::to_string))
    }

    /// Whether the served state has a store id: an index check that lists
    /// no key then cannot confirm it (the token sees nothing, or the store
    /// is empty).
    pub(super) fn expects_store_id(&self) -> bool {
        self.core.served().is_some_and(|s| s.store_id.is_some())
    }

    /// At start-up, before the first read: learns our datacenter from
    /// `--consul-addr` (unless `--consul-datacenter` pins it) and proves
    /// every fallback at once, each bounded by [`Watcher::proof_timeout`].
    /// With the datacenter pinned it does not wait for a primary that does
    /// not answer.
    pub(super) async fn prove_at_start(&mut self) {
        if self.routes.count() == 1 {
            return;
        }
        let timeout = self.proof_timeout();
        let mut tasks = JoinSet::new();
        let primary = Arc::clone(&self.clients[0]);
        tasks.spawn(async move { Found::Datacenter(datacenter(&primary, timeout).await) });
        for route in 1..self.routes.count() {
            tasks.spawn(prove(
                route,
                Arc::clone(&self.clients[route]),
                self.config.prefix.clone(),
                timeout,
            ));
        }
        let mut observed = Vec::new();
        let mut primary_done = false;
        let deadline = tokio::time::Instant::now() + timeout + Duration::from_millis(500);
        while observed.len() < self.routes.count() - 1
            || !(primary_done || self.config.datacenter.is_some())
        {
            let next = tokio::time::timeout_at(deadline, tasks.join_next()).await;
            match next {
                Ok(Some(Ok(Found::Datacenter(seen)))) => {
                    primary_done = true;
                    self.learn_datacenter(seen);
                }
                Ok(Some(Ok(Found::Proof(route, dc, store)))) => observed.push((route, dc, store)),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.judge_all(observed);
        for route in 1..self.routes.count() {
            if self.routes.proof(route) == Proof::Unproven {
                let why = self.details[route]
                    .clone()
                    .unwrap_or_else(|| "no answer in time".to_string());
                warn!(
                    consul_fallback_addr = %self.clients[route].addr(),
                    "--consul-fallback-addr not proven the same Consul at start-up ({why}); reads will not go through it until it is"
                );
            }
        }
    }

    /// Our datacenter as `--consul-addr` answers it: learned, unless
    /// `--consul-datacenter` pins it (then a difference is warned of).
    fn learn_datacenter(&mut self, seen: Seen<String>) {
        match (seen, self.config.datacenter.as_deref()) {
            (Seen::Answered(theirs), Some(pinned)) if theirs != pinned => {
                warn!(
                    consul_addr = %self.clients[0].addr(),
                    datacenter = %theirs,
                    consul_datacenter = %pinned,
                    "--consul-addr answers for another datacenter than --consul-datacenter; fallbacks are proven against --consul-datacenter"
                );
            }
            (Seen::Answered(theirs), None) if self.datacenter.as_deref() != Some(&theirs) => {
                info!(consul_addr = %self.clients[0].addr(), datacenter = %theirs, "our Consul datacenter, as --consul-addr answers it");
                self.shared.sync.lock().unwrap().datacenter = Some(theirs.clone());
                self.datacenter = Some(theirs);
            }
            (Seen::Denied, None) => {
                warn!(
                    consul_addr = %self.clients[0].addr(),
                    "the token was refused (403) on /v1/agent/self of --consul-addr: our datacenter is not known, so no --consul-fallback-addr can be proven; grant agent read (agent_prefix \"\" {{ policy = \"read\" }}) or set --consul-datacenter"
                );
            }
            _ => {}
        }
    }

    /// Records the proof of fallback `route`: the routes take it, and a
    /// change is logged (a refusal as a warning naming the address and
    /// why), shown on `/status` and counted.
    pub(super) fn record(&mut self, route: usize, verdict: Verdict) {
        let before = self.routes.proof(route);
        let changed =
            before != verdict.proof || self.details[route].as_ref() != Some(&verdict.detail);
        let step = self.routes.on_proof(route, verdict.proof);
        if changed {
            let addr = self.clients[route].addr();
            let state = verdict.proof.as_str();
            let detail = &verdict.detail;
            match verdict.proof {
                Proof::Proven => {
                    info!(consul_fallback_addr = %addr, "--consul-fallback-addr proven the same Consul ({detail}): reads may go through it")
                }
                Proof::Unproven => {
                    info!(consul_fallback_addr = %addr, "--consul-fallback-addr not proven ({detail}): reads will not go through it until it is")
                }
                _ => {
                    warn!(consul_fallback_addr = %addr, state, "--consul-fallback-addr refused, not the same Consul or not for this token ({detail}): reads never go through it")
                }
            }
        }
        self.details[route] = Some(verdict.detail);
        self.publish_proofs();
        if let Step::Switch(to) = step {
            self.switched(
                to,
                "the --consul-fallback-addr in use is no longer proven the same Consul",
            );
        }
    }

    /// Shows every fallback's proof on `/status` and counts the refused.
    pub(super) fn publish_proofs(&self) {
        let fallbacks = (1..self.routes.count())
            .map(|route| crate::agent::shared::FallbackStatus {
                addr: self.clients[route].addr().to_string(),
                state: self.routes.proof(route).as_str(),
                detail: self.details[route].clone(),
            })
            .collect();
        self.shared.sync.lock().unwrap().fallbacks = fallbacks;
        for reason in Proof::REFUSED {
            let count = (1..self.routes.count())
                .filter(|r| self.routes.proof(*r) == reason)
                .count();
            self.shared
                .metrics
                .consul_fallback_refused
                .with_label_values(&[reason.as_str()])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Index checks through the addresses `check` at once, proving those in
    /// `prove` beside theirs (and asking the primary its datacenter while
    /// ours is not known), each bounded by [`Watcher::proof_timeout`], the
    /// watchdog beaten meanwhile: the first address that is usable
    /// ([`crate::agent::route::Routes::usable`]) and answered fresh, if any.
    pub(super) async fn probe(&mut self, check: &[usize], prove: &[usize]) -> Option<usize> {
        let timeout = self.proof_timeout();
        let mut tasks = JoinSet::new();
        for &route in check {
            let client = Arc::clone(&self.clients[route]);
            let prefix = self.config.prefix.clone();
            tasks.spawn(
                async move { Found::Check(route, client.check_index(&prefix, timeout).await) },
            );
        }
        for &route in prove {
            tasks.spawn(prove_task(route, self, timeout));
        }
        let mut asking_primary = false;
        if self.datacenter.is_none() && !prove.is_empty() {
            let primary = Arc::clone(&self.clients[0]);
            tasks.spawn(async move { Found::Datacenter(datacenter(&primary, timeout).await) });
            asking_primary = true;
        }
        let mut fresh = Vec::new();
        let mut observed = Vec::new();
        let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
        loop {
            let done = tokio::select! {
                done = tasks.join_next() => done,
                _ = beat.tick() => {
                    self.beat();
                    continue;
                }
            };
            let Some(done) = done else { break };
            match done {
                Ok(Found::Check(route, result)) => {
                    if self.fresh(&result) {
                        fresh.push(route);
                    }
                }
                Ok(Found::Proof(route, dc, store)) => observed.push((route, dc, store)),
                Ok(Found::Datacenter(seen)) => {
                    asking_primary = false;
                    self.learn_datacenter(seen);
                }
                Err(_) => {}
            }
            if !asking_primary {
                self.judge_all(std::mem::take(&mut observed));
            }
            if let Some(&route) = fresh.iter().find(|r| self.routes.usable(**r)) {
                self.beat();
                return Some(route);
            }
        }
        self.judge_all(observed);
        self.beat();
        let found = fresh.into_iter().find(|r| self.routes.usable(*r));
        if found.is_none() {
            self.find_soon();
        }
        found
    }

    /// Records each proof observed, judged against our datacenter and the
    /// served store id as they are now.
    fn judge_all(&mut self, observed: Vec<(usize, Seen<String>, Seen<Option<String>>)>) {
        if observed.is_empty() {
            return;
        }
        let expected_store = self.expected_store();
        let datacenter = self.datacenter.clone();
        for (route, dc, store) in observed {
            let expected = Expected {
                datacenter: datacenter.as_deref(),
                store_id: expected_store.as_ref().map(|s| s.as_deref()),
            };
            self.record(route, judge(expected, &dc, &store));
        }
    }
}

/// The proof task of fallback `route` in a probe.
fn prove_task(
    route: usize,
    watcher: &Watcher,
    timeout: Duration,
) -> impl std::future::Future<Output = Found> + Send + 'static {
    prove(
        route,
        Arc::clone(&watcher.clients[route]),
        watcher.config.prefix.clone(),
        timeout,
    )
}

/// Reads fallback `route`'s datacenter and store id at once.
async fn prove(
    route: usize,
    client: Arc<ConsulClient>,
    prefix: String,
    timeout: Duration,
) -> Found {
    let (dc, store) = tokio::join!(
        datacenter(&client, timeout),
        store_id(&client, &prefix, timeout)
    );
    Found::Proof(route, dc, store)
}
