//! The writer CLI, `gitlab-haproxy-agent state ...`: reads desired state from
//! Consul KV through the agent's own parser, writes only values that parser
//! accepts, always with compare-and-set, and runs drains in the order HAProxy
//! needs (drain, wait, maint; back through maint so slowstart ramps).
//!
//! Every command that writes (`set`, `clear`, `drain`, `undrain`, `canary`)
//! is one path: `select` picks the keys (one group key such as a zone or
//! `canary`, which needs no HAProxy configuration, or row keys, named or
//! expanded from the servers that [`haproxy`] reads with the grammar of
//! [`crate::model::haproxy_config`]); with `--prometheus`, [`groups`] first
//! refuses a group no load balancer names; [`plan`] turns what the keys hold
//! into steps (pure); `execute` writes them as compare-and-set transactions
//! (each advancing the store's write generation),
//! waits, checks HAProxy's stats socket and, with `--prometheus`, has
//! [`confirm`] wait after each write step until every agent answers from it
//! (asking Prometheus for the [`crate::fleet`], and for a group key counting the
//! servers it decides); `progress` records how far it got; `report` prints
//! the result as text or JSON. `commands` dispatches and holds the read-only
//! commands (`get`, `list`, `explain`), which say with
//! [`crate::fleet::held`] what the agents hold; `session` is the Consul connection they share
//! ([`crate::cli::defaults`] reads the Prometheus settings of the defaults
//! file); [`error`] names each
//! failure and its exit status. The writer stands on the model and the
//! Consul client and imports nothing from the daemon; no module of it
//! imports one that imports it back (tests/layout.rs).

pub mod author;
mod commands;
pub mod confirm;
pub mod error;
mod execute;
pub mod groups;
pub mod haproxy;
mod held;
pub mod live;
pub mod output;
pub mod plan;
mod progress;
mod release;
mod report;
mod select;
mod session;
pub mod waits;
mod weights;

use std::process::ExitCode;

use crate::cli::{ConsulArgs, StateArgs};
use crate::consul::config::{ConsulConfig, Fallbacks};
use commands::run;
use error::report_failure;
pub use error::{exit, Failure};
pub use execute::DRAIN_CHECK_GRACE;
pub use select::CANARY_KEY;

/// Runs one `state` command and returns its exit status. Consul options are
/// resolved as for the daemon (same flags, environment and token file).
pub fn main(consul: &ConsulArgs, args: &StateArgs, fallbacks: &Fallbacks) -> ExitCode {
    let code = match consul.resolve(fallbacks).and_then(ConsulConfig::load_tls) {
        Err(e) => report_failure(args.json, &Failure::usage(e.to_string())),
        Ok(config) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Err(e) => report_failure(
                args.json,
                &Failure::new(1, "runtime", format!("cannot start the runtime: {e}")),
            ),
            Ok(rt) => rt.block_on(run(config, args, fallbacks)),
        },
    };
    ExitCode::from(code)
}

/// Reports a usage error found before a `state` command could be parsed
/// (clap's, e.g. an unknown option): the message on stderr and, with
/// `json`, the same `{"ok": false, "error": {"kind": "usage", ...}}` object
/// on stdout as every other failure. Returns exit status 64 (EX_USAGE).
pub fn usage_error(json: bool, message: &str) -> ExitCode {
    ExitCode::from(report_failure(json, &Failure::usage(message)))
}
