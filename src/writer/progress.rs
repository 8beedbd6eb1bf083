//! Where a sequence got to: the status of each step, why it stopped
//! ([`Stop`]), and [`Run`], which records what was written and says so in
//! the failure's message (what was written, what the keys hold now, what
//! was not written).

use std::collections::HashMap;
use std::time::Duration;

use super::error::Failure;
use super::plan::{shown, Current, Plan, Step};
use crate::model::snapshot::Snapshot;
use crate::model::value::AdminState;

/// Where one step of a sequence got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StepStatus {
    Planned,
    Done,
    Partial,
    Failed,
    Interrupted,
    NotRun,
}

impl StepStatus {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            StepStatus::Planned => "planned",
            StepStatus::Done => "done",
            StepStatus::Partial => "partial",
            StepStatus::Failed => "failed",
            StepStatus::Interrupted => "interrupted",
            StepStatus::NotRun => "not_run",
        }
    }
}

/// Why a sequence stopped before its end.
pub(super) enum Stop {
    /// Before any step.
    Setup(Failure),
    /// A signal, before or during step `step`.
    Signal {
        step: usize,
        name: &'static str,
        code: u8,
    },
    /// Step `step` failed (a conflict, Consul, permission).
    Failed { step: usize, failure: Failure },
}

impl Stop {
    /// The same stop, at step `step`.
    pub(super) fn at(self, step: usize) -> Stop {
        match self {
            Stop::Failed { failure, .. } => Stop::Failed { step, failure },
            Stop::Signal { name, code, .. } => Stop::Signal { step, name, code },
            other => other,
        }
    }
}

/// A write step every agent confirmed, through Prometheus
/// (with `--prometheus`). Its JSON: `{index, agents_at_index,
/// rows_answered, state, waited_seconds, confirmed_by_index_only}`, and for
/// a group key `group` ([`crate::fleet::GroupVerdict`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(super) struct Confirmation {
    /// The index every agent reached: the write's ModifyIndex, or for a
    /// removal the prefix's X-Consul-Index read after it.
    pub(super) index: u64,
    /// How many agents confirmed it (all the selector matched).
    #[serde(rename = "agents_at_index")]
    pub(super) agents: usize,
    /// The answer the write produces (`drain`, `maint`, `ready`, ...).
    pub(super) state: &'static str,
    /// For a group key, the servers naming it that answer `state`; `None`
    /// (null) for row keys, whose rows the agents do not count apart.
    #[serde(rename = "rows_answered")]
    pub(super) rows: Option<u64>,
    /// From the start of the wait to the confirmation (to the millisecond).
    #[serde(rename = "waited_seconds", serialize_with = "to_the_ms")]
    pub(super) waited: Duration,
    /// For a group key: the servers it decides and those another key
    /// decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) group: Option<crate::fleet::GroupVerdict>,
    /// Agents confirmed by their index alone.
    #[serde(rename = "confirmed_by_index_only")]
    pub(super) by_index_only: Vec<String>,
}

fn to_the_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
}

pub(super) use crate::fleet::idle::Idle;

/// Where a sequence got to.
pub(super) struct Run {
    /// Consul index of the read the plan was made from.
    pub(super) read_index: u64,
    /// Last ModifyIndex seen per key (0: absent).
    pub(super) indexes: HashMap<String, u64>,
    /// Keys written so far and what they hold now (`None`: removed).
    pub(super) now: HashMap<String, Option<AdminState>>,
    /// One per plan step.
    pub(super) statuses: Vec<StepStatus>,
    /// One per plan step: set for a write step every agent confirmed.
    pub(super) confirmations: Vec<Option<Confirmation>>,
    /// The keys and the snapshot as read again at the end, when that read
    /// worked.
    pub(super) observed: Option<(HashMap<String, Current>, Snapshot)>,
    /// Servers HAProxy did not put in DRAIN after the drain wait (with
    /// `--haproxy-socket`).
    pub(super) not_drained: Vec<String>,
    /// Servers HAProxy did not put in MAINT after maint was written (with
    /// `--haproxy-socket`).
    pub(super) not_in_maint: Vec<String>,
    pub(super) idle: Option<Idle>,
    /// Keys a Consul session holds and this run has not written yet.
    pub(super) held: super::held::Held,
    /// Keys this run released from a session by writing them, in order.
    pub(super) released: Vec<(String, crate::consul::Holder)>,
}

impl Run {
    pub(super) fn new(plan: &Plan, read_index: u64) -> Run {
        Run {
            read_index,
            indexes: plan
                .keys
                .iter()
                .map(|k| (k.key.clone(), k.before.index()))
                .collect(),
            now: HashMap::new(),
            statuses: vec![StepStatus::NotRun; plan.steps.len()],
            confirmations: vec![None; plan.steps.len()],
            observed: None,
            not_drained: Vec::new(),
            not_in_maint: Vec::new(),
            idle: None,
            held: super::held::Held::new(),
            released: Vec::new(),
        }
    }

