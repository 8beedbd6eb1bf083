//! Consul read consistency for the blocking query, and the rule that keeps
//! stale reads from ever moving the served state backwards.
//!
//! In `default` mode (Consul's default, api-docs/features/consistency)
//! every read is served by the Raft leader: one server answers the whole
//! fleet's blocking queries. In `stale` mode (`?stale`) any server answers
//! from its own state, so reads spread over the cluster, but a follower can
//! be behind the leader: right after a write, Consul 1.8.7 followers
//! answered the prefix with an older index and older values for up to
//! about 100 ms, and a client agent sends each request to whichever server
//! it uses at the time. So in stale mode an answer is held, not applied,
//! when:
//!
//! - its `X-Consul-Index` is lower than the served state's (a server behind
//!   the one that gave it),
//! - its `X-Consul-LastContact` (milliseconds since that server last heard
//!   from the leader; 0 on the leader) is over `--max-stale`, or missing,
//! - its `X-Consul-KnownLeader` is `false` (the server knows no leader) or
//!   missing.
//!
//! A held answer is counted and followed by a default-consistency full read
//! (from the leader, answered at once), judged like any answer; then the
//! core goes back to stale reads. The first read is a default one too, so
//! an agent never starts from a lagging server's copy. A direct read of a
//! key made in stale mode whose index is behind the answer it confirms is
//! asked again of the leader.

use std::time::Duration;

use crate::model::answer::ReadMeta;

/// Default `--max-stale`: 5 s. A follower that has not heard from the
/// leader for that long is cut off (Consul's election timeout is 1 s at
/// `raft_multiplier = 1`, 5 s at the default of 5).
pub const DEFAULT_MAX_STALE: Duration = Duration::from_secs(5);

/// The allowed `--max-stale` (inclusive): 100 ms to 10 minutes.
pub const MAX_STALE_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(600));

/// Why a stale answer was held (the `reason` label of
/// `gitlab_haproxy_agent_stale_answers_held_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// Its index is lower than the copy's.
    LowerIndex,
    /// Its server last heard from the leader more than `--max-stale` ago
    /// (or did not say).
    TooOld,
    /// Its server knows no leader (or did not say).
    NoLeader,
}

impl HoldReason {
    /// Every reason, so each label value exists at 0 from start-up.
    pub const ALL: [HoldReason; 3] = [
        HoldReason::LowerIndex,
        HoldReason::TooOld,
        HoldReason::NoLeader,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::LowerIndex => "lower_index",
            HoldReason::TooOld => "too_old",
            HoldReason::NoLeader => "no_leader",
        }
    }
}

/// Whether a stale answer with index `index` and freshness `meta` must be
/// held rather than applied over a copy at `held` (`None`: no copy yet, and
/// then the index alone holds nothing). The first reason that applies, in
/// the order: no leader, too old, lower index.
pub fn hold_reason(
    held: Option<u64>,
    index: u64,
    meta: &ReadMeta,
    max_stale: Duration,
) -> Option<HoldReason> {
    if meta.known_leader != Some(true) {
        return Some(HoldReason::NoLeader);
    }
    match meta.last_contact {
        Some(age) if age <= max_stale => {}
        _ => return Some(HoldReason::TooOld),
    }
    match held {
        Some(h) if index.max(1) < h => Some(HoldReason::LowerIndex),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: ReadMeta = ReadMeta {
        last_contact: Some(Duration::from_millis(3)),
        known_leader: Some(true),
        filtered_by_acls: None,
    };

    #[test]
    fn fresh_answers_at_or_above_the_copy_are_applied() {
        let max = DEFAULT_MAX_STALE;
        assert_eq!(hold_reason(None, 1, &FRESH, max), None);
        assert_eq!(hold_reason(Some(12), 12, &FRESH, max), None);
        assert_eq!(hold_reason(Some(12), 13, &FRESH, max), None);
        let at_limit = ReadMeta {
            last_contact: Some(max),
            ..FRESH
        };
        assert_eq!(hold_reason(Some(12), 13, &at_limit, max), None);
    }

    #[test]
    fn lower_old_or_leaderless_answers_are_held() {
        let max = Duration::from_secs(2);
        // The follower that had not applied index 12 yet: 404, index 1.
        assert_eq!(
            hold_reason(Some(12), 1, &FRESH, max),
            Some(HoldReason::LowerIndex)
        );
        // Index 0 counts as 1 (Consul's clamp), still lower.
        assert_eq!(
            hold_reason(Some(2), 0, &FRESH, max),
            Some(HoldReason::LowerIndex)
        );
        let old = ReadMeta {
            last_contact: Some(Duration::from_millis(2001)),
            ..FRESH
        };
        assert_eq!(
            hold_reason(Some(12), 20, &old, max),
            Some(HoldReason::TooOld)
        );
        let leaderless = ReadMeta {
            known_leader: Some(false),
            ..FRESH
        };
        assert_eq!(
            hold_reason(Some(12), 20, &leaderless, max),
            Some(HoldReason::NoLeader)
        );
        // Without the headers nothing says the answer is fresh.
        assert_eq!(
            hold_reason(None, 20, &ReadMeta::default(), max),
            Some(HoldReason::NoLeader)
        );
        let no_contact = ReadMeta {
            last_contact: None,
            ..FRESH
        };
        assert_eq!(
            hold_reason(None, 20, &no_contact, max),
            Some(HoldReason::TooOld)
        );
    }
}
