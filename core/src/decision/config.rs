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

/// One rule of the core that tests turn off, one at a time or a few
/// together, to show the simulation finds what it prevents
/// ([`Rules::without`]). The daemon keeps every rule on.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Read a key the state holds that an answer lacks (ACLs on).
    ProbeMissing,
    /// Treat a vanished or changed [`STORE_ID_KEY`] as lost data.
    ///
    /// [`STORE_ID_KEY`]: crate::model::identity::STORE_ID_KEY
    StoreId,
    /// Ask about ACLs again after a failure (Consul may have restarted with
    /// ACLs turned on).
    AclReprobe,
    /// Treat a write generation the served one is not in the history of
    /// as lost data.
    Generation,
    /// Take an index that went back with nothing moved for a reaped
    /// tombstone, not lost data.
    Reap,
    /// Re-issue a parked blocking read that an index check shows behind or
    /// cut off.
    IndexCheck,
    /// Re-issue a read for being behind only once: the re-issued read asks
    /// at an index Consul is known to be past, so it answers at once, or
    /// slowly, but it is not parked (the daemon's give-up deadline still
    /// bounds it).
    ReissueBehindOnce,
    /// Holds keep the lower side of the order of traffic
    /// ([`crate::model::value::Traffic`]), weights included: a weight that
    /// rises or vanishes in an answer from a store that lost data is held
    /// like a drain that is left.
    TrafficOrder,
    /// Re-issue a parked read from 0 when an index check shows the prefix
    /// below its index (Consul's reset rule: a snapshot restored under it).
    ResetBelow,
    /// Replace a read re-issued for being behind that checks keep showing
    /// behind by a full read, after
    /// [`REPLACE_UNANSWERED_AFTER`](super::REPLACE_UNANSWERED_AFTER) checks.
    ReplaceUnanswered,
    /// With ACLs on, list the names of the writer's records beside the
    /// prefix after a writer transaction, and read directly the keys they
    /// name that the answer does not show.
    ListRecords,
}

/// The rules in force: every [`Rule`] by default, which is what the daemon
/// runs; a test turns single rules off with [`Rules::without`]. Which are
/// off is private: no setting of the agent reaches it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rules {
    /// The rules turned off, one bit per [`Rule`] (`1 << rule as u16`).
    off: u16,
}

impl Rules {
    /// These rules with `rule` turned off (tests only: without it the
    /// agent can give a server more traffic than the newest write allows).
    pub fn without(self, rule: Rule) -> Rules {
        Rules {
            off: self.off | Rules::bit(rule),
        }
    }

    /// Whether `rule` is in force.
    pub(crate) fn on(self, rule: Rule) -> bool {
        self.off & Rules::bit(rule) == 0
    }

    fn bit(rule: Rule) -> u16 {
        1 << rule as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Rule; 11] = [
        Rule::ProbeMissing,
        Rule::StoreId,
        Rule::AclReprobe,
        Rule::Generation,
        Rule::Reap,
        Rule::IndexCheck,
        Rule::ReissueBehindOnce,
        Rule::TrafficOrder,
        Rule::ResetBelow,
        Rule::ReplaceUnanswered,
        Rule::ListRecords,
    ];

    #[test]
    fn every_rule_is_on_by_default_and_turns_off_alone() {
        for rule in ALL {
            assert!(Rules::default().on(rule), "{rule:?} on by default");
            let without = Rules::default().without(rule);
            for other in ALL {
                assert_eq!(
                    without.on(other),
                    other != rule,
                    "{other:?} without {rule:?}"
                );
            }
        }
    }
}
