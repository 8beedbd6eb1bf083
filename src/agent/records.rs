//! The writer's records (who wrote a key, why and until when) of the keys
//! served, read from their sibling prefix
//! ([`records_prefix`](crate::model::meta::records_prefix)) only when
//! something asks (`/status`, a scrape of `/metrics`): one bounded refresh
//! at a time, cached, never on the path from a write to HAProxy. A refresh
//! reads only the records of keys written since they were last read (one
//! small GET each, up to [`MAX_KEY_READS`]; more at once, one read of the
//! records prefix), so a write costs each scraped agent the records it
//! wrote, not all of them. Records an
//! earlier writer left below the prefix come with the state, as before, and
//! win over nothing: the served state's own record is kept when it
//! describes the key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::Consistency;
use crate::consul::ConsulClient;
use crate::decision::served::{ConsulKey, ServedState};
use crate::model::meta::{parse_meta, records_prefix, KeyMeta};
use crate::model::snapshot::Entry;

/// Longest a read of the records may take: 2 s. Past it the read is given
/// up and the keys show as before (`/status` says why).
pub const RECORDS_TIMEOUT: Duration = Duration::from_secs(2);

/// After a failed read, how long before the next one: 30 s, so that
/// scrapes of an agent whose token may not read the records do not each
/// cost a request.
pub const RECORDS_RETRY: Duration = Duration::from_secs(30);

/// Longest records are kept before the whole records prefix is read again:
/// 10 min. Needed because a writer that writes the value a key already
/// holds (a new `--until` or reason on a drained key) changes its record
/// only: Consul keeps the key's ModifyIndex for an identical value, so
/// nothing served tells which record changed. Such a change shows within
/// this time.
pub const RECORDS_MAX_AGE: Duration = Duration::from_secs(600);

/// Most records read one by one in a refresh: 8. Past it, the refresh
/// reads the whole records prefix once instead.
pub const MAX_KEY_READS: usize = 8;

/// Most records kept from one read: 100,000 (a record is at most 8 KiB;
/// past this the rest are left out and counted).
pub const MAX_RECORDS: usize = 100_000;

/// What a refresh reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// Nothing: the cache describes what it can.
    Nothing,
    /// The records of these keys, one by one.
    Keys(Vec<Box<str>>),
    /// The whole records prefix.
    Prefix,
}

/// What the last read gave.
#[derive(Debug, Default, Clone)]
struct Cached {
    /// What the last read has seen: its `X-Consul-Index` or the index of
    /// the state served when it was made, the larger. A record written
    /// with a key (one transaction) is in every default-consistency read
    /// made after the key's write was served; a key written by hand has
    /// none to wait for (the prefix's index would not move for it).
    index: u64,
    /// When it was read.
    at: Option<Instant>,
    /// The usable records, by key, with their ModifyIndex.
    by_key: BTreeMap<Box<str>, (KeyMeta, u64)>,
    /// Keys whose record was read alone since the last read of the prefix,
    /// with the index it has seen (as `index`, for that key).
    key_index: BTreeMap<Box<str>, u64>,
    /// Records left out: unusable, or past [`MAX_RECORDS`].
    invalid: usize,
    /// Why the last read failed, and when.
    error: Option<(String, Instant)>,
}

/// The agent's cache of the writer's records. See the module documentation.
#[derive(Debug)]
pub struct RecordCache {
    /// The sibling prefix of the records.
    prefix: String,
    client: OnceLock<Arc<ConsulClient>>,
    /// Held while a read is under way: reads at once share one.
    reading: tokio::sync::Mutex<()>,
    cached: Mutex<Arc<Cached>>,
}

impl RecordCache {
    /// A cache for the records of the keys below `prefix` (the watched
    /// prefix, ending in `/`), reading nothing until [`Self::set_client`].
    pub fn new(prefix: &str) -> RecordCache {
        RecordCache {
            prefix: records_prefix(prefix),
            client: OnceLock::new(),
            reading: tokio::sync::Mutex::new(()),
            cached: Mutex::new(Arc::default()),
        }
    }

    /// The client records are read through (the primary Consul address).
    pub fn set_client(&self, client: Arc<ConsulClient>) {
        let _ = self.client.set(client);
    }

    fn cached(&self) -> Arc<Cached> {
        self.cached.lock().unwrap().clone()
    }

