//! The core as a state machine: one phase (`phase.rs`) says what it waits
//! for, and each response is matched against it. Every transition has a
//! row in the table tests (`tests.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config::{CoreConfig, Rule};
use super::loss;
use super::phase::{
    Acl, Behind, ChecksServer, ConfirmStep, Consistency, Judged, Pending, Phase, PrefixAsk,
    PrefixRead, Read, ReadCheck, Refusal, Sent, StaleReads, StoreCheck,
};
use super::protocol::{
    BehindStep, CheckOutput, Delay, IndexCheck, KeyRead, Next, Note, Output, Refused, Request,
    Response, Unconfirmed,
};
use super::served::{AnswerView, ConsulKey, HoldCause, MergeInput, Probe, ServedState};
use super::stale::hold_reason;
use crate::model::identity::STORE_ID_KEY;

mod records;

/// How many index checks that show Consul past a read re-issued for being
/// behind it waits before it is replaced by a full read (index 0): 3, six
/// seconds at the default `--index-check` of 2 s, past the two checks of
/// an overloaded fan-out that still answers. A read that is never answered
/// (a proxy or an overloaded server that withholds blocking answers while
/// index checks pass) otherwise holds every change back until the
/// request's own timeout (`--wait` and more).
pub const REPLACE_UNANSWERED_AFTER: u32 = 3;

