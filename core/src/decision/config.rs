//! What the core needs to know of the agent's settings, and the switches
//! for single rules that tests turn off.

use std::time::Duration;

/// What the core needs to know of the agent's settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The watched prefix, ending in `/`.
    pub prefix: String,
    /// `--consistency stale`: blocking reads go to any server.
    pub stale: bool,
    /// `--max-stale`: the oldest `X-Consul-LastContact` a stale answer may
    /// have to be applied. Default [`super::stale::DEFAULT_MAX_STALE`] (5 s).
    pub max_stale: Duration,
    /// The rules in force: all of them, but for tests that show what each
    /// one prevents.
    #[doc(hidden)]
    pub rules: Rules,
}

/// Switches for single rules, all on by default; turned off only by tests
/// that show the simulation finds what each rule prevents.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Read a key the state holds that an answer lacks (ACLs on).
    pub probe_missing: bool,
    /// Treat a vanished or changed [`STORE_ID_KEY`] as lost data.
    pub store_id: bool,
    /// Ask about ACLs again after a failure (Consul may have restarted with
    /// ACLs turned on).
    pub acl_reprobe: bool,
    /// Treat a write generation the served one is not in the history of
    /// as lost data.
    pub generation: bool,
    /// Take an index that went back with nothing moved for a reaped
    /// tombstone, not lost data.
    pub reap: bool,
    /// Re-issue a parked blocking read that an index check shows behind or
    /// cut off.
    pub index_check: bool,
    /// Re-issue a read for being behind only once: the re-issued read asks
    /// at an index Consul is known to be past, so it answers at once, or
    /// slowly, but it is not parked (the daemon's give-up deadline still
    /// bounds it).
    pub reissue_behind_once: bool,
    /// Holds keep the lower side of the order of traffic
    /// ([`crate::model::value::Traffic`]), weights included: a weight that
    /// rises or vanishes in an answer from a store that lost data is held
    /// like a drain that is left.
    pub traffic_order: bool,
    /// Re-issue a parked read from 0 when an index check shows the prefix
    /// below its index (Consul's reset rule: a snapshot restored under it).
    pub reset_below: bool,
    /// Replace a read re-issued for being behind that checks keep showing
    /// behind by a full read, after
    /// [`REPLACE_UNANSWERED_AFTER`](super::REPLACE_UNANSWERED_AFTER) checks.
    pub replace_unanswered: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            probe_missing: true,
            store_id: true,
            acl_reprobe: true,
            generation: true,
            reap: true,
            index_check: true,
            reissue_behind_once: true,
            traffic_order: true,
            reset_below: true,
            replace_unanswered: true,
        }
    }
}
