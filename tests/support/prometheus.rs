//! A real Prometheus (Debian's `prometheus`) on a free loopback port, its
//! storage in a temporary directory, scraping given agents every second as
//! job `gitlab-haproxy-agent`; stopped by its PID when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{free_port, http_request, wait_for, Proc, TempDir};

/// The scrape job name the alerts, the dashboard and the writer's
/// `--confirm-selector` default use.
pub const JOB: &str = "gitlab-haproxy-agent";

/// A running Prometheus.
pub struct Prometheus {
    proc: Proc,
    addr: SocketAddr,
    dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (agents' HTTP listeners) every
    /// second, each with an `fqdn` label `lb-N.test` (N from 1, in order);
    /// waits (up to 30 s) until its query API answers.
    pub fn start(targets: &[SocketAddr]) -> Prometheus {
        Self::start_with(targets, &[])
    }

    /// As [`Prometheus::start`], also scraping each `(job, target)` of
    /// `others` every second under its own job name (e.g. HAProxy's own
    /// exporter as job `haproxy`).
    pub fn start_with(targets: &[SocketAddr], others: &[(&str, SocketAddr)]) -> Prometheus {
        let jobs: Vec<(&str, Vec<SocketAddr>, &str)> =
            others.iter().map(|(j, t)| (*j, vec![*t], "1s")).collect();
        Self::start_jobs(targets, &jobs)
    }

    /// As [`Prometheus::start_with`], each other job `(name, targets,
    /// scrape interval)` with several targets and its own interval (e.g.
    /// HAProxy's exporters every 30s, as a fleet's default 60s does).
    pub fn start_jobs(
        targets: &[SocketAddr],
        others: &[(&str, Vec<SocketAddr>, &str)],
    ) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
        );
        for (i, t) in targets.iter().enumerate() {
            config.push_str(&format!(
                "      - targets: ['{t}']\n        labels:\n          fqdn: lb-{}.test\n",
                i + 1
            ));
        }
        for (job, t, every) in others {
            let t: Vec<String> = t.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    scrape_interval: {every}\n    static_configs:\n      - targets: [{}]\n",
                t.join(", ")
            ));
        }
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let proc = Proc::spawn(cmd, dir.path().join("prometheus.log"));
        let prometheus = Prometheus { proc, addr, dir };
        let ok = wait_for(Duration::from_secs(30), || {
            (prometheus.query("vector(1)")?["status"] == "success").then_some(())
        });
        assert!(
            ok.is_some(),
            "Prometheus did not start:\n{}",
            prometheus.proc.log()
        );
        prometheus
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The directory holding its configuration, storage and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.proc.log()
    }

    /// An instant query; `None` when Prometheus does not answer with JSON.
    pub fn query(&self, expr: &str) -> Option<Value> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let (_, _, body) = http_request(self.addr, "GET", &path, b"")?;
        serde_json::from_slice(&body).ok()
    }

    /// The values of an instant query's samples, by their `instance` label.
    pub fn values(&self, expr: &str) -> Vec<(String, f64)> {
        let Some(answer) = self.query(expr) else {
            return Vec::new();
        };
        answer["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let instance = s["metric"]["instance"].as_str()?.to_string();
                let value = s["value"][1].as_str()?.parse().ok()?;
                Some((instance, value))
            })
            .collect()
    }

    /// Waits up to `timeout` until every sample of `expr` satisfies `ok`
    /// and there are `n` of them.
    pub fn wait_until(
        &self,
        timeout: Duration,
        expr: &str,
        n: usize,
        ok: impl Fn(f64) -> bool,
    ) -> bool {
        wait_for(timeout, || {
            let v = self.values(expr);
            (v.len() == n && v.iter().all(|(_, x)| ok(*x))).then_some(())
        })
        .is_some()
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters kept).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
