//! `--until-idle`: whether any load balancer may still hold a session on
//! the drained servers, from HAProxy's own exporter
//! (`haproxy_server_current_sessions{proxy,server}`) as the Prometheus that
//! scrapes it saw it.
//!
//! A server counts as idle on a load balancer only from a sample scraped
//! after the wait began (the drain was confirmed then), so a sample from
//! before the drain (a 60 s scrape interval) is never trusted. Every load
//! balancer that reported the server in the last hour must report it again
//! (one whose exporter is not scraped any more counts as in session). A
//! load balancer whose HAProxy started after the drain was written
//! (`haproxy_process_start_time_seconds`) reloaded: its old worker keeps
//! the sessions it had, which the new worker's exporter does not count, so
//! it counts as in session until the longest wait, unless its agent
//! reports, from a scrape after that start, no old worker left.
//!
//! Old workers from a reload made before the drain are not in the exporter
//! either: the agent on the node counts them
//! (`gitlab_haproxy_agent_haproxy_old_workers`, see
//! [`crate::agent::old_workers`]), and a load balancer whose agent reports
//! one or more, or reported a count in the last hour and none since the
//! wait began, is not idle. An agent and an exporter are on the same load
//! balancer when their `instance` labels name the same host (the address
//! without its port).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prometheus_http_query::response::Data;

use super::{as_index, instant_query, samples, sessions_query, FetchError, Sessions, LOOKBACK};

/// How often Prometheus is asked for sessions during `--until-idle`:
/// 500 ms, so maint follows the scrape that saw the last session end.
pub const IDLE_POLL: Duration = Duration::from_millis(500);

/// Slack taken before the drain's write when telling a reload after it:
/// the write, the index read and the clocks of one host: 2 s.
const RELOAD_SLACK: f64 = 2.0;

/// Why a server counts as in session on a load balancer although its last
/// sample says no session: no sample since the drain.
pub const NOT_REPORTED: &str = "not_reported_since_drain";
/// ... or its HAProxy reloaded after the drain (old workers unseen).
pub const RELOADED: &str = "reloaded_after_drain";
/// ... or its agent counts old HAProxy workers, left by a reload, still
/// running: they may hold sessions the exporter does not count.
pub const OLD_WORKERS: &str = "old_workers_running";
/// ... or its agent counted old workers before the wait and has not been
/// scraped since it began.
pub const OLD_WORKERS_NOT_REPORTED: &str = "old_workers_not_reported_since_drain";

/// How an `--until-idle` wait ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Idle {
    /// No load balancer may hold a session on the servers.
    pub idle: bool,
    /// How long the wait lasted.
    pub waited_seconds: u64,
    /// Those still in session (or not known to be idle) at the end, by
    /// load balancer.
    pub still_in_session: Vec<Sessions>,
    /// Why Prometheus could not tell, at the last poll.
    pub error: Option<String>,
}

impl Idle {
    /// The sentence before the table of [`Idle::rows`], or the whole text
    /// when idle.
    pub fn heading(&self) -> String {
        let waited = self.waited_seconds;
        if self.idle {
            return format!("No session left after {waited}s.\n");
        }
        let unknown = (self.error.as_ref()).map(|e| format!(" (or unknown: {e})"));
        format!(
            "The longest wait ({waited}s) ended with sessions open or not known to be \
             closed{}; maint was written anyway. HAProxy keeps the sessions already \
             established on a server in maint (maint only stops new sessions and checks): \
             they last until the client or the server closes them, on a worker left by a \
             reload until the configuration's hard-stop-after at the latest. \
             `shutdown sessions server BACKEND/SERVER` on a load balancer's stats socket \
             cuts them there:\n",
            unknown.unwrap_or_default()
        )
    }

