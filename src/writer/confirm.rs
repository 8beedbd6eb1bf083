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
//! `gitlab_haproxy_agent_rows_answered{state}`.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::plan::Change;
use super::{exit, CanaryAction, Failure, StateCommand, Writer};
use crate::consul::{ConsulClient, ConsulError};
use crate::state::AnswerKind;

/// The default `--confirm-selector`: the scrape job the alerts and the
/// dashboard use.
pub const DEFAULT_SELECTOR: &str = r#"job="gitlab-haproxy-agent""#;

/// How often Prometheus is asked again while agents lag: 1 s.
pub const POLL: Duration = Duration::from_secs(1);

/// Longest one Prometheus query may take: 5 s.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// How far back an agent's last scraped values are looked up, so that an
/// agent whose target is down is still shown with its last index and last
/// sync: 1 hour.
const LOOKBACK: &str = "1h";

/// The options every write command takes to confirm its writes.
#[derive(Debug, Args, Clone, Default)]
pub struct ConfirmArgs {
    /// After each write step, ask the Prometheus at URL (its base, plain
    /// http, e.g. `http://prometheus:9090`) whether every agent holds a snapshot at or
    /// past the write's ModifyIndex and has answered the rows HAProxy asks
    /// about from it; wait up to --confirm-timeout, else name the agents
    /// that lag and exit 68 (the next step is not written).
    #[arg(long, value_name = "URL", env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL")]
    pub confirm_prometheus: Option<String>,
    /// How long to wait for every agent to confirm each write step. Make it
    /// longer than the scrape interval plus agent-inter.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub confirm_timeout: Duration,
    /// PromQL label matchers that select the agents' scrape targets (every
    /// agent reading this Consul datacenter, e.g. add
    /// `environment="gprd"`).
    #[arg(
        long,
        value_name = "MATCHERS",
        default_value = DEFAULT_SELECTOR,
        env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR"
    )]
    pub confirm_selector: String,
}

/// Options of `state status`.
#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// The Prometheus that scrapes every agent (its base URL).
    #[arg(long, value_name = "URL", env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL")]
    pub prometheus: String,
    /// PromQL label matchers that select the agents' scrape targets.
    #[arg(
        long,
        value_name = "MATCHERS",
        default_value = DEFAULT_SELECTOR,
        env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR"
    )]
    pub selector: String,
}

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

/// The `--confirm-*` options of the command, when `--confirm-prometheus`
/// (or its environment variable) is given and not empty.
///
/// # Errors
///
/// A usage failure (exit 64) for a URL that is not an `http://` URL, before
/// anything is written.
pub fn of_command(command: &StateCommand) -> Result<Option<ConfirmArgs>, Failure> {
    let write = match command {
        StateCommand::Set { write, .. }
        | StateCommand::Clear { write, .. }
        | StateCommand::Drain { write, .. }
        | StateCommand::Undrain { write, .. } => write,
        StateCommand::Canary { action } => match action {
            CanaryAction::Disable { write, .. } | CanaryAction::Enable { write, .. } => write,
        },
        StateCommand::Get { .. }
        | StateCommand::List
        | StateCommand::Explain { .. }
        | StateCommand::Status(_) => return Ok(None),
    };
    match write.confirm.confirm_prometheus.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(url) => {
            check_url(url).map_err(|e| {
                Failure::usage(format!("--confirm-prometheus: {e}; nothing written"))
            })?;
            Ok(Some(write.confirm.clone()))
        }
    }
}

/// Checks that `url` is a Prometheus base URL this client can ask: plain
/// `http://` (the build has no TLS backend, as for Consul).
fn check_url(url: &str) -> Result<(), String> {
    let hint = "give Prometheus's base URL, e.g. http://prometheus:9090";
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL ({e}); {hint}"))?;
    if parsed.scheme() != "http" || parsed.host_str().is_none() {
        return Err(format!("{url:?} is not an http:// URL; {hint}"));
    }
    Ok(())
}

fn not_confirmed(kind: &'static str, message: String) -> Failure {
    Failure::new(exit::NOT_CONFIRMED, kind, message)
}

