//! The shortest `--drain-wait` and `--maint-wait` a sequence accepts.
//!
//! A sequence writes an intermediate state (drain before maint, maint before
//! the key is removed) and relies on every load balancer applying it: drain
//! lets sessions finish, and only MAINT -> READY fires HAProxy's slowstart
//! (REFERENCE, HAProxy). An agent reads Consul at most every
//! `--min-query-interval`, so two writes closer than that can reach it as
//! one answer, and HAProxy asks the agent once per `agent-inter` at a phase
//! of its own, so a state served for less than that may never be asked
//! about. Either way the intermediate state is skipped.

use std::time::Duration;

use crate::cli::{CanaryAction, StateArgs, StateCommand};

/// HAProxy's default `agent-inter` (doc configuration.txt "agent-inter"):
/// 2 s; the default of `--agent-inter`.
pub const DEFAULT_AGENT_INTER: Duration = Duration::from_secs(2);

/// Default of `--agent-read-delay`: 1 s, the longest an agent on default
/// settings takes from a Consul write to serving it: the blocking query
/// returns within milliseconds of the write, the agent's
/// `--min-query-interval` (default 100 ms) can delay the next read, and
/// HAProxy's check of that moment may time out (`--check-timeout`, default
/// 500 ms).
pub const DEFAULT_READ_DELAY: Duration = Duration::from_secs(1);

/// Smallest `--agent-inter` and `--agent-read-delay` accepted: 10 ms (an
/// accidental `0s` must not turn the floor off).
pub const MIN_FLEET_TIMING: Duration = Duration::from_millis(10);

/// The floor: `2 x agent_inter + read_delay`. The intermediate state is
/// served by every agent after at most `read_delay`; holding it two
/// agent-inter periods beyond that lets every HAProxy ask at least once
/// even if one check is lost. With the defaults (2 s, 1 s): 5 s, the
/// default `--maint-wait`.
pub fn floor(agent_inter: Duration, read_delay: Duration) -> Duration {
    agent_inter.saturating_mul(2).saturating_add(read_delay)
}

/// Checks the wait of a sequence against [`floor`] of `--agent-inter` and
/// `--agent-read-delay`.
///
/// # Errors
///
/// A message for exit 64 (EX_USAGE) naming the option, the wait and the
/// floor, when the wait is below the floor or a fleet timing is below
/// [`MIN_FLEET_TIMING`].
pub fn check(args: &StateArgs) -> Result<(), String> {
    let waits = match &args.command {
        StateCommand::Canary {
            action: CanaryAction::Disable {
                drain_wait, idle, ..
            },
        }
        | StateCommand::Drain {
            drain_wait, idle, ..
        } => match idle.until_idle {
            Some(max) => vec![("--until-idle", max)],
            None => vec![("--drain-wait", *drain_wait)],
        },
        StateCommand::Canary {
            action: CanaryAction::Enable {
                maint_wait, ramp, ..
            },
        }
        | StateCommand::Undrain {
            maint_wait, ramp, ..
        } => {
            let mut waits = vec![("--maint-wait", *maint_wait)];
            if !ramp.weights().is_empty() {
                waits.push(("--ramp-every", ramp.ramp_every));
            }
            waits
        }
        _ => return Ok(()),
    };
    for (name, value) in [
        ("--agent-inter", args.agent_inter),
        ("--agent-read-delay", args.agent_read_delay),
    ] {
        if value < MIN_FLEET_TIMING {
            return Err(format!(
                "{name} {} is below {}",
                humantime::format_duration(value),
                humantime::format_duration(MIN_FLEET_TIMING)
            ));
        }
    }
    let floor = floor(args.agent_inter, args.agent_read_delay);
    match waits.into_iter().find(|(_, wait)| *wait < floor) {
        None => Ok(()),
        Some((option, wait)) => Err(format!(
            "{option} {} is below {}, the least that lets every agent and HAProxy apply \
             the intermediate state (2 x --agent-inter {} + --agent-read-delay {}); \
             nothing written",
            humantime::format_duration(wait),
            humantime::format_duration(floor),
            humantime::format_duration(args.agent_inter),
            humantime::format_duration(args.agent_read_delay),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_floor_is_five_seconds() {
        assert_eq!(
            floor(DEFAULT_AGENT_INTER, DEFAULT_READ_DELAY),
            Duration::from_secs(5)
        );
    }
}
