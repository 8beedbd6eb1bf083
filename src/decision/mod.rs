//! The decision core: every rule that decides what the agent serves, in one
//! place with no I/O, no clock and no runtime (the shape of ntpd-rs's
//! `ntp-proto`). The daemon ([`crate::agent::watcher`]) performs the
//! [`Request`] the core asks for, hands back the [`Response`], publishes the
//! [`ServedState`] when it changed, and writes it to disk.
//!
//! The rules, each with its table test below and driven through random
//! fault schedules by `tests/simulation.rs`:
//!
//! - **Consul's index rules** (api-docs/features/blocking): block on the last
//!   index; a lower index is a reset (re-read from 0); an index of 0 counts
//!   as 1; every read after a failure (and the first after a start) is a
//!   full read without an index.
//! - **Lost data** (a `-dev` restart, a rebuilt cluster, an old snapshot
//!   restored): the index went backwards, the [`STORE_ID_KEY`] the state had
//!   vanished or changed (whatever the index), or an answer that did not
//!   move past the served index shows a key rewritten (with ACLs off, any
//!   difference). A value from such a store that would put a server back
//!   in rotation is not applied: drain or maint left for anything else, a
//!   `ready` or a weight that appears where there was nothing (held
//!   `rolled_back`) until the key is written again or `state
//!   release-rollback`. A weight keeps its server in rotation either way
//!   and follows Consul.
//! - **Invalid values**: held at the key's last valid state, or skipped
//!   (the next identity on the line decides) when none is known.
//! - **Filtered views** (ACLs): Consul drops keys a token may not read from
//!   a recursive read, and a parked blocking query keeps the policy it
//!   started with. A key the state holds that an answer lacks is read
//!   directly: 403 is hidden (held), 404 is a delete; then the store id is
//!   read, so a direct read from a store that lost data meanwhile is not
//!   taken for the answer's. With ACLs disabled
//!   (`GET /v1/acl/token/self` answers 401 "ACL support disabled", asked at
//!   start and, after a failure, once the next read succeeds, before it is
//!   applied) nothing is filtered and no key is read.
//!   After a 403 on a direct read, before an empty answer is applied and
//!   with each token read from its file, the token's read access to the
//!   whole prefix is checked (`~read-check`, 403 for a token that may not
//!   read it). An answer whose index moved past every
//!   ModifyIndex it shows, with no delete to explain it, is replaced by one
//!   fresh read; so is one that lacked keys a direct read then shows
//!   present (filtered by the older policy of a parked query), when its
//!   index is past theirs too: it may hide a key the state does not hold.
//!   An answer at the same index that shows other keys (a query parked
//!   under a narrower policy) is applied like a change.
//! - **Stale reads** ([`stale`]): an answer from a server that is behind,
//!   cut off or leaderless is held and confirmed by a default read.
//!
//! The served state survives restarts: a core built with the state read
//! from disk answers from it at once and judges the first Consul answer
//! against it by the same rules.

pub mod served;
pub mod stale;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::consul::{KvPair, PrefixAnswer, ReadMeta};
use crate::model::generation::{GenerationMark, Lineage};
pub use served::{held_answer, HoldCause, STORE_ID_KEY};
use served::{AnswerView, Change, ConsulKey, MergeInput, Probe, ServedState};
use stale::{hold_reason, HoldReason};

/// What the core needs to know of the agent's settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The watched prefix, ending in `/`.
    pub prefix: String,
    /// `--consistency stale`: blocking reads go to any server.
    pub stale: bool,
    /// `--max-stale`: the oldest `X-Consul-LastContact` a stale answer may
    /// have to be applied. Default [`stale::DEFAULT_MAX_STALE`] (5 s).
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
    /// A hidden key holds only drain or maint; a hidden `ready` or weight
    /// is skipped.
    pub hidden_holds_only_out: bool,
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
            hidden_holds_only_out: true,
        }
    }
}

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
        /// ([`crate::consul::TokenSource::loads`]).
        token_load: u64,
    },
    /// A direct key read.
    Key {
        /// What it said.
        read: KeyRead,
        /// Its `X-Consul-Index`, if sent.
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
    /// read waits on: the read was re-issued.
    ParkedBehind {
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
    },
    /// The read check answered 403.
    ReadCheckDenied,
    /// The store id read after direct reads was not the answer's: Consul
    /// lost data meanwhile; the answer was dropped for a full read.
    StoreMoved,
}