/// One agent as Prometheus sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    /// The target's `instance` label.
    pub instance: String,
    /// Its `fqdn` label, when the scrape config sets one.
    pub fqdn: Option<String>,
    /// `up` is 1: the last scrape worked.
    pub up: bool,
    /// Last scraped `gitlab_haproxy_agent_consul_index`.
    pub consul_index: Option<u64>,
    /// Last scraped `gitlab_haproxy_agent_answered_index`.
    pub answered_index: Option<u64>,
    /// Seconds since the agent's last Consul sync, by Prometheus's clock.
    pub last_sync_age: Option<f64>,
    /// Last scraped `gitlab_haproxy_agent_rows_seen`.
    pub rows_seen: Option<u64>,
    /// Last scraped `gitlab_haproxy_agent_rows_answered`, by `state`.
    pub rows_answered: BTreeMap<String, u64>,
}

impl AgentView {
    /// The instance, with the FQDN when known.
    pub fn name(&self) -> String {
        match &self.fqdn {
            Some(f) if *f != self.instance => format!("{} ({f})", self.instance),
            _ => self.instance.clone(),
        }
    }

    /// Why this agent does not confirm index `index`, if it does not.
    pub fn lag(&self, index: u64) -> Option<Lag> {
        if !self.up {
            return Some(Lag::Down);
        }
        let Some(consul_index) = self.consul_index else {
            return Some(Lag::NoMetrics);
        };
        if consul_index < index {
            return Some(Lag::Behind);
        }
        if self.rows_seen.unwrap_or(0) == 0 {
            return Some(Lag::NotAsked);
        }
        if self.answered_index.unwrap_or(0) < index {
            return Some(Lag::AnsweredBehind);
        }
        None
    }

    fn rows(&self, state: &str) -> u64 {
        self.rows_answered.get(state).copied().unwrap_or(0)
    }
}

/// Why an agent lags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lag {
    /// Its target is down: the last scrape failed.
    Down,
    /// Scraped, but without the agent's metrics.
    NoMetrics,
    /// Its snapshot is older than the write.
    Behind,
    /// HAProxy asked it nothing in the last 60 s.
    NotAsked,
    /// Some row was last answered from an older snapshot.
    AnsweredBehind,
}

impl Lag {
    /// The stable name for `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lag::Down => "target_down",
            Lag::NoMetrics => "no_metrics",
            Lag::Behind => "behind",
            Lag::NotAsked => "not_asked",
            Lag::AnsweredBehind => "answered_behind",
        }
    }
}

/// Every agent target matched by the selector.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fleet {
    /// Sorted by instance.
    pub agents: Vec<AgentView>,
}

/// How the fleet stands against one index.
#[derive(Debug)]
pub struct Verdict<'a> {
    /// The index every agent must have reached.
    pub index: u64,
    /// The answer the write should produce (`drain`, `ready`, ...); `None`
    /// for `state status`, which wrote nothing.
    pub state: Option<&'static str>,
    /// Agents at or past it.
    pub confirmed: Vec<&'a AgentView>,
    /// Agents that lag, with why.
    pub lagging: Vec<(&'a AgentView, Lag)>,
    /// Rows the confirmed agents last answered `state` (0 without one).
    pub rows: u64,
}

impl Verdict<'_> {
    /// True when there is at least one agent and none lags.
    pub fn all_confirmed(&self) -> bool {
        !self.confirmed.is_empty() && self.lagging.is_empty()
    }
}

impl Fleet {
    /// Builds the fleet from the answers to the queries of [`queries`], in
    /// that order: the targets are those of `up`; the others add values.
    ///
    /// # Errors
    ///
    /// A text naming the query whose answer is not a Prometheus vector.
    pub fn from_answers(answers: &[Value]) -> Result<Fleet, String> {
        let [up, consul_index, answered_index, sync_age, rows_seen, rows_answered] = answers else {
            return Err(format!("{} answers, not 6", answers.len()));
        };
        let mut agents: BTreeMap<(String, String), AgentView> = BTreeMap::new();
        for Sample { labels, value } in samples(up, "up")? {
            let Some(instance) = labels.get("instance") else {
                continue;
            };
            agents.insert(
                target_key(&labels),
                AgentView {
                    instance: instance.clone(),
                    fqdn: labels.get("fqdn").cloned(),
                    up: value == 1.0,
                    consul_index: None,
                    answered_index: None,
                    last_sync_age: None,
                    rows_seen: None,
                    rows_answered: BTreeMap::new(),
                },
            );
        }
        fill(&mut agents, consul_index, "consul_index", |a, _, v| {
            a.consul_index = Some(as_index(v))
        })?;
        fill(&mut agents, answered_index, "answered_index", |a, _, v| {
            a.answered_index = Some(as_index(v))
        })?;
        fill(&mut agents, sync_age, "last_sync_age", |a, _, v| {
            a.last_sync_age = Some(v.max(0.0))
        })?;
        fill(&mut agents, rows_seen, "rows_seen", |a, _, v| {
            a.rows_seen = Some(as_index(v))
        })?;
        fill(
            &mut agents,
            rows_answered,
            "rows_answered",
            |a, labels, v| {
                if let Some(state) = labels.get("state") {
                    a.rows_answered.insert(state.clone(), as_index(v));
                }
            },
        )?;
        Ok(Fleet {
            agents: agents.into_values().collect(),
        })
    }

