//! Which Consul address the watcher reads through: the node's own Consul
//! agent (`--consul-addr`, the primary) or, while that one cannot confirm
//! the state served, one of `--consul-fallback-addr`.
//!
//! A Consul client agent sends every RPC to one server and moves to another
//! only once an RPC to it fails, and a server cut off from the quorum holds
//! each default read for Consul's `rpc_hold_timeout` (7 s, a server setting)
//! before it fails. So a load balancer whose client agent sends to the wrong
//! side of a partition serves nothing new for 7 to 33 s however often the
//! agent re-issues its read (BENCHMARKS.md, "Client agents pinned to the cut
//! server"). A second way into the same datacenter (another client agent, or
//! the servers themselves) ends that within an index check:
//!
//! - an index check through the address in use that cannot confirm (it
//!   failed, or its server knows no leader or has lost contact with it for
//!   over `--max-stale`) has every other address checked at once, and reads
//!   move to the first whose check answers fresh;
//! - a request through the address in use that fails (not one refused by
//!   the ACLs) moves reads to the next address, so a local Consul agent
//!   that is down or restarting does not stop the reads either;
//! - a request refused by the ACLs (403) through a fallback takes reads back
//!   to the primary: the token's rights there are the ones the agent
//!   answers to, and a fallback that does not know the token must not hold
//!   reads where no index check asks the primary;
//! - while reads go through a fallback, every [`PRIMARY_RETRY_CHECKS`]-th
//!   index check asks the primary instead, and a fresh answer takes the reads
//!   back to it.
//!
//! The address changes nothing the decision core decides: every address
//! reaches the same Raft log, so a default read answers the same index and
//! keys through any of them, and a stale answer from a server behind is held
//! by the core's stale rules ([`crate::decision::stale`]). Pure: no I/O, no
//! clock; the watcher performs what it says.

/// While reads go through a fallback, every this many index checks one asks
/// the primary: 15, every 30 s at the default `--index-check` of 2 s.
pub const PRIMARY_RETRY_CHECKS: u32 = 15;

/// What to do after an index check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Stay,
    /// Check these addresses (indexes into the list, the primary 0) at once,
    /// and hand the first to answer fresh to [`Routes::on_probes`].
    Probe(Vec<usize>),
    /// Reads now go through this address: re-issue the read in flight
    /// through it.
    Switch(usize),
}

/// The addresses reads may go through and the one in use. Index 0 is the
/// primary (`--consul-addr`), 1.. the fallbacks in the order given.
#[derive(Debug, Clone)]
pub struct Routes {
    count: usize,
    current: usize,
    /// Index checks made since reads moved to a fallback.
    checks: u32,
}

impl Routes {
    /// `count` addresses (at least 1: the primary alone never moves).
    pub fn new(count: usize) -> Self {
        Routes {
            count: count.max(1),
            current: 0,
            checks: 0,
        }
    }

    /// The address reads go through now.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The address the next index check goes through: the one in use, or,
    /// every [`PRIMARY_RETRY_CHECKS`]-th check while reads go through a
    /// fallback, the primary.
    pub fn next_check(&mut self) -> usize {
        if self.current == 0 {
            return 0;
        }
        self.checks += 1;
        if self.checks % PRIMARY_RETRY_CHECKS == 0 {
            0
        } else {
            self.current
        }
    }

    /// An index check through `route` answered fresh (a server that knows
    /// its leader, within `--max-stale`) or not (failed, no leader, too
    /// old).
    pub fn on_check(&mut self, route: usize, fresh: bool) -> Step {
        if self.count == 1 {
            return Step::Stay;
        }
        if route == self.current {
            if fresh {
                return Step::Stay;
            }
            return Step::Probe((0..self.count).filter(|r| *r != self.current).collect());
        }
        if route == 0 && fresh {
            return self.switch(0);
        }
        Step::Stay
    }

    /// The address of a [`Step::Probe`] whose check answered fresh first:
    /// reads move to it; none, they stay.
    pub fn on_probes(&mut self, fresh: Option<usize>) -> Step {
        match fresh {
            Some(r) if r < self.count && r != self.current => self.switch(r),
            _ => Step::Stay,
        }
    }

