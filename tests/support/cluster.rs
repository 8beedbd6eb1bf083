//! A real Consul cluster on loopback, as production runs it: three servers
//! (non-dev, each with its own data directory) and client agents, every
//! node on its own loopback address with Consul's default ports, the agent
//! under test reading through a client agent. Every process is started and
//! stopped by its PID; every wait is bounded.
//!
//! Each cluster takes one /24 of 127.0.0.0/8 (all of it is local on Linux):
//! servers on `.1`-`.3`, client agents from `.11`. The /24 is chosen per
//! process and per cluster, held by a lock file while in use, and skipped
//! when something already listens there, so test binaries and tests
//! running at once never meet.
//!
//! Raft runs with `performance { raft_multiplier = 1 }` (Consul's
//! recommended production timing; the default of 5 is for small machines),
//! so a leader is elected again within about 2 s of losing one.
//!
//! Partitions ([`Cluster::start_partitionable`], [`Cluster::cut`],
//! [`Cluster::heal`]) need the private namespace of `super::netns`: each
//! node runs under its own uid (Consul's gossip TCP leaves from 127.0.0.1,
//! not from the node's address), and a cut is nftables DROP rules on the
//! output hook, by address pair and by `meta skuid`, both directions.
//!
//! What Consul 1.8.7 does under a cut, measured with this setup (three
//! servers, `raft_multiplier = 1`, a client agent c1):
//!
//! - The `X-Consul-Index` of `GET /v1/kv/<prefix>?keys&separator=/` (with
//!   or without `&stale`) is the one of `GET /v1/kv/<prefix>?recurse`,
//!   always: after a put, a put folded under the separator (`p/b/c`), an
//!   update, a flags-only change, a delete (the tombstone keeps the index
//!   up), a prefix emptied by deletes (404, index of its tombstones), and a
//!   prefix never written (404, the whole KV table's index, so moved by a
//!   write anywhere). A write outside a non-empty prefix moves neither. A
//!   blocking `?keys&separator=/&stale` query wakes on a write folded
//!   under the separator, as soon as it is written, with and without
//!   `&stale`.
//! - A default-consistency read through c1 whose server is cut from the
//!   other two: when that server already knows it has no leader, 500 "No
//!   cluster leader" after `rpc_hold_timeout` (7.0-7.1 s); right after the
//!   cut, while the server still forwards to the leader over a pooled
//!   connection that now drops everything, 500 "rpc error making call: EOF"
//!   after 30-34 s. After that error c1 moves to another server: the next
//!   read answers in 40-100 ms, from the quorum. Without an error c1 stays
//!   on the cut server (a `?stale` read there answers at once, with the old
//!   data and a growing `X-Consul-LastContact`, `KnownLeader: false` once
//!   it noticed).
//! - The leader cut from the other two keeps answering default reads as
//!   leader (`LastContact: 0`) for its lease (~0.5 s); a quorum-side
//!   follower forwards to it until the new leader is known: a write through
//!   it then failed after 10 s (dial timeout to the old leader).
//! - A client agent cut from every server: the first default read failed
//!   after 32 s (EOF), the next after 10 s (dial timeout); a `?stale` read
//!   after 10 s.
//! - `performance { rpc_hold_timeout = "2s" }` is accepted by 1.8.7 (`consul
//!   validate` refuses a misspelt key) and shortens "No cluster leader" to
//!   2.1 s.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{http_request_as, kill, netns, wait_every, Proc, TempDir, PREFIX};

/// Consul's default HTTP port, on each node's own address.
pub const HTTP_PORT: u16 = 8500;
/// Consul's default server RPC port: a leader is named `<ip>:8300`.
pub const SERVER_PORT: u16 = 8300;
/// Consul's default serf LAN port.
pub const SERF_LAN_PORT: u16 = 8301;

/// How long a cluster may take to form (about 5-10 s here).
pub const FORM_TIMEOUT: Duration = Duration::from_secs(60);

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// A partitionable cluster's node at `.h` runs as uid `NODE_UID_BASE + h`
/// (no such user needs to exist).
const NODE_UID_BASE: u32 = 47_000;

/// The nftables table that holds the cuts.
const NFT_TABLE: &str = "gha_partition";