    /// How the fleet stands against `index`, counting rows answered `state`.
    pub fn verdict(&self, index: u64, state: Option<AnswerKind>) -> Verdict<'_> {
        let state = state.map(AnswerKind::as_str);
        let mut confirmed = Vec::new();
        let mut lagging = Vec::new();
        for agent in &self.agents {
            match agent.lag(index) {
                None => confirmed.push(agent),
                Some(lag) => lagging.push((agent, lag)),
            }
        }
        let rows = state.map_or(0, |s| confirmed.iter().map(|a| a.rows(s)).sum());
        Verdict {
            index,
            state,
            confirmed,
            lagging,
            rows,
        }
    }
}

/// The PromQL queries the fleet is built from, for agents matched by
/// `selector` (label matchers without braces).
pub fn queries(selector: &str) -> [String; 6] {
    let last = |metric: &str| format!("last_over_time({metric}{{{selector}}}[{LOOKBACK}])");
    [
        format!("up{{{selector}}}"),
        last("gitlab_haproxy_agent_consul_index"),
        last("gitlab_haproxy_agent_answered_index"),
        format!(
            "time() - {}",
            last("gitlab_haproxy_agent_last_sync_timestamp_seconds")
        ),
        last("gitlab_haproxy_agent_rows_seen"),
        last("gitlab_haproxy_agent_rows_answered"),
    ]
}

/// Adds the values of one answer to the agents they belong to (samples of
/// targets not in `up` are ignored).
fn fill(
    agents: &mut BTreeMap<(String, String), AgentView>,
    answer: &Value,
    what: &str,
    mut set: impl FnMut(&mut AgentView, &Labels, f64),
) -> Result<(), String> {
    for sample in samples(answer, what)? {
        if let Some(agent) = agents.get_mut(&target_key(&sample.labels)) {
            set(agent, &sample.labels, sample.value);
        }
    }
    Ok(())
}

/// A series' labels.
type Labels = BTreeMap<String, String>;

/// One sample of an instant vector.
struct Sample {
    labels: Labels,
    value: f64,
}

fn target_key(labels: &Labels) -> (String, String) {
    (
        labels.get("job").cloned().unwrap_or_default(),
        labels.get("instance").cloned().unwrap_or_default(),
    )
}

fn as_index(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v as u64
    } else {
        0
    }
}