/// Why an index check did not confirm the served state (the `reason` label
/// of `gitlab_haproxy_agent_index_checks_total`, beside `current` and
/// `behind`).
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
    /// What to log and count.
    pub notes: Vec<Note>,
}

/// A blocking prefix read in flight, which index checks watch.
#[derive(Debug, Clone, Copy)]
struct Parked {
    index: u64,
    /// Re-issued for a cut-off server: such a read must be left to fail
    /// (Consul's `rpc_hold_timeout`, 7 s), which moves the Consul client
    /// agent to another server, not re-issued again.
    for_cut_off: bool,
}

/// What the core decided after a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The next request.
    pub next: Next,
    /// The served state changed: publish [`Core::served`] and write it.
    pub served_changed: bool,
    /// Read the token file again before the next request.
    pub reload_token: bool,
    /// What to log and count.
    pub notes: Vec<Note>,
}

/// An answer being confirmed: read checks and direct reads still to make.
#[derive(Debug, Clone)]
struct Pending {
    view: AnswerView,
    rolled_back: bool,
    /// The answer came from a default-consistency read.
    default_read: bool,
    /// The token load to mark checked once the read check passes.
    read_check: Option<u64>,
    to_probe: Vec<Box<str>>,
    probes: BTreeMap<Box<str>, Probe>,
    /// The probe in flight was stale.
    probe_stale: bool,
    /// A direct read showed a key present or absent: the store id is read
    /// after them, to know they came from the store that gave the answer.
    store_check: StoreCheck,
    /// The answer's index moved past the one blocked on, and it was not
    /// itself a fresh read replacing a refused answer: rule 5 applies once
    /// its direct reads are in.
    may_refuse: bool,
}

/// The check that direct reads came from the store that gave the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreCheck {
    /// Not needed (no direct read, or only 403s).
    None,
    /// To ask.
    Due,
    /// Asked.
    Asked,
}

/// A prefix answer with what the core needs to judge it.
#[derive(Debug)]
struct PrefixRead {
    answer: PrefixAnswer,
    meta: ReadMeta,
    token_load: u64,
    /// It was a `?stale` read.
    stale: bool,
}

/// The decision core of one agent. See the module documentation.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    /// Shared with the daemon, which publishes it without a copy.
    served: Option<Arc<ServedState>>,
    synced: bool,
    /// The next prefix read is a full read (index 0).
    full_read: bool,
    /// The last full read was a fresh read replacing a refused answer.
    fresh: bool,
    /// `None` until the ACL probe answers.
    acl: Option<bool>,
    token_checked: Option<u64>,
    /// Stale mode: the next read is a default one (the first read, and
    /// after a held answer).
    confirm_default: bool,
    failures: u32,
    pending: Option<Pending>,
    /// A prefix answer that came while the ACL state was unknown (the first
    /// read after a failure), applied once the ACL probe answers.
    awaiting_acl: Option<PrefixRead>,
    /// The last request handed out.
    asked: Option<Request>,
    /// Writer records (`~meta/<key>`) whose key a direct read found absent,
    /// with the record's ModifyIndex: not read again until the record
    /// changes (a key deleted by hand leaves its record behind).
    records_read: BTreeMap<Box<str>, u64>,
    /// The blocking read in flight, if the last request is one.
    parked: Option<Parked>,
}

impl Core {
    /// A core with no state (`restored` `None`: the agent answers nobody
    /// until its first Consul answer) or the state read from disk (answered
    /// at once, and judged against the first answer).
    pub fn new(config: CoreConfig, restored: Option<ServedState>) -> Core {
        Core {
            served: restored.map(Arc::new),
            synced: false,
            full_read: true,
            fresh: false,
            acl: None,
            token_checked: None,
            confirm_default: true,
            failures: 0,
            pending: None,
            awaiting_acl: None,
            asked: None,
            records_read: BTreeMap::new(),
            parked: None,
            config,
        }
    }

    /// The index of the state served, which the next blocking read waits
    /// on; `None` before any state.
    fn current(&self) -> Option<u64> {
        self.served.as_deref().map(|s| s.index)
    }

