//! Weights where HAProxy ignores them: with a HAProxy configuration
//! (`--haproxy-config`, or the default one when it exists), a weight or a
//! ramp for servers of a backend whose algorithm ignores weights
//! ([`weights_ignored`]) is refused before anything is written; without
//! one it cannot be checked.

use std::path::PathBuf;

use super::error::{exit, Failure};
use super::select::{config_path, CANARY_KEY};
use crate::cli::{CanaryAction, StateArgs, StateCommand};
use crate::model::haproxy_config::{weights_ignored, ZONE_GROUP_PREFIX};
use crate::model::value::{parse_value, AdminState};

/// Refuses (exit 65 `weights_ignored`, nothing written) `set` of a weight
/// between 0% and 100%, `undrain --ramp` and `canary enable --ramp` for
/// servers of a backend whose algorithm ignores weights.
///
/// # Errors
///
/// `weights_ignored` (65).
pub(super) fn check(args: &StateArgs) -> Result<(), Failure> {
    // (what is written, the key or backend, a whole backend, the config)
    let (written, key, whole, given) = match &args.command {
        StateCommand::Set { key, value, .. } => match parse_value(value.as_bytes()) {
            Ok(AdminState::Weight(w @ 1..=99)) => {
                (format!("{key} = {w}%"), key.clone(), false, None)
            }
            _ => return Ok(()),
        },
        StateCommand::Undrain { select, ramp, .. } if !ramp.weights().is_empty() => {
            let key = match (&select.zone, &select.group, &select.backend) {
                (Some(z), _, _) => format!("{ZONE_GROUP_PREFIX}{z}"),
                (None, Some(g), _) => g.clone(),
                (None, None, Some(b)) => b.clone(),
                _ => return Ok(()),
            };
            let whole = select.zone.is_none() && select.group.is_none();
            let cfg = select.haproxy_config.as_deref();
            ("this ramp".into(), key, whole, cfg)
        }
        StateCommand::Canary {
            action: CanaryAction::Enable { ramp, .. },
        } if !ramp.weights().is_empty() => ("this ramp".into(), CANARY_KEY.into(), false, None),
        _ => return Ok(()),
    };
    // No configuration, or one that cannot be read (the selection's
    // business, 66): nothing to check against.
    let read = |p: PathBuf| Some((std::fs::read_to_string(&p).ok()?, p));
    let Some((text, path)) = config_path(given).and_then(read) else {
        return Ok(());
    };
    match weights_ignored(&text, &key, whole) {
        None => Ok(()),
        Some(why) => Err(Failure::new(
            exit::DATAERR,
            "weights_ignored",
            format!(
                "{written} would be answered and not applied: {why} ({}). Nothing written. \
                 Undrain without --ramp (ready, or clear the key), or balance that backend \
                 with a dynamic algorithm (roundrobin, leastconn, hash-type consistent)",
                path.display()
            ),
        )),
    }
}
