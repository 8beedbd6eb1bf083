//! What the watcher, the responder and the HTTP endpoint share: the current
//! snapshot (swapped whole, read without locks), readiness, liveness
//! heartbeats, the watcher's sync status, metrics, and the rows seen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use crate::agent::metrics::Metrics;
use crate::agent::seen::Seen;
use crate::decision::served::ServedState;
use crate::model::snapshot::Snapshot;

/// State shared by every task of a running agent.
pub struct Shared {
    /// The copy of the prefix being served; `None` until the first sync, and
    /// then never `None` again: answers come from the last copy however stale.
    pub snapshot: ArcSwapOption<Snapshot>,
    /// Every metric.
    pub metrics: Metrics,
    /// Start-up latches read by `/-/ready` and sd_notify `READY=1`.
    pub readiness: Readiness,
    /// Proof of life of the watcher loop, for the systemd watchdog.
    pub watcher_heartbeat: Heartbeat,
    /// Proof of life of the responder's accept loop, for the watchdog.
    pub responder_heartbeat: Heartbeat,
    /// How the Consul sync is going, for `/status` and `STATUS=`.
    pub sync: Mutex<SyncStatus>,
    /// Which agent-send lines HAProxy asked about, and when.
    pub seen: Seen,
    /// Unix time the agent started, in seconds.
    pub started_at: f64,
    /// Where the agent reads Consul, for `/status`.
    pub consul_addr: String,
    /// The watched prefix, for `/status`.
    pub prefix: String,
    /// The served state behind [`Shared::snapshot`], with its holds, for
    /// `/status`; replaced whole by the watcher with each change.
    pub served: Mutex<Option<Arc<ServedState>>>,
    /// The state file, for `/status`.
    pub state_file: Mutex<StateFileStatus>,
    /// The writer's records of the keys served, read when `/status` or a
    /// scrape asks, off the path from a write to HAProxy.
    pub records: crate::agent::records::RecordCache,
}

/// What `/status` says of the state file.
#[derive(Debug, Clone, Default)]
pub struct StateFileStatus {
    /// Its path; `None`: no state folder, nothing survives a restart.
    pub path: Option<String>,
    /// The agent started from it (or from its runtime copy).
    pub loaded: bool,
    /// The runtime copy's path; `None`: no runtime folder.
    pub runtime_copy: Option<String>,
    /// The start served the runtime copy, newer than the file.
    pub loaded_runtime_copy: bool,
    /// Why it was not used at start-up (missing, unreadable, malformed).
    pub load_error: Option<String>,
    /// The last write failed with this error.
    pub write_error: Option<String>,
}

impl Shared {
    /// A fresh state: unsynced, not ready, empty metrics.
    pub fn new(consul_addr: &str, prefix: &str) -> Arc<Self> {
        Arc::new(Shared {
            snapshot: ArcSwapOption::empty(),
            metrics: Metrics::new(),
            readiness: Readiness::new(),
            watcher_heartbeat: Heartbeat::new(),
            responder_heartbeat: Heartbeat::new(),
            sync: Mutex::new(SyncStatus::default()),
            seen: Seen::default(),
            started_at: crate::agent::metrics::unix_now(),
            consul_addr: consul_addr.to_string(),
            prefix: prefix.to_string(),
            served: Mutex::new(None),
            state_file: Mutex::new(StateFileStatus::default()),
            records: crate::agent::records::RecordCache::new(prefix),
        })
    }
}

/// The watcher's view of Consul, for humans.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    /// Wall-clock time of the last successful sync.
    pub last_sync: Option<SystemTime>,
    /// When the current Consul outage started, if one is going on.
    pub failing_since: Option<Instant>,
    /// The last Consul error, kept until the next success.
    pub last_error: Option<String>,
    /// When the state served was last confirmed to be Consul's latest (an
    /// answer, or an index check while a blocking read is parked), less
    /// the answering server's `X-Consul-LastContact`.
    pub confirmed_at: Option<Instant>,
    /// The `--consul-fallback-addr` reads go through; `None`: the primary,
    /// `--consul-addr`.
    pub reading_through: Option<String>,
    /// Our Consul datacenter: `--consul-datacenter`, else the one
    /// `--consul-addr` answered on `/v1/agent/self`; `None` while unknown.
    pub datacenter: Option<String>,
    /// Each `--consul-fallback-addr`, in order, with its proof.
    pub fallbacks: Vec<FallbackStatus>,
    /// Where the fallbacks come from: `found` (from Consul), `listed`
    /// (`--consul-fallback-addr`) or `none`.
    pub fallbacks_from: &'static str,
    /// The last read of the servers for fallbacks, while they are found.
    pub discovery: Option<DiscoveryStatus>,
}