    /// The state served now; `None` before any.
    pub fn served(&self) -> Option<&ServedState> {
        self.served.as_deref()
    }

    /// The state served now, shared: what the daemon publishes and writes.
    pub fn served_shared(&self) -> Option<Arc<ServedState>> {
        self.served.clone()
    }

    /// Whether a Consul answer has been applied since the start.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Consecutive failed requests.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The first request: the ACL probe.
    pub fn start(&mut self) -> Next {
        self.ask(Request::AclProbe, Delay::None)
    }

    fn ask(&mut self, request: Request, delay: Delay) -> Next {
        self.parked = match request {
            Request::Prefix { index, .. } if index > 0 => Some(Parked {
                index,
                for_cut_off: false,
            }),
            _ => None,
        };
        self.asked = Some(request.clone());
        Next { request, delay }
    }

    /// Whether the request in flight is a blocking read, which the daemon
    /// watches with an index check every `--index-check`.
    pub fn parked(&self) -> bool {
        self.parked.is_some()
    }

    /// Takes what an index check found while a blocking read is parked.
    /// Consul keeps a parked query on the server that holds it: one cut off
    /// from the quorum answers nothing new, and no error, until the wait
    /// ends (1.8.7 `blockingQuery`; no version releases it on a loss of
    /// leadership). So:
    ///
    /// - a check from a server that knows the leader and heard from it
    ///   within `--max-stale` at an index not past the parked one confirms
    ///   the state served;
    /// - one past it means the read is parked behind: it is re-issued, and
    ///   answers at once;
    /// - one from a server that knows no leader, or has not heard from it
    ///   within `--max-stale`, means a read through it is stuck: it is
    ///   re-issued as a default read, which such a server fails after
    ///   Consul's `rpc_hold_timeout` (7 s), and a Consul client agent moves
    ///   to another server on that error;
    /// - a failed check confirms nothing.
    ///
    /// A read re-issued for a cut-off server is not re-issued again for
    /// that; a check that comes after the read returned is ignored.
    pub fn on_index_check(&mut self, check: IndexCheck) -> CheckOutput {
        let mut out = CheckOutput::default();
        let Some(parked) = self.parked else {
            return out;
        };
        // Whether to re-issue, and whether for a cut-off server.
        let reissue = match check {
            IndexCheck::Failed => {
                out.notes.push(Note::Unconfirmed {
                    reason: Unconfirmed::Failed,
                });
                None
            }
            IndexCheck::Answered { index, meta } => {
                match hold_reason(None, index, &meta, self.config.max_stale) {
                    Some(reason) => {
                        out.notes.push(Note::Unconfirmed {
                            reason: Unconfirmed::CutOff(reason),
                        });
                        (!parked.for_cut_off).then_some(true)
                    }
                    None if index > parked.index => {
                        out.notes.push(Note::ParkedBehind {
                            parked: parked.index,
                            index,
                        });
                        Some(false)
                    }
                    None => {
                        out.notes.push(Note::Confirmed {
                            last_contact: meta.last_contact.unwrap_or_default(),
                        });
                        None
                    }
                }
            }
        };
        let Some(for_cut_off) = reissue.filter(|_| self.config.rules.index_check) else {
            return out;
        };
        if for_cut_off {
            self.confirm_default = true;
        }
        let next = self.prefix_read(Delay::None);
        if let Some(p) = self.parked.as_mut() {
            p.for_cut_off = for_cut_off;
        }
        out.reissue = Some(next);
        out
    }

    fn stale_now(&self) -> bool {
        self.config.stale && !self.confirm_default
    }

    fn prefix_read(&mut self, delay: Delay) -> Next {
        let index = if self.full_read {
            0
        } else {
            self.current().unwrap_or(0)
        };
        let stale = self.stale_now();
        self.ask(Request::Prefix { index, stale }, delay)
    }

