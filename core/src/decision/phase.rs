//! The typed state of the core's phases: what it waits for, what the read
//! out asks and why it was sent, what index checks found of it, and where
//! an answer stands while it is confirmed. No flags: each state says what
//! it means, and `machine.rs` moves between them.

use std::collections::BTreeMap;

use crate::model::value::AdminState;

use super::served::{AnswerView, Probe};
use crate::model::answer::{PrefixAnswer, ReadMeta};

/// What the core waits for: the answer to the one request it has out.
#[derive(Debug)]
pub(super) enum Phase {
    /// Nothing asked yet.
    Idle,
    /// The ACL probe. `held`: a prefix answer that came while the ACL state
    /// was unknown (the first read after a failure), judged once it
    /// answers.
    Acl { held: Option<PrefixRead> },
    /// A prefix read.
    Prefix(PrefixAsk),
    /// A check of an answer before it is merged: its read check, its direct
    /// reads, the store id after them.
    Confirming {
        pending: Box<Pending>,
        step: ConfirmStep,
    },
}

/// A prefix read out.
#[derive(Debug, Clone, Copy)]
pub(super) struct PrefixAsk {
    /// Full, or blocking on an index (and what index checks found of it).
    pub(super) read: Read,
    /// Which servers may answer it.
    pub(super) consistency: Consistency,
    /// Why it was sent.
    pub(super) sent: Sent,
}

/// What a prefix read asks Consul for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// A full read, without an index: Consul answers it at once.
    Full,
    /// A blocking read on `index` (never 0), parked until the prefix moves
    /// past it or the wait ends; the daemon checks the prefix's index while
    /// it is parked.
    Blocking {
        /// The index blocked on.
        index: u64,
        /// What index checks found of it.
        behind: Behind,
    },
}

impl Read {
    /// A read on `index`: full for 0 (sent without an index), else
    /// blocking, no check having found it behind yet.
    pub(super) fn on(index: u64) -> Read {
        match index {
            0 => Read::Full,
            index => Read::Blocking {
                index,
                behind: Behind::No,
            },
        }
    }
}

/// Which servers may answer a read (`--consistency`, api-docs
/// features/consistency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Consistency {
    /// The leader (Consul's default mode).
    Default,
    /// Any server (`?stale`), however far behind: its answer is held by
    /// the stale rules ([`hold_reason`](super::stale::hold_reason)) before it is applied.
    Stale,
}

impl Consistency {
    pub(super) fn of(stale: bool) -> Consistency {
        match stale {
            true => Consistency::Stale,
            false => Consistency::Default,
        }
    }

    pub(super) fn is_stale(self) -> bool {
        self == Consistency::Stale
    }
}

/// Why a prefix read was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    /// The next read: after an answer, a failure or the ACL probe, or
    /// re-issued for being behind.
    Next,
    /// A full read replacing an answer refused for hiding writes (which is
    /// not refused again).
    Refresh,
    /// Re-issued as a default read because an index check showed its
    /// server cut off: left to fail, not re-issued again for that.
    CutOff,
    /// A full default read because an index check showed the prefix below
    /// `parked`, the index the read it replaces waited on.
    Reset { parked: u64 },
}

/// How far index checks have found a blocking read behind Consul's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Behind {
    /// No check showed Consul past it.
    No,
    /// One did: its own answer may be on its way (in a fleet whose write
    /// takes longer than a check to reach every agent, re-issuing then
    /// would add a full read per agent to a fan-out already slow).
    Once,
    /// Re-issued because two in a row did: Consul is known to be past
    /// `index`, so the read is answered as soon as its server gets to it.
    /// `checks` have shown Consul past it since. It is not re-issued for
    /// that again: in a fleet whose servers take longer than two checks to
    /// answer a full read, each re-issue would drop an answer on its way
    /// and ask again, for ever (measured at 1,000 agents on 919 keys). At
    /// [`REPLACE_UNANSWERED_AFTER`](super::REPLACE_UNANSWERED_AFTER) it is replaced, once, by a full read,
    /// which is not parked and so never replaced again.
    Reissued { checks: u32 },
}

/// The request out while an answer is confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ConfirmStep {
    /// `~read-check`.
    ReadCheck,
    /// The names of the writer's records.
    RecordNames { consistency: Consistency },
    /// The writer's record of a key probed 403 (`never_held`: one the
    /// state did not hold).
    Record { key: Box<str>, never_held: bool },
    /// A direct read of the key last in `to_probe`.
    Key { consistency: Consistency },
    /// The store id, after the direct reads.
    StoreId { consistency: Consistency },
}

