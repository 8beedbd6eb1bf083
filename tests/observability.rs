//! The alert rules and the dashboard against the real agent: every metric
//! they name is exported, and a real Prometheus scraping a real agent
//! evaluates every rule and every panel query without error, with data for
//! the key ones.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, TempDir};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap()
}

fn rule_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("alerts"))
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            // alertmanager.example.yml is Alertmanager's config, not rules.
            let rules =
                p.extension()? == "yml" && !p.file_name()?.to_str()?.starts_with("alertmanager.");
            rules.then(|| p.to_str().unwrap().to_string())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

/// Every PromQL expression of the dashboard, with its template variables
/// replaced by what Grafana would send for "All".
fn dashboard_exprs() -> Vec<(String, String)> {
    fn walk(panel: &Value, out: &mut Vec<(String, String)>) {
        let title = panel["title"].as_str().unwrap_or("").to_string();
        for t in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                let expr = expr
                    .replace("$environment", ".*")
                    .replace("$fqdn", ".*")
                    .replace("$__rate_interval", "1m")
                    .replace("$__interval", "15s")
                    .replace("${__range}", "5m");
                out.push((title.clone(), expr));
            }
        }
        for p in panel["panels"].as_array().into_iter().flatten() {
            walk(p, out);
        }
    }
    let dashboard: Value =
        serde_json::from_str(&read("dashboards/gitlab-haproxy-agent.json")).unwrap();
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        walk(p, &mut out);
    }
    assert!(out.len() > 10, "dashboard queries found: {}", out.len());
    out
}

/// Metric names (not recording rules, which contain `:`) in a text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices(['g', 'p']) {
        let rest = &text[i..];
        if i > 0 {
            let prev = text[..i].chars().last().unwrap();
            if prev.is_ascii_alphanumeric() || prev == '_' || prev == ':' {
                continue;
            }
        }
        if !(rest.starts_with("gitlab_haproxy_agent_") || rest.starts_with("process_")) {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        if !name.contains(':') {
            names.insert(name);
        }
    }
    names
}

/// Families exported, from the `# TYPE` lines; histograms also as their
/// `_bucket`, `_sum` and `_count` series.
fn exported(metrics: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        out.insert(name.to_string());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.insert(format!("{name}{suffix}"));
            }
        }
    }
    out
}

struct Rig {
    consul: Consul,
    agent: Agent,
    _haproxy: Haproxy,
}

fn rig() -> Rig {
    let consul = Consul::start();
    // A store the writer has written to has a store id; without one
    // GitLabHAProxyAgentNoStoreId would be pending, and this is a healthy
    // fleet.
    consul.put("~store-id", "5f0c2a9e8d7b4c31a6e2f90b1d4c7e58");
    consul.put("canary", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let mut backends = String::from("backend web\n");
    backends.push_str(&server_line("web", "web-01", &[], port, 200));
    backends.push_str(&server_line("web", "web-cny-01", &["canary"], port, 200));
    let haproxy = Haproxy::start(&haproxy_config(&backends));
    Rig {
        consul,
        agent,
        _haproxy: haproxy,
    }
}

#[test]
fn every_metric_named_by_alerts_and_dashboard_is_exported() {
    let rig = rig();
    wait_for(Duration::from_secs(10), || {
        (rig.agent.metric("gitlab_haproxy_agent_rows_seen") == 2.0).then_some(())
    })
    .expect("HAProxy asks");
    let exported = exported(&rig.agent.metrics());
    let mut named = BTreeSet::new();
    for f in rule_files() {
        named.extend(metric_names(&std::fs::read_to_string(f).unwrap()));
    }
    for (_, expr) in dashboard_exprs() {
        named.extend(metric_names(&expr));
    }
    assert!(named.len() >= 10, "{named:?}");
    let missing: Vec<_> = named.difference(&exported).collect();
    assert!(missing.is_empty(), "named but not exported: {missing:?}");
}

fn try_query(prom: &str, expr: &str) -> Option<Value> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-G",
            &format!("{prom}/api/v1/query"),
        ])
        .arg("--data-urlencode")
        .arg(format!("query={expr}"))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

