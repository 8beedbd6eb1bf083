//! A scriptable stand-in for Consul's KV HTTP API, for the faults a real
//! Consul cannot be made to show on demand: malformed, truncated or slow
//! answers, a missing, zero or backwards `X-Consul-Index`, a 200 with `[]`,
//! a value larger than Consul accepts.
//!
//! A hyper 1 server on `127.0.0.1:0` inside the test process, on its own
//! runtime. Without a script it behaves like Consul on a small KV store:
//! `GET /v1/kv/<prefix>?recurse` answers at once without `index` (or with
//! `index=0`), and as a blocking query otherwise, held until the store's
//! index moves or `wait` ends. Replies queued with [`FakeConsul::script`]
//! are served one per request, in order, before anything else (a pending
//! blocking query takes the next one at once); a [`FakeConsul::set_sticky`]
//! reply answers every request until cleared. Requests without a script
//! get the label `store`. A plain read of one key (no `recurse`) is always
//! answered from the store at once and recorded apart
//! ([`FakeConsul::key_reads`]). Every request is recorded on arrival with its
//! time and its `index` and `wait` parameters, then with the reply chosen.
//! `GET /v1/acl/token/self` answers as a Consul with ACLs off (401 `ACL
//! support disabled`) unless [`FakeConsul::set_acl_enabled`] says otherwise.
//! [`FakeConsul::set_slow_reads`] delays non-blocking GETs (no `index` or
//! `index=0`: key reads, key lists, the token lookup; recursive reads of
//! the prefix by a delay of their own) by a fixed time; each then succeeds.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// The longest `wait` honoured, as Consul: 10 minutes.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// How a reply sets `X-Consul-Index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexHeader {
    /// The store's index when the reply is chosen (what Consul does).
    Store,
    /// No header at all.
    Absent,
    /// This number.
    Value(u64),
    /// This text, verbatim (e.g. not a number).
    Raw(String),
}

/// What a reply carries as its body.
#[derive(Debug, Clone)]
enum ReplyBody {
    /// The prefix rendered from the store when the reply is chosen: 200 with
    /// the JSON list, or 404 with an empty body when no key is under it.
    Store,
    /// These bytes with the reply's status.
    Bytes(Vec<u8>),
    /// `Content-Length` of the whole of `bytes`, but only the first `keep`
    /// bytes are sent before the connection is cut.
    Cut { bytes: Vec<u8>, keep: usize },
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Names the reply in the request log.
    pub label: String,
    status: u16,
    index: IndexHeader,
    body: ReplyBody,
    delay: Duration,
    bump: bool,
    /// `X-Consul-KnownLeader` and `X-Consul-LastContact` (ms), as a
    /// leader sends them (`true`, `0`) unless changed; `None` leaves the
    /// header out.
    known_leader: Option<String>,
    last_contact: Option<String>,
}

impl Reply {
    /// A Consul-like answer from the store: 200 and the JSON list (404 and
    /// an empty body for an empty prefix), `X-Consul-Index` the store's.
    pub fn store(label: &str) -> Reply {
        Reply {
            label: label.into(),
            status: 200,
            index: IndexHeader::Store,
            body: ReplyBody::Store,
            delay: Duration::ZERO,
            bump: false,
            known_leader: Some("true".into()),
            last_contact: Some("0".into()),
        }
    }

    /// An error status with a text body (`500`, `No cluster leader`), with
    /// the store's index as Consul sends it.
    pub fn error(label: &str, status: u16, text: &str) -> Reply {
        Reply {
            status,
            body: ReplyBody::Bytes(text.as_bytes().to_vec()),
            ..Reply::store(label)
        }
    }

    /// A 200 with exactly these body bytes and the store's index.
    pub fn body(label: &str, bytes: &[u8]) -> Reply {
        Reply {
            body: ReplyBody::Bytes(bytes.to_vec()),
            ..Reply::store(label)
        }
    }

    /// A 200 announcing all of `bytes` in `Content-Length` whose connection
    /// is cut after the first `keep` bytes.
    pub fn cut(label: &str, bytes: &[u8], keep: usize) -> Reply {
        Reply {
            body: ReplyBody::Cut {
                bytes: bytes.to_vec(),
                keep: keep.min(bytes.len()),
            },
            ..Reply::store(label)
        }
    }

    /// The same reply with another `X-Consul-Index`.
    pub fn with_index(mut self, index: IndexHeader) -> Reply {
        self.index = index;
        self
    }

