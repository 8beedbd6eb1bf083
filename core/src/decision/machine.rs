//! The core as a state machine: one [`Phase`] says what it waits for, and
//! each response is matched against it. Every transition has a row in the
//! table tests (`tests.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::{CoreConfig, Rule};
use super::loss;
use super::protocol::{
    BehindStep, CheckOutput, Delay, IndexCheck, KeyRead, Next, Note, Output, Refused, Request,
    Response, Unconfirmed,
};
use super::served::{AnswerView, ConsulKey, HoldCause, MergeInput, Probe, ServedState};
use super::stale::hold_reason;
use crate::model::answer::{PrefixAnswer, ReadMeta};
use crate::model::identity::STORE_ID_KEY;

/// What the core waits for: the answer to the one request it has out.
#[derive(Debug)]
enum Phase {
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
struct PrefixAsk {
    /// The index blocked on; 0 for a full read.
    index: u64,
    /// A `?stale` read.
    stale: bool,
    /// Why it was sent.
    sent: Sent,
    /// What index checks found of it (a blocking read's).
    behind: Behind,
}

/// Why a prefix read was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
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
enum Behind {
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
    /// [`REPLACE_UNANSWERED_AFTER`] it is replaced, once, by a full read,
    /// which is not parked and so never replaced again.
    Reissued { checks: u32 },
}

/// How many index checks that show Consul past a read re-issued for being
/// behind it waits before it is replaced by a full read (index 0): 3, six
/// seconds at the default `--index-check` of 2 s, past the two checks of
/// an overloaded fan-out that still answers. A read that is never answered
/// (a proxy or an overloaded server that withholds blocking answers while
/// index checks pass) otherwise holds every change back until the
/// request's own timeout (`--wait` and more).
pub const REPLACE_UNANSWERED_AFTER: u32 = 3;

/// The request out while an answer is confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ConfirmStep {
    /// `~read-check`.
    ReadCheck,
    /// A direct read of the key last in `to_probe`.
    Key { stale: bool },
    /// The store id, after the direct reads.
    StoreId { stale: bool },
}

/// An answer being confirmed.
#[derive(Debug)]
struct Pending {
    view: AnswerView,
    rolled_back: bool,
    /// The answer came from a full read (no index).
    full: bool,
    /// The answer came from a default-consistency read.
    default_read: bool,
    /// A read check is due; with the token load to mark checked when it
    /// passes (`None`: due after a 403, after which the next answer is
    /// checked again).
    read_check: Option<Option<u64>>,
    to_probe: Vec<Box<str>>,
    probes: BTreeMap<Box<str>, Probe>,
    /// A direct read showed a key present or absent: the store id is read
    /// after them, to know they came from the store that gave the answer.
    store_check: bool,
    /// The answer moved past the index blocked on and was not itself a
    /// fresh read: once its direct reads are in, it is refused if it may
    /// hide writes.
    may_refuse: bool,
}

/// A prefix answer with what the core needs to judge it.
#[derive(Debug)]
struct PrefixRead {
    answer: PrefixAnswer,
    meta: ReadMeta,
    token_load: u64,
    ask: PrefixAsk,
}

/// The decision core of one agent. See the module documentation.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    phase: Phase,
    /// Shared with the daemon, which publishes it without a copy.
    served: Option<Arc<ServedState>>,
    synced: bool,
    /// `None` until the ACL probe answers (again after a failure).
    acl: Option<bool>,
    /// The token load whose read access was last checked.
    token_checked: Option<u64>,
    /// Stale mode: the next read is a default one (the first read, and
    /// after a held answer or a cut-off server).
    confirm_default: bool,
    failures: u32,
    /// Writer records (`~meta/<key>`) whose key a direct read found absent,
    /// with the record's ModifyIndex: not read again until the record
    /// changes (a key deleted by hand leaves its record behind).
    records_read: BTreeMap<Box<str>, u64>,
    /// A read from 0 after an index check below the parked index answered
    /// exactly the parked index: nothing went back, nothing new, so the
    /// checks' server lags the leader (a follower that has not applied the
    /// latest writes). Checks below do not read from 0 again until one
    /// answers at the parked index or past it: a follower lagging for long
    /// would otherwise cost a full read every check.
    checks_lag: bool,
}

