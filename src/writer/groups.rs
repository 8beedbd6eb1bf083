//! The group check of a write: a group key that no load balancer names
//! (by [`crate::fleet::groups::fleet_groups`]) is refused before anything is
//! written, the groups that exist listed closest first.
//!
//! The rule when the names cannot be had: the check refuses only on
//! evidence (Prometheus answered, agents are scraped, none names the
//! group). Without --prometheus, with Prometheus unreachable or without
//! agents, it says it could not check and the write goes on: a drain is
//! never held up by monitoring.

use super::error::Failure;
use super::output::err_line;
use super::select::{Target, CANARY_KEY};
use super::session::Writer;
use crate::cli::{CanaryAction, StateArgs, StateCommand, DEFAULT_PROMETHEUS_SELECTOR};
use crate::fleet::groups::{fleet_groups, FleetGroups};
use crate::fleet::{http_client, LOOKBACK};
use crate::model::value::{parse_value, AnswerKind};

/// At most this many existing groups are listed, closest first, when a
/// group is refused: 8.
const SUGGESTIONS: usize = 8;

/// `names` closest to `key` first (Damerau-Levenshtein distance, then
/// name), at most [`SUGGESTIONS`].
pub fn closest<'a>(key: &str, names: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    let mut by: Vec<(usize, &str)> = names
        .into_iter()
        .map(|n| (strsim::damerau_levenshtein(key, n), n.as_str()))
        .collect();
    by.sort();
    by.into_iter().take(SUGGESTIONS).map(|(_, n)| n).collect()
}

/// The failure (exit 65, nothing written) for a group no load balancer
/// names.
pub fn unknown_group(key: &str, base: &str, groups: &FleetGroups) -> Failure {
    let listed = closest(key, &groups.names);
    let more = groups.names.len().saturating_sub(listed.len());
    Failure::new(
        super::error::exit::DATAERR,
        "unknown_group",
        format!(
            "no load balancer names the group {key}: no server naming it was asked about in \
             the last {LOOKBACK} on any of the {} Prometheus at {base} scrapes. {}; nothing \
             written. If {key} is new (no server names it yet), add --new-group",
            crate::fleet::held::agents_text(groups.agents),
            if listed.is_empty() {
                "They name no group at all".to_string()
            } else {
                format!(
                    "The groups that exist, closest first: {}{}",
                    listed.join(", "),
                    if more > 0 {
                        format!(" (and {more} more)")
                    } else {
                        String::new()
                    }
                )
            }
        ),
    )
}

/// The group key a command writes, whether it takes servers out, and
/// whether it may pass when the key is present in Consul (taking a key back
/// is how a mistyped one is cleaned up); `None` for a command that writes no
/// group key.
fn group_write(command: &StateCommand) -> Option<(String, bool)> {
    match command {
        StateCommand::Drain { select, .. } => Target::check_selector(select)
            .ok()
            .flatten()
            .map(|g| (g, false)),
        StateCommand::Undrain { select, .. } => Target::check_selector(select)
            .ok()
            .flatten()
            .map(|g| (g, true)),
        StateCommand::Canary { action } => Some((
            CANARY_KEY.to_string(),
            matches!(action, CanaryAction::Enable { .. }),
        )),
        StateCommand::Set { key, value, .. }
            if !key.contains('/') && super::error::check_key(key).is_ok() =>
        {
            // `set` to ready takes servers back, like undrain.
            let back = parse_value(value.as_bytes()).is_ok_and(|v| v.kind() == AnswerKind::Ready);
            Some((key.clone(), back))
        }
        _ => None,
    }
}

impl Writer {
    /// Before a write of a group key: refuses (exit 65) a group that no
    /// load balancer names, by Prometheus at `--prometheus`, unless
    /// `--new-group`. Says on stderr when it could not check, and goes on.
    ///
    /// # Errors
    ///
    /// `unknown_group` (65); Consul's failure reading the key for a write
    /// that takes servers back.
    pub(super) async fn check_group(&self, args: &StateArgs) -> Result<(), Failure> {
        let Some((key, back)) = group_write(&args.command) else {
            return Ok(());
        };
        let write = match &args.command {
            StateCommand::Set { write, .. }
            | StateCommand::Drain { write, .. }
            | StateCommand::Undrain { write, .. } => write,
            StateCommand::Canary { action } => match action {
                CanaryAction::Disable { write, .. } | CanaryAction::Enable { write, .. } => write,
            },
            _ => return Ok(()),
        };
        if key == crate::check_ready::PROBE_IDENTITY {
            let why = crate::check_ready::NOT_A_GROUP;
            return Err(Failure::new(
                super::error::exit::DATAERR,
                "unknown_group",
                why,
            ));
        }
        if write.new_group {
            return Ok(());
        }
        let could_not = |why: &str| {
            err_line(&format!(
                "warning: could not check that a load balancer names the group {key}: {why}; \
                 going on (a mistyped group would select no server)"
            ));
        };
        let Some(base) = args
            .prometheus
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            could_not(
                "no Prometheus is set (--prometheus URL or GITLAB_HAPROXY_AGENT_PROMETHEUS_URL)",
            );
            return Ok(());
        };
        let selector = if write.confirm.confirm_selector.is_empty() {
            DEFAULT_PROMETHEUS_SELECTOR
        } else {
            &write.confirm.confirm_selector
        };
        let http = match http_client() {
            Ok(h) => h,
            Err(e) => {
                could_not(&e);
                return Ok(());
            }
        };
        let groups = match fleet_groups(&http, base, selector).await {
            Ok(g) => g,
            Err(e) => {
                could_not(&e.message);
                return Ok(());
            }
        };
        if groups.names.contains(&key) {
            return Ok(());
        }
        if groups.agents == 0 {
            could_not(&format!(
                "Prometheus at {base} has no target matching {{{selector}}}"
            ));
            return Ok(());
        }
        if groups.over_cap {
            could_not(&format!(
                "an agent names more groups than it exports (gitlab_haproxy_agent_groups_over_cap \
                 > 0 at {base}), so {key} may exist"
            ));
            return Ok(());
        }
        if back && self.client.get_key(&self.full(&key)).await?.is_some() {
            // Taking back a key nobody names removes a harmless mistake.
            return Ok(());
        }
        Err(unknown_group(&key, base, &groups))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_closest_names_come_first() {
        let names: BTreeSet<String> = ["canary", "zone-us-east1-b", "zone-us-east1-c", "zone-b"]
            .map(String::from)
            .into();
        assert_eq!(
            closest("zone-us-east-1b", &names),
            ["zone-us-east1-b", "zone-us-east1-c", "zone-b", "canary"]
        );
        assert_eq!(closest("canray", &names)[0], "canary");
    }
}
