//! Who wrote a key, why and until when: the record the writer CLI keeps of
//! each state key under a sibling prefix ([`records_prefix`]:
//! `gitlab-haproxy-agent/state~meta/<key>` for the keys under
//! `gitlab-haproxy-agent/state/`), written in the same Consul transaction as
//! the key (so both carry one ModifyIndex) and deleted with it. The agents'
//! blocking query never carries records: an agent reads them only when
//! asked (`/status`, a scrape), bounded and cached. Earlier writers kept
//! them below the prefix (`<prefix>~meta/<key>`, [`legacy_record_key`]):
//! those are still read, and the writer's next write of a key moves its
//! record (`state migrate-records` moves them all). The value grammar of
//! the state keys does not change, and `consul kv put` keeps working: a key
//! whose record does not describe its current write was written outside
//! the writer.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::identity::is_control_key;
pub use super::identity::{is_meta_key, META_PREFIX};
use super::snapshot::KvPair;
use super::value::{parse_value, AdminState};

/// Longest record accepted, in bytes: 8 KiB. A longer one is ignored (its
/// key shows as written outside the writer) and counted as invalid.
pub const MAX_META_LEN: usize = 8192;

/// Longest `--reason` or `--by` the writer accepts, in bytes: 1 KiB, so a
/// record always fits in [`MAX_META_LEN`].
pub const MAX_TEXT_LEN: usize = 1024;

/// What a key shows when no record describes its current value.
pub const UNKNOWN: &str = "unknown, written outside the writer";

/// One record: the JSON value of `<prefix>~meta/<key>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyMeta {
    /// Who wrote the key: the login (`$SUDO_USER`, else `$USER`) or the
    /// writer's `--by` (a ChatOps bot names the person it acts for).
    pub by: String,
    /// Why (`--reason`); empty when none was given (allowed for writes that
    /// bring servers back).
    #[serde(default)]
    pub reason: String,
    /// When the writer wrote it, Unix time in seconds.
    pub at: u64,
    /// Until when the state is meant to last (`--until`), Unix time in
    /// seconds: a reminder that alerts once past, never an automatic undo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// The state value written with the record (`drain`, `maint`, `ready`,
    /// `N%`).
    pub value: String,
}

/// The record's key below the prefix where earlier writers kept it
/// (`~meta/<identity>`), relative to the prefix; every agent downloads it
/// with the state.
pub fn meta_key(identity: &str) -> String {
    format!("{META_PREFIX}{identity}")
}

/// What follows the prefix, less its final `/`, in [`records_prefix`].
pub const RECORDS_SUFFIX: &str = "~meta/";

/// The prefix of the writer's records of the keys below `prefix` (which
/// ends in `/`): `prefix` without its final `/`, then [`RECORDS_SUFFIX`]
/// (`gitlab-haproxy-agent/state~meta/` for `gitlab-haproxy-agent/state/`).
/// A sibling, not below `prefix`: the agents' `?recurse` read of `prefix`
/// (with its `/`) never carries it, and an ACL rule
/// `key_prefix "gitlab-haproxy-agent/state"` (no `/`) covers both.
pub fn records_prefix(prefix: &str) -> String {
    format!(
        "{}{RECORDS_SUFFIX}",
        prefix.strip_suffix('/').unwrap_or(prefix)
    )
}

/// The full key of `identity`'s record ([`records_prefix`]).
pub fn record_key(prefix: &str, identity: &str) -> String {
    format!("{}{identity}", records_prefix(prefix))
}

/// The full key where earlier writers kept `identity`'s record, below the
/// prefix ([`meta_key`]): still read, and deleted by every write of the key.
pub fn legacy_record_key(prefix: &str, identity: &str) -> String {
    format!("{prefix}{}", meta_key(identity))
}

/// Why a record was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadMeta {
    /// Longer than [`MAX_META_LEN`].
    #[error("record longer than {MAX_META_LEN} bytes")]
    TooLong,
    /// Not a JSON object of the expected shape.
    #[error("record is not {{\"by\",\"reason\",\"at\",\"until\",\"value\"}} JSON: {0}")]
    Malformed(String),
}