/// A free /24 as its first three octets: `127.(100 + pid % 100).n`, n
/// counting up per cluster, skipping a /24 another process holds (its lock
/// file `/tmp/gha-cluster-127.b.n.lock` names a live PID) or where anything
/// listens on a node's Consul ports. The lock is removed when the cluster
/// is dropped.
fn pick_net(clients: u8) -> ([u8; 3], PathBuf) {
    let b = 100 + (std::process::id() % 100) as u8;
    for _ in 0..250 {
        let c = (NEXT_NET.fetch_add(1, Ordering::SeqCst) % 250) as u8 + 1;
        let net = [127, b, c];
        let Some(lock) = lock_net(net) else {
            continue;
        };
        let hosts = (1..=3).chain(11..11 + clients.max(1));
        let free = hosts.into_iter().all(|h| {
            let ip = Ipv4Addr::new(net[0], net[1], net[2], h);
            [HTTP_PORT, SERVER_PORT, SERF_LAN_PORT]
                .iter()
                .all(|p| TcpListener::bind((ip, *p)).is_ok())
        });
        if free {
            return (net, lock);
        }
        let _ = std::fs::remove_file(&lock);
    }
    panic!("no free loopback /24 for a Consul cluster");
}

/// Takes the lock file of `net` for this process: created anew, or taken
/// over from a PID that no longer runs. `None` when a live process holds it.
fn lock_net(net: [u8; 3]) -> Option<PathBuf> {
    let path =
        std::env::temp_dir().join(format!("gha-cluster-{}.{}.{}.lock", net[0], net[1], net[2]));
    let me = std::process::id().to_string();
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write as _;
                f.write_all(me.as_bytes()).ok()?;
                return Some(path);
            }
            Err(_) => {
                let owner = std::fs::read_to_string(&path).unwrap_or_default();
                let alive = owner.trim().parse::<u32>().is_ok_and(|pid| {
                    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
                });
                if alive {
                    return None;
                }
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    None
}

/// One Consul agent process (server or client) of a [`Cluster`].
pub struct Node {
    /// The node name: `s1`..`s3`, `c1`...
    pub name: String,
    /// Its own loopback address (bind, client and advertise address).
    pub ip: Ipv4Addr,
    /// A server (`-server`) or a client agent.
    pub server: bool,
    data: PathBuf,
    logs: PathBuf,
    join: Vec<Ipv4Addr>,
    raft_multiplier: u8,
    /// Consul's `performance.rpc_hold_timeout` (e.g. `2s`); `None`: its
    /// default, 7 s.
    rpc_hold_timeout: Option<String>,
    /// Its own uid (in a partitionable cluster), for `meta skuid` rules.
    pub uid: Option<u32>,
    starts: u32,
    proc: Option<Proc>,
}

