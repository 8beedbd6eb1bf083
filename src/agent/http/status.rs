//! `/status`: the JSON document for humans and tools (sync state, keys,
//! held and invalid keys, the rows HAProxy asked about), built off the
//! async workers and shared by requests that arrive while it is built.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hyper::body::Bytes;
use serde_json::{json, Value};

use super::answer::Answer;
use crate::agent::shared::Shared;
use crate::decision::served::{ConsulKey, ServedState};
use crate::decision::HoldCause;
use crate::model::snapshot::Entry;
use crate::model::value::AnswerKind;

/// The last `/status` body and when its building began; locked while one
/// is built, so requests at once share one build.
#[derive(Default)]
pub(super) struct StatusCache(tokio::sync::Mutex<Option<(Instant, Bytes)>>);

impl StatusCache {
    /// `/status`, built off the async workers (for 45,000 keys it is a few
    /// MB of JSON) and at most one at a time: a request that finds a body
    /// whose building began after it arrived takes that one, so it is never
    /// older than the request and a crowd of requests costs one build.
    pub(super) async fn answer(&self, shared: &Arc<Shared>) -> Answer {
        let arrived = Instant::now();
        let mut last = self.0.lock().await;
        if let Some((began, body)) = last.as_ref() {
            if *began >= arrived {
                return Answer::new(200, "application/json", body.clone());
            }
        }
        let began = Instant::now();
        let shared = shared.clone();
        let built = tokio::task::spawn_blocking(move || {
            let mut body = serde_json::to_vec_pretty(&status(&shared))
                .expect("a JSON value always serialises");
            body.push(b'\n');
            Bytes::from(body)
        })
        .await;
        match built {
            Ok(body) => {
                *last = Some((began, body.clone()));
                Answer::new(200, "application/json", body)
            }
            Err(e) => Answer::plain(500, format!("building the status failed: {e}\n")),
        }
    }
}