    /// Takes the response to the last request and decides what comes next.
    /// `now` is the Unix time in seconds (only recorded, as the start of new
    /// holds).
    pub fn on_response(&mut self, response: Response, now: u64) -> Output {
        let mut out = Output {
            next: Next {
                request: Request::AclProbe,
                delay: Delay::None,
            },
            served_changed: false,
            reload_token: false,
            notes: Vec::new(),
        };
        self.parked = None;
        out.next = match response {
            Response::Failed { forbidden } => self.fail(forbidden, &mut out),
            Response::Acl { enabled } => {
                self.acl = Some(enabled);
                out.notes.push(Note::Acl { enabled });
                match self.awaiting_acl.take() {
                    Some(read) => self.on_prefix(read, now, &mut out),
                    None => self.prefix_read(Delay::None),
                }
            }
            Response::ReadCheck { allowed } => {
                if !allowed {
                    out.notes.push(Note::ReadCheckDenied);
                    self.fail(true, &mut out)
                } else {
                    if let Some(p) = self.pending.as_mut() {
                        if let Some(load) = p.read_check.take() {
                            self.token_checked = Some(load);
                        }
                    }
                    self.proceed(now, &mut out)
                }
            }
            Response::Key { read, index } => self.on_key(read, index, now, &mut out),
            Response::Prefix {
                answer,
                meta,
                token_load,
            } => {
                let read = PrefixRead {
                    answer,
                    meta,
                    token_load,
                    stale: matches!(self.asked, Some(Request::Prefix { stale: true, .. })),
                };
                self.on_prefix(read, now, &mut out)
            }
        };
        out
    }

    /// After a failure the ACL state is unknown again (Consul may have come
    /// back with ACLs turned on or off), so the next full read is applied
    /// only once the ACL probe has answered. The probe follows the read
    /// that succeeds rather than preceding every retry: an outage costs one
    /// request per retry, and the recovery one more.
    fn fail(&mut self, forbidden: bool, out: &mut Output) -> Next {
        self.failures = self.failures.saturating_add(1);
        self.pending = None;
        self.awaiting_acl = None;
        self.full_read = true;
        self.fresh = false;
        if self.config.rules.acl_reprobe {
            self.acl = None;
        }
        if forbidden {
            out.reload_token = true;
            self.token_checked = None;
        }
        self.prefix_read(Delay::Backoff(self.failures))
    }

