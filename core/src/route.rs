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
//! A fallback is used only once it is proven the same Consul as the
//! primary ([`judge`]): the same datacenter (`/v1/agent/self`
//! `Config.Datacenter`, against `--consul-datacenter` or the primary's) and
//! the same store (the store id key [`STORE_ID_KEY`] under the prefix,
//! against the one the served state holds), both read with the agent's
//! token. Consul's default datacenter name is `dc1` everywhere, so the
//! name alone does not tell two clusters apart; the store id does, and the
//! datacenter tells a prefix copied into another datacenter (consul-replicate)
//! from its source. A fallback that is not proven is never read through on
//! a failure alone; one whose own request fails, or whose token is refused,
//! is proven again before it is used again.
//!
//! Through a proven address the routes change nothing the decision core
//! decides: every such address reaches the same Raft log, so a default read
//! answers the same index and keys through any of them, and a stale answer
//! from a server behind is held by the core's stale rules
//! ([`crate::decision::stale`]). Pure: no I/O, no clock; the watcher
//! performs what it says and hands back what it found, proofs included.
//!
//! [`STORE_ID_KEY`]: crate::model::identity::STORE_ID_KEY

/// While reads go through a fallback, every this many index checks one asks
/// the primary: 15, every 30 s at the default `--index-check` of 2 s.
pub const PRIMARY_RETRY_CHECKS: u32 = 15;

/// A fallback refused by its proof (another datacenter or store, or the
/// token denied) is proven again at every this many probes that could use
/// it: 15, about every 30 s of a primary that cannot confirm at the default
/// `--index-check` of 2 s. An unproven one is proven at every probe.
pub const REPROVE_EVERY_PROBES: u32 = 15;

/// What a fallback address was found to be. The primary is [`Proof::Proven`]
/// by definition: it is the Consul the agent answers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// Not proven yet, or since its own failure: its last proof could not be
    /// made (no answer, an error, or our own datacenter not known yet).
    Unproven,
    /// The same datacenter and the same store: reads may go through it.
    Proven,
    /// Its Consul agent answers for another datacenter.
    OtherDatacenter,
    /// The same datacenter, another store: its store id differs from the
    /// served state's, or it has none (or one) where the served state has
    /// one (none).
    OtherStore,
    /// Its Consul refused the agent's token (403) on `/v1/agent/self` or
    /// the store id, or on a request while reads went through it.
    Denied,
}

impl Proof {
    /// Every value, in the order `/status` and the metric list them.
    pub const ALL: [Proof; 5] = [
        Proof::Proven,
        Proof::Unproven,
        Proof::OtherDatacenter,
        Proof::OtherStore,
        Proof::Denied,
    ];

    /// The refusals, the `reason` label of
    /// `gitlab_haproxy_agent_consul_fallback_refused`.
    pub const REFUSED: [Proof; 3] = [Proof::OtherDatacenter, Proof::OtherStore, Proof::Denied];

    /// The name `/status`, the log and the metric use: `proven`,
    /// `unproven`, `other_datacenter`, `other_store`, `denied`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proof::Unproven => "unproven",
            Proof::Proven => "proven",
            Proof::OtherDatacenter => "other_datacenter",
            Proof::OtherStore => "other_store",
            Proof::Denied => "denied",
        }
    }

    /// A proof that refuses the address: another datacenter or store, or
    /// the token denied.
    pub fn refused(self) -> bool {
        matches!(
            self,
            Proof::OtherDatacenter | Proof::OtherStore | Proof::Denied
        )
    }
}

/// What one read of a proof found through an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen<T> {
    /// It answered this.
    Answered(T),
    /// 403: Consul refused the agent's token.
    Denied,
    /// No answer in time, or an error other than 403.
    Failed,
}

/// The identity an address must show to be proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// Our datacenter: `--consul-datacenter`, else the primary's
    /// `/v1/agent/self`; `None` while neither is known.
    pub datacenter: Option<&'a str>,
    /// The served state's store id: `Some(None)` for a served state without
    /// one, `None` before any state is served. A fallback is proven only by
    /// a store id both hold: with none on either side, or nothing served
    /// yet, it stays unproven.
    pub store_id: Option<Option<&'a str>>,
}

/// A proof's outcome, with what a human needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The outcome.
    pub proof: Proof,
    /// Why, for the log and `/status`: the datacenters or store ids
    /// compared, or the read that was refused or failed.
    pub detail: String,
}