    /// The table's header and rows: server, load balancer, sessions, why.
    pub fn rows(&self) -> ([&'static str; 4], Vec<Vec<String>>) {
        let rows = (self.still_in_session.iter())
            .map(|s| {
                let (sessions, why) = match s.why {
                    Some(NOT_REPORTED) => ("?", "not reported since the drain"),
                    Some(RELOADED) => ("?", "HAProxy reloaded: old workers not seen"),
                    Some(OLD_WORKERS) => ("?", "old HAProxy workers from a reload still running"),
                    Some(OLD_WORKERS_NOT_REPORTED) => {
                        ("?", "old HAProxy workers not reported since the drain")
                    }
                    _ if s.instance.is_none() => ("?", "no load balancer reports it"),
                    _ => ("", "open"),
                };
                vec![
                    s.server.clone(),
                    s.instance.clone().unwrap_or("-".into()),
                    match sessions {
                        "" => s.sessions.to_string(),
                        other => other.to_string(),
                    },
                    why.to_string(),
                ]
            })
            .collect();
        (["SERVER", "LOAD BALANCER", "SESSIONS", "WHY"], rows)
    }
}

/// The Prometheus clock now (`time()`), in seconds.
async fn prometheus_now(http: &reqwest::Client, base: &str) -> Result<f64, FetchError> {
    match instant_query(http, base, "time()").await? {
        Data::Scalar(at) => Ok(at.value()),
        other => Err(FetchError {
            message: format!("Prometheus at {base}: time() answered {other:?}, not a scalar"),
            lasting: false,
        }),
    }
}

/// `(server, instance) -> value` of an instant-vector answer of the
/// sessions query (or one wrapped in a function that keeps its labels).
fn by_server(answer: &Data) -> Result<BTreeMap<(String, String), f64>, FetchError> {
    let label = |l: &super::Labels, k: &str| l.get(k).cloned().unwrap_or_default();
    Ok(samples(answer, "haproxy_server_current_sessions")
        .map_err(|message| FetchError {
            message,
            lasting: false,
        })?
        .into_iter()
        .map(|s| {
            let server = format!(
                "{}/{}",
                label(&s.labels, "proxy"),
                label(&s.labels, "server")
            );
            ((server, label(&s.labels, "instance")), s.value)
        })
        .collect())
}

/// What the wait compares each poll with, read once when it begins.
struct Watch {
    /// Prometheus's clock when the wait began: only samples scraped after
    /// it count.
    since: f64,
    /// A load balancer whose HAProxy started after this reloaded after the
    /// drain.
    reload_after: f64,
    /// `(server, instance)` reported in the last hour.
    before: BTreeSet<(String, String)>,
    /// Hosts whose agent counted old workers in the last hour.
    counted: BTreeSet<String>,
}

/// The host of an `instance` label: the address without its port
/// (`10.0.0.1:9778` -> `10.0.0.1`, `[::1]:9778` -> `[::1]`, `lb-01` ->
/// `lb-01`).
pub fn host_of(instance: &str) -> &str {
    match instance.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']')) =>
        {
            host
        }
        _ => instance,
    }
}

/// What one host's agent says of old workers at a poll.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OldWorkers {
    /// The largest count among the host's agents (-1: unknown).
    count: f64,
    /// When it was scraped (Prometheus's clock, seconds).
    at: f64,
}

/// The servers' sessions on every load balancer `selector` matches.
pub struct IdleQuery<'a> {
    /// The HTTP client.
    pub http: &'a reqwest::Client,
    /// Prometheus's base URL.
    pub base: &'a str,
    /// `--sessions-selector`.
    pub selector: &'a str,
    /// `<backend>/<server>`.
    pub servers: &'a [String],
    /// `--confirm-selector`: the agents' series, whose
    /// `gitlab_haproxy_agent_haproxy_old_workers` is read.
    pub agents: &'a str,
}

