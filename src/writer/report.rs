//! What a `state` command prints, each as one model: `--json` prints its
//! fields and the text is rendered from the same value ([`Render`]): a key
//! of `get` and `list` ([`KeyView`]), `set` and `clear` ([`KeyReport`]), a
//! sequence ([`SequenceReport`]).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use super::error::Failure;
use super::haproxy::{Enrolment, Server};
use super::held::{self, held_note};
use super::output::{table, Render};
use super::plan::{self, is_row_key, show_raw, Current, Plan, Step};
use super::progress::{Confirmation, Idle, Run};
use super::select::{Target, ASSUMED_ROW_KEYS, NAMED_ROW_KEY};
use crate::consul::{Holder, KvPair};
use crate::model::marks::{is_drain_mark, mark_name};
use crate::model::meta::Records;
use crate::model::snapshot::{Answer, Entry, Snapshot};
use crate::model::value::{parse_value, AdminState, InvalidValue};

/// A value for display: as stored when it is plain text, else quoted.
pub(super) fn display_value(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(s) if !s.is_empty() && s.len() <= 40 && s.bytes().all(|b| b.is_ascii_graphic()) => {
            s.to_string()
        }
        _ => show_raw(raw),
    }
}

/// The SET-BY column: `-` for a group key (its Flags mean nothing), else
/// [`mark_name`].
pub(super) fn set_by(key: &str, flags: u64) -> String {
    if is_row_key(key) {
        mark_name(flags)
    } else {
        "-".to_string()
    }
}

/// One key as `get` and `list` show it: `--json` prints its fields (an
/// absent key only `key` and `present: false`), and its row of the key
/// table is rendered from them.
#[derive(Serialize)]
pub(super) struct KeyView {
    key: String,
    present: bool,
    #[serde(flatten)]
    pair: Option<PairView>,
}

/// A present key: its value, ModifyIndex, Flags, record and what the agent
/// makes of it.
#[derive(Serialize)]
struct PairView {
    value: String,
    modify_index: u64,
    flags: u64,
    by_drain: bool,
    set_by: String,
    written: Value,
    valid: bool,
    #[serde(flatten)]
    verdict: Verdict,
    /// The WRITTEN column ([`Records::describe`]).
    #[serde(skip)]
    described: String,
    /// The Consul session holding the key (`null`: none).
    session: Option<Holder>,
}

/// What the agent makes of a value; `reply` is the REPLY column (for an
/// invalid value [`crate::model::value::InvalidValue::reply_text`]).
#[derive(Serialize)]
#[serde(untagged)]
enum Verdict {
    Valid {
        state: String,
        reply: String,
    },
    Invalid {
        error: String,
        #[serde(skip)]
        reply: String,
    },
}

impl KeyView {
    /// `key` (below the prefix) and its pair, with the agent's verdict
    /// `entry` when known (key validity included), else its value's.
    /// `held`: the session holding the key.
    pub(super) fn new(
        key: &str,
        (p, held): (Option<&KvPair>, Option<&Holder>),
        e: Option<&Entry>,
        r: &Records,
    ) -> Self {
        let pair = p.map(|p| {
            let state = match e {
                Some(Entry::Valid(s)) => Ok(*s),
                Some(Entry::Invalid(e)) => Err(InvalidValue::clone(e)),
                Some(Entry::Unreadable | Entry::AtMost(_)) | None => parse_value(&p.value),
            };
            PairView {
                value: String::from_utf8_lossy(&p.value).into(),
                modify_index: p.modify_index,
                flags: p.flags,
                by_drain: is_row_key(key) && is_drain_mark(p.flags),
                set_by: set_by(key, p.flags),
                written: r.written(key, p),
                valid: state.is_ok(),
                verdict: match state {
                    Ok(s) => Verdict::Valid {
                        state: s.to_string(),
                        reply: s.reply_text(),
                    },
                    Err(e) => Verdict::Invalid {
                        error: e.to_string(),
                        reply: e.reply_text(),
                    },
                },
                described: r.describe(key, p),
                session: held.cloned(),
            }
        });
        let present = pair.is_some();
        KeyView {
            key: key.to_string(),
            present,
            pair,
        }
    }

