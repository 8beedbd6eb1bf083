//! The fleet as the Prometheus that scrapes every agent sees it: one
//! [`AgentView`] per scrape target, built from six instant queries on the
//! agent's own metrics (`gitlab_haproxy_agent_consul_index`,
//! `gitlab_haproxy_agent_answered_index`,
//! `gitlab_haproxy_agent_last_sync_timestamp_seconds`,
//! `gitlab_haproxy_agent_rows_seen`, `gitlab_haproxy_agent_rows_answered`)
//! and `up`, and how it stands against one index ([`Verdict`]). The
//! queries go through the Prometheus HTTP API client `prometheus-http-query`
//! ([`instant_query`]). [`groups`] adds what the agents
//! say of the groups their servers name, [`held`] the keys they hold. The
//! writer ([`crate::writer::confirm`]) waits on this view; it depends on the
//! model and the core only, as [`crate::consul`] does for Consul.

pub mod groups;
pub mod held;
pub mod idle;
pub mod status;
pub mod text;

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_http_query::error::PrometheusErrorType;
use prometheus_http_query::response::Data;

use crate::model::value::AnswerKind;

/// Longest one Prometheus query may take: 5 s.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// How far back an agent's last scraped values are looked up, so that an
/// agent whose target is down is still shown with its last index and last
/// sync: 1 hour.
pub(crate) const LOOKBACK: &str = "1h";

/// Checks that `url` is a Prometheus base URL this client can ask: plain
/// `http://` (the build has no TLS backend, as for Consul).
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let hint = "give Prometheus's base URL, e.g. http://prometheus:9090";
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL ({e}); {hint}"))?;
    if parsed.scheme() != "http" || parsed.host_str().is_none() {
        return Err(format!("{url:?} is not an http:// URL; {hint}"));
    }
    Ok(())
}

/// One agent as Prometheus sees it (its JSON in `state status --json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
    #[serde(rename = "last_sync_age_seconds")]
    pub last_sync_age: Option<f64>,
    /// Last scraped `gitlab_haproxy_agent_rows_seen`.
    pub rows_seen: Option<u64>,
    /// Last scraped `gitlab_haproxy_agent_rows_answered`, by `state`.
    pub rows_answered: BTreeMap<String, u64>,
    /// What `state status` also asks ([`health_queries`]); empty in a
    /// confirmation.
    #[serde(flatten)]
    pub health: Health,
}

/// What `state status` asks of each agent besides its index: whether it
/// answers every server as Consul says, and follows the store the writer
/// writes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Health {
    /// Last scraped `gitlab_haproxy_agent_out_rows_not_asked`: rows it
    /// answered drain or maint that HAProxy stopped asking about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_rows_not_asked: Option<u64>,
    /// Last scraped `gitlab_haproxy_agent_held_keys`, every cause: keys it
    /// answers with another state than Consul's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_keys: Option<u64>,
    /// Of those, keys held since Consul's data went backwards
    /// (`cause="rolled_back"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_keys: Option<u64>,
    /// Last scraped `gitlab_haproxy_agent_store_id_present`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_id_present: Option<bool>,
    /// Last scraped `gitlab_haproxy_agent_synced`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synced: Option<bool>,
    /// The store is known to have had an id (see
    /// [`Fleet::expect_store_id`]): an agent synced without one followed
    /// an emptied or rebuilt store.
    #[serde(skip)]
    pub store_id_expected: bool,
}

/// Why `state status` finds an agent not ok although it may be at the
/// index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// Rows it answered drain or maint that HAProxy no longer asks about:
    /// those servers are likely back in traffic on that load balancer.
    RowsNotAsked(u64),
    /// Keys it answers with another state than Consul's (an invalid value,
    /// a rollback, a key hidden from its token).
    HeldKeys(u64),
    /// Synced with a store that has no `~store-id` while the store is
    /// known to have had one: an emptied or rebuilt store it followed
    /// (what was lost is not held).
    NoStoreId,
}

