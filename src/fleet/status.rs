//! The verdict of `state status` on the fleet: against Consul's index
//! (unknown when Consul could not be read), each agent's lag and what else
//! is wrong with it ([`super::Trouble`]), and the `--json` view.

use serde_json::{json, Value};

use super::{groups, AgentView, Fleet, Lag, Trouble, Verdict};

impl Fleet {
    /// How the fleet stands for `state status`: as for a confirmation, an
    /// agent HAProxy asks nothing (a node with nothing enrolled) is at the
    /// index by its index alone (its status still says `not_asked`). With
    /// Consul's index unknown (`None`), no agent is behind it.
    pub fn status_verdict(&self, index: Option<u64>) -> Verdict<'_> {
        let mut verdict = self.verdict(index.unwrap_or(0), None);
        groups::by_index_alone(&mut verdict);
        verdict
    }

    /// The verdict of `state status`: Consul's index is known, there is an
    /// agent, none lags, and none has rows HAProxy no longer asks about,
    /// held keys, or a store without an id.
    pub fn status_ok(&self, index: Option<u64>) -> bool {
        index.is_some()
            && self.status_verdict(index).all_confirmed()
            && self.troubled().next().is_none()
    }

    /// Why `state status` is not ok with Consul's index known: its kind
    /// (`not_confirmed` when an agent lags or there is none, `not_ok`) and
    /// message; `None` when ok. `base` and `selector` say where the agents
    /// were looked for.
    pub fn status_failure(
        &self,
        index: Option<u64>,
        base: &str,
        selector: &str,
    ) -> Option<(&'static str, String)> {
        if self.status_ok(index) {
            return None;
        }
        if self.agents.is_empty() {
            return Some((
                "not_confirmed",
                format!("no agent: Prometheus at {base} has no target matching {{{selector}}}"),
            ));
        }
        let verdict = self.status_verdict(index);
        let kind = match verdict.lagging.is_empty() {
            true => "not_ok",
            false => "not_confirmed",
        };
        Some((
            kind,
            super::text::status_failure_text(self, &verdict, index),
        ))
    }

    /// The agents with something wrong besides a lag, and what.
    pub fn troubled(&self) -> impl Iterator<Item = (&AgentView, Vec<Trouble>)> {
        self.agents
            .iter()
            .map(|a| (a, a.troubles()))
            .filter(|(_, t)| !t.is_empty())
    }
}

impl AgentView {
    /// The STATUS column (and `status` in `--json`): `ok`, or why not
    /// (the lag, then the troubles), comma separated.
    pub fn status(&self, index: Option<u64>) -> String {
        let mut why: Vec<&str> = self
            .lag(index.unwrap_or(0))
            .map(Lag::as_str)
            .into_iter()
            .collect();
        why.extend(self.troubles().into_iter().map(Trouble::as_str));
        match why.is_empty() {
            true => "ok".to_string(),
            false => why.join(","),
        }
    }
}

/// The fleet view for `state status --json`.
pub fn status_json(fleet: &Fleet, index: Option<u64>) -> Value {
    let verdict = fleet.status_verdict(index);
    json!({
        "ok": fleet.status_ok(index),
        "consul_index": index,
        "agents_total": fleet.agents.len(),
        "agents_at_index": index.map(|_| verdict.confirmed.len()),
        "agents": fleet.agents.iter().map(|a| {
            let mut v = json!(a);
            v["lag"] = json!(a.lag(index.unwrap_or(0)).map(Lag::as_str));
            v["problems"] = json!(a.troubles().into_iter().map(|t| json!({
                "kind": t.as_str(),
                "message": t.text(),
            })).collect::<Vec<_>>());
            v["status"] = json!(a.status(index));
            v
        }).collect::<Vec<_>>(),
    })
}
