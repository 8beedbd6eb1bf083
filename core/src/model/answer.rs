//! What one Consul read answers (api-docs/kv, api-docs/features/consistency):
//! the keys of a prefix read at an index, and the freshness headers sent
//! with every read. The HTTP client builds them; the decision core judges
//! them.

use std::time::Duration;

use super::snapshot::KvPair;

/// The answer to a prefix read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixAnswer {
    /// `X-Consul-Index`, exactly as sent (0 is possible; callers clamp).
    pub index: u64,
    /// The keys; empty for a 404 (a prefix with no keys).
    pub pairs: Vec<KvPair>,
    /// The raw body size in bytes, for logs and benchmarks.
    pub body_bytes: usize,
}

/// The freshness headers Consul sends with every read
/// (api-docs/features/consistency): each `None` when missing or malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadMeta {
    /// `X-Consul-LastContact`: time since the answering server last heard
    /// from the leader (0 on the leader), sent in milliseconds.
    pub last_contact: Option<Duration>,
    /// `X-Consul-KnownLeader`: whether the answering server knows a leader.
    pub known_leader: Option<bool>,
    /// `X-Consul-Results-Filtered-By-ACLs`: whether the token's ACL dropped
    /// entries from the answer. Sent by Consul 1.13 and later when it did;
    /// 1.8.7 never sends it.
    pub filtered_by_acls: Option<bool>,
}

impl ReadMeta {
    /// Reads the headers from an answer, `text` giving a header's value by
    /// name (`None` when missing or not text): `X-Consul-LastContact` as a
    /// whole number of milliseconds, `X-Consul-KnownLeader` and
    /// `X-Consul-Results-Filtered-By-ACLs` as `true` or `false` exactly
    /// (Consul's spelling); anything else is `None`.
    pub fn from_header<'a>(text: impl Fn(&str) -> Option<&'a str>) -> ReadMeta {
        ReadMeta {
            last_contact: text("X-Consul-LastContact")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_millis),
            known_leader: text("X-Consul-KnownLeader").and_then(flag),
            filtered_by_acls: text("X-Consul-Results-Filtered-By-ACLs").and_then(flag),
        }
    }
}

/// `true` or `false` exactly (Consul's spelling).
fn flag(v: &str) -> Option<bool> {
    match v.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}
