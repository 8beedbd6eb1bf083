//! The served state: for every key below the prefix, what Consul shows, the
//! state answered and why it differs (a hold), with the rules that merge one
//! Consul answer into it. This is what the agent keeps on disk, so that a
//! restart answers what the agent answered before it. `state.rs` holds the
//! data, `view.rs` one answer taken apart, `merge.rs` the hold rules, `file.rs`
//! the on-disk format.

mod file;
mod merge;
mod state;
mod view;

pub use crate::model::identity::STORE_ID_KEY;
pub use file::StateFileError;
pub use merge::{Change, MergeInput, Probe};
pub use state::{
    capped_answer, held_answer, held_state, parse_held_state, Hold, HoldCause, KeyRecord, OutKey,
    ServedState,
};
pub use view::{AnswerView, ConsulKey};