    pub(super) fn not_run_from(&mut self, from: usize) {
        for s in self.statuses.iter_mut().skip(from) {
            *s = StepStatus::NotRun;
        }
    }

    /// What this run wrote, what the keys hold now when they could be read
    /// again (another writer's changes named as such), and what was not
    /// written, from step `from` on.
    pub(super) fn progress(&self, plan: &Plan, from: usize) -> String {
        let mut parts = Vec::new();
        let mut written: Vec<(&String, &Option<AdminState>)> = self.now.iter().collect();
        written.sort_by(|a, b| a.0.cmp(b.0));
        let sets: Vec<String> = written
            .iter()
            .filter_map(|(k, s)| s.map(|s| format!("{k} = {s}")))
            .collect();
        let clears: Vec<&str> = written
            .iter()
            .filter(|(_, s)| s.is_none())
            .map(|(k, _)| k.as_str())
            .collect();
        if !sets.is_empty() {
            parts.push(format!("wrote {}", sets.join(", ")));
        }
        if !clears.is_empty() {
            parts.push(format!("removed {}", clears.join(", ")));
        }
        if parts.is_empty() {
            parts.push("this run wrote nothing".to_string());
        }
        let observed = self.observed.as_ref().map(|(keys, _)| keys);
        match observed {
            None => parts.push(
                "what the keys hold now is unknown (reading them again failed; look with \
                 `state list`)"
                    .to_string(),
            ),
            Some(observed) => {
                let mut changed = Vec::new();
                for k in &plan.keys {
                    let Some(now) = observed.get(&k.key) else {
                        continue;
                    };
                    let now_shown = now.describe();
                    match self.now.get(&k.key) {
                        Some(ours) => {
                            let ours = shown(*ours);
                            if now_shown != ours {
                                changed.push(format!(
                                    "then {} changed to {now_shown} by someone else",
                                    k.key
                                ));
                            }
                        }
                        None => {
                            let before = k.before.describe();
                            if now_shown != before {
                                changed.push(format!(
                                    "{} changed from {before} to {now_shown} by someone else",
                                    k.key
                                ));
                            }
                        }
                    }
                }
                if !changed.is_empty() {
                    parts.push(format!("{}; nothing overwritten", changed.join(", ")));
                }
            }
        }
        let pending: Vec<String> = plan.steps[from.min(plan.steps.len())..]
            .iter()
            .filter_map(|s| match s {
                Step::Write { change, keys, .. } => {
                    let target = change.state();
                    let left = keys
                        .iter()
                        .filter(|k| self.now.get(*k) != Some(&target))
                        .count();
                    (left > 0).then(|| {
                        format!(
                            "{} was NOT written to {left} key{}",
                            change.describe(),
                            if left == 1 { "" } else { "s" }
                        )
                    })
                }
                Step::Wait { .. } => None,
            })
            .collect();
        parts.push(if pending.is_empty() {
            "nothing was left to write".to_string()
        } else {
            pending.join(", ")
        });
        let mut text = parts.join("; ");
        if let Some(observed) = observed {
            let invalid: Vec<&str> = plan
                .keys
                .iter()
                .filter(|k| matches!(observed.get(&k.key), Some(Current::Invalid { .. })))
                .map(|k| k.key.as_str())
                .collect();
            if invalid.is_empty() {
                text.push_str(". Every key holds a valid value");
            } else {
                text.push_str(&format!(
                    ". {} now {} an invalid value",
                    invalid.join(", "),
                    if invalid.len() == 1 { "holds" } else { "hold" }
                ));
            }
        }
        text
    }

    /// The failure for a signal during step `current` (or before it),
    /// naming what is left unwritten.
    pub(super) fn interrupted(
        &mut self,
        plan: &Plan,
        current: usize,
        name: &str,
        code: u8,
    ) -> Failure {
        self.not_run_from(current + 1);
        Failure::new(
            code,
            "interrupted",
            format!(
                "interrupted by {name}: {}. Re-run the same command to finish (it is \
                 idempotent)",
                self.progress(plan, current)
            ),
        )
    }

    /// The failure for a sequence that stopped, its message describing what
    /// was written and what the keys hold now.
    pub(super) fn stopped(&mut self, plan: &Plan, stop: Stop) -> Failure {
        match stop {
            Stop::Setup(f) => f,
            Stop::Signal { step, name, code } => self.interrupted(plan, step, name, code),
            Stop::Failed { step, mut failure } => {
                self.not_run_from(step + 1);
                failure.message = format!(
                    "{}. So far: {}",
                    failure.message.trim_end_matches('.'),
                    self.progress(plan, step)
                );
                failure
            }
        }
    }

    /// What `key` holds now, given what it held before.
    pub(super) fn now_of(&self, key: &str, before: &Current) -> String {
        if let Some(c) = self.observed.as_ref().and_then(|(keys, _)| keys.get(key)) {
            return c.describe();
        }
        match self.now.get(key) {
            Some(s) => shown(*s),
            None => before.describe(),
        }
    }
}