/// Parses one record.
///
/// # Errors
///
/// [`BadMeta`] for an over-long or malformed record.
pub fn parse_meta(raw: &[u8]) -> Result<KeyMeta, BadMeta> {
    if raw.len() > MAX_META_LEN {
        return Err(BadMeta::TooLong);
    }
    serde_json::from_slice(raw).map_err(|e| BadMeta::Malformed(e.to_string()))
}

impl KeyMeta {
    /// Whether this record, at ModifyIndex `meta_index`, describes the
    /// current write of a key holding `state` at ModifyIndex `key_index`:
    /// it names the same state and was written at or after the key's last
    /// change. Written together they share one ModifyIndex; the record is
    /// newer when the writer wrote the value the key already held (Consul
    /// keeps the ModifyIndex of an identical write). A later write of
    /// another value by hand moves the key past its record.
    pub fn describes(&self, meta_index: u64, state: AdminState, key_index: u64) -> bool {
        meta_index >= key_index && parse_value(self.value.as_bytes()).ok() == Some(state)
    }

    /// Whether the record's `until` is past at `now` (Unix seconds).
    pub fn past_until(&self, now: u64) -> bool {
        self.until.is_some_and(|u| now > u)
    }
}

/// Who writes, why and until when: what one writer run records with every
/// key it writes ([`Author::record`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Author {
    /// `--by`, else the login.
    pub by: String,
    /// `--reason`; empty when none was given.
    pub reason: String,
    /// `--until`, Unix seconds.
    pub until: Option<u64>,
    /// When the command started, Unix seconds: the `at` of every record it
    /// writes (a drain's maint is recorded from when the drain began).
    pub at: u64,
}

impl Author {
    /// Resolves the writer's `--by`, `--reason` and `--until` at `now`
    /// (Unix seconds). `login` is the caller's login (`$SUDO_USER`, else
    /// `$USER`, else `$LOGNAME`), used without `--by`; `unknown` without
    /// either. `reason_required`: the command writes drain or maint.
    ///
    /// # Errors
    ///
    /// A usage text: no `--reason` (or only blanks) where one is required,
    /// `--by` or `--reason` over [`MAX_TEXT_LEN`] bytes or with control
    /// characters, or a bad `--until` ([`parse_until`]).
    pub fn resolve(
        by: Option<&str>,
        login: Option<&str>,
        reason: Option<&str>,
        until: Option<&str>,
        reason_required: bool,
        now: u64,
    ) -> Result<Author, String> {
        let text = |flag: &str, v: &str| {
            let v = v.trim();
            if v.len() > MAX_TEXT_LEN {
                Err(format!("{flag} is longer than {MAX_TEXT_LEN} bytes"))
            } else if v.chars().any(char::is_control) {
                Err(format!("{flag} has a control character"))
            } else {
                Ok(v.to_string())
            }
        };
        let reason = text("--reason", reason.unwrap_or(""))?;
        if reason_required && reason.is_empty() {
            return Err(
                "--reason TEXT is required to write drain or maint: it is recorded \
                 with the key, so whoever finds the servers out knows why (or set \
                 GITLAB_HAPROXY_AGENT_REASON); nothing was written"
                    .into(),
            );
        }
        let by = match by.map(str::trim).filter(|b| !b.is_empty()) {
            Some(b) => text("--by", b)?,
            None => login
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map_or("unknown".into(), str::to_string),
        };
        let until = until.map(|u| parse_until(u, now)).transpose()?;
        Ok(Author {
            by,
            reason,
            until,
            at: now,
        })
    }

    /// The record of a write of `state`.
    pub fn record(&self, state: AdminState) -> KeyMeta {
        KeyMeta {
            by: self.by.clone(),
            reason: self.reason.clone(),
            at: self.at,
            until: self.until,
            value: state.to_string(),
        }
    }
}