impl Trouble {
    /// The stable name for `--json` and the STATUS column.
    pub fn as_str(self) -> &'static str {
        match self {
            Trouble::RowsNotAsked(_) => "rows_not_asked",
            Trouble::HeldKeys(_) => "held_keys",
            Trouble::NoStoreId => "no_store_id",
        }
    }

    /// What it means, for people.
    pub fn text(self) -> String {
        match self {
            Trouble::RowsNotAsked(n) => format!(
                "{n} row{} answered drain or maint that HAProxy no longer asks about (those \
                 servers are likely in traffic again; runbook: Drain not applied)",
                if n == 1 { "" } else { "s" }
            ),
            Trouble::HeldKeys(n) => format!(
                "{n} key{} held, answered with another state than Consul's (see held keys \
                 below; runbook: State rolled back, Invalid values, Keys hidden)",
                if n == 1 { "" } else { "s" }
            ),
            Trouble::NoStoreId => "synced with a store that has no ~store-id, though Consul \
                 or other agents show the store had one: it followed an emptied or rebuilt \
                 store, and drains and maint the store lost are not held there (runbook: State \
                 rolled back)"
                .to_string(),
        }
    }
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

    /// What `state status` finds wrong with this agent besides a lag
    /// (nothing unless [`Fleet::add_health`] filled [`AgentView::health`]).
    pub fn troubles(&self) -> Vec<Trouble> {
        let h = &self.health;
        let mut out = Vec::new();
        if let Some(n) = h.out_rows_not_asked.filter(|n| *n > 0) {
            out.push(Trouble::RowsNotAsked(n));
        }
        if let Some(n) = h.held_keys.filter(|n| *n > 0) {
            out.push(Trouble::HeldKeys(n));
        }
        if h.store_id_expected && h.synced == Some(true) && h.store_id_present == Some(false) {
            out.push(Trouble::NoStoreId);
        }
        out
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
    /// Rows the confirmed agents last answered `state` (every row they are
    /// asked about: the fleet's, not a selection's); for a group write, the
    /// rows naming the group that its key decides and that answer
    /// `state`. `None` without a state, and for a write of row keys, whose
    /// rows the agents do not count apart.
    pub rows: Option<u64>,
    /// For a group write: the servers the key decides, and those another
    /// key decides (see [`groups`]).
    pub group: Option<GroupVerdict>,
    /// Agents confirmed by their index alone (names): HAProxy asks them
    /// about no row the write decides (a node with nothing enrolled), so
    /// no answer can show it; see [`groups::by_index_alone`].
    pub by_index_only: Vec<String>,
}

/// How the rows naming a written group key stand, over the confirmed
/// agents. Its JSON (in a confirmation): `{key, servers_naming,
/// servers_answering, servers_overridden, servers_overridden_in_service,
/// overridden: [{agent, row, decided_by, answer, rows}]}`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GroupVerdict {
    /// The group key written.
    pub key: String,
    /// Rows whose agent-send line names the key.
    #[serde(rename = "servers_naming")]
    pub naming: u64,
    /// Of those, rows the key decides that answer the written state.
    #[serde(rename = "servers_answering")]
    pub answering: u64,
    /// Rows the key decides that still answer something else (held, or
    /// not yet answered since the write).
    #[serde(skip)]
    pub other_answer: u64,
    /// Rows naming the key that another key decides.
    #[serde(rename = "servers_overridden")]
    pub overridden_rows: u64,
    /// Of those, rows the other key keeps in service (not drain or maint),
    /// counting rows past the agents' cap of named ones as in service.
    #[serde(rename = "servers_overridden_in_service")]
    pub overridden_in_service: u64,
    /// Which: (agent, row, deciding key, its answer, rows), as far as the
    /// agents export them.
    #[serde(serialize_with = "overridden_json")]
    pub overridden: Vec<(String, String, String, String, u64)>,
    /// Overridden rows make the write fail: it takes servers out (drain,
    /// maint) and `--accept-overridden` was not given.
    #[serde(skip)]
    pub overridden_block: bool,
}

