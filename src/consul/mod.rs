//! Consul, on the model: [`client`] speaks HTTP to the local agent (blocking
//! reads, compare-and-set, transactions), [`generation`] makes a
//! transaction advance the store's write generation, [`types`] holds what it sends and
//! answers, [`session`] the Consul sessions that hold keys, [`token`] the ACL token, [`tls`] TLS to it, [`config`] where
//! Consul is. Every call returns a typed result; what
//! it counts as (a metric label, an exit status) is for the caller to say.

pub mod client;
pub mod config;
pub mod generation;
pub mod peers;
pub mod records;
pub mod session;
pub mod tls;
pub mod token;
pub mod types;

pub use client::{
    ConsulClient, KEYS_PER_TXN, MAX_TXN_OPS, MAX_WAIT, READ_CHECK_KEY, REQUEST_TIMEOUT,
    TIMEOUT_MARGIN,
};
pub use generation::{AdvanceError, GENERATION_ATTEMPTS};
pub use session::{Holder, Holders, SessionInfo};
pub use token::TokenSource;
pub use types::{
    decode_held_pairs, decode_pairs, decode_txn, ConsulError, KvPair, PrefixAnswer, ReadMeta,
    TxnError, TxnOp, TxnOutcome,
};