    fn on_prefix(&mut self, read: PrefixRead, now: u64, out: &mut Output) -> Next {
        if self.acl.is_none() {
            self.awaiting_acl = Some(read);
            return self.ask(Request::AclProbe, Delay::None);
        }
        let PrefixRead {
            answer,
            meta,
            token_load,
            stale: stale_read,
        } = read;
        let full = self.full_read;
        let view = AnswerView::new(&self.config.prefix, answer.index, &answer.pairs);
        let (raw_index, empty) = (answer.index, answer.pairs.is_empty());
        // The view holds what is needed: the pairs go now, not after the
        // direct reads (a 10,000-key answer is a few MB).
        drop(answer);

        // 1. A stale answer that could move the state backwards is held.
        if stale_read {
            if let Some(reason) =
                hold_reason(self.current(), raw_index, &meta, self.config.max_stale)
            {
                out.notes.push(Note::StaleHeld {
                    reason,
                    index: raw_index,
                    served_index: self.current().unwrap_or(0),
                });
                self.confirm_default = true;
                self.full_read = true;
                return self.prefix_read(Delay::MinInterval);
            }
        }
        let acl_on = self.acl != Some(false) || meta.filtered_by_acls == Some(true);
        if meta.filtered_by_acls == Some(true) {
            out.notes.push(Note::FilteredByAcls);
        }

        // 2. No change: the same index showing the same keys.
        if !full && Some(view.index) == self.current() && self.shows_the_same(&view) {
            out.notes.push(Note::NotModified);
            self.failures = 0;
            return self.prefix_read(Delay::MinInterval);
        }

        // 3. Lost data.
        let mut rolled_back = false;
        if let Some(previous) = self.current().filter(|c| view.index < *c) {
            // A reaped tombstone moves the index back and nothing else.
            let reaped = self.config.rules.reap && self.shows_the_same(&view);
            out.notes.push(Note::IndexReset {
                previous,
                index: view.index,
                reaped,
            });
            rolled_back = !reaped;
        }
        if self.config.rules.generation {
            if let Some(lost) = self.generation_lost(&view) {
                out.notes.push(lost);
                rolled_back = true;
            }
        }
        if self.config.rules.store_id {
            if let Some(previous) = self.served.as_ref().and_then(|s| s.store_id.clone()) {
                if view.store_id.as_ref() != Some(&previous) {
                    out.notes.push(Note::StoreChanged {
                        previous,
                        now: view.store_id.clone(),
                    });
                    rolled_back = true;
                }
            }
        }
        // The index did not move, yet Consul shows something else: only a
        // store that lost data (restarted, restored) answers so. With ACLs
        // on, keys shown or not at the same index may be a policy's doing
        // (a query parked under another one): only a key shown with another
        // ModifyIndex tells then.
        if !rolled_back
            && self.current().is_some_and(|i| view.index <= i)
            && self.rewritten(&view, acl_on)
        {
            out.notes.push(Note::NotMoved { index: view.index });
            rolled_back = true;
        }

        // 4. Keys the state holds that the answer lacks: those Consul showed,
        // those hidden, and, when the answer releases the rolled-back holds,
        // those held since they vanished.
        let releases = view.release_mark.is_some()
            && self.served.as_ref().map(|s| s.release_mark) != Some(view.release_mark);
        let missing: Vec<Box<str>> = match &self.served {
            Some(s) if !rolled_back => s
                .keys
                .iter()
                .filter(|(k, r)| {
                    !view.keys.contains_key(*k)
                        && (r.consul.is_some()
                            || r.hold.is_some_and(|h| {
                                h.cause == HoldCause::Hidden
                                    || (releases && h.cause == HoldCause::RolledBack)
                            }))
                })
                .map(|(k, _)| k.clone())
                .collect(),
            _ => Vec::new(),
        };
        let probe = acl_on && self.config.rules.probe_missing;
        // Keys only a writer record names (the answer lacks the key, the
        // state does not know it): with ACLs on, a key the token may not
        // read shows only so (a deny on the one key passes the read check).
        // Each is read directly once per write of its record; a 403 holds
        // it as hidden with no value known, which gets no answer.
        let mut missing = missing;
        if probe && !rolled_back {
            let known = |k: &str| self.served.as_ref().is_some_and(|s| s.keys.contains_key(k));
            missing.extend(
                view.meta
                    .iter()
                    .filter(|(k, (_, mi))| {
                        !view.keys.contains_key(*k)
                            && !known(k)
                            && self.records_read.get(*k) != Some(mi)
                    })
                    .map(|(k, _)| k.clone()),
            );
        }

        // 5. An index moved past every key shown, with nothing deleted to
        // explain it, may hide a write: read once more, fresh.
        let moved = self.current().is_some_and(|c| view.index > c);
        if acl_on
            && !rolled_back
            && !self.fresh
            && moved
            && view.latest_shown > 0
            && view.index > view.latest_shown
            && missing.is_empty()
        {
            out.notes.push(Note::Refused(Refused::HidesWrites));
            self.full_read = true;
            self.fresh = true;
            // A policy narrowed since the last check is the likely cause.
            self.token_checked = None;
            return self.prefix_read(Delay::None);
        }
        let may_refuse = acl_on && !rolled_back && !self.fresh && moved;
        self.fresh = false;

        let read_check =
            (acl_on && (empty || self.token_checked != Some(token_load))).then_some(token_load);
        self.pending = Some(Pending {
            view,
            rolled_back,
            default_read: !stale_read,
            read_check,
            to_probe: if probe { missing } else { Vec::new() },
            probes: BTreeMap::new(),
            probe_stale: false,
            store_check: StoreCheck::None,
            may_refuse,
        });
        self.proceed(now, out)
    }

    /// Whether `view`, at an index not past the served one, shows Consul's
    /// keys otherwise than the served state: a key with another ModifyIndex,
    /// or (with ACLs off, where nothing is filtered) any difference.
    fn rewritten(&self, view: &AnswerView, acl_on: bool) -> bool {
        let Some(served) = &self.served else {
            return false;
        };
        let moved = view.keys.iter().any(|(k, c)| {
            served
                .keys
                .get(k)
                .and_then(|r| r.consul.as_ref())
                .is_some_and(|s| s.modify_index != c.modify_index)
        });
        moved || (!acl_on && !self.shows_the_same(view))
    }

