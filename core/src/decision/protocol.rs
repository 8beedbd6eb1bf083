//! What the core and the daemon say to each other: the requests the core
//! asks for, the responses the daemon hands back, and the notes it logs and
//! counts.

use std::time::Duration;

use super::stale::HoldReason;
use crate::model::answer::{PrefixAnswer, ReadMeta};
use crate::model::generation::GenerationMark;
use crate::model::snapshot::KvPair;

use super::served::Change;

/// One request for the daemon to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `GET /v1/acl/token/self`: are ACLs enabled?
    AclProbe,
    /// `GET /v1/kv/<prefix>?recurse`, blocking from `index` when it is not 0
    /// (`&index=I&wait=W`), `&stale` when `stale`.
    Prefix {
        /// The index to block on; 0 answers at once.
        index: u64,
        /// Any server may answer.
        stale: bool,
    },
    /// `GET /v1/kv/<prefix><key>`: a key the served state holds that the
    /// last answer lacked.
    Key {
        /// The key, relative to the prefix.
        key: Box<str>,
        /// Any server may answer.
        stale: bool,
    },
    /// `GET /v1/kv/<records prefix>?keys` (gzip, `&stale` when `stale`):
    /// the names of the writer's records beside the prefix
    /// ([`records_prefix`](crate::model::meta::records_prefix)), keys only,
    /// asked with ACLs on when a writer transaction came since the state
    /// served: the record of a key the token may not read names it.
    RecordNames {
        /// Any server may answer.
        stale: bool,
    },
    /// `GET /v1/kv/<records prefix><key>` (default consistency): the
    /// writer's record of a key the token may not read (403) that the
    /// state never held, for the state it names (answered as
    /// [`Response::Key`]).
    Record {
        /// The key, relative to the prefix.
        key: Box<str>,
    },
    /// `GET /v1/kv/<prefix>~read-check` (a key that never exists): 404 for
    /// a token that may read the whole prefix, 403 for one that may not.
    ReadCheck {
        /// Any server may answer.
        stale: bool,
    },
}

/// How long the daemon waits before it sends the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// At once.
    None,
    /// Until `--min-query-interval` after the start of the last prefix read,
    /// so a Consul that answers at once cannot make the loop spin.
    MinInterval,
    /// The jittered backoff after this many consecutive failures (1 for the
    /// first).
    Backoff(u32),
}

/// The next request and when to send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    /// The request.
    pub request: Request,
    /// When.
    pub delay: Delay,
}

/// The answer to a direct key read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRead {
    /// 200.
    Present(KvPair),
    /// 404.
    Absent,
    /// 403.
    Forbidden,
}

/// What came back for the last request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The ACL probe was answered: `false` for 401 "ACL support disabled",
    /// `true` for anything else Consul answered.
    Acl {
        /// ACLs are (or may be) enabled.
        enabled: bool,
    },
    /// A prefix read: 200, or 404 (no key).
    Prefix {
        /// The answer.
        answer: PrefixAnswer,
        /// Its freshness headers.
        meta: ReadMeta,
        /// How many times the token file has been read
        /// (the daemon's `TokenSource::loads`).
        token_load: u64,
    },
    /// A direct key read.
    Key {
        /// What it said.
        read: KeyRead,
        /// Its `X-Consul-Index`, if sent.
        index: Option<u64>,
    },
    /// The names of the records (keys relative to the records prefix, so
    /// the state keys they describe; none for a 404); `None` for a 403 (a
    /// token that may not read them).
    RecordNames {
        /// The names.
        names: Option<Vec<Box<str>>>,
        /// Its `X-Consul-Index` (the records prefix's), if sent.
        index: Option<u64>,
    },
    /// The read check: `false` for 403.
    ReadCheck {
        /// The token may read the whole prefix.
        allowed: bool,
    },
    /// The request failed: transport, timeout, an error status, or an
    /// unusable answer.
    Failed {
        /// A 403: the token file should be read again.
        forbidden: bool,
    },
}

/// Why an answer was replaced by a fresh read instead of applied (the
/// `reason` label of `gitlab_haproxy_agent_consul_answers_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its index moved past every ModifyIndex it shows with no delete to
    /// explain it: a write it may not show.
    HidesWrites,
}

impl Refused {
    /// Every reason, so each label value exists at 0 from start-up.
    pub const ALL: [Refused; 1] = [Refused::HidesWrites];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::HidesWrites => "hides_writes",
        }
    }
}