    /// A request through `route` failed (not refused by the ACLs): while
    /// it is the one in use, reads move to the next address (the last one
    /// wraps to the primary).
    pub fn on_failure(&mut self, route: usize) -> Step {
        if self.count == 1 || route != self.current {
            return Step::Stay;
        }
        self.switch((self.current + 1) % self.count)
    }

    /// A request through `route` was refused by the ACLs (403): through a
    /// fallback in use, reads go back to the primary; through the primary,
    /// the refusal stands (the core handles it).
    pub fn on_refused(&mut self, route: usize) -> Step {
        if route != self.current || route == 0 {
            return Step::Stay;
        }
        self.switch(0)
    }

    fn switch(&mut self, to: usize) -> Step {
        self.current = to;
        self.checks = 0;
        Step::Switch(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_alone_never_moves() {
        let mut r = Routes::new(1);
        assert_eq!(r.on_check(0, false), Step::Stay);
        assert_eq!(r.on_failure(0), Step::Stay);
        assert_eq!(r.next_check(), 0);
        assert_eq!(r.current(), 0);
    }

    #[test]
    fn a_check_that_cannot_confirm_probes_every_other_address() {
        let mut r = Routes::new(3);
        assert_eq!(r.on_check(0, true), Step::Stay);
        assert_eq!(r.on_check(0, false), Step::Probe(vec![1, 2]));
        assert_eq!(r.current(), 0, "a probe alone moves nothing");
    }

    #[test]
    fn reads_move_to_the_address_a_probe_found_fresh() {
        let mut r = Routes::new(3);
        assert_eq!(r.on_probes(Some(1)), Step::Switch(1));
        assert_eq!(r.current(), 1);
        // From a fallback, the primary is probed too.
        assert_eq!(r.on_check(1, false), Step::Probe(vec![0, 2]));
        assert_eq!(r.on_probes(None), Step::Stay);
        assert_eq!(r.on_probes(Some(2)), Step::Switch(2));
        assert_eq!(r.on_probes(Some(3)), Step::Stay, "no such address");
        assert_eq!(r.on_probes(Some(0)), Step::Switch(0));
    }

    #[test]
    fn a_failed_request_moves_to_the_next_address_and_wraps() {
        let mut r = Routes::new(3);
        assert_eq!(r.on_failure(0), Step::Switch(1));
        assert_eq!(r.on_failure(0), Step::Stay, "not the address in use");
        assert_eq!(r.on_failure(1), Step::Switch(2));
        assert_eq!(r.on_failure(2), Step::Switch(0));
    }

    #[test]
    fn a_refusal_through_a_fallback_takes_reads_back_to_the_primary() {
        let mut r = Routes::new(3);
        assert_eq!(r.on_refused(0), Step::Stay, "the primary's refusal stands");
        r.on_probes(Some(2));
        assert_eq!(r.on_refused(1), Step::Stay, "not the address in use");
        assert_eq!(r.on_refused(2), Step::Switch(0));
        assert_eq!(r.current(), 0);
    }

    #[test]
    fn on_a_fallback_every_fifteenth_check_asks_the_primary_and_a_fresh_one_takes_reads_back() {
        let mut r = Routes::new(2);
        r.on_failure(0);
        let routes: Vec<usize> = (0..2 * PRIMARY_RETRY_CHECKS)
            .map(|_| r.next_check())
            .collect();
        let primary: Vec<usize> = (0..routes.len()).filter(|i| routes[*i] == 0).collect();
        let at = PRIMARY_RETRY_CHECKS as usize;
        assert_eq!(primary, vec![at - 1, 2 * at - 1]);
        // The primary still cut off: reads stay.
        assert_eq!(r.on_check(0, false), Step::Stay);
        assert_eq!(r.current(), 1);
        assert_eq!(r.on_check(0, true), Step::Switch(0));
        assert_eq!(r.next_check(), 0);
    }

    #[test]
    fn a_late_check_through_an_address_left_changes_nothing() {
        let mut r = Routes::new(3);
        r.on_probes(Some(2));
        assert_eq!(r.on_check(1, false), Step::Stay);
        assert_eq!(r.on_check(1, true), Step::Stay);
        assert_eq!(r.current(), 2);
    }
}