/// The rows seen, judged against the state served now: a silent row counts
/// as out only while the current snapshot still answers it drain or maint.
pub(super) fn seen_summary(shared: &Shared) -> crate::agent::seen::SeenSummary {
    let snapshot = shared.snapshot.load();
    shared.seen.summary(|line| {
        snapshot.as_ref().as_ref().is_none_or(|s| {
            matches!(
                s.lookup(crate::model::identity::identities(line)).kind(),
                AnswerKind::Drain | AnswerKind::Maint
            )
        })
    })
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The `held` object of `/status`: each key answered with another state
/// than Consul's, with the state answered and why. Keys held for an invalid
/// value are also added to `invalid`, since that is their value.
fn held_json(served: &ServedState, invalid: &mut serde_json::Map<String, Value>) -> Value {
    let mut out = serde_json::Map::new();
    for (key, record) in &served.keys {
        let Some(hold) = record.hold else {
            continue;
        };
        let state_text = record.served.map_or("none".to_string(), |s| s.to_string());
        let reply = record
            .served
            .map_or("none (the key is not answered)".to_string(), |s| {
                String::from_utf8_lossy(s.reply().as_bytes())
                    .trim_end()
                    .to_string()
            });
        let consul_modify_index = record.consul.as_ref().map(|c| c.modify_index);
        let detail = match hold.cause {
            HoldCause::InvalidValue => {
                let reason = match record.consul.as_ref().map(|c| &c.entry) {
                    Some(Entry::Invalid(e)) => e.to_string(),
                    _ => String::new(),
                };
                invalid.insert(
                    key.to_string(),
                    json!({"reason": reason, "modify_index": consul_modify_index, "held": state_text}),
                );
                format!("current value is invalid: {reason}")
            }
            HoldCause::RolledBack => match consul_modify_index {
                None => "Consul lost its data and the key is gone; the lower of its last state and what the next identity answers is answered; release with `state release-rollback` or a new write".to_string(),
                Some(_) => "Consul lost its data and the key's value there would give servers more traffic; release with `state release-rollback` or a new write".to_string(),
            },
            HoldCause::Hidden => match (record.served, &record.consul) {
                (Some(_), _) => "the token may not read the key (403): it may still hold its drain or maint, or have been cleared; the lower of that and what the next identity answers is answered until it can".to_string(),
                (None, Some(ConsulKey { entry: Entry::Valid(_), .. })) => "the token may not read the key (403); its last value (ready or a weight) is not answered: the next identity decides, capped at that value, until it can".to_string(),
                (None, Some(_)) => "the token may not read the key (403); its last value was invalid and is not answered, the next identity decides, until it can".to_string(),
                (None, None) => "the token may not read the key (403) and its value was never seen; lines it decides get no answer until it can".to_string(),
            },
        };
        out.insert(
            key.to_string(),
            json!({
                "state": state_text,
                "reply": reply,
                "cause": hold.cause.as_str(),
                "cap": record.capping().map(|s| s.to_string()),
                "answer": match (record.capping(), &record.consul, hold.cause) {
                    // Hidden, last seen invalid: skipped.
                    (None, Some(_), HoldCause::Hidden) => format!(
                        "no answer from this key, the next identity decides (held: {})",
                        hold.cause.words()
                    ),
                    (cap, _, _) => crate::decision::held_answer(record.served, cap, hold.cause),
                },
                "detail": detail,
                "consul_modify_index": consul_modify_index,
                "since": hold.since as f64,
            }),
        );
    }
    Value::Object(out)
}

/// The `/status` document: sync state, keys held with their parsed state,
/// invalid keys with the reason, and the rows HAProxy asked about.
pub fn status(shared: &Shared) -> Value {
    let snapshot = shared.snapshot.load_full();
    let sync = shared.sync.lock().unwrap().clone();
    let now = SystemTime::now();
    let mut keys = serde_json::Map::new();
    let mut invalid = serde_json::Map::new();
    let served = shared.served.lock().unwrap().clone();
    // The writer's records read for this request, beside the state's own.
    let served = served.map(|s| shared.records.fill(&s).map_or(s, Arc::new));
    if let Some(snap) = &snapshot {
        let mut sorted: Vec<_> = snap.keys.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        for (key, state) in sorted {
            let record = served.as_deref().and_then(|v| v.keys.get(key));
            match &state.entry {
                // A held state is listed as it was before it could cap.
                Entry::Valid(s) | Entry::AtMost(s)
                    if record.is_none_or(|r| r.served == Some(*s)) =>
                {
                    let meta = record.and_then(|r| r.meta.as_deref());
                    keys.insert(
                        key.to_string(),
                        json!({
                            "state": s.to_string(),
                            "reply": String::from_utf8_lossy(s.reply().as_bytes()).trim_end(),
                            "modify_index": state.modify_index,
                            "served_since": record.map(|r| r.since),
                            "written": crate::model::meta::written_json(meta),
                        }),
                    );
                }
                Entry::Invalid(e) => {
                    invalid.insert(
                        key.to_string(),
                        json!({"reason": e.to_string(), "modify_index": state.modify_index}),
                    );
                }
                // Listed under `held` (hidden: no value known, or a cap).
                Entry::Valid(_) | Entry::Unreadable | Entry::AtMost(_) => {}
            }
        }
    }
    let held = served
        .as_deref()
        .map_or_else(|| json!({}), |s| held_json(s, &mut invalid));
    let state_file = shared.state_file.lock().unwrap().clone();
    let summary = seen_summary(shared);
    let rows: Vec<Value> = shared
        .seen
        .rows()
        .into_iter()
        .map(|(line, row)| {
            let silent = row.last_asked.elapsed();
            json!({
                "agent_send": line,
                "last_asked": unix(row.last_asked_wall),
                "last_asked_age_seconds": silent.as_secs_f64(),
                "answer": row.answer,
                "kind": row.kind.as_str(),
                "decided_by": row.decided_by.and_then(|p| crate::model::identity::identities(&line).nth(usize::from(p))),
                "ask_interval_seconds": row.interval.map(|i| i.as_secs_f64()),
                "not_asked": silent > row.deadline(),
            })
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "synced": snapshot.is_some(),
        "ready": shared.readiness.is_ready(),
        "consul_addr": shared.consul_addr,
        "consul_fallback_in_use": sync.reading_through,
        "consul_datacenter": sync.datacenter,
        "consul_fallbacks": sync.fallbacks.iter().map(|f| json!({
            "addr": f.addr,
            "state": f.state,
            "detail": f.detail,
        })).collect::<Vec<_>>(),
        "consul_fallbacks_from": sync.fallbacks_from,
        "consul_fallback_discovery": sync.discovery.as_ref().map(|d| json!({
            "found_through": d.through,
            "found_at": d.at.map(unix),
            "peers": d.peers,
            "last_error": d.error,
        })),
        "prefix": shared.prefix,
        "records": shared.records.status_json(),
        "consul_index": snapshot.as_ref().map(|s| s.index),
        "last_sync": sync.last_sync.map(unix),
        "last_sync_age_seconds": sync.last_sync.and_then(|t| now.duration_since(t).ok()).map(|d| d.as_secs_f64()),
        "consul_failing_for_seconds": sync.failing_since.map(|t| t.elapsed().as_secs_f64()),
        "last_error": sync.last_error,
        "consul_current": sync.unconfirmed_for().is_some_and(|d| d <= crate::agent::shared::CURRENT_WITHIN),
        "consul_unconfirmed_seconds": sync.unconfirmed_for().map(|d| d.as_secs_f64()),
        "keys": keys,
        "invalid": invalid,
        "held": held,
        "store_id": served.as_ref().and_then(|s| s.store_id.as_deref().map(str::to_string)),
        "state_file": {
            "path": state_file.path,
            "loaded": state_file.loaded,
            "load_error": state_file.load_error,
            "write_error": state_file.write_error,
            "behind_seconds": shared.metrics.state_file_behind_seconds.get(),
            "runtime_copy": state_file.runtime_copy,
            "loaded_runtime_copy": state_file.loaded_runtime_copy,
        },
        "rows": rows,
        "out_rows_not_asked": summary.out_not_asked,
    })
}
