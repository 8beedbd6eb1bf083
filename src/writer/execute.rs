//! Running a sequence: read the keys, plan, write each step as
//! compare-and-set transactions of at most [`KEYS_PER_TXN`] keys, each
//! with its record of who wrote it, why and until when and the advance of
//! the write generation, wait, check on the stats socket that HAProxy
//! reached DRAIN and MAINT, stop between steps on a signal, and print the
//! report.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::confirm;
use super::error::{exit, Failure};
use super::haproxy::{self, Server};
use super::held::{self, releases, Record};
use super::output::err_line;
use super::plan::{currents, Change, Current, Plan, Step, WaitFor};
use super::progress::{Run, StepStatus, Stop};
use super::report::Report;
use super::select::{Target, ASSUMED_ROW_KEYS};
use super::session::Writer;

use crate::consul::records::record_ops;
use crate::consul::AdvanceError;
use crate::consul::{TxnOp, TxnOutcome};
use crate::model::meta::records_prefix;
use crate::model::snapshot::build_snapshot;
use crate::model::value::AdminState;

/// How long after the drain wait HAProxy may take to show the servers of a
/// drain from `--haproxy-socket` in DRAIN (several `agent-inter` of 2 s).
pub const DRAIN_CHECK_GRACE: Duration = Duration::from_secs(10);

/// How often the stats socket is read while waiting for DRAIN.
pub(super) const DRAIN_CHECK_POLL: Duration = Duration::from_millis(250);

/// Stops sequences between steps on SIGINT, SIGTERM or SIGHUP.
pub(super) struct Interrupt {
    pub(super) token: CancellationToken,
    pub(super) signal: Arc<Mutex<Option<(&'static str, u8)>>>,
}

impl Interrupt {
    pub(super) fn install() -> std::io::Result<Interrupt> {
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let token = CancellationToken::new();
        let which = Arc::new(Mutex::new(None));
        let (t, w) = (token.clone(), which.clone());
        tokio::spawn(async move {
            let got = tokio::select! {
                _ = int.recv() => ("SIGINT", exit::SIGINT),
                _ = term.recv() => ("SIGTERM", exit::SIGTERM),
                _ = hup.recv() => ("SIGHUP", exit::SIGHUP),
            };
            *w.lock().unwrap() = Some(got);
            t.cancel();
        });
        Ok(Interrupt {
            token,
            signal: which,
        })
    }

    pub(super) fn fired(&self) -> Option<(&'static str, u8)> {
        if self.token.is_cancelled() {
            *self.signal.lock().unwrap()
        } else {
            None
        }
    }

    /// The stop at step `step` for the signal that fired (SIGINT if none
    /// is recorded yet).
    pub(super) fn stop(&self, step: usize) -> Stop {
        let (name, code) = self.fired().unwrap_or(("SIGINT", exit::SIGINT));
        Stop::Signal { step, name, code }
    }

    /// Sleeps `d`; `false` when a signal came first.
    pub(super) async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.token.cancelled() => false,
        }
    }
}

/// The HAProxy admin state [`Writer::check_admin`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Drain,
    Maint,
}

impl Want {
    pub(super) fn flag(self) -> u32 {
        match self {
            Want::Drain => haproxy::ADMIN_FORCED_DRAIN,
            Want::Maint => haproxy::ADMIN_FORCED_MAINT,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Want::Drain => "DRAIN",
            Want::Maint => "MAINT",
        }
    }

