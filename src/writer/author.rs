//! Who writes, why and until when: the record each write carries, from the
//! command's options and the login that runs it.

use crate::cli::{CanaryAction, StateCommand, WriteOpts};
use crate::model::meta::Author;
use crate::model::value::AdminState;

/// Who writes, why and until when for a command that writes ([`of_write`],
/// a reason required when it [takes servers out](takes_servers_out)), and
/// the time it starts (also for one that does not write: the time its
/// output is judged at).
///
/// # Errors
///
/// A usage text ([`Author::resolve`]).
pub fn of(command: &StateCommand) -> Result<Author, String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now = now.map_or(0, |d| d.as_secs());
    match command.write_opts() {
        Some(write) => of_write(write, takes_servers_out(command), now),
        None => Ok(Author {
            at: now,
            ..Author::default()
        }),
    }
}

/// Who writes, why and until when, at `now` (Unix seconds); the login is
/// `$SUDO_USER`, else `$USER`, else `$LOGNAME`.
///
/// # Errors
///
/// A usage text ([`Author::resolve`]).
pub fn of_write(write: &WriteOpts, reason_required: bool, now: u64) -> Result<Author, String> {
    let login = ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|l| !l.is_empty()))
        .or_else(process_author);
    Author::resolve(
        write.by.as_deref(),
        login.as_deref(),
        write.reason.as_deref(),
        write.until.as_deref(),
        reason_required,
        now,
    )
}

/// Whether the command writes drain or maint to take servers out, and so
/// needs a `--reason`: `drain`, `canary disable`, `set KEY drain|maint`.
pub fn takes_servers_out(command: &StateCommand) -> bool {
    match command {
        StateCommand::Drain { .. }
        | StateCommand::Canary {
            action: CanaryAction::Disable { .. },
        } => true,
        StateCommand::Set { value, .. } => matches!(
            crate::model::value::parse_value(value.as_bytes()),
            Ok(AdminState::Drain | AdminState::Maint)
        ),
        _ => false,
    }
}

/// Who wrote, when no login is known (`USER`, `LOGNAME` and `SUDO_USER`
/// unset, as under cron or a CI runner): `uid N on host H`, from the
/// process's own `/proc` entry and the kernel's host name, so the record
/// still tells where to look.
fn process_author() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    Some(match host {
        Some(h) => format!("uid {uid} on host {h}"),
        None => format!("uid {uid}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_author_without_a_login_is_named_by_uid_and_host() {
        let by = process_author().unwrap();
        assert!(by.starts_with("uid "), "{by}");
    }
}
