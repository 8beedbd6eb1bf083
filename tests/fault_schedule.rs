//! The one promise under random faults: a server whose deciding key is
//! `drain` or `maint` stays out of rotation until someone brings it back.
//!
//! A seeded schedule of steps runs against a real HAProxy (master-worker,
//! reloaded with SIGUSR2), a real one-server Consul that keeps its data
//! across restarts, with ACLs on, and the agent binary: row and group writes,
//! deletes, invalid values, transactions, agent SIGTERM and SIGKILL with
//! restarts that keep the served-state file, lose it (a new empty state
//! directory) or find it corrupt, HAProxy reloads, Consul restarts, and
//! changes to the policy of the agent's token (narrowed, then restored). A
//! thread reads `show servers state` every ~100 ms. Afterwards every reading
//! is judged against what the KV contract and its safety rules promise
//! (docs/kv-contract.md):
//!
//! - a server is never READY while the value that decides it has been
//!   `drain` or `maint` for longer than [`GRACE`] of time the agent could see
//!   it, except within one `agent-inter` (plus slack) after a HAProxy reload;
//! - the value that decides is that of the first identity on the agent-send
//!   line that has a key, with one exception: a key whose value the agent
//!   cannot know is skipped, and the next identity decides; if no later
//!   identity has a key, there is no answer (HAProxy keeps its state, and a
//!   server may go READY only through a reload);
//! - a key's value is unknowable, until the key is written again, when the
//!   key is invalid and the agent knows none of its valid values in the
//!   key's current life: it started after the invalid write with no state
//!   file (lost or corrupt), or the valid value was written and replaced
//!   while it was away or blind. What an agent knows is what it or, through
//!   restarts that kept the state file, the agents before it saw. An invalid
//!   key with a known valid value answers that value. A key hidden from the
//!   token keeps the value the agent last saw (below); one the agent never
//!   saw because it was hidden, or because Consul lost it, is unknowable in
//!   the same way. This schedule restarts no agent while the token is
//!   narrowed, and its Consul keeps its data, so those two do not arise
//!   here: tests/served_state.rs covers them;
//! - while the token cannot read the whole prefix, or Consul is down, the
//!   agent serves its last copy;
//! - every server ends at its desired state and weight.
//!
//! The state directory is given to the agent in the environment
//! (`GITLAB_HAPROXY_AGENT_STATE_DIR`). Seeds run [`PARALLEL`] at a time
//! (`GHA_FAULT_PARALLEL`), each with its own ports and processes.
//!
//! The schedule is generated from the seed alone, so a seed replays the same
//! steps: `scripts/fault-schedule.sh --steps N SEED`. `GHA_FAULT_SEEDS` (seeds
//! separated by spaces or commas) and `GHA_FAULT_STEPS` (steps per schedule)
//! override the fixed CI set.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::schedule::{DurableConsul, Row, Sample, Sampler, StopSignal};
use support::{free_port, haproxy_config, wait_every, Agent, Haproxy, TempDir, PREFIX};

/// The management token of the schedule's Consul.
const MASTER: &str = "5b0e3c61-6a2d-4f1e-8c39-2f7d1e0a4b17";

/// `agent-inter` of every server, milliseconds.
const INTER_MS: u64 = 500;

/// How long a server may still be READY after its deciding value became
/// drain or maint and the agent could see it: the agent's next read (at
/// most `--min-query-interval`, 100 ms, after the write) plus HAProxy's next
/// agent-check (at most `agent-inter`), with room for a loaded machine.
const GRACE: f64 = 1.5;

/// After a HAProxy reload every server is READY until its first agent
/// answer, up to one `agent-inter` after the new worker starts
/// (docs/kv-contract.md, "HAProxy reloads"); this much more is allowed for the check itself.
const RELOAD_SLACK: f64 = 1.0;

/// A value current for this long while the agent could read Consul is in
/// the agent's copy (it reads within ~100 ms of a write).
const SEEN: f64 = 0.3;

/// The seeds CI runs, and their length. Together they have every fault
/// kind (`ci_seeds_cover_every_fault_kind`).
const CI_SEEDS: &[u64] = &[4, 7, 10, 45, 53, 1, 2, 3, 5, 6];
const CI_STEPS: usize = 60;

/// The pause after each step, milliseconds: drawn in this range.
const GAP_MS: (u64, u64) = (200, 600);

/// Schedules run at once (`GHA_FAULT_PARALLEL` overrides), each with its
/// own Consul, HAProxy, agent and ports.
const PARALLEL: usize = 3;

/// The enrolled servers: backend, server, agent-send identities in order.
const SERVERS: &[(&str, &str, &[&str])] = &[
    ("web", "web-01", &["web/web-01", "canary", "zone-a"]),
    ("web", "web-02", &["web/web-02", "zone-a"]),
    ("web", "web-03", &["web/web-03", "canary", "zone-b"]),
    ("web", "web-04", &["web/web-04", "zone-b"]),
    // A group first: `zone-b` decides before the row key.
    ("web", "web-05", &["zone-b", "web/web-05"]),
    ("api", "api-01", &["api/api-01", "canary", "zone-a"]),
    ("api", "api-02", &["api/api-02", "zone-b"]),
    ("api", "api-03", &["api/api-03"]),
];

const ROW_KEYS: &[&str] = &[
    "web/web-01",
    "web/web-02",
    "web/web-03",
    "web/web-04",
    "web/web-05",
    "api/api-01",
    "api/api-02",
    "api/api-03",
];
const GROUP_KEYS: &[&str] = &["canary", "zone-a", "zone-b"];
/// A key on no agent-send line, written only by [`Rig::policy_barrier`].
const NUDGE_KEY: &str = "barrier-nudge";

/// Valid values as operators write them (case and whitespace vary).
const VALID: &[&str] = &[
    "drain", "drain", "maint", "maint", "ready", "0%", "50%", "150%", "256%", "100%", " Drain ",
    "MAINT\n",
];
/// Values the contract refuses (docs/kv-contract.md, "Safety rules").
const INVALID: &[&str] = &[
    "mantenance",
    "drian",
    "50",
    "up",
    "drain maxconn:0",
    "",
    "+50%",
    "257%",
    "50.5%",
];

/// What a server should show: the value table of docs/kv-contract.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Desired {
    /// READY at this percentage of the configured weight (100).
    Ready(u16),
    Drain,
    Maint,
}

impl Desired {
    fn is_out(self) -> bool {
        matches!(self, Desired::Drain | Desired::Maint)
    }

    fn matches(self, row: &Row) -> bool {
        match self {
            Desired::Maint => row.admin & 0x01 != 0 && row.uweight == 100,
            Desired::Drain => row.admin & 0x09 == 0x08 && row.uweight == 100,
            Desired::Ready(pct) => row.is_ready() && row.uweight == u32::from(pct.min(256)),
        }
    }
}

/// The contract's grammar, written from the docs/kv-contract.md table (not the agent's
/// parser): case-insensitive, surrounding whitespace ignored.
fn parse(raw: &str) -> Option<Desired> {
    let v = raw.trim().to_ascii_lowercase();
    match v.as_str() {
        "ready" => Some(Desired::Ready(100)),
        "drain" => Some(Desired::Drain),
        "maint" => Some(Desired::Maint),
        _ => {
            let digits = v.strip_suffix('%')?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u16 = digits.parse().ok()?;
            (n <= 256).then_some(Desired::Ready(n))
        }
    }
}

