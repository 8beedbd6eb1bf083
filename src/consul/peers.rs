//! The servers of the datacenter, as Consul's raft configuration names
//! them: where the agent finds its fallback addresses when no list is given
//! ([`crate::agent::discovery`]).

use std::time::Duration;

use reqwest::StatusCode;

use super::client::{status_error, ConsulClient};
use super::types::ConsulError;

/// Most bytes a peer list may take: 64 KiB (a datacenter's 3 to 7 servers
/// take about 100 bytes).
const MAX_PEERS_BODY: usize = 64 << 10;

impl ConsulClient {
    /// `GET /v1/status/peers?stale`: the raft peers of this agent's
    /// datacenter, as `ip:port` server RPC addresses (Consul 1.8.7
    /// `agent/consul/status_endpoint.go`: a client agent forwards it to a
    /// server, which, asked `stale`, answers from its own raft
    /// configuration without asking its leader; no ACL is checked).
    /// `timeout` bounds the whole request.
    ///
    /// # Errors
    ///
    /// [`ConsulError`] for transport failures, a timeout, error statuses
    /// (500 "No known Consul servers" from a client agent that has none)
    /// and an answer that is not a JSON list of strings.
    pub async fn raft_peers(&self, timeout: Duration) -> Result<Vec<String>, ConsulError> {
        let url = format!("{}/v1/status/peers?stale", self.addr());
        let (status, body) = tokio::time::timeout(timeout, self.get(&url))
            .await
            .map_err(|_| ConsulError::Timeout {
                addr: self.addr().to_string(),
                after: timeout,
            })??;
        if status != StatusCode::OK {
            return Err(status_error(status, &body));
        }
        if body.len() > MAX_PEERS_BODY {
            return Err(ConsulError::Decode(format!(
                "/v1/status/peers: {} bytes, more than {MAX_PEERS_BODY}",
                body.len()
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| ConsulError::Decode(format!("/v1/status/peers: {e}")))
    }
}
