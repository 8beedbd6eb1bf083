//! The fleet's reading of Prometheus answers: samples, errors, each agent against an index.

use serde_json::json;

use super::*;

/// A canned series: metric name (empty: none), labels, value.
pub(crate) type Series<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

/// An instant vector as the HTTP API's JSON gives it, read by the client.
pub(crate) fn vector(samples: &[Series<'_>]) -> Data {
    let result: Vec<serde_json::Value> = samples
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
    serde_json::from_value(json!({"resultType": "vector", "result": result})).unwrap()
}

pub(crate) const JOB: (&str, &str) = ("job", "gitlab-haproxy-agent");

/// Three agents: lb-01 caught up, lb-02 down since before the write,
/// lb-03 synced but with one row last answered from an older snapshot.
pub(crate) fn answers() -> Vec<Data> {
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
    answers[2] = serde_json::from_value(json!({"resultType": "matrix", "result": []})).unwrap();
    let e = Fleet::from_answers(&answers).unwrap_err();
    assert_eq!(e, "query for answered_index: not an instant vector");
    answers[2] =
        serde_json::from_value(json!({"resultType": "scalar", "result": [1.5, "2"]})).unwrap();
    assert!(Fleet::from_answers(&answers).is_err());
}

/// Prometheus's error answer, as the client reads it.
fn refusal(error_type: &str) -> prometheus_http_query::Error {
    prometheus_http_query::Error::Prometheus(
        serde_json::from_value(json!({"errorType": error_type, "error": "parse error"})).unwrap(),
    )
}

#[test]
fn a_query_prometheus_cannot_run_is_a_lasting_error() {
    let base = "http://127.0.0.1:9090";
    for (error_type, lasting) in [
        ("bad_data", true),
        ("execution", true),
        ("not_found", true),
        ("timeout", false),
        ("canceled", false),
        ("internal", false),
        ("unavailable", false),
    ] {
        let e = fetch_error(base, "up{", &refusal(error_type));
        assert_eq!(e.lasting, lasting, "{error_type}");
        assert_eq!(
            e.message,
            format!("Prometheus at {base} refused \"up{{\": {error_type} parse error")
        );
    }
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
fn sessions_query_selects_the_backends_escaped() {
    assert_eq!(
        sessions_query(" job=\"haproxy\" ", &["web", "api.v2"]),
        r#"haproxy_server_current_sessions{job="haproxy",proxy=~"web|api.v2"}"#
    );
    assert_eq!(
        sessions_query("", &["web"]),
        r#"haproxy_server_current_sessions{proxy=~"web"}"#
    );
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