/// A policy the schedule gives the agent's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Read on the whole prefix, as docs/kv-contract.md asks.
    Full,
    /// Read on `state/web/` only: Consul answers the recursive read with
    /// that folder, a filtered view of the prefix.
    WebOnly,
    /// Read on another prefix only: the prefix answers 404.
    Elsewhere,
    /// `key` where `key_prefix` was meant: the prefix answers 404.
    FolderKey,
}

impl Policy {
    fn rules(self) -> String {
        match self {
            Policy::Full => format!(r#"key_prefix "{PREFIX}" {{ policy = "read" }}"#),
            Policy::WebOnly => format!(r#"key_prefix "{PREFIX}web/" {{ policy = "read" }}"#),
            Policy::Elsewhere => r#"key_prefix "other/" { policy = "read" }"#.to_string(),
            Policy::FolderKey => format!(r#"key "{PREFIX}" {{ policy = "read" }}"#),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Policy::Full => "the whole prefix",
            Policy::WebOnly => "web/ only",
            Policy::Elsewhere => "another prefix only",
            Policy::FolderKey => "the folder key only",
        }
    }
}

/// What an agent restart does to the served-state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateFile {
    /// The same state directory, untouched: the new agent knows what the
    /// old one served.
    Kept,
    /// A new, empty state directory (a new host, a lost volume): no memory.
    Lost,
    /// The same directory with the file overwritten by garbage: unreadable,
    /// so no memory.
    Corrupt,
}

impl StateFile {
    fn name(self) -> &'static str {
        match self {
            StateFile::Kept => "state file kept",
            StateFile::Lost => "state file lost",
            StateFile::Corrupt => "state file corrupt",
        }
    }
}

/// One step of a schedule.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `PUT` one key (a valid or an invalid value).
    Put {
        key: &'static str,
        value: &'static str,
    },
    /// `DELETE` one key.
    Delete { key: &'static str },
    /// One Consul transaction: sets and deletes at one index.
    Txn {
        ops: Vec<(&'static str, Option<&'static str>)>,
    },
    /// Stop the agent, keep it down for `down_ms`, start it again with its
    /// state directory as `state` says.
    AgentRestart {
        signal: StopSignal,
        down_ms: u64,
        state: StateFile,
    },
    /// SIGUSR2 to HAProxy's master: a new worker from the config.
    HaproxyReload,
    /// Stop Consul, keep it down for `down_ms`, start it on the same data.
    ConsulRestart { signal: StopSignal, down_ms: u64 },
    /// Change the policy of the agent's token to one that reads less.
    Narrow(Policy),
    /// Give the token read on the whole prefix again.
    Restore,
    /// Nothing happens.
    Pause { ms: u64 },
}

impl Step {
    /// The fault kind, as violations and the coverage check name it.
    fn kind(&self) -> &'static str {
        match self {
            Step::Put { key, value } => match (is_group(key), parse(value).is_some()) {
                (false, true) => "row write",
                (true, true) => "group write",
                (false, false) => "invalid row value",
                (true, false) => "invalid group value",
            },
            Step::Delete { key } if is_group(key) => "group delete",
            Step::Delete { .. } => "row delete",
            Step::Txn { .. } => "transaction",
            Step::AgentRestart { signal, state, .. } => match (signal, state) {
                (StopSignal::Term, StateFile::Kept) => "agent SIGTERM + restart, state file kept",
                (StopSignal::Term, StateFile::Lost) => "agent SIGTERM + restart, state file lost",
                (StopSignal::Term, StateFile::Corrupt) => {
                    "agent SIGTERM + restart, state file corrupt"
                }
                (StopSignal::Kill, StateFile::Kept) => "agent SIGKILL + restart, state file kept",
                (StopSignal::Kill, StateFile::Lost) => "agent SIGKILL + restart, state file lost",
                (StopSignal::Kill, StateFile::Corrupt) => {
                    "agent SIGKILL + restart, state file corrupt"
                }
            },
            Step::HaproxyReload => "HAProxy reload",
            Step::ConsulRestart {
                signal: StopSignal::Term,
                ..
            } => "Consul SIGTERM + restart",
            Step::ConsulRestart {
                signal: StopSignal::Kill,
                ..
            } => "Consul SIGKILL + restart",
            Step::Narrow(Policy::WebOnly) => "token narrowed to web/",
            Step::Narrow(Policy::Elsewhere) => "token narrowed to another prefix",
            Step::Narrow(_) => "token narrowed to the folder key",
            Step::Restore => "token restored",
            Step::Pause { .. } => "pause",
        }
    }

    fn describe(&self) -> String {
        match self {
            Step::Put { key, value } => format!("put {key}={value:?}"),
            Step::Delete { key } => format!("delete {key}"),
            Step::Txn { ops } => {
                let ops: Vec<String> = ops
                    .iter()
                    .map(|(k, v)| match v {
                        Some(v) => format!("{k}={v:?}"),
                        None => format!("delete {k}"),
                    })
                    .collect();
                format!("txn [{}]", ops.join(", "))
            }
            Step::AgentRestart {
                signal,
                down_ms,
                state,
            } => {
                format!(
                    "agent {signal:?}, down {down_ms} ms, restart ({})",
                    state.name()
                )
            }
            Step::HaproxyReload => "HAProxy reload (USR2)".into(),
            Step::ConsulRestart { signal, down_ms } => {
                format!("Consul {signal:?}, down {down_ms} ms, restart with its data")
            }
            Step::Narrow(p) => format!("token policy narrowed to {}", p.name()),
            Step::Restore => "token policy restored to the whole prefix".into(),
            Step::Pause { ms } => format!("pause {ms} ms"),
        }
    }
}

fn is_group(key: &str) -> bool {
    !key.contains('/')
}

/// A step and the pause after it.
#[derive(Debug, Clone, PartialEq)]
struct Planned {
    step: Step,
    gap_ms: u64,
}

/// Fault families a schedule can leave out (`GHA_FAULT_WITHOUT`), to tell
/// which family a violation needs.
const FAMILIES: &[&str] = &[
    "invalid",
    "narrow",
    "agent-restart",
    "consul-restart",
    "reload",
];

/// The family of a step, if it can be left out.
fn family(step: &Step) -> Option<&'static str> {
    match step {
        Step::Put { value, .. } if parse(value).is_none() => Some("invalid"),
        Step::Txn { ops }
            if ops
                .iter()
                .any(|(_, v)| v.is_some_and(|v| parse(v).is_none())) =>
        {
            Some("invalid")
        }
        Step::Narrow(_) => Some("narrow"),
        Step::AgentRestart { .. } => Some("agent-restart"),
        Step::ConsulRestart { .. } => Some("consul-restart"),
        Step::HaproxyReload => Some("reload"),
        _ => None,
    }
}

/// The whole schedule for `seed`: `steps` steps (one more if the token is
/// still narrowed at the end), from the seed alone.
fn generate(seed: u64, steps: usize) -> Vec<Planned> {
    generate_without(seed, steps, &[])
}