    /// [`held_note`] of the key, when a session holds it.
    pub(super) fn held_note(&self) -> Option<String> {
        let holder = self.pair.as_ref()?.session.as_ref()?;
        Some(held_note(&self.key, holder))
    }

    /// True for a present key holding a value the agent refuses.
    pub(super) fn invalid(&self) -> bool {
        self.pair.as_ref().is_some_and(|p| !p.valid)
    }
}

/// The key table of `get` and `list` (absent keys have no row).
pub(super) fn key_table(keys: &[KeyView]) -> String {
    let rows: Vec<Vec<String>> = (keys.iter().filter_map(|k| Some((k, k.pair.as_ref()?))))
        .map(|(k, p)| {
            let (state, reply) = match &p.verdict {
                Verdict::Valid { state, reply } => (state.clone(), reply),
                Verdict::Invalid { error, reply } => (format!("INVALID: {error}"), reply),
            };
            let (value, index) = (display_value(p.value.as_bytes()), p.modify_index);
            let (index, set_by) = (index.to_string(), &p.set_by);
            [&k.key, &value, &state, reply, &index, &p.described, set_by]
                .map(String::clone)
                .to_vec()
        })
        .collect();
    let header = "KEY VALUE STATE REPLY MODIFY-INDEX WRITTEN SET-BY";
    let mut out = table(&header.split(' ').collect::<Vec<_>>(), &rows);
    for note in keys.iter().filter_map(KeyView::held_note) {
        out.push_str(&format!("{note}.\n"));
    }
    out
}

/// True for a state that keeps a server in rotation: ready, or a weight
/// above 0.
fn in_service(state: AdminState) -> bool {
    matches!(state, AdminState::Ready | AdminState::Weight(1..))
}

/// The report of `set` and `clear`: one key, written or not, and its
/// confirmation. `--json` prints its fields; the text is its table.
#[derive(Serialize)]
pub(super) struct KeyReport {
    pub(super) ok: bool,
    pub(super) error: Option<Failure>,
    pub(super) confirmed: Option<Confirmation>,
    pub(super) key: String,
    pub(super) before: String,
    pub(super) after: String,
    pub(super) modify_index_before: u64,
    pub(super) flags_before: u64,
    pub(super) by_drain_before: bool,
    pub(super) written: bool,
    pub(super) dry_run: bool,
    pub(super) note: Option<&'static str>,
    /// The Consul session this write released the key from.
    pub(super) released_session: Option<Holder>,
    /// The Consul session that still holds the key (a dry run, or a write
    /// that failed).
    pub(super) session: Option<Holder>,
    /// `written`, `unchanged` or `dry run: not written` (the text's STATUS).
    #[serde(skip)]
    pub(super) status: &'static str,
}

impl KeyReport {
    /// The report of the plan `k` of one key, `status` as in
    /// [`KeyReport::status`], confirmed or not.
    pub(super) fn new(
        k: &plan::KeyPlan,
        status: &'static str,
        dry_run: bool,
        confirmed: &Result<Option<Confirmation>, Failure>,
    ) -> KeyReport {
        KeyReport {
            ok: confirmed.is_ok(),
            error: confirmed.as_ref().err().cloned(),
            confirmed: confirmed.as_ref().ok().and_then(Option::as_ref).cloned(),
            key: k.key.clone(),
            before: k.before.describe(),
            after: plan::shown(k.after),
            modify_index_before: k.before.index(),
            flags_before: k.before.flags(),
            by_drain_before: k.before.by_drain(),
            written: status == "written",
            dry_run,
            note: k.note,
            released_session: None,
            session: None,
            status,
        }
    }
}

impl Render for KeyReport {
    fn text(&self) -> String {
        let row = [&self.key, &self.before, &self.after, self.status];
        table(
            &["KEY", "BEFORE", "AFTER", "STATUS"],
            &[row.map(str::to_string).to_vec()],
        )
    }
}

/// One step of a sequence's report.
#[derive(Serialize)]
#[serde(untagged)]
enum StepRow {
    Write {
        write: String,
        flags: u64,
        keys: Vec<String>,
        status: &'static str,
        confirmed: Option<Confirmation>,
    },
    Wait {
        wait_seconds: f64,
        #[serde(rename = "for")]
        purpose: &'static str,
        status: &'static str,
        #[serde(skip)]
        duration: std::time::Duration,
    },
}

