//! What the writer says of a [`Verdict`]: the headline of a confirmation
//! (`N/M agents at index >= I, ...`), each lagging agent and why, and the
//! failures of a confirmation and of `state status`, in words.

use std::time::Duration;

use super::{groups, AgentView, Fleet, Lag, Verdict};

pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub(crate) fn waiting_text(action: &str, index: u64, base: &str, timeout: Duration) -> String {
    format!(
        "{action}: confirming with Prometheus at {base} that every agent answers from index \
         >= {index} (up to {})",
        humantime::format_duration(timeout)
    )
}

/// The headline of every outcome: `N/M agents at index >= I, R rows
/// answered S` (without the rows when there is no state to count, or for
/// row keys, which the agents count no rows apart for).
pub(crate) fn headline(verdict: &Verdict<'_>) -> String {
    let mut text = format!(
        "{}/{} agents at index >= {}",
        verdict.confirmed.len(),
        verdict.confirmed.len() + verdict.lagging.len(),
        verdict.index,
    );
    match (verdict.state, &verdict.group, verdict.rows) {
        (Some(state), Some(g), _) => text.push_str(&groups::describe(g, state)),
        (Some(state), None, Some(rows)) => text.push_str(&format!(
            ", {} answered {state}",
            plural(rows as usize, "row", "rows")
        )),
        _ => {}
    }
    text.push_str(&groups::by_index_text(verdict));
    text
}

pub(crate) fn confirmed_text(action: &str, verdict: &Verdict<'_>, waited: Duration) -> String {
    format!(
        "{action}: confirmed: {} (after {:.1}s)",
        headline(verdict),
        waited.as_secs()
    )
}

/// One lagging agent: `instance (why; index X, answered from Y, last sync
/// Zs ago)`.
pub(crate) fn lagging_agent(agent: &AgentView, lag: Lag, index: u64) -> String {
    let why = match lag {
        Lag::Down => "target down (the last scrape failed)".to_string(),
        Lag::NoMetrics => "scraped without the agent's metrics".to_string(),
        Lag::Behind => format!("snapshot older than {index}"),
        Lag::NotAsked => "HAProxy asked it nothing in the last 60 s".to_string(),
        Lag::AnsweredBehind => format!("rows last answered from a snapshot older than {index}"),
    };
    let known = |v: Option<u64>| v.map_or("unknown".to_string(), |v| v.to_string());
    let age = agent
        .last_sync_age
        .map_or("unknown".to_string(), |a| format!("{a:.0}s ago"));
    format!(
        "{}: {why}, index {}, answered from {}, last sync {age}",
        agent.name(),
        known(agent.consul_index),
        known(agent.answered_index),
    )
}

/// `N agents are behind: <agent>; <agent>`, naming every lagging agent.
pub(crate) fn behind_text(verdict: &Verdict<'_>) -> String {
    let names: Vec<String> = verdict
        .lagging
        .iter()
        .map(|(a, lag)| lagging_agent(a, *lag, verdict.index))
        .collect();
    format!(
        "{} behind: {}",
        plural(verdict.lagging.len(), "agent is", "agents are"),
        names.join("; ")
    )
}

/// The failure when agents still lag at the deadline, naming every one.
pub(crate) fn lagging_text(verdict: &Verdict<'_>, waited: Duration) -> String {
    format!(
        "not confirmed after {}s: {}; {}. The write is in Consul, but those load \
         balancers may still answer the old state. Follow them with `state status \
         --prometheus URL`; once they are fixed (runbook: Agent down, Consul sync stale, \
         HAProxy not asking), re-run the same command to go on (it is idempotent)",
        waited.as_secs(),
        headline(verdict),
        behind_text(verdict),
    )
}

pub(crate) fn no_agents_text(base: &str, selector: &str, waited: Duration) -> String {
    format!(
        "not confirmed after {}s: Prometheus at {base} has no target matching \
         {{{selector}}}; nothing tells whether the fleet applied the write (set \
         --confirm-selector to the agents' scrape job)",
        waited.as_secs()
    )
}

pub(crate) fn unavailable_text(index: u64, error: &str, waited: Duration) -> String {
    format!(
        "not confirmed after {}s: {error}; the write (index {index}) is in Consul, but \
         whether every agent applied it is unknown",
        waited.as_secs()
    )
}

/// The failure of `state status` when agents lag or are not ok, naming
/// them.
pub(crate) fn status_failure_text(
    fleet: &Fleet,
    verdict: &Verdict<'_>,
    index: Option<u64>,
) -> String {
    let mut parts = Vec::new();
    if index.is_some() {
        parts.push(headline(verdict));
    }
    if !verdict.lagging.is_empty() {
        parts.push(behind_text(verdict));
    }
    let troubled: Vec<String> = fleet
        .troubled()
        .map(|(a, t)| {
            let why: Vec<String> = t.iter().map(|t| t.text()).collect();
            format!("{}: {}", a.name(), why.join("; "))
        })
        .collect();
    if !troubled.is_empty() {
        parts.push(format!(
            "{} not ok: {}",
            plural(troubled.len(), "agent is", "agents are"),
            troubled.join(" | ")
        ));
    }
    parts.join("; ")
}