/// [`generate`] with the steps of the families in `without` replaced by
/// valid writes (drawn after the step, so the result still depends only on
/// the seed, the length and `without`).
fn generate_without(seed: u64, steps: usize, without: &[&str]) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed);
    // The state file's fate at each agent restart comes from a stream of
    // its own, so the other steps of a seed are what they were before
    // restarts had a state file.
    let mut files = fastrand::Rng::with_seed(seed ^ 0x5157_a7e0_f11e_5eed);
    let mut kv: BTreeMap<&'static str, &'static str> = BTreeMap::new();
    let mut narrowed_for: Option<usize> = None;
    let mut plan = Vec::with_capacity(steps + 1);
    for _ in 0..steps {
        let step = match narrowed_for {
            Some(n) if n >= 4 || rng.u8(..100) < 25 => Step::Restore,
            Some(_) => match rng.u8(..100) {
                0..=64 => kv_step(&mut rng, &kv),
                65..=84 => Step::HaproxyReload,
                _ => Step::Pause {
                    ms: rng.u64(200..1500),
                },
            },
            None => match rng.u8(..100) {
                0..=45 => kv_step(&mut rng, &kv),
                46..=54 => Step::AgentRestart {
                    signal: if rng.bool() {
                        StopSignal::Term
                    } else {
                        StopSignal::Kill
                    },
                    down_ms: rng.u64(0..1500),
                    state: match files.u8(..100) {
                        0..=54 => StateFile::Kept,
                        55..=84 => StateFile::Lost,
                        _ => StateFile::Corrupt,
                    },
                },
                55..=68 => Step::HaproxyReload,
                69..=76 => Step::ConsulRestart {
                    signal: if rng.bool() {
                        StopSignal::Term
                    } else {
                        StopSignal::Kill
                    },
                    down_ms: rng.u64(0..1000),
                },
                77..=90 => Step::Narrow(match rng.u8(..4) {
                    0 | 1 => Policy::WebOnly,
                    2 => Policy::Elsewhere,
                    _ => Policy::FolderKey,
                }),
                _ => Step::Pause {
                    ms: rng.u64(200..1500),
                },
            },
        };
        let step = match family(&step) {
            Some(f) if without.contains(&f) => Step::Put {
                key: if rng.bool() {
                    ROW_KEYS[rng.usize(..ROW_KEYS.len())]
                } else {
                    GROUP_KEYS[rng.usize(..GROUP_KEYS.len())]
                },
                value: VALID[rng.usize(..VALID.len())],
            },
            _ => step,
        };
        narrowed_for = match (&step, narrowed_for) {
            (Step::Narrow(_), _) => Some(0),
            (Step::Restore, _) => None,
            (_, n) => n.map(|n| n + 1),
        };
        apply_to(&mut kv, &step);
        // Drawn as before, then mapped onto GAP_MS.
        let drawn = rng.u64(350..1000);
        plan.push(Planned {
            step,
            gap_ms: GAP_MS.0 + (drawn - 350) * (GAP_MS.1 - GAP_MS.0) / 650,
        });
    }
    if narrowed_for.is_some() {
        plan.push(Planned {
            step: Step::Restore,
            gap_ms: 500,
        });
    }
    plan
}

/// A write, delete, invalid value or transaction, chosen with the keys'
/// current values in mind so that invalid values often follow drains.
fn kv_step(rng: &mut fastrand::Rng, kv: &BTreeMap<&'static str, &'static str>) -> Step {
    let any_key = |rng: &mut fastrand::Rng| {
        if rng.u8(..100) < 60 {
            ROW_KEYS[rng.usize(..ROW_KEYS.len())]
        } else {
            GROUP_KEYS[rng.usize(..GROUP_KEYS.len())]
        }
    };
    let out: Vec<&'static str> = kv
        .iter()
        .filter(|(_, v)| parse(v).is_some_and(Desired::is_out))
        .map(|(k, _)| *k)
        .collect();
    let present: Vec<&'static str> = kv.keys().copied().collect();
    match rng.u8(..100) {
        0..=54 => Step::Put {
            key: any_key(rng),
            value: VALID[rng.usize(..VALID.len())],
        },
        55..=72 => Step::Put {
            key: if !out.is_empty() && rng.u8(..100) < 70 {
                out[rng.usize(..out.len())]
            } else {
                any_key(rng)
            },
            value: INVALID[rng.usize(..INVALID.len())],
        },
        73..=89 => Step::Delete {
            key: if !present.is_empty() && rng.u8(..100) < 80 {
                present[rng.usize(..present.len())]
            } else {
                any_key(rng)
            },
        },
        _ => {
            let mut ops: Vec<(&'static str, Option<&'static str>)> = Vec::new();
            for _ in 0..rng.usize(2..=4) {
                let key = any_key(rng);
                if ops.iter().any(|(k, _)| *k == key) {
                    continue;
                }
                let value = match rng.u8(..100) {
                    0..=64 => Some(VALID[rng.usize(..VALID.len())]),
                    65..=79 => Some(INVALID[rng.usize(..INVALID.len())]),
                    _ => None,
                };
                ops.push((key, value));
            }
            Step::Txn { ops }
        }
    }
}

/// The KV changes a step makes: (key, new value or `None` for a delete).
fn kv_changes(step: &Step) -> Vec<(&'static str, Option<&'static str>)> {
    match step {
        Step::Put { key, value } => vec![(*key, Some(*value))],
        Step::Delete { key } => vec![(*key, None)],
        Step::Txn { ops } => ops.clone(),
        _ => Vec::new(),
    }
}

fn apply_to(kv: &mut BTreeMap<&'static str, &'static str>, step: &Step) {
    for (k, v) in kv_changes(step) {
        match v {
            Some(v) => kv.insert(k, v),
            None => kv.remove(k),
        };
    }
}

/// A time interval in seconds since the schedule's start.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: f64,
    to: f64,
}

/// One KV change as it happened: sent at `b`, acknowledged at `a`.
#[derive(Debug, Clone)]
struct KvWrite {
    step: usize,
    b: f64,
    a: f64,
    key: &'static str,
    value: Option<&'static str>,
}

/// One agent process: synced (`/-/ready`) at `ready`, signalled at `stop`.
#[derive(Debug, Clone, Copy)]
struct Instance {
    ready: f64,
    stop: f64,
    /// Started with the state file the previous process left: it knows
    /// what that one served.
    remembers: bool,
}

/// A step as run.
#[derive(Debug, Clone)]
struct StepRun {
    index: usize,
    kind: &'static str,
    text: String,
    b: f64,
    a: f64,
    narrowed: Option<Policy>,
}

/// Everything the schedule did, with times.
#[derive(Debug, Default)]
struct Timeline {
    writes: Vec<KvWrite>,
    instances: Vec<Instance>,
    /// The agent was not running or not synced: HAProxy got no answers.
    absent: Vec<Window>,
    /// The agent could not read Consul (Consul down, token narrowed): it
    /// answers from its copy.
    blind: Vec<Window>,
    /// (x, y): at `y` the agent's copy held every write acknowledged by `x`.
    catchups: Vec<(f64, f64)>,
    /// HAProxy reloads: USR2 sent, new worker seen.
    reloads: Vec<Window>,
    steps: Vec<StepRun>,
    /// Barriers that timed out, and other findings made while running.
    findings: Vec<String>,
}

/// A finding: what, when, and the steps that led to it.
#[derive(Debug, Clone)]
struct Violation {
    at: f64,
    server: String,
    what: String,
    /// The kind of the step running (or last run) at `at`.
    step_kind: String,
    /// The faults (invalid values, restarts, reloads, token changes and
    /// writes while narrowed) from the start of the state judged to `at`.
    faults: String,
    context: String,
}

/// The components of one schedule.
struct Rig {
    epoch: Instant,
    consul: DurableConsul,
    haproxy: Haproxy,
    agent: Option<Agent>,
    agent_port: u16,
    http_port: u16,
    token_file: PathBuf,
    policy_id: String,
    /// The agent's state directory now; replaced by an empty one when a
    /// restart loses the file.
    state_dir: TempDir,
    logs: Vec<String>,
    _dir: TempDir,
}