/// One key of a sequence's report.
#[derive(Serialize)]
struct KeyRow {
    key: String,
    before: String,
    modify_index_before: u64,
    flags: u64,
    by_drain: bool,
    set_by_hand: bool,
    /// What it holds now (before, for a dry run); `target`: what the plan writes.
    now: String,
    target: String,
    note: Option<&'static str>,
}

/// A server left alone because its key was set by hand.
#[derive(Serialize)]
struct HandRow {
    server: Option<String>,
    key: String,
    value: String,
    flags: u64,
}

/// A row key that decides before the group key written.
#[derive(Serialize)]
struct DecidesFirst {
    key: String,
    value: String,
}

/// One server of a sequence's report.
#[derive(Serialize)]
struct ServerRow {
    server: String,
    /// Its row key, or the group key written (`None`: no key decides it).
    key: Option<String>,
    groups: Vec<String>,
    template: bool,
    /// The agents' answer after the sequence (or the plan), and the identity that decides it.
    agent_answer: String,
    decided_by: Option<String>,
}

/// A server of the selection that the keys written do not decide.
#[derive(Serialize)]
struct NotWritten {
    server: String,
    reason: String,
    groups: Vec<String>,
}

/// The report printed at the end of a sequence: `--json` prints its
/// fields, and the text is rendered from them.
#[derive(Serialize)]
pub(super) struct SequenceReport {
    ok: bool,
    action: &'static str,
    outcome: &'static str,
    dry_run: bool,
    prefix_read_at_index: u64,
    source: Option<String>,
    group: Option<String>,
    row_keys_assumed: bool,
    not_drained: Vec<String>,
    not_in_maint: Vec<String>,
    until_idle: Option<Idle>,
    steps: Vec<StepRow>,
    keys: Vec<KeyRow>,
    set_by_hand: Vec<HandRow>,
    row_keys_deciding_first: Vec<DecidesFirst>,
    servers: Vec<ServerRow>,
    not_written: Vec<NotWritten>,
    /// Keys this run released from a Consul session by writing them.
    released_sessions: Vec<HeldRow>,
    /// Keys a Consul session still holds (not written, or a dry run).
    sessions: Vec<HeldRow>,
    error: Option<Failure>,
}

pub(super) use held::HeldRow;

/// What a sequence's report is made from.
pub(super) struct Report<'a> {
    pub(super) action: &'static str,
    pub(super) dry_run: bool,
    pub(super) plan: &'a Plan,
    pub(super) run: &'a Run,
    pub(super) target: &'a Target,
    pub(super) snapshot: &'a Snapshot,
    pub(super) failure: Option<&'a Failure>,
}