/// An answer being confirmed.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) view: AnswerView,
    /// What the loss rules found of it.
    pub(super) judged: Judged,
    /// The read it answers: full or blocking.
    pub(super) read: Read,
    /// Which servers could answer that read.
    pub(super) consistency: Consistency,
    /// The token's read check, if one is due before it is applied.
    pub(super) read_check: ReadCheck,
    /// Whether the names of the writer's records are listed before the
    /// direct reads.
    pub(super) list_records: bool,
    /// Whether they were listed (a writer transaction since the state
    /// served).
    pub(super) listed: bool,
    /// Keys only the listed record names named: read for a 403.
    pub(super) named: Vec<Box<str>>,
    pub(super) to_probe: Vec<Box<str>>,
    pub(super) probes: BTreeMap<Box<str>, Probe>,
    /// The states the writer's records name for keys probed 403 that the
    /// state never held.
    pub(super) written: BTreeMap<Box<str>, AdminState>,
    /// Whether the store id is read after the direct reads.
    pub(super) store_check: StoreCheck,
    /// Whether it is refused once its direct reads are in, if it may hide
    /// writes.
    pub(super) refusal: Refusal,
}

/// What the loss rules (`loss::judge`) found of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judged {
    /// From the store the state came from (or no state yet).
    Kept,
    /// From a store that lost data: what would give a server more traffic
    /// is held (`rolled_back`), and no key is read directly.
    RolledBack,
}

/// The read check (`~read-check`) of the token before an answer is
/// applied: it tells an empty answer from one the token may not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadCheck {
    /// Not due: ACLs off, or this token load was checked and the answer
    /// has keys.
    NotDue,
    /// Due for the token read `token_load` times, marked checked when it
    /// passes.
    Due { token_load: u64 },
    /// Due because a direct read was refused (403): the token's policy
    /// changed. Passing checks this answer only; the next is checked
    /// again.
    AfterForbidden,
}

impl ReadCheck {
    /// The token load to record as checked once it passes.
    pub(super) fn checked(self) -> Option<u64> {
        match self {
            ReadCheck::Due { token_load } => Some(token_load),
            ReadCheck::NotDue | ReadCheck::AfterForbidden => None,
        }
    }
}

/// Whether the store id is read after an answer's direct reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoreCheck {
    /// No direct read since it was last read (or none at all).
    NotDue,
    /// A direct read showed a key present or absent: the store id is read
    /// after them, to know they came from the store that gave the answer.
    Due,
}

/// Whether an answer that may hide writes is refused (and read again,
/// fresh) once its direct reads are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Not refused: ACLs off, its index did not move past the state's, it
    /// was rolled back, or it is itself the fresh read after a refusal.
    Never,
    /// Its index moved past the state's with ACLs on: refused if its index
    /// is past every ModifyIndex it and its direct reads show.
    IfHidesWrites,
}

/// A prefix answer with what the core needs to judge it.
#[derive(Debug)]
pub(super) struct PrefixRead {
    pub(super) answer: PrefixAnswer,
    pub(super) meta: ReadMeta,
    pub(super) token_load: u64,
    pub(super) ask: PrefixAsk,
}

/// What the ACL probe (`GET /v1/acl/token/self`) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acl {
    /// Not asked yet, or asked before the last failure (Consul may have
    /// come back with ACLs turned on or off): an answer waits for the
    /// probe.
    Unknown,
    /// ACLs on: answers may be filtered by the token's policy.
    Enabled,
    /// ACLs off (401 "ACL support disabled"): nothing is filtered.
    Disabled,
}

impl Acl {
    pub(super) fn of(enabled: bool) -> Acl {
        match enabled {
            true => Acl::Enabled,
            false => Acl::Disabled,
        }
    }
}

/// Whether reads go to any server in stale mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StaleReads {
    /// The next read is a default one (the first read, and after a held
    /// answer, a cut-off server or a reset), until one is applied.
    ConfirmFirst,
    /// A default read was applied since: reads may be `?stale`.
    Allowed,
}

/// What the index checks' server was found to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChecksServer {
    /// Nothing known against it: a check below the parked index reads
    /// from 0.
    InStep,
    /// A read from 0 after a check below the parked index answered exactly
    /// the parked index: nothing went back, nothing new, so the checks'
    /// server lags the leader (a follower that has not applied the latest
    /// writes). Checks below do not read from 0 again until one answers at
    /// the parked index or past it: a follower lagging for long would
    /// otherwise cost a full read every check.
    Lags,
}
