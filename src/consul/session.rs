//! Consul sessions on state keys (api-docs/session, api-docs/kv): which
//! session holds a key ([`Holders`], from each entry's `Session`), and what
//! that session does to it when it ends ([`SessionInfo`], from
//! `/v1/session/info/ID`). A plain PUT keeps a key's session; when the
//! session is invalidated (destroyed, its node or checks failing, its TTL
//! run out) Consul deletes the key (`Behavior` `delete`) or unbinds it
//! (`release`). The writer releases a key it writes in the same transaction
//! ([`super::TxnOp::Unlock`]).

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use super::client::{status_error, ConsulClient};
use super::types::ConsulError;
pub use super::types::Holders;

/// A session as `/v1/session/info/ID` describes it, the fields an operator
/// needs to find its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session ID.
    #[serde(rename(deserialize = "ID"))]
    pub id: String,
    /// The name its creator gave it (often the tool's); may be empty.
    #[serde(rename(deserialize = "Name"), default)]
    pub name: String,
    /// The Consul node it is tied to: the session ends when that node's
    /// health checks fail.
    #[serde(rename(deserialize = "Node"), default)]
    pub node: String,
    /// What Consul does to the keys it holds when it ends: `delete` or
    /// `release` (Consul's default).
    #[serde(rename(deserialize = "Behavior"), default)]
    pub behavior: String,
    /// Its TTL (`"30s"`), empty for none.
    #[serde(rename(deserialize = "TTL"), default)]
    pub ttl: String,
}

/// A session holding a key, as the writer names it: its ID, and what
/// Consul said of it (`None`: not asked, gone, or not readable with the
/// token, `reason` then says which).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// The session ID (the key's `Session`).
    pub id: String,
    /// `/v1/session/info/ID`, when Consul gave it.
    pub info: Option<SessionInfo>,
    /// Why `info` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

impl Holder {
    /// True unless Consul said the session releases its keys: a session
    /// with Behavior `delete`, or one not known here, may delete the key.
    pub fn may_delete(&self) -> bool {
        self.info.as_ref().is_none_or(|i| i.behavior != "release")
    }

    /// `session ID (name "x", node n, behavior delete)`, or with why its
    /// details are missing.
    pub fn describe(&self) -> String {
        match &self.info {
            Some(i) => {
                let ttl = match i.ttl.as_str() {
                    "" => String::new(),
                    t => format!(", TTL {t}"),
                };
                format!(
                    "session {} (name {:?}, node {}, behavior {}{ttl})",
                    self.id, i.name, i.node, i.behavior
                )
            }
            None => format!(
                "session {} ({})",
                self.id,
                self.unknown.as_deref().unwrap_or("not known")
            ),
        }
    }

    /// What Consul does to the key when the session ends.
    pub fn when_it_ends(&self) -> &'static str {
        match self.info.as_ref().map(|i| i.behavior.as_str()) {
            Some("release") => "Consul unbinds the key when the session ends (its value stays)",
            Some(_) => "Consul deletes the key when the session ends",
            None => "Consul deletes the key when the session ends if its Behavior is delete",
        }
    }
}

impl ConsulClient {
    /// `GET /v1/session/info/ID`: the session, or `None` when Consul does
    /// not know it (it answers `[]`; also what a token without
    /// `session:read` on its node sees, as Consul filters the answer).
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, error statuses and an answer
    /// that is not a list of sessions.
    pub async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        let id: String = id
            .chars()
            .filter(|c| c.is_ascii_hexdigit() || *c == '-')
            .collect();
        let url = format!("{}/v1/session/info/{id}", self.addr());
        let (status, body) = self.get(&url).await?;
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        let list: Option<Vec<SessionInfo>> = serde_json::from_slice(&body)
            .map_err(|e| ConsulError::Decode(format!("session info JSON: {e}")))?;
        Ok(list.unwrap_or_default().into_iter().find(|s| s.id == id))
    }

    /// The [`Holder`] of session `id`: its info, or why it is missing
    /// (never an error: a key is written or shown whether or not its
    /// session can be described).
    pub async fn holder(&self, id: &str) -> Holder {
        let (info, unknown) = match self.session_info(id).await {
            Ok(Some(info)) => (Some(info), None),
            Ok(None) => (None, Some("gone, or not readable with this token".into())),
            Err(e) => (None, Some(format!("its details not read: {e}"))),
        };
        Holder {
            id: id.to_string(),
            info,
            unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_info_decodes_as_consul_answers() {
        // Consul 1.8.7's answer, as recorded.
        let body = br#"[{"ID":"2b62df83-7e27-8e8e-c464-0d615ae73329","Name":"automation-x",
            "Node":"vm","LockDelay":15000000000,"Behavior":"delete","TTL":"",
            "NodeChecks":["serfHealth"],"ServiceChecks":null,"CreateIndex":13,"ModifyIndex":13}]"#;
        let list: Vec<SessionInfo> = serde_json::from_slice(body).unwrap();
        let holder = Holder {
            id: list[0].id.clone(),
            info: Some(list[0].clone()),
            unknown: None,
        };
        assert!(holder.may_delete());
        assert_eq!(
            holder.describe(),
            "session 2b62df83-7e27-8e8e-c464-0d615ae73329 (name \"automation-x\", node vm, \
             behavior delete)"
        );
        let release = Holder {
            info: Some(SessionInfo {
                behavior: "release".into(),
                ttl: "30s".into(),
                ..list[0].clone()
            }),
            ..holder
        };
        assert!(!release.may_delete());
        assert!(release.describe().ends_with("behavior release, TTL 30s)"));
        let unknown = Holder {
            id: "x".into(),
            info: None,
            unknown: Some("gone".into()),
        };
        assert!(unknown.may_delete(), "a session not known here may delete");
        assert_eq!(unknown.describe(), "session x (gone)");
    }
}