    /// What a refresh reads for `served`: nothing when every key Consul
    /// shows is described or was written before its record was last read;
    /// the records of the keys written since (at most [`MAX_KEY_READS`]);
    /// else, or when the last read of the prefix is older than
    /// [`RECORDS_MAX_AGE`] and a key takes its record from it, the whole
    /// prefix. Nothing within [`RECORDS_RETRY`] of a failure.
    fn plan(&self, served: &ServedState, cached: &Cached, now: Instant) -> Plan {
        if cached
            .error
            .as_ref()
            .is_some_and(|(_, at)| now < *at + RECORDS_RETRY)
        {
            return Plan::Nothing;
        }
        let old = cached.at.is_some_and(|at| now >= at + RECORDS_MAX_AGE);
        let mut keys = Vec::new();
        for (key, r) in &served.keys {
            let Some(c) = &r.consul else { continue };
            if names(r.meta.as_deref(), c) || cached.describes(key, c) {
                if old && r.meta.is_none() {
                    return Plan::Prefix;
                }
                continue;
            }
            let seen = cached.key_index.get(key).copied().unwrap_or(cached.index);
            if matches!(c.entry, Entry::Valid(_)) && c.modify_index > seen {
                keys.push(key.clone());
            }
        }
        match keys.len() {
            0 => Plan::Nothing,
            n if n > MAX_KEY_READS => Plan::Prefix,
            _ => Plan::Keys(keys),
        }
    }

    /// Reads the records when `served` has a key they may describe that
    /// the cache does not ([`Self::wants`]), at most one read at a time
    /// and for at most [`RECORDS_TIMEOUT`]; a failure is kept for
    /// `/status` and tried again after [`RECORDS_RETRY`].
    pub async fn refresh(&self, served: &ServedState) {
        let Some(client) = self.client.get() else {
            return;
        };
        if self.plan(served, &self.cached(), Instant::now()) == Plan::Nothing {
            return;
        }
        let _reading = self.reading.lock().await;
        // Another request may have read them meanwhile.
        let before = self.cached();
        let plan = self.plan(served, &before, Instant::now());
        let read = async {
            match &plan {
                Plan::Nothing => Ok(None),
                Plan::Prefix => self.read_all(client, served).await.map(Some),
                Plan::Keys(keys) => self
                    .read_keys(client, served, &before, keys)
                    .await
                    .map(Some),
            }
        };
        let next = match tokio::time::timeout(RECORDS_TIMEOUT, read).await {
            Ok(Ok(Some(next))) => next,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => failed(&before, e.to_string()),
            Err(_) => failed(
                &before,
                format!(
                    "no answer in {}",
                    humantime::format_duration(RECORDS_TIMEOUT)
                ),
            ),
        };
        *self.cached.lock().unwrap() = Arc::new(next);
    }

    /// One read of the whole records prefix.
    async fn read_all(
        &self,
        client: &ConsulClient,
        served: &ServedState,
    ) -> Result<Cached, crate::consul::types::ConsulError> {
        let read = client.read_prefix(&self.prefix, 0, Duration::ZERO, Consistency::Default);
        let (answer, _) = read.await?;
        let mut next = Cached {
            index: answer.index.max(served.index),
            at: Some(Instant::now()),
            ..Cached::default()
        };
        for p in &answer.pairs {
            let key = &p.key[self.prefix.len().min(p.key.len())..];
            match parse_meta(&p.value) {
                Ok(m) if next.by_key.len() < MAX_RECORDS && !key.is_empty() => {
                    next.by_key.insert(key.into(), (m, p.modify_index));
                }
                _ => next.invalid += 1,
            }
        }
        Ok(next)
    }

    /// The records of `keys` alone, one small default-consistency GET
    /// each, into a copy of `before`.
    async fn read_keys(
        &self,
        client: &ConsulClient,
        served: &ServedState,
        before: &Cached,
        keys: &[Box<str>],
    ) -> Result<Cached, crate::consul::types::ConsulError> {
        use crate::decision::KeyRead;
        let mut next = Cached {
            error: None,
            // The age the full read is counted from, if none was made.
            at: before.at.or(Some(Instant::now())),
            ..before.clone()
        };
        for key in keys {
            let full = format!("{}{key}", self.prefix);
            let (read, _) = client.read_key(&full, Consistency::Default).await?;
            match read {
                KeyRead::Present(p) => match parse_meta(&p.value) {
                    Ok(m) => {
                        next.by_key.insert(key.clone(), (m, p.modify_index));
                    }
                    Err(_) => {
                        next.by_key.remove(key);
                        next.invalid += 1;
                    }
                },
                KeyRead::Absent => {
                    next.by_key.remove(key);
                }
                KeyRead::Forbidden => {
                    return Err(crate::consul::types::ConsulError::Decode(format!(
                        "403 reading the record of {key}"
                    )))
                }
            }
            // A record written with its key is in a default read made
            // after the key's write was served.
            next.key_index.insert(key.clone(), served.index);
        }
        Ok(next)
    }