/// [`GroupVerdict::overridden`] as `[{row, decided_by, answer, agents,
/// rows}]`: one entry per server, with the load balancers that keep it
/// ([`groups::overridden_servers`]).
fn overridden_json<S: serde::Serializer>(
    rows: &[(String, String, String, String, u64)],
    s: S,
) -> Result<S::Ok, S::Error> {
    let g = GroupVerdict {
        overridden: rows.to_vec(),
        ..GroupVerdict::default()
    };
    s.collect_seq(
        groups::overridden_servers(&g)
            .into_iter()
            .map(|(row, by, answer, agents, n)| {
                serde_json::json!({"row": row, "decided_by": by, "answer": answer, "agents": agents,
                "rows": n})
            }),
    )
}

impl GroupVerdict {
    /// Every row the key decides answers the written state, and no row is
    /// kept from it by another key (unless accepted).
    pub fn holds(&self) -> bool {
        self.other_answer == 0 && !(self.overridden_block && self.overridden_in_service > 0)
    }
}

impl Verdict<'_> {
    /// True when there is at least one agent, none lags, and for a group
    /// write every row the key decides answers the written state and none
    /// naming it is kept by another key (unless accepted).
    pub fn all_confirmed(&self) -> bool {
        !self.confirmed.is_empty()
            && self.lagging.is_empty()
            && self.group.as_ref().is_none_or(GroupVerdict::holds)
    }
}

