//! Reading the running HAProxy's servers: its configuration file or its
//! stats socket (`show servers state`); the grammar of both is
//! [`crate::model::haproxy_config`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub use crate::model::haproxy_config::*;

/// How long the stats socket may take to answer.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the servers could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file or socket could not be read.
    #[error("cannot read {what} {path}: {detail}")]
    Io {
        /// `HAProxy configuration` or `HAProxy stats socket`.
        what: &'static str,
        /// The path.
        path: String,
        /// The I/O error.
        detail: String,
    },
    /// The socket answered something else than `show servers state`.
    #[error("unexpected answer from the HAProxy stats socket {path}: {detail}")]
    Socket {
        /// The path.
        path: String,
        /// What was wrong.
        detail: String,
    },
}

/// Reads the servers of the configuration file at `path`.
///
/// # Errors
///
/// [`SourceError::Io`] when the file cannot be read.
pub fn servers_from_config(path: &Path) -> Result<Vec<Server>, SourceError> {
    let text = std::fs::read(path).map_err(|e| SourceError::Io {
        what: "HAProxy configuration",
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    Ok(parse_config(&String::from_utf8_lossy(&text)))
}

/// Reads the servers of the running HAProxy from its stats socket (`show
/// servers state`). The socket has no agent-send line: the row key is taken
/// to be `<backend>/<server>`, and no server has a group. It does not tell
/// server-template servers apart either: their assumed row keys are never
/// read, which the DRAIN check of `state drain` finds.
///
/// # Errors
///
/// [`SourceError`] when the socket cannot be used or answers something else.
pub fn servers_from_socket(path: &Path) -> Result<Vec<Server>, SourceError> {
    let out = show_servers_state(path)?;
    parse_servers_state(&out).map_err(|detail| SourceError::Socket {
        path: path.display().to_string(),
        detail,
    })
}

/// Which servers of the running HAProxy have `flag` set in their
/// `srv_admin_state` now ([`ADMIN_FORCED_DRAIN`], [`ADMIN_FORCED_MAINT`]),
/// read from its stats socket: by `<backend>/<server>`.
///
/// # Errors
///
/// [`SourceError`] when the socket cannot be used or answers something else.
pub fn with_admin_flag_from_socket(
    path: &Path,
    flag: u32,
) -> Result<HashMap<String, bool>, SourceError> {
    let out = show_servers_state(path)?;
    parse_admin_states(&out)
        .map(|states| {
            states
                .into_iter()
                .map(|(id, admin)| (id, admin & flag != 0))
                .collect()
        })
        .map_err(|detail| SourceError::Socket {
            path: path.display().to_string(),
            detail,
        })
}

/// The raw answer to `show servers state` on the stats socket at `path`.
fn show_servers_state(path: &Path) -> Result<String, SourceError> {
    socket_command(path, "show servers state")
}

/// The raw answer to one command on the stats socket at `path`.
pub(super) fn socket_command(path: &Path, command: &str) -> Result<String, SourceError> {
    let io = |e: std::io::Error| SourceError::Io {
        what: "HAProxy stats socket",
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let mut stream = UnixStream::connect(path).map_err(io)?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT)).map_err(io)?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(io)?;
    let mut out = String::new();
    stream.read_to_string(&mut out).map_err(io)?;
    Ok(out)
}