    /// A note when the answer's write generation does not descend from the
    /// one served: an older one or another branch (see
    /// [`crate::model::generation`]), or none where the last answer showed
    /// one. A value that does not parse (written by hand) and one too many
    /// writes ahead to link say nothing.
    fn generation_lost(&self, view: &AnswerView) -> Option<Note> {
        let state = self.served.as_ref()?;
        let served = state.generation?;
        let now = match &view.generation {
            None if !state.generation_shown => return None,
            None => None,
            Some(Err(_)) => return None,
            Some(Ok(g)) => match g.lineage(served) {
                Lineage::Same | Lineage::Descends | Lineage::TooFar => return None,
                Lineage::Lost => Some(g.mark()),
            },
        };
        Some(Note::GenerationLost { served, now })
    }

    /// Whether `view` shows exactly what the served state shows of Consul.
    fn shows_the_same(&self, view: &AnswerView) -> bool {
        let Some(served) = &self.served else {
            return false;
        };
        let generation = match &view.generation {
            Some(Ok(g)) => Some(g.mark()),
            Some(Err(_)) | None => served.generation,
        };
        served.store_id == view.store_id
            && served.generation_shown == view.generation.is_some()
            && served.generation == generation
            && served.release_mark == view.release_mark
            && served.consul_key_count() == view.keys.len()
            && view.keys.iter().all(|(k, c)| {
                served
                    .keys
                    .get(k)
                    .and_then(|r| r.consul.as_ref())
                    .is_some_and(|s| s == c)
            })
    }

    /// The next step of a pending answer: its read check, its direct reads,
    /// then the merge.
    fn proceed(&mut self, now: u64, out: &mut Output) -> Next {
        let stale = self.stale_now();
        let Some(p) = self.pending.as_mut() else {
            return self.prefix_read(Delay::MinInterval);
        };
        if p.read_check.is_some() {
            return self.ask(Request::ReadCheck { stale }, Delay::None);
        }
        if let Some(key) = p.to_probe.last().cloned() {
            p.probe_stale = stale;
            return self.ask(Request::Key { key, stale }, Delay::None);
        }
        if p.store_check == StoreCheck::Due {
            p.store_check = StoreCheck::Asked;
            p.probe_stale = stale;
            let key = STORE_ID_KEY.into();
            return self.ask(Request::Key { key, stale }, Delay::None);
        }
        let p = self.pending.take().expect("pending answer");
        // 5, after the direct reads: keys the answer lacked that a direct
        // read shows present were filtered, not deleted (a query parked
        // under an older, narrower policy). Such an answer may hide writes
        // to keys the state does not hold, which no direct read asks for:
        // if its index moved past every ModifyIndex it and the direct reads
        // show, with no 404 to explain it, read once more, fresh.
        if p.may_refuse && hides_writes(&p) {
            out.notes.push(Note::Refused(Refused::HidesWrites));
            self.full_read = true;
            self.fresh = true;
            return self.prefix_read(Delay::None);
        }
        self.finish(p, now, out)
    }

    /// The store id read after direct reads says they came from the store
    /// that gave the answer when it is the answer's: the same id at the
    /// same ModifyIndex (Consul answers a read of a present key with its
    /// ModifyIndex as `X-Consul-Index`, `KVS.Get`), or absent from both
    /// with the KV table's index, which a 404 carries, not below the
    /// answer's. Otherwise Consul lost data meanwhile: the answer is
    /// dropped and a full read follows, which the loss rules judge.
    fn on_store_check(
        &mut self,
        read: KeyRead,
        index: Option<u64>,
        now: u64,
        out: &mut Output,
    ) -> Next {
        let Some(p) = self.pending.as_mut() else {
            return self.prefix_read(Delay::MinInterval);
        };
        let same = match &read {
            KeyRead::Present(pair) => {
                p.view.store_id.as_deref() == Some(String::from_utf8_lossy(&pair.value).trim())
                    && pair.modify_index == p.view.store_id_index
            }
            KeyRead::Absent => {
                p.view.store_id.is_none() && index.is_some_and(|i| i >= p.view.index)
            }
            // A token denied the store id cannot check by it: the answer
            // did not show it either (the loss rules already hold what its
            // vanishing could undo). One that showed it and now is denied
            // changed policy meanwhile: read again.
            KeyRead::Forbidden => p.view.store_id.is_none(),
        };
        // A stale server behind the answer may not have the store id yet:
        // ask the leader before judging.
        if !same && p.probe_stale && read != KeyRead::Forbidden {
            p.probe_stale = false;
            let key = STORE_ID_KEY.into();
            return self.ask(Request::Key { key, stale: false }, Delay::None);
        }
        if same {
            p.store_check = StoreCheck::None;
            return self.proceed(now, out);
        }
        out.notes.push(Note::StoreMoved);
        self.pending = None;
        self.full_read = true;
        // Not at once: a store that keeps moving cannot make the loop spin.
        self.prefix_read(Delay::MinInterval)
    }

