//! The writer's records in Consul ([`crate::model::meta`]): where each is
//! written with its key, how they are read from both places, and the move
//! of an earlier writer's records from below the prefix to the sibling
//! prefix ([`records_prefix`]).

use std::time::Duration;

use super::client::{ConsulClient, MAX_TXN_OPS};
use super::generation::AdvanceError;
use super::types::{ConsulError, KvPair, TxnOp, TxnOutcome};
use crate::cli::Consistency;
use crate::model::meta::{legacy_record_key, record_key, records_prefix, META_PREFIX};

/// The operations on `key`'s record that go with a write of the key
/// (`record` `Some`, as JSON) or its delete (`None`): under
/// [`records_prefix`] with the delete of an earlier writer's record below
/// the prefix (two operations), or, with `beside`, below the prefix as
/// earlier writers did (one), for a token that may not write the sibling.
pub fn record_ops(
    prefix: &str,
    key: &str,
    record: Option<&impl serde::Serialize>,
    beside: bool,
) -> Vec<TxnOp> {
    let legacy = legacy_record_key(prefix, key);
    match beside {
        true => vec![TxnOp::record(legacy, record)],
        false => vec![
            TxnOp::record(record_key(prefix, key), record),
            TxnOp::Delete { key: legacy },
        ],
    }
}

/// What [`ConsulClient::migrate_records`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Records found below `<prefix>~meta/`.
    pub found: usize,
    /// Moved to [`records_prefix`].
    pub moved: usize,
    /// Left where they were: changed by a writer between the read and the
    /// move (the next run moves them).
    pub raced: usize,
}

impl ConsulClient {
    /// The names of the records under [`records_prefix`]`(prefix)`, relative
    /// to it (the state keys they describe), with the records prefix's
    /// `X-Consul-Index`: `GET /v1/kv/<records prefix>?keys` (`&stale` when
    /// `stale`), keys only (no values: a few dozen bytes a record, gzipped),
    /// within the client's request timeout. Empty for a 404 (no record the
    /// token may see), `None` for a 403.
    ///
    /// # Errors
    ///
    /// Transport errors, a timeout, other error statuses, a body that is not
    /// a JSON list of strings.
    pub async fn record_names(
        &self,
        prefix: &str,
        stale: bool,
    ) -> Result<(Option<Vec<Box<str>>>, Option<u64>), ConsulError> {
        let sibling = records_prefix(prefix);
        let (keys, index) = self.list_keys(&sibling, stale).await?;
        let names = keys.map(|keys| {
            keys.iter()
                .filter_map(|k| k.strip_prefix(&sibling))
                .filter(|k| !k.is_empty())
                .map(Into::into)
                .collect()
        });
        Ok((names, index))
    }

    /// Every record under [`records_prefix`]`(prefix)` (full keys), in a
    /// default-consistency read; none for an empty prefix.
    ///
    /// # Errors
    ///
    /// As [`ConsulClient::read_prefix`] (403 for a token that may not
    /// read them).
    pub async fn read_records(&self, prefix: &str) -> Result<Vec<KvPair>, ConsulError> {
        let sibling = records_prefix(prefix);
        let read = self.read_prefix(&sibling, 0, Duration::ZERO, Consistency::Default);
        Ok(read.await?.0.pairs)
    }

    /// `key`'s records in both places (full keys), and why a place could
    /// not be read.
    pub async fn key_records(&self, prefix: &str, key: &str) -> (Vec<KvPair>, Vec<String>) {
        let (mut found, mut errors) = (Vec::new(), Vec::new());
        for place in [record_key(prefix, key), legacy_record_key(prefix, key)] {
            match self.get_key(&place).await {
                Ok(pair) => found.extend(pair),
                Err(e) => errors.push(format!("cannot read the record {place}: {e}")),
            }
        }
        (found, errors)
    }

    /// Moves every record below `<prefix>~meta/` to [`records_prefix`],
    /// unchanged: each put there and deleted here with compare-and-set on
    /// the ModifyIndex read, up to 31 a transaction, advancing the write
    /// generation (as every delete below the prefix does). With `dry_run`
    /// only counts them.
    ///
    /// # Errors
    ///
    /// [`AdvanceError`]: a read or transaction failed, or an ACL refused it.
    pub async fn migrate_records(
        &self,
        prefix: &str,
        dry_run: bool,
    ) -> Result<Migration, AdvanceError> {
        let below = format!("{prefix}{META_PREFIX}");
        let pairs = self.list_prefix(prefix).await?.pairs;
        let old: Vec<&KvPair> = (pairs.iter())
            .filter(|p| p.key.len() > below.len() && p.key.starts_with(&below))
            .collect();
        let mut done = Migration {
            found: old.len(),
            moved: 0,
            raced: 0,
        };
        for chunk in old.chunks((MAX_TXN_OPS - 1) / 2).filter(|_| !dry_run) {
            let ops: Vec<TxnOp> = (chunk.iter())
                .flat_map(|p| {
                    let key = record_key(prefix, &p.key[below.len()..]);
                    let value = p.value.clone();
                    let (old, index) = (p.key.clone(), p.modify_index);
                    [
                        TxnOp::Set { key, value },
                        TxnOp::DeleteCas { key: old, index },
                    ]
                })
                .collect();
            match self.txn_advancing(prefix, &ops).await? {
                TxnOutcome::Committed(_) => done.moved += chunk.len(),
                TxnOutcome::RolledBack(_) => done.raced += chunk.len(),
            }
        }
        Ok(done)
    }
}