impl IdleQuery<'_> {
    fn backends(&self) -> Vec<&str> {
        let all = self.servers.iter().filter_map(|s| s.split('/').next());
        all.collect::<BTreeSet<_>>().into_iter().collect()
    }

    async fn watch(&self, drained_for: Duration) -> Result<Watch, FetchError> {
        let since = prometheus_now(self.http, self.base).await?;
        let query = sessions_query(self.selector, &self.backends());
        let seen = format!("max_over_time({query}[{LOOKBACK}])");
        let before = by_server(&instant_query(self.http, self.base, &seen).await?)?;
        let old = self.old_workers_query();
        let counted = format!("max_over_time({old}[{LOOKBACK}]) >= 0");
        let counted = self.samples(&counted).await?;
        Ok(Watch {
            since,
            reload_after: since - drained_for.as_secs_f64() - RELOAD_SLACK,
            before: before.into_keys().collect(),
            counted: (counted.iter())
                .filter_map(|s| s.labels.get("instance"))
                .map(|i| host_of(i).to_string())
                .collect(),
        })
    }

    async fn samples(&self, query: &str) -> Result<Vec<super::Sample>, FetchError> {
        let answer = instant_query(self.http, self.base, query).await?;
        samples(&answer, query).map_err(|message| FetchError {
            message,
            lasting: false,
        })
    }

    fn old_workers_query(&self) -> String {
        format!(
            "gitlab_haproxy_agent_haproxy_old_workers{{{}}}",
            self.agents.trim()
        )
    }

    /// Each host's agent's last count of old workers, with when it was
    /// scraped.
    async fn old_workers(&self) -> Result<BTreeMap<String, OldWorkers>, FetchError> {
        let query = self.old_workers_query();
        let at = self.samples(&format!("timestamp({query})")).await?;
        let values = self.samples(&query).await?;
        let mut by_host: BTreeMap<String, OldWorkers> = BTreeMap::new();
        for s in &values {
            let Some(instance) = s.labels.get("instance") else {
                continue;
            };
            let when = (at.iter())
                .find(|t| t.labels.get("instance") == Some(instance))
                .map_or(0.0, |t| t.value);
            let seen = OldWorkers {
                count: s.value,
                at: when,
            };
            by_host
                .entry(host_of(instance).to_string())
                .and_modify(|o| {
                    o.count = o.count.max(seen.count);
                    o.at = o.at.min(seen.at);
                })
                .or_insert(seen);
        }
        Ok(by_host)
    }

    /// The servers that may still be in session, by load balancer.
    async fn busy(&self, watch: &Watch) -> Result<Vec<Sessions>, FetchError> {
        let query = sessions_query(self.selector, &self.backends());
        // The timestamps first: the values read after are as new or newer.
        let at =
            by_server(&instant_query(self.http, self.base, &format!("timestamp({query})")).await?)?;
        let values = by_server(&instant_query(self.http, self.base, &query).await?)?;
        let selector = self.selector.trim();
        let starts = format!("haproxy_process_start_time_seconds{{{selector}}}");
        let started = samples(
            &instant_query(self.http, self.base, &starts).await?,
            &starts,
        )
        .map_err(|message| FetchError {
            message,
            lasting: false,
        })?;
        let reloaded: BTreeMap<String, f64> = (started.iter())
            .filter(|s| s.value > watch.reload_after)
            .filter_map(|s| Some((s.labels.get("instance")?.clone(), s.value)))
            .collect();
        let old = self.old_workers().await?;
        // What the instance's agent says of old workers: a reason to count
        // it as in session, or none (`Ok`: the agent saw none left since
        // `after`, Prometheus's clock).
        let old_workers = |instance: &str, after: f64| -> Result<(), &'static str> {
            let host = host_of(instance);
            match old.get(host) {
                Some(o) if o.at > watch.since && o.count > 0.0 => Err(OLD_WORKERS),
                Some(o) if o.at > after && o.count == 0.0 => Ok(()),
                _ if watch.counted.contains(host) => Err(OLD_WORKERS_NOT_REPORTED),
                _ => Err(RELOADED),
            }
        };
        let mut busy = Vec::new();
        for server in self.servers {
            let fresh: BTreeMap<&str, f64> = (values.iter())
                .filter(|((s, i), _)| {
                    s == server
                        && at
                            .get(&(s.clone(), i.clone()))
                            .is_some_and(|t| *t > watch.since)
                })
                .map(|((_, i), v)| (i.as_str(), *v))
                .collect();
            let mut instances: BTreeSet<&str> = (watch.before.iter())
                .filter(|(s, _)| s == server)
                .map(|(_, i)| i.as_str())
                .collect();
            instances.extend(
                values
                    .keys()
                    .filter(|(s, _)| s == server)
                    .map(|(_, i)| i.as_str()),
            );
            if instances.is_empty() {
                busy.push(Sessions {
                    server: server.clone(),
                    instance: None,
                    sessions: 0,
                    why: None,
                });
            }
            for instance in instances {
                let (sessions, why) = match fresh.get(instance) {
                    Some(v) if *v > 0.0 => (as_index(*v), None),
                    Some(_) => match reloaded.get(instance) {
                        // Only a count scraped after the reload clears it.
                        Some(start) => match old_workers(instance, *start) {
                            Ok(()) => continue,
                            Err(why) => (0, Some(why)),
                        },
                        None => match old_workers(instance, watch.since) {
                            Err(why @ (OLD_WORKERS | OLD_WORKERS_NOT_REPORTED)) => (0, Some(why)),
                            _ => continue,
                        },
                    },
                    None => (0, Some(NOT_REPORTED)),
                };
                busy.push(Sessions {
                    server: server.clone(),
                    instance: Some(instance.to_string()),
                    sessions,
                    why,
                });
            }
        }
        Ok(busy)
    }

    /// Waits at least `at_least`, then asks Prometheus every
    /// [`IDLE_POLL`] until no load balancer may hold a session on the
    /// servers, or `max` has passed since the start. `drained_for` is how
    /// long ago the drain was written. A Prometheus that does not answer
    /// counts every server as in session.
    pub async fn wait(&self, at_least: Duration, max: Duration, drained_for: Duration) -> Idle {
        let started = tokio::time::Instant::now();
        let mut watch = None;
        tokio::time::sleep(at_least.min(max)).await;
        loop {
            let next = tokio::time::Instant::now() + IDLE_POLL;
            if watch.is_none() {
                watch = self.watch(drained_for + started.elapsed()).await.ok();
            }
            let answer = match &watch {
                Some(w) => self.busy(w).await,
                None => Err(FetchError {
                    message: format!("Prometheus at {} did not answer", self.base),
                    lasting: false,
                }),
            };
            let busy = match &answer {
                Ok(busy) => busy.clone(),
                Err(_) => (self.servers.iter())
                    .map(|s| Sessions {
                        server: s.clone(),
                        instance: None,
                        sessions: 0,
                        why: None,
                    })
                    .collect(),
            };
            let waited = started.elapsed();
            if busy.is_empty() || waited >= max {
                return Idle {
                    idle: busy.is_empty(),
                    waited_seconds: waited.as_secs(),
                    still_in_session: busy,
                    error: answer.err().map(|e| e.message),
                };
            }
            tokio::time::sleep_until(next).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_and_an_exporter_are_matched_by_the_host_of_their_instance() {
        for (instance, host) in [
            ("10.0.0.1:9778", "10.0.0.1"),
            ("lb-01.example.com:8405", "lb-01.example.com"),
            ("lb-01", "lb-01"),
            ("[::1]:9778", "[::1]"),
            ("[2001:db8::1]", "[2001:db8::1]"),
            ("2001:db8::1", "2001:db8::1"),
            ("lb-01:", "lb-01:"),
            ("lb-01:http", "lb-01:http"),
        ] {
            assert_eq!(host_of(instance), host, "{instance}");
        }
    }

    #[test]
    fn the_report_names_each_load_balancer_that_may_hold_a_session_and_why() {
        let busy = |server: &str, instance: Option<&str>, sessions, why| Sessions {
            server: server.into(),
            instance: instance.map(str::to_string),
            sessions,
            why,
        };
        let mut idle = Idle {
            idle: false,
            waited_seconds: 600,
            still_in_session: vec![
                busy("web/web-01", Some("lb-01:8405"), 3, None),
                busy("web/web-01", Some("lb-02:8405"), 0, Some(RELOADED)),
                busy("web/web-01", Some("lb-03:8405"), 0, Some(NOT_REPORTED)),
                busy("web/web-02", None, 0, None),
            ],
            error: None,
        };
        let text = idle.heading();
        assert!(
            text.starts_with("The longest wait (600s) ended with sessions open or not known"),
            "{text}"
        );
        assert!(
            text.contains("HAProxy keeps the sessions already established"),
            "{text}"
        );
        assert!(text.contains("hard-stop-after"), "{text}");
        assert!(!text.contains("cut them:"), "{text}");
        let (_, rows) = idle.rows();
        assert_eq!(rows[0], ["web/web-01", "lb-01:8405", "3", "open"]);
        assert_eq!(
            rows[1][2..],
            ["?", "HAProxy reloaded: old workers not seen"]
        );
        assert_eq!(rows[2][3], "not reported since the drain");
        assert_eq!(rows[3][1..], ["-", "?", "no load balancer reports it"]);
        let v = serde_json::to_value(&idle).unwrap();
        assert_eq!(
            v["still_in_session"][0],
            serde_json::json!({"server": "web/web-01", "instance": "lb-01:8405", "sessions": 3})
        );
        assert_eq!(v["still_in_session"][1]["why"], RELOADED);
        idle.error = Some("Prometheus at http://p:9090 did not answer".into());
        assert!(idle.heading().contains("closed (or unknown: Prometheus at"));
        idle.idle = true;
        idle.still_in_session.clear();
        assert_eq!(idle.heading(), "No session left after 600s.\n");
    }
}
