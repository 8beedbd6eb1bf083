//! A transaction that also advances the store's write generation
//! ([`crate::model::generation`]) by compare-and-set, as every transaction
//! of the writer does, so that the agents can tell a store that moved on
//! from one that lost writes. Refused only because another writer moved
//! the generation first, it is sent again on the new one.

use std::time::Duration;

use super::client::ConsulClient;
use super::types::{ConsulError, TxnOp, TxnOutcome};
use crate::model::generation::{Generation, GENERATION_KEY};

/// How many times a transaction is sent when each time only the
/// generation's compare-and-set fails (another writer's transaction came
/// between the read of the generation and the write).
pub const GENERATION_ATTEMPTS: u64 = 5;

/// Why a transaction that advances the generation wrote nothing, other
/// than its own operations' compare-and-set.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    /// The request failed.
    #[error(transparent)]
    Consul(#[from] ConsulError),
    /// An ACL refused an operation (`Consul`'s reason, or that the token
    /// may not write the generation).
    #[error("{0}")]
    Denied(String),
    /// The generation key holds something no writer wrote.
    #[error(
        "{key} holds {value:?}, which is not a write generation (`<number> <16-hex id>...`, \
         written only by this CLI); nothing written. Deleting it is safe: `consul kv delete \
         {key}`, and the next write starts a new history; every agent then takes the \
         vanished generation for lost data and holds the drains and maints it serves, as \
         after a restore"
    )]
    Bad {
        /// The full key.
        key: String,
        /// Its value (at most 80 characters of it).
        value: String,
    },
    /// Another writer moved the generation before every attempt.
    #[error(
        "conflict: {key} moved before each of {GENERATION_ATTEMPTS} attempts (other writers at \
         work); this transaction wrote nothing. Re-run"
    )]
    Raced {
        /// The full key.
        key: String,
    },
}

impl ConsulClient {
    /// Applies `ops` in one transaction with, as its last operation, the
    /// write of `prefix`[`GENERATION_KEY`] to the next generation
    /// (the first when absent), compare-and-set on the ModifyIndex read
    /// just before. The generation's own result and error are left out of
    /// the outcome, so positions in it are positions in `ops`: a
    /// [`TxnOutcome::RolledBack`] names only `ops` that were refused.
    ///
    /// # Errors
    ///
    /// [`AdvanceError`]: an ACL refused an operation, the generation is
    /// not one, it moved before every one of [`GENERATION_ATTEMPTS`]
    /// attempts, or a request failed.
    pub async fn txn_advancing(
        &self,
        prefix: &str,
        ops: &[TxnOp],
    ) -> Result<TxnOutcome, AdvanceError> {
        let key = &format!("{prefix}{GENERATION_KEY}");
        for attempt in 0..GENERATION_ATTEMPTS {
            if attempt > 0 {
                // Writers that raced spread out before they try again.
                let ms = fastrand::u64(0..=10 * attempt);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let id = fastrand::u64(..);
            let (next, index) = match self.get_key(key).await? {
                None => (Generation::first(id), 0),
                Some(p) => match Generation::parse(&p.value) {
                    Ok(current) => (current.next(id), p.modify_index),
                    Err(_) => {
                        let value = String::from_utf8_lossy(&p.value).chars().take(80).collect();
                        let key = key.to_string();
                        return Err(AdvanceError::Bad { key, value });
                    }
                },
            };
            let mut all = ops.to_vec();
            all.push(TxnOp::put_cas(key, next.to_string().as_bytes(), index));
            let errors = match self.txn(&all).await? {
                TxnOutcome::Committed(mut results) => {
                    results.retain(|p| p.key != *key);
                    return Ok(TxnOutcome::Committed(results));
                }
                TxnOutcome::RolledBack(errors) => errors,
            };
            let (generation, others): (Vec<_>, Vec<_>) =
                errors.into_iter().partition(|e| e.op_index == ops.len());
            if let Some(e) = others.iter().find(|e| e.is_permission_denied()) {
                return Err(AdvanceError::Denied(e.what.clone()));
            }
            if generation.iter().any(|e| e.is_permission_denied()) {
                return Err(AdvanceError::Denied(format!(
                    "the token may not write {key}, which every writer transaction advances \
                     (give it write on the whole prefix)"
                )));
            }
            if !others.is_empty() {
                return Ok(TxnOutcome::RolledBack(others));
            }
        }
        Err(AdvanceError::Raced {
            key: key.to_string(),
        })
    }
}