/// Judges one address from its `/v1/agent/self` datacenter and its store id
/// (`None`: the key is absent). Another datacenter is named first, then a
/// token refused, then a read that failed, then the store ids compared.
/// Pure.
pub fn judge(
    expected: Expected<'_>,
    datacenter: &Seen<String>,
    store_id: &Seen<Option<String>>,
) -> Verdict {
    let verdict = |proof, detail: String| Verdict { proof, detail };
    if let (Some(ours), Seen::Answered(theirs)) = (expected.datacenter, datacenter) {
        if theirs != ours {
            return verdict(
                Proof::OtherDatacenter,
                format!("its datacenter is {theirs:?}, ours {ours:?}"),
            );
        }
    }
    if *datacenter == Seen::Denied {
        return verdict(
            Proof::Denied,
            "the token was refused (403) on /v1/agent/self: it needs agent read there (agent_prefix \"\" { policy = \"read\" })".into(),
        );
    }
    if *store_id == Seen::Denied {
        return verdict(
            Proof::Denied,
            "the token was refused (403) on the store id: that Consul does not know the token or denies the prefix".into(),
        );
    }
    let (Seen::Answered(theirs), Seen::Answered(store)) = (datacenter, store_id) else {
        return verdict(
            Proof::Unproven,
            "no answer to /v1/agent/self or the store id in time".into(),
        );
    };
    let Some(ours) = expected.datacenter else {
        return verdict(
            Proof::Unproven,
            format!("its datacenter is {theirs:?}; ours is not known yet (--consul-addr has not answered /v1/agent/self and no --consul-datacenter)"),
        );
    };
    let show = |id: Option<&str>| id.map_or("none".to_string(), |id| format!("{id:?}"));
    // Datacenters share names (every Consul is `dc1` unless told
    // otherwise): only a store id both sides hold proves the same store.
    match (expected.store_id, store.as_deref()) {
        (Some(Some(ours_id)), Some(theirs)) if ours_id == theirs => verdict(
            Proof::Proven,
            format!("datacenter {ours:?}, store id {theirs:?}"),
        ),
        (Some(ours_id), theirs) if ours_id.is_some() || theirs.is_some() => verdict(
            Proof::OtherStore,
            format!(
                "datacenter {ours:?}, but its store id is {}, ours {}",
                show(theirs),
                show(ours_id)
            ),
        ),
        (Some(_), _) => verdict(
            Proof::Unproven,
            format!(
                "datacenter {ours:?}, but neither it nor the state served has a store id (`~store-id`, which the writer creates: `gitlab-haproxy-agent state release-rollback` creates it): another Consul of the same name cannot be told from ours"
            ),
        ),
        (None, _) => verdict(
            Proof::Unproven,
            format!(
                "datacenter {ours:?}; no state served yet to compare its store id with (proven again once Consul has answered)"
            ),
        ),
    }
}

/// The routing rules that can be turned off, for tests and the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRules {
    /// A fallback is read through only once proven ([`judge`]); refused or
    /// failed ones are proven again first. Off: any address whose index
    /// check answers fresh, or the next one after a failure, is used (the
    /// rule before proofs). Default on.
    pub prove_identity: bool,
}

impl Default for RouteRules {
    fn default() -> Self {
        RouteRules {
            prove_identity: true,
        }
    }
}

/// What to do after an index check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Stay,
    /// Check these addresses (indexes into the list, the primary 0) at once,
    /// proving those in `prove` first ([`Routes::on_proof`]), and hand the
    /// first that is proven and answers fresh to [`Routes::on_probes`].
    Probe {
        /// Addresses to index-check.
        check: Vec<usize>,
        /// Of those, the ones to prove ([`judge`]) beside the check.
        prove: Vec<usize>,
    },
    /// Reads now go through this address: re-issue the read in flight
    /// through it.
    Switch(usize),
}

/// The addresses reads may go through and the one in use. Index 0 is the
/// primary (`--consul-addr`), 1.. the fallbacks in the order given.
#[derive(Debug, Clone)]
pub struct Routes {
    rules: RouteRules,
    current: usize,
    /// Index checks made since reads moved to a fallback.
    checks: u32,
    /// Each address's proof; the primary's is always [`Proof::Proven`].
    proofs: Vec<Proof>,
    /// Probes since each address was last proven (or refused).
    since_proof: Vec<u32>,
}

