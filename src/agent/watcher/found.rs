//! Keeps the fallbacks found from Consul current
//! ([`crate::agent::discovery`]): reads `/v1/status/peers` in a task of its
//! own every `--consul-fallback-refresh` (5 s after a read that failed, or
//! after a probe that found no fallback fresh), through the address reads
//! go through, else the primary, else a proven fallback, and hands the
//! list to the routes between requests. What is said of it: the log,
//! `/status` `consul_fallback_discovery`,
//! `gitlab_haproxy_agent_consul_fallbacks_found` and
//! `gitlab_haproxy_agent_consul_fallback_discovery_failures_total`.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Watcher;
use crate::agent::discovery::{self, RETRY_AFTER};
use crate::agent::finder::Answer;
use crate::agent::route::Step;
use crate::agent::shared::DiscoveryStatus;
use crate::consul::{ConsulClient, ConsulError};

impl Watcher {
    /// Starts a read of the servers when one is due and none is in flight.
    pub(super) fn find_due(&mut self) {
        let Some(finder) = &self.finder else { return };
        if finder.task.is_some() || Instant::now() < finder.due {
            return;
        }
        let order = discovery::sources(self.routes.current(), self.routes.count(), |r| {
            self.routes.usable(r)
        });
        let clients: Vec<Arc<ConsulClient>> = order
            .iter()
            .map(|r| Arc::clone(&self.clients[*r]))
            .collect();
        let timeout = self.proof_timeout();
        let task = tokio::spawn(async move {
            let mut last = None;
            for client in clients {
                match client.raft_peers(timeout).await {
                    Ok(peers) => return (Some(client.addr().to_string()), Ok(peers)),
                    Err(e) => last = Some(e),
                }
            }
            (None, Err(last.expect("the address in use is always asked")))
        });
        let finder = self.finder.as_mut().expect("checked above");
        finder.started = Some(Instant::now());
        finder.task = Some(task);
    }

    /// A probe found no fallback fresh: the list may be out of date, so it
    /// is read again soon ([`RETRY_AFTER`] after the last read started).
    pub(super) fn find_soon(&mut self) {
        if let Some(finder) = &mut self.finder {
            let soon = finder
                .started
                .map_or_else(Instant::now, |s| s + RETRY_AFTER);
            finder.due = finder.due.min(soon);
        }
    }

    /// Whether a read of the servers is in flight.
    pub(super) fn finding(&self) -> bool {
        self.finder.as_ref().is_some_and(|f| f.task.is_some())
    }

    /// Awaits the read in flight (pending forever with none).
    pub(super) async fn found(&mut self) -> Answer {
        let task = self.finder.as_mut().and_then(|f| f.task.as_mut());
        match task {
            Some(task) => task.await.unwrap_or_else(|e| {
                (
                    None,
                    Err(ConsulError::Decode(format!(
                        "the read of the servers ended: {e}"
                    ))),
                )
            }),
            None => std::future::pending().await,
        }
    }

    /// Applies a read that has ended, if one has: between requests.
    pub(super) async fn apply_found_if_done(&mut self) {
        let done = self
            .finder
            .as_ref()
            .and_then(|f| f.task.as_ref())
            .is_some_and(JoinHandle::is_finished);
        if done {
            let answer = self.found().await;
            self.apply_found(answer);
        }
    }

    /// At start-up, before the fallbacks are proven: one read, bounded by
    /// [`Watcher::proof_timeout`], applied.
    pub(super) async fn find_at_start(&mut self) {
        self.find_due();
        if !self.finding() {
            return;
        }
        let limit = self.proof_timeout() + std::time::Duration::from_millis(500);
        if let Ok(answer) = tokio::time::timeout(limit, self.found()).await {
            self.apply_found(answer);
        }
    }

    /// Takes a read that ended: the list in use replaced by what it found
    /// (proofs of the addresses kept, the new ones unproven), or kept on an
    /// error. True when the address reads go through moved or changed its
    /// index: the caller re-issues a read parked through it.
    pub(super) fn apply_found(&mut self, (through, result): Answer) -> bool {
        let Some(finder) = &mut self.finder else {
            return false;
        };
        finder.task = None;
        let metrics = &self.shared.metrics;
        let peers = match result {
            Err(e) => {
                finder.due = Instant::now() + RETRY_AFTER;
                metrics
                    .consul_fallback_discovery_failures
                    .with_label_values(&["request"])
                    .inc();
                if !finder.failing {
                    warn!(error = %e, "cannot read the Consul servers (/v1/status/peers) for fallbacks; the list in use is kept and read again every 5 s");
                }
                finder.failing = true;
                let mut sync = self.shared.sync.lock().unwrap();
                sync.discovery.get_or_insert_with(Default::default).error = Some(e.to_string());
                return false;
            }
            Ok(peers) => peers,
        };
        finder.due = Instant::now() + finder.discovery.refresh;
        if finder.failing {
            info!(
                consul_addr = through.as_deref().unwrap_or(""),
                "the Consul servers are read again for fallbacks"
            );
        }
        finder.failing = false;
        let found = discovery::addresses(&peers, &finder.discovery, self.clients[0].addr());
        let make = Arc::clone(&finder.make);
        if !found.bad.is_empty() {
            metrics
                .consul_fallback_discovery_failures
                .with_label_values(&["bad_peer"])
                .inc_by(found.bad.len() as u64);
            warn!(peers = ?found.bad, "Consul named raft peers that are not ip:port; they are not used as fallbacks");
        }
        *self
            .shared
            .sync
            .lock()
            .unwrap()
            .discovery
            .get_or_insert_with(Default::default) = DiscoveryStatus {
            through,
            at: Some(SystemTime::now()),
            peers,
            error: None,
        };
        let current: Vec<String> = self.clients[1..]
            .iter()
            .map(|c| c.addr().to_string())
            .collect();
        let Some(refit) = discovery::update(&current, &found.addrs) else {
            return false;
        };
        let mut clients = Vec::with_capacity(refit.keep.len());
        let mut details = Vec::with_capacity(refit.keep.len());
        for (i, keep) in refit.keep.iter().enumerate() {
            let client = match keep {
                Some(old) => Arc::clone(&self.clients[*old]),
                None => match make(&refit.list[i - 1]) {
                    Ok(client) => Arc::new(client),
                    Err(e) => {
                        warn!(error = %e, "cannot build a Consul client for the servers found; the list in use is kept");
                        return false;
                    }
                },
            };
            clients.push(client);
            details.push(keep.and_then(|old| self.details[old].clone()));
        }
        let before = self.routes.current();
        let step = self.routes.refit(&refit.keep);
        self.clients = clients;
        self.details = details;
        info!(
            added = %refit.added.join(","),
            removed = %refit.removed.join(","),
            consul_fallback_addrs = %refit.list.join(","),
            "Consul servers found for fallbacks: each is proven the same Consul before reads go through it"
        );
        self.shared
            .metrics
            .consul_fallbacks_found
            .set(i64::try_from(refit.list.len()).unwrap_or(i64::MAX));
        self.publish_proofs();
        match step {
            Step::Switch(to) => {
                self.switched(
                    to,
                    "the fallback in use is no longer among the Consul servers found",
                );
                true
            }
            _ if self.routes.current() != before => {
                self.shared
                    .metrics
                    .consul_route
                    .set(i64::try_from(self.routes.current()).unwrap_or(i64::MAX));
                true
            }
            _ => false,
        }
    }
}