impl Rig {
    fn start(epoch: Instant, timeline: &mut Timeline) -> Rig {
        let consul = DurableConsul::start(MASTER);
        let body = serde_json::json!({
            "Name": "fault-schedule-agent",
            "Rules": Policy::Full.rules(),
        });
        let policy = consul.request_json("PUT", "/v1/acl/policy", body.to_string().as_bytes());
        let policy_id = policy["ID"].as_str().unwrap().to_string();
        let token = consul.request_json(
            "PUT",
            "/v1/acl/token",
            br#"{"Description":"agent","Policies":[{"Name":"fault-schedule-agent"}]}"#,
        );
        let dir = TempDir::new("fault-schedule");
        let token_file = dir.path().join("consul-token");
        std::fs::write(&token_file, token["SecretID"].as_str().unwrap()).unwrap();

        let agent_port = free_port();
        let http_port = free_port();
        let mut backends = String::new();
        for backend in ["web", "api"] {
            writeln!(backends, "backend {backend}").unwrap();
            for (_, server, ids) in SERVERS.iter().filter(|(b, _, _)| *b == backend) {
                writeln!(
                    backends,
                    "    server {server} 127.0.0.1:1 weight 100 agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter {INTER_MS}ms agent-send \"{}\\n\"",
                    ids.join(" ")
                )
                .unwrap();
            }
            backends.push('\n');
        }
        let haproxy = Haproxy::start(&haproxy_config(&backends));
        let mut rig = Rig {
            epoch,
            consul,
            haproxy,
            agent: None,
            agent_port,
            http_port,
            token_file,
            policy_id,
            state_dir: TempDir::new("fault-schedule-state"),
            logs: Vec::new(),
            _dir: dir,
        };
        let spawn = rig.now();
        rig.spawn_agent();
        let ready = rig.now();
        timeline.instances.push(Instance {
            ready,
            stop: f64::INFINITY,
            remembers: false,
        });
        timeline.catchups.push((spawn, ready));
        rig
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Starts the agent on its ports with its state directory (given in
    /// the environment, `GITLAB_HAPROXY_AGENT_STATE_DIR`, as a settings
    /// file would) and waits (up to 20 s) until it is ready.
    fn spawn_agent(&mut self) {
        let agent = Agent::spawn_env(
            &self.consul.url(),
            self.agent_port,
            self.http_port,
            &[(
                "GITLAB_HAPROXY_AGENT_STATE_DIR",
                self.state_dir.path().to_str().unwrap(),
            )],
            &[
                "--consul-token-file",
                self.token_file.to_str().unwrap(),
                "--startup-timeout",
                "10s",
            ],
        );
        let ok = wait_every(Duration::from_secs(20), Duration::from_millis(25), || {
            (agent.http_get("/-/ready")?.0 == 200).then_some(())
        });
        assert!(ok.is_some(), "agent not ready:\n{}", agent.log());
        self.agent = Some(agent);
    }

    fn set_policy(&self, policy: Policy) {
        let body = serde_json::json!({
            "ID": self.policy_id,
            "Name": "fault-schedule-agent",
            "Rules": policy.rules(),
        });
        self.consul.request_json(
            "PUT",
            &format!("/v1/acl/policy/{}", self.policy_id),
            body.to_string().as_bytes(),
        );
    }

    /// The index of the copy the agent serves and whether its last Consul
    /// request failed (`/status`: `consul_index`, `last_error`).
    fn agent_sync(&self) -> Option<(u64, bool)> {
        let (_, body) = self.agent.as_ref()?.http_get("/status")?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some((v["consul_index"].as_u64()?, !v["last_error"].is_null()))
    }

    /// Waits (up to 30 s) until the agent's copy is at Consul's index of
    /// the prefix and its last Consul request succeeded (it is not backing
    /// off after an outage or a refusal): (x, y) with every write
    /// acknowledged by x in the copy at y. `Err` says how it stayed behind.
    fn barrier(&self) -> Result<(f64, f64), String> {
        let x = self.now();
        let want = self.consul.prefix_index(PREFIX);
        let caught_up = wait_every(Duration::from_secs(30), Duration::from_millis(25), || {
            let (index, failing) = self.agent_sync()?;
            (index >= want && !failing).then_some(())
        });
        match caught_up {
            Some(()) => Ok((x, self.now())),
            None => Err(format!(
                "the agent did not catch up within 30 s: (copy index, last request failed) {:?}, Consul's prefix is at {want}",
                self.agent_sync()
            )),
        }
    }

    /// A barrier after a policy change. A blocking query parked before the
    /// change keeps the policy it started with, and a policy change moves
    /// neither Consul's index nor the agent's `last_error`, so
    /// [`Rig::barrier`] alone passes at once while the agent still reads
    /// under the old policy (seed 4: parked under web/ only 0.2 s before the
    /// restore, it stayed parked until after the next narrowing). Two writes
    /// to [`NUDGE_KEY`], each waited for: the first ends the parked query;
    /// an answer at the second's index comes from a read sent after that,
    /// under the policy in force, and shows every key it allows.
    fn policy_barrier(&self) -> Result<(f64, f64), String> {
        let x = self.now();
        for value in ["ready", "100%"] {
            self.kv_write(NUDGE_KEY, Some(value));
            self.barrier()?;
        }
        Ok((x, self.now()))
    }

    fn kv_write(&self, key: &str, value: Option<&str>) {
        let path = format!("/v1/kv/{PREFIX}{key}");
        let (status, _, body) = match value {
            Some(v) => self.consul.request("PUT", &path, v.as_bytes()),
            None => self.consul.request("DELETE", &path, b""),
        };
        assert_eq!(
            (status, body.trim_ascii()),
            (200, &b"true"[..]),
            "{key}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    fn txn(&self, ops: &[(&'static str, Option<&'static str>)]) {
        use base64::Engine as _;
        let ops: Vec<serde_json::Value> = ops
            .iter()
            .map(|(k, v)| match v {
                Some(v) => serde_json::json!({"KV": {
                    "Verb": "set",
                    "Key": format!("{PREFIX}{k}"),
                    "Value": base64::engine::general_purpose::STANDARD.encode(v),
                }}),
                None => {
                    serde_json::json!({"KV": {"Verb": "delete", "Key": format!("{PREFIX}{k}")}})
                }
            })
            .collect();
        let body = serde_json::Value::Array(ops).to_string();
        let (status, _, answer) = self.consul.request("PUT", "/v1/txn", body.as_bytes());
        assert_eq!(status, 200, "txn: {}", String::from_utf8_lossy(&answer));
    }

    /// Runs one step and records what happened in `timeline`.
    fn run(
        &mut self,
        index: usize,
        step: &Step,
        narrowed: &mut Option<(Policy, f64)>,
        timeline: &mut Timeline,
    ) {
        let b = self.now();
        match step {
            Step::Put { .. } | Step::Delete { .. } | Step::Txn { .. } => {
                let changes = kv_changes(step);
                match step {
                    Step::Txn { ops } => self.txn(ops),
                    _ => self.kv_write(changes[0].0, changes[0].1),
                }
                let a = self.now();
                for (key, value) in changes {
                    timeline.writes.push(KvWrite {
                        step: index,
                        b,
                        a,
                        key,
                        value,
                    });
                }
            }
            Step::AgentRestart {
                signal,
                down_ms,
                state,
            } => {
                let mut agent = self.agent.take().expect("agent running");
                match signal {
                    StopSignal::Term => {
                        if agent.terminate().is_none() {
                            timeline.findings.push(format!(
                                "step #{index}: the agent did not exit within 10 s of SIGTERM"
                            ));
                        }
                    }
                    StopSignal::Kill => agent.proc().kill(),
                }
                self.logs.push(agent.log());
                drop(agent);
                if let Some(last) = timeline.instances.last_mut() {
                    last.stop = b;
                }
                match state {
                    StateFile::Kept => {}
                    StateFile::Lost => self.state_dir = TempDir::new("fault-schedule-state"),
                    StateFile::Corrupt => corrupt_files(self.state_dir.path()),
                }
                std::thread::sleep(Duration::from_millis(*down_ms));
                let spawn = self.now();
                self.spawn_agent();
                let ready = self.now();
                timeline.instances.push(Instance {
                    ready,
                    stop: f64::INFINITY,
                    remembers: *state == StateFile::Kept,
                });
                timeline.catchups.push((spawn, ready));
                let y = self.catch_up(index, timeline);
                timeline.absent.push(Window { from: b, to: y });
            }
            Step::HaproxyReload => {
                self.haproxy.reload();
                timeline.reloads.push(Window {
                    from: b,
                    to: self.now(),
                });
            }
            Step::ConsulRestart { signal, down_ms } => {
                self.consul
                    .restart(*signal, Duration::from_millis(*down_ms));
                let y = self.catch_up(index, timeline);
                timeline.blind.push(Window { from: b, to: y });
            }
            Step::Narrow(policy) => {
                self.set_policy(*policy);
                *narrowed = Some((*policy, b));
            }
            Step::Restore => {
                self.set_policy(Policy::Full);
                let y = match self.policy_barrier() {
                    Ok((x, y)) => {
                        timeline.catchups.push((x, y));
                        y
                    }
                    Err(e) => {
                        timeline.findings.push(format!("after step #{index}: {e}"));
                        self.now()
                    }
                };
                if let Some((_, from)) = narrowed.take() {
                    timeline.blind.push(Window { from, to: y });
                }
            }
            Step::Pause { ms } => std::thread::sleep(Duration::from_millis(*ms)),
        }
        timeline.steps.push(StepRun {
            index,
            kind: step.kind(),
            text: step.describe(),
            b,
            a: self.now(),
            narrowed: narrowed.map(|(p, _)| p),
        });
    }

    /// A barrier whose failure is a finding; returns when it ended.
    fn catch_up(&self, index: usize, timeline: &mut Timeline) -> f64 {
        match self.barrier() {
            Ok((x, y)) => {
                timeline.catchups.push((x, y));
                y
            }
            Err(e) => {
                timeline.findings.push(format!("after step #{index}: {e}"));
                self.now()
            }
        }
    }

    fn agent_log(&self) -> String {
        let mut all = self.logs.join("\n--- agent restarted ---\n");
        if let Some(agent) = &self.agent {
            all.push_str("\n--- current agent ---\n");
            all.push_str(&agent.log());
        }
        all
    }
}

/// Overwrites every file in `dir` with bytes no state file can be (and
/// writes `served-state.json` so if there was none).
fn corrupt_files(dir: &std::path::Path) {
    let garbage = b"{\"served\": [not json\x00\xff";
    let mut any = false;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::write(entry.path(), garbage).unwrap();
            any = true;
        }
    }
    if !any {
        std::fs::write(dir.join("served-state.json"), garbage).unwrap();
    }
}

/// The answers the running agent may give for a server at one moment:
/// `Some(state)`, or `None` for no answer.
type Candidates = BTreeSet<Option<Desired>>;

/// How a server's possible answers constrain HAProxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Every possible answer is drain or maint: must not be READY.
    Out,
    /// No answer, or drain/maint: HAProxy keeps its state; READY only
    /// through a reload.
    Frozen,
    /// Some possible answer is ready: no constraint while running.
    Free,
}