impl Node {
    fn command(&self) -> Command {
        let mut cmd = match self.uid {
            Some(uid) => {
                let mut c = Command::new("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".to_string(),
                    "consul".to_string(),
                ]);
                c
            }
            None => Command::new("consul"),
        };
        cmd.arg("agent")
            .arg(format!("-node={}", self.name))
            .arg(format!("-bind={}", self.ip))
            .arg(format!("-client={}", self.ip))
            .arg(format!("-data-dir={}", self.data.display()))
            .args(["-dns-port=-1", "-grpc-port=-1", "-retry-interval=200ms"])
            .args(["-log-level=info", "-disable-host-node-id"]);
        for ip in &self.join {
            cmd.arg(format!("-retry-join={ip}"));
        }
        let hold = self
            .rpc_hold_timeout
            .as_ref()
            .map_or(String::new(), |t| format!(" rpc_hold_timeout = \"{t}\""));
        if self.server {
            cmd.args(["-server", "-bootstrap-expect=3"]).arg(format!(
                "-hcl=performance {{ raft_multiplier = {}{hold} }}",
                self.raft_multiplier
            ));
        } else if !hold.is_empty() {
            cmd.arg(format!("-hcl=performance {{{hold} }}"));
        }
        // Every client of a test connects from 127.0.0.1: lift the
        // per-address HTTP connection cap (200 on 1.8.7).
        cmd.arg("-hcl=limits { http_max_conns_per_client = 10000 }");
        cmd
    }

    /// Starts the process (again, on the same data directory and address,
    /// after [`Node::kill`] or [`Node::terminate`]); does not wait.
    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "{} is running", self.name);
        self.starts += 1;
        let log = self.logs.join(format!("{}-{}.log", self.name, self.starts));
        self.proc = Some(Proc::spawn(self.command(), log));
    }

    /// Whether the process runs (or is stopped by SIGSTOP).
    pub fn is_running(&self) -> bool {
        self.proc.is_some()
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("running").pid()
    }

    /// SIGKILL and reap: a crash, no leave.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            kill(p.pid(), "CONT");
            p.kill();
        }
    }

    /// SIGTERM (a server shuts down without leaving the cluster, as
    /// `systemctl restart consul` does), then waits up to 15 s for the exit;
    /// SIGKILL after that.
    pub fn terminate(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.signal("TERM");
            if p.wait_exit(Duration::from_secs(15)).is_none() {
                p.kill();
            }
        }
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing.
    pub fn pause(&self) {
        kill(self.pid(), "STOP");
    }

    /// SIGCONT after [`Node::pause`].
    pub fn resume(&self) {
        kill(self.pid(), "CONT");
    }

    /// `<ip>:8500`.
    pub fn http(&self) -> SocketAddr {
        SocketAddr::from((self.ip, HTTP_PORT))
    }

    /// `http://<ip>:8500`, for `--consul-addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http())
    }

    /// `<ip>:8300`: how Consul names this server as leader.
    pub fn rpc_addr(&self) -> String {
        format!("{}:{SERVER_PORT}", self.ip)
    }

    /// Every log of this node so far (one file per start), for failures.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| {
                let path = self.logs.join(format!("{}-{n}.log", self.name));
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "--- {} start {n} (last 40 lines)\n{}\n",
                    self.name,
                    tail.join("\n")
                )
            })
            .collect()
    }

    /// Any HTTP request to this node; `None` when it does not answer in
    /// time (the harness's reads wait at most 15 s).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Option<(u16, HashMap<String, String>, Vec<u8>)> {
        http_request_as(self.http(), None, method, path, body)
    }

    /// The leader this node knows (`<ip>:8300`), if any.
    pub fn leader(&self) -> Option<String> {
        let (status, _, body) = self.request("GET", "/v1/status/leader", b"")?;
        let leader = String::from_utf8_lossy(&body)
            .trim()
            .trim_matches('"')
            .to_string();
        (status == 200 && !leader.is_empty()).then_some(leader)
    }

    /// Writes `PREFIX + key` through this node; false when Consul refused
    /// (no leader) or did not answer.
    pub fn put(&self, key: &str, value: &str) -> bool {
        put_at(self.http(), key, value)
    }

    /// The `X-Consul-Index` of the prefix read through this node with the
    /// given query (`""`, `"&stale"`), if it answers.
    pub fn prefix_index(&self, query: &str) -> Option<u64> {
        let (status, headers, _) =
            self.request("GET", &format!("/v1/kv/{PREFIX}?recurse{query}"), b"")?;
        if status != 200 && status != 404 {
            return None;
        }
        headers.get("x-consul-index")?.parse().ok()
    }

    /// Joins this node's gossip to the node at `ip` now (`PUT
    /// /v1/agent/join`), rather than at serf's next reconnect attempt (up
    /// to 30 s for a member it saw fail); true on success.
    pub fn join(&self, ip: Ipv4Addr) -> bool {
        self.request("PUT", &format!("/v1/agent/join/{ip}"), b"")
            .is_some_and(|(s, _, _)| s == 200)
    }

    /// The members this node sees alive (`/v1/agent/members`, status 1).
    pub fn alive_members(&self) -> usize {
        let Some((200, _, body)) = self.request("GET", "/v1/agent/members", b"") else {
            return 0;
        };
        let members: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        members
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["Status"] == 1).count())
    }

    /// The servers this client agent holds RPC connections to now (from
    /// /proc/net/tcp: ESTABLISHED from its address to port 8300), as
    /// addresses. A client agent sends every RPC to one server at a time
    /// and moves on only when that one fails or on its periodic rebalance
    /// (minutes).
    pub fn rpc_peers(&self) -> Vec<Ipv4Addr> {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let me = self.ip;
        let mut peers: Vec<Ipv4Addr> = table
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (local, remote, state) = (f.get(1)?, f.get(2)?, f.get(3)?);
                if *state != "01" {
                    return None;
                }
                let (lip, _) = parse_proc_addr(local)?;
                let (rip, rport) = parse_proc_addr(remote)?;
                (lip == me && rport == SERVER_PORT).then_some(rip)
            })
            .collect();
        peers.sort();
        peers.dedup();
        peers
    }
}

