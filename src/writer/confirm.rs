//! Confirmation that the fleet applied a write, from the Prometheus that
//! scrapes every agent: after each write step, every agent must hold a
//! snapshot at or past the write's index and have answered the rows HAProxy
//! asks about from it. Also `state status --prometheus`, the same fleet view
//! without writing.
//!
//! The agent exports what this needs without a series per server:
//! `gitlab_haproxy_agent_consul_index` (its snapshot),
//! `gitlab_haproxy_agent_answered_index` (the lowest snapshot index among
//! the last answers to the rows asked about in the last 60 s) and
//! `gitlab_haproxy_agent_rows_answered{state}`; [`super::fleet`] asks
//! Prometheus for them. The options are [`crate::cli::ConfirmArgs`] and
//! [`crate::cli::StatusArgs`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::error::{exit, Failure};
use super::output::{err_line, out_line};
use super::plan::Change;
use super::progress::{Confirmation, Idle};
use super::session::Writer;
use crate::cli::{ConfirmArgs, StateArgs, StateCommand, StatusArgs};
use crate::consul::{ConsulClient, ConsulError};
use crate::fleet::groups;
use crate::fleet::idle::IdleQuery;
use crate::fleet::status::status_json;
use crate::fleet::text::{
    confirmed_text, lagging_text, no_agents_text, unavailable_text, waiting_text,
};
use crate::fleet::{check_url, fetch_fleet, fetch_health, http_client, Fleet};
use crate::model::meta::keys_out;
use crate::model::value::AnswerKind;

/// How often Prometheus is asked again while agents lag: 1 s.
pub const POLL: Duration = Duration::from_secs(1);

/// Why a confirmation did not succeed.
#[derive(Debug)]
pub enum Unconfirmed {
    /// A signal came during the wait.
    Interrupted,
    /// Not every agent confirmed in time (`not_confirmed`, exit 68),
    /// Prometheus could not tell (`prometheus_unavailable`, exit 68), or the
    /// write's index could not be read from Consul.
    Failed(Failure),
}

/// The `--confirm-*` options of the command, when `--prometheus`
/// (or its environment variable) is given and not empty.
///
/// # Errors
///
/// A usage failure (exit 64) for a URL that is not an `http://` URL, before
/// anything is written.
pub fn of_command(args: &StateArgs) -> Result<Option<ConfirmArgs>, Failure> {
    // The release mark decides no row's answer by itself: nothing to
    // confirm per row; `state status` shows the fleet after it.
    let release = matches!(
        args.command,
        StateCommand::ReleaseRollback { .. } | StateCommand::MigrateRecords { .. }
    );
    let Some(write) = args.command.write_opts().filter(|_| !release) else {
        return Ok(None);
    };
    match args.prometheus.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(url) => {
            check_url(url)
                .map_err(|e| Failure::usage(format!("--prometheus: {e}; nothing written")))?;
            Ok(Some(ConfirmArgs {
                confirm_prometheus: Some(url.to_string()),
                ..write.confirm.clone()
            }))
        }
    }
}

fn not_confirmed(kind: &'static str, message: String) -> Failure {
    Failure::new(exit::NOT_CONFIRMED, kind, message)
}

/// The index a write must be confirmed at: `known` (the ModifyIndex a
/// write returned), else the prefix's `X-Consul-Index` read now, which is
/// at or past a removal's index and is the index the agents' blocking
/// queries on the same prefix reach.
///
/// # Errors
///
/// The Consul read's.
pub async fn index_after(
    client: &ConsulClient,
    prefix: &str,
    known: Option<u64>,
) -> Result<u64, ConsulError> {
    match known {
        Some(i) => Ok(i),
        None => Ok(client.list_prefix(prefix).await?.index),
    }
}