fn classify(c: &Candidates) -> Class {
    if c.iter().all(|d| d.is_some_and(Desired::is_out)) {
        Class::Out
    } else if c.iter().all(|d| d.is_none_or(Desired::is_out)) {
        Class::Frozen
    } else {
        Class::Free
    }
}

/// A run of READY samples while the server had to be out.
struct Stretch {
    first: f64,
    last: f64,
    row: Row,
    /// The last sample before `first` that showed the server out, if any
    /// did since it had to be.
    last_good: Option<f64>,
    /// What decided the server at `first`.
    why: String,
}

/// The model: what the contract says the agent answers, from the recorded
/// timeline.
struct Model<'a> {
    t: &'a Timeline,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Seen {
    Yes,
    Maybe,
    No,
}

impl Model<'_> {
    /// The agent instance running (or being restarted into) at `at`, and
    /// the ones before it whose memory it has through kept state files:
    /// the agents whose copies add up to what it knows.
    fn memory(&self, at: f64) -> Option<Vec<&Instance>> {
        let i = self
            .t
            .instances
            .iter()
            .rposition(|i| i.ready <= at && at < i.stop)?;
        let mut out = vec![&self.t.instances[i]];
        let mut j = i;
        while j > 0 && self.t.instances[j].remembers {
            j -= 1;
            out.push(&self.t.instances[j]);
        }
        Some(out)
    }

    /// Whether one of `memory` held a value current from `from` to `to` in
    /// its copy.
    fn seen(&self, memory: &[&Instance], from: f64, to: f64) -> Seen {
        let mut visible = 0.0;
        // Time the instance ran, blind or not: a token narrowed to web/
        // still shows web/ keys, and an agent that holds none outside it
        // applies such answers, so a value current only while blind may
        // have been seen all the same.
        let mut running = 0.0;
        for inst in memory {
            if self
                .t
                .catchups
                .iter()
                .any(|&(x, y)| y >= inst.ready && y <= inst.stop && from <= x && to >= y)
            {
                return Seen::Yes;
            }
            // Time within [from, to] the instance was synced and could read.
            let lo = from.max(inst.ready);
            let hi = to.min(inst.stop);
            if hi <= lo {
                continue;
            }
            visible += hi - lo;
            running += hi - lo;
            for w in &self.t.blind {
                let (l, h) = (w.from.max(lo), w.to.min(hi));
                if h > l {
                    visible -= h - l;
                }
            }
        }
        if visible >= SEEN {
            Seen::Yes
        } else if visible > 0.0 || running > 0.0 {
            Seen::Maybe
        } else {
            Seen::No
        }
    }

    /// The possible held values of a key whose value, after write `upto`
    /// (index into `writes`), is invalid: its last valid value in the key's
    /// current life that the agent running at `at` knows (itself or through
    /// kept state files), and `true` if it may know none (the key is then
    /// unknowable, and skipped, until written again).
    fn hold(&self, key: &str, upto: usize, memory: &[&Instance]) -> (BTreeSet<Desired>, bool) {
        let mut out = BTreeSet::new();
        let history: Vec<&KvWrite> = self.t.writes[..=upto]
            .iter()
            .filter(|w| w.key == key)
            .collect();
        let life = history
            .iter()
            .rposition(|w| w.value.is_none())
            .map_or(0, |p| p + 1);
        for i in (life..history.len().saturating_sub(1)).rev() {
            let Some(v) = history[i].value.and_then(parse) else {
                continue;
            };
            match self.seen(memory, history[i].a, history[i + 1].b) {
                Seen::Yes => {
                    out.insert(v);
                    return (out, false);
                }
                Seen::Maybe => {
                    out.insert(v);
                }
                Seen::No => {}
            }
        }
        (out, true)
    }

    /// The possible answers for `ids` with the KV as after write `upto`
    /// (`None`: before any write), at `at`, and what decides them.
    fn answers(
        &self,
        ids: &[&str],
        kv: &BTreeMap<&'static str, (Option<&'static str>, usize)>,
        at: f64,
    ) -> (Candidates, String) {
        self.answers_from(ids, kv, self.memory(at).as_deref(), false)
    }

    /// [`Model::answers`] for the identities `ids` with what the agent
    /// knows (`None`: no agent runs), the ones before them skipped
    /// (`skipped`: an invalid key with no value known came first, so no key
    /// at all means no answer, not ready).
    fn answers_from(
        &self,
        ids: &[&str],
        kv: &BTreeMap<&'static str, (Option<&'static str>, usize)>,
        memory: Option<&[&Instance]>,
        skipped: bool,
    ) -> (Candidates, String) {
        for (n, id) in ids.iter().enumerate() {
            let Some(&(Some(raw), upto)) = kv.get(id) else {
                continue;
            };
            let Some(d) = parse(raw) else {
                let Some(memory) = memory else {
                    return (
                        Candidates::from([None]),
                        format!("{id}={raw:?} (invalid; no agent)"),
                    );
                };
                let (held, unknowable) = self.hold(id, upto, memory);
                let mut out: Candidates = held.iter().map(|d| Some(*d)).collect();
                let mut shown: Vec<String> = held.iter().map(|d| format!("{d:?}")).collect();
                if unknowable {
                    let (rest, why) = self.answers_from(&ids[n + 1..], kv, Some(memory), true);
                    out.extend(rest);
                    shown.push(format!("skipped for {why}"));
                }
                return (
                    out,
                    format!("{id}={raw:?} (invalid; held: {})", shown.join(" or ")),
                );
            };
            return (Candidates::from([Some(d)]), format!("{id}={raw:?}"));
        }
        if skipped {
            (Candidates::from([None]), "no later key: no answer".into())
        } else {
            (
                Candidates::from([Some(Desired::Ready(100))]),
                "no key".into(),
            )
        }
    }

    /// A server's answers over time: (b, a, candidates, what decides, the
    /// step that made it so), one entry per KV write and agent start.
    fn segments(&self, ids: &[&str]) -> Vec<(f64, f64, Candidates, String, Option<usize>)> {
        enum Ev {
            Write(usize),
            Start(f64),
        }
        let mut events: Vec<(f64, Ev)> = self
            .t
            .writes
            .iter()
            .enumerate()
            .map(|(i, w)| (w.b, Ev::Write(i)))
            .collect();
        events.extend(
            self.t
                .instances
                .iter()
                .skip(1)
                .map(|i| (i.ready, Ev::Start(i.ready))),
        );
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut kv: BTreeMap<&'static str, (Option<&'static str>, usize)> = BTreeMap::new();
        let (c, why) = self.answers(ids, &kv, 0.0);
        let mut out = vec![(0.0, 0.0, c, why, None)];
        for (_, ev) in events {
            let (b, a, step) = match ev {
                Ev::Write(i) => {
                    let w = &self.t.writes[i];
                    match w.value {
                        Some(_) => kv.insert(w.key, (w.value, i)),
                        None => kv.remove(w.key),
                    };
                    (w.b, w.a, Some(w.step))
                }
                Ev::Start(at) => (at, at, None),
            };
            let (c, why) = self.answers(ids, &kv, a);
            out.push((b, a, c, why, step));
        }
        out
    }

    /// When a drain that became current at `a` must show: [`GRACE`] after
    /// the agent could see it, later if the agent was away or could not
    /// read Consul before it had it.
    fn enforced_from(&self, a: f64) -> f64 {
        let mut t = a + GRACE;
        loop {
            let mut next = t;
            for w in &self.t.absent {
                if w.from < t && w.to > a {
                    next = next.max(w.to + GRACE);
                }
            }
            for w in &self.t.blind {
                if w.from < a + SEEN && w.to > a {
                    next = next.max(w.to + GRACE);
                }
            }
            if next == t {
                return t;
            }
            t = next;
        }
    }

    /// Whether `[from, to]` meets the time after a HAProxy reload in which
    /// a server is READY until its first agent answer: one `agent-inter`
    /// (plus slack) after the new worker, or, if the agent stopped before
    /// HAProxy could ask it, until as long after the agent is back.
    fn in_reload_window(&self, from: f64, to: f64) -> bool {
        let extra = INTER_MS as f64 / 1000.0 + RELOAD_SLACK;
        self.t.reloads.iter().any(|w| {
            let mut end = w.to + extra;
            for a in &self.t.absent {
                if a.from <= end && a.to >= w.from {
                    end = end.max(a.to + extra);
                }
            }
            w.from <= to && end >= from
        })
    }

    fn step_at(&self, at: f64) -> Option<&StepRun> {
        self.t.steps.iter().rev().find(|s| s.b <= at)
    }

    /// The step running at `at` and the four before it, with times.
    fn context(&self, at: f64) -> String {
        let Some(cur) = self.step_at(at) else {
            return "before the first step".into();
        };
        let first = cur.index.saturating_sub(4);
        let mut out = String::new();
        for s in &self.t.steps[first..=cur.index] {
            let narrowed = s
                .narrowed
                .map(|p| format!(" [token: {}]", p.name()))
                .unwrap_or_default();
            writeln!(
                out,
                "      #{:<3} {:6.2}-{:6.2}s {:<28} {}{narrowed}",
                s.index, s.b, s.a, s.kind, s.text
            )
            .unwrap();
        }
        out
    }

    /// The fault steps that started in `[from, to]`, in order: everything
    /// but plain writes and pauses, and writes made while the token was
    /// narrowed.
    /// If none did, the last three fault steps before `to`, marked as
    /// earlier.
    fn faults_between(&self, from: f64, to: f64) -> String {
        let within = self.fault_labels(from, to);
        if !within.is_empty() {
            return within.join(" -> ");
        }
        let earlier = self.fault_labels(f64::NEG_INFINITY, to);
        if earlier.is_empty() {
            return "no fault step".into();
        }
        let tail = &earlier[earlier.len().saturating_sub(3)..];
        format!("none since it was last out; earlier: {}", tail.join(" -> "))
    }

    fn fault_labels(&self, from: f64, to: f64) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.t.steps.iter().filter(|s| s.a >= from && s.b <= to) {
            let kv = matches!(
                s.kind,
                "row write"
                    | "group write"
                    | "row delete"
                    | "group delete"
                    | "transaction"
                    | "invalid row value"
                    | "invalid group value"
            );
            let plain = kv && !s.kind.starts_with("invalid");
            let label = match s.narrowed {
                Some(p) if kv => format!("{} while token reads {}", s.kind, p.name()),
                _ if plain || s.kind == "pause" => continue,
                _ => s.kind.to_string(),
            };
            if out.last() != Some(&label) {
                out.push(label);
            }
        }
        out
    }

    fn step_kind(&self, at: f64) -> String {
        match self.step_at(at) {
            Some(s) => match s.narrowed {
                Some(p) if !matches!(s.kind, "token restored") => {
                    format!("{} while token reads {}", s.kind, p.name())
                }
                _ => s.kind.to_string(),
            },
            None => "start".into(),
        }
    }

    /// Judges every sample; returns the violations (one per server per
    /// stretch of bad samples).
    fn judge(&self, samples: &[Sample]) -> Vec<Violation> {
        let mut out = Vec::new();
        for (backend, server, ids) in SERVERS {
            let name = format!("{backend}/{server}");
            let segs = self.segments(ids);
            for (i, (_, a, c, why, step)) in segs.iter().enumerate() {
                let end = segs.get(i + 1).map_or(f64::INFINITY, |s| s.0);
                match classify(c) {
                    Class::Out => {
                        // A stretch of Out segments starts at the first one.
                        if i > 0 && classify(&segs[i - 1].2) == Class::Out {
                            continue;
                        }
                        let run_end = segs[i + 1..]
                            .iter()
                            .find(|s| classify(&s.2) != Class::Out)
                            .map_or(f64::INFINITY, |s| s.0);
                        let from = self.enforced_from(*a);
                        // The segment current at a time, for what decides.
                        let why_at = |at: f64| {
                            segs.iter()
                                .rev()
                                .find(|s| s.0 <= at)
                                .map_or(why.as_str(), |s| s.3.as_str())
                        };
                        let mut last_good = None;
                        let mut bad: Option<Stretch> = None;
                        for s in samples.iter().filter(|s| {
                            let at = s.at.as_secs_f64();
                            at >= *a && at < run_end
                        }) {
                            let at = s.at.as_secs_f64();
                            let Some(row) = s.rows.get(&name) else {
                                continue;
                            };
                            if !row.is_ready() {
                                last_good = Some(at);
                                if let Some(found) = bad.take() {
                                    out.push(self.out_violation(&name, found, *a, from, *step));
                                }
                            } else if at >= from && !self.in_reload_window(at, at) {
                                match &mut bad {
                                    Some(b) => b.last = at,
                                    None => {
                                        bad = Some(Stretch {
                                            first: at,
                                            last: at,
                                            row: *row,
                                            last_good,
                                            why: why_at(at).to_string(),
                                        })
                                    }
                                }
                            }
                        }
                        if let Some(found) = bad {
                            out.push(self.out_violation(&name, found, *a, from, *step));
                        }
                    }
                    Class::Frozen => {
                        let from = self.enforced_from(*a);
                        let window: Vec<&Sample> = samples
                            .iter()
                            .filter(|s| {
                                let at = s.at.as_secs_f64();
                                at >= from && at < end
                            })
                            .collect();
                        for pair in window.windows(2) {
                            let (p, q) = (pair[0], pair[1]);
                            let (Some(rp), Some(rq)) = (p.rows.get(&name), q.rows.get(&name))
                            else {
                                continue;
                            };
                            let (tp, tq) = (p.at.as_secs_f64(), q.at.as_secs_f64());
                            if !rp.is_ready() && rq.is_ready() && !self.in_reload_window(tp, tq) {
                                out.push(Violation {
                                    at: tq,
                                    server: name.clone(),
                                    what: format!(
                                        "went from {} to READY at {tq:.2}s with no reload, while {why} allows no answer",
                                        rp.describe()
                                    ),
                                    step_kind: self.step_kind(tq),
                                    faults: self.faults_between(
                                        a.max(tp - GRACE - INTER_MS as f64 / 1000.0),
                                        tq,
                                    ),
                                    context: self.context(tq),
                                });
                                break;
                            }
                        }
                    }
                    Class::Free => {}
                }
            }
        }
        out
    }

    fn out_violation(
        &self,
        name: &str,
        bad: Stretch,
        since: f64,
        from: f64,
        step: Option<usize>,
    ) -> Violation {
        let by = step.map_or("an agent restart".into(), |s| format!("step #{s}"));
        let Stretch {
            first,
            last,
            row,
            last_good,
            why,
        } = bad;
        // What happened since HAProxy last had the server out, with time
        // for the agent and HAProxy to act on a step just before that.
        let window = last_good.map_or(since, |g| since.max(g - GRACE - INTER_MS as f64 / 1000.0));
        let seen_out = last_good.map_or("HAProxy never had it out".into(), |g| {
            format!("last seen out at {g:.2}s")
        });
        Violation {
            at: first,
            server: name.to_string(),
            what: format!(
                "{} from {first:.2}s to {last:.2}s while {why} decides it (out since {since:.2}s by {by}, enforced from {from:.2}s, {seen_out})",
                row.describe()
            ),
            step_kind: self.step_kind(first),
            faults: self.faults_between(window, first),
            context: self.context(first),
        }
    }

    /// The single answer each server must end with, if the model knows it.
    fn final_desired(&self) -> Vec<(String, Option<Desired>, String, f64)> {
        SERVERS
            .iter()
            .map(|(backend, server, ids)| {
                let segs = self.segments(ids);
                let (_, _, c, why, _) = segs.last().cloned().unwrap();
                // The state has held since the first of the last segments
                // with these answers.
                let since = segs
                    .iter()
                    .rev()
                    .take_while(|s| s.2 == c)
                    .last()
                    .map_or(0.0, |s| s.1);
                let single = match c.iter().collect::<Vec<_>>().as_slice() {
                    [Some(d)] => Some(*d),
                    _ => None,
                };
                (format!("{backend}/{server}"), single, why, since)
            })
            .collect()
    }
}