/// Writes `PREFIX + key` through the Consul HTTP API at `addr`; false when
/// Consul refused (no leader) or did not answer.
pub fn put_at(addr: SocketAddr, key: &str, value: &str) -> bool {
    http_request_as(
        addr,
        None,
        "PUT",
        &format!("/v1/kv/{PREFIX}{key}"),
        value.as_bytes(),
    )
    .is_some_and(|(s, _, b)| s == 200 && b.trim_ascii() == b"true")
}

/// Runs an nftables script (`nft -f -`) in this process's network
/// namespace; panics when nft refuses it.
fn nft(script: &str) {
    use std::io::Write as _;
    assert!(netns::inside(), "nftables rules only inside netns::enter");
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft (Debian nftables)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "nft refused:\n{script}");
}

/// `0100007F:1F90` (little-endian address, hex port) from /proc/net/tcp.
fn parse_proc_addr(field: &str) -> Option<(Ipv4Addr, u16)> {
    let (ip, port) = field.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some((Ipv4Addr::from(ip.swap_bytes()), port))
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three Consul servers and `n` client agents on one loopback /24.
pub struct Cluster {
    /// `s1`..`s3` on `.1`..`.3`.
    pub servers: Vec<Node>,
    /// `c1`.. on `.11`...
    pub clients: Vec<Node>,
    net: [u8; 3],
    lock: PathBuf,
    // Last: removed after every node has been stopped.
    dir: TempDir,
}

impl Cluster {
    /// Starts three servers and `clients` client agents, and waits (up to
    /// [`FORM_TIMEOUT`]) until a leader is elected, every node sees every
    /// other alive, and a write through the first client agent succeeds.
    pub fn start(clients: u8) -> Cluster {
        Self::start_with(clients, 1)
    }

    /// Like [`Cluster::start`] with Consul's `raft_multiplier` (1 to 10):
    /// Raft's timeouts are scaled by it. 1 is Consul's recommendation for
    /// production servers; a machine far busier than a Consul server (the
    /// fleet benchmark runs thousands of agents on two cores) needs the
    /// default of 5 to keep its leader.
    pub fn start_with(clients: u8, raft_multiplier: u8) -> Cluster {
        Self::launch(clients, raft_multiplier, false, None)
    }

    /// Like [`Cluster::start`], for [`Cluster::cut`]: every node under its
    /// own uid (`setpriv`). Only inside the private namespace of
    /// [`netns::enter`].
    pub fn start_partitionable(clients: u8) -> Cluster {
        Self::start_partitionable_with(clients, None)
    }

    /// Like [`Cluster::start_partitionable`], every node with Consul's
    /// `performance.rpc_hold_timeout` set to `rpc_hold_timeout` (e.g.
    /// `2s`; `None`: Consul's default, 7 s).
    pub fn start_partitionable_with(clients: u8, rpc_hold_timeout: Option<&str>) -> Cluster {
        assert!(
            netns::inside(),
            "a partitionable cluster runs only inside netns::enter"
        );
        Self::launch(clients, 1, true, rpc_hold_timeout)
    }

    fn launch(
        clients: u8,
        raft_multiplier: u8,
        own_uids: bool,
        rpc_hold_timeout: Option<&str>,
    ) -> Cluster {
        // A private namespace's loopback is its own: no lock to take (and
        // a PID there means nothing to the processes outside).
        let (net, lock) = if netns::inside() {
            ([127, 101, 1], PathBuf::new())
        } else {
            pick_net(clients)
        };
        let dir = TempDir::new("consul-cluster");
        if own_uids {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod the cluster folder");
        }
        let ip = |h: u8| Ipv4Addr::new(net[0], net[1], net[2], h);
        let seeds: Vec<Ipv4Addr> = (1..=3).map(ip).collect();
        let node = |name: String, host: u8, server: bool| Node {
            uid: own_uids.then(|| {
                let uid = NODE_UID_BASE + u32::from(host);
                let data = dir.path().join(&name);
                std::fs::create_dir(&data).expect("create a node's data folder");
                std::os::unix::fs::chown(&data, Some(uid), Some(uid))
                    .expect("chown a node's data folder");
                uid
            }),
            data: dir.path().join(&name),
            logs: dir.path().to_path_buf(),
            name,
            ip: ip(host),
            server,
            join: seeds.clone(),
            raft_multiplier,
            rpc_hold_timeout: rpc_hold_timeout.map(str::to_string),
            starts: 0,
            proc: None,
        };
        let servers: Vec<Node> = (1..=3).map(|n| node(format!("s{n}"), n, true)).collect();
        let clients: Vec<Node> = (1..=clients)
            .map(|n| node(format!("c{n}"), 10 + n, false))
            .collect();
        let mut cluster = Cluster {
            servers,
            clients,
            net,
            lock,
            dir,
        };
        for n in cluster.servers.iter_mut().chain(cluster.clients.iter_mut()) {
            n.start();
        }
        let started = Instant::now();
        cluster.wait_formed(FORM_TIMEOUT);
        eprintln!(
            "cluster on {}.{}.{}.0/24 formed in {:?}",
            net[0],
            net[1],
            net[2],
            started.elapsed()
        );
        cluster
    }

    /// Waits up to `timeout` until every running server agrees on a leader,
    /// every running node sees all running nodes alive, and a write
    /// through the first client agent succeeds; panics with the logs
    /// otherwise.
    pub fn wait_formed(&self, timeout: Duration) {
        let running = self.nodes().filter(|n| n.is_running()).count();
        let ok = wait_every(timeout, Duration::from_millis(100), || {
            let leader = self.agreed_leader()?;
            let all_alive = self
                .nodes()
                .filter(|n| n.is_running())
                .all(|n| n.alive_members() >= running);
            // Outside the agent's prefix: an invalid value there would be
            // held and counted.
            let ping = self
                .client(0)
                .request("PUT", "/v1/kv/gha-cluster-ping", b"1")
                .is_some_and(|(s, _, _)| s == 200);
            (all_alive && ping).then_some(leader)
        });
        if ok.is_none() {
            panic!(
                "the Consul cluster did not form in {timeout:?}:\n{}",
                self.logs()
            );
        }
    }

    fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.servers.iter().chain(self.clients.iter())
    }

    /// The `n`-th client agent (0-based).
    pub fn client(&self, n: usize) -> &Node {
        &self.clients[n]
    }

    /// The leader every running (not paused) server names, as a server
    /// index, when they agree.
    pub fn agreed_leader(&self) -> Option<usize> {
        let mut named = self
            .servers
            .iter()
            .filter(|s| s.is_running())
            .map(|s| s.leader());
        let first = named.next()??;
        if !named.all(|l| l.as_deref() == Some(first.as_str())) {
            return None;
        }
        self.servers.iter().position(|s| s.rpc_addr() == first)
    }

    /// Waits up to `timeout` for an agreed leader and returns its index.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        wait_every(timeout, Duration::from_millis(100), || self.agreed_leader())
            .unwrap_or_else(|| panic!("no agreed leader in {timeout:?}:\n{}", self.logs()))
    }

    /// Waits up to `timeout` until a write of `key` through the first
    /// client agent succeeds (a leader is there and commits).
    pub fn wait_put(&self, key: &str, value: &str, timeout: Duration) {
        let ok = wait_every(timeout, Duration::from_millis(100), || {
            self.client(0).put(key, value).then_some(())
        });
        assert!(
            ok.is_some(),
            "PUT {key}={value} failed for {timeout:?}:\n{}",
            self.logs()
        );
    }

    /// Like [`Cluster::wait_put`], through server `server`'s own HTTP API.
    pub fn wait_put_on(&self, server: usize, key: &str, value: &str, timeout: Duration) {
        let ok = wait_every(timeout, Duration::from_millis(100), || {
            self.servers[server].put(key, value).then_some(())
        });
        assert!(
            ok.is_some(),
            "PUT {key}={value} on s{} failed for {timeout:?}:\n{}",
            server + 1,
            self.logs()
        );
    }

    /// Writes `PREFIX + key` through the first client agent; panics if
    /// Consul refuses.
    pub fn put(&self, key: &str, value: &str) {
        assert!(
            self.client(0).put(key, value),
            "PUT {key}={value} refused:\n{}",
            self.logs()
        );
    }

    /// The index of the server the client agent `client` sends its RPCs
    /// to, when it holds a connection to exactly one.
    pub fn server_of(&self, client: usize) -> Option<usize> {
        match self.clients[client].rpc_peers()[..] {
            [ip] => self.servers.iter().position(|s| s.ip == ip),
            _ => None,
        }
    }

    /// The node named `name` (`s1`, `c2`, ...).
    pub fn node(&self, name: &str) -> &Node {
        self.nodes()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Cuts every node of `a` from every node of `b` (names, e.g.
    /// `cut(&["s1"], &["s2", "s3"])`): nftables drops, on the output hook,
    /// packets between their addresses and packets any of their processes
    /// (by uid) sends to the other's address, both directions. Open TCP
    /// connections stall rather than close, as in a real partition. Adds to
    /// the cuts already made; [`Cluster::heal`] removes them all.
    pub fn cut(&self, a: &[&str], b: &[&str]) {
        let mut rules = format!(
            "add table inet {NFT_TABLE}\nadd chain inet {NFT_TABLE} out {{ type filter hook output priority 0; policy accept; }}\n"
        );
        for x in a {
            for y in b {
                let (x, y) = (self.node(x), self.node(y));
                for (from, to) in [(x, y), (y, x)] {
                    let uid = from.uid.expect("a partitionable cluster");
                    rules.push_str(&format!(
                        "add rule inet {NFT_TABLE} out ip saddr {} ip daddr {} drop\n\
                         add rule inet {NFT_TABLE} out meta skuid {uid} ip daddr {} drop\n",
                        from.ip, to.ip, to.ip
                    ));
                }
            }
        }
        nft(&rules);
    }

    /// Cuts node `name` from every server but itself: a server from the
    /// other two, a client agent from all three.
    pub fn isolate(&self, name: &str) {
        let others: Vec<&str> = self
            .servers
            .iter()
            .map(|s| s.name.as_str())
            .filter(|s| *s != name)
            .collect();
        self.cut(&[name], &others);
    }

    /// Removes every cut.
    pub fn heal(&self) {
        nft(&format!(
            "add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
        ));
    }

    /// Starts one more server on the next address of the /24 (`s4` on
    /// `.4`, ...), joining the others, and waits (up to [`FORM_TIMEOUT`])
    /// until the leader names it among its raft peers; its index in
    /// [`Cluster::servers`]. Not in a partitionable cluster.
    pub fn add_server(&mut self) -> usize {
        let n = self.servers.len() as u8 + 1;
        assert!(n < 11, "server addresses end below the client agents'");
        let first = &self.servers[0];
        assert!(first.uid.is_none(), "not in a partitionable cluster");
        let name = format!("s{n}");
        let mut node = Node {
            data: self.dir.path().join(&name),
            logs: self.dir.path().to_path_buf(),
            ip: Ipv4Addr::new(self.net[0], self.net[1], self.net[2], n),
            name,
            server: true,
            join: first.join.clone(),
            raft_multiplier: first.raft_multiplier,
            rpc_hold_timeout: first.rpc_hold_timeout.clone(),
            uid: None,
            starts: 0,
            proc: None,
        };
        assert!(
            TcpListener::bind(node.http()).is_ok(),
            "{} is taken",
            node.http()
        );
        node.start();
        let rpc = node.rpc_addr();
        self.servers.push(node);
        let joined = wait_every(FORM_TIMEOUT, Duration::from_millis(200), || {
            self.raft_peers().contains(&rpc).then_some(())
        });
        assert!(joined.is_some(), "{rpc} did not join:\n{}", self.logs());
        self.servers.len() - 1
    }

    /// Server `i` leaves the cluster gracefully (`PUT /v1/agent/leave`:
    /// out of the raft peers and the catalog), and its process exits (up to
    /// 30 s, then SIGKILL).
    pub fn leave(&mut self, i: usize) {
        let node = &mut self.servers[i];
        let left = node.request("PUT", "/v1/agent/leave", b"");
        assert!(
            left.as_ref().is_some_and(|(s, _, _)| *s == 200),
            "{} refused to leave: {left:?}",
            node.name
        );
        if let Some(mut p) = node.proc.take() {
            if p.wait_exit(Duration::from_secs(30)).is_none() {
                p.kill();
            }
        }
    }

    /// The raft peers (`ip:8300`) the first running server names, as
    /// `/v1/status/peers` gives them.
    pub fn raft_peers(&self) -> Vec<String> {
        let Some(server) = self.servers.iter().find(|s| s.is_running()) else {
            return Vec::new();
        };
        match server.request("GET", "/v1/status/peers", b"") {
            Some((200, _, body)) => serde_json::from_slice(&body).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The last lines of every node's logs.
    pub fn logs(&self) -> String {
        self.nodes().map(Node::log).collect()
    }

    /// The cluster's /24, e.g. `127.142.3`.
    pub fn net(&self) -> String {
        format!("{}.{}.{}", self.net[0], self.net[1], self.net[2])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.clients.iter_mut().chain(self.servers.iter_mut()) {
            n.kill();
        }
        if !self.lock.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.lock);
        }
    }
}