    /// What a socket error means for the sequence.
    pub(super) fn unchecked(self) -> &'static str {
        match self {
            Want::Drain => "cannot check that HAProxy drained the servers, so maint is not written",
            Want::Maint => {
                "cannot check that HAProxy put the servers in MAINT (maint is written); look \
                 with `show servers state`"
            }
        }
    }

    /// The failure (exit 65) when the servers `missing` are still not in
    /// this state on HAProxy at `socket` [`DRAIN_CHECK_GRACE`] after the
    /// drain wait (`not_drained`) or after maint was written
    /// (`not_in_maint`), saying what probably decides them instead.
    pub(super) fn not_reached(self, socket: &Path, missing: &[String]) -> Failure {
        let n = missing.len();
        let head = format!(
            "{} {} not in {} on HAProxy at {} {} after {}: {}.",
            n,
            if n == 1 { "server is" } else { "servers are" },
            self.name(),
            socket.display(),
            humantime::format_duration(DRAIN_CHECK_GRACE),
            match self {
                Want::Drain => "the drain wait",
                Want::Maint => "maint was written",
            },
            missing.join(", "),
        );
        let its = if n == 1 { "Its" } else { "Their" };
        let (kind, message) = match self {
            Want::Drain => (
                "not_drained",
                format!(
                    "not drained by the agent: {head} The key written does not decide \
                     {} here: {} agent-send line may start with another key (with \
                     --haproxy-socket alone the row key is only assumed to be \
                     <backend>/<server>: drain with --haproxy-config, which reads it), or \
                     this node's agent is not answering or not in sync (`curl -s \
                     http://127.0.0.1:9778/status`); maint is not written. Take the drain \
                     back with `state undrain` and the same selection",
                    if n == 1 { "it" } else { "them" },
                    its.to_lowercase(),
                ),
            ),
            Want::Maint => (
                "not_in_maint",
                format!(
                    "not in maint: {head} maint is written to {} key, but \
                     something else decides first: {} agent-send probably starts \
                     with another key (a group key such as `canary` at drain), \
                     or the server was set from the HAProxy CLI. Find what \
                     decides with `state explain` and the server's agent-send \
                     line (--haproxy-config), and take it out that way",
                    if n == 1 { "its" } else { "their" },
                    its.to_lowercase(),
                ),
            ),
        };
        Failure::new(exit::DATAERR, kind, message)
    }
}

impl Writer {
    /// Reads the keys, plans, and (unless `dry_run`) writes the plan's steps,
    /// stopping at the first conflict, error or signal. Prints a report of
    /// where every key is now, in every case.
    pub(super) async fn sequence(
        &self,
        action: &'static str,
        target: Result<Target, Failure>,
        dry_run: bool,
        make_plan: impl FnOnce(Vec<(String, Current)>) -> Result<Plan, Failure>,
    ) -> Result<(), Failure> {
        let target = target?;
        if target.keys.is_empty() {
            return Err(target.nothing_selected());
        }
        let (answer, holders) = self.client.list_held(&self.prefix).await?;
        let snapshot = build_snapshot(&self.prefix, answer.index, &answer.pairs);
        let plan = make_plan(currents(&self.prefix, &answer.pairs, &target.keys))?;
        if target.assumed {
            err_line(&format!("note: {ASSUMED_ROW_KEYS}"));
        }
        let mut run = Run::new(&plan, answer.index);
        run.held = self.held(&holders, Some(&target.keys)).await;
        let mut failure = None;
        if dry_run {
            run.statuses
                .iter_mut()
                .for_each(|s| *s = StepStatus::Planned);
        } else if !plan.steps.is_empty() {
            let stop = self.execute(action, &plan, &target, &mut run).await.err();
            // Report what Consul holds now, not only what was written: after
            // a conflict another writer's value is the truth.
            if let Ok(after) = self.client.list_prefix(&self.prefix).await {
                run.observed = Some((
                    currents(&self.prefix, &after.pairs, &target.keys)
                        .into_iter()
                        .collect(),
                    build_snapshot(&self.prefix, after.index, &after.pairs),
                ));
            }
            // The message is written after that read, so that it says what
            // the keys hold now, as the report's table does.
            failure = stop.map(|stop| run.stopped(&plan, stop));
        }
        let report = Report {
            action,
            dry_run,
            plan: &plan,
            run: &run,
            target: &target,
            snapshot: &snapshot,
            failure: failure.as_ref(),
        };
        self.print(&report.model());
        match failure {
            None => Ok(()),
            Some(mut f) => {
                f.reported = true;
                Err(f)
            }
        }
    }