impl Report<'_> {
    /// The snapshot the agents hold now (or will, for a dry run).
    fn snapshot_now(&self) -> Snapshot {
        if self.dry_run {
            return plan::snapshot_after(self.snapshot, &self.plan.keys);
        }
        if let Some((_, snapshot)) = &self.run.observed {
            return snapshot.clone();
        }
        let reached: Vec<plan::KeyPlan> = (self.run.now.iter())
            .map(|(k, s)| plan::KeyPlan {
                key: k.clone(),
                before: Current::Absent,
                after: *s,
                note: None,
                set_by_hand: false,
            })
            .collect();
        plan::snapshot_after(self.snapshot, &reached)
    }

    /// The keys left alone because they were set by hand, each with the
    /// server it decides (`None` without servers), in the report's order.
    fn set_by_hand(&self) -> Vec<(Option<String>, &plan::KeyPlan)> {
        let hand = self.plan.keys.iter().filter(|k| k.set_by_hand);
        if self.target.servers.is_empty() {
            return hand.map(|k| (None, k)).collect();
        }
        let hand: HashMap<&str, &plan::KeyPlan> = hand.map(|k| (k.key.as_str(), k)).collect();
        (self.target.servers.iter())
            .filter_map(|s| Some((Some(s.id()), *hand.get(s.row_key()?)?)))
            .collect()
    }

    /// For a group sequence without servers to preview: the row keys that
    /// keep a server of the group where the group key does not put it, since
    /// a row key with a value decides first. After a drain (a plan that
    /// writes maint), those in service (ready or a weight above 0); after
    /// an undrain, those out (drain, maint or `0%`).
    fn overrides(&self) -> Vec<DecidesFirst> {
        if self.target.group.is_none() || !self.target.servers.is_empty() {
            return Vec::new();
        }
        let draining = (self.plan.keys.iter()).any(|k| k.after == Some(AdminState::Maint));
        let mut keys: Vec<DecidesFirst> = (self.snapshot.keys.iter())
            .filter_map(|(k, s)| match s.entry {
                Entry::Valid(state) if is_row_key(k) && in_service(state) == draining => {
                    Some(DecidesFirst {
                        key: k.to_string(),
                        value: state.to_string(),
                    })
                }
                _ => None,
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        keys
    }

    fn outcome(&self) -> &'static str {
        match self.failure {
            Some(f) => f.kind,
            None if self.dry_run => "dry_run",
            None if self.plan.steps.is_empty() => "nothing_to_do",
            None => "done",
        }
    }

    fn server_answer(snapshot: &Snapshot, server: &Server) -> (String, Option<String>) {
        let ids: Vec<&str> = match &server.enrolment {
            Enrolment::Enrolled { identities, .. } => {
                identities.iter().map(String::as_str).collect()
            }
            Enrolment::NotEnrolled(_) => return ("-".into(), None),
        };
        match snapshot.lookup(ids.iter().copied()) {
            // A snapshot built from Consul here is never provisional.
            Answer::State { state, decided_by } | Answer::Withheld { state, decided_by } => {
                (state.reply_text(), decided_by.map(|d| ids[d].to_string()))
            }
            Answer::Invalid { decided_by } => (
                "none (invalid value)".into(),
                Some(ids[decided_by].to_string()),
            ),
        }
    }

    /// The report, for text and JSON alike.
    pub(super) fn model(&self) -> SequenceReport {
        let (run, target, now) = (self.run, self.target, self.snapshot_now());
        let steps = (self
            .plan
            .steps
            .iter()
            .zip(&run.statuses)
            .zip(&run.confirmations))
        .map(|((step, status), confirmed)| match step {
            Step::Write {
                change,
                flags,
                keys,
            } => StepRow::Write {
                write: change.describe(),
                flags: *flags,
                keys: keys.clone(),
                status: status.as_str(),
                confirmed: confirmed.as_ref().cloned(),
            },
            Step::Wait { duration, purpose } => StepRow::Wait {
                wait_seconds: duration.as_secs_f64(),
                purpose: purpose.as_str(),
                status: status.as_str(),
                duration: *duration,
            },
        });
        let servers = target.servers.iter().map(|server| {
            let (agent_answer, decided_by) = Self::server_answer(&now, server);
            let key = target.key_of(server).map(str::to_string);
            let (groups, template) = (server.groups.clone(), server.template);
            let server = server.id();
            ServerRow {
                server,
                key,
                groups,
                template,
                agent_answer,
                decided_by,
            }
        });
        let keys = (self.plan.keys.iter()).map(|k| KeyRow {
            key: k.key.clone(),
            before: k.before.describe(),
            modify_index_before: k.before.index(),
            flags: k.before.flags(),
            by_drain: is_row_key(&k.key) && k.before.by_drain(),
            set_by_hand: k.set_by_hand,
            now: match self.dry_run {
                true => k.before.describe(),
                false => run.now_of(&k.key, &k.before),
            },
            target: match k.set_by_hand {
                true => k.before.describe(),
                false => plan::shown(k.after),
            },
            note: k.note,
        });
        let hand = self.set_by_hand().into_iter().map(|(server, k)| HandRow {
            server,
            key: k.key.clone(),
            value: k.before.describe(),
            flags: k.before.flags(),
        });
        let not_written = (target.not_written.iter()).map(|(s, why)| NotWritten {
            server: s.id(),
            reason: why.clone(),
            groups: s.groups.clone(),
        });
        SequenceReport {
            ok: self.failure.is_none(),
            action: self.action,
            outcome: self.outcome(),
            dry_run: self.dry_run,
            prefix_read_at_index: run.read_index,
            source: target.source.clone(),
            group: target.group.clone(),
            row_keys_assumed: target.assumed,
            not_drained: run.not_drained.clone(),
            not_in_maint: run.not_in_maint.clone(),
            until_idle: run.idle.clone(),
            steps: steps.collect(),
            keys: keys.collect(),
            set_by_hand: hand.collect(),
            row_keys_deciding_first: self.overrides(),
            servers: servers.collect(),
            not_written: not_written.collect(),
            released_sessions: held::rows(
                self.plan,
                (&run.held, &run.released),
                self.dry_run,
                true,
            ),
            sessions: held::rows(self.plan, (&run.held, &run.released), self.dry_run, false),
            error: self.failure.cloned(),
        }
    }
}