/// The writer's records of one prefix read, by the key they describe,
/// judged at `now` (Unix seconds): what `state get`, `list` and `status`
/// show of who wrote each key, why and until when.
#[derive(Debug, Default)]
pub struct Records<'a> {
    /// Both places a record may be ([`records_prefix`] and, from earlier
    /// writers, below the prefix), at most one each.
    by_key: BTreeMap<&'a str, Vec<(KeyMeta, u64)>>,
    now: u64,
}

impl<'a> Records<'a> {
    /// The usable records among `pairs` (full keys below `prefix`, or
    /// below [`records_prefix`]), with their ModifyIndex.
    pub fn read(prefix: &str, pairs: &'a [KvPair], now: u64) -> Records<'a> {
        let sibling = records_prefix(prefix);
        let mut by_key: BTreeMap<&'a str, Vec<(KeyMeta, u64)>> = BTreeMap::new();
        for p in pairs {
            let key = match p.key.strip_prefix(sibling.as_str()) {
                Some(key) => key,
                None => match p.key.strip_prefix(prefix) {
                    Some(rel) => match rel.strip_prefix(META_PREFIX) {
                        Some(key) => key,
                        None => continue,
                    },
                    None => continue,
                },
            };
            if let Ok(meta) = parse_meta(&p.value) {
                by_key.entry(key).or_default().push((meta, p.modify_index));
            }
        }
        Records { by_key, now }
    }

    /// The record of `key` that describes the write `pair` shows
    /// ([`KeyMeta::describes`]), the later one when both places hold one.
    pub fn of(&self, key: &str, pair: &KvPair) -> Option<&KeyMeta> {
        let state = parse_value(&pair.value).ok()?;
        let found = self.by_key.get(key)?.iter();
        found
            .filter(|(meta, index)| meta.describes(*index, state, pair.modify_index))
            .max_by_key(|(_, index)| *index)
            .map(|(meta, _)| meta)
    }

    /// [`describe`] of that record, at `now`.
    pub fn describe(&self, key: &str, pair: &KvPair) -> String {
        describe(self.of(key, pair), self.now)
    }

    /// [`written_json`] of that record.
    pub fn written(&self, key: &str, pair: &KvPair) -> serde_json::Value {
        written_json(self.of(key, pair))
    }
}

/// The state keys among `pairs` (full keys below `prefix`, with the
/// records below [`records_prefix`] beside them) at drain, maint
/// or a weight, in their order, with who wrote them, why and until when at
/// `now`: one line each (`KEY STATE: ...`, [`describe`]), or with `json`
/// `[{"key", "state", "written"}]` ([`written_json`]). What `state status`
/// shows.
pub fn keys_out(prefix: &str, pairs: &[KvPair], now: u64, json: bool) -> serde_json::Value {
    let records = Records::read(prefix, pairs, now);
    let out = pairs.iter().filter_map(|p| {
        let key = p.key.strip_prefix(prefix).filter(|k| !is_control_key(k))?;
        let state = parse_value(&p.value)
            .ok()
            .filter(|s| *s != AdminState::Ready)?;
        Some(match json {
            true => serde_json::json!({"key": key, "state": state.to_string(),
                "written": records.written(key, p)}),
            false => format!("{key} {state}: {}", records.describe(key, p)).into(),
        })
    });
    let out: Vec<serde_json::Value> = out.collect();
    match json {
        true => out.into(),
        false if out.is_empty() => "No key takes servers out (drain, maint or a weight).".into(),
        false => (out.iter().filter_map(|l| l.as_str()))
            .fold("Keys out:".to_string(), |text, l| text + "\n  " + l)
            .into(),
    }
}

/// Parses `--until`: a duration from `now` (`2h`, `90m`, `3d`, humantime's
/// grammar) or an RFC 3339 time ([`parse_rfc3339`]); Unix seconds.
///
/// # Errors
///
/// A text naming both accepted forms, for a value that is neither, one
/// saying a time needs its zone, or that it is not after `now`.
pub fn parse_until(text: &str, now: u64) -> Result<u64, String> {
    let until = match humantime::parse_duration(text) {
        Ok(d) => now.saturating_add(d.as_secs()),
        Err(_) => parse_rfc3339(text).map_err(|why| format!("--until {text:?} {why}"))?,
    };
    if until <= now {
        return Err(format!("--until {text:?} is not in the future"));
    }
    Ok(until)
}

/// An RFC 3339 date-time in Unix seconds: `2026-12-01T18:00:00Z`, with
/// `Z` or an offset (`+01:00`, `-05:00`), `t`/`z` in either case, a space
/// for the `T`, fractions of a second (dropped). A time without a zone is
/// refused: taken as UTC it would be hours off for whoever meant local
/// time, and the reminder would fire at the wrong moment.
///
/// # Errors
///
/// Why the text is not such a time (for "--until TEXT ...").
pub fn parse_rfc3339(text: &str) -> Result<u64, String> {
    let neither = "is neither a duration (2h, 90m, 3d) nor an RFC 3339 time \
                   (2026-12-01T18:00:00Z, 2026-12-01T19:00:00+01:00)";
    let mut t = text.trim().to_ascii_uppercase();
    if t.len() > 10 && t.as_bytes()[10] == b' ' {
        t.replace_range(10..11, "T");
    }
    let (body, offset) = if let Some(body) = t.strip_suffix('Z') {
        (body.to_string(), 0i64)
    } else {
        let n = t.len();
        let zone = t.get(n.saturating_sub(6)..).unwrap_or("").as_bytes();
        let digits = |r: std::ops::Range<usize>| {
            zone.get(r)
                .filter(|d| d.iter().all(u8::is_ascii_digit))
                .map(|d| d.iter().fold(0i64, |acc, c| acc * 10 + i64::from(c - b'0')))
        };
        match (zone.first(), zone.get(3), digits(1..3), digits(4..6)) {
            (Some(sign @ (b'+' | b'-')), Some(b':'), Some(h), Some(m))
                if n > 16 && h < 24 && m < 60 =>
            {
                let sign = if *sign == b'-' { -1 } else { 1 };
                (t[..n - 6].to_string(), sign * (h * 3600 + m * 60))
            }
            _ if humantime::parse_rfc3339_weak(&t).is_ok() => {
                return Err(format!(
                    "has no time zone: add Z for UTC ({}Z) or the offset meant (e.g. {}+01:00); \
                     a time without a zone is not taken as UTC",
                    text.trim(),
                    text.trim()
                ))
            }
            _ => return Err(neither.to_string()),
        }
    };
    let utc = humantime::parse_rfc3339(&format!("{body}Z")).map_err(|_| neither.to_string())?;
    let secs = utc
        .duration_since(UNIX_EPOCH)
        .map_err(|_| neither.to_string())?
        .as_secs();
    u64::try_from(i64::try_from(secs).map_err(|_| neither.to_string())? - offset)
        .map_err(|_| neither.to_string())
}

fn time_text(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

fn ago(unix: u64, now: u64) -> String {
    let d = |s: u64| humantime::format_duration(Duration::from_secs(s)).to_string();
    if unix <= now {
        format!("{} ago", d(now - unix))
    } else {
        format!("in {}", d(unix - now))
    }
}

/// One line saying who wrote a key, why, since when and until when, at
/// `now` (Unix seconds), or [`UNKNOWN`].
pub fn describe(meta: Option<&KeyMeta>, now: u64) -> String {
    let Some(m) = meta else {
        return UNKNOWN.to_string();
    };
    let mut out = format!(
        "by {}, since {} ({})",
        m.by,
        time_text(m.at),
        ago(m.at, now)
    );
    if !m.reason.is_empty() {
        out.push_str(&format!(": {}", m.reason));
    }
    if let Some(u) = m.until {
        let past = if m.past_until(now) { ", PAST" } else { "" };
        out.push_str(&format!("; until {} ({}{past})", time_text(u), ago(u, now)));
    }
    out
}

/// The JSON of who wrote a key: `{"by","reason","since","until"}` (Unix
/// seconds; `until` null when none was given), or the text [`UNKNOWN`].
pub fn written_json(meta: Option<&KeyMeta>) -> serde_json::Value {
    meta.map_or_else(
        || serde_json::json!(UNKNOWN),
        |m| serde_json::json!({"by": m.by, "reason": m.reason, "since": m.at, "until": m.until}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: &str) -> KeyMeta {
        KeyMeta {
            by: "alice".into(),
            reason: "kernel upgrade".into(),
            at: 1_700_000_000,
            until: Some(1_700_007_200),
            value: value.into(),
        }
    }

    #[test]
    fn a_record_round_trips_and_until_is_optional() {
        let m = meta("drain");
        let text = serde_json::to_vec(&m).unwrap();
        assert_eq!(parse_meta(&text), Ok(m));
        let bare = br#"{"by":"bot","at":5,"value":"maint"}"#;
        let m = parse_meta(bare).unwrap();
        assert_eq!((m.reason.as_str(), m.until), ("", None));
    }

    #[test]
    fn bad_records_are_refused() {
        assert!(matches!(parse_meta(b"drain"), Err(BadMeta::Malformed(_))));
        assert!(matches!(
            parse_meta(br#"{"by":"x","value":"drain"}"#),
            Err(BadMeta::Malformed(_))
        ));
        let long = vec![b' '; MAX_META_LEN + 1];
        assert_eq!(parse_meta(&long), Err(BadMeta::TooLong));
    }

    #[test]
    fn a_record_describes_the_write_it_came_with_and_no_later_one() {
        let m = meta("drain");
        // Written together: one ModifyIndex.
        assert!(m.describes(10, AdminState::Drain, 10));
        // The writer wrote drain over drain: the key kept its index.
        assert!(m.describes(12, AdminState::Drain, 10));
        // `consul kv put` of another value, or of the same after another.
        assert!(!m.describes(10, AdminState::Maint, 11));
        assert!(!m.describes(10, AdminState::Drain, 11));
        // A record for another value.
        assert!(!m.describes(10, AdminState::Maint, 10));
        assert!(!meta("DRIAN").describes(10, AdminState::Drain, 10));
        // The spelling does not matter, the state does.
        assert!(meta("DRAIN").describes(10, AdminState::Drain, 10));
    }

    #[test]
    fn until_is_past_only_after_it() {
        let m = meta("drain");
        assert!(!m.past_until(1_700_007_200));
        assert!(m.past_until(1_700_007_201));
        assert!(!KeyMeta { until: None, ..m }.past_until(u64::MAX));
    }

    #[test]
    fn until_is_a_duration_or_a_timestamp_in_the_future() {
        let now = 1_700_000_000;
        assert_eq!(parse_until("2h", now), Ok(now + 7200));
        assert_eq!(parse_until("1d 30m", now), Ok(now + 86_400 + 1800));
        assert_eq!(parse_until("2023-11-14T22:13:20Z", now - 1), Ok(now));
        assert!(parse_until("2023-11-14T22:13:20Z", now)
            .unwrap_err()
            .contains("not in the future"));
        assert!(parse_until("tomorrow", now)
            .unwrap_err()
            .contains("neither a duration"));
    }

    #[test]
    fn a_key_is_described_by_its_record_or_as_unknown() {
        let now = 1_700_003_600;
        let m = meta("drain");
        assert_eq!(
            describe(Some(&m), now),
            "by alice, since 2023-11-14T22:13:20Z (1h ago): kernel upgrade; \
             until 2023-11-15T00:13:20Z (in 1h)"
        );
        assert!(describe(Some(&m), 1_700_007_201).ends_with("(1s ago, PAST)"));
        assert_eq!(describe(None, now), UNKNOWN);
        assert_eq!(written_json(None), serde_json::json!(UNKNOWN));
        assert_eq!(written_json(Some(&m))["until"], 1_700_007_200);
        let pairs = [
            KvPair {
                key: "p/~meta/canary".into(),
                value: serde_json::to_vec(&m).unwrap(),
                modify_index: 7,
                flags: 0,
            },
            KvPair {
                key: "p/~meta/web/a".into(),
                value: b"junk".to_vec(),
                modify_index: 7,
                flags: 0,
            },
        ];
        let r = Records::read("p/", &pairs, now);
        assert_eq!(r.by_key.len(), 1);
        let key = |value: &str, modify_index| KvPair {
            key: "p/canary".into(),
            value: value.into(),
            modify_index,
            flags: 0,
        };
        assert_eq!(r.of("canary", &key("drain", 7)), Some(&m));
        assert_eq!(
            r.of("canary", &key("drain", 8)),
            None,
            "written again since"
        );
        assert_eq!(r.of("canary", &key("maint", 7)), None);
        assert_eq!(r.of("web/a", &key("drain", 1)), None, "unusable");
        assert!(r.describe("canary", &key("drain", 7)).ends_with("(in 1h)"));
        assert_eq!(
            r.written("canary", &key("drain", 8)),
            serde_json::json!(UNKNOWN)
        );
        let record = pairs[0].clone();
        let mut pairs = vec![key("drain", 7), key("ready", 8), key("50%", 9), record];
        pairs[2].key = "p/web/a".into();
        let json = keys_out("p/", &pairs, now, true);
        assert_eq!(json[0]["written"]["by"], "alice", "{json}");
        assert_eq!(
            json[1],
            serde_json::json!({"key": "web/a", "state": "50%", "written": UNKNOWN})
        );
        assert_eq!(
            json.as_array().unwrap().len(),
            2,
            "ready keys and records are not out"
        );
        let text = keys_out("p/", &pairs, now, false);
        let text = text.as_str().unwrap();
        assert!(
            text.starts_with("Keys out:\n  canary drain: by alice, since "),
            "{text}"
        );
        assert!(
            text.ends_with("\n  web/a 50%: unknown, written outside the writer"),
            "{text}"
        );
        assert_eq!(
            keys_out("p/", &[], now, false),
            "No key takes servers out (drain, maint or a weight)."
        );
    }

    #[test]
    fn an_author_needs_a_reason_to_take_servers_out() {
        let now = 1_700_000_000;
        let a = Author::resolve(
            None,
            Some("alice"),
            Some(" upgrade "),
            Some("2h"),
            true,
            now,
        );
        let a = a.unwrap();
        assert_eq!(
            a,
            Author {
                by: "alice".into(),
                reason: "upgrade".into(),
                until: Some(now + 7200),
                at: now,
            }
        );
        assert_eq!(
            a.record(AdminState::Drain),
            KeyMeta {
                by: "alice".into(),
                reason: "upgrade".into(),
                at: now,
                until: Some(now + 7200),
                value: "drain".into()
            }
        );
        for reason in [None, Some(""), Some("  ")] {
            let e = Author::resolve(None, Some("alice"), reason, None, true, now).unwrap_err();
            assert!(e.contains("--reason TEXT is required"), "{e}");
        }
        // Bringing servers back needs none.
        let a = Author::resolve(Some("chatops (bob)"), None, None, None, false, now).unwrap();
        assert_eq!((a.by.as_str(), a.reason.as_str()), ("chatops (bob)", ""));
        let a = Author::resolve(None, None, None, None, false, now).unwrap();
        assert_eq!(a.by, "unknown");
        let long = "x".repeat(MAX_TEXT_LEN + 1);
        assert!(Author::resolve(None, None, Some(&long), None, true, now).is_err());
        assert!(Author::resolve(Some("a\nb"), None, Some("r"), None, true, now).is_err());
        assert!(Author::resolve(None, None, Some("r"), Some("soon"), true, now).is_err());
        // The record of the longest texts, every byte escaped, fits.
        let quotes = "\"".repeat(MAX_TEXT_LEN);
        let a = Author::resolve(Some(&quotes), None, Some(&quotes), Some("1d"), true, now);
        let record = serde_json::to_vec(&a.unwrap().record(AdminState::Maint)).unwrap();
        assert!(record.len() > 4096);
        assert!(parse_meta(&record).is_ok());
    }

    #[test]
    fn until_takes_rfc3339_in_full_and_refuses_a_time_without_a_zone() {
        let now = 1_700_000_000;
        let utc = 1_764_612_000; // 2025-12-01T18:00:00Z
        for text in [
            "2025-12-01T18:00:00Z",
            "2025-12-01t18:00:00z",
            "2025-12-01 18:00:00Z",
            "2025-12-01T18:00:00.250Z",
            "2025-12-01T19:00:00+01:00",
            "2025-12-01T13:00:00-05:00",
            "2025-12-01t13:00:00-05:00",
            "2025-12-02T03:30:00+09:30",
        ] {
            assert_eq!(parse_until(text, now), Ok(utc), "{text}");
        }
        for text in ["2025-12-01T18:00:00", "2025-12-01 18:00:00"] {
            let e = parse_until(text, now).unwrap_err();
            assert!(e.contains("has no time zone: add Z for UTC"), "{e}");
        }
        for text in [
            "soon",
            "2025-12-01T18:00:00+1:00",
            "2025-12-01T18:00:00+24:00",
        ] {
            let e = parse_until(text, now).unwrap_err();
            assert!(e.contains("is neither a duration"), "{text}: {e}");
        }
        assert_eq!(parse_until("2h", now), Ok(now + 7200));
        let e = parse_until("2020-01-01T00:00:00+01:00", now).unwrap_err();
        assert!(e.contains("not in the future"), "{e}");
    }

    #[test]
    fn records_lie_beside_the_prefix_and_the_later_of_both_places_describes() {
        let prefix = "gitlab-haproxy-agent/state/";
        assert_eq!(records_prefix(prefix), "gitlab-haproxy-agent/state~meta/");
        assert_eq!(
            record_key(prefix, "web/a"),
            "gitlab-haproxy-agent/state~meta/web/a"
        );
        assert!(!record_key(prefix, "web/a").starts_with(prefix));
        assert_eq!(
            legacy_record_key(prefix, "web/a"),
            "gitlab-haproxy-agent/state/~meta/web/a"
        );
        let pair = |key: String, m: &KeyMeta, modify_index| KvPair {
            key,
            value: serde_json::to_vec(m).unwrap(),
            modify_index,
            flags: 0,
        };
        let (old, new) = (
            meta("drain"),
            KeyMeta {
                by: "bob".into(),
                ..meta("drain")
            },
        );
        let key = KvPair {
            key: format!("{prefix}web/a"),
            value: b"drain".to_vec(),
            modify_index: 5,
            flags: 0,
        };
        // An earlier writer's record alone still describes the key.
        let pairs = [
            key.clone(),
            pair(legacy_record_key(prefix, "web/a"), &old, 5),
        ];
        let r = Records::read(prefix, &pairs, 0);
        assert_eq!(r.of("web/a", &key).map(|m| m.by.as_str()), Some("alice"));
        // Both: the later that describes the write.
        let pairs = [
            pair(legacy_record_key(prefix, "web/a"), &old, 5),
            pair(record_key(prefix, "web/a"), &new, 7),
        ];
        let r = Records::read(prefix, &pairs, 0);
        assert_eq!(r.of("web/a", &key).map(|m| m.by.as_str()), Some("bob"));
        let pairs = [
            pair(legacy_record_key(prefix, "web/a"), &old, 8),
            pair(record_key(prefix, "web/a"), &new, 7),
        ];
        let r = Records::read(prefix, &pairs, 0);
        assert_eq!(r.of("web/a", &key).map(|m| m.by.as_str()), Some("alice"));
        // A sibling record is no key of the prefix.
        let pairs = [key.clone(), pair(record_key(prefix, "web/a"), &new, 5)];
        let out = keys_out(prefix, &pairs, 0, true);
        assert_eq!(out.as_array().unwrap().len(), 1, "{out}");
        assert_eq!(out[0]["written"]["by"], "bob", "{out}");
    }

    #[test]
    fn meta_keys_lie_below_the_reserved_folder() {
        assert_eq!(meta_key("web/web-01"), "~meta/web/web-01");
        assert!(is_meta_key("~meta/canary"));
        assert!(is_meta_key("~meta/"));
        assert!(!is_meta_key("canary"));
        assert!(!is_meta_key("~metadata"));
    }
}
