//! The cookbook's rendered haproxy.cfg run for real: the sample role
//! (cookbook/gitlab-haproxy-agent/test/fixtures/sample_role.json) rendered by
//! the cookbook's template, a real HAProxy on it, the agent and a real Consul.
//! One write of the `canary` key drains every canary server and nothing else,
//! a row key overrides the group for one server, deleting the keys restores
//! all; one write of `zone-b` drains (then maints) exactly the servers the
//! role puts in zone b, server-template servers included, and a server's zone
//! comes before its backend's groups; setting `agent.enable` false (then
//! reloading) is a rollback. Servers of a server-template resolved through
//! Consul's DNS (SRV records) keep the weight the agent sets.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use support::{free_port, wait_for, Agent, Consul, Haproxy, ServerState, TempDir};

/// agent-inter rendered into the sample (production default is 2s).
const INTER: &str = "200ms";
/// Several agent-inter periods: long enough for every server to be asked
/// again after a change.
const SETTLE: Duration = Duration::from_millis(1200);
/// One agent-inter plus the agent's Consul wake-up, with slack for a loaded
/// machine.
const CONVERGE: Duration = Duration::from_secs(10);
/// Stats socket path rendered into the config, replaced by the harness's
/// `{SOCKET}` placeholder before HAProxy starts.
const SOCKET_SENTINEL: &str = "/nonexistent/cookbook-e2e/admin.sock";

/// Servers the sample role puts in the `canary` group (via agent.groups).
const CANARY: [(&str, &str); 3] = [
    ("canary_web", "web-cny-01"),
    ("canary_web", "web-cny-02"),
    ("canary_api", "api-cny-01"),
];
/// Every enrolled server of the sample role (the 14 `server` lines and the
/// two servers of `server-template web-tpl 2`) with the groups on its
/// agent-send line: its zone as `zone-<zone>`, then its backend's groups.
const ENROLLED: [(&str, &str, &[&str]); 16] = [
    ("web", "web-01", &["zone-b"]),
    ("web", "web-02", &["zone-c"]),
    ("web", "web-03", &["zone-d"]),
    ("web", "web-tpl1", &["zone-b"]),
    ("web", "web-tpl2", &["zone-b"]),
    ("canary_web", "web-cny-01", &["zone-b", "canary"]),
    ("canary_web", "web-cny-02", &["zone-c", "canary"]),
    ("canary_api", "api-cny-01", &["zone-d", "canary"]),
    ("api", "api-01", &[]),
    ("api", "api-02", &[]),
    ("ci", "ci-01", &[]),
    ("ci", "ci-02", &[]),
    ("pages", "pages-01", &[]),
    ("pages", "pages-02", &[]),
    ("registry", "registry-01", &[]),
    ("registry", "registry-02", &[]),
];
/// Distinct agent-send lines: one per `server` line, one for the template.
const SEND_LINES: usize = 15;
/// The excluded backend's inline server: never enrolled.
const EXCLUDED: (&str, &str) = ("asset_proxy", "asset_proxy");

