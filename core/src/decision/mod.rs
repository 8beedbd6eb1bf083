//! The decision core: every rule that decides what the agent serves, in one
//! place with no I/O, no clock and no runtime (the shape of ntpd-rs's
//! `ntp-proto`). The daemon (the agent's `watcher`) performs the
//! [`Request`] the core asks for, hands back the [`Response`], publishes the
//! [`served::ServedState`] when it changed, and writes it to disk.
//!
//! The rules, each with its table test below and driven through random
//! fault schedules by `tests/simulation.rs`:
//!
//! - **Consul's index rules** (api-docs/features/blocking): block on the last
//!   index; a lower index is a reset (re-read from 0); an index of 0 counts
//!   as 1; every read after a failure (and the first after a start) is a
//!   full read without an index.
//! - **Lost data** (a `-dev` restart, a rebuilt cluster, an old snapshot
//!   restored): the index went backwards and something moved
//!   (nothing moved: a reaped tombstone, not a loss), the writer's write
//!   generation ([`crate::model::generation`]) is not one the served
//!   generation leads to (a restore, whatever is written after it; not the
//!   writer's new history after the generation vanished), the
//!   [`STORE_ID_KEY`] the state had vanished or changed (whatever the
//!   index), or an answer that did not move past the served index shows a
//!   key rewritten (with ACLs off, any difference). A value from such a
//!   store that would give a server more traffic in the order of traffic
//!   ([`crate::model::value::Traffic`]: maint < drain < 0% < lower weight <
//!   higher weight, `ready` at 100%) is not applied (held `rolled_back`)
//!   until the key is written again or `state release-rollback`; a held key
//!   that may answer nothing of its own (gone, or a value that appeared)
//!   caps its lines at its state.
//! - **Invalid values**: held at the key's last valid state, or skipped
//!   (the next identity on the line decides) when none is known.
//! - **Filtered views** (ACLs): Consul drops keys a token may not read from
//!   a recursive read, and a parked blocking query keeps the policy it
//!   started with. A key the state holds that an answer lacks is read
//!   directly: 403 is hidden (a drain or maint held; a `ready` or weight
//!   skipped, since it may have been cleared unseen and would outrank a
//!   later identity), 404 is a delete; then the store id is
//!   read, so a direct read from a store that lost data meanwhile is not
//!   taken for the answer's. With ACLs disabled
//!   (`GET /v1/acl/token/self` answers 401 "ACL support disabled", asked at
//!   start and, after a failure, once the next read succeeds, before it is
//!   applied) nothing is filtered and no key is read.
//!   After a 403 on a direct read, before an empty answer is applied and
//!   with each token read from its file, the token's read access to the
//!   whole prefix is checked (`~read-check`, 403 for a token that may not
//!   read it). An answer whose index moved past every
//!   ModifyIndex it shows, with no delete to explain it, is replaced by one
//!   fresh read; so is one that lacked keys a direct read then shows
//!   present (filtered by the older policy of a parked query), when its
//!   index is past theirs too: it may hide a key the state does not hold.
//!   An answer at the same index that shows other keys (a query parked
//!   under a narrower policy) is applied like a change.
//! - **Stale reads** ([`stale`]): an answer from a server that is behind,
//!   cut off or leaderless is held and confirmed by a default read.
//! - **Parked queries** ([`Core::on_index_check`]): a blocking query parked
//!   on a server cut off from the quorum answers nothing until its wait
//!   ends; while one is parked the daemon checks the prefix's index every
//!   `--index-check`, and the core re-issues the query when the check shows
//!   it behind or its server cut off, reads again from 0 when it shows the
//!   index below it (a restore), and replaces a re-issued query still
//!   unanswered a few checks later by a full read.
//!
//! The core is a state machine (`machine.rs`): one phase says what it waits
//! for (the ACL probe, a prefix read, or a check of an answer before it is
//! merged: its read check, direct reads, the store id), and each response
//! is matched against it. Each phase carries typed state (`phase.rs`), not
//! flags: a read is full or blocking (with what index checks found of it:
//! not behind, behind once, re-issued) and knows why it was sent (the next
//! read, a fresh read after a refusal, re-issued for a cut-off server, a
//! reset); an answer being confirmed knows what the loss rules found of it
//! and which checks are still due. `protocol.rs` holds what the core and
//! the daemon say to each other; [`served`] the state served, its merge rules and its
//! file.
//!
//! The served state survives restarts: a core built with the state read
//! from disk answers from it at once and judges the first Consul answer
//! against it by the same rules.

mod config;
mod loss;
mod machine;
mod phase;
mod protocol;
pub mod served;
pub mod stale;

pub use config::{CoreConfig, Rule, Rules};
pub use machine::{Core, REPLACE_UNANSWERED_AFTER};
pub use protocol::{
    BehindStep, CheckOutput, Delay, IndexCheck, KeyRead, Next, Note, Output, Refused, Request,
    Response, Unconfirmed,
};
pub use served::{held_answer, held_state, parse_held_state, HoldCause, STORE_ID_KEY};

#[cfg(test)]
mod tests;