/// Something the daemon logs or counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The ACL probe answered.
    Acl {
        /// ACLs are (or may be) enabled.
        enabled: bool,
    },
    /// A blocking read ended with no change.
    NotModified,
    /// An answer was applied at this index (`changes` may be empty).
    Applied {
        /// `X-Consul-Index` of the answer.
        index: u64,
        /// The keys whose served state, hold or validity changed.
        changes: Vec<Change>,
    },
    /// The first Consul answer since the start was applied.
    FirstSync,
    /// The index went backwards.
    IndexReset {
        /// The index before.
        previous: u64,
        /// The index now.
        index: u64,
        /// Nothing moved: a tombstone was reaped (Consul reaps a delete's
        /// tombstone about 15 minutes later and the prefix index drops to
        /// the highest live key's). Not a loss.
        reaped: bool,
    },
    /// The write generation ([`crate::model::generation`]) is not one the
    /// served generation leads to: an older one, another branch (a restored
    /// snapshot, then writes), or none where there was one.
    GenerationLost {
        /// The generation served.
        served: GenerationMark,
        /// The answer's (`None`: absent).
        now: Option<GenerationMark>,
    },
    /// An index check confirmed that the state served is Consul's latest,
    /// as of `last_contact` ago. (A prefix answer that is not held confirms
    /// it too; the daemon sees that from the response.)
    Confirmed {
        /// The answering server's `X-Consul-LastContact`.
        last_contact: Duration,
    },
    /// An index check could not confirm the state served is Consul's latest.
    Unconfirmed {
        /// Why.
        reason: Unconfirmed,
    },
    /// An index check showed the prefix past the index a parked blocking
    /// read waits on.
    ParkedBehind {
        /// The index the read waited on.
        parked: u64,
        /// The check's index.
        index: u64,
        /// What was done.
        then: BehindStep,
    },
    /// An index check showed the prefix below the index a parked blocking
    /// read waits on (a restored snapshot, a reaped tombstone, or a
    /// follower that has not applied the last write): Consul's reset rule,
    /// the read was re-issued from 0 as a default read.
    IndexBelow {
        /// The index the read waited on.
        parked: u64,
        /// The check's index.
        index: u64,
    },
    /// The store id vanished or changed: Consul lost its data.
    StoreChanged {
        /// The id before.
        previous: Box<str>,
        /// The id now.
        now: Option<Box<str>>,
    },
    /// An answer that did not move past the served index shows other keys
    /// or values: Consul lost data (a restart, a restore).
    NotMoved {
        /// The index.
        index: u64,
    },
    /// A stale answer was held.
    StaleHeld {
        /// Why.
        reason: HoldReason,
        /// Its index.
        index: u64,
        /// The index of the state served.
        served_index: u64,
    },
    /// An answer was replaced by a fresh read.
    Refused(Refused),
    /// Consul said the answer was filtered by ACLs
    /// (`X-Consul-Results-Filtered-By-ACLs: true`).
    FilteredByAcls,
    /// A key the answer lacked was read directly.
    Probed {
        /// The key.
        key: Box<str>,
        /// `present`, `absent` or `forbidden`.
        result: &'static str,
        /// The key was held hidden before this answer: it is read again at
        /// every answer that lacks it, and a 403 tells nothing new.
        already_hidden: bool,
    },
    /// The names of the writer's records were listed.
    RecordsListed {
        /// Names the answer and the state served do not hold: each is read
        /// directly.
        unknown: usize,
        /// The token may not list them (403): a key hidden from it is found
        /// only by its records, so none is.
        denied: bool,
    },
    /// The read check answered 403.
    ReadCheckDenied,
    /// The store id read after direct reads was not the answer's: Consul
    /// lost data meanwhile; the answer was dropped for a full read.
    StoreMoved,
}

/// What an index check that showed Consul past a parked read did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BehindStep {
    /// Nothing yet: the first such check (the read's own answer may be on
    /// its way), or one of the few after the read was re-issued for it.
    Waits,
    /// The read was re-issued: the second check in a row.
    Reissued,
    /// The re-issued read went unanswered for
    /// [`REPLACE_UNANSWERED_AFTER`](super::REPLACE_UNANSWERED_AFTER) more
    /// checks: replaced by a full read (which does not park), and
    /// [`CheckOutput::reroute`] set.
    Replaced,
}

/// Why an index check did not confirm the served state (the `reason` label
/// of `gitlab_haproxy_agent_index_checks_total`, beside `current`,
/// `behind` and `below`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unconfirmed {
    /// The check failed or timed out.
    Failed,
    /// The check's server knows no leader or last heard from it more than
    /// `--max-stale` ago: it is cut off, and so is a read parked through it.
    CutOff(HoldReason),
}

impl Unconfirmed {
    /// The label value: `failed`, `no_leader`, `too_old`.
    pub fn as_str(self) -> &'static str {
        match self {
            Unconfirmed::Failed => "failed",
            Unconfirmed::CutOff(r) => r.as_str(),
        }
    }
}

/// What an index check found: the check is
/// `GET /v1/kv/<prefix>?keys&separator=/&stale`, whose `X-Consul-Index` is
/// the prefix's (the same as a recursive read's, tombstones included:
/// checked on Consul 1.8.7) and whose body is a few top-level names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexCheck {
    /// It answered.
    Answered {
        /// `X-Consul-Index`.
        index: u64,
        /// Its freshness headers.
        meta: ReadMeta,
    },
    /// It failed or timed out.
    Failed,
}

/// What the core decided after an index check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckOutput {
    /// Drop the parked read and send this instead.
    pub reissue: Option<Next>,
    /// A read through the address in use went unanswered while index
    /// checks through it passed: send the re-issue through another
    /// address when there is one (`--consul-fallback-addr`).
    pub reroute: bool,
    /// What to log and count.
    pub notes: Vec<Note>,
}

/// What the core decided after a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The next request.
    pub next: Next,
    /// The served state changed: publish [`super::Core::served`] and write it.
    pub served_changed: bool,
    /// Read the token file again before the next request.
    pub reload_token: bool,
    /// What to log and count.
    pub notes: Vec<Note>,
}