/// What `/status` says of the last read of the servers for fallbacks
/// ([`crate::agent::discovery`]).
#[derive(Debug, Clone, Default)]
pub struct DiscoveryStatus {
    /// The address that answered the last list.
    pub through: Option<String>,
    /// When it answered.
    pub at: Option<std::time::SystemTime>,
    /// The raft peers it named, as given.
    pub peers: Vec<String>,
    /// The last read's error, if it failed (the list in use is kept).
    pub error: Option<String>,
}

/// What `/status` says of one `--consul-fallback-addr`.
#[derive(Debug, Clone)]
pub struct FallbackStatus {
    /// Its address.
    pub addr: String,
    /// Its proof ([`crate::agent::route::Proof::as_str`]): `proven`,
    /// `unproven`, `other_datacenter`, `other_store` or `denied`.
    pub state: &'static str,
    /// Why: the datacenters or store ids compared, or what failed.
    pub detail: Option<String>,
}

/// How long after its last confirmation the agent still says it serves
/// Consul's latest state (`/status` `consul_current`): 5 s, two and a half
/// index checks at the default `--index-check` of 2 s.
pub const CURRENT_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl SyncStatus {
    /// Seconds since the state served was last confirmed to be Consul's
    /// latest; `None` before the first confirmation.
    pub fn unconfirmed_for(&self) -> Option<std::time::Duration> {
        self.confirmed_at.map(|t| t.elapsed())
    }
}

/// Start-up steps that must all be done before the agent is ready: both
/// listeners bound and the first Consul snapshot applied.
pub struct Readiness {
    responder_bound: AtomicBool,
    http_bound: AtomicBool,
    synced: AtomicBool,
    changed: watch::Sender<bool>,
}

/// One start-up step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyStep {
    /// The agent-check listener is bound.
    ResponderBound,
    /// The HTTP listener is bound.
    HttpBound,
    /// The first Consul snapshot is applied.
    Synced,
}

impl Readiness {
    fn new() -> Self {
        Readiness {
            responder_bound: AtomicBool::new(false),
            http_bound: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            changed: watch::channel(false).0,
        }
    }

    /// Marks one step done. Steps are latches: they never go back.
    pub fn set(&self, step: ReadyStep) {
        let flag = match step {
            ReadyStep::ResponderBound => &self.responder_bound,
            ReadyStep::HttpBound => &self.http_bound,
            ReadyStep::Synced => &self.synced,
        };
        flag.store(true, Ordering::Release);
        let ready = self.is_ready();
        self.changed.send_replace(ready);
    }

    /// True once every step is done.
    pub fn is_ready(&self) -> bool {
        self.responder_bound.load(Ordering::Acquire)
            && self.http_bound.load(Ordering::Acquire)
            && self.synced.load(Ordering::Acquire)
    }

    /// True once the first snapshot is applied.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits until every step is done.
    pub async fn wait(&self) {
        let mut rx = self.changed.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// The time a loop last proved it was running, as milliseconds since an
/// origin fixed at creation.
pub struct Heartbeat {
    origin: Instant,
    last_ms: AtomicU64,
}

impl Heartbeat {
    fn new() -> Self {
        Heartbeat {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Records that the loop is alive now.
    pub fn beat(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        let now = self.origin.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_only_after_every_step() {
        let r = Readiness::new();
        r.set(ReadyStep::ResponderBound);
        r.set(ReadyStep::Synced);
        assert!(!r.is_ready());
        assert!(r.is_synced());
        r.set(ReadyStep::HttpBound);
        assert!(r.is_ready());
        tokio::time::timeout(Duration::from_secs(1), r.wait())
            .await
            .expect("wait returns once ready");
    }
}