impl Core {
    /// A core with no state (`restored` `None`: the agent answers nobody
    /// until its first Consul answer) or the state read from disk (answered
    /// at once, and judged against the first answer).
    pub fn new(config: CoreConfig, restored: Option<ServedState>) -> Core {
        Core {
            config,
            phase: Phase::Idle,
            served: restored.map(Arc::new),
            synced: false,
            acl: None,
            token_checked: None,
            confirm_default: true,
            failures: 0,
            records_read: BTreeMap::new(),
            checks_lag: false,
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
        self.phase = Phase::Acl { held: None };
        next(Request::AclProbe, Delay::None)
    }

    /// Whether the request out is a blocking read, which the daemon watches
    /// with an index check every `--index-check`.
    pub fn parked(&self) -> bool {
        matches!(self.phase, Phase::Prefix(ask) if ask.index > 0)
    }

    fn stale_now(&self) -> bool {
        self.config.stale && !self.confirm_default
    }

    /// A prefix read: a full one (no index), or a blocking one on the
    /// served index.
    fn read(&mut self, full: bool, sent: Sent, delay: Delay) -> Next {
        let index = if full { 0 } else { self.current().unwrap_or(0) };
        let stale = self.stale_now();
        self.phase = Phase::Prefix(PrefixAsk {
            index,
            stale,
            sent,
            behind: Behind::No,
        });
        next(Request::Prefix { index, stale }, delay)
    }

    /// Takes what an index check found while a blocking read is parked.
    /// Consul keeps a parked query on the server that holds it: one cut off
    /// from the quorum answers nothing new, and no error, until the wait
    /// ends (1.8.7 `blockingQuery`; no version releases it on a loss of
    /// leadership). So:
    ///
    /// - a check from a server that knows the leader and heard from it
    ///   within `--max-stale` at the parked index confirms the state
    ///   served;
    /// - one below the parked index is Consul's reset rule (api-docs
    ///   features/blocking: an index that goes backwards means read again
    ///   from 0): a snapshot restored under the parked query (which Consul
    ///   holds until its wait ends) or a reaped tombstone. The read is
    ///   re-issued at once as a full default read, which the loss rules
    ///   judge. One check is enough: a stale check from a follower that has
    ///   not applied the last write yet (about 100 ms after it) costs one
    ///   full read that shows the same state, and the default read decides
    ///   in one request in either mode. When that read answers exactly the
    ///   parked index (the checks' server lags), checks below read from 0
    ///   again only after one has answered at the parked index or past it;
    /// - two in a row past it mean the read is parked behind: it is
    ///   re-issued, and answers at once (the first may just have come before
    ///   the read's own answer); a read re-issued so is not re-issued for
    ///   that again, but [`REPLACE_UNANSWERED_AFTER`] more checks past it
    ///   replace it by a full read, once, and ask the daemon to read through
    ///   another address when it has one ([`CheckOutput::reroute`]);
    /// - one from a server that knows no leader, or has not heard from it
    ///   within `--max-stale`, means a read through it is stuck: it is
    ///   re-issued as a default read, which such a server fails after
    ///   Consul's `rpc_hold_timeout` (7 s), and a Consul client agent moves
    ///   to another server on that error; not again for that;
    /// - a failed check confirms nothing.
    ///
    /// Every check gets one note, the daemon's count. A check that comes
    /// after the read returned is ignored.
    pub fn on_index_check(&mut self, check: IndexCheck) -> CheckOutput {
        let mut out = CheckOutput::default();
        let Phase::Prefix(ask) = self.phase else {
            return out;
        };
        if ask.index == 0 {
            return out;
        }
        let rules = self.config.rules;
        let parked = ask.index;
        let act = match check {
            IndexCheck::Failed => {
                out.notes.push(Note::Unconfirmed {
                    reason: Unconfirmed::Failed,
                });
                Act::Keep
            }
            IndexCheck::Answered { index, meta } => {
                match hold_reason(None, index, &meta, self.config.max_stale) {
                    Some(reason) => {
                        out.notes.push(Note::Unconfirmed {
                            reason: Unconfirmed::CutOff(reason),
                        });
                        if ask.sent == Sent::CutOff {
                            Act::Keep
                        } else {
                            Act::CutOff
                        }
                    }
                    None if index < parked && rules.on(Rule::ResetBelow) => {
                        out.notes.push(Note::IndexBelow { parked, index });
                        if self.checks_lag {
                            Act::Keep
                        } else {
                            Act::Reset
                        }
                    }
                    None if index > parked => {
                        self.checks_lag = false;
                        let (behind, then) = match ask.behind {
                            Behind::No => (Behind::Once, BehindStep::Waits),
                            Behind::Reissued { checks } if rules.on(Rule::ReissueBehindOnce) => {
                                let checks = checks.saturating_add(1);
                                if checks >= REPLACE_UNANSWERED_AFTER
                                    && rules.on(Rule::ReplaceUnanswered)
                                {
                                    (ask.behind, BehindStep::Replaced)
                                } else {
                                    (Behind::Reissued { checks }, BehindStep::Waits)
                                }
                            }
                            // Without the rule, as a read sent afresh.
                            Behind::Reissued { .. } => (Behind::Once, BehindStep::Waits),
                            Behind::Once => (ask.behind, BehindStep::Reissued),
                        };
                        if let Phase::Prefix(ask) = &mut self.phase {
                            ask.behind = behind;
                        }
                        out.notes.push(Note::ParkedBehind {
                            parked,
                            index,
                            then,
                        });
                        match then {
                            BehindStep::Waits => Act::Keep,
                            BehindStep::Reissued => Act::Behind,
                            BehindStep::Replaced => Act::Replace,
                        }
                    }
                    None => {
                        if index >= parked {
                            self.checks_lag = false;
                        }
                        out.notes.push(Note::Confirmed {
                            last_contact: meta.last_contact.unwrap_or_default(),
                        });
                        Act::Keep
                    }
                }
            }
        };
        let next = match act {
            Act::Keep => return out,
            // Re-issues that the index-check rule turns off.
            Act::CutOff | Act::Behind if !rules.on(Rule::IndexCheck) => return out,
            Act::CutOff => {
                self.confirm_default = true;
                let next = self.read(false, Sent::CutOff, Delay::None);
                // A read re-issued for being behind stays so, with its
                // own checks before it is replaced.
                if let (Phase::Prefix(new), Behind::Reissued { .. }) = (&mut self.phase, ask.behind)
                {
                    new.behind = Behind::Reissued { checks: 0 };
                }
                next
            }
            Act::Behind => {
                let next = self.read(false, Sent::Next, Delay::None);
                if let Phase::Prefix(new) = &mut self.phase {
                    new.behind = Behind::Reissued { checks: 0 };
                }
                next
            }
            Act::Reset => {
                self.confirm_default = true;
                self.read(true, Sent::Reset { parked }, Delay::None)
            }
            Act::Replace => {
                out.reroute = true;
                self.read(true, Sent::Next, Delay::None)
            }
        };
        out.reissue = Some(next);
        out
    }

    /// Takes the response to the request out and decides what comes next.
    /// `now` is the Unix time in seconds (only recorded, as the start of new
    /// holds). A response that does not fit the request out starts over
    /// with a full read.
    pub fn on_response(&mut self, response: Response, now: u64) -> Output {
        let mut out = Output {
            next: next(Request::AclProbe, Delay::None),
            served_changed: false,
            reload_token: false,
            notes: Vec::new(),
        };
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        out.next = match (phase, response) {
            (_, Response::Failed { forbidden }) => self.fail(forbidden, &mut out),
            (Phase::Acl { held }, Response::Acl { enabled }) => {
                self.acl = Some(enabled);
                out.notes.push(Note::Acl { enabled });
                match held {
                    Some(read) => self.on_prefix(read, now, &mut out),
                    None => self.read(true, Sent::Next, Delay::None),
                }
            }
            (
                Phase::Prefix(ask),
                Response::Prefix {
                    answer,
                    meta,
                    token_load,
                },
            ) => {
                let read = PrefixRead {
                    answer,
                    meta,
                    token_load,
                    ask,
                };
                self.on_prefix(read, now, &mut out)
            }
            (
                Phase::Confirming {
                    mut pending,
                    step: ConfirmStep::ReadCheck,
                },
                Response::ReadCheck { allowed },
            ) => {
                if !allowed {
                    out.notes.push(Note::ReadCheckDenied);
                    self.fail(true, &mut out)
                } else {
                    // A check after a 403 passes for this answer only: the
                    // next one is checked again.
                    if let Some(load) = pending.read_check.take() {
                        self.token_checked = load;
                    }
                    self.proceed(pending, now, &mut out)
                }
            }
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::Key { stale },
                },
                Response::Key { read, index },
            ) => self.on_key(pending, stale, read, index, now, &mut out),
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::StoreId { stale },
                },
                Response::Key { read, index },
            ) => self.on_store_check(pending, stale, read, index, now, &mut out),
            // An ACL answer says what it says whatever was asked.
            (_, Response::Acl { enabled }) => {
                self.acl = Some(enabled);
                out.notes.push(Note::Acl { enabled });
                self.read(true, Sent::Next, Delay::None)
            }
            (_, _) => self.read(true, Sent::Next, Delay::MinInterval),
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
        if self.config.rules.on(Rule::AclReprobe) {
            self.acl = None;
        }
        if forbidden {
            out.reload_token = true;
            self.token_checked = None;
        }
        self.read(true, Sent::Next, Delay::Backoff(self.failures))
    }

    fn on_prefix(&mut self, read: PrefixRead, now: u64, out: &mut Output) -> Next {
        if self.acl.is_none() {
            self.phase = Phase::Acl { held: Some(read) };
            return next(Request::AclProbe, Delay::None);
        }
        let PrefixRead {
            answer,
            meta,
            token_load,
            ask,
        } = read;
        let full = ask.index == 0;
        if let Sent::Reset { parked } = ask.sent {
            self.checks_lag = answer.index == parked;
        }
        let view = AnswerView::new(&self.config.prefix, answer.index, &answer.pairs);
        let (raw_index, empty) = (answer.index, answer.pairs.is_empty());
        // The view holds what is needed: the pairs go now, not after the
        // direct reads (a 10,000-key answer is a few MB).
        drop(answer);

        // A stale answer that could move the state backwards is held.
        if ask.stale {
            if let Some(reason) =
                hold_reason(self.current(), raw_index, &meta, self.config.max_stale)
            {
                out.notes.push(Note::StaleHeld {
                    reason,
                    index: raw_index,
                    served_index: self.current().unwrap_or(0),
                });
                self.confirm_default = true;
                return self.read(true, Sent::Next, Delay::MinInterval);
            }
        }
        let acl_on = self.acl != Some(false) || meta.filtered_by_acls == Some(true);
        if meta.filtered_by_acls == Some(true) {
            out.notes.push(Note::FilteredByAcls);
        }

        // No change: the same index showing the same keys.
        let served = self.served.as_deref();
        if !full && Some(view.index) == self.current() && loss::shows_the_same(served, &view) {
            out.notes.push(Note::NotModified);
            self.failures = 0;
            return self.read(false, Sent::Next, Delay::MinInterval);
        }

        let rolled_back = loss::judge(served, &view, acl_on, self.config.rules, &mut out.notes);

        // Keys the state holds that the answer lacks, and keys only a
        // writer record names, are read directly (ACLs on).
        let probe = acl_on && self.config.rules.on(Rule::ProbeMissing);
        let missing = if rolled_back {
            Vec::new()
        } else {
            loss::missing(served, &view, probe, &self.records_read)
        };

        // An index moved past every key shown, with nothing deleted to
        // explain it, may hide a write: read once more, fresh.
        let moved = self.current().is_some_and(|c| view.index > c);
        if acl_on
            && !rolled_back
            && ask.sent != Sent::Refresh
            && moved
            && view.latest_shown > 0
            && view.index > view.latest_shown
            && missing.is_empty()
        {
            out.notes.push(Note::Refused(Refused::HidesWrites));
            // A policy narrowed since the last check is the likely cause.
            self.token_checked = None;
            return self.read(true, Sent::Refresh, Delay::None);
        }
        let read_check = (acl_on && (empty || self.token_checked != Some(token_load)))
            .then_some(Some(token_load));
        let pending = Box::new(Pending {
            view,
            rolled_back,
            full,
            default_read: !ask.stale,
            read_check,
            to_probe: if probe { missing } else { Vec::new() },
            probes: BTreeMap::new(),
            store_check: false,
            may_refuse: acl_on && !rolled_back && ask.sent != Sent::Refresh && moved,
        });
        self.proceed(pending, now, out)
    }

    /// The next step of a pending answer: its read check, its direct reads,
    /// the store id, then the merge.
    fn proceed(&mut self, mut p: Box<Pending>, now: u64, out: &mut Output) -> Next {
        let stale = self.stale_now();
        let (step, request) = if p.read_check.is_some() {
            (ConfirmStep::ReadCheck, Request::ReadCheck { stale })
        } else if let Some(key) = p.to_probe.last().cloned() {
            (ConfirmStep::Key { stale }, Request::Key { key, stale })
        } else if p.store_check {
            p.store_check = false;
            let key = STORE_ID_KEY.into();
            (ConfirmStep::StoreId { stale }, Request::Key { key, stale })
        } else {
            // After the direct reads: keys the answer lacked that a direct
            // read shows present were filtered, not deleted (a query parked
            // under an older, narrower policy). Such an answer may hide
            // writes to keys the state does not hold, which no direct read
            // asks for: if its index moved past every ModifyIndex it and the
            // direct reads show, with no 404 to explain it, read once more,
            // fresh.
            if p.may_refuse && loss::hides_writes(&p.view, &p.probes) {
                out.notes.push(Note::Refused(Refused::HidesWrites));
                return self.read(true, Sent::Refresh, Delay::None);
            }
            return self.finish(*p, now, out);
        };
        self.phase = Phase::Confirming { pending: p, step };
        next(request, Delay::None)
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
        p: Box<Pending>,
        stale: bool,
        read: KeyRead,
        index: Option<u64>,
        now: u64,
        out: &mut Output,
    ) -> Next {
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
        if !same && stale && read != KeyRead::Forbidden {
            self.phase = Phase::Confirming {
                pending: p,
                step: ConfirmStep::StoreId { stale: false },
            };
            let key = STORE_ID_KEY.into();
            return next(Request::Key { key, stale: false }, Delay::None);
        }
        if same {
            return self.proceed(p, now, out);
        }
        out.notes.push(Note::StoreMoved);
        // Not at once: a store that keeps moving cannot make the loop spin.
        self.read(true, Sent::Next, Delay::MinInterval)
    }

    fn on_key(
        &mut self,
        mut p: Box<Pending>,
        stale: bool,
        read: KeyRead,
        index: Option<u64>,
        now: u64,
        out: &mut Output,
    ) -> Next {
        let Some(key) = p.to_probe.last().cloned() else {
            return self.proceed(p, now, out);
        };
        // A stale server behind the answer may not have the key yet, or
        // still have it: ask the leader.
        if stale && read != KeyRead::Forbidden && index.is_none_or(|i| i < p.view.index) {
            self.phase = Phase::Confirming {
                pending: p,
                step: ConfirmStep::Key { stale: false },
            };
            return next(Request::Key { key, stale: false }, Delay::None);
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
            p.read_check = Some(None);
        } else {
            p.store_check = true;
        }
        let already_hidden = self
            .served
            .as_deref()
            .and_then(|s| s.keys.get(&key))
            .and_then(|r| r.hold)
            .is_some_and(|h| h.cause == HoldCause::Hidden);
        out.notes.push(Note::Probed {
            key: key.clone(),
            result,
            already_hidden,
        });
        p.probes.insert(key, probe);
        self.proceed(p, now, out)
    }

    fn finish(&mut self, p: Pending, now: u64, out: &mut Output) -> Next {
        let input = MergeInput {
            weights_unprotected: !self.config.rules.on(Rule::TrafficOrder),
            rolled_back: p.rolled_back,
            probes: p.probes,
            now,
        };
        let backwards = self.current().is_some_and(|c| p.view.index < c);
        let p_full = p.full;
        let (next_state, changes) = match self.served.as_deref() {
            Some(base) => base.merge(p.view, &input),
            None => ServedState::default().merge(p.view, &input),
        };
        out.served_changed = self.served.as_deref() != Some(&next_state);
        out.notes.push(Note::Applied {
            index: next_state.index,
            changes,
        });
        self.served = Some(Arc::new(next_state));
        if !self.synced {
            self.synced = true;
            out.notes.push(Note::FirstSync);
        }
        self.failures = 0;
        if p.default_read {
            self.confirm_default = false;
        }
        // Consul's rule: after the index went backwards on a blocking read,
        // read again from 0; a full read that shows it needs no second one.
        self.read(backwards && !p_full, Sent::Next, Delay::MinInterval)
    }
}

/// What an index check does with the read out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Nothing.
    Keep,
    /// Re-issue it as a default read: its server is cut off.
    CutOff,
    /// Re-issue it: parked behind.
    Behind,
    /// Read from 0, default: the index went below the parked one.
    Reset,
    /// Replace the re-issued read that went unanswered by a full read.
    Replace,
}

fn next(request: Request, delay: Delay) -> Next {
    Next { request, delay }
}