/// The decision core of one agent. See the module documentation.
#[derive(Debug)]
pub struct Core {
    config: CoreConfig,
    phase: Phase,
    /// Shared with the daemon, which publishes it without a copy.
    served: Option<Arc<ServedState>>,
    synced: bool,
    /// What the ACL probe answered (unknown again after a failure).
    acl: Acl,
    /// The token load whose read access was last checked.
    token_checked: Option<u64>,
    /// Whether reads may go to any server (`--consistency stale`).
    stale_reads: StaleReads,
    failures: u32,
    /// Writer records (`~meta/<key>`) whose key a direct read found absent,
    /// with the record's ModifyIndex: not read again until the record
    /// changes (a key deleted by hand leaves its record behind).
    records_read: BTreeMap<Box<str>, u64>,
    /// Whether the index checks' server is known to lag the leader.
    checks: ChecksServer,
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
            acl: Acl::Unknown,
            token_checked: None,
            stale_reads: StaleReads::ConfirmFirst,
            failures: 0,
            records_read: BTreeMap::new(),
            checks: ChecksServer::InStep,
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
        matches!(
            self.phase,
            Phase::Prefix(PrefixAsk {
                read: Read::Blocking { .. },
                ..
            })
        )
    }

    /// Which servers the next request may go to.
    fn consistency_now(&self) -> Consistency {
        Consistency::of(self.config.stale && self.stale_reads == StaleReads::Allowed)
    }

    /// A prefix read: a full one (no index), or a blocking one on the
    /// served index.
    fn read(&mut self, full: bool, sent: Sent, delay: Delay) -> Next {
        let index = if full { 0 } else { self.current().unwrap_or(0) };
        let consistency = self.consistency_now();
        self.phase = Phase::Prefix(PrefixAsk {
            read: Read::on(index),
            consistency,
            sent,
        });
        let stale = consistency.is_stale();
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
        let Read::Blocking {
            index: parked,
            behind: was_behind,
        } = ask.read
        else {
            return out;
        };
        let rules = self.config.rules;
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
                        if self.checks == ChecksServer::Lags {
                            Act::Keep
                        } else {
                            Act::Reset
                        }
                    }
                    None if index > parked => {
                        self.checks = ChecksServer::InStep;
                        let (behind, then) = match was_behind {
                            Behind::No => (Behind::Once, BehindStep::Waits),
                            Behind::Reissued { checks } if rules.on(Rule::ReissueBehindOnce) => {
                                let checks = checks.saturating_add(1);
                                if checks >= REPLACE_UNANSWERED_AFTER
                                    && rules.on(Rule::ReplaceUnanswered)
                                {
                                    (was_behind, BehindStep::Replaced)
                                } else {
                                    (Behind::Reissued { checks }, BehindStep::Waits)
                                }
                            }
                            // Without the rule, as a read sent afresh.
                            Behind::Reissued { .. } => (Behind::Once, BehindStep::Waits),
                            Behind::Once => (was_behind, BehindStep::Reissued),
                        };
                        self.set_behind(behind);
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
                            self.checks = ChecksServer::InStep;
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
                self.stale_reads = StaleReads::ConfirmFirst;
                let next = self.read(false, Sent::CutOff, Delay::None);
                // A read re-issued for being behind stays so, with its
                // own checks before it is replaced.
                if let Behind::Reissued { .. } = was_behind {
                    self.set_behind(Behind::Reissued { checks: 0 });
                }
                next
            }
            Act::Behind => {
                let next = self.read(false, Sent::Next, Delay::None);
                self.set_behind(Behind::Reissued { checks: 0 });
                next
            }
            Act::Reset => {
                self.stale_reads = StaleReads::ConfirmFirst;
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

    /// Records what index checks found of the blocking read out.
    fn set_behind(&mut self, found: Behind) {
        if let Phase::Prefix(PrefixAsk {
            read: Read::Blocking { behind, .. },
            ..
        }) = &mut self.phase
        {
            *behind = found;
        }
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
                self.acl = Acl::of(enabled);
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
                    if pending.read_check != ReadCheck::NotDue {
                        self.token_checked = pending.read_check.checked();
                        pending.read_check = ReadCheck::NotDue;
                    }
                    self.proceed(pending, now, &mut out)
                }
            }
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::RecordNames { consistency },
                },
                Response::RecordNames { names, index },
            ) => self.on_record_names(pending, consistency, names, index, now, &mut out),
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::Record { key, never_held },
                },
                Response::Key { read, .. },
            ) => self.on_record(pending, key, never_held, read, now, &mut out),
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::Key { consistency },
                },
                Response::Key { read, index },
            ) => self.on_key(pending, consistency, read, index, now, &mut out),
            (
                Phase::Confirming {
                    pending,
                    step: ConfirmStep::StoreId { consistency },
                },
                Response::Key { read, index },
            ) => self.on_store_check(pending, consistency, read, index, now, &mut out),
            // An ACL answer says what it says whatever was asked.
            (_, Response::Acl { enabled }) => {
                self.acl = Acl::of(enabled);
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
            self.acl = Acl::Unknown;
        }
        if forbidden {
            out.reload_token = true;
            self.token_checked = None;
        }
        self.read(true, Sent::Next, Delay::Backoff(self.failures))
    }

    fn on_prefix(&mut self, read: PrefixRead, now: u64, out: &mut Output) -> Next {
        if self.acl == Acl::Unknown {
            self.phase = Phase::Acl { held: Some(read) };
            return next(Request::AclProbe, Delay::None);
        }
        let PrefixRead {
            answer,
            meta,
            token_load,
            ask,
        } = read;
        let full = ask.read == Read::Full;
        if let Sent::Reset { parked } = ask.sent {
            self.checks = match answer.index == parked {
                true => ChecksServer::Lags,
                false => ChecksServer::InStep,
            };
        }
        let view = AnswerView::new(&self.config.prefix, answer.index, &answer.pairs);
        let (raw_index, empty) = (answer.index, answer.pairs.is_empty());
        // The view holds what is needed: the pairs go now, not after the
        // direct reads (a 10,000-key answer is a few MB).
        drop(answer);

        // A stale answer that could move the state backwards is held.
        if ask.consistency.is_stale() {
            if let Some(reason) =
                hold_reason(self.current(), raw_index, &meta, self.config.max_stale)
            {
                out.notes.push(Note::StaleHeld {
                    reason,
                    index: raw_index,
                    served_index: self.current().unwrap_or(0),
                });
                self.stale_reads = StaleReads::ConfirmFirst;
                return self.read(true, Sent::Next, Delay::MinInterval);
            }
        }
        let acl_on = self.acl != Acl::Disabled || meta.filtered_by_acls == Some(true);
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
        // The writer keeps its records beside the prefix, out of the
        // answer: a key the token may not read that a writer transaction
        // wrote since the state served shows in no answer (its index is
        // the generation's, written in the same transaction). With ACLs
        // on, the names of the records are listed after each writer
        // transaction (and at the first answer), and the keys they name
        // that nothing shows are read directly.
        let list_records = probe
            && !rolled_back
            && self.config.rules.on(Rule::ListRecords)
            && view.generation_index > 0
            && self.current().is_none_or(|c| view.generation_index > c);
        let read_check = match acl_on && (empty || self.token_checked != Some(token_load)) {
            true => ReadCheck::Due { token_load },
            false => ReadCheck::NotDue,
        };
        let refusal = match acl_on && !rolled_back && ask.sent != Sent::Refresh && moved {
            true => Refusal::IfHidesWrites,
            false => Refusal::Never,
        };
        let pending = Box::new(Pending {
            view,
            judged: match rolled_back {
                true => Judged::RolledBack,
                false => Judged::Kept,
            },
            read: ask.read,
            consistency: ask.consistency,
            read_check,
            list_records,
            listed: false,
            named: Vec::new(),
            to_probe: if probe { missing } else { Vec::new() },
            probes: BTreeMap::new(),
            written: BTreeMap::new(),
            store_check: StoreCheck::NotDue,
            refusal,
        });
        self.proceed(pending, now, out)
    }

    /// The next step of a pending answer: its read check, its direct reads,
    /// the store id, then the merge.
    fn proceed(&mut self, mut p: Box<Pending>, now: u64, out: &mut Output) -> Next {
        let consistency = self.consistency_now();
        let stale = consistency.is_stale();
        let (step, request) = if p.read_check != ReadCheck::NotDue {
            (ConfirmStep::ReadCheck, Request::ReadCheck { stale })
        } else if p.list_records {
            p.list_records = false;
            (
                ConfirmStep::RecordNames { consistency },
                Request::RecordNames { stale },
            )
        } else if let Some(key) = p.to_probe.last().cloned() {
            (
                ConfirmStep::Key { consistency },
                Request::Key { key, stale },
            )
        } else if p.store_check == StoreCheck::Due {
            p.store_check = StoreCheck::NotDue;
            let key = STORE_ID_KEY.into();
            (
                ConfirmStep::StoreId { consistency },
                Request::Key { key, stale },
            )
        } else {
            // After the direct reads: keys the answer lacked that a direct
            // read shows present were filtered, not deleted (a query parked
            // under an older, narrower policy). Such an answer may hide
            // writes to keys the state does not hold, which no direct read
            // asks for: if its index moved past every ModifyIndex it and the
            // direct reads show, with no 404 to explain it, read once more,
            // fresh.
            if p.refusal == Refusal::IfHidesWrites && loss::hides_writes(&p.view, &p.probes) {
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
        consistency: Consistency,
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
        if !same && consistency.is_stale() && read != KeyRead::Forbidden {
            self.phase = Phase::Confirming {
                pending: p,
                step: ConfirmStep::StoreId {
                    consistency: Consistency::Default,
                },
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
        consistency: Consistency,
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
        if consistency.is_stale()
            && read != KeyRead::Forbidden
            && index.is_none_or(|i| i < p.view.index)
        {
            self.phase = Phase::Confirming {
                pending: p,
                step: ConfirmStep::Key {
                    consistency: Consistency::Default,
                },
            };
            return next(Request::Key { key, stale: false }, Delay::None);
        }
        p.to_probe.pop();
        // A key only a record names that the token may read, yet the answer
        // lacked: a query parked under an older policy, or a store changed
        // under the answer (a snapshot restored keeps the store id). The
        // answer is read afresh, once (a fresh read, or the first answer,
        // takes the key as read).
        if matches!(read, KeyRead::Present(_))
            && p.named.contains(&key)
            && p.refusal == Refusal::IfHidesWrites
        {
            out.notes.push(Note::Refused(Refused::HidesWrites));
            return self.read(true, Sent::Refresh, Delay::None);
        }
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
            p.read_check = ReadCheck::AfterForbidden;
        } else {
            p.store_check = StoreCheck::Due;
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
        let never_held = self
            .served
            .as_deref()
            .is_none_or(|s| !s.keys.contains_key(&key));
        // A key the state never held, hidden: found by a record; or one held
        // hidden when a writer transaction came since (its record names
        // what the writer wrote last, which may be this key).
        let read_record = probe == Probe::Forbidden && (never_held || p.listed);
        p.probes.insert(key.clone(), probe);
        if read_record {
            // An earlier writer's record below the prefix is in the answer;
            // one beside it is read.
            if let Some(state) = p
                .view
                .meta
                .get(&key)
                .and_then(|(m, _)| Core::record_state(m))
            {
                p.written.insert(key, state);
            } else if self.config.rules.on(Rule::ListRecords) {
                self.phase = Phase::Confirming {
                    pending: p,
                    step: ConfirmStep::Record {
                        key: key.clone(),
                        never_held,
                    },
                };
                return next(Request::Record { key }, Delay::None);
            }
        }
        self.proceed(p, now, out)
    }

    fn finish(&mut self, p: Pending, now: u64, out: &mut Output) -> Next {
        let input = MergeInput {
            weights_unprotected: !self.config.rules.on(Rule::TrafficOrder),
            rolled_back: p.judged == Judged::RolledBack,
            probes: p.probes,
            written: p.written,
            now,
        };
        let backwards = self.current().is_some_and(|c| p.view.index < c);
        let p_full = p.read == Read::Full;
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
        if p.consistency == Consistency::Default {
            self.stale_reads = StaleReads::Allowed;
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