/// `s` unless `n` is 1.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl SequenceReport {
    fn key(&self, key: Option<&str>) -> Option<&KeyRow> {
        self.keys.iter().find(|k| Some(k.key.as_str()) == key)
    }

    /// What a key holds at the end: the plan's target for a dry run.
    fn now_of<'k>(&self, k: &'k KeyRow) -> &'k str {
        if self.dry_run {
            &k.target
        } else {
            &k.now
        }
    }

    /// The lines naming the servers left alone because their keys were set
    /// by hand, so on-call sees them; empty when there are none.
    fn set_by_hand_text(&self) -> String {
        let n = self.set_by_hand.len();
        if n == 0 {
            return String::new();
        }
        let (them, verb) = match n {
            1 => ("its key was", "it stays"),
            _ => ("their keys were", "they stay"),
        };
        let mut out = format!(
            "{n} server{} left alone: {them} set by hand (drain, maint, 0% or an invalid value \
             with even Consul Flags, not the mark of `state drain`), so {verb} as set:\n",
            plural(n),
        );
        let rows: Vec<Vec<String>> = (self.set_by_hand.iter())
            .map(|h| {
                let index = self.key(Some(&h.key)).map_or(0, |k| k.modify_index_before);
                let server = h.server.clone().unwrap_or_else(|| "-".into());
                let (key, value, flags) = (h.key.clone(), h.value.clone(), h.flags.to_string());
                vec![server, key, value, flags, index.to_string()]
            })
            .collect();
        out.push_str(&table(
            &["SERVER", "KEY", "VALUE", "FLAGS", "MODIFY-INDEX"],
            &rows,
        ));
        out.push_str(
            "Before releasing one, ask whoever set it; then `state clear KEY` (from drain, \
             `state set KEY maint` first, so slowstart ramps).\n",
        );
        out
    }

    /// The lines naming the row keys that decide before the group
    /// ([`Report::overrides`]); empty when there are none.
    fn overrides_text(&self) -> String {
        const SHOWN: usize = 10;
        let keys = &self.row_keys_deciding_first;
        if keys.is_empty() {
            return String::new();
        }
        let list: Vec<String> = (keys.iter().take(SHOWN))
            .map(|d| format!("{} = {}", d.key, d.value))
            .collect();
        let n = keys.len();
        let (are, stays) = match self.keys.iter().any(|k| k.target == "maint") {
            true => ("in service", "stays in service"),
            false => ("at drain, maint or 0%", "stays out"),
        };
        format!(
            "Row keys decide before any group key, and {n} row key{} {are}: {}{}. A server of \
             {} whose row key is one of them {stays}. See which with --haproxy-config (a load \
             balancer's configuration) or `state explain KEY GROUPS...`.\n",
            if n == 1 { " is" } else { "s are" },
            list.join(", "),
            if n > SHOWN { ", ..." } else { "" },
            self.group.as_deref().unwrap_or("the group"),
        )
    }

    /// One line per step (for a dry run or a sequence that stopped).
    fn steps_text(&self) -> String {
        let line = |step: &StepRow| match step {
            StepRow::Write {
                write,
                keys,
                status,
                ..
            } => format!(
                "  write {write} to {} key{}: {status}\n",
                keys.len(),
                plural(keys.len())
            ),
            StepRow::Wait {
                duration,
                purpose,
                status,
                ..
            } => format!(
                "  wait {} ({purpose}): {status}\n",
                humantime::format_duration(*duration)
            ),
        };
        self.steps.iter().map(line).collect()
    }

    /// The table of the keys (without servers to preview) or of the
    /// servers.
    fn table_text(&self) -> String {
        let now_header = if self.dry_run { "AFTER" } else { "NOW" };
        if self.servers.is_empty() {
            let rows: Vec<Vec<String>> = (self.keys.iter())
                .map(|k| {
                    let (now, note) = (self.now_of(k), k.note.unwrap_or(""));
                    [&k.key, &k.before, now, note].map(str::to_string).to_vec()
                })
                .collect();
            return table(&["KEY", "BEFORE", now_header, "NOTE"], &rows);
        }
        let rows: Vec<Vec<String>> = (self.servers.iter())
            .map(|r| {
                let key = r.key.as_deref().unwrap_or("-");
                let (before, after, mut note) = match self.key(r.key.as_deref()) {
                    Some(k) => (k.before.as_str(), self.now_of(k), k.note.unwrap_or("")),
                    None => ("-", "-", ""),
                };
                if r.decided_by.as_deref().is_some_and(|d| d != key) {
                    note = "another key decides first: not moved by this one";
                }
                let answer = match &r.decided_by {
                    Some(d) => format!("{} ({d})", r.agent_answer),
                    None => r.agent_answer.clone(),
                };
                [&r.server, key, before, after, &answer, note]
                    .map(str::to_string)
                    .to_vec()
            })
            .collect();
        let header = [
            "SERVER",
            "KEY",
            "BEFORE",
            now_header,
            "AGENT ANSWERS",
            "NOTE",
        ];
        table(&header, &rows)
    }
}

