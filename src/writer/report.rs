//! What a `state` command prints: the key tables of `get` and `list`, the
//! report of a sequence (text for people, `--json` for scripts), and the
//! columns they share (value, state, reply, set-by).

use std::collections::HashMap;

use serde_json::{json, Value};

use super::error::Failure;
use super::haproxy::{Enrolment, Server};
use super::output::table;
use super::plan::{self, show_raw, Current, Plan, Step, WaitFor};
use super::progress::{Confirmation, Run};
use super::select::{Target, ASSUMED_ROW_KEYS};
use crate::consul::KvPair;
use crate::model::marks::drain_mark;
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

pub(super) fn reply_text(state: AdminState) -> String {
    String::from_utf8_lossy(state.reply().as_bytes())
        .trim_end()
        .to_string()
}

pub(super) fn key_json(key: &str, pair: Option<&KvPair>) -> Value {
    match pair {
        None => json!({"key": key, "present": false}),
        Some(p) => {
            let mut v = json!({
                "key": key,
                "present": true,
                "value": String::from_utf8_lossy(&p.value),
                "modify_index": p.modify_index,
                "flags": p.flags,
                "by_drain": is_row_key(key) && drain_mark(p.flags).is_some(),
                "drain_id": drain_id_json(key, p.flags),
                "set_by": set_by(key, p.flags),
            });
            match parse_value(&p.value) {
                Ok(s) => {
                    v["valid"] = json!(true);
                    v["state"] = json!(s.to_string());
                    v["reply"] = json!(reply_text(s));
                }
                Err(e) => {
                    v["valid"] = json!(false);
                    v["error"] = json!(e.to_string());
                }
            }
            v
        }
    }
}

pub(super) fn entry_json(key: &str, pair: &KvPair, snapshot: &Snapshot) -> Value {
    let mut v = key_json(key, Some(pair));
    // The agent's verdict, key validity included.
    if let Some(Entry::Invalid(e)) = snapshot.keys.get(key).map(|k| &k.entry) {
        v["valid"] = json!(false);
        v["error"] = json!(e.to_string());
        if let Some(o) = v.as_object_mut() {
            o.remove("state");
            o.remove("reply");
        }
    }
    v
}

/// The REPLY column for a key the agent holds invalid: a server whose first
/// key it is gets no answer (frozen in its current state), but no server can
/// name a key that is not a valid identity.
pub(super) fn invalid_reply(e: &InvalidValue) -> String {
    match e {
        InvalidValue::Key(_) => "none (no agent-send can name this key)".to_string(),
        _ => "none (frozen)".to_string(),
    }
}

pub(super) fn key_row(key: &str, pair: &KvPair, entry: Option<&Entry>) -> Vec<String> {
    let (state, reply) = match entry {
        Some(Entry::Valid(s)) => (s.to_string(), reply_text(*s)),
        Some(Entry::Invalid(e)) => (format!("INVALID: {e}"), invalid_reply(e)),
        None => match parse_value(&pair.value) {
            Ok(s) => (s.to_string(), reply_text(s)),
            Err(e) => (format!("INVALID: {e}"), invalid_reply(&e)),
        },
    };
    vec![
        key.to_string(),
        display_value(&pair.value),
        state,
        reply,
        pair.modify_index.to_string(),
        set_by(key, pair.flags),
    ]
}

/// True for a row key (`<backend>/<server>`), false for a group key such as
/// `canary`, which has no set-by-hand rule.
pub(super) fn is_row_key(key: &str) -> bool {
    key.contains('/')
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

/// What a row key's Flags say: `drain` for the generic mark (Flags 1),
/// `drain:<id>` (8 hex digits) for a drain with selection id `id`, `hand` for
/// even Flags (with them when they are not 0).
pub(super) fn mark_name(flags: u64) -> String {
    match drain_mark(flags) {
        Some(0) => "drain".to_string(),
        Some(id) => format!("drain:{id:08x}"),
        None if flags == 0 => "hand".to_string(),
        None => format!("hand (flags {flags})"),
    }
}

/// The selection id of a drain mark for `--json`: 8 hex digits, `None` for
/// the generic mark, a key set by hand, or a group key.
pub(super) fn drain_id_json(key: &str, flags: u64) -> Option<String> {
    drain_mark(flags)
        .filter(|id| is_row_key(key) && *id != 0)
        .map(|id| format!("{id:08x}"))
}

pub(super) const KEY_HEADER: [&str; 6] =
    ["KEY", "VALUE", "STATE", "REPLY", "MODIFY-INDEX", "SET-BY"];

pub(super) fn key_table(rows: &[(String, &KvPair)]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|(k, p)| key_row(k, p, None)).collect();
    table(&KEY_HEADER, &rows)
}