impl ConfirmArgs {
    /// Waits until every agent confirms `index` (see [`AgentView::lag`]),
    /// polling Prometheus every [`POLL`] for at most `--confirm-timeout`,
    /// and prints the outcome on stderr. `state` is the answer the write
    /// should produce; `action` names the step (`drain: drain`).
    ///
    /// # Errors
    ///
    /// [`Unconfirmed::Failed`] when the time is up with agents lagging (or
    /// Prometheus unreachable), or at once for an answer that retrying
    /// cannot fix (a bad selector); [`Unconfirmed::Interrupted`] when
    /// `cancel` fires during the wait.
    pub(super) async fn confirm(
        &self,
        action: &str,
        index: u64,
        state: AnswerKind,
        group: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<Option<Confirmation>, Unconfirmed> {
        let Some(base) = &self.confirm_prometheus else {
            return Ok(None);
        };
        let failed = |kind, message| Unconfirmed::Failed(not_confirmed(kind, message));
        let http = http_client().map_err(|e| failed("prometheus_unavailable", e))?;
        let started = tokio::time::Instant::now();
        let deadline = started + self.confirm_timeout;
        err_line(&waiting_text(action, index, base, self.confirm_timeout));
        loop {
            let last = tokio::select! {
                f = groups::fetch_with_group(&http, base, &self.confirm_selector, group) => f,
                _ = cancel.cancelled() => return Err(Unconfirmed::Interrupted),
            };
            let waited = started.elapsed();
            match &last {
                Ok((fleet, rows)) => {
                    let mut verdict = fleet.verdict(index, Some(state));
                    match (group, rows) {
                        (Some(key), Some(rows)) => {
                            groups::apply(&mut verdict, key, rows, state, self.accept_overridden)
                        }
                        _ => groups::by_index_alone(&mut verdict),
                    }
                    // Row keys: the agents count no rows apart for them.
                    verdict.rows = verdict.rows.filter(|_| group.is_some());
                    if let Some(text) = groups::overridden_text(&verdict) {
                        return Err(failed("overridden", text));
                    }
                    if verdict.all_confirmed() {
                        err_line(&confirmed_text(action, &verdict, waited));
                        return Ok(Some(Confirmation {
                            index,
                            agents: verdict.confirmed.len(),
                            state: state.as_str(),
                            rows: verdict.rows,
                            waited,
                            group: verdict.group.clone(),
                            by_index_only: verdict.by_index_only.clone(),
                        }));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        let message = if fleet.agents.is_empty() {
                            no_agents_text(base, &self.confirm_selector, waited)
                        } else {
                            lagging_text(&verdict, waited)
                        };
                        return Err(failed("not_confirmed", message));
                    }
                }
                // A bad selector stays bad: say so at once.
                Err(e) if e.lasting || tokio::time::Instant::now() >= deadline => {
                    return Err(failed(
                        "prometheus_unavailable",
                        unavailable_text(index, &e.message, waited),
                    ))
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = cancel.cancelled() => return Err(Unconfirmed::Interrupted),
            }
        }
    }
}

/// The fleet view for `state status` against Consul's index `index` (the
/// prefix's X-Consul-Index now; `None` when Consul could not be read: each
/// agent's own index is shown, none is judged against Consul's), as text.
pub fn status_text(fleet: &Fleet, index: Option<u64>) -> String {
    let verdict = fleet.status_verdict(index);
    let rows: Vec<Vec<String>> = fleet
        .agents
        .iter()
        .map(|a| {
            let known = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            let answers: Vec<String> = a
                .rows_answered
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(s, n)| format!("{n} {s}"))
                .collect();
            vec![
                a.name(),
                if a.up { "up" } else { "down" }.to_string(),
                known(a.consul_index),
                known(a.answered_index),
                a.last_sync_age
                    .map_or("-".to_string(), |s| format!("{s:.0}s ago")),
                known(a.rows_seen),
                if answers.is_empty() {
                    "-".to_string()
                } else {
                    answers.join(", ")
                },
                a.status(index),
            ]
        })
        .collect();
    let mut text = super::output::table(
        &[
            "INSTANCE",
            "TARGET",
            "INDEX",
            "ANSWERED-FROM",
            "LAST-SYNC",
            "ROWS",
            "ANSWERS",
            "STATUS",
        ],
        &rows,
    );
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &fleet.agents {
        for (s, n) in &a.rows_answered {
            *totals.entry(s.as_str()).or_default() += n;
        }
    }
    let answered: Vec<String> = totals
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    let at = match index {
        Some(index) => format!(
            "{}/{} agents at index >= {index} (the prefix's X-Consul-Index now){}",
            verdict.confirmed.len(),
            fleet.agents.len(),
            groups::by_index_text(&verdict),
        ),
        None => format!(
            "{} agents; Consul's index is unknown (Consul could not be read): INDEX is each \
             agent's last scraped one, not judged against Consul's",
            fleet.agents.len()
        ),
    };
    text.push_str(&format!(
        "{at}; rows answered: {}.\n",
        if answered.is_empty() {
            "none".to_string()
        } else {
            answered.join(", ")
        }
    ));
    for (agent, troubles) in fleet.troubled() {
        for t in troubles {
            text.push_str(&format!("{}: {}\n", agent.name(), t.text()));
        }
    }
    text
}

/// The answer a write makes the servers it decides get: its state, or for a
/// removal the default (`ready`).
fn change_answer(change: Change) -> AnswerKind {
    match change {
        Change::Set(s) => s.kind(),
        Change::Clear => AnswerKind::Ready,
    }
}

impl Writer {
    /// After a sequence's write step of `change` to `keys`: confirms it at
    /// the highest ModifyIndex the transactions returned (`indexes`), or
    /// for a removal, which has none, at the prefix's index read now.
    /// `None` when confirmation was not asked for.
    pub(super) async fn confirm_written(
        &self,
        action: &str,
        change: Change,
        keys: &[String],
        indexes: &HashMap<String, u64>,
        cancel: &CancellationToken,
    ) -> Result<Option<Confirmation>, Unconfirmed> {
        let written = match change {
            Change::Set(_) => keys.iter().filter_map(|k| indexes.get(k)).max().copied(),
            Change::Clear => None,
        };
        let step = format!("{action}: {}", change.describe());
        let group = match keys {
            [key] if !key.contains('/') => Some(key.as_str()),
            _ => None,
        };
        self.confirm_step(&step, written, change_answer(change), group, cancel)
            .await
    }