/// The samples of one instant-vector answer
/// (`{"status":"success","data":{"resultType":"vector","result":[...]}}`,
/// Prometheus HTTP API): labels and value.
fn samples(answer: &Value, what: &str) -> Result<Vec<Sample>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "query for {what} failed: {} {}",
            answer["errorType"].as_str().unwrap_or("error"),
            answer["error"].as_str().unwrap_or("(no message)")
        ));
    }
    let data = &answer["data"];
    if data["resultType"] != "vector" {
        return Err(format!("query for {what}: not an instant vector"));
    }
    let Some(result) = data["result"].as_array() else {
        return Err(format!("query for {what}: no result array"));
    };
    let mut out = Vec::with_capacity(result.len());
    for sample in result {
        let labels: Labels = sample["metric"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let value = sample["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("query for {what}: a sample without a numeric value"))?;
        out.push(Sample { labels, value });
    }
    Ok(out)
}

/// Asks Prometheus at `base` (its URL, e.g. `http://prometheus:9090`) for
/// every agent matched by `selector`.
///
/// # Errors
///
/// A text saying why: Prometheus unreachable, an error status (a bad
/// selector is a 400 `bad_data`), or an answer that is not the HTTP API's.
pub async fn fetch_fleet(
    http: &reqwest::Client,
    base: &str,
    selector: &str,
) -> Result<Fleet, FetchError> {
    let endpoint = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let mut answers = Vec::with_capacity(6);
    for query in queries(selector) {
        let mut url = reqwest::Url::parse(&endpoint).map_err(|e| FetchError {
            message: format!("bad Prometheus URL {base:?}: {e}"),
            lasting: true,
        })?;
        url.query_pairs_mut().append_pair("query", &query);
        let passing = |message: String| FetchError {
            message,
            lasting: false,
        };
        let response = http
            .get(url)
            .timeout(QUERY_TIMEOUT)
            .send()
            .await
            .map_err(|e| {
                passing(format!(
                    "Prometheus at {base} did not answer: {}",
                    error_chain(&e)
                ))
            })?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| passing(format!("Prometheus at {base}: {}", error_chain(&e))))?;
        // The HTTP API answers 400 (bad_data) to a query it cannot parse
        // and 404 to a path that is not the API: asking again cannot help.
        let lasting = status.is_client_error();
        let value: Value = serde_json::from_slice(&body).map_err(|_| FetchError {
            message: format!(
                "Prometheus at {base} answered {status} without the HTTP API's JSON (is the \
                 URL Prometheus's base?)"
            ),
            lasting,
        })?;
        if value["status"] != "success" {
            return Err(FetchError {
                message: format!(
                    "Prometheus at {base} refused {query:?}: {} {}",
                    value["errorType"].as_str().unwrap_or("error"),
                    value["error"].as_str().unwrap_or("(no message)")
                ),
                lasting,
            });
        }
        answers.push(value);
    }
    Fleet::from_answers(&answers).map_err(|e| FetchError {
        message: format!("Prometheus at {base}: {e}"),
        lasting: false,
    })
}