/// What one schedule did.
struct Outcome {
    steps: usize,
    samples: usize,
    failed_reads: u64,
    skipped_end_checks: usize,
    violations: Vec<Violation>,
    seconds: f64,
    agent_log: String,
}

/// Runs the schedule of `seed` and judges it.
fn run_schedule(seed: u64, steps: usize, without: &[&str]) -> Outcome {
    let plan = generate_without(seed, steps, without);
    let started = Instant::now();
    let epoch = Instant::now();
    let mut timeline = Timeline::default();
    let mut rig = Rig::start(epoch, &mut timeline);
    let sampler = Sampler::start(rig.haproxy.socket(), epoch, Duration::from_millis(100));
    // Let every server get its first answer.
    std::thread::sleep(Duration::from_millis(2 * INTER_MS));

    let mut narrowed = None;
    let mut stopped_early = None;
    for (index, planned) in plan.iter().enumerate() {
        rig.run(index, &planned.step, &mut narrowed, &mut timeline);
        if let Some(status) = rig.agent.as_mut().and_then(|a| a.proc().try_wait()) {
            stopped_early = Some(format!(
                "the agent exited ({status}) after step #{index} {}",
                planned.step.describe()
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(planned.gap_ms));
    }
    if let Some(end) = timeline.instances.last_mut() {
        end.stop = f64::INFINITY;
    }

    // The end: every server at its desired state and weight.
    let model_now = Model { t: &timeline };
    let desired = model_now.final_desired();
    let wait_end = Duration::from_secs_f64(GRACE + 2.0 * INTER_MS as f64 / 1000.0 + 2.0);
    let settled = wait_every(wait_end, Duration::from_millis(100), || {
        let rows = rig.haproxy.servers_state();
        desired
            .iter()
            .all(|(name, d, _, _)| {
                let (b, s) = name.split_once('/').unwrap();
                d.is_none_or(|d| {
                    let r = &rows[&(b.to_string(), s.to_string())];
                    d.matches(&Row {
                        admin: r.admin_state,
                        uweight: r.uweight,
                    })
                })
            })
            .then_some(())
    });
    let end_rows = rig.haproxy.servers_state();
    let end_at = rig.now();
    let (samples, failed_reads) = sampler.finish();

    let model = Model { t: &timeline };
    let mut violations = model.judge(&samples);
    if settled.is_none() {
        for (name, d, why, since) in &desired {
            let (b, s) = name.split_once('/').unwrap();
            let r = &end_rows[&(b.to_string(), s.to_string())];
            let row = Row {
                admin: r.admin_state,
                uweight: r.uweight,
            };
            if let Some(d) = d.filter(|d| !d.matches(&row)) {
                violations.push(Violation {
                    at: end_at,
                    server: name.clone(),
                    what: format!(
                        "ended at {} instead of {d:?} ({why}) after {wait_end:?}",
                        row.describe()
                    ),
                    step_kind: "end of schedule".into(),
                    faults: model.faults_between(*since, end_at),
                    context: model.context(end_at),
                });
            }
        }
    }
    for finding in timeline.findings.iter().chain(stopped_early.iter()) {
        violations.push(Violation {
            at: end_at,
            server: "-".into(),
            what: finding.clone(),
            step_kind: "harness barrier".into(),
            faults: String::new(),
            context: String::new(),
        });
    }
    violations.sort_by(|a, b| a.at.total_cmp(&b.at));
    Outcome {
        steps: timeline.steps.len(),
        samples: samples.len(),
        failed_reads,
        skipped_end_checks: desired.iter().filter(|(_, d, _, _)| d.is_none()).count(),
        violations,
        seconds: started.elapsed().as_secs_f64(),
        agent_log: rig.agent_log(),
    }
}

/// The fault families named in a violation's list of faults.
fn families_in(faults: &str) -> Vec<&'static str> {
    [
        ("token narrowed", "token narrowed/restored"),
        ("while token reads", "token narrowed/restored"),
        ("token restored", "token narrowed/restored"),
        ("invalid", "invalid value"),
        ("HAProxy reload", "HAProxy reload"),
        ("agent SIG", "agent restart"),
        ("Consul SIG", "Consul restart"),
    ]
    .into_iter()
    .filter(|(needle, _)| faults.contains(needle))
    .map(|(_, family)| family)
    .collect()
}

/// Prints a line to stderr past the test harness's capture (the macros
/// are captured, a write to the stream is not), so CI logs show the
/// figures of a passing run too.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// The fault families to leave out: `GHA_FAULT_WITHOUT`, comma-separated.
fn without() -> Vec<&'static str> {
    let Ok(list) = std::env::var("GHA_FAULT_WITHOUT") else {
        return Vec::new();
    };
    list.split(',')
        .filter(|f| !f.is_empty())
        .map(|f| {
            *FAMILIES
                .iter()
                .find(|k| **k == f)
                .unwrap_or_else(|| panic!("GHA_FAULT_WITHOUT: {f:?} is not one of {FAMILIES:?}"))
        })
        .collect()
}