    pub(super) async fn execute(
        &self,
        action: &str,
        plan: &Plan,
        target: &Target,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let interrupt = Interrupt::install().map_err(|e| {
            Stop::Setup(Failure::new(
                1,
                "runtime",
                format!("cannot watch signals: {e}; nothing written"),
            ))
        })?;
        for (i, step) in plan.steps.iter().enumerate() {
            if interrupt.fired().is_some() {
                return Err(interrupt.stop(i));
            }
            match step {
                Step::Wait { duration, purpose } => {
                    let what = match purpose {
                        WaitFor::Drain => "for sessions to finish before maint",
                        WaitFor::Idle { .. } => {
                            "at most, until no load balancer reports a session on the drained \
                             servers, before maint"
                        }
                        WaitFor::Maint => {
                            "so every HAProxy applies maint before the key is cleared. Ctrl-C \
                             now leaves maint in place"
                        }
                        WaitFor::Ramp => {
                            "so every HAProxy serves this weight before the next step. Ctrl-C \
                             now leaves the weight in place"
                        }
                    };
                    let drain = match purpose.drains() {
                        true => ". Ctrl-C now leaves drain in place and does not write maint",
                        false => "",
                    };
                    err_line(&format!(
                        "{action}: waiting {} {what}{drain}",
                        humantime::format_duration(*duration)
                    ));
                    let next = match plan.steps.get(i + 1) {
                        Some(Step::Write { keys, .. }) => keys.as_slice(),
                        _ => &[],
                    };
                    let waited = match (purpose, &target.sessions) {
                        (WaitFor::Idle { at_least }, Some(selector)) => {
                            let servers = (&target.session_servers(next)[..], selector.as_str());
                            let drained = run.confirmations[i.saturating_sub(1)].as_ref();
                            let times = (
                                *at_least,
                                *duration,
                                drained.map_or(Duration::ZERO, |c| c.waited),
                            );
                            run.idle = self.wait_idle(servers, times, &interrupt.token).await;
                            run.idle.is_some()
                        }
                        _ => interrupt.sleep(*duration).await,
                    };
                    if !waited {
                        run.statuses[i] = StepStatus::Interrupted;
                        return Err(interrupt.stop(i));
                    }
                    run.statuses[i] = StepStatus::Done;
                    if let (true, Some(socket)) = (purpose.drains(), &target.socket) {
                        let servers = target.servers_of(next);
                        self.check_admin(action, socket, &servers, Want::Drain, &interrupt, run)
                            .await
                            .map_err(|stop| stop.at(i + 1))?;
                    }
                }
                Step::Write {
                    change,
                    flags,
                    keys,
                } => {
                    let chunked = held::chunks(keys, &run.held, *change);
                    let chunks = chunked.len();
                    for (n, chunk) in chunked.into_iter().enumerate() {
                        if n > 0 && interrupt.fired().is_some() {
                            run.statuses[i] = StepStatus::Partial;
                            return Err(interrupt.stop(i));
                        }
                        let released = run.released.len();
                        let written = self.write_chunk(*change, *flags, chunk, run).await;
                        for (key, holder) in &run.released[released..] {
                            err_line(&held::released_line(action, key, holder, *change));
                        }
                        if let Err(failure) = written {
                            run.statuses[i] = if n == 0 {
                                StepStatus::Failed
                            } else {
                                StepStatus::Partial
                            };
                            return Err(Stop::Failed { step: i, failure });
                        }
                    }
                    run.statuses[i] = StepStatus::Done;
                    err_line(&format!(
                        "{action}: {} written to {} key{} ({chunks} transaction{})",
                        change.describe(),
                        keys.len(),
                        if keys.len() == 1 { "" } else { "s" },
                        if chunks == 1 { "" } else { "s" },
                    ));
                    match self
                        .confirm_written(action, *change, keys, &run.indexes, &interrupt.token)
                        .await
                    {
                        Ok(confirmed) => run.confirmations[i] = confirmed,
                        Err(confirm::Unconfirmed::Failed(failure)) => {
                            return Err(Stop::Failed { step: i, failure })
                        }
                        Err(confirm::Unconfirmed::Interrupted) => return Err(interrupt.stop(i)),
                    }
                    let after_drain_wait = i > 0
                        && matches!(plan.steps[i - 1], Step::Wait { purpose, .. } if purpose.drains());
                    if let (Change::Set(AdminState::Maint), true, Some(socket)) =
                        (change, after_drain_wait, &target.socket)
                    {
                        let servers = target.servers_of(keys);
                        self.check_admin(action, socket, &servers, Want::Maint, &interrupt, run)
                            .await
                            .map_err(|stop| stop.at(i))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// With servers from the stats socket, reads `show servers state` there
    /// again until every server in `servers` is in the state `want`, for at
    /// most [`DRAIN_CHECK_GRACE`]:
    ///
    /// - [`Want::Drain`], after the drain wait: a server HAProxy does not
    ///   drain is one whose agent-send line does not start with the assumed
    ///   row key; the sequence stops before maint (exit 65, `not_drained`).
    /// - [`Want::Maint`], after maint was written: a server HAProxy does not
    ///   put in MAINT is decided by something else first (a group key earlier
    ///   on its agent-send line, e.g. `canary` = drain, which also fooled the
    ///   DRAIN check); exit 65, `not_in_maint`.
    pub(super) async fn check_admin(
        &self,
        action: &str,
        socket: &Path,
        servers: &[&Server],
        want: Want,
        interrupt: &Interrupt,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let failed = |failure: Failure| Stop::Failed { step: 0, failure };
        let deadline = tokio::time::Instant::now() + DRAIN_CHECK_GRACE;
        loop {
            let reached =
                haproxy::with_admin_flag_from_socket(socket, want.flag()).map_err(|e| {
                    let mut f = Failure::from(e);
                    f.message = format!("{}; {}", f.message, want.unchecked());
                    failed(f)
                })?;
            let missing: Vec<String> = servers
                .iter()
                .map(|s| s.id())
                .filter(|id| reached.get(id) != Some(&true))
                .collect();
            if missing.is_empty() {
                err_line(&format!(
                    "{action}: HAProxy at {} shows {} server{} in {}",
                    socket.display(),
                    servers.len(),
                    if servers.len() == 1 { "" } else { "s" },
                    want.name(),
                ));
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                match want {
                    Want::Drain => run.not_drained.clone_from(&missing),
                    Want::Maint => run.not_in_maint.clone_from(&missing),
                }
                return Err(failed(want.not_reached(socket, &missing)));
            }
            if !interrupt.sleep(DRAIN_CHECK_POLL).await {
                return Err(interrupt.stop(0));
            }
        }
    }

    /// One transaction: every key in `chunk` gets `change` (a value with
    /// Consul Flags `flags`), each only if its ModifyIndex is the one last
    /// seen, and its record is written (or deleted with it) under
    /// [`records_prefix`], an earlier writer's record below the prefix
    /// deleted, after the keys so that a refused operation's position names
    /// its key. A token refused the records prefix gets them below the
    /// prefix, with a warning. A value for a
    /// key a Consul session holds is written with its release
    /// ([`held`]): the index check, then `unlock`.
    pub(super) async fn write_chunk(
        &self,
        change: Change,
        flags: u64,
        chunk: &[String],
        run: &mut Run,
    ) -> Result<(), Failure> {
        self.ensure_store_id().await?;
        let mut ops = Vec::new();
        // The key of each operation on a key, by position.
        let mut owners = Vec::new();
        for k in chunk {
            let (key, index) = (self.full(k), run.indexes.get(k).copied().unwrap_or(0));
            let (value, holder) = (
                change.state().map(|s| s.to_string().into_bytes()),
                run.held.get(k),
            );
            match (value, holder) {
                (Some(value), Some(h)) => {
                    ops.push(TxnOp::CheckIndex {
                        key: key.clone(),
                        index,
                    });
                    let session = h.id.clone();
                    ops.push(TxnOp::Unlock {
                        key,
                        value,
                        flags,
                        session,
                    });
                    owners.extend([k, k]);
                }
                (Some(value), None) => {
                    ops.push(TxnOp::Cas {
                        key,
                        value,
                        flags,
                        index,
                    });
                    owners.push(k);
                }
                (None, _) => {
                    ops.push(TxnOp::DeleteCas { key, index });
                    owners.push(k);
                }
            }
        }
        let meta = change.state().map(|s| self.author.record(s));
        let held = &run.held;
        let records = |beside: bool| -> Vec<TxnOp> {
            (chunk.iter())
                .flat_map(|k| {
                    let record = meta.as_ref().map(|meta| Record {
                        meta,
                        released_session: held.get(k).filter(|_| releases(held, k, change)),
                    });
                    record_ops(&self.prefix, k, record.as_ref(), beside)
                })
                .collect()
        };
        let keys_only = ops.len();
        ops.extend(records(false));
        let outcome = match self.client.txn_advancing(&self.prefix, &ops).await {
            // A token that may write the prefix only (granted before records
            // moved): the whole transaction was refused, so nothing was
            // written; the records go below the prefix, as before.
            Err(AdvanceError::Denied(why)) => {
                ops.truncate(keys_only);
                ops.extend(records(true));
                let outcome = self.client.txn_advancing(&self.prefix, &ops).await?;
                let sibling = records_prefix(&self.prefix);
                err_line(&format!(
                    "warning: records written below the prefix, where every agent downloads \
                     them: the token may not write {sibling} ({why})"
                ));
                outcome
            }
            outcome => outcome?,
        };
        match outcome {
            TxnOutcome::Committed(results) => {
                for k in chunk {
                    run.now.insert(k.clone(), change.state());
                    if change == Change::Clear {
                        run.indexes.insert(k.clone(), 0);
                    }
                    if let Some(holder) = run.held.remove(k) {
                        run.released.push((k.clone(), holder));
                    }
                }
                // Records' indexes too: the same as their keys', never asked.
                // In order, so a released key's index is its unlock's, after
                // its index check's.
                for pair in results {
                    if let Some(rel) = pair.key.strip_prefix(&self.prefix) {
                        run.indexes.insert(rel.to_string(), pair.modify_index);
                    }
                }
                Ok(())
            }
            TxnOutcome::RolledBack(errors) => {
                let mut lines = Vec::new();
                for e in &errors {
                    let Some(key) = owners.get(e.op_index) else {
                        lines.push(e.what.clone());
                        continue;
                    };
                    let expected = run.indexes.get(*key).copied().unwrap_or(0);
                    let now = match self.client.get_held_key(&self.full(key)).await {
                        Ok(p) => {
                            let c = Current::from_pair(p.as_ref().map(|(p, _)| p));
                            let held = match p.and_then(|(_, s)| s) {
                                Some(s) => format!(", held by Consul session {s}"),
                                None => String::new(),
                            };
                            format!("now {} at ModifyIndex {}{held}", c.describe(), c.index())
                        }
                        Err(_) => "now unknown".to_string(),
                    };
                    lines.push(format!(
                        "{key} changed since this run last read or wrote it (expected \
                         ModifyIndex {expected}, {now})"
                    ));
                }
                lines.dedup();
                Err(Failure::rolled_back(&lines))
            }
        }
    }
}
