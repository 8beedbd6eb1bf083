//! Why a `state` command did not complete: [`Failure`], with its exit
//! status ([`exit`], from sysexits.h) and a stable kind for `--json`, and
//! the operator's message for each outcome, built next to the type.

use serde_json::json;

use super::haproxy::SourceError;
use super::output::{err_line, out_line};
use super::plan::Current;
use crate::consul::{AdvanceError, ConsulError};
use crate::model::identity::validate_identity;

/// Exit statuses, from sysexits.h; documented in `state --help`
/// ([`crate::cli::EXIT_CODES_HELP`]).
pub mod exit {
    /// Done, or nothing to do.
    pub const OK: u8 = 0;
    /// EX_USAGE: bad options or arguments.
    pub const USAGE: u8 = 64;
    /// EX_DATAERR: an invalid key or value; nothing written. Also a drain
    /// from `--haproxy-socket` whose servers HAProxy did not put in DRAIN
    /// (their row key is not the assumed `<backend>/<server>`): drain
    /// written, maint not; or did not put in MAINT after maint was written
    /// (something else decides them first).
    pub const DATAERR: u8 = 65;
    /// EX_NOINPUT: the HAProxy configuration or socket cannot be read.
    pub const NOINPUT: u8 = 66;
    /// EX_NOHOST: written, but not every agent (host) confirmed it within
    /// `--confirm-timeout`, or Prometheus could not be asked; `state
    /// status`: an agent lags.
    pub const NOT_CONFIRMED: u8 = 68;
    /// EX_UNAVAILABLE: Consul unreachable, timed out, or without a leader.
    pub const UNAVAILABLE: u8 = 69;
    /// EX_TEMPFAIL: compare-and-set conflict (or a session's lock moved); nothing overwritten.
    pub const CONFLICT: u8 = 75;
    /// EX_PROTOCOL: Consul answered something unusable.
    pub const PROTOCOL: u8 = 76;
    /// EX_NOPERM: Consul refused the token, or it cannot be read.
    pub const NOPERM: u8 = 77;
    /// 128 + SIGHUP (the terminal or SSH session went away).
    pub const SIGHUP: u8 = 129;
    /// 128 + SIGINT.
    pub const SIGINT: u8 = 130;
    /// 128 + SIGTERM.
    pub const SIGTERM: u8 = 143;
}

/// Why a command did not complete, with its exit status; its JSON is
/// `{kind, message, exit_code}`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Failure {
    /// The exit status.
    #[serde(rename = "exit_code")]
    pub code: u8,
    /// A stable name for `--json`: `usage`, `invalid`, `no_input`,
    /// `unavailable`, `conflict`, `protocol`, `permission_denied`,
    /// `interrupted`, `not_drained`, `not_in_maint`, `not_confirmed`,
    /// `prometheus_unavailable`.
    pub kind: &'static str,
    /// What happened, and what was and was not written.
    pub message: String,
    /// Already in the JSON report printed on stdout.
    #[serde(skip)]
    pub(super) reported: bool,
}

impl Failure {
    pub(super) fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            kind,
            message: message.into(),
            reported: false,
        }
    }

    pub(super) fn usage(message: impl Into<String>) -> Failure {
        Failure::new(exit::USAGE, "usage", message)
    }

    pub(super) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(exit::DATAERR, "invalid", message)
    }

    pub(super) fn conflict(message: impl Into<String>) -> Failure {
        Failure::new(exit::CONFLICT, "conflict", message)
    }

    /// `conflict` (exit 75): a transaction rolled back because keys changed
    /// since this run read or wrote them; `lines` says how, one per key.
    pub(super) fn rolled_back(lines: &[String]) -> Failure {
        Failure::conflict(format!(
            "conflict: {}. Not overwritten; this transaction wrote nothing. Look with \
             `state list`, then re-run",
            lines.join("; ")
        ))
    }

    /// `conflict` (exit 75): `key` is not at the ModifyIndex `--cas`
    /// expects, so it was not written.
    pub(super) fn cas_mismatch(key: &str, before: &Current, expected: u64) -> Failure {
        Failure::conflict(format!(
            "{key} is {} at ModifyIndex {}, not at {expected} as --cas expects; not \
             overwritten",
            before.describe(),
            before.index()
        ))
    }
}

impl From<ConsulError> for Failure {
    fn from(e: ConsulError) -> Failure {
        let (code, kind) = match &e {
            ConsulError::Connect { .. } | ConsulError::Tls { .. } | ConsulError::Timeout { .. } => {
                (exit::UNAVAILABLE, "unavailable")
            }
            ConsulError::Status { .. } if e.is_forbidden() => (exit::NOPERM, "permission_denied"),
            ConsulError::Status { status, .. } if status.is_server_error() => {
                (exit::UNAVAILABLE, "unavailable")
            }
            ConsulError::Status { .. } | ConsulError::Decode(_) => (exit::PROTOCOL, "protocol"),
            ConsulError::Token { .. } => (exit::NOPERM, "permission_denied"),
        };
        Failure::new(code, kind, e.to_string())
    }
}

impl From<AdvanceError> for Failure {
    fn from(e: AdvanceError) -> Failure {
        match e {
            AdvanceError::Consul(e) => e.into(),
            AdvanceError::Denied(what) => Failure::new(
                exit::NOPERM,
                "permission_denied",
                format!(
                    "Consul refused the write: {what}; nothing in this transaction was written"
                ),
            ),
            AdvanceError::Bad { .. } => Failure::invalid(e.to_string()),
            AdvanceError::Raced { .. } => Failure::conflict(e.to_string()),
        }
    }
}

impl From<SourceError> for Failure {
    fn from(e: SourceError) -> Failure {
        Failure::new(exit::NOINPUT, "no_input", e.to_string())
    }
}

pub(super) fn report_failure(json: bool, failure: &Failure) -> u8 {
    err_line(&format!("gitlab-haproxy-agent state: {}", failure.message));
    if json && !failure.reported {
        out_line(&json!({"ok": false, "error": failure}).to_string());
    }
    failure.code
}

pub(super) fn refused_invalid(keys: Vec<(String, String)>) -> Failure {
    let list: Vec<String> = keys.iter().map(|(k, why)| format!("{k} ({why})")).collect();
    Failure::invalid(format!(
        "refusing to guess: {} an invalid value, so the servers it decides are frozen in an \
         unknown state; nothing written. Set a valid value first (`state set KEY maint`), then \
         re-run",
        if keys.len() == 1 {
            format!("{} holds", list[0])
        } else {
            format!("{} hold", list.join(", "))
        }
    ))
}

pub(super) fn check_key(key: &str) -> Result<(), Failure> {
    validate_identity(key).map_err(|e| {
        Failure::invalid(format!(
            "invalid key {key:?}: {e} (keys are relative to the prefix: `canary`, \
             `web/web-01`); nothing written"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consul_errors_map_to_exit_codes() {
        let f: Failure = ConsulError::Connect {
            addr: "x".into(),
            detail: "refused".into(),
        }
        .into();
        assert_eq!(f.code, exit::UNAVAILABLE);
        let f: Failure = ConsulError::Status {
            status: reqwest::StatusCode::FORBIDDEN,
            body: "Permission denied".into(),
        }
        .into();
        assert_eq!(f.code, exit::NOPERM);
        let f: Failure = ConsulError::Status {
            status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            body: "No cluster leader".into(),
        }
        .into();
        assert_eq!(f.code, exit::UNAVAILABLE);
        let f: Failure = ConsulError::Decode("x".into()).into();
        assert_eq!(f.code, exit::PROTOCOL);
    }
}