impl Fleet {
    /// Builds the fleet from the answers to the queries of [`queries`], in
    /// that order: the targets are those of `up`; the others add values.
    ///
    /// # Errors
    ///
    /// A text naming the query whose answer is not a Prometheus vector.
    pub fn from_answers(answers: &[Data]) -> Result<Fleet, String> {
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
                    health: Health::default(),
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

    /// Adds the answers to [`health_queries`], in that order, to the
    /// agents they belong to.
    ///
    /// # Errors
    ///
    /// As [`Fleet::from_answers`].
    pub fn add_health(&mut self, answers: &[Data]) -> Result<(), String> {
        let [not_asked, held, store_id, synced] = answers else {
            return Err(format!("{} answers, not 4", answers.len()));
        };
        for agent in self.agents.iter_mut() {
            agent.health.held_keys = None;
            agent.health.rolled_back_keys = None;
        }
        for sample in samples(held, "held_keys")? {
            let instance = sample.labels.get("instance");
            let rolled_back = sample.labels.get("cause").map(String::as_str) == Some("rolled_back");
            for agent in self.agents.iter_mut() {
                if Some(&agent.instance) == instance {
                    let h = &mut agent.health;
                    *h.held_keys.get_or_insert(0) += as_index(sample.value);
                    if rolled_back {
                        *h.rolled_back_keys.get_or_insert(0) += as_index(sample.value);
                    }
                }
            }
        }
        // The selector picks one job's targets: the instance tells them
        // apart.
        let mut add = |answer: &Data, what: &str, set: fn(&mut Health, f64)| {
            for sample in samples(answer, what)? {
                let instance = sample.labels.get("instance");
                for agent in self.agents.iter_mut() {
                    if Some(&agent.instance) == instance {
                        set(&mut agent.health, sample.value);
                    }
                }
            }
            Ok::<(), String>(())
        };
        add(not_asked, "out_rows_not_asked", |h, v| {
            h.out_rows_not_asked = Some(as_index(v))
        })?;
        add(store_id, "store_id_present", |h, v| {
            h.store_id_present = Some(v == 1.0)
        })?;
        add(synced, "synced", |h, v| h.synced = Some(v == 1.0))?;
        Ok(())
    }

    /// Whether an agent synced without a store id is in trouble: the store
    /// is known to have had an id when Consul shows one now
    /// (`consul_has_id`), or an agent still sees one or holds keys since a
    /// rollback. A store the writer never wrote has none anywhere, which
    /// is not such trouble (`GitLabHAProxyAgentNoStoreId` opens a ticket).
    pub fn expect_store_id(&mut self, consul_has_id: bool) {
        let expected = consul_has_id
            || self.agents.iter().any(|a| {
                a.health.store_id_present == Some(true) || a.health.rolled_back_keys > Some(0)
            });
        for agent in &mut self.agents {
            agent.health.store_id_expected = expected;
        }
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
        let rows = state.map(|s| confirmed.iter().map(|a| a.rows(s)).sum());
        Verdict {
            index,
            state,
            confirmed,
            lagging,
            rows,
            group: None,
            by_index_only: Vec::new(),
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

/// The PromQL queries of [`Fleet::add_health`], for agents matched by
/// `selector`: rows answered out that HAProxy no longer asks about, keys
/// held (every cause), whether the store has an id, whether synced.
pub fn health_queries(selector: &str) -> [String; 4] {
    let last = |metric: &str| format!("last_over_time({metric}{{{selector}}}[{LOOKBACK}])");
    [
        last("gitlab_haproxy_agent_out_rows_not_asked"),
        last("gitlab_haproxy_agent_held_keys"),
        last("gitlab_haproxy_agent_store_id_present"),
        last("gitlab_haproxy_agent_synced"),
    ]
}

/// Asks Prometheus at `base` for [`health_queries`] and adds them to
/// `fleet`.
///
/// # Errors
///
/// As [`fetch_fleet`].
pub async fn fetch_health(
    http: &reqwest::Client,
    base: &str,
    selector: &str,
    fleet: &mut Fleet,
) -> Result<(), FetchError> {
    let mut answers = Vec::with_capacity(4);
    for query in health_queries(selector) {
        answers.push(instant_query(http, base, &query).await?);
    }
    fleet.add_health(&answers).map_err(|e| FetchError {
        message: format!("Prometheus at {base}: {e}"),
        lasting: false,
    })
}

/// Adds the values of one answer to the agents they belong to (samples of
/// targets not in `up` are ignored).
fn fill(
    agents: &mut BTreeMap<(String, String), AgentView>,
    answer: &Data,
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
pub(crate) type Labels = BTreeMap<String, String>;

/// One sample of an instant vector.
pub(crate) struct Sample {
    /// Its labels.
    pub(crate) labels: Labels,
    /// Its value.
    pub(crate) value: f64,
}

fn target_key(labels: &Labels) -> (String, String) {
    (
        labels.get("job").cloned().unwrap_or_default(),
        labels.get("instance").cloned().unwrap_or_default(),
    )
}

pub(crate) fn as_index(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v as u64
    } else {
        0
    }
}

/// The samples of one instant-vector answer (`"resultType": "vector"`,
/// Prometheus HTTP API): labels and value.
///
/// # Errors
///
/// A text naming `what` when the answer is not an instant vector (a
/// matrix or a scalar).
pub(crate) fn samples(answer: &Data, what: &str) -> Result<Vec<Sample>, String> {
    let Data::Vector(result) = answer else {
        return Err(format!("query for {what}: not an instant vector"));
    };
    Ok(result
        .iter()
        .map(|v| Sample {
            labels: v
                .metric()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            value: v.sample().value(),
        })
        .collect())
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
    let mut answers = Vec::with_capacity(6);
    for query in queries(selector) {
        answers.push(instant_query(http, base, &query).await?);
    }
    Fleet::from_answers(&answers).map_err(|e| FetchError {
        message: format!("Prometheus at {base}: {e}"),
        lasting: false,
    })
}

/// One load balancer's current sessions on one server, from HAProxy's own
/// exporter (`haproxy_server_current_sessions{proxy,server}`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sessions {
    /// `<proxy>/<server>`: the backend and server.
    pub server: String,
    /// The exporter target's `instance` label (the load balancer); `None`
    /// for a server no load balancer reports.
    pub instance: Option<String>,
    /// Current sessions.
    pub sessions: u64,
    /// Why it counts as in session with no session counted
    /// ([`idle::NOT_REPORTED`], [`idle::RELOADED`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<&'static str>,
}

/// The PromQL query for the current sessions of the servers of `backends`
/// (series matched by `selector` too, label matchers without braces).
/// HAProxy allows only letters, digits and `-_.:` in a proxy name, and a
/// `.` matching more only widens the answer, which is filtered by name.
pub fn sessions_query(selector: &str, backends: &[&str]) -> String {
    let selector = selector.trim();
    let comma = if selector.is_empty() { "" } else { "," };
    let backends = backends.join("|");
    format!("haproxy_server_current_sessions{{{selector}{comma}proxy=~\"{backends}\"}}")
}

/// One instant query (`/api/v1/query`) to the HTTP API of the Prometheus
/// at `base`, through `prometheus-http-query` over `http`: its data, given
/// within [`QUERY_TIMEOUT`] (5 s).
///
/// # Errors
///
/// As [`fetch_fleet`]; which ones are lasting: [`fetch_error`].
pub(crate) async fn instant_query(
    http: &reqwest::Client,
    base: &str,
    query: &str,
) -> Result<Data, FetchError> {
    // The client joins `api/v1/query` to the base's path with a `/`.
    let client = prometheus_http_query::Client::from(http.clone(), base.trim_end_matches('/'))
        .map_err(|e| FetchError {
            message: format!("bad Prometheus URL {base:?}: {}", error_chain(&e)),
            lasting: true,
        })?;
    match tokio::time::timeout(QUERY_TIMEOUT, client.query(query).get()).await {
        Ok(Ok(answer)) => Ok(answer.into_inner().0),
        Ok(Err(e)) => Err(fetch_error(base, query, &e)),
        Err(_) => Err(FetchError {
            message: format!(
                "Prometheus at {base} did not answer: no answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ),
            lasting: false,
        }),
    }
}

/// What an error of the client means for `query` to Prometheus at `base`.
/// Lasting (asking again cannot help): the error types Prometheus gives a
/// query it cannot run as asked, `bad_data` (a selector it cannot parse,
/// HTTP 400), `execution` (422) and `not_found` (404), and an answer that
/// is not the HTTP API's JSON with a 4xx status (a URL that is not the
/// API's, a proxy refusing us). Passing: no answer, `timeout`,
/// `unavailable`, `internal`, `canceled`, a 5xx or a body that is not the
/// API's (prometheus/prometheus `web/api/v1/api.go`, `returnAPIError`).
fn fetch_error(base: &str, query: &str, e: &prometheus_http_query::Error) -> FetchError {
    use prometheus_http_query::Error;
    let not_api = |status: Option<reqwest::StatusCode>| FetchError {
        message: format!(
            "Prometheus at {base} answered {}without the HTTP API's JSON (is the URL \
             Prometheus's base?)",
            status.map(|s| format!("{s} ")).unwrap_or_default()
        ),
        lasting: status.is_some_and(|s| s.is_client_error()),
    };
    match e {
        Error::Prometheus(p) => FetchError {
            message: format!(
                "Prometheus at {base} refused {query:?}: {} {}",
                p.error_type(),
                p.message()
            ),
            lasting: matches!(
                p.error_type(),
                PrometheusErrorType::BadData
                    | PrometheusErrorType::Execution
                    | PrometheusErrorType::NotFound
            ),
        },
        // Not JSON: the client keeps the status when it was an error.
        Error::Client(c) => match c.inner() {
            None => not_api(None),
            Some(r) if r.is_status() || r.is_decode() => not_api(r.status()),
            Some(r) => FetchError {
                message: format!("Prometheus at {base} did not answer: {}", error_chain(r)),
                lasting: false,
            },
        },
        Error::ParseUrl(_) => FetchError {
            message: format!("bad Prometheus URL {base:?}: {}", error_chain(e)),
            lasting: true,
        },
        other => FetchError {
            message: format!("Prometheus at {base}: {}", error_chain(other)),
            lasting: false,
        },
    }
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

pub(crate) fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .user_agent(concat!("gitlab-haproxy-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

#[cfg(test)]
pub(crate) mod tests;