    /// `served` with the cached records of keys whose own record (from
    /// the state, written by an earlier writer) does not describe them;
    /// `None` when the cache adds nothing.
    pub fn fill(&self, served: &ServedState) -> Option<ServedState> {
        let cached = self.cached();
        let adds = |key: &str, r: &crate::decision::served::KeyRecord| {
            let c = r.consul.as_ref()?;
            if names(r.meta.as_deref(), c) || !cached.describes(key, c) {
                return None;
            }
            cached.by_key.get(key).map(|(m, _)| m)
        };
        if !served.keys.iter().any(|(k, r)| adds(k, r).is_some()) {
            return None;
        }
        let mut out = served.clone();
        for (key, r) in out.keys.iter_mut() {
            if let Some(m) = adds(key, r) {
                r.meta = Some(Box::new(m.clone()));
            }
        }
        Some(out)
    }

    /// The `records` object of `/status`: where they are read, at which
    /// index, how many, and the last error.
    pub fn status_json(&self) -> Value {
        let c = self.cached();
        json!({
            "prefix": self.prefix,
            "read_index": (c.index > 0).then_some(c.index),
            "read_seconds_ago": c.at.map(|at| at.elapsed().as_secs()),
            "records": c.by_key.len(),
            "unusable": c.invalid,
            "error": c.error.as_ref().map(|(e, _)| e),
        })
    }
}

impl Cached {
    /// Whether the cached record of `key` describes the write `c` shows
    /// ([`KeyMeta::describes`]: the same state, written with the key or
    /// after it).
    fn describes(&self, key: &str, c: &ConsulKey) -> bool {
        match (self.by_key.get(key), &c.entry) {
            (Some((m, index)), Entry::Valid(s)) => m.describes(*index, *s, c.modify_index),
            _ => false,
        }
    }
}

/// Whether the served state's own record (kept by the decision core from
/// an earlier writer's record below the prefix, already judged against
/// the key's index) names the state `c` shows.
fn names(meta: Option<&KeyMeta>, c: &ConsulKey) -> bool {
    match (meta, &c.entry) {
        (Some(m), Entry::Valid(s)) => {
            crate::model::value::parse_value(m.value.as_bytes()).ok() == Some(*s)
        }
        _ => false,
    }
}