/// Why Prometheus could not be asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    /// What happened, for people.
    pub message: String,
    /// Asking again cannot help (a selector Prometheus refuses, a URL that
    /// is not the HTTP API's); otherwise it may (unreachable, 5xx).
    pub lasting: bool,
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .user_agent(concat!("gitlab-haproxy-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
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
        None => Ok(client.list_prefix(prefix, 0, Duration::ZERO).await?.index),
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
    pub async fn confirm(
        &self,
        action: &str,
        index: u64,
        state: AnswerKind,
        cancel: &CancellationToken,
    ) -> Result<(), Unconfirmed> {
        let Some(base) = &self.confirm_prometheus else {
            return Ok(());
        };
        let failed = |kind, message| Unconfirmed::Failed(not_confirmed(kind, message));
        let http = http_client().map_err(|e| failed("prometheus_unavailable", e))?;
        let started = tokio::time::Instant::now();
        let deadline = started + self.confirm_timeout;
        err_line(&waiting_text(action, index, base, self.confirm_timeout));
        loop {
            let last = tokio::select! {
                f = fetch_fleet(&http, base, &self.confirm_selector) => f,
                _ = cancel.cancelled() => return Err(Unconfirmed::Interrupted),
            };
            let waited = started.elapsed();
            match &last {
                Ok(fleet) => {
                    let verdict = fleet.verdict(index, Some(state));
                    if verdict.all_confirmed() {
                        err_line(&confirmed_text(action, &verdict, waited));
                        return Ok(());
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

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn waiting_text(action: &str, index: u64, base: &str, timeout: Duration) -> String {
    format!(
        "{action}: confirming with Prometheus at {base} that every agent answers from index \
         >= {index} (up to {})",
        humantime::format_duration(timeout)
    )
}

/// The headline of every outcome: `N/M agents at index >= I, R rows
/// answered S` (without the rows when there is no state to count).
pub fn headline(verdict: &Verdict<'_>) -> String {
    let mut text = format!(
        "{}/{} agents at index >= {}",
        verdict.confirmed.len(),
        verdict.confirmed.len() + verdict.lagging.len(),
        verdict.index,
    );
    if let Some(state) = verdict.state {
        text.push_str(&format!(
            ", {} answered {state}",
            plural(verdict.rows as usize, "row", "rows")
        ));
    }
    text
}

fn confirmed_text(action: &str, verdict: &Verdict<'_>, waited: Duration) -> String {
    format!(
        "{action}: confirmed: {} (after {:.1}s)",
        headline(verdict),
        waited.as_secs_f64()
    )
}

/// One lagging agent: `instance (why; index X, answered from Y, last sync
/// Zs ago)`.
fn lagging_agent(agent: &AgentView, lag: Lag, index: u64) -> String {
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
fn behind_text(verdict: &Verdict<'_>) -> String {
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
pub fn lagging_text(verdict: &Verdict<'_>, waited: Duration) -> String {
    format!(
        "not confirmed after {:.0}s: {}; {}. The write is in Consul, but those load \
         balancers may still answer the old state. Follow them with `state status \
         --prometheus URL`; once they are fixed (runbook: Agent down, Consul sync stale, \
         HAProxy not asking), re-run the same command to go on (it is idempotent)",
        waited.as_secs_f64(),
        headline(verdict),
        behind_text(verdict),
    )
}

fn no_agents_text(base: &str, selector: &str, waited: Duration) -> String {
    format!(
        "not confirmed after {:.0}s: Prometheus at {base} has no target matching \
         {{{selector}}}; nothing tells whether the fleet applied the write (set \
         --confirm-selector to the agents' scrape job)",
        waited.as_secs_f64()
    )
}

fn unavailable_text(index: u64, error: &str, waited: Duration) -> String {
    format!(
        "not confirmed after {:.0}s: {error}; the write (index {index}) is in Consul, but \
         whether every agent applied it is unknown",
        waited.as_secs_f64()
    )
}

/// The failure of `state status` when agents lag, naming them.
fn status_lagging_text(verdict: &Verdict<'_>) -> String {
    format!("{}; {}", headline(verdict), behind_text(verdict))
}

/// The fleet view for `state status` against Consul's index `index`, as
/// text.
pub fn status_text(fleet: &Fleet, index: u64) -> String {
    let verdict = fleet.verdict(index, None);
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
                a.lag(index).map_or("ok", Lag::as_str).to_string(),
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
    text.push_str(&format!(
        "{}/{} agents at index >= {index} (the prefix's X-Consul-Index now); rows answered: {}.\n",
        verdict.confirmed.len(),
        fleet.agents.len(),
        if answered.is_empty() {
            "none".to_string()
        } else {
            answered.join(", ")
        }
    ));
    text
}

/// The fleet view for `state status --json`.
pub fn status_json(fleet: &Fleet, index: u64) -> Value {
    let verdict = fleet.verdict(index, None);
    json!({
        "ok": verdict.all_confirmed(),
        "consul_index": index,
        "agents_total": fleet.agents.len(),
        "agents_at_index": verdict.confirmed.len(),
        "agents": fleet.agents.iter().map(|a| json!({
            "instance": a.instance,
            "fqdn": a.fqdn,
            "up": a.up,
            "consul_index": a.consul_index,
            "answered_index": a.answered_index,
            "last_sync_age_seconds": a.last_sync_age,
            "rows_seen": a.rows_seen,
            "rows_answered": a.rows_answered,
            "lag": a.lag(index).map(Lag::as_str),
        })).collect::<Vec<_>>(),
    })
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
    pub(super) async fn confirm_written(
        &self,
        action: &str,
        change: Change,
        keys: &[String],
        indexes: &HashMap<String, u64>,
        cancel: &CancellationToken,
    ) -> Result<(), Unconfirmed> {
        let written = match change {
            Change::Set(_) => keys.iter().filter_map(|k| indexes.get(k)).max().copied(),
            Change::Clear => None,
        };
        let step = format!("{action}: {}", change.describe());
        self.confirm_step(&step, written, change_answer(change), cancel)
            .await
    }

    /// After `set` or `clear` of `key` (`full`: with the prefix): confirms
    /// it at the key's ModifyIndex read back (a removal has none: the
    /// prefix's index). `None` when confirmed or not asked for.
    pub(super) async fn confirm_one(
        &self,
        key: &str,
        full: &str,
        change: Change,
    ) -> Option<Failure> {
        let known = match change {
            Change::Set(_) => self.client.get_key(full).await.ok().flatten(),
            Change::Clear => None,
        };
        let step = format!("{key}: {}", change.describe());
        // No signal handler is installed for one write: SIGINT ends the
        // process as usual, and this token never fires.
        let never = CancellationToken::new();
        let confirmed = self
            .confirm_step(
                &step,
                known.map(|p| p.modify_index),
                change_answer(change),
                &never,
            )
            .await;
        match confirmed {
            Ok(()) => None,
            Err(Unconfirmed::Failed(f)) => Some(f),
            Err(Unconfirmed::Interrupted) => Some(Failure::new(
                exit::SIGINT,
                "interrupted",
                format!("{key} written; interrupted while confirming"),
            )),
        }
    }

    /// After a write step: confirms it (when `--confirm-prometheus` is
    /// given) at `known`, the ModifyIndex the write returned, or else at
    /// the prefix's index read now (see [`index_after`]). `state` is the
    /// answer the write should produce.
    async fn confirm_step(
        &self,
        action: &str,
        known: Option<u64>,
        state: AnswerKind,
        cancel: &CancellationToken,
    ) -> Result<(), Unconfirmed> {
        let Some(confirm) = &self.confirm else {
            return Ok(());
        };
        let index = index_after(&self.client, &self.prefix, known)
            .await
            .map_err(|e| Unconfirmed::Failed(e.into()))?;
        confirm.confirm(action, index, state, cancel).await
    }

    /// `state status`: reads the prefix's index from Consul and shows every
    /// agent against it; exit 68 (`not_confirmed`) when one lags.
    pub(super) async fn status(&self, args: &StatusArgs) -> Result<(), Failure> {
        check_url(args.prometheus.trim())
            .map_err(|e| Failure::usage(format!("--prometheus: {e}")))?;
        let index = index_after(&self.client, &self.prefix, None).await?;
        let unavailable = |e| not_confirmed("prometheus_unavailable", e);
        let http = http_client().map_err(unavailable)?;
        let fleet = fetch_fleet(&http, &args.prometheus, &args.selector)
            .await
            .map_err(|e| unavailable(e.message))?;
        let verdict = fleet.verdict(index, None);
        if self.json {
            out_line(
                &serde_json::to_string_pretty(&status_json(&fleet, index)).unwrap_or_default(),
            );
        } else if fleet.agents.is_empty() {
            out_line(&format!(
                "Prometheus at {} has no target matching {{{}}}.",
                args.prometheus, args.selector
            ));
        } else {
            out_line(status_text(&fleet, index).trim_end());
        }
        if verdict.all_confirmed() {
            return Ok(());
        }
        let mut failure = not_confirmed(
            "not_confirmed",
            if fleet.agents.is_empty() {
                format!(
                    "no agent: Prometheus at {} has no target matching {{{}}}",
                    args.prometheus, args.selector
                )
            } else {
                status_lagging_text(&verdict)
            },
        );
        failure.reported = self.json;
        Err(failure)
    }
}

/// A line on stdout, ignoring write errors (the terminal may be gone).
fn out_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// A line on stderr, ignoring write errors.
fn err_line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A canned series: metric name (empty: none), labels, value.
    type Series<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

    fn vector(samples: &[Series<'_>]) -> Value {
        let result: Vec<Value> = samples
            .iter()
            .map(|(name, labels, value)| {
                let mut metric = serde_json::Map::new();
                if !name.is_empty() {
                    metric.insert("__name__".into(), json!(name));
                }
                for (k, v) in *labels {
                    metric.insert((*k).into(), json!(v));
                }
                json!({"metric": metric, "value": [1_700_000_000.5, value]})
            })
            .collect();
        json!({"status": "success", "data": {"resultType": "vector", "result": result}})
    }

    const JOB: (&str, &str) = ("job", "gitlab-haproxy-agent");

    /// Three agents: lb-01 caught up, lb-02 down since before the write,
    /// lb-03 synced but with one row last answered from an older snapshot.
    fn answers() -> Vec<Value> {
        let a = [JOB, ("instance", "10.0.0.1:9101"), ("fqdn", "lb-01")];
        let b = [JOB, ("instance", "10.0.0.2:9101"), ("fqdn", "lb-02")];
        let c = [JOB, ("instance", "10.0.0.3:9101"), ("fqdn", "lb-03")];
        let with = |l: &[(&'static str, &'static str)], s: &'static str| {
            let mut v = l.to_vec();
            v.push(("state", s));
            v
        };
        let (ad, bd, cd, cr) = (
            with(&a, "drain"),
            with(&b, "drain"),
            with(&c, "drain"),
            with(&c, "ready"),
        );
        vec![
            vector(&[("up", &a, "1"), ("up", &b, "0"), ("up", &c, "1")]),
            vector(&[("", &a, "120"), ("", &b, "90"), ("", &c, "120")]),
            vector(&[("", &a, "120"), ("", &b, "90"), ("", &c, "100")]),
            vector(&[("", &a, "1.2"), ("", &b, "75"), ("", &c, "0.4")]),
            vector(&[("", &a, "2"), ("", &b, "2"), ("", &c, "2")]),
            vector(&[
                ("", &ad, "2"),
                ("", &bd, "0"),
                ("", &cd, "1"),
                ("", &cr, "1"),
            ]),
        ]
    }

    #[test]
    fn builds_the_fleet_from_the_query_answers() {
        let fleet = Fleet::from_answers(&answers()).unwrap();
        assert_eq!(fleet.agents.len(), 3);
        let b = &fleet.agents[1];
        assert_eq!(b.name(), "10.0.0.2:9101 (lb-02)");
        assert!(!b.up);
        assert_eq!(b.consul_index, Some(90));
        assert_eq!(b.last_sync_age, Some(75.0));
        assert_eq!(fleet.agents[2].rows_answered["ready"], 1);
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
            status_lagging_text(&fleet.verdict(120, None)),
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
    fn an_agent_without_rows_or_metrics_lags() {
        let a = [JOB, ("instance", "10.0.0.1:9101")];
        let b = [JOB, ("instance", "10.0.0.2:9101")];
        let answers = vec![
            vector(&[("up", &a, "1"), ("up", &b, "1")]),
            vector(&[("", &a, "50")]),
            vector(&[("", &a, "0")]),
            vector(&[("", &a, "1")]),
            vector(&[("", &a, "0")]),
            vector(&[]),
        ];
        let fleet = Fleet::from_answers(&answers).unwrap();
        let verdict = fleet.verdict(50, Some(AnswerKind::Maint));
        let lags: Vec<Lag> = verdict.lagging.iter().map(|(_, l)| *l).collect();
        assert_eq!(lags, [Lag::NotAsked, Lag::NoMetrics]);
    }

    #[test]
    fn no_target_is_never_confirmed() {
        let empty = vector(&[]);
        let fleet = Fleet::from_answers(&vec![empty; 6]).unwrap();
        assert!(!fleet.verdict(1, None).all_confirmed());
    }

    #[test]
    fn refuses_answers_that_are_not_vectors() {
        let mut answers = answers();
        answers[2] = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        let e = Fleet::from_answers(&answers).unwrap_err();
        assert_eq!(e, "query for answered_index failed: bad_data parse error");
        answers[2] = json!({"status": "success", "data": {"resultType": "matrix", "result": []}});
        assert!(Fleet::from_answers(&answers).is_err());
    }

    #[test]
    fn only_plain_http_urls_are_taken() {
        assert!(check_url("http://127.0.0.1:9090").is_ok());
        assert!(check_url("http://prometheus.gprd:9090/prometheus/").is_ok());
        // `prometheus:9090` parses as scheme `prometheus`.
        assert!(check_url("prometheus:9090").is_err());
        assert!(check_url("https://prometheus:9090").is_err());
        assert!(check_url("http//prometheus").is_err());
    }

    #[test]
    fn queries_select_the_targets() {
        let q = queries(r#"job="gitlab-haproxy-agent",environment="gprd""#);
        assert_eq!(q[0], r#"up{job="gitlab-haproxy-agent",environment="gprd"}"#);
        assert_eq!(
            q[3],
            r#"time() - last_over_time(gitlab_haproxy_agent_last_sync_timestamp_seconds{job="gitlab-haproxy-agent",environment="gprd"}[1h])"#
        );
    }

    #[test]
    fn status_shows_every_agent_and_the_totals() {
        let fleet = Fleet::from_answers(&answers()).unwrap();
        let text = status_text(&fleet, 120);
        assert!(text.starts_with("INSTANCE "), "{text}");
        assert!(text.contains("target_down"), "{text}");
        assert!(text.contains("answered_behind"), "{text}");
        assert!(
            text.ends_with(
                "1/3 agents at index >= 120 (the prefix's X-Consul-Index now); rows answered: 3 drain, 1 ready.\n"
            ),
            "{text}"
        );
        let v = status_json(&fleet, 120);
        assert_eq!(v["ok"], false);
        assert_eq!(v["agents"][1]["lag"], "target_down");
    }
}
