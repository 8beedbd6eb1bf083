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
//!   decision/      |         what the agent serves: every rule, no I/O, no
//!      |           |         clock (the daemon performs what it asks for)
//!      +-----+-----+
//!            |
//!         consul/            HTTP client, KV and txn types, token, config
//!            |
//!         cli.rs             every option (clap structs)
//!            |
//!         model/             value and agent-send grammar, snapshot, drain
//!                            marks: no I/O
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod check_ready;
pub mod cli;
pub mod consul;
pub mod decision;
pub mod fleet;
pub mod model;
pub mod writer;

pub use agent::run;
