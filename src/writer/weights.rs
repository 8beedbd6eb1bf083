//! Weights where HAProxy ignores them: a backend balanced by a static
//! algorithm (`balance source`, `uri`, `hdr(...)`, ... without `hash-type
//! consistent`, `static-rr`, `first`) applies only 0% and 100% at runtime,
//! so a `set` of a weight is answered and not applied, and an `undrain
//! --ramp` jumps from maint to full weight. With a HAProxy configuration
//! (`--haproxy-config`, or the default one when it exists), such writes are
//! refused before anything is written; without one they cannot be checked.

use std::path::Path;

use super::error::{exit, Failure};
use super::select::{config_path, CANARY_KEY};
use crate::cli::{CanaryAction, Selector, StateArgs, StateCommand};
use crate::model::haproxy_config::{parse_config, static_backends, ZONE_GROUP_PREFIX};
use crate::model::value::{parse_value, AdminState};

/// What a command writes below 100%, and to which servers.
enum Weighted<'a> {
    /// `set KEY N%`, 0 < N < 100.
    Set(&'a str, u16),
    /// `undrain --ramp` or `canary enable --ramp`: the group or backend.
    Ramp(Option<String>, Option<&'a str>, Option<&'a Path>),
}

fn weighted(command: &StateCommand) -> Option<Weighted<'_>> {
    match command {
        StateCommand::Set { key, value, .. } => match parse_value(value.as_bytes()) {
            Ok(AdminState::Weight(w @ 1..=99)) => Some(Weighted::Set(key, w)),
            _ => None,
        },
        StateCommand::Undrain { select, ramp, .. } if !ramp.weights().is_empty() => Some(
            Weighted::Ramp(group_of(select), select.backend.as_deref(), {
                select.haproxy_config.as_deref()
            }),
        ),
        StateCommand::Canary {
            action: CanaryAction::Enable { ramp, .. },
        } if !ramp.weights().is_empty() => {
            Some(Weighted::Ramp(Some(CANARY_KEY.into()), None, None))
        }
        _ => None,
    }
}

fn group_of(select: &Selector) -> Option<String> {
    match (&select.zone, &select.group) {
        (Some(z), _) => Some(format!("{ZONE_GROUP_PREFIX}{z}")),
        (None, Some(g)) => Some(g.clone()),
        _ => None,
    }
}

/// Refuses (exit 65, nothing written) a weight below 100% or a ramp for
/// servers of a backend whose algorithm ignores weights, as the HAProxy
/// configuration shows; passes when there is no configuration to read.
///
/// # Errors
///
/// `weights_ignored` (65).
pub(super) fn check(args: &StateArgs) -> Result<(), Failure> {
    let Some(what) = weighted(&args.command) else {
        return Ok(());
    };
    let given = match &what {
        Weighted::Ramp(_, _, given) => *given,
        Weighted::Set(..) => None,
    };
    let Some(path) = config_path(given) else {
        return Ok(());
    };
    // An unreadable configuration is the selection's business (66).
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let statics = static_backends(&text);
    if statics.is_empty() {
        return Ok(());
    }
    let servers = parse_config(&text);
    let naming = |group: &str| -> Vec<String> {
        servers
            .iter()
            .filter(|s| s.groups.iter().any(|g| g == group))
            .map(|s| s.backend.clone())
            .collect()
    };
    let backends: Vec<String> = match &what {
        Weighted::Set(key, _) => match key.split_once('/') {
            Some((backend, _)) => vec![backend.to_string()],
            None => naming(key),
        },
        Weighted::Ramp(Some(group), _, _) => naming(group),
        Weighted::Ramp(None, backend, _) => backend.map(str::to_string).into_iter().collect(),
    };
    let mut hit: Vec<String> = backends
        .into_iter()
        .filter_map(|b| statics.get(&b).map(|algo| format!("{b} (balance {algo})")))
        .collect();
    hit.sort();
    hit.dedup();
    if hit.is_empty() {
        return Ok(());
    }
    let written = match what {
        Weighted::Set(key, w) => format!("{key} = {w}%"),
        Weighted::Ramp(..) => "this ramp".to_string(),
    };
    Err(Failure::new(
        exit::DATAERR,
        "weights_ignored",
        format!(
            "{written} would be answered and not applied: in {} (as {} shows) the algorithm \
             ignores server weights, and HAProxy applies only 0% and 100% there, so the servers \
             would jump to their full weight. Nothing written. Undrain without --ramp (and \
             without a weight: ready, or clear the key), or balance that backend with a \
             dynamic algorithm (roundrobin, leastconn, or hash-type consistent)",
            hit.join(", "),
            path.display()
        ),
    ))
}
