//! What the running HAProxy shows for one server on its stats socket (`show
//! stat`): its status and weight, and whether its agent check was forced
//! down at runtime (`set server B/S agent down`), which no agent reply undoes.

use std::path::Path;

use serde::Serialize;

use super::haproxy::{socket_command, SourceError};

/// One server as `show stat` shows it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Live {
    /// `<backend>/<server>`.
    pub server: String,
    /// `status`: `UP`, `DOWN (agent)`, `DRAIN (agent)`, `MAINT`, ...
    pub status: String,
    /// `weight`: the effective weight now.
    pub weight: String,
    /// The agent check is enabled (`agent_status` is not empty).
    pub agent_check: bool,
    /// The agent check is down (`agent_health` below `agent_rise`). The
    /// agent never sends health words, so this is `set server B/S agent
    /// down` (or another agent's `down`): the server stays DOWN whatever the
    /// agent answers until `set server B/S agent up`. Same columns on
    /// HAProxy 2.6, 3.0 and 3.2.
    pub agent_down: bool,
}

/// `show stat` on the socket at `path`, the row of `backend`/`server`;
/// `None` when HAProxy has no such server.
///
/// # Errors
///
/// [`SourceError`] when the socket cannot be used or answers something else.
pub fn server_from_socket(
    path: &Path,
    backend: &str,
    server: &str,
) -> Result<Option<Live>, SourceError> {
    let out = socket_command(path, "show stat")?;
    parse_stat(&out, backend, server).map_err(|detail| SourceError::Socket {
        path: path.display().to_string(),
        detail,
    })
}

/// Parses `show stat` CSV output and returns the row of `backend`/`server`.
///
/// # Errors
///
/// A message when the header lacks a column this needs.
pub fn parse_stat(out: &str, backend: &str, server: &str) -> Result<Option<Live>, String> {
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .and_then(|l| l.strip_prefix('#'))
        .ok_or("show stat: no header line")?
        .trim()
        .split(',')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or(format!("show stat: no column {name}"))
    };
    let (px, sv, status, weight) = (
        col("pxname")?,
        col("svname")?,
        col("status")?,
        col("weight")?,
    );
    let (agent_status, health, rise) = (
        col("agent_status")?,
        col("agent_health")?,
        col("agent_rise")?,
    );
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let get = |i: usize| f.get(i).copied().unwrap_or("");
        if get(px) != backend || get(sv) != server {
            continue;
        }
        let agent_check = !get(agent_status).is_empty();
        let down = match (get(health).parse::<u32>(), get(rise).parse::<u32>()) {
            (Ok(h), Ok(r)) => h < r,
            _ => false,
        };
        return Ok(Some(Live {
            server: format!("{backend}/{server}"),
            status: get(status).to_string(),
            weight: get(weight).to_string(),
            agent_check,
            agent_down: agent_check && down,
        }));
    }
    Ok(None)
}

impl Live {
    /// One line for `state explain`: what HAProxy shows, and what to do when
    /// the agent check is forced down.
    pub fn describe(&self, socket: &Path) -> String {
        let mut text = format!(
            "HAProxy now: {} status {}, weight {}",
            self.server, self.status, self.weight
        );
        if !self.agent_check {
            text.push_str("; its agent check is off (the agent's answer does not apply)");
        } else if self.agent_down {
            text.push_str(&format!(
                "; its agent check is forced DOWN on this HAProxy (`set server {s} agent down`): \
                 the server stays DOWN whatever the agent answers; end it with `echo \"set server \
                 {s} agent up\" | socat stdio {}`",
                socket.display(),
                s = self.server
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Measured on HAProxy 2.6.12 after `set server web/s1 agent down`
    // (columns 1-2, 18-19, 63, 71-73; 3.0 and 3.2 print the same).
    const DOWN: &str =
        "# pxname,svname,status,weight,agent_status,agent_rise,agent_fall,agent_health\n\
        web,s1,DOWN (agent),10,CHECKED,1,1,0\n\
        web,s2,UP,10,CHECKED,1,1,1\n\
        web,s3,UP,10,,,,\n";

    #[test]
    fn a_forced_down_agent_check_is_agent_health_below_agent_rise() {
        let s1 = parse_stat(DOWN, "web", "s1").unwrap().unwrap();
        assert!(s1.agent_check && s1.agent_down);
        assert_eq!(s1.status, "DOWN (agent)");
        let s2 = parse_stat(DOWN, "web", "s2").unwrap().unwrap();
        assert!(s2.agent_check && !s2.agent_down);
        let s3 = parse_stat(DOWN, "web", "s3").unwrap().unwrap();
        assert!(!s3.agent_check && !s3.agent_down);
        assert_eq!(parse_stat(DOWN, "web", "nope").unwrap(), None);
        assert!(parse_stat("# pxname,svname\n", "web", "s1").is_err());
    }
}