impl Render for SequenceReport {
    fn text(&self) -> String {
        let headline = match self.outcome {
            "dry_run" => "dry run, nothing written; the plan".to_string(),
            "nothing_to_do" => "nothing to do".to_string(),
            "done" => "done".to_string(),
            other => format!("stopped ({other})"),
        };
        let hand = match self.set_by_hand.len() {
            0 => String::new(),
            1 => "; 1 server set by hand left alone (see below)".to_string(),
            n => format!("; {n} servers set by hand left alone (see below)"),
        };
        let mut out = format!("{}: {headline}{hand}\n", self.action);
        if self.dry_run || self.error.is_some() {
            out.push_str(&self.steps_text());
        }
        out.push_str(&self.table_text());
        if !self.not_written.is_empty() {
            let n = self.not_written.len();
            out.push_str(&format!(
                "{n} server{} of the selection not decided by the key{} written (take them out \
                 another way if needed):\n",
                plural(n),
                plural(self.keys.len()),
            ));
            let rows: Vec<Vec<String>> = (self.not_written.iter())
                .map(|s| vec![s.server.clone(), s.reason.clone()])
                .collect();
            out.push_str(&table(&["SERVER", "REASON"], &rows));
        }
        out.push_str(&self.set_by_hand_text());
        for h in &self.sessions {
            out.push_str(&format!("{}.\n", h.note()));
        }
        out.push_str(&self.overrides_text());
        if let Some(idle) = &self.until_idle {
            out.push_str(&idle_text(idle));
        }
        if let (Some(group), Some(source), true) = (
            &self.group,
            &self.source,
            self.servers.is_empty() && self.not_written.is_empty(),
        ) {
            out.push_str(&format!(
                "No server in {source} names {group}: the key is for the fleet's other load \
                 balancers, or mistyped.\n"
            ));
        }
        if let Some(source) = &self.source {
            out.push_str(&format!("Servers read from {source}.\n"));
        }
        let mut notes = Vec::new();
        if self.source.is_none() && self.group.is_none() {
            notes.push(NAMED_ROW_KEY);
        }
        if self.row_keys_assumed {
            notes.push(ASSUMED_ROW_KEYS);
        }
        for note in notes {
            let mut note = note.to_string();
            note[..1].make_ascii_uppercase();
            out.push_str(&format!("{note}.\n"));
        }
        out
    }
}

/// How an `--until-idle` wait ended: no session left, or the servers and
/// load balancers that may still hold one when the longest wait was up.
fn idle_text(idle: &Idle) -> String {
    let (header, rows) = idle.rows();
    match idle.idle {
        true => idle.heading(),
        false => idle.heading() + &table(&header, &rows),
    }
}

#[cfg(test)]
mod tests;