pub(super) fn key_table_snapshot(rows: &[(String, &KvPair)], snapshot: &Snapshot) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(k, p)| key_row(k, p, snapshot.keys.get(k.as_str()).map(|s| &s.entry)))
        .collect();
    table(&KEY_HEADER, &rows)
}

/// A table of servers a sequence left alone: server, key, value, `mark`
/// (under `mark_header`) and ModifyIndex of each key as read.
pub(super) fn left_alone_table(
    keys: &[(Option<String>, &plan::KeyPlan)],
    mark_header: &str,
    mark: impl Fn(&plan::Current) -> String,
) -> String {
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(server, k)| {
            vec![
                server.clone().unwrap_or_else(|| "-".into()),
                k.key.clone(),
                k.before.describe(),
                mark(&k.before),
                k.before.index().to_string(),
            ]
        })
        .collect();
    table(
        &["SERVER", "KEY", "VALUE", mark_header, "MODIFY-INDEX"],
        &rows,
    )
}

/// The report printed at the end of a sequence.
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
    pub(super) fn snapshot_now(&self) -> Snapshot {
        if self.dry_run {
            return plan::snapshot_after(self.snapshot, &self.plan.keys);
        }
        if let Some((_, snapshot)) = &self.run.observed {
            return snapshot.clone();
        }
        let reached: Vec<plan::KeyPlan> = self
            .run
            .now
            .iter()
            .map(|(k, s)| plan::KeyPlan {
                key: k.clone(),
                before: Current::Absent,
                after: *s,
                note: None,
                set_by_hand: false,
                held_by_other_drain: false,
            })
            .collect();
        plan::snapshot_after(self.snapshot, &reached)
    }

    /// The keys left alone because they were set by hand, each with the
    /// server it decides (`None` for a group key), in the report's order.
    pub(super) fn set_by_hand(&self) -> Vec<(Option<String>, &plan::KeyPlan)> {
        self.left_alone(|k| k.set_by_hand)
    }

    /// The keys left alone because another drain's mark holds them, each
    /// with the server it decides.
    pub(super) fn held_by_other_drain(&self) -> Vec<(Option<String>, &plan::KeyPlan)> {
        self.left_alone(|k| k.held_by_other_drain)
    }

    pub(super) fn left_alone(
        &self,
        which: impl Fn(&plan::KeyPlan) -> bool,
    ) -> Vec<(Option<String>, &plan::KeyPlan)> {
        let hand: HashMap<&str, &plan::KeyPlan> = self
            .plan
            .keys
            .iter()
            .filter(|k| which(k))
            .map(|k| (k.key.as_str(), k))
            .collect();
        if self.target.servers.is_empty() {
            return self
                .plan
                .keys
                .iter()
                .filter(|k| which(k))
                .map(|k| (None, k))
                .collect();
        }
        self.target
            .servers
            .iter()
            .filter_map(|s| {
                let k = hand.get(s.row_key()?)?;
                Some((Some(s.id()), *k))
            })
            .collect()
    }

    /// The lines naming the servers left alone because their keys were set
    /// by hand, so on-call sees them; empty when there are none.
    pub(super) fn set_by_hand_text(&self) -> String {
        let hand = self.set_by_hand();
        if hand.is_empty() {
            return String::new();
        }
        let n = hand.len();
        let (them, verb) = if n == 1 {
            ("its key was", "it stays")
        } else {
            ("their keys were", "they stay")
        };
        let mut out = format!(
            "{n} server{} left alone: {them} set by hand (drain, maint or 0% without Consul \
             Flags: no mark of `state drain`), so {verb} as set:\n",
            if n == 1 { "" } else { "s" },
        );
        out.push_str(&left_alone_table(&hand, "FLAGS", |c| c.flags().to_string()));
        out.push_str(
            "Before releasing one, ask whoever set it; then `state clear KEY` (from drain, \
             `state set KEY maint` first, so slowstart ramps).\n",
        );
        out
    }

    /// The lines naming the servers left alone because another drain holds
    /// their keys; empty when there are none.
    pub(super) fn held_by_other_drain_text(&self) -> String {
        let held = self.held_by_other_drain();
        if held.is_empty() {
            return String::new();
        }
        let n = held.len();
        let mut out = format!(
            "{n} server{} left alone: held by another drain (drain or maint with another \
             selection's mark):\n",
            if n == 1 { "" } else { "s" },
        );
        out.push_str(&left_alone_table(&held, "SET-BY", |c| mark_name(c.flags())));
        out.push_str(
            "Undrain it with the same selection as its drain (or --any-drain), or `state \
             clear KEY`.\n",
        );
        out
    }

    pub(super) fn outcome(&self) -> &'static str {
        match self.failure {
            Some(f) => f.kind,
            None if self.dry_run => "dry_run",
            None if self.plan.steps.is_empty() => "nothing_to_do",
            None => "done",
        }
    }

    pub(super) fn server_answer(snapshot: &Snapshot, server: &Server) -> (String, Option<String>) {
        let ids: Vec<&str> = match &server.enrolment {
            Enrolment::Enrolled { identities, .. } => {
                identities.iter().map(String::as_str).collect()
            }
            Enrolment::NotEnrolled(_) => return ("-".into(), None),
        };
        match snapshot.lookup(ids.iter().copied()) {
            Answer::State { state, decided_by } => {
                (reply_text(state), decided_by.map(|d| ids[d].to_string()))
            }
            Answer::Invalid { decided_by } => (
                "none (invalid value)".into(),
                Some(ids[decided_by].to_string()),
            ),
        }
    }

    pub(super) fn steps_json(&self) -> Vec<Value> {
        self.plan
            .steps
            .iter()
            .zip(&self.run.statuses)
            .zip(&self.run.confirmations)
            .map(|((step, status), confirmed)| match step {
                Step::Write {
                    change,
                    flags,
                    keys,
                } => json!({
                    "write": change.describe(), "flags": flags, "keys": keys,
                    "status": status.as_str(),
                    "confirmed": confirmed.as_ref().map(Confirmation::json),
                }),
                Step::Wait { duration, purpose } => json!({
                    "wait_seconds": duration.as_secs_f64(),
                    "for": match purpose { WaitFor::Drain => "drain", WaitFor::Maint => "maint" },
                    "status": status.as_str(),
                }),
            })
            .collect()
    }

    pub(super) fn json(&self) -> Value {
        let now = self.snapshot_now();
        json!({
            "ok": self.failure.is_none(),
            "action": self.action,
            "outcome": self.outcome(),
            "dry_run": self.dry_run,
            "prefix_read_at_index": self.run.read_index,
            "source": self.target.source,
            "row_keys_assumed": self.target.socket.is_some(),
            "not_drained": self.run.not_drained,
            "not_in_maint": self.run.not_in_maint,
            "steps": self.steps_json(),
            "keys": self.plan.keys.iter().map(|k| json!({
                "key": k.key,
                "before": k.before.describe(),
                "modify_index_before": k.before.index(),
                "flags": k.before.flags(),
                "by_drain": k.before.by_drain(),
                "drain_id": k.before.drain_id().filter(|id| *id != 0).map(|id| format!("{id:08x}")),
                "set_by_hand": k.set_by_hand,
                "held_by_other_drain": k.held_by_other_drain,
                "now": if self.dry_run { k.before.describe() } else { self.run.now_of(&k.key, &k.before) },
                "target": k.after.map_or("absent".into(), |s| s.to_string()),
                "note": k.note,
            })).collect::<Vec<_>>(),
            "set_by_hand": self.set_by_hand().iter().map(|(server, k)| json!({
                "server": server,
                "key": k.key,
                "value": k.before.describe(),
                "flags": k.before.flags(),
            })).collect::<Vec<_>>(),
            "held_by_other_drain": self.held_by_other_drain().iter().map(|(server, k)| json!({
                "server": server,
                "key": k.key,
                "value": k.before.describe(),
                "flags": k.before.flags(),
                "drain_id": k.before.drain_id().map(|id| format!("{id:08x}")),
            })).collect::<Vec<_>>(),
            "servers": self.target.servers.iter().map(|s| {
                let (answer, decided_by) = Self::server_answer(&now, s);
                json!({
                    "server": s.id(),
                    "key": s.row_key(),
                    "zones": s.zones,
                    "agent_answer": answer,
                    "decided_by": decided_by,
                })
            }).collect::<Vec<_>>(),
            "not_enrolled": self.target.not_enrolled.iter().map(|(s, why)| json!({
                "server": s.id(), "reason": why, "zones": s.zones,
            })).collect::<Vec<_>>(),
            "error": self.failure.map(Failure::json),
        })
    }

    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        let headline = match self.outcome() {
            "dry_run" => "dry run, nothing written; the plan".to_string(),
            "nothing_to_do" => "nothing to do".to_string(),
            "done" => "done".to_string(),
            other => format!("stopped ({other})"),
        };
        let hand = self.set_by_hand().len();
        let hand = match hand {
            0 => String::new(),
            1 => "; 1 server set by hand left alone (see below)".to_string(),
            n => format!("; {n} servers set by hand left alone (see below)"),
        };
        let held = match self.held_by_other_drain().len() {
            0 => String::new(),
            1 => "; 1 server held by another drain left alone (see below)".to_string(),
            n => format!("; {n} servers held by another drain left alone (see below)"),
        };
        out.push_str(&format!("{}: {headline}{hand}{held}\n", self.action));
        if self.dry_run || self.failure.is_some() {
            for (step, status) in self.plan.steps.iter().zip(&self.run.statuses) {
                let what = match step {
                    Step::Write { change, keys, .. } => format!(
                        "write {} to {} key{}",
                        change.describe(),
                        keys.len(),
                        if keys.len() == 1 { "" } else { "s" }
                    ),
                    Step::Wait { duration, .. } => {
                        format!("wait {}", humantime::format_duration(*duration))
                    }
                };
                out.push_str(&format!("  {what}: {}\n", status.as_str()));
            }
        }
        let now = self.snapshot_now();
        let now_header = if self.dry_run { "AFTER" } else { "NOW" };
        if self.target.servers.is_empty() {
            let rows: Vec<Vec<String>> = self
                .plan
                .keys
                .iter()
                .map(|k| {
                    vec![
                        k.key.clone(),
                        k.before.describe(),
                        if self.dry_run {
                            k.after.map_or("absent".into(), |s| s.to_string())
                        } else {
                            self.run.now_of(&k.key, &k.before)
                        },
                        k.note.unwrap_or("").to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(&["KEY", "BEFORE", now_header, "NOTE"], &rows));
        } else {
            let by_key: HashMap<&str, &plan::KeyPlan> =
                self.plan.keys.iter().map(|k| (k.key.as_str(), k)).collect();
            let rows: Vec<Vec<String>> = self
                .target
                .servers
                .iter()
                .map(|s| {
                    let key = s.row_key().unwrap_or("-");
                    let (before, after, note) = match by_key.get(key) {
                        Some(k) => (
                            k.before.describe(),
                            if self.dry_run {
                                k.after.map_or("absent".into(), |s| s.to_string())
                            } else {
                                self.run.now_of(key, &k.before)
                            },
                            k.note.unwrap_or(""),
                        ),
                        None => ("-".into(), "-".into(), ""),
                    };
                    let (answer, decided_by) = Self::server_answer(&now, s);
                    vec![
                        s.id(),
                        key.to_string(),
                        before,
                        after,
                        match decided_by {
                            Some(d) => format!("{answer} ({d})"),
                            None => answer,
                        },
                        note.to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(
                &[
                    "SERVER",
                    "KEY",
                    "BEFORE",
                    now_header,
                    "AGENT ANSWERS",
                    "NOTE",
                ],
                &rows,
            ));
        }
        if !self.target.not_enrolled.is_empty() {
            let n = self.target.not_enrolled.len();
            out.push_str(&format!(
                "{n} server{} not enrolled, so not written (the agent does not decide their \
                 state; take them out another way if needed):\n",
                if n == 1 { "" } else { "s" }
            ));
            let rows: Vec<Vec<String>> = self
                .target
                .not_enrolled
                .iter()
                .map(|(s, why)| vec![s.id(), why.clone()])
                .collect();
            out.push_str(&table(&["SERVER", "REASON"], &rows));
        }
        out.push_str(&self.set_by_hand_text());
        out.push_str(&self.held_by_other_drain_text());
        if let Some(source) = &self.target.source {
            out.push_str(&format!("Servers read from {source}.\n"));
        }
        if self.target.socket.is_some() {
            let mut note = ASSUMED_ROW_KEYS.to_string();
            note[..1].make_ascii_uppercase();
            out.push_str(&format!("{note}.\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::model::marks::{drain_flags, DRAIN_FLAGS};
    use crate::writer::haproxy;
    use crate::writer::plan::{currents, plan_undrain, Claim};
    use crate::writer::select::tests::{selector, CONFIG};

    #[test]
    fn set_by_column_names_the_drain_mark() {
        assert_eq!(set_by("web/a", DRAIN_FLAGS), "drain");
        assert_eq!(set_by("web/a", 0), "hand");
        assert_eq!(set_by("web/a", 42), "hand (flags 42)");
        assert_eq!(set_by("web/a", drain_flags(0x1234abcd)), "drain:1234abcd");
        assert_eq!(
            drain_id_json("web/a", drain_flags(0xab)).unwrap(),
            "000000ab"
        );
        assert_eq!(drain_id_json("web/a", DRAIN_FLAGS), None);
        // Group keys have no set-by-hand rule.
        for flags in [0, DRAIN_FLAGS, drain_flags(7), 42] {
            assert_eq!(set_by("canary", flags), "-");
            assert_eq!(drain_id_json("canary", flags), None);
        }
    }

    #[test]
    fn report_names_servers_left_alone_because_set_by_hand() {
        let target = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), None, None),
            "cfg".into(),
        );
        let key = |key: &str, value: &[u8], flags| KvPair {
            key: format!("p/{key}"),
            value: value.to_vec(),
            modify_index: 5,
            flags,
        };
        let pairs = [
            key("api/api-01", b"maint", 0),
            key("web/web-02", b"maint", DRAIN_FLAGS),
        ];
        let plan = plan_undrain(
            currents("p/", &pairs, &target.keys),
            Duration::ZERO,
            Claim::Marked {
                id: 0,
                any_drain: false,
            },
        )
        .unwrap();
        let run = Run::new(&plan, 9);
        let snapshot = Snapshot::default();
        let report = Report {
            action: "undrain",
            dry_run: true,
            plan: &plan,
            run: &run,
            target: &target,
            snapshot: &snapshot,
            failure: None,
        };
        let text = report.text();
        assert!(
            text.starts_with("undrain: dry run, nothing written; the plan; 1 server set by hand"),
            "{text}"
        );
        assert!(
            text.contains("1 server left alone: its key was set by hand"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("api/api-01") && l.ends_with(" 5"))
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["api/api-01", "api/api-01", "maint", "0", "5"]
        );
        let v = report.json();
        assert_eq!(
            v["set_by_hand"],
            json!([{"server": "api/api-01", "key": "api/api-01", "value": "maint", "flags": 0}])
        );
        let keys = v["keys"].as_array().unwrap();
        assert_eq!(keys[0]["key"], "api/api-01");
        assert_eq!(keys[0]["set_by_hand"], true);
        assert_eq!(keys[1]["flags"], DRAIN_FLAGS);
        assert_eq!(keys[1]["by_drain"], true);
        assert_eq!(keys[1]["set_by_hand"], false);
    }
}
