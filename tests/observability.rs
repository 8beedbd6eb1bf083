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
use support::{
    free_port, haproxy_config, server_line, wait_for, Agent, Consul, Haproxy, ServerState, TempDir,
};

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
    // Who drained it, why and until when, as the writer records it (put
    // after the key, so it describes the key's write): the until is a day
    // ahead, so neither forgotten-drain alert is pending.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let record = serde_json::json!({"by": "alice", "reason": "canary deploy", "at": now,
        "until": now + 86_400, "value": "drain"});
    consul.put("~meta/canary", &record.to_string());
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

/// A real Prometheus scraping `target` every second (labels environment
/// "test", fqdn "lb-01.test") and evaluating the shipped rule files every
/// second; with `short_for`, every `for:` is cut to 5 s so a test sees an
/// alert fire. Killed by PID when dropped; its log is printed if a test
/// panics.
struct Prometheus {
    child: std::process::Child,
    url: String,
    dir: TempDir,
}

impl Prometheus {
    fn start(target: std::net::SocketAddr, short_for: bool) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let port = free_port();
        let rules: Vec<String> = rule_files()
            .iter()
            .map(|f| {
                let path = dir.path().join(Path::new(f).file_name().unwrap());
                let text = std::fs::read_to_string(f).unwrap();
                let fast: String = text
                    .lines()
                    .map(|l| {
                        let indent = &l[..l.len() - l.trim_start().len()];
                        if l.trim_start().starts_with("interval:") {
                            format!("{indent}interval: 1s")
                        } else if short_for && l.trim_start().starts_with("for:") {
                            format!("{indent}for: 5s")
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
            target
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
        let child = Command::new("prometheus")
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
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// Waits up to 30 s for five scrapes of the agent.
    fn wait_scraped(&self) {
        let scraped = wait_for(Duration::from_secs(30), || {
            let v = try_query(
                &self.url,
                "count_over_time(gitlab_haproxy_agent_synced[1m])",
            )?;
            let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
            (n >= 5.0).then_some(())
        });
        assert!(scraped.is_some(), "Prometheus did not scrape the agent");
    }

    /// The alerts pending or firing, as (name, state, labels).
    fn alerts(&self) -> Vec<(String, String, Value)> {
        let alerts = get(&self.url, "/api/v1/alerts").unwrap_or_default();
        alerts["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "{}",
                std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
            );
        }
    }
}

#[test]
fn real_prometheus_evaluates_every_rule_and_panel() {
    let rig = rig();
    let prometheus = Prometheus::start(rig.agent.http, false);
    let prom = prometheus.url.clone();
    {
        // A few scrapes and rule evaluations, with traffic in between.
        prometheus.wait_scraped();
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
    }
}

/// Backends `web` (web-01, web-02) asking the agent on `web_port` and `api`
/// (api-01, api-cny-01 in group canary) asking on `api_port`, every 200 ms.
fn two_backends(web_port: u16, api_port: u16) -> String {
    let mut b = String::from("backend web\n");
    b.push_str(&server_line("web", "web-01", &[], web_port, 200));
    b.push_str(&server_line("web", "web-02", &["zone-b"], web_port, 200));
    b.push_str("\nbackend api\n");
    b.push_str(&server_line("api", "api-01", &["zone-b"], api_port, 200));
    b.push_str(&server_line(
        "api",
        "api-cny-01",
        &["canary"],
        api_port,
        200,
    ));
    haproxy_config(&b)
}

/// Issue 18, defect 4: one backend reloaded with a wrong agent-port puts its
/// server in maint back in traffic while the rest of the node still asks
/// the agent (rows_seen stays above 0). The agent counts the silent maint
/// row once it is silent past its deadline (10 s at agent-inter 200 ms),
/// a real Prometheus fires the page on it, and it clears when HAProxy asks
/// again.
#[test]
fn a_backend_reloaded_onto_a_wrong_agent_port_pages() {
    let consul = Consul::start();
    consul.put("~store-id", "5f0c2a9e8d7b4c31a6e2f90b1d4c7e58");
    consul.put("api/api-cny-01", "maint");
    consul.put("zone-b", "drain");
    let agent = Agent::start(&consul.url(), &[]);
    let port = agent.listen.port();
    let haproxy = Haproxy::start(&two_backends(port, port));
    let cfg_path = haproxy.socket().with_file_name("haproxy.cfg");
    assert!(cfg_path.exists(), "{}", cfg_path.display());
    let converge = Duration::from_secs(10);
    haproxy.wait_server("api", "api-cny-01", converge, ServerState::is_maint);
    haproxy.wait_server("api", "api-01", converge, ServerState::is_drain);
    haproxy.wait_server("web", "web-02", converge, ServerState::is_drain);
    wait_for(converge, || {
        (agent.metric("gitlab_haproxy_agent_rows_seen") == 4.0).then_some(())
    })
    .expect("HAProxy asks about the four servers");
    // The groups the rows name, and what each decides.
    let metrics = agent.metrics();
    for line in [
        "gitlab_haproxy_agent_group_rows{answer=\"drain\",group=\"zone-b\"} 2",
        "gitlab_haproxy_agent_group_decided_rows{answer=\"drain\",group=\"zone-b\"} 2",
        "gitlab_haproxy_agent_group_rows{answer=\"maint\",group=\"canary\"} 1",
        "gitlab_haproxy_agent_group_overridden_rows{answer=\"maint\",group=\"canary\",key=\"api/api-cny-01\",row=\"api/api-cny-01\"} 1",
        "gitlab_haproxy_agent_groups_over_cap 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
    assert!(
        !metrics.contains("group_decided_rows{answer=\"maint\",group=\"canary\"}"),
        "the row key decides api-cny-01, not canary:\n{metrics}"
    );
    let prometheus = Prometheus::start(agent.http, true);
    prometheus.wait_scraped();
    assert_eq!(agent.metric("gitlab_haproxy_agent_out_rows_not_asked"), 0.0);

    // The api backend reloaded onto a port nobody listens on.
    let wrong = free_port();
    let cfg = two_backends(port, wrong).replace("{SOCKET}", haproxy.socket().to_str().unwrap());
    std::fs::write(&cfg_path, cfg).unwrap();
    haproxy.reload();
    let reloaded = std::time::Instant::now();
    // What the page is about: the new worker starts every server READY and
    // nothing takes the api servers out again.
    haproxy.wait_server(
        "api",
        "api-cny-01",
        converge,
        ServerState::is_ready_full_weight,
    );
    haproxy.wait_server("api", "api-01", converge, ServerState::is_ready_full_weight);
    haproxy.wait_server("web", "web-02", converge, ServerState::is_drain);

    let counted = wait_for(Duration::from_secs(25), || {
        (agent.metric("gitlab_haproxy_agent_out_rows_not_asked") == 2.0).then(|| reloaded.elapsed())
    })
    .unwrap_or_else(|| panic!("the silent rows were not counted:\n{}", agent.metrics()));
    // Not before the 10 s floor (less the last ask's 200 ms), and soon after.
    assert!(
        counted >= Duration::from_millis(9_500) && counted < Duration::from_secs(15),
        "counted {counted:?} after the reload"
    );
    // The node still asks about web: the node-wide signals stay quiet.
    assert_eq!(agent.metric("gitlab_haproxy_agent_rows_seen"), 4.0);
    let status: Value = serde_json::from_str(&agent.http_get("/status").unwrap().1).unwrap();
    assert_eq!(status["out_rows_not_asked"], 2);
    let silent: BTreeSet<&str> = status["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["not_asked"] == true)
        .map(|r| r["agent_send"].as_str().unwrap())
        .collect();
    assert_eq!(
        silent,
        BTreeSet::from(["api/api-01 zone-b", "api/api-cny-01 canary"])
    );

    // The page, through a real Prometheus evaluating the shipped rule
    // (its for: cut to 5 s).
    let fired = wait_for(Duration::from_secs(30), || {
        prometheus.alerts().into_iter().find(|(name, state, _)| {
            name == "GitLabHAProxyAgentDrainNotApplied" && state == "firing"
        })
    })
    .unwrap_or_else(|| panic!("no page; alerts: {:?}", prometheus.alerts()));
    assert_eq!(fired.2["pager"], "pagerduty");
    assert_eq!(fired.2["severity"], "s2");
    assert_eq!(fired.2["fqdn"], "lb-01.test");
    assert!(
        !prometheus
            .alerts()
            .iter()
            .any(|(name, _, _)| name == "GitLabHAProxyAgentNodeNotAsked"),
        "{:?}",
        prometheus.alerts()
    );

    // Fixed and reloaded: HAProxy asks again, the servers go back out, the
    // count clears and the page resolves.
    let cfg = two_backends(port, port).replace("{SOCKET}", haproxy.socket().to_str().unwrap());
    std::fs::write(&cfg_path, cfg).unwrap();
    haproxy.reload();
    haproxy.wait_server("api", "api-cny-01", converge, ServerState::is_maint);
    wait_for(converge, || {
        (agent.metric("gitlab_haproxy_agent_out_rows_not_asked") == 0.0).then_some(())
    })
    .expect("asked again: not counted");
    wait_for(Duration::from_secs(20), || {
        (!prometheus
            .alerts()
            .iter()
            .any(|(name, _, _)| name == "GitLabHAProxyAgentDrainNotApplied"))
        .then_some(())
    })
    .unwrap_or_else(|| panic!("page not resolved: {:?}", prometheus.alerts()));
}

/// Writes `n` keys `folder/sNNNNN` in transactions of 64 (the most Consul
/// 1.8 takes), the value of key `i` being `value(i)`.
fn put_bulk(consul: &Consul, folder: &str, n: usize, value: impl Fn(usize) -> &'static str) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let ops: Vec<Value> = chunk
            .iter()
            .map(|&i| {
                serde_json::json!({"KV": {
                    "Verb": "set",
                    "Key": format!("{}{folder}/s{i:05}", support::PREFIX),
                    "Value": b64.encode(value(i)),
                }})
            })
            .collect();
        let body = serde_json::to_vec(&ops).unwrap();
        let (status, _, answer) = consul.request("PUT", "/v1/txn", &body);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    }
}

/// journald keeps 10,000 lines per 30 s per service by default and drops
/// the rest, errors included: a start with 20,000 keys and a delete of a
/// prefix of 12,000 keys each log a few lines, not one per key, while an
/// ordinary change keeps its line per key.
#[test]
fn a_start_with_20000_keys_and_a_delete_of_the_prefix_log_a_few_lines() {
    const BOUND: usize = 50;
    let consul = Consul::start();
    consul.put("~store-id", "5f0c2a9e8d7b4c31a6e2f90b1d4c7e58");
    // 12,000 keys at drain or maint (a delete of the prefix holds them),
    // 8,000 more at ready or a weight, and one typo (a key too).
    put_bulk(&consul, "held", 12_000, |i| {
        if i % 2 == 0 {
            "drain"
        } else {
            "maint"
        }
    });
    put_bulk(&consul, "more", 8_000, |i| {
        if i % 2 == 0 {
            "ready"
        } else {
            "50%"
        }
    });
    consul.put("web/typo", "drian");
    let agent = Agent::spawn(&consul.url(), &[]);
    agent.wait_ready_within(Duration::from_secs(60));
    assert_eq!(agent.metric("gitlab_haproxy_agent_keys"), 20_001.0);
    let log = agent.log();
    let started = log.lines().count();
    assert!(started < BOUND, "{started} lines at start:\n{}", head(&log));
    assert!(log.contains("first Consul answer applied"), "{log}");
    assert!(log.contains("drain 6000 (held/s00000,"), "{log}");

    // An ordinary change: its own line.
    consul.put("web/web-01", "drain");
    wait_for(Duration::from_secs(10), || {
        (agent.ask("web/web-01") == "drain 100%\n").then_some(())
    })
    .expect("drain applied");
    let log = agent.log();
    assert!(
        log.lines()
            .skip(started)
            .any(|l| l.contains("key=web/web-01") && l.contains("desired state applied")),
        "{log}"
    );

    // 8,000 keys deleted at once: one line.
    let before = agent.log().lines().count();
    let (status, _, _) = consul.request(
        "DELETE",
        &format!("/v1/kv/{}more/?recurse", support::PREFIX),
        b"",
    );
    assert_eq!(status, 200);
    wait_for(Duration::from_secs(30), || {
        (agent.metric("gitlab_haproxy_agent_keys") == 12_002.0).then_some(())
    })
    .expect("8,000 keys deleted");
    let log = agent.log();
    let lines = log.lines().count() - before;
    assert!(
        lines < BOUND,
        "{lines} lines for a delete of 8,000 keys:\n{}",
        tail(&log)
    );

    // `consul kv delete -recurse` of the prefix: 12,000 drains and maints
    // held (the store id went with them), in a few lines.
    let before = agent.log().lines().count();
    let (status, _, _) = consul.request(
        "DELETE",
        &format!("/v1/kv/{}?recurse", support::PREFIX),
        b"",
    );
    assert_eq!(status, 200);
    wait_for(Duration::from_secs(30), || {
        (agent.metric("gitlab_haproxy_agent_rollback_held_keys") == 12_001.0).then_some(())
    })
    .unwrap_or_else(|| panic!("not held:\n{}", tail(&agent.log())));
    // Whatever else the answer logs, give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let log = agent.log();
    let lines = log.lines().count() - before;
    assert!(
        lines < BOUND,
        "{lines} lines for a delete of the prefix:\n{}",
        tail(&log)
    );
    assert!(log.contains("rolled_back 12001"), "{}", tail(&log));
}

/// The first lines of a log, for a failure message.
fn head(log: &str) -> String {
    log.lines().take(20).collect::<Vec<_>>().join("\n")
}

/// The last lines of a log, for a failure message.
fn tail(log: &str) -> String {
    let lines: Vec<_> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