/// How many schedules run at once: `GHA_FAULT_PARALLEL`, else [`PARALLEL`].
fn parallel() -> usize {
    std::env::var("GHA_FAULT_PARALLEL")
        .ok()
        .map(|s| s.parse().expect("GHA_FAULT_PARALLEL: an integer"))
        .unwrap_or(PARALLEL)
        .max(1)
}

/// Runs the schedule of every seed, `parallel` at a time; the outcomes in
/// the order of `seeds`, a harness panic as its message.
fn run_all(
    seeds: &[u64],
    steps: usize,
    without: &[&'static str],
    parallel: usize,
) -> Vec<(u64, Result<Outcome, String>)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..parallel.min(seeds.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(&seed) = seeds.get(i) else { break };
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    run_schedule(seed, steps, without)
                }))
                .map_err(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                });
                done.lock().unwrap().push((i, seed, outcome));
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|(i, _, _)| *i);
    done.into_iter().map(|(_, seed, o)| (seed, o)).collect()
}

fn seeds_and_steps() -> (Vec<u64>, usize) {
    let seeds = std::env::var("GHA_FAULT_SEEDS")
        .ok()
        .map(|s| {
            s.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().expect("GHA_FAULT_SEEDS: seeds are integers"))
                .collect()
        })
        .unwrap_or_else(|| CI_SEEDS.to_vec());
    let steps = std::env::var("GHA_FAULT_STEPS")
        .ok()
        .map(|s| s.parse().expect("GHA_FAULT_STEPS: an integer"))
        .unwrap_or(CI_STEPS);
    (seeds, steps)
}

