//! The pure core of gitlab-haproxy-agent (the shape of ntpd-rs's
//! `ntp-proto`): every rule that decides what a load balancer is told, with
//! no I/O, no runtime, no HTTP and no clock. Its `Cargo.toml` holds none of
//! tokio, reqwest or hyper, so the boundary is the crate's, not a
//! convention (`tests/layout.rs` checks it). The daemon, the writer and the
//! fleet view (the `gitlab-haproxy-agent` package) perform what it decides
//! and re-export these modules under the same paths.
//!
//! ```text
//!   decision/   route,       what the agent serves, and which Consul
//!      |        discovery    address it reads through (and which
//!      |          |          servers are fallbacks)
//!      +----+-----+
//!           |
//!        model/              value and agent-send grammar, snapshot,
//!                            drain marks, write metadata, generations,
//!                            one read's answer
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod decision;
pub mod discovery;
pub mod model;
pub mod route;
