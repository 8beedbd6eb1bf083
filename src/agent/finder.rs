//! What the watcher keeps of its reads of the Consul servers while
//! fallbacks are found from Consul ([`crate::agent::discovery`]): the read
//! in flight, when the next is due, and how a found address's client is
//! made. The reads themselves are the watcher's.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::discovery::Discovery;
use crate::consul::{ConsulClient, ConsulError};

/// Makes the client of an address found, as `--consul-addr`'s is made
/// (same token, same settings).
pub type ClientFactory = Arc<dyn Fn(&str) -> anyhow::Result<ConsulClient> + Send + Sync>;

/// What a read of the servers found: the address that answered and the
/// peers, or the last error.
pub type Answer = (Option<String>, Result<Vec<String>, ConsulError>);

/// The reads of the servers, while fallbacks are found.
pub struct Finder {
    pub(crate) discovery: Discovery,
    pub(crate) make: ClientFactory,
    pub(crate) task: Option<JoinHandle<Answer>>,
    /// When the next read starts.
    pub(crate) due: Instant,
    /// When the last one started.
    pub(crate) started: Option<Instant>,
    /// Whether the last read failed (a change is logged once).
    pub(crate) failing: bool,
}

impl Finder {
    /// A finder whose first read is due now.
    pub fn new(discovery: Discovery, make: ClientFactory) -> Self {
        Finder {
            discovery,
            make,
            task: None,
            due: Instant::now(),
            started: None,
            failing: false,
        }
    }
}