fn query(prom: &str, expr: &str) -> Value {
    try_query(prom, expr).unwrap_or_else(|| panic!("Prometheus did not answer {expr}"))
}

fn get(prom: &str, path: &str) -> Option<Value> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", &format!("{prom}{path}")])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

#[test]
fn real_prometheus_evaluates_every_rule_and_panel() {
    let rig = rig();
    let dir = TempDir::new("prometheus");
    let port = free_port();
    // The rule files as shipped, but evaluated every second so a short test
    // sees every group evaluated a few times.
    let rules: Vec<String> = rule_files()
        .iter()
        .map(|f| {
            let path = dir.path().join(Path::new(f).file_name().unwrap());
            let text = std::fs::read_to_string(f).unwrap();
            let fast: String = text
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("interval:") {
                        l.split("interval:").next().unwrap().to_string() + "interval: 1s"
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(&path, fast).unwrap();
            format!("  - {}", path.display())
        })
        .collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n{}\nscrape_configs:\n  - job_name: gitlab-haproxy-agent\n    static_configs:\n      - targets: ['{}']\n        labels:\n          environment: test\n          fqdn: lb-01.test\n",
        rules.join("\n"),
        rig.agent.http
    );
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(&cfg, config).unwrap();
    let check = Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let mut prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let prom = format!("http://127.0.0.1:{port}");
    let result = std::panic::catch_unwind(|| {
        // A few scrapes and rule evaluations, with traffic in between.
        let scraped = wait_for(Duration::from_secs(30), || {
            let v = try_query(&prom, "count_over_time(gitlab_haproxy_agent_synced[1m])")?;
            let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
            (n >= 5.0).then_some(())
        });
        assert!(scraped.is_some(), "Prometheus did not scrape the agent");
        rig.consul.put("web/web-01", "maint");
        std::thread::sleep(Duration::from_secs(3));

        let rules = get(&prom, "/api/v1/rules").expect("rules API");
        let mut evaluated = 0;
        for group in rules["data"]["groups"].as_array().unwrap() {
            for rule in group["rules"].as_array().unwrap() {
                evaluated += 1;
                assert_eq!(
                    rule["health"], "ok",
                    "rule {} failed: {}",
                    rule["name"], rule["lastError"]
                );
            }
        }
        assert!(evaluated >= 10, "{evaluated} rules loaded");

        // A healthy, synced, asked agent fires none of the alerts.
        let alerts = get(&prom, "/api/v1/alerts").unwrap();
        let firing: Vec<_> = alerts["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] != "GitLabHAProxyAgentTargetsMissing")
            .map(|a| a["labels"]["alertname"].clone())
            .collect();
        assert!(firing.is_empty(), "alerts pending or firing: {firing:?}");

        let mut empty = Vec::new();
        for (title, expr) in dashboard_exprs() {
            let v = query(&prom, &expr);
            assert_eq!(v["status"], "success", "{title}: {expr}: {v}");
            if v["data"]["result"].as_array().is_none_or(|r| r.is_empty()) {
                empty.push(format!("{title}: {expr}"));
            }
        }
        // Key panels have data.
        for key in [
            "gitlab_haproxy_agent_last_sync_age_seconds",
            "gitlab_haproxy_agent_rows_seen",
            "gitlab_haproxy_agent:answers:rate5m",
            "gitlab_haproxy_agent:consul_requests:rate5m",
            "gitlab_haproxy_agent_keys",
            "process_resident_memory_bytes",
        ] {
            assert!(
                !empty.iter().any(|e| e.contains(key)),
                "no data for {key}; empty panels: {empty:#?}"
            );
        }
    });
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    if let Err(e) = result {
        eprintln!(
            "{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::panic::resume_unwind(e);
    }
}
