//! gitlab-haproxy-agent: answers HAProxy agent-checks with the admin state
//! (ready, drain, maint, weight) desired in Consul KV.
//!
//! Data flows one way, and each layer uses only those below it:
//!
//! ```text
//!   main.rs                  parses the options, runs the daemon or the writer
//!   agent/      writer/      the daemon and the `state` CLI, side by side;
//!      |           |  \      neither imports the other
//!      |           |  fleet/ the fleet through the Prometheus that scrapes
//!      |           |  /      the agents (the writer's; phrases of decision/)
//!      +-----+-----+
//!            |
//!         consul/            HTTP client, KV and txn types, token, config
//!            |
//!         cli.rs             every option (clap structs)
//!   - - - - -|- - - - - - -  the crate gitlab-haproxy-agent-core (core/):
//!   decision/   route        what the agent serves (every rule) and which
//!      |          |          Consul address it reads through: no I/O, no
//!      +----+-----+          clock (the daemon performs what they ask for)
//!           |
//!         model/             value and agent-send grammar, snapshot, drain
//!                            marks, one read's answer: no I/O
//! ```
//!
//! The core's modules are re-exported here under the paths they had in this
//! crate ([`model`], [`decision`], `agent::route`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod check_ready;
pub mod cli;
pub mod consul;
pub mod fleet;
pub mod writer;

pub use gitlab_haproxy_agent_core::{decision, model};

pub use agent::run;