    fn on_key(&mut self, read: KeyRead, index: Option<u64>, now: u64, out: &mut Output) -> Next {
        let Some(p) = self.pending.as_mut() else {
            return self.prefix_read(Delay::MinInterval);
        };
        if p.store_check == StoreCheck::Asked {
            return self.on_store_check(read, index, now, out);
        }
        let Some(key) = p.to_probe.last().cloned() else {
            return self.proceed(now, out);
        };
        // A stale server behind the answer may not have the key yet, or
        // still have it: ask the leader.
        if p.probe_stale && read != KeyRead::Forbidden && index.is_none_or(|i| i < p.view.index) {
            p.probe_stale = false;
            return self.ask(Request::Key { key, stale: false }, Delay::None);
        }
        p.to_probe.pop();
        let (probe, result) = match read {
            KeyRead::Present(pair) => (
                Probe::Present(ConsulKey::parse(&key, &pair.value, pair.modify_index)),
                "present",
            ),
            KeyRead::Absent => (Probe::Absent, "absent"),
            KeyRead::Forbidden => (Probe::Forbidden, "forbidden"),
        };
        if probe == Probe::Absent {
            if let Some((_, mi)) = p.view.meta.get(&key) {
                self.records_read.insert(key.clone(), *mi);
            }
        }
        if probe == Probe::Forbidden {
            // The token's policy changed: read the token file again (a
            // rotated token), and check its read access before applying.
            out.reload_token = true;
            p.read_check = Some(u64::MAX);
        } else {
            p.store_check = StoreCheck::Due;
        }
        out.notes.push(Note::Probed {
            key: key.clone(),
            result,
        });
        p.probes.insert(key, probe);
        self.proceed(now, out)
    }

    fn finish(&mut self, p: Pending, now: u64, out: &mut Output) -> Next {
        let input = MergeInput {
            hidden_holds_only_out: self.config.rules.hidden_holds_only_out,
            rolled_back: p.rolled_back,
            probes: p.probes,
            now,
        };
        let backwards = self.current().is_some_and(|c| p.view.index < c);
        let (next, changes) = match self.served.as_deref() {
            Some(base) => base.merge(p.view, &input),
            None => ServedState::default().merge(p.view, &input),
        };
        out.served_changed = self.served.as_deref() != Some(&next);
        out.notes.push(Note::Applied {
            index: next.index,
            changes,
        });
        self.served = Some(Arc::new(next));
        if !self.synced {
            self.synced = true;
            out.notes.push(Note::FirstSync);
        }
        self.failures = 0;
        // Consul's rule: after the index went backwards on a blocking read,
        // read again from 0; a full read that shows it needs no second one.
        self.full_read = backwards && !self.full_read;
        if p.default_read {
            self.confirm_default = false;
        }
        self.prefix_read(Delay::MinInterval)
    }
}

/// Whether a pending answer whose direct reads are in may hide a write:
/// some key it lacked is present, none is absent (a delete's tombstone
/// would explain the index) or forbidden, and its index is past every
/// ModifyIndex shown.
fn hides_writes(p: &Pending) -> bool {
    let mut latest = p.view.latest_shown;
    let mut present = false;
    for probe in p.probes.values() {
        match probe {
            Probe::Present(k) => {
                present = true;
                latest = latest.max(k.modify_index);
            }
            Probe::Absent | Probe::Forbidden => return false,
        }
    }
    present && p.view.index > latest
}

#[cfg(test)]
mod tests;