impl Routes {
    /// `count` addresses (at least 1: the primary alone never moves), the
    /// fallbacks unproven, with the default rules.
    pub fn new(count: usize) -> Self {
        Self::with_rules(count, RouteRules::default())
    }

    /// As [`Routes::new`], with `rules`.
    pub fn with_rules(count: usize, rules: RouteRules) -> Self {
        let count = count.max(1);
        let mut proofs = vec![Proof::Unproven; count];
        proofs[0] = Proof::Proven;
        Routes {
            rules,
            current: 0,
            checks: 0,
            proofs,
            since_proof: vec![0; count],
        }
    }

    /// How many addresses there are, the primary included.
    pub fn count(&self) -> usize {
        self.proofs.len()
    }

    /// The address reads go through now.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The proof of address `route` (the primary's is always proven).
    pub fn proof(&self, route: usize) -> Proof {
        self.proofs.get(route).copied().unwrap_or(Proof::Unproven)
    }

    /// Whether reads may go through `route`: the primary, or a proven
    /// fallback (any fallback with [`RouteRules::prove_identity`] off).
    pub fn usable(&self, route: usize) -> bool {
        route < self.count() && (!self.rules.prove_identity || self.proof(route) == Proof::Proven)
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
    /// its leader, within `--max-stale`, and an answer that can confirm) or
    /// not (failed, no leader, too old, or an empty list where the served
    /// state has a store id). A fallback in use that cannot confirm is
    /// proven again before it is used again.
    pub fn on_check(&mut self, route: usize, fresh: bool) -> Step {
        if self.count() == 1 {
            return Step::Stay;
        }
        if route == self.current {
            if fresh {
                return Step::Stay;
            }
            if route != 0 && self.rules.prove_identity {
                self.proofs[route] = Proof::Unproven;
            }
            return self.probe();
        }
        if route == 0 && fresh {
            return self.switch(0);
        }
        Step::Stay
    }

    /// The probe after the address in use could not confirm: every other
    /// address that is usable or due to be proven is checked, and those not
    /// proven are proven beside their check.
    fn probe(&mut self) -> Step {
        let mut check = Vec::new();
        let mut prove = Vec::new();
        for r in (0..self.count()).filter(|r| *r != self.current) {
            if self.usable(r) {
                check.push(r);
                continue;
            }
            self.since_proof[r] += 1;
            let due = match self.proofs[r] {
                Proof::Unproven => true,
                _ => self.since_proof[r] >= REPROVE_EVERY_PROBES,
            };
            if due {
                check.push(r);
                prove.push(r);
            }
        }
        if check.is_empty() {
            return Step::Stay;
        }
        Step::Probe { check, prove }
    }

    /// The proof of `route` was made: recorded. A fallback in use that is
    /// no longer proven gives the reads back to the primary.
    pub fn on_proof(&mut self, route: usize, proof: Proof) -> Step {
        if route == 0 || route >= self.count() {
            return Step::Stay;
        }
        self.proofs[route] = proof;
        self.since_proof[route] = 0;
        if route == self.current && !self.usable(route) {
            return self.switch(0);
        }
        Step::Stay
    }

    /// The identity the fallbacks were proven against changed (the served
    /// state's store id): every fallback but the one in use, through which
    /// the change was read, is proven again before it is used.
    pub fn on_identity_changed(&mut self) {
        for r in 1..self.count() {
            if r != self.current && self.proofs[r] == Proof::Proven {
                self.proofs[r] = Proof::Unproven;
            }
        }
    }

    /// The address of a [`Step::Probe`] that is proven and whose check
    /// answered fresh first: reads move to it; none, they stay.
    pub fn on_probes(&mut self, fresh: Option<usize>) -> Step {
        match fresh {
            Some(r) if r != self.current && self.usable(r) => self.switch(r),
            _ => Step::Stay,
        }
    }

    /// A request through `route` failed (not refused by the ACLs): while
    /// it is the one in use, reads move to the next usable address (after
    /// the last, the primary); with none, the others due a proof are
    /// probed ([`Step::Probe`]). A fallback whose own request failed is
    /// proven again before it is used again.
    pub fn on_failure(&mut self, route: usize) -> Step {
        if self.count() == 1 || route != self.current {
            return Step::Stay;
        }
        if route != 0 && self.rules.prove_identity {
            self.proofs[route] = Proof::Unproven;
        }
        let next = (1..self.count())
            .map(|i| (self.current + i) % self.count())
            .find(|r| self.usable(*r));
        match next {
            Some(to) => self.switch(to),
            None => self.probe(),
        }
    }

    /// A request through `route` was refused by the ACLs (403): through a
    /// fallback in use, it is [`Proof::Denied`] and reads go back to the
    /// primary; through the primary, the refusal stands (the core handles
    /// it).
    pub fn on_refused(&mut self, route: usize) -> Step {
        if route != self.current || route == 0 {
            return Step::Stay;
        }
        if self.rules.prove_identity {
            self.proofs[route] = Proof::Denied;
            self.since_proof[route] = 0;
        }
        self.switch(0)
    }

    /// The fallbacks changed (found again from Consul,
    /// [`crate::agent::discovery::update`]): `keep[i]` is, for address `i`
    /// of the new list (0 the primary), the index it had in the old one,
    /// whose proof it keeps, or `None` for a new address, unproven. Reads
    /// through a fallback no longer listed go back to the primary
    /// ([`Step::Switch`]); through one kept, they stay on it at its new
    /// index ([`Routes::current`]).
    pub fn refit(&mut self, keep: &[Option<usize>]) -> Step {
        let old = |r: &Option<usize>| r.filter(|o| *o < self.count());
        let proofs: Vec<Proof> = keep
            .iter()
            .map(|r| old(r).map_or(Proof::Unproven, |o| self.proofs[o]))
            .collect();
        let since: Vec<u32> = keep
            .iter()
            .map(|r| old(r).map_or(0, |o| self.since_proof[o]))
            .collect();
        let current = keep.iter().position(|r| old(r) == Some(self.current));
        self.proofs = proofs;
        self.since_proof = since;
        if self.proofs.is_empty() {
            self.proofs.push(Proof::Proven);
            self.since_proof.push(0);
        }
        self.proofs[0] = Proof::Proven;
        match current {
            Some(now) => {
                self.current = now;
                Step::Stay
            }
            None => self.switch(0),
        }
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

    fn probe(check: &[usize], prove: &[usize]) -> Step {
        Step::Probe {
            check: check.to_vec(),
            prove: prove.to_vec(),
        }
    }

    /// Routes over `count` addresses with every fallback proven.
    fn proven(count: usize) -> Routes {
        let mut r = Routes::new(count);
        for f in 1..count {
            r.on_proof(f, Proof::Proven);
        }
        r
    }

    #[test]
    fn the_primary_alone_never_moves() {
        let mut r = Routes::new(1);
        assert_eq!(r.on_check(0, false), Step::Stay);
        assert_eq!(r.on_failure(0), Step::Stay);
        assert_eq!(r.next_check(), 0);
        assert_eq!(r.current(), 0);
    }

    #[test]
    fn a_check_that_cannot_confirm_probes_every_other_address_proving_the_unproven() {
        let mut r = Routes::new(3);
        r.on_proof(2, Proof::Proven);
        assert_eq!(r.on_check(0, true), Step::Stay);
        assert_eq!(r.on_check(0, false), probe(&[1, 2], &[1]));
        assert_eq!(r.current(), 0, "a probe alone moves nothing");
    }

    #[test]
    fn an_unproven_or_refused_fallback_is_never_read_through() {
        for proof in [
            Proof::Unproven,
            Proof::OtherDatacenter,
            Proof::OtherStore,
            Proof::Denied,
        ] {
            let mut r = Routes::new(2);
            r.on_proof(1, proof);
            assert_eq!(r.on_probes(Some(1)), Step::Stay, "{proof:?}");
            assert_ne!(r.on_failure(0), Step::Switch(1), "{proof:?}");
            assert_eq!(r.current(), 0, "{proof:?}");
        }
    }

    #[test]
    fn without_the_proof_rule_any_address_is_read_through() {
        let mut r = Routes::with_rules(
            3,
            RouteRules {
                prove_identity: false,
            },
        );
        r.on_proof(1, Proof::OtherDatacenter);
        assert_eq!(r.on_check(0, false), probe(&[1, 2], &[]));
        assert_eq!(r.on_probes(Some(1)), Step::Switch(1));
        assert_eq!(r.on_failure(1), Step::Switch(2));
    }

    #[test]
    fn reads_move_to_the_proven_address_a_probe_found_fresh() {
        let mut r = proven(3);
        assert_eq!(r.on_probes(Some(1)), Step::Switch(1));
        assert_eq!(r.current(), 1);
        // From a fallback that cannot confirm: the primary is probed too,
        // and the fallback itself is proven again before it is used again.
        assert_eq!(r.on_check(1, false), probe(&[0, 2], &[]));
        assert_eq!(r.proof(1), Proof::Unproven);
        assert_eq!(r.on_probes(None), Step::Stay);
        assert_eq!(r.on_probes(Some(2)), Step::Switch(2));
        assert_eq!(r.on_probes(Some(3)), Step::Stay, "no such address");
        assert_eq!(r.on_probes(Some(1)), Step::Stay, "not proven again yet");
        assert_eq!(r.on_probes(Some(0)), Step::Switch(0));
    }

    #[test]
    fn a_failed_request_moves_to_the_next_usable_address_and_proves_the_failed_one_again() {
        let mut r = proven(3);
        assert_eq!(r.on_failure(0), Step::Switch(1));
        assert_eq!(r.on_failure(0), Step::Stay, "not the address in use");
        assert_eq!(r.on_failure(1), Step::Switch(2));
        assert_eq!(r.proof(1), Proof::Unproven);
        assert_eq!(r.on_failure(2), Step::Switch(0), "wraps to the primary");
        // Nothing usable left but the primary: a failure there probes.
        assert_eq!(r.on_failure(0), probe(&[1, 2], &[1, 2]));
        assert_eq!(r.current(), 0);
    }

    #[test]
    fn a_refusal_through_a_fallback_denies_it_and_takes_reads_back_to_the_primary() {
        let mut r = proven(3);
        assert_eq!(r.on_refused(0), Step::Stay, "the primary's refusal stands");
        r.on_probes(Some(2));
        assert_eq!(r.on_refused(1), Step::Stay, "not the address in use");
        assert_eq!(r.on_refused(2), Step::Switch(0));
        assert_eq!(r.current(), 0);
        assert_eq!(r.proof(2), Proof::Denied);
        assert_eq!(r.on_probes(Some(2)), Step::Stay);
    }

    #[test]
    fn a_refused_fallback_is_proven_again_every_fifteenth_probe() {
        let mut r = Routes::new(2);
        r.on_proof(1, Proof::OtherDatacenter);
        // Each due proof is made, and refuses it again.
        let probes: Vec<Step> = (0..2 * REPROVE_EVERY_PROBES)
            .map(|_| {
                let step = r.on_check(0, false);
                if step != Step::Stay {
                    r.on_proof(1, Proof::OtherDatacenter);
                }
                step
            })
            .collect();
        let due: Vec<usize> = (0..probes.len())
            .filter(|i| probes[*i] != Step::Stay)
            .collect();
        let every = REPROVE_EVERY_PROBES as usize;
        assert_eq!(due, vec![every - 1, 2 * every - 1]);
        assert_eq!(probes[every - 1], probe(&[1], &[1]));
        r.on_proof(1, Proof::Proven);
        assert_eq!(r.on_check(0, false), probe(&[1], &[]));
    }

    #[test]
    fn a_fallback_in_use_that_loses_its_proof_gives_reads_back() {
        let mut r = proven(3);
        r.on_probes(Some(1));
        r.on_identity_changed();
        assert_eq!(r.proof(1), Proof::Proven, "the one in use read the change");
        assert_eq!(r.proof(2), Proof::Unproven);
        assert_eq!(r.on_proof(2, Proof::OtherStore), Step::Stay);
        assert_eq!(r.on_proof(1, Proof::OtherStore), Step::Switch(0));
        assert_eq!(r.on_proof(0, Proof::Denied), Step::Stay);
        assert_eq!(r.proof(0), Proof::Proven, "the primary is the reference");
    }

    #[test]
    fn on_a_fallback_every_fifteenth_check_asks_the_primary_and_a_fresh_one_takes_reads_back() {
        let mut r = proven(2);
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
        let mut r = proven(3);
        r.on_probes(Some(2));
        assert_eq!(r.on_check(1, false), Step::Stay);
        assert_eq!(r.on_check(1, true), Step::Stay);
        assert_eq!(r.current(), 2);
    }

    #[test]
    fn a_new_list_keeps_the_proofs_and_reads_through_a_fallback_still_listed() {
        let mut r = proven(4);
        r.on_proof(3, Proof::OtherStore);
        r.on_probes(Some(2));
        // Fallback 1 gone, 2 and 3 kept (now 1 and 2), one new (3).
        assert_eq!(r.refit(&[Some(0), Some(2), Some(3), None]), Step::Stay);
        assert_eq!(r.current(), 1, "reads stay on the same fallback");
        assert_eq!(
            (1..4).map(|f| r.proof(f)).collect::<Vec<_>>(),
            vec![Proof::Proven, Proof::OtherStore, Proof::Unproven]
        );
        assert!(!r.usable(3), "a new address is proven before use");
        // The fallback in use gone: reads go back to the primary.
        assert_eq!(r.refit(&[Some(0), Some(3)]), Step::Switch(0));
        assert_eq!(r.count(), 2);
        assert_eq!(r.proof(0), Proof::Proven);
        assert_eq!(r.proof(1), Proof::Unproven);
        // Every fallback gone: the primary alone never moves.
        assert_eq!(r.refit(&[Some(0)]), Step::Stay);
        assert_eq!(r.on_check(0, false), Step::Stay);
    }

    const DC1: Expected<'static> = Expected {
        datacenter: Some("dc1"),
        store_id: Some(Some("s-1")),
    };

    fn dc(name: &str) -> Seen<String> {
        Seen::Answered(name.to_string())
    }

    fn store(id: Option<&str>) -> Seen<Option<String>> {
        Seen::Answered(id.map(str::to_string))
    }

    /// The proof's table: what each answer makes of a fallback.
    #[test]
    fn a_fallback_is_proven_only_by_our_datacenter_and_our_store_id() {
        type Case = (Expected<'static>, Seen<String>, Seen<Option<String>>, Proof);
        let cases: Vec<Case> = vec![
            (DC1, dc("dc1"), store(Some("s-1")), Proof::Proven),
            (DC1, dc("dc2"), store(Some("s-1")), Proof::OtherDatacenter),
            (DC1, dc("dc2"), Seen::Denied, Proof::OtherDatacenter),
            (DC1, dc("dc1"), store(Some("s-2")), Proof::OtherStore),
            // An ACL-filtered or empty store where ours has an id.
            (DC1, dc("dc1"), store(None), Proof::OtherStore),
            (DC1, dc("dc1"), Seen::Denied, Proof::Denied),
            (DC1, Seen::Denied, store(Some("s-1")), Proof::Denied),
            (DC1, Seen::Failed, store(Some("s-1")), Proof::Unproven),
            (DC1, dc("dc1"), Seen::Failed, Proof::Unproven),
            // Our datacenter not known: nothing is proven.
            (
                Expected {
                    datacenter: None,
                    ..DC1
                },
                dc("dc1"),
                store(Some("s-1")),
                Proof::Unproven,
            ),
            // A served state without a store id: nothing proves a store
            // without one either (another Consul named dc1 would do).
            (
                Expected {
                    store_id: Some(None),
                    ..DC1
                },
                dc("dc1"),
                store(None),
                Proof::Unproven,
            ),
            (
                Expected {
                    store_id: Some(None),
                    ..DC1
                },
                dc("dc1"),
                store(Some("s-1")),
                Proof::OtherStore,
            ),
            // Nothing served yet: nothing to compare the store id with.
            (
                Expected {
                    store_id: None,
                    ..DC1
                },
                dc("dc1"),
                store(Some("s-9")),
                Proof::Unproven,
            ),
            (
                Expected {
                    store_id: None,
                    ..DC1
                },
                dc("dc2"),
                store(Some("s-9")),
                Proof::OtherDatacenter,
            ),
        ];
        for (expected, datacenter, store_id, want) in cases {
            let got = judge(expected, &datacenter, &store_id);
            assert_eq!(
                got.proof, want,
                "{expected:?} {datacenter:?} {store_id:?}: {}",
                got.detail
            );
        }
        let named = judge(DC1, &dc("dc2"), &store(Some("s-1")));
        assert!(named.detail.contains("\"dc2\"") && named.detail.contains("\"dc1\""));
    }
}