    /// After a write step: confirms it (when `--prometheus` is
    /// given) at `known`, the ModifyIndex the write returned, or else at
    /// the prefix's index read now (see [`index_after`]). `state` is the
    /// answer the write should produce.
    async fn confirm_step(
        &self,
        action: &str,
        known: Option<u64>,
        state: AnswerKind,
        group: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<Option<Confirmation>, Unconfirmed> {
        let Some(confirm) = &self.confirm else {
            return Ok(None);
        };
        let index = index_after(&self.client, &self.prefix, known)
            .await
            .map_err(|e| Unconfirmed::Failed(e.into()))?;
        confirm.confirm(action, index, state, group, cancel).await
    }

    /// `--until-idle` on `servers` (`<backend>/<server>`) and the exporter
    /// series `selector` matches, the drain written `drained_for` ago (see
    /// [`IdleQuery::wait`]). `None` when `cancel` fires.
    pub(super) async fn wait_idle(
        &self,
        (servers, selector): (&[String], &str),
        (at_least, max, drained_for): (Duration, Duration, Duration),
        cancel: &CancellationToken,
    ) -> Option<Idle> {
        let base = self.confirm.as_ref()?.confirm_prometheus.as_deref()?;
        let query = IdleQuery {
            http: &http_client().unwrap_or_default(),
            base,
            selector,
            servers,
            agents: &self.confirm.as_ref()?.confirm_selector,
        };
        tokio::select! {
            idle = query.wait(at_least, max, drained_for) => Some(idle),
            _ = cancel.cancelled() => None,
        }
    }

    /// `state status`: reads the prefix's index from Consul and shows every
    /// agent against it, with what else is wrong with each; exit 68
    /// (`not_confirmed`) when one lags, (`not_ok`) when one has rows
    /// HAProxy no longer asks about, held keys, or a store without an id.
    /// With Consul unreadable it still shows every agent Prometheus
    /// scrapes, Consul's index marked unknown, and fails as Consul did.
    pub(super) async fn status(&self, args: &StatusArgs) -> Result<(), Failure> {
        if args.prometheus.trim().is_empty() {
            return Err(Failure::usage(
                "state status asks the Prometheus that scrapes the agents: give --prometheus URL \
                 (or set GITLAB_HAPROXY_AGENT_PROMETHEUS_URL)",
            ));
        }
        check_url(args.prometheus.trim())
            .map_err(|e| Failure::usage(format!("--prometheus: {e}")))?;
        let store_id = format!("{}{}", self.prefix, crate::model::identity::STORE_ID_KEY);
        let (index, out, consul_failure, consul_has_id) =
            match self.client.list_prefix(&self.prefix).await {
                Ok(mut answer) => (
                    Some(answer.index),
                    {
                        let records = self.records().await;
                        answer.pairs.extend(records);
                        keys_out(&self.prefix, &answer.pairs, self.author.at, self.json)
                    },
                    None,
                    answer.pairs.iter().any(|p| p.key == store_id),
                ),
                Err(e) => {
                    let keys =
                        (!self.json).then_some("Keys out: unknown (Consul could not be read).");
                    (None, json!(keys), Some(Failure::from(e)), false)
                }
            };
        let unavailable = |e: String| match &consul_failure {
            // Neither can be read: Consul's failure decides the exit.
            Some(f) => Failure::new(f.code, f.kind, format!("{}; and {e}", f.message)),
            None => not_confirmed("prometheus_unavailable", e),
        };
        let http = http_client().map_err(unavailable)?;
        let mut fleet = fetch_fleet(&http, &args.prometheus, &args.selector)
            .await
            .map_err(|e| unavailable(e.message))?;
        fetch_health(&http, &args.prometheus, &args.selector, &mut fleet)
            .await
            .map_err(|e| unavailable(e.message))?;
        fleet.expect_store_id(consul_has_id);
        let holds = crate::fleet::held::fleet_holds(self.holds.as_ref()).await;
        let failure = match consul_failure {
            Some(mut f) => {
                f.message = format!(
                    "{}: the agents are shown as Prometheus last scraped them, against no Consul \
                     index",
                    f.message
                );
                Some(f)
            }
            None => (fleet.status_failure(index, &args.prometheus, &args.selector))
                .map(|(kind, message)| not_confirmed(kind, message)),
        };
        if self.json {
            let mut view = status_json(&fleet, index);
            view["held"] = holds.json();
            view["keys_out"] = out;
            if let Some(f) = &failure {
                view["error"] = json!(f);
            }
            out_line(&serde_json::to_string_pretty(&view).unwrap_or_default());
        } else if fleet.agents.is_empty() {
            out_line(&format!(
                "Prometheus at {} has no target matching {{{}}}.",
                args.prometheus, args.selector
            ));
        } else {
            out_line(status_text(&fleet, index).trim_end());
            out_line(out.as_str().unwrap_or_default().trim_end());
            out_line(&holds.section(&[]).unwrap_or_else(|| holds.heading()));
            out_line(match (&failure, index) {
                (None, _) => "Verdict: ok.",
                (Some(_), None) => "Verdict: NOT OK: Consul could not be read (see the error).",
                (Some(_), Some(_)) => "Verdict: NOT OK (see STATUS and the error).",
            });
        }
        match failure {
            None => Ok(()),
            Some(mut f) => {
                f.reported = self.json;
                Err(f)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::tests::{answers, vector, JOB};
    use crate::fleet::text::{headline, status_failure_text};
    use crate::fleet::Lag;

    #[test]
    fn status_json_names_each_agent_s_fields_and_lag() {
        let fleet = Fleet::from_answers(&answers()).unwrap();
        let v = status_json(&fleet, Some(120));
        let a = &v["agents"][1];
        let mut keys: Vec<&str> = a.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "answered_index",
                "consul_index",
                "fqdn",
                "instance",
                "lag",
                "last_sync_age_seconds",
                "problems",
                "rows_answered",
                "rows_seen",
                "status",
                "up"
            ]
        );
        assert_eq!(
            (&a["instance"], &a["lag"]),
            (&json!("10.0.0.2:9101"), &json!("target_down"))
        );
        assert_eq!(v["agents_total"], 3);
    }

    #[test]
    fn names_every_agent_that_lags_and_why() {
        let fleet = Fleet::from_answers(&answers()).unwrap();
        let verdict = fleet.verdict(120, Some(AnswerKind::Drain));
        assert!(!verdict.all_confirmed());
        assert_eq!(verdict.confirmed.len(), 1);
        let lags: Vec<(&str, Lag)> = verdict
            .lagging
            .iter()
            .map(|(a, l)| (a.instance.as_str(), *l))
            .collect();
        assert_eq!(
            lags,
            [
                ("10.0.0.2:9101", Lag::Down),
                ("10.0.0.3:9101", Lag::AnsweredBehind)
            ]
        );
        assert_eq!(
            headline(&verdict),
            "1/3 agents at index >= 120, 2 rows answered drain"
        );
        let text = lagging_text(&verdict, Duration::from_secs(30));
        assert!(
            text.starts_with("not confirmed after 30s: 1/3 agents at index >= 120"),
            "{text}"
        );
        assert!(
            text.contains(
                "10.0.0.2:9101 (lb-02): target down (the last scrape failed), index 90, \
                 answered from 90, last sync 75s ago; "
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "10.0.0.3:9101 (lb-03): rows last answered from a snapshot older than 120, \
                 index 120, answered from 100, last sync 0s ago. "
            ),
            "{text}"
        );
        assert_eq!(
            status_failure_text(&fleet, &fleet.verdict(120, None), Some(120)),
            "1/3 agents at index >= 120; 2 agents are behind: 10.0.0.2:9101 (lb-02): target \
             down (the last scrape failed), index 90, answered from 90, last sync 75s ago; \
             10.0.0.3:9101 (lb-03): rows last answered from a snapshot older than 120, index \
             120, answered from 100, last sync 0s ago"
        );
        assert!(!text.contains("10.0.0.1"), "{text}");
    }

    #[test]
    fn confirms_when_every_agent_is_at_the_index() {
        let mut answers = answers();
        answers[0] = vector(&[
            ("up", &[JOB, ("instance", "10.0.0.1:9101")], "1"),
            ("up", &[JOB, ("instance", "10.0.0.3:9101")], "1"),
        ]);
        let fleet = Fleet::from_answers(&answers).unwrap();
        // lb-02's stale values are ignored: it is no longer a target.
        assert_eq!(fleet.agents.len(), 2);
        let verdict = fleet.verdict(100, Some(AnswerKind::Drain));
        assert!(verdict.all_confirmed());
        assert_eq!(
            headline(&verdict),
            "2/2 agents at index >= 100, 3 rows answered drain"
        );
        assert!(!fleet.verdict(101, None).all_confirmed());
    }

    #[test]
    fn status_is_not_ok_for_rows_not_asked_held_keys_or_no_store_id() {
        let a = [JOB, ("instance", "10.0.0.1:9101")];
        let mut answers = answers();
        answers[0] = vector(&[("up", &a, "1")]);
        let mut fleet = Fleet::from_answers(&answers).unwrap();
        assert!(fleet.status_ok(Some(120)));
        // Consul's index unknown: never ok, every agent still shown.
        assert!(!fleet.status_ok(None));
        let text = status_text(&fleet, None);
        assert!(text.contains("10.0.0.1:9101"), "{text}");
        assert!(text.contains("Consul's index is unknown"), "{text}");
        let health = |not_asked: &str, held: &str, store: &str| {
            vec![
                vector(&[("", &a, not_asked)]),
                vector(&[("", &a, held)]),
                vector(&[("", &a, store)]),
                vector(&[("", &a, "1")]),
            ]
        };
        fleet.add_health(&health("0", "0", "1")).unwrap();
        assert!(fleet.status_ok(Some(120)));
        fleet.add_health(&health("0", "0", "0")).unwrap();
        // A store the writer never wrote: no id anywhere, ok.
        fleet.expect_store_id(false);
        assert!(fleet.status_ok(Some(120)));
        fleet.add_health(&health("1", "2", "0")).unwrap();
        fleet.expect_store_id(true);
        assert!(!fleet.status_ok(Some(120)));
        let text = status_text(&fleet, Some(120));
        assert!(
            text.contains(" rows_not_asked,held_keys,no_store_id\n"),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.1:9101: 1 row answered drain or maint that HAProxy"),
            "{text}"
        );
        let v = status_json(&fleet, Some(120));
        assert_eq!(v["ok"], false);
        assert_eq!(v["agents"][0]["problems"][1]["kind"], "held_keys");
        assert_eq!(v["agents"][0]["held_keys"], 2);
        let verdict = fleet.status_verdict(Some(120));
        let text = status_failure_text(&fleet, &verdict, Some(120));
        assert!(
            text.contains("1 agent is not ok: 10.0.0.1:9101: 1 row"),
            "{text}"
        );
    }

    #[test]
    fn status_shows_every_agent_and_the_totals() {
        let fleet = Fleet::from_answers(&answers()).unwrap();
        let text = status_text(&fleet, Some(120));
        assert!(text.starts_with("INSTANCE "), "{text}");
        assert!(text.contains("target_down"), "{text}");
        assert!(text.contains("answered_behind"), "{text}");
        assert!(
            text.ends_with(
                "1/3 agents at index >= 120 (the prefix's X-Consul-Index now); rows answered: 3 drain, 1 ready.\n"
            ),
            "{text}"
        );
        let v = status_json(&fleet, Some(120));
        assert_eq!(v["ok"], false);
        assert_eq!(v["agents"][1]["lag"], "target_down");
    }
}