fn failed(before: &Cached, error: String) -> Cached {
    Cached {
        error: Some((error, Instant::now())),
        ..before.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::served::KeyRecord;
    use crate::model::value::AdminState;

    fn record(value: &str) -> KeyMeta {
        KeyMeta {
            by: "alice".into(),
            reason: "kernel upgrade".into(),
            at: 1_700_000_000,
            until: Some(1_700_007_200),
            value: value.into(),
        }
    }

    /// A state serving `canary` at `state`, last written at `index`, with
    /// the record the state itself carries (an earlier writer's).
    fn served(state: AdminState, index: u64, meta: Option<KeyMeta>) -> ServedState {
        let mut s = ServedState::default();
        s.keys.insert(
            "canary".into(),
            KeyRecord {
                consul: Some(ConsulKey {
                    value: None,
                    entry: Entry::Valid(state),
                    modify_index: index,
                }),
                served: Some(state),
                hold: None,
                cap: None,
                meta: meta.map(Box::new),
                since: 5,
            },
        );
        s
    }

    fn cache(read_index: u64, records: &[(&str, KeyMeta, u64)]) -> (RecordCache, Instant) {
        let c = RecordCache::new("gitlab-haproxy-agent/state/");
        let at = Instant::now();
        *c.cached.lock().unwrap() = Arc::new(Cached {
            index: read_index,
            at: Some(at),
            by_key: (records.iter())
                .map(|(k, m, i)| (Box::from(*k), (m.clone(), *i)))
                .collect(),
            ..Cached::default()
        });
        (c, at)
    }

    #[test]
    fn a_record_read_beside_the_prefix_fills_the_key_it_describes() {
        let (c, now) = cache(12, &[("canary", record("drain"), 10)]);
        let s = served(AdminState::Drain, 10, None);
        let filled = c.fill(&s).expect("the record describes the key");
        assert_eq!(
            filled.keys["canary"].meta.as_deref(),
            Some(&record("drain"))
        );
        assert_eq!(filled.out_keys()[0].until, Some(1_700_007_200));
        assert_eq!(
            c.plan(&s, &c.cached(), now),
            Plan::Nothing,
            "nothing newer than the read"
        );
        // Written by hand since (same value, later index): not described,
        // and a read at 12 has seen the key's write: no read either.
        let s = served(AdminState::Drain, 11, None);
        assert!(c.fill(&s).is_none());
        assert_eq!(c.plan(&s, &c.cached(), now), Plan::Nothing);
        // A key written after the read: its record is read alone.
        let s = served(AdminState::Maint, 15, None);
        assert!(c.fill(&s).is_none());
        assert_eq!(
            c.plan(&s, &c.cached(), now),
            Plan::Keys(vec!["canary".into()])
        );
        // Ten minutes on, the whole prefix is read again (a record changed
        // by a write of the value its key held shows in no index).
        let s = served(AdminState::Drain, 10, None);
        assert_eq!(c.plan(&s, &c.cached(), now + RECORDS_MAX_AGE), Plan::Prefix);
    }

    #[test]
    fn the_states_own_record_wins_and_a_failure_waits_before_the_next_read() {
        let (c, now) = cache(12, &[("canary", record("drain"), 10)]);
        let own = KeyMeta {
            by: "bob".into(),
            ..record("maint")
        };
        let s = served(AdminState::Maint, 15, Some(own));
        assert!(
            c.fill(&s).is_none(),
            "an earlier writer's record, from the answer"
        );
        assert_eq!(c.plan(&s, &c.cached(), now), Plan::Nothing);
        assert_eq!(
            c.plan(&s, &c.cached(), now + RECORDS_MAX_AGE),
            Plan::Nothing
        );
        let s = served(AdminState::Maint, 15, None);
        let failed = failed(&c.cached(), "403".into());
        let at = failed.error.as_ref().unwrap().1;
        assert_eq!(c.plan(&s, &failed, at), Plan::Nothing);
        assert_eq!(
            c.plan(&s, &failed, at + RECORDS_RETRY),
            Plan::Keys(vec!["canary".into()])
        );
        assert_eq!(failed.by_key.len(), 1, "what was read is kept");
    }

    /// A state serving `n` keys `web/sN` at drain, each written at index
    /// `10 + N`.
    fn many(n: u64) -> ServedState {
        let mut s = ServedState::default();
        for i in 0..n {
            let one = served(AdminState::Drain, 10 + i, None);
            s.keys
                .insert(format!("web/s{i}").into(), one.keys["canary"].clone());
        }
        s.index = 10 + n;
        s
    }

    #[test]
    fn a_refresh_reads_the_records_of_the_keys_written_since_and_the_prefix_past_eight() {
        // Read at 12: web/s0..s2 (written at 10..12) are seen, records or
        // not; a write of s3 and s4 since costs their two records alone.
        let (c, now) = cache(12, &[("web/s0", record("drain"), 10)]);
        let s = many(5);
        assert_eq!(
            c.plan(&s, &c.cached(), now),
            Plan::Keys(vec!["web/s3".into(), "web/s4".into()])
        );
        // Once read alone (s3 has a record, s4 none: written by hand),
        // neither is read again until written again.
        let mut after = (*c.cached()).clone();
        after.by_key.insert("web/s3".into(), (record("drain"), 13));
        after.key_index.insert("web/s3".into(), s.index);
        after.key_index.insert("web/s4".into(), s.index);
        assert_eq!(c.plan(&s, &after, now), Plan::Nothing);
        let mut s2 = s.clone();
        s2.keys
            .get_mut("web/s4")
            .unwrap()
            .consul
            .as_mut()
            .unwrap()
            .modify_index = 40;
        assert_eq!(c.plan(&s2, &after, now), Plan::Keys(vec!["web/s4".into()]));
        // More than MAX_KEY_READS written since: one read of the prefix.
        let s = many(12 + MAX_KEY_READS as u64);
        assert_eq!(c.plan(&s, &c.cached(), now), Plan::Prefix);
        // A fresh agent with a few keys reads their records alone.
        let fresh = RecordCache::new("gitlab-haproxy-agent/state/");
        assert_eq!(
            fresh.plan(&many(2), &fresh.cached(), now),
            Plan::Keys(vec!["web/s0".into(), "web/s1".into()])
        );
    }
}
