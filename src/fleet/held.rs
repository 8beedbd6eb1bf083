//! What the agents hold, as the Prometheus that scrapes them shows it
//! (`gitlab_haproxy_agent_held_key{key,cause,state}`): keys answered with
//! another state than Consul's (an invalid value, a rollback, a key hidden
//! from the token). `state list`, `get`, `explain`, `status` and
//! `release-rollback --dry-run` say it with [`held_answer`], the phrase
//! `/status` uses; without Prometheus they say that what the agents hold is
//! not known here.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{http_client, instant_query, samples};
use crate::cli::DEFAULT_PROMETHEUS_SELECTOR;
use crate::decision::{held_answer, parse_held_state, HoldCause};
use crate::model::value::AdminState;

/// Where the agents' metrics are: `--prometheus` and the selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Prometheus's base URL.
    pub base: String,
    /// PromQL label matchers of the agents' targets.
    pub selector: String,
}

impl Source {
    /// The source of a command: `prometheus` (the global `--prometheus`,
    /// empty is none) and `selector`, else
    /// `$GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR`, else the default.
    pub fn of(prometheus: Option<&str>, selector: Option<&str>) -> Option<Source> {
        let base = prometheus.map(str::trim).filter(|u| !u.is_empty())?;
        let selector = selector
            .map(str::to_string)
            .or_else(|| std::env::var("GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR").ok())
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_PROMETHEUS_SELECTOR.to_string());
        Some(Source {
            base: base.to_string(),
            selector,
        })
    }
}

/// One agent holding one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The agent's `instance` (with its `fqdn` when the scrape sets one).
    pub agent: String,
    /// Why it holds the key.
    pub cause: HoldCause,
    /// The state it answers for the key (`None`: held absent).
    pub state: Option<AdminState>,
    /// With no state of its own: the most it lets the next identity answer
    /// (the label's `at most 40%`,
    /// [`held_state`](crate::decision::held_state)).
    pub cap: Option<AdminState>,
}

impl Holder {
    /// [`held_answer`] of this hold.
    pub fn answer(&self) -> String {
        held_answer(self.state, self.cap, self.cause)
    }
}

/// What the fleet holds, or why it is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// Known from Prometheus at `base`: `agents` targets, the holders of
    /// each held key.
    Known {
        /// Prometheus's base URL.
        base: String,
        /// Agent targets (`up`).
        agents: usize,
        /// Held keys and who holds them.
        keys: BTreeMap<String, Vec<Holder>>,
    },
    /// Not known: why (no --prometheus, Prometheus unreachable).
    Unknown(String),
}

/// Asks Prometheus what the agents hold; never fails: a failure is
/// [`Holds::Unknown`] with the reason.
pub async fn fleet_holds(source: Option<&Source>) -> Holds {
    let Some(source) = source else {
        return Holds::Unknown(
            "no Prometheus is set (--prometheus URL or GITLAB_HAPROXY_AGENT_PROMETHEUS_URL); \
             /status on a load balancer shows what its agent holds"
                .to_string(),
        );
    };
    match fetch(source).await {
        Ok(h) => h,
        Err(e) => Holds::Unknown(e),
    }
}

async fn fetch(source: &Source) -> Result<Holds, String> {
    let http = http_client()?;
    let m = format!("{{{}}}", source.selector);
    let up = instant_query(&http, &source.base, &format!("up{m}"))
        .await
        .map_err(|e| e.message)?;
    // The values now: a hold released is gone from the next scrape.
    let held = instant_query(
        &http,
        &source.base,
        &format!("gitlab_haproxy_agent_held_key{m}"),
    )
    .await
    .map_err(|e| e.message)?;
    let agents = samples(&up, "up")?.len();
    let mut keys: BTreeMap<String, Vec<Holder>> = BTreeMap::new();
    for s in samples(&held, "held_key")? {
        let label = |l: &str| s.labels.get(l).cloned().unwrap_or_default();
        let Some(cause) = HoldCause::from_label(&label("cause")) else {
            continue;
        };
        let instance = label("instance");
        let agent = match s.labels.get("fqdn") {
            Some(f) if *f != instance => format!("{instance} ({f})"),
            _ => instance,
        };
        let (state, cap) = parse_held_state(&label("state"));
        keys.entry(label("key")).or_default().push(Holder {
            agent,
            cause,
            state,
            cap,
        });
    }
    Ok(Holds::Known {
        base: source.base.clone(),
        agents,
        keys,
    })
}

impl Holds {
    /// What the agents answer for `key`, in one phrase:
    /// `maint 100% (held: invalid value) on 2/2 agents`; for a key Consul
    /// shows `invalid`, the agents that do not hold it skip it. `None` when
    /// known and no agent holds it (and it is valid).
    pub fn key_phrase(&self, key: &str, invalid: bool) -> Option<String> {
        match self {
            Holds::Unknown(_) => invalid.then(|| {
                "an agent that knew a valid value answers it (held: invalid value); one that \
                 did not skips the key"
                    .to_string()
            }),
            Holds::Known { agents, keys, .. } => {
                let holders = keys.get(key).map(Vec::as_slice).unwrap_or(&[]);
                if holders.is_empty() && !invalid {
                    return None;
                }
                let mut by: BTreeMap<String, usize> = BTreeMap::new();
                for h in holders {
                    *by.entry(h.answer()).or_default() += 1;
                }
                let mut parts: Vec<String> = by
                    .into_iter()
                    .map(|(answer, n)| format!("{answer} on {n}/{agents} agents"))
                    .collect();
                let rest = agents.saturating_sub(holders.len());
                if invalid && rest > 0 {
                    parts.push(format!(
                        "skipped (no valid value known) on {rest}/{agents} agents"
                    ));
                }
                Some(parts.join("; "))
            }
        }
    }