/// The CI seeds exercise every fault kind, so a narrowed CI set cannot
/// quietly stop testing one.
#[test]
fn ci_seeds_cover_every_fault_kind() {
    let kinds: BTreeSet<&str> = CI_SEEDS
        .iter()
        .flat_map(|&s| generate(s, CI_STEPS))
        .map(|p| p.step.kind())
        .collect();
    for want in [
        "row write",
        "group write",
        "invalid row value",
        "invalid group value",
        "row delete",
        "group delete",
        "transaction",
        "HAProxy reload",
        "Consul SIGTERM + restart",
        "Consul SIGKILL + restart",
        "token narrowed to web/",
        "token narrowed to another prefix",
        "token narrowed to the folder key",
        "token restored",
    ] {
        assert!(kinds.contains(want), "no CI seed has a {want:?} step");
    }
    // Agent restarts by either signal, keeping, losing and corrupting the
    // state file (not every pairing).
    for want in [
        "agent SIGTERM + restart",
        "agent SIGKILL + restart",
        "state file kept",
        "state file lost",
        "state file corrupt",
    ] {
        assert!(
            kinds.iter().any(|k| k.contains(want)),
            "no CI seed has a {want:?} step"
        );
    }
    // The same seed gives the same schedule.
    assert_eq!(generate(7, 40), generate(7, 40));
    assert_ne!(generate(7, 40), generate(8, 40));
    // Leaving a family out leaves none of its steps.
    for f in FAMILIES {
        assert!(CI_SEEDS
            .iter()
            .flat_map(|&s| generate_without(s, CI_STEPS, &[f]))
            .all(|p| family(&p.step) != Some(f)));
    }
}

#[test]
fn drained_servers_stay_out_under_a_seeded_fault_schedule() {
    let (seeds, steps) = seeds_and_steps();
    let without = without();
    let replay = if without.is_empty() {
        format!("--steps {steps}")
    } else {
        format!("--steps {steps} --without {}", without.join(","))
    };
    let (mut total_steps, mut total_samples, mut total_violations) = (0, 0, 0);
    let mut schedule_seconds = 0.0;
    let mut failed: Vec<(u64, String)> = Vec::new();
    let started = Instant::now();
    let parallel = parallel();
    for (seed, outcome) in run_all(&seeds, steps, &without, parallel) {
        let outcome = match outcome {
            Ok(o) => o,
            Err(msg) => {
                say!("seed {seed}: the harness failed: {msg}");
                failed.push((seed, "harness failure".into()));
                total_violations += 1;
                continue;
            }
        };
        total_steps += outcome.steps;
        total_samples += outcome.samples;
        schedule_seconds += outcome.seconds;
        total_violations += outcome.violations.len();
        say!(
            "seed {seed}: {} steps, {} samples ({} failed reads), {} violations, {} servers with no single end state, {:.1} s",
            outcome.steps,
            outcome.samples,
            outcome.failed_reads,
            outcome.violations.len(),
            outcome.skipped_end_checks,
            outcome.seconds
        );
        for v in &outcome.violations {
            say!(
                "  VIOLATION seed {seed} [{}] {} at {:.2}s: {}\n    faults: {}\n    steps up to then:\n{}",
                v.step_kind, v.server, v.at, v.what, v.faults, v.context
            );
        }
        if !outcome.violations.is_empty() {
            let families: BTreeSet<&str> = outcome
                .violations
                .iter()
                .flat_map(|v| families_in(&v.faults))
                .collect();
            failed.push((
                seed,
                format!(
                    "{} violations; faults involved: {}",
                    outcome.violations.len(),
                    families.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
            if std::env::var_os("GHA_FAULT_AGENT_LOG").is_some() {
                say!("  agent log for seed {seed}:\n{}", outcome.agent_log);
            }
        }
    }
    say!(
        "{} schedules, {total_steps} steps, {total_samples} samples, {total_violations} violations",
        seeds.len()
    );
    say!(
        "{:.2} s per step within a schedule (start and end included); {:.1} s in all, {parallel} at a time",
        schedule_seconds / total_steps.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    for (seed, kinds) in &failed {
        say!("FAILED seed {seed} ({kinds}): replay with scripts/fault-schedule.sh {replay} {seed}");
    }
    assert!(
        failed.is_empty(),
        "{total_violations} violations in seeds {:?}",
        failed.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
}