    /// The same reply, chosen (and rendered from the store) at once but sent
    /// only after `delay`.
    pub fn delayed(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// The same reply as a server with these `X-Consul-KnownLeader` and
    /// `X-Consul-LastContact` values would send it (`None`: no header).
    pub fn with_freshness(
        mut self,
        known_leader: Option<&str>,
        last_contact: Option<&str>,
    ) -> Reply {
        self.known_leader = known_leader.map(str::to_string);
        self.last_contact = last_contact.map(str::to_string);
        self
    }

    /// The same reply, after moving the store's index up by one with no
    /// change to the keys (churn elsewhere in the datacenter).
    pub fn bumping(mut self) -> Reply {
        self.bump = true;
        self
    }
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Record {
    /// When it arrived.
    pub at: Instant,
    /// The path, e.g. `/v1/kv/gitlab-haproxy-agent/state/`.
    pub path: String,
    /// The `index` query parameter, if present.
    pub index: Option<u64>,
    /// The `wait` query parameter, if present, verbatim.
    pub wait: Option<String>,
    /// Whether the read asked for `?stale`.
    pub stale: bool,
    /// The label of the reply it got, set when the reply is chosen (before
    /// any delay); empty while the request is pending.
    pub served: String,
    /// The `X-Consul-Index` sent back, if a number was.
    pub served_index: Option<u64>,
    /// When the reply was chosen (it is sent then, or after its delay).
    pub answered_at: Option<Instant>,
}

/// A read delayed by [`FakeConsul::set_slow_reads`].
#[derive(Debug, Clone)]
pub struct SlowRead {
    /// Path and query, e.g. `/v1/kv/gitlab-haproxy-agent/state/canary?`.
    pub target: String,
    /// When it arrived.
    pub at: Instant,
    /// When it was answered; `None` while it waits.
    pub answered_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    /// Full key -> (value, ModifyIndex).
    keys: BTreeMap<String, (Vec<u8>, u64)>,
    index: u64,
    script: VecDeque<Reply>,
    sticky: Option<Reply>,
    log: Vec<Record>,
    /// Paths of plain (non-recursive) key reads, in order.
    key_reads: Vec<String>,
    key_lists: Vec<String>,
    /// `GET /v1/acl/token/self` answers 200 (ACLs on) rather than 401.
    acl_enabled: bool,
    token_lookups: usize,
    /// Delay before answering a non-blocking GET: one not recursive, one
    /// recursive.
    slow_reads: (Option<Duration>, Option<Duration>),
    /// Every delayed read: path and query, arrived, answered.
    slow_log: Vec<SlowRead>,
}

struct Inner {
    state: Mutex<State>,
    /// Bumped on every change of the store, the script or the sticky reply,
    /// to wake pending blocking queries.
    version: watch::Sender<u64>,
}

impl Inner {
    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// The fake Consul; stops serving when dropped.
pub struct FakeConsul {
    addr: SocketAddr,
    prefix: String,
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeConsul {
    /// Starts serving an empty store at index `index` (at least 1), whose
    /// keys are written below `prefix` (ending in `/`).
    pub fn start(prefix: &str, index: u64) -> FakeConsul {
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                index: index.max(1),
                ..State::default()
            }),
            version: watch::channel(0).0,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-consul")
            .enable_all()
            .build()
            .expect("a runtime for the fake Consul");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake Consul");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let served = inner.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let inner = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let inner = inner.clone();
                        async move { Ok::<_, Infallible>(answer(&inner, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeConsul {
            addr,
            prefix: prefix.to_string(),
            inner,
            runtime: Some(runtime),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.inner.state.lock().unwrap());
        self.inner.changed();
        out
    }

    /// Writes `prefix + key` = `value` as Consul does: the store's index
    /// moves up by one and becomes the key's ModifyIndex.
    pub fn put(&self, key: &str, value: &[u8]) {
        let full = format!("{}{key}", self.prefix);
        self.with_state(|s| {
            s.index += 1;
            let index = s.index;
            s.keys.insert(full, (value.to_vec(), index));
        });
    }

    /// Like [`FakeConsul::put`], without waking a pending blocking query:
    /// the write shows in the next answer chosen, whatever it is.
    pub fn put_silently(&self, key: &str, value: &[u8]) {
        let full = format!("{}{key}", self.prefix);
        let mut s = self.inner.state.lock().unwrap();
        s.index += 1;
        let index = s.index;
        s.keys.insert(full, (value.to_vec(), index));
    }

    /// Deletes `prefix + key`; the store's index moves up by one.
    pub fn delete(&self, key: &str) {
        let full = format!("{}{key}", self.prefix);
        self.with_state(|s| {
            s.index += 1;
            s.keys.remove(&full);
        });
    }

    /// Replaces the whole store with `pairs` (keys below the prefix) at
    /// `index`, which may be lower than the current one: a snapshot restore.
    pub fn restore(&self, pairs: &[(&str, &[u8])], index: u64) {
        let prefix = self.prefix.clone();
        self.with_state(|s| {
            s.index = index;
            s.keys = pairs
                .iter()
                .map(|(k, v)| (format!("{prefix}{k}"), (v.to_vec(), index)))
                .collect();
        });
    }

    /// The store's index.
    pub fn index(&self) -> u64 {
        self.inner.state.lock().unwrap().index
    }

    /// The JSON list Consul would send for the prefix, for `pairs` (keys
    /// below the prefix) each at ModifyIndex `modify_index`.
    pub fn render(&self, pairs: &[(&str, &[u8])], modify_index: u64) -> Vec<u8> {
        let list: Vec<serde_json::Value> = pairs
            .iter()
            .map(|(k, v)| entry(&format!("{}{k}", self.prefix), v, modify_index))
            .collect();
        serde_json::to_vec(&list).unwrap()
    }

    /// Queues `reply` for the next request that has no earlier scripted
    /// reply; a pending blocking query takes it at once.
    pub fn script(&self, reply: Reply) {
        self.with_state(|s| s.script.push_back(reply));
    }

    /// Answers every request with `reply` (after any scripted ones) until
    /// set to `None`; pending blocking queries take it at once.
    pub fn set_sticky(&self, reply: Option<Reply>) {
        self.with_state(|s| s.sticky = reply);
    }

    /// Every request so far, in the order they arrived.
    pub fn requests(&self) -> Vec<Record> {
        self.inner.state.lock().unwrap().log.clone()
    }

    /// The paths of plain reads of one key (no `recurse`), in order; they
    /// are answered from the store and are not in [`FakeConsul::requests`].
    pub fn key_reads(&self) -> Vec<String> {
        self.inner.state.lock().unwrap().key_reads.clone()
    }

    /// The paths of key-name lists (`?keys`), in order; answered from the
    /// store at once, never from a script.
    pub fn key_lists(&self) -> Vec<String> {
        self.inner.state.lock().unwrap().key_lists.clone()
    }

    /// Makes `GET /v1/acl/token/self` answer as Consul does with ACLs on
    /// (200 and the token, here the anonymous one) or off (401 `ACL support
    /// disabled`, the default).
    pub fn set_acl_enabled(&self, enabled: bool) {
        self.with_state(|s| s.acl_enabled = enabled);
    }

    /// How many times `GET /v1/acl/token/self` was asked.
    pub fn token_lookups(&self) -> usize {
        self.inner.state.lock().unwrap().token_lookups
    }

    /// Delays every non-blocking GET (no `index`, or `index=0`) before it
    /// is answered as usual: by `delay` if it is not recursive (a key, a key
    /// list, the token), by `prefix_delay` if it is a recursive read of a
    /// prefix. `None` answers them at once. Blocking queries are never
    /// delayed.
    pub fn set_slow_reads(&self, delay: Option<Duration>, prefix_delay: Option<Duration>) {
        self.with_state(|s| s.slow_reads = (delay, prefix_delay));
    }

    /// Every read delayed by [`FakeConsul::set_slow_reads`], in order.
    pub fn slow_reads(&self) -> Vec<SlowRead> {
        self.inner.state.lock().unwrap().slow_log.clone()
    }

    /// Scripted replies not served yet.
    pub fn pending(&self) -> usize {
        self.inner.state.lock().unwrap().script.len()
    }

    /// Waits up to `timeout` for a request answered with the reply labelled
    /// `label` and returns its position in [`FakeConsul::requests`].
    pub fn wait_served(&self, label: &str, timeout: Duration) -> usize {
        self.wait_record(timeout, &format!("{label:?} served"), |log| {
            log.iter().position(|r| r.served == label)
        })
    }

    /// Waits up to `timeout` until request `n` (from 0) has arrived and
    /// returns it, answered or not.
    pub fn wait_request(&self, n: usize, timeout: Duration) -> Record {
        self.wait_record(timeout, &format!("request #{n}"), |log| log.get(n).cloned())
    }

    /// Waits up to `timeout` until request `n` (from 0) has been given its
    /// reply and returns it.
    pub fn wait_answered(&self, n: usize, timeout: Duration) -> Record {
        self.wait_record(timeout, &format!("answered request #{n}"), |log| {
            log.get(n).filter(|r| !r.served.is_empty()).cloned()
        })
    }

    /// Waits up to `timeout` for a request not given its reply yet (a held
    /// blocking query) and returns its position.
    pub fn wait_pending(&self, timeout: Duration) -> usize {
        self.wait_record(timeout, "a pending request", |log| {
            log.iter().rposition(|r| r.served.is_empty())
        })
    }

    fn wait_record<T>(
        &self,
        timeout: Duration,
        what: &str,
        find: impl Fn(&[Record]) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = find(&self.requests()) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "the fake Consul got no {what} within {timeout:?}; requests: {:#?}",
                self.requests()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeConsul {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn entry(key: &str, value: &[u8], modify_index: u64) -> serde_json::Value {
    serde_json::json!({
        "LockIndex": 0,
        "Key": key,
        "Flags": 0,
        "Value": base64::engine::general_purpose::STANDARD.encode(value),
        "CreateIndex": modify_index,
        "ModifyIndex": modify_index,
    })
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// Consul's `wait` syntax: a number with a unit (`ms`, `s`, `m`).
fn parse_wait(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok()?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return None,
    };
    Some(d.min(MAX_WAIT))
}

async fn answer(inner: &Inner, req: Request<Incoming>) -> Response<FakeBody> {
    let at = Instant::now();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let blocking = query_param(&query, "index")
        .and_then(|i| i.parse::<u64>().ok())
        .is_some_and(|i| i > 0);
    if path == "/v1/status/peers" {
        // No servers to find: the agent keeps its fallbacks as they are.
        return plain(200, "[]");
    }
    let slow = {
        let mut s = inner.state.lock().unwrap();
        let delay = if query_param(&query, "recurse").is_some() {
            s.slow_reads.1
        } else {
            s.slow_reads.0
        };
        match delay {
            Some(d) if !blocking && req.method() == hyper::Method::GET => {
                s.slow_log.push(SlowRead {
                    target: format!("{path}?{query}"),
                    at,
                    answered_at: None,
                });
                Some((d, s.slow_log.len() - 1))
            }
            _ => None,
        }
    };
    if let Some((delay, n)) = slow {
        tokio::time::sleep(delay).await;
        inner.state.lock().unwrap().slow_log[n].answered_at = Some(Instant::now());
    }
    if path == "/v1/acl/token/self" {
        return token_self(inner);
    }
    if query_param(&query, "keys").is_some() {
        return key_list(inner, path);
    }
    if query_param(&query, "recurse").is_none() {
        return key_read(inner, path);
    }
    let index = query_param(&query, "index").and_then(|i| i.parse::<u64>().ok());
    let wait = query_param(&query, "wait").map(str::to_string);
    let hold = match &wait {
        None => Duration::from_secs(300),
        Some(w) => match parse_wait(w) {
            Some(d) => d,
            None => return plain(400, "Invalid wait time"),
        },
    };
    let deadline = tokio::time::Instant::now() + hold;
    let position = {
        let mut s = inner.state.lock().unwrap();
        s.log.push(Record {
            at,
            path: path.clone(),
            index,
            wait,
            stale: query
                .split('&')
                .any(|kv| kv == "stale" || kv.starts_with("stale=")),
            served: String::new(),
            served_index: None,
            answered_at: None,
        });
        s.log.len() - 1
    };
    let mut version = inner.version.subscribe();
    let reply = loop {
        version.borrow_and_update();
        let decided = {
            let mut s = inner.state.lock().unwrap();
            if let Some(r) = s.script.pop_front() {
                Some(r)
            } else if let Some(r) = s.sticky.clone() {
                Some(r)
            } else if index.unwrap_or(0) == 0
                || s.index != index.unwrap_or(0)
                || tokio::time::Instant::now() >= deadline
            {
                Some(Reply::store("store"))
            } else {
                None
            }
        };
        match decided {
            Some(r) => break r,
            None => {
                tokio::select! {
                    _ = version.changed() => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
    };
    let (status, body, header) = {
        let mut s = inner.state.lock().unwrap();
        if reply.bump {
            s.index += 1;
        }
        let prefix = path.strip_prefix("/v1/kv/").unwrap_or("").to_string();
        let (status, body) = match &reply.body {
            ReplyBody::Store => {
                let list: Vec<serde_json::Value> = s
                    .keys
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, (v, m))| entry(k, v, *m))
                    .collect();
                if list.is_empty() {
                    (404, FakeBody::full(Vec::new()))
                } else {
                    (200, FakeBody::full(serde_json::to_vec(&list).unwrap()))
                }
            }
            ReplyBody::Bytes(b) => (reply.status, FakeBody::full(b.clone())),
            ReplyBody::Cut { bytes, keep } => (
                reply.status,
                FakeBody {
                    data: Some(Bytes::copy_from_slice(&bytes[..*keep])),
                    fail: true,
                    declared: bytes.len() as u64,
                },
            ),
        };
        let header = match &reply.index {
            IndexHeader::Store => Some(s.index.to_string()),
            IndexHeader::Absent => None,
            IndexHeader::Value(v) => Some(v.to_string()),
            IndexHeader::Raw(r) => Some(r.clone()),
        };
        let record = &mut s.log[position];
        record.served = reply.label.clone();
        record.served_index = header.as_deref().and_then(|h| h.parse().ok());
        record.answered_at = Some(Instant::now());
        (status, body, header)
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut builder = Response::builder()
        .status(status)
        .header("Content-Type", "application/json");
    if let Some(h) = header {
        builder = builder.header("X-Consul-Index", h);
    }
    if let Some(v) = &reply.known_leader {
        builder = builder.header("X-Consul-KnownLeader", v);
    }
    if let Some(v) = &reply.last_contact {
        builder = builder.header("X-Consul-LastContact", v);
    }
    builder.body(body).unwrap()
}

/// A plain read of one key (the agent's check of its token's read access):
/// answered from the store at once, never from a script, and recorded in
/// `key_reads` only.
fn key_read(inner: &Inner, path: String) -> Response<FakeBody> {
    let mut s = inner.state.lock().unwrap();
    let key = path.strip_prefix("/v1/kv/").unwrap_or("").to_string();
    let (status, body) = match s.keys.get(&key) {
        Some((v, m)) => (200, serde_json::to_vec(&[entry(&key, v, *m)]).unwrap()),
        None => (404, Vec::new()),
    };
    let index = s.index.to_string();
    s.key_reads.push(path);
    Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .header("X-Consul-Index", index)
        .body(FakeBody::full(body))
        .unwrap()
}

/// `GET /v1/kv/<prefix>?keys`: the names of the store's keys under the
/// prefix, from the store at once (404 when there are none), recorded in
/// `key_lists` only.
fn key_list(inner: &Inner, path: String) -> Response<FakeBody> {
    let mut s = inner.state.lock().unwrap();
    let prefix = path.strip_prefix("/v1/kv/").unwrap_or("").to_string();
    let names: Vec<&String> = s.keys.keys().filter(|k| k.starts_with(&prefix)).collect();
    let (status, body) = if names.is_empty() {
        (404, Vec::new())
    } else {
        (200, serde_json::to_vec(&names).unwrap())
    };
    let index = s.index.to_string();
    s.key_lists.push(path);
    Response::builder()
        .status(status)
        .header("Content-Type", "application/json")
        .header("X-Consul-Index", index)
        .body(FakeBody::full(body))
        .unwrap()
}

/// `GET /v1/acl/token/self`: the anonymous token with ACLs on, Consul
/// 1.8's 401 with ACLs off.
fn token_self(inner: &Inner) -> Response<FakeBody> {
    let mut s = inner.state.lock().unwrap();
    s.token_lookups += 1;
    if !s.acl_enabled {
        return plain(401, "ACL support disabled");
    }
    let body = serde_json::json!({
        "AccessorID": "00000000-0000-0000-0000-000000000002",
        "SecretID": "anonymous",
        "Description": "Anonymous Token",
        "Policies": [],
        "Local": false,
        "CreateIndex": 5,
        "ModifyIndex": 5,
    });
    Response::builder()
        .status(200)
        .header("Content-Type", "application/json")
        .header("X-Consul-Index", s.index.to_string())
        .body(FakeBody::full(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn plain(status: u16, text: &str) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .body(FakeBody::full(text.as_bytes().to_vec()))
        .unwrap()
}

/// A body sent in one frame, optionally followed by an error that makes
/// hyper cut the connection short of the declared length.
struct FakeBody {
    data: Option<Bytes>,
    fail: bool,
    declared: u64,
}

impl FakeBody {
    fn full(bytes: Vec<u8>) -> FakeBody {
        FakeBody {
            declared: bytes.len() as u64,
            data: (!bytes.is_empty()).then(|| Bytes::from(bytes)),
            fail: false,
        }
    }
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut this.fail) {
            return Poll::Ready(Some(Err(io::Error::other("cut mid-body"))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.fail
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.declared)
    }
}