    /// One line per held key (of `cause`, when given):
    /// `canary: maint 100% (held: invalid value) on 2/2 agents`.
    pub fn lines(&self, cause: Option<HoldCause>) -> Vec<String> {
        let Holds::Known { keys, .. } = self else {
            return Vec::new();
        };
        keys.iter()
            .filter(|(_, hs)| cause.is_none_or(|c| hs.iter().any(|h| h.cause == c)))
            .filter_map(|(k, _)| Some(format!("{k}: {}", self.key_phrase(k, false)?)))
            .collect()
    }

    /// `{"known": true, "prometheus": URL, "agents": N, "keys": {KEY:
    /// [{agent, cause, state, answer}]}}`, or `{"known": false, "why": ...}`.
    pub fn json(&self) -> Value {
        match self {
            Holds::Unknown(why) => json!({"known": false, "why": why}),
            Holds::Known { base, agents, keys } => json!({
                "known": true,
                "prometheus": base,
                "agents": agents,
                "keys": keys.iter().map(|(k, hs)| (k.clone(), json!(hs.iter().map(|h| json!({
                    "agent": h.agent,
                    "cause": h.cause.as_str(),
                    "state": h.state.map(|s| s.to_string()),
                    "answer": h.answer(),
                })).collect::<Vec<_>>()))).collect::<serde_json::Map<String, Value>>(),
            }),
        }
    }

    /// The section `state list` and `state status` print: the heading, then
    /// one line per held key and per key of `invalid` (keys Consul shows
    /// with an invalid value); `None` when there is nothing to say.
    pub fn section(&self, invalid: &[String]) -> Option<String> {
        let phrases = self.phrases(invalid);
        if phrases.is_empty() {
            return None;
        }
        let mut text = self.heading();
        for (k, p) in phrases {
            text.push_str(&format!("\n  {k}: {p}"));
        }
        Some(text)
    }

    /// [`Holds::key_phrase`] of every held key and every key of `invalid`,
    /// by key.
    pub fn phrases(&self, invalid: &[String]) -> BTreeMap<String, String> {
        let mut keys: Vec<&str> = invalid.iter().map(String::as_str).collect();
        if let Holds::Known { keys: held, .. } = self {
            keys.extend(held.keys().map(String::as_str));
        }
        keys.into_iter()
            .filter_map(|k| {
                let bad = invalid.iter().any(|i| i == k);
                Some((k.to_string(), self.key_phrase(k, bad)?))
            })
            .collect()
    }

    /// The heading of the held section: `Held by the agents (Prometheus at
    /// URL, N agents):`, or the reason it is not known.
    pub fn heading(&self) -> String {
        match self {
            Holds::Known { base, agents, keys } if keys.is_empty() => format!(
                "No agent holds a key (Prometheus at {base}, {}): each answers Consul's values.",
                agents_text(*agents)
            ),
            Holds::Known { base, agents, .. } => format!(
                "Held by the agents (Prometheus at {base}, {}):",
                agents_text(*agents)
            ),
            Holds::Unknown(why) => format!("What the agents hold is not known here: {why}."),
        }
    }
}

/// `1 agent`, `3 agents`.
pub fn agents_text(n: usize) -> String {
    format!("{n} agent{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(holders: &[(&str, HoldCause, Option<AdminState>)]) -> Holds {
        let mut keys = BTreeMap::new();
        for (key, cause, state) in holders {
            keys.entry(key.to_string())
                .or_insert_with(Vec::new)
                .push(Holder {
                    agent: "a".into(),
                    cause: *cause,
                    state: *state,
                    cap: None,
                });
        }
        Holds::Known {
            base: "http://p:9090".into(),
            agents: 2,
            keys,
        }
    }

    #[test]
    fn an_invalid_key_is_held_by_agents_that_knew_a_value_and_skipped_by_the_others() {
        let h = known(&[("canary", HoldCause::InvalidValue, Some(AdminState::Maint))]);
        assert_eq!(
            h.key_phrase("canary", true).unwrap(),
            "maint 100% (held: invalid value) on 1/2 agents; skipped (no valid value known) on \
             1/2 agents"
        );
        assert_eq!(h.key_phrase("zone-b", false), None);
        assert_eq!(
            h.lines(None),
            ["canary: maint 100% (held: invalid value) on 1/2 agents"]
        );
        assert!(h.lines(Some(HoldCause::RolledBack)).is_empty());
        let unknown = Holds::Unknown("no Prometheus".into());
        assert!(unknown
            .key_phrase("canary", true)
            .unwrap()
            .ends_with("one that did not skips the key"));
        assert_eq!(
            unknown.section(&["canary".to_string()]).unwrap(),
            "What the agents hold is not known here: no Prometheus.\n  canary: an agent that \
             knew a valid value answers it (held: invalid value); one that did not skips the key"
        );
        assert_eq!(unknown.key_phrase("canary", false), None);
    }
}
