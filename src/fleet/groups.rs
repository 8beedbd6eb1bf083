//! What the agents say of the groups their servers name
//! (`gitlab_haproxy_agent_group_rows`, `..._group_decided_rows`,
//! `..._group_overridden_rows`), as the Prometheus that scrapes them shows
//! it: which groups exist ([`fleet_groups`]), and for a write of a group
//! key, the servers the key decides ([`GroupVerdict`], filled by
//! [`apply`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    as_index, fetch_fleet, instant_query, samples, FetchError, Fleet, GroupVerdict, Lag, Verdict,
    LOOKBACK,
};
use crate::model::value::AnswerKind;

/// The groups the agents matched by a selector name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetGroups {
    /// Agent targets matched (`up`).
    pub agents: usize,
    /// Groups named on an agent-send line some agent was asked about
    /// within the last hour.
    pub names: BTreeSet<String>,
    /// Some agent names more groups than it exports
    /// (`gitlab_haproxy_agent_groups_over_cap` above 0): a group missing
    /// from `names` may still exist.
    pub over_cap: bool,
}

/// PromQL label matchers: `selector` and `extra`, either possibly empty.
fn matchers(selector: &str, extra: &str) -> String {
    let parts: Vec<&str> = [selector.trim(), extra]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// `group="KEY"`, quoted for PromQL.
fn group_matcher(key: &str) -> String {
    format!(
        "group=\"{}\"",
        key.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

/// Asks Prometheus at `base` which groups the agents matched by `selector`
/// name (within [`LOOKBACK`], so a load balancer down for minutes still
/// counts).
///
/// # Errors
///
/// Prometheus unreachable or refusing a query ([`FetchError`]).
pub async fn fleet_groups(
    http: &reqwest::Client,
    base: &str,
    selector: &str,
) -> Result<FleetGroups, FetchError> {
    let m = matchers(selector, "");
    let up = instant_query(http, base, &format!("up{m}")).await?;
    let names = instant_query(
        http,
        base,
        &format!(
            "group by (group) (last_over_time(gitlab_haproxy_agent_group_rows{m}[{LOOKBACK}]))"
        ),
    )
    .await?;
    let over = instant_query(
        http,
        base,
        &format!("max(last_over_time(gitlab_haproxy_agent_groups_over_cap{m}[{LOOKBACK}]))"),
    )
    .await?;
    let bad = |e: String| FetchError {
        message: format!("Prometheus at {base}: {e}"),
        lasting: false,
    };
    Ok(FleetGroups {
        agents: samples(&up, "up").map_err(bad)?.len(),
        names: samples(&names, "group_rows")
            .map_err(bad)?
            .into_iter()
            .filter_map(|s| s.labels.get("group").cloned())
            // Agents of earlier versions export the reload guard's probe
            // line as a group: it is none.
            .filter(|g| g != crate::check_ready::PROBE_IDENTITY)
            .collect(),
        over_cap: samples(&over, "groups_over_cap")
            .map_err(bad)?
            .iter()
            .any(|s| s.value > 0.0),
    })
}

/// How one agent's rows name the written group key (instant values).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentGroup {
    /// Rows naming the key (`group_rows`, every answer).
    pub naming: u64,
    /// Those rows by answer.
    pub naming_by: BTreeMap<String, u64>,
    /// Rows the key decides, by answer (`group_decided_rows`).
    pub decided: BTreeMap<String, u64>,
    /// (row, deciding key, its answer, rows) from `group_overridden_rows`.
    pub overridden: Vec<(String, String, String, u64)>,
}

/// The fleet, and how each agent's rows (by `instance`) name `key`, when a
/// group key was written.
///
/// # Errors
///
/// As [`fetch_fleet`].
pub async fn fetch_with_group(
    http: &reqwest::Client,
    base: &str,
    selector: &str,
    key: Option<&str>,
) -> Result<(Fleet, Option<BTreeMap<String, AgentGroup>>), FetchError> {
    let fleet = fetch_fleet(http, base, selector).await?;
    let Some(key) = key else {
        return Ok((fleet, None));
    };
    let m = matchers(selector, &group_matcher(key));
    let mut agents: BTreeMap<String, AgentGroup> = BTreeMap::new();
    let bad = |e: String| FetchError {
        message: format!("Prometheus at {base}: {e}"),
        lasting: false,
    };
    for (metric, what) in [
        ("gitlab_haproxy_agent_group_rows", 0),
        ("gitlab_haproxy_agent_group_decided_rows", 1),
        ("gitlab_haproxy_agent_group_overridden_rows", 2),
    ] {
        let answer = instant_query(http, base, &format!("{metric}{m}")).await?;
        for s in samples(&answer, metric).map_err(bad)? {
            let Some(instance) = s.labels.get("instance") else {
                continue;
            };
            let a = agents.entry(instance.clone()).or_default();
            let n = as_index(s.value);
            let label = |l: &str| s.labels.get(l).cloned().unwrap_or_default();
            match what {
                0 => {
                    a.naming += n;
                    *a.naming_by.entry(label("answer")).or_default() += n;
                }
                1 => *a.decided.entry(label("answer")).or_default() += n,
                _ => a
                    .overridden
                    .push((label("row"), label("key"), label("answer"), n)),
            }
        }
    }
    Ok((fleet, Some(agents)))
}

/// Counts, into `verdict`, the servers a write of the group key `key`
/// decides: agents whose HAProxy names no row with the key confirm by their
/// index alone (a node with nothing enrolled is not lagging); rows naming
/// the key that another key decides are named, and block the confirmation
/// when the write takes servers out (`state` drain or maint) and the other
/// key keeps them in service (an answer other than drain or maint; rows
/// past the agents' cap of named ones count as in service), unless
/// `accept`. A server its own key already holds out does not block.
pub fn apply(
    verdict: &mut Verdict<'_>,
    key: &str,
    rows: &BTreeMap<String, AgentGroup>,
    state: AnswerKind,
    accept: bool,
) {
    let naming = |instance: &str| rows.get(instance).map_or(0, |r| r.naming);
    let mut g = GroupVerdict {
        key: key.to_string(),
        overridden_block: !accept && matches!(state, AnswerKind::Drain | AnswerKind::Maint),
        ..GroupVerdict::default()
    };
    let lagging = std::mem::take(&mut verdict.lagging);
    for (agent, lag) in lagging {
        if naming(&agent.instance) == 0 && matches!(lag, Lag::NotAsked | Lag::AnsweredBehind) {
            verdict.by_index_only.push(agent.name());
            verdict.confirmed.push(agent);
        } else {
            verdict.lagging.push((agent, lag));
        }
    }
    for agent in &verdict.confirmed {
        let Some(r) = rows.get(&agent.instance) else {
            continue;
        };
        let decided: u64 = r.decided.values().sum();
        let named: u64 = r.overridden.iter().map(|o| o.3).sum();
        let out = |answer: &str| matches!(answer, "drain" | "maint");
        let named_out: u64 = (r.overridden.iter())
            .filter(|o| out(&o.2))
            .map(|o| o.3)
            .sum();
        g.naming += r.naming;
        if state == AnswerKind::Ready {
            // Taking servers back (ready, or the key removed, when rows
            // fall through to the keys after it on their line): count the
            // rows naming it that answer ready; those a key earlier on the
            // line keeps are named.
            g.answering += r.naming_by.get(state.as_str()).copied().unwrap_or(0);
            g.overridden_rows += named;
        } else {
            let answering = r.decided.get(state.as_str()).copied().unwrap_or(0);
            g.answering += answering;
            g.other_answer += decided - answering;
            let overridden = r.naming.saturating_sub(decided).max(named);
            g.overridden_rows += overridden;
            g.overridden_in_service += overridden - named_out;
        }
        for (row, by, answer, n) in &r.overridden {
            g.overridden
                .push((agent.name(), row.clone(), by.clone(), answer.clone(), *n));
        }
    }
    verdict.rows = Some(g.answering);
    verdict.group = Some(g);
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `; zone-b: 2/3 servers naming it answer drain, 1 decided by another
/// key, 1 agent confirmed by its index alone (...)`.
pub fn describe(g: &GroupVerdict, state: &str) -> String {
    let mut text = format!(
        "; {}: {}/{} naming it answer {state}",
        g.key,
        g.answering,
        plural(g.naming, "server", "servers")
    );
    if g.other_answer > 0 {
        text.push_str(&format!(
            ", {} it decides still {} another answer",
            plural(g.other_answer, "server", "servers"),
            if g.other_answer == 1 { "gets" } else { "get" }
        ));
    }
    if g.overridden_rows > 0 {
        text.push_str(&format!(
            ", {} decided by another key: {}",
            plural(g.overridden_rows, "server", "servers"),
            overridden_list(g)
        ));
    }
    text
}

/// For a write of row keys: agents HAProxy asked nothing in the last 60 s
/// (a node with nothing enrolled yet) have no row the write decides, so
/// they confirm by their index alone instead of lagging.
pub fn by_index_alone(verdict: &mut Verdict<'_>) {
    let lagging = std::mem::take(&mut verdict.lagging);
    for (agent, lag) in lagging {
        if lag == Lag::NotAsked {
            verdict.by_index_only.push(agent.name());
            verdict.confirmed.push(agent);
        } else {
            verdict.lagging.push((agent, lag));
        }
    }
}

/// `; confirmed by index alone (...): agents`, or nothing.
pub fn by_index_text(verdict: &Verdict<'_>) -> String {
    if verdict.by_index_only.is_empty() {
        return String::new();
    }
    let why = match &verdict.group {
        Some(g) => format!("their HAProxy names no server with {}", g.key),
        None => "HAProxy asked them nothing in the last 60 s".to_string(),
    };
    format!(
        "; confirmed by index alone ({why}): {}",
        verdict.by_index_only.join(", ")
    )
}

/// At most this many load balancers are named per overridden server: 10
/// (the others are counted).
const AGENTS_NAMED: usize = 10;

/// The overridden rows of `g`, one entry per server (row, deciding key and
/// its answer) with the load balancers that keep it so, in order: a server
/// on 80 load balancers is one entry, not 80.
pub fn overridden_servers(g: &GroupVerdict) -> Vec<(String, String, String, Vec<String>, u64)> {
    let mut out: Vec<(String, String, String, Vec<String>, u64)> = Vec::new();
    for (agent, row, by, answer, n) in &g.overridden {
        match out
            .iter_mut()
            .find(|o| (&o.0, &o.1, &o.2) == (row, by, answer))
        {
            Some(o) => {
                o.3.push(agent.clone());
                o.4 += n;
            }
            None => out.push((
                row.clone(),
                by.clone(),
                answer.clone(),
                vec![agent.clone()],
                *n,
            )),
        }
    }
    out
}

/// `web/s1 (decided by web/s1: ready, on lb-01, lb-02), ...`.
fn overridden_list(g: &GroupVerdict) -> String {
    let named: Vec<String> = overridden_servers(g)
        .iter()
        .map(|(row, by, answer, agents, _)| {
            let more = agents.len().saturating_sub(AGENTS_NAMED);
            let on = agents[..agents.len().min(AGENTS_NAMED)].join(", ");
            let on = match (agents.len(), more) {
                (1, _) => format!("on {on}"),
                (n, 0) => format!("on {n} load balancers: {on}"),
                (n, more) => format!("on {n} load balancers: {on} and {more} more"),
            };
            format!("{row} (decided by {by}: {answer}, {on})")
        })
        .collect();
    if named.is_empty() {
        "not named by the agents".to_string()
    } else {
        named.join(", ")
    }
}

/// The servers kept in service by another key, counted once whatever the
/// number of load balancers that keep them: the distinct rows named, when
/// the agents named every such row; otherwise the rows counted per load
/// balancer.
fn servers_in_service(g: &GroupVerdict) -> (u64, &'static str, &'static str) {
    let servers = overridden_servers(g);
    let in_service: Vec<_> = servers
        .iter()
        .filter(|s| !matches!(s.2.as_str(), "drain" | "maint"))
        .collect();
    let named_rows: u64 = in_service.iter().map(|s| s.4).sum();
    if named_rows == g.overridden_in_service {
        (in_service.len() as u64, "server", "servers")
    } else {
        (
            g.overridden_in_service,
            "server row (counted per load balancer)",
            "server rows (counted per load balancer)",
        )
    }
}

/// The failure text when servers naming the key are kept from it by
/// another key, once every agent is at the index: exit 68 `overridden`.
pub fn overridden_text(verdict: &Verdict<'_>) -> Option<String> {
    let g = verdict.group.as_ref()?;
    if !verdict.lagging.is_empty() || g.other_answer > 0 || g.holds() {
        return None;
    }
    let (n, one, many) = servers_in_service(g);
    Some(format!(
        "not confirmed: {} naming {} {} kept in service by another key, so this write does not \
         move {}: {}. The write is in Consul; the next step is not written. Clear or change \
         those keys (`state explain`, `state clear`), or re-run the same command with \
         --accept-overridden to go on without them",
        plural(n, one, many),
        g.key,
        if n == 1 { "is" } else { "are" },
        if n == 1 { "it" } else { "them" },
        overridden_list(g),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{vector, JOB};
    use super::*;

    fn fleet() -> Fleet {
        let a = [JOB, ("instance", "10.0.0.1:9101")];
        let b = [JOB, ("instance", "10.0.0.2:9101")];
        Fleet::from_answers(&[
            vector(&[("up", &a, "1"), ("up", &b, "1")]),
            vector(&[("", &a, "50"), ("", &b, "50")]),
            vector(&[("", &a, "50"), ("", &b, "0")]),
            vector(&[("", &a, "1"), ("", &b, "1")]),
            vector(&[("", &a, "3"), ("", &b, "0")]),
            vector(&[]),
        ])
        .unwrap()
    }

    fn rows(decided: u64, overridden: &[(&str, &str, &str)]) -> BTreeMap<String, AgentGroup> {
        let mut a = AgentGroup {
            naming: decided + overridden.len() as u64,
            ..AgentGroup::default()
        };
        a.naming_by.insert("drain".into(), a.naming);
        a.decided.insert("drain".into(), decided);
        for (r, k, answer) in overridden {
            a.overridden
                .push((r.to_string(), k.to_string(), answer.to_string(), 1));
        }
        BTreeMap::from([("10.0.0.1:9101".to_string(), a)])
    }

    #[test]
    fn a_node_with_nothing_enrolled_confirms_by_index() {
        let fleet = fleet();
        let mut verdict = fleet.verdict(50, Some(AnswerKind::Drain));
        assert!(!verdict.all_confirmed(), "b is not asked anything");
        apply(
            &mut verdict,
            "zone-b",
            &rows(2, &[]),
            AnswerKind::Drain,
            false,
        );
        assert!(verdict.all_confirmed());
        assert_eq!(verdict.rows, Some(2));
        let text = describe(verdict.group.as_ref().unwrap(), "drain");
        assert!(
            text.contains("zone-b: 2/2 servers naming it answer drain"),
            "{text}"
        );
        assert_eq!(
            by_index_text(&verdict),
            "; confirmed by index alone (their HAProxy names no server with zone-b): \
             10.0.0.2:9101"
        );
        // A write of row keys: the node HAProxy asks nothing confirms by
        // index too.
        let mut verdict = fleet.verdict(50, Some(AnswerKind::Drain));
        by_index_alone(&mut verdict);
        assert!(verdict.all_confirmed());
        assert_eq!(verdict.by_index_only, ["10.0.0.2:9101"]);
    }

    #[test]
    fn a_server_kept_in_service_by_its_row_key_blocks_a_drain_unless_accepted() {
        let fleet = fleet();
        let mut verdict = fleet.verdict(50, Some(AnswerKind::Drain));
        let kept = rows(1, &[("web/s1", "web/s1", "ready")]);
        apply(&mut verdict, "zone-b", &kept, AnswerKind::Drain, false);
        assert!(!verdict.all_confirmed());
        let text = overridden_text(&verdict).unwrap();
        assert!(
            text.contains("1 server naming zone-b is kept in service by another key")
                && text.contains("web/s1 (decided by web/s1: ready, on 10.0.0.1:9101)"),
            "{text}"
        );
        let mut verdict = fleet.verdict(50, Some(AnswerKind::Drain));
        apply(&mut verdict, "zone-b", &kept, AnswerKind::Drain, true);
        assert!(verdict.all_confirmed());
        assert!(overridden_text(&verdict).is_none());
    }

    #[test]
    fn a_server_its_own_key_holds_out_does_not_block_a_drain_but_is_named() {
        let fleet = fleet();
        for (answer, state) in [
            ("drain", AnswerKind::Drain),
            ("maint", AnswerKind::Drain),
            ("drain", AnswerKind::Maint),
        ] {
            let mut verdict = fleet.verdict(50, Some(state));
            let out = rows(1, &[("web/s1", "web/s1", answer)]);
            let mut out = out;
            out.values_mut().next().unwrap().decided = BTreeMap::from([(state.as_str().into(), 1)]);
            apply(&mut verdict, "zone-b", &out, state, false);
            assert!(verdict.all_confirmed(), "{answer} under {state:?}");
            assert!(overridden_text(&verdict).is_none());
            let g = verdict.group.as_ref().unwrap();
            assert_eq!((g.overridden_rows, g.overridden_in_service), (1, 0));
            assert!(describe(g, state.as_str()).contains("web/s1 (decided by web/s1: "));
        }
    }
}