/// Answers every connection with `HTTP/1.1 200 OK` so the sample's health
/// checks (HTTP and TCP) keep the servers UP; stopped and joined on drop.
struct HealthServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HealthServer {
    fn start() -> HealthServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 1024];
                        let _ = s.read(&mut buf);
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HealthServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Render arguments shared by every rendering in one rig.
struct Render {
    health_port: u16,
    agent_port: u16,
    binds: [(&'static str, u16); 3],
}

impl Render {
    /// `ruby cookbook/gitlab-haproxy-agent/test/render_sample.rb ...`, with
    /// the stats socket left as the harness's `{SOCKET}` placeholder.
    fn config(&self, agent_enabled: bool) -> String {
        let script: PathBuf = [
            env!("CARGO_MANIFEST_DIR"),
            "cookbook/gitlab-haproxy-agent/test/render_sample.rb",
        ]
        .iter()
        .collect();
        let mut cmd = Command::new("ruby");
        cmd.arg(&script)
            .arg("--server-addr")
            .arg(format!("127.0.0.1:{}", self.health_port))
            .arg("--agent-port")
            .arg(self.agent_port.to_string())
            .args(["--agent-inter", INTER, "--stats-socket", SOCKET_SENTINEL]);
        for (frontend, port) in self.binds {
            cmd.arg("--bind")
                .arg(format!("{frontend}=127.0.0.1:{port}"));
        }
        if !agent_enabled {
            cmd.arg("--disable-agent");
        }
        let out = cmd.output().expect("ruby runs render_sample.rb");
        assert!(
            out.status.success(),
            "render_sample.rb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cfg = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            cfg.matches(SOCKET_SENTINEL).count(),
            1,
            "one stats socket:\n{cfg}"
        );
        assert!(
            !cfg.contains("server-state"),
            "no server-state file:\n{cfg}"
        );
        assert_eq!(
            cfg.matches(" agent-check ").count(),
            if agent_enabled { SEND_LINES } else { 0 }
        );
        cfg.replace(SOCKET_SENTINEL, "{SOCKET}")
    }
}

struct Rig {
    consul: Consul,
    agent: Agent,
    haproxy: Haproxy,
    render: Render,
    _health: HealthServer,
}

fn rig() -> Rig {
    let health = HealthServer::start();
    let consul = Consul::start();
    let agent = Agent::start(&consul.url(), &[]);
    let render = Render {
        health_port: health.port,
        agent_port: agent.listen.port(),
        binds: [
            ("main", free_port()),
            ("registry_http", free_port()),
            ("pages_tcp", free_port()),
        ],
    };
    let haproxy = Haproxy::start(&render.config(true));
    let rig = Rig {
        consul,
        agent,
        haproxy,
        render,
        _health: health,
    };
    // Every enrolled server's agent-send line reaches the agent and is read
    // (the agent counts the distinct lines it was asked about).
    let seen = wait_for(CONVERGE, || {
        (rows_seen(&rig.agent) == Some(SEND_LINES as f64)).then_some(())
    });
    assert!(
        seen.is_some(),
        "agent did not see the {SEND_LINES} agent-send lines (saw {:?}):\n{}",
        rows_seen(&rig.agent),
        rig.agent.log()
    );
    rig
}

/// `gitlab_haproxy_agent_rows_seen`, or None while the agent does not show it.
fn rows_seen(agent: &Agent) -> Option<f64> {
    let (_, text) = agent.http_get("/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix("gitlab_haproxy_agent_rows_seen "))
        .and_then(|v| v.trim().parse().ok())
}

type Key = (String, String);

fn key((backend, server): (&str, &str)) -> Key {
    (backend.to_string(), server.to_string())
}

/// The enrolled servers whose agent-send line carries `group`.
fn members(group: &str) -> Vec<Key> {
    ENROLLED
        .iter()
        .filter(|(_, _, groups)| groups.contains(&group))
        .map(|(b, s, _)| key((b, s)))
        .collect()
}

/// (admin_state, uweight, iweight) of every server.
fn admin_view(h: &Haproxy) -> HashMap<Key, (u32, u32, u32)> {
    h.servers_state()
        .into_iter()
        .map(|(k, s)| (k, (s.admin_state, s.uweight, s.iweight)))
        .collect()
}

/// What a ready server at its configured weight looks like.
fn ready_view(h: &Haproxy) -> HashMap<Key, (u32, u32, u32)> {
    admin_view(h)
        .into_iter()
        .map(|(k, (_, _, iw))| (k, (0, iw, iw)))
        .collect()
}

/// Waits until every server matches `expected` (bounded by CONVERGE).
fn wait_view(h: &Haproxy, expected: &HashMap<Key, (u32, u32, u32)>, what: &str) {
    let ok = wait_for(CONVERGE, || (admin_view(h) == *expected).then_some(()));
    if ok.is_none() {
        let now = admin_view(h);
        let mut diff: Vec<String> = expected
            .iter()
            .filter(|(k, v)| now.get(*k) != Some(*v))
            .map(|(k, v)| format!("{}/{}: want {v:?} got {:?}", k.0, k.1, now.get(k)))
            .collect();
        diff.sort();
        panic!("{what}: servers did not converge:\n{}", diff.join("\n"));
    }
}

fn drained(s: &ServerState) -> bool {
    s.is_drain() && !s.is_maint() && s.uweight == s.iweight
}

#[test]
fn sample_role_layout_is_what_the_role_defines() {
    let rig = rig();
    let state = rig.haproxy.servers_state();
    let mut names: Vec<&Key> = state.keys().collect();
    names.sort();
    let mut expected: Vec<Key> = ENROLLED.iter().map(|(b, s, _)| key((b, s))).collect();
    expected.push(key(EXCLUDED));
    expected.sort();
    assert_eq!(names, expected.iter().collect::<Vec<_>>());
    let canary: Vec<Key> = CANARY.iter().map(|s| key(*s)).collect();
    assert_eq!(members("canary"), canary);
    for (b, s, _) in ENROLLED {
        let row = &state[&key((b, s))];
        assert_eq!(
            (row.admin_state, row.uweight, row.iweight),
            (0, 100, 100),
            "{b}/{s}"
        );
    }
    // The health checks pass (servers UP) alongside the agent checks.
    let up = wait_for(CONVERGE, || {
        rig.haproxy
            .servers_state()
            .values()
            .all(|s| s.op_state == 2)
            .then_some(())
    });
    assert!(
        up.is_some(),
        "servers not UP: {:?}",
        rig.haproxy.servers_state()
    );
}

#[test]
fn canary_write_drains_canary_only_row_key_overrides_delete_restores() {
    let rig = rig();
    let h = &rig.haproxy;
    let ready = ready_view(h);
    wait_view(h, &ready, "start");

    // One write of the group key.
    rig.consul.put("canary", "drain");
    let mut want = ready.clone();
    for s in CANARY {
        want.insert(key(s), (8, 100, 100));
    }
    wait_view(h, &want, "canary=drain");
    for s in CANARY {
        assert!(
            drained(&h.server(s.0, s.1)),
            "{s:?} drained by the group key"
        );
    }
    // Nothing else moves, however many agent checks pass.
    std::thread::sleep(SETTLE);
    assert_eq!(
        admin_view(h),
        want,
        "canary=drain must change the canary servers only"
    );

    // A row key wins over the group for its server only; a weight row key
    // sets a share of the configured weight.
    rig.consul.put("canary_web/web-cny-01", "ready");
    rig.consul.put("web/web-02", "50%");
    want.insert(key(("canary_web", "web-cny-01")), (0, 100, 100));
    want.insert(key(("web", "web-02")), (0, 50, 100));
    wait_view(h, &want, "row keys");
    std::thread::sleep(SETTLE);
    assert_eq!(
        admin_view(h),
        want,
        "row keys must change their own servers only"
    );

    // Deleting the keys restores every server.
    rig.consul.delete("canary");
    rig.consul.delete("canary_web/web-cny-01");
    rig.consul.delete("web/web-02");
    wait_view(h, &ready, "keys deleted");
    std::thread::sleep(SETTLE);
    assert_eq!(admin_view(h), ready, "all servers ready at full weight");
}

#[test]
fn zone_write_drains_then_maints_that_zone_only_template_servers_included() {
    let rig = rig();
    let h = &rig.haproxy;
    let ready = ready_view(h);
    wait_view(h, &ready, "start");
    let zone_b = members("zone-b");
    assert_eq!(zone_b.len(), 4, "web-01, web-tpl1, web-tpl2, web-cny-01");

    // One write drains every server of zone b, the template's two included.
    rig.consul.put("zone-b", "drain");
    let mut want = ready.clone();
    for k in &zone_b {
        want.insert(k.clone(), (8, 100, 100));
    }
    wait_view(h, &want, "zone-b=drain");
    std::thread::sleep(SETTLE);
    assert_eq!(admin_view(h), want, "zone-b=drain moves zone b only");

    // Then maint; a row key still overrides the zone for its server.
    rig.consul.put("zone-b", "maint");
    rig.consul.put("web/web-01", "ready");
    for k in &zone_b {
        want.insert(k.clone(), (1, 100, 100));
    }
    want.insert(key(("web", "web-01")), (0, 100, 100));
    wait_view(h, &want, "zone-b=maint, web/web-01=ready");

    // A server's zone comes before its backend's groups on its agent-send
    // line: with canary drained and zone c in maint, web-cny-02 (zone c)
    // follows its zone.
    rig.consul.put("canary", "drain");
    rig.consul.put("zone-c", "maint");
    for k in members("canary") {
        want.insert(k, (8, 100, 100));
    }
    for k in members("zone-c") {
        want.insert(k, (1, 100, 100));
    }
    want.insert(key(("canary_web", "web-cny-01")), (1, 100, 100));
    assert_eq!(want[&key(("canary_web", "web-cny-02"))], (1, 100, 100));
    wait_view(h, &want, "canary=drain, zone-c=maint");
    std::thread::sleep(SETTLE);
    assert_eq!(admin_view(h), want, "each server answered by its first key");

    for k in ["zone-b", "zone-c", "canary", "web/web-01"] {
        rig.consul.delete(k);
    }
    wait_view(h, &ready, "keys deleted");
}

#[test]
fn disabling_the_agent_is_a_rollback_and_reenabling_reapplies_consul() {
    let rig = rig();
    let h = &rig.haproxy;
    let ready = ready_view(h);
    rig.consul.put("canary", "drain");
    rig.consul.put("registry/registry-01", "maint");
    let mut want = ready.clone();
    for s in CANARY {
        want.insert(key(s), (8, 100, 100));
    }
    want.insert(key(("registry", "registry-01")), (1, 100, 100));
    wait_view(h, &want, "drained before rollback");

    // agent.enable false: the config without agent options, reloaded. With
    // no server-state file, every server comes back ready and stays so.
    let cfg_path = h.socket().with_file_name("haproxy.cfg");
    assert!(
        cfg_path.exists(),
        "harness config at {}",
        cfg_path.display()
    );
    let disabled = rig
        .render
        .config(false)
        .replace("{SOCKET}", h.socket().to_str().unwrap());
    std::fs::write(&cfg_path, disabled).unwrap();
    h.reload();
    wait_view(h, &ready, "after rollback reload");
    std::thread::sleep(SETTLE);
    assert_eq!(
        admin_view(h),
        ready,
        "no agent, no drain, whatever Consul holds"
    );

    // Enabled again: the agent re-applies the state still in Consul.
    let enabled = rig
        .render
        .config(true)
        .replace("{SOCKET}", h.socket().to_str().unwrap());
    std::fs::write(&cfg_path, enabled).unwrap();
    h.reload();
    wait_view(h, &want, "after re-enable reload");

    rig.consul.delete("canary");
    rig.consul.delete("registry/registry-01");
    wait_view(h, &ready, "keys deleted");
}

// ---------------------------------------------------------------------------
// Servers found through DNS: a server-template resolving Consul's SRV
// records keeps the agent's weight.

/// agent-inter of the DNS rig: ten resolutions between two agent answers,
/// so a resolution that resets the weight shows in most samples.
const DNS_AGENT_INTER: &str = "1s";
/// How long the weight is sampled, and how often.
const DNS_SAMPLING: Duration = Duration::from_secs(4);
const DNS_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// A role with one backend whose servers come from `server-template app 2
/// _app._tcp.service.consul resolvers consul`, re-resolved every 100 ms
/// through Consul's DNS on `dns_port`, zone b, configured weight 100.
fn dns_role(dns_port: u16) -> serde_json::Value {
    serde_json::json!({
        "name": "dns-lb",
        "json_class": "Chef::Role",
        "chef_type": "role",
        "run_list": ["recipe[gitlab-haproxy-agent]"],
        "env_run_lists": {},
        "override_attributes": {},
        "default_attributes": { "gitlab-haproxy-agent": {
            "agent": { "enable": true, "zones": ["b"] },
            "haproxy": {
                "global": {
                    "log": "log stderr format short local0 notice",
                    "chroot": null, "user": null, "group": null, "daemon": null,
                    "maxconn": "maxconn 4096"
                },
                "resolvers": { "consul": {
                    "nameserver": format!("nameserver consul 127.0.0.1:{dns_port}"),
                    "payload": "accepted_payload_size 8192",
                    "hold_valid": "hold valid 100ms",
                    "timeout_resolve": "timeout resolve 100ms",
                    "timeout_retry": "timeout retry 100ms"
                } },
                "backends": { "app": {
                    "options": {
                        "balance": "balance roundrobin",
                        "default_server": "default-server weight 100"
                    },
                    "server_templates": { "app": {
                        "count": 2,
                        "address": "_app._tcp.service.consul",
                        "zone": "b",
                        "options": "resolvers consul init-addr none"
                    } }
                } }
            }
        } }
    })
}

/// Renders `dns_role` with the cookbook, for the agent on `agent_port`.
fn dns_config(dir: &TempDir, dns_port: u16, agent_port: u16) -> String {
    let role = dir.path().join("dns-role.json");
    std::fs::write(&role, dns_role(dns_port).to_string()).unwrap();
    let script: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "cookbook/gitlab-haproxy-agent/test/render_sample.rb",
    ]
    .iter()
    .collect();
    let out = Command::new("ruby")
        .arg(&script)
        .arg("--role")
        .arg(&role)
        .args(["--agent-port", &agent_port.to_string()])
        .args(["--agent-inter", DNS_AGENT_INTER])
        .args(["--stats-socket", SOCKET_SENTINEL])
        .output()
        .expect("ruby runs render_sample.rb");
    assert!(
        out.status.success(),
        "render_sample.rb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = String::from_utf8(out.stdout).unwrap();
    assert_eq!(cfg.matches(" agent-check ").count(), 1, "{cfg}");
    cfg.replace(SOCKET_SENTINEL, "{SOCKET}")
}

/// Registers two instances of the service `app` with the local Consul.
fn register_app(consul: &Consul) {
    for i in 1..=2 {
        let body = serde_json::json!({
            "ID": format!("app-{i}"), "Name": "app", "Address": "127.0.0.1", "Port": free_port()
        });
        let (status, _, answer) = consul.request(
            "PUT",
            "/v1/agent/service/register",
            body.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    }
}

/// The user weight of `app/app1` and `app/app2` once both are resolved
/// and running, neither drained nor in maint, else `None`.
fn app_weights(h: &Haproxy) -> Option<[u32; 2]> {
    let state = h.servers_state();
    let weight = |name: &str| {
        let s = state.get(&key(("app", name)))?;
        // 0x20: no address resolved yet; 0x08, 0x01: drain, maint; 0x40 (the name came from an SRV
        // record) stays set and does not take the server out.
        (s.admin_state & (0x20 | 0x08 | 0x01) == 0 && s.op_state == 2).then_some(s.uweight)
    };
    Some([weight("app1")?, weight("app2")?])
}

/// Waits until both servers show `want`, then samples their weights
/// over [`DNS_SAMPLING`]: how many samples showed `want` on both, of how
/// many.
fn sample_weights(h: &Haproxy, want: u32) -> (usize, usize) {
    let seen = wait_for(CONVERGE, || (app_weights(h)? == [want; 2]).then_some(()));
    assert!(
        seen.is_some(),
        "never at weight {want}:\n{}",
        h.command("show servers state app")
    );
    sample_only(h, want)
}

/// Samples the weights over [`DNS_SAMPLING`], both servers once resolved:
/// how many samples showed `want` on both, of how many.
fn sample_only(h: &Haproxy, want: u32) -> (usize, usize) {
    let resolved = wait_for(CONVERGE, || app_weights(h));
    assert!(
        resolved.is_some(),
        "not resolved:\n{}",
        h.command("show servers state app")
    );
    let (mut held, mut samples) = (0, 0);
    let end = std::time::Instant::now() + DNS_SAMPLING;
    while std::time::Instant::now() < end {
        samples += 1;
        if app_weights(h) == Some([want; 2]) {
            held += 1;
        }
        std::thread::sleep(DNS_SAMPLE_EVERY);
    }
    (held, samples)
}

/// `server-template ... resolvers consul` resolves Consul's SRV records
/// every 100 ms; each answer would set the servers' weight to the record's
/// (Consul's SRV weight 1 makes HAProxy weight 1), undoing the agent's. The
/// cookbook renders `resolve-opts ignore-weight` on such enrolled lines, so
/// the weight the agent sets holds in every sample: 100 with no key, 50
/// with `zone-b` at 50%. The same config without the option, beside it,
/// shows what it prevents.
#[test]
fn servers_resolved_through_consul_dns_keep_the_agents_weight() {
    let consul = Consul::start();
    register_app(&consul);
    let agent = Agent::start(&consul.url(), &[]);
    let dir = TempDir::new("dns-role");
    let cfg = dns_config(&dir, consul.dns_port(), agent.listen.port());
    let line = cfg
        .lines()
        .find(|l| l.contains("server-template app 2 _app._tcp.service.consul"))
        .expect("the server-template line");
    assert!(line.contains(" resolve-opts ignore-weight "), "{line}");
    let haproxy = Haproxy::start(&cfg);
    // The line as a cookbook without the option rendered it.
    let unguarded = Haproxy::start(&cfg.replace(" resolve-opts ignore-weight", ""));

    for (value, want) in [(None, 100), (Some("50%"), 50)] {
        if let Some(value) = value {
            consul.put("zone-b", value);
        }
        let (held, samples) = sample_weights(&haproxy, want);
        let (unguarded_held, unguarded_samples) = sample_only(&unguarded, want);
        eprintln!(
            "weight {want}: held in {held} of {samples} samples with ignore-weight, \
             {unguarded_held} of {unguarded_samples} without"
        );
        assert_eq!(
            held,
            samples,
            "weight {want} held in {held} of {samples} samples: {:?}",
            app_weights(&haproxy)
        );
        // Without it, the DNS answers win most of the time: the check above
        // would see it.
        assert!(
            unguarded_held < unguarded_samples,
            "without ignore-weight the weight held too ({unguarded_held} of {unguarded_samples}): \
             this HAProxy no longer takes SRV weights"
        );
    }
}
