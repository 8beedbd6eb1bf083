//! Which keys a sequence acts on: the canary group key, or the row keys of
//! the enrolled servers a selector (--zone, --backend, --server glob) picks
//! from the HAProxy configuration or stats socket.

use std::path::PathBuf;

use super::error::Failure;
use super::haproxy::{self, glob_match, Enrolment, Server};
use crate::cli::Selector;
use crate::model::identity::validate_identity;

/// The key of the canary group.
pub const CANARY_KEY: &str = "canary";

/// What a report from `--haproxy-socket` says about its row keys.
pub(super) const ASSUMED_ROW_KEYS: &str =
    "row keys are assumed to be <backend>/<server>: the stats \
     socket does not show agent-send lines, so a server whose agent-send starts with another \
     key is not decided by the key written (AGENT ANSWERS is the answer for that key alone). \
     `drain` checks on this HAProxy that the servers went to DRAIN before it writes maint, \
     and to MAINT after";

/// What a sequence acts on.
pub(super) struct Target {
    /// The keys, relative to the prefix.
    pub(super) keys: Vec<String>,
    /// Enrolled servers selected (empty for a group key).
    pub(super) servers: Vec<Server>,
    /// Servers that matched but the agent cannot drain.
    pub(super) not_enrolled: Vec<(Server, String)>,
    /// Where the servers came from, for the report.
    pub(super) source: Option<String>,
    /// The stats socket the servers were read from: their row keys are
    /// assumed to be `<backend>/<server>` (the socket shows no agent-send
    /// line), and `drain` checks there that HAProxy drained them.
    pub(super) socket: Option<PathBuf>,
    /// The selection, in words.
    pub(super) selection: String,
}

impl Target {
    pub(super) fn canary() -> Target {
        Target {
            keys: vec![CANARY_KEY.to_string()],
            servers: Vec::new(),
            not_enrolled: Vec::new(),
            source: None,
            socket: None,
            selection: format!("key {CANARY_KEY}"),
        }
    }

    /// Checks the combination of selector options (64 when bad).
    pub(super) fn check_selector(select: &Selector) -> Result<(), Failure> {
        let problem = if select.server.is_some() && select.backend.is_none() {
            Some("--server needs --backend (the glob matches server names within one backend)")
        } else if select.zone.is_none() && select.backend.is_none() {
            Some("which servers? Give --zone, --backend or both")
        } else if select.zone.is_some() && select.haproxy_socket.is_some() {
            Some(
                "--zone cannot be used with --haproxy-socket: the stats socket does not know \
                 zones; read them from --haproxy-config",
            )
        } else {
            None
        };
        match problem {
            Some(p) => Err(Failure::usage(format!("{p}; nothing written (see --help)"))),
            None => Ok(()),
        }
    }

    pub(super) fn servers(select: &Selector) -> Result<Target, Failure> {
        Target::check_selector(select)?;
        if let Some(zone) = &select.zone {
            validate_identity(&format!("{}{zone}", haproxy::ZONE_GROUP_PREFIX))
                .map_err(|e| Failure::invalid(format!("invalid zone {zone:?}: {e}")))?;
        }
        let (all, source) = match &select.haproxy_socket {
            Some(socket) => (
                haproxy::servers_from_socket(socket)?,
                format!("stats socket {}", socket.display()),
            ),
            None => (
                haproxy::servers_from_config(&select.haproxy_config)?,
                select.haproxy_config.display().to_string(),
            ),
        };
        let mut target = Target::select(all, select, source);
        target.socket.clone_from(&select.haproxy_socket);
        Ok(target)
    }

    pub(super) fn select(all: Vec<Server>, select: &Selector, source: String) -> Target {
        let mut servers = Vec::new();
        let mut not_enrolled = Vec::new();
        for server in all {
            if select
                .backend
                .as_ref()
                .is_some_and(|b| *b != server.backend)
            {
                continue;
            }
            if select
                .server
                .as_ref()
                .is_some_and(|g| !glob_match(g, &server.name))
            {
                continue;
            }
            let in_zone = match &select.zone {
                None => Some(true),
                Some(z) if server.zones.iter().any(|s| s == z) => Some(true),
                Some(_) if server.zones.is_empty() => None,
                Some(_) => Some(false),
            };
            match (&server.enrolment, in_zone) {
                (_, Some(false)) => {}
                (Enrolment::Enrolled { .. }, Some(true)) => servers.push(server),
                (Enrolment::Enrolled { .. }, None) => {}
                (Enrolment::NotEnrolled(why), Some(true)) => {
                    let why = why.to_string();
                    not_enrolled.push((server, why));
                }
                (Enrolment::NotEnrolled(why), None) => {
                    let why = format!("{why}; zone unknown (no zone- group)");
                    not_enrolled.push((server, why));
                }
            }
        }
        let mut keys: Vec<String> = servers
            .iter()
            .filter_map(|s| s.row_key().map(str::to_string))
            .collect();
        keys.sort();
        keys.dedup();
        Target {
            keys,
            servers,
            not_enrolled,
            source: Some(source),
            socket: None,
            selection: Target::describe_selection(select),
        }
    }

    /// The failure (exit 65, `invalid`) for a selection with no key: no
    /// enrolled server matches, and those that matched but are not enrolled
    /// are named with the reason.
    pub(super) fn nothing_selected(&self) -> Failure {
        let mut message = format!(
            "no enrolled server matches {} in {}; nothing written",
            self.selection,
            self.source.as_deref().unwrap_or("the configuration")
        );
        if !self.not_enrolled.is_empty() {
            message.push_str(&format!(
                " (not enrolled, so not counted: {} server{}: {})",
                self.not_enrolled.len(),
                if self.not_enrolled.len() == 1 {
                    ""
                } else {
                    "s"
                },
                self.not_enrolled
                    .iter()
                    .map(|(s, why)| format!("{} {why}", s.id()))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        Failure::invalid(message)
    }

    /// The servers whose row key is one of `keys`.
    pub(super) fn servers_of(&self, keys: &[String]) -> Vec<&Server> {
        self.servers
            .iter()
            .filter(|s| s.row_key().is_some_and(|k| keys.iter().any(|w| w == k)))
            .collect()
    }

    pub(super) fn describe_selection(select: &Selector) -> String {
        let mut parts = Vec::new();
        if let Some(z) = &select.zone {
            parts.push(format!("zone {z}"));
        }
        if let Some(b) = &select.backend {
            parts.push(format!("backend {b}"));
        }
        if let Some(g) = &select.server {
            parts.push(format!("servers {g}"));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn selector(
        zone: Option<&str>,
        backend: Option<&str>,
        server: Option<&str>,
    ) -> Selector {
        Selector {
            zone: zone.map(Into::into),
            backend: backend.map(Into::into),
            server: server.map(Into::into),
            haproxy_config: "/dev/null".into(),
            haproxy_socket: None,
        }
    }

    pub(crate) const CONFIG: &str = "defaults\n  default-server agent-check\nbackend web\n  server web-01 1.1.1.1:80 agent-send \"web/web-01 zone-a\\n\"\n  server web-02 1.1.1.2:80 agent-send \"web/web-02 zone-b\\n\"\n  server web-03 1.1.1.3:80 no-agent-check agent-send \"web/web-03 zone-b\\n\"\n  server web-04 1.1.1.4:80 no-agent-check\nbackend api\n  server api-01 1.1.2.1:80 agent-send \"api/api-01 canary zone-b\\n\"\n";

    #[test]
    fn zone_selection_lists_unenrolled_servers() {
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), None, None),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["api/api-01", "web/web-02"]);
        let ne: Vec<(String, &str)> = t
            .not_enrolled
            .iter()
            .map(|(s, w)| (s.id(), w.as_str()))
            .collect();
        assert_eq!(
            ne,
            vec![
                ("web/web-03".to_string(), "no agent-check"),
                (
                    "web/web-04".to_string(),
                    "no agent-check; zone unknown (no zone- group)"
                ),
            ]
        );
    }

    #[test]
    fn servers_the_agent_would_not_answer_from_their_row_key_are_not_enrolled() {
        let config = "defaults\n  default-server agent-check\nbackend legacy\n  server l-01 1.1.1.1:80 agent-send \"legacy/l-01 zone-c\\n\"\n  server l-02 1.1.1.2:80 agent-send \"canary legacy/l-02 zone-c\\n\"\n  server l-03 1.1.1.3:80 agent-send \"legacy/l-03 zone-c\"\n  server l-04 1.1.1.4:80 agent-send \"legacy/l-04 zone-c a b c d e f g h i j k l m n o\\n\"\n";
        for select in [
            selector(Some("c"), None, None),
            selector(None, Some("legacy"), None),
        ] {
            let t = Target::select(haproxy::parse_config(config), &select, "cfg".into());
            assert_eq!(t.keys, vec!["legacy/l-01"]);
            let ids: Vec<String> = t.servers.iter().map(Server::id).collect();
            assert_eq!(ids, vec!["legacy/l-01"]);
            let ne: Vec<(String, &str)> = t
                .not_enrolled
                .iter()
                .map(|(s, w)| (s.id(), w.as_str()))
                .collect();
            assert_eq!(ne.len(), 3, "{ne:?}");
            assert_eq!(ne[0].0, "legacy/l-02");
            assert!(
                ne[0]
                    .1
                    .starts_with("first identity on agent-send is `canary`, not a row key"),
                "{ne:?}"
            );
            assert_eq!(ne[1].0, "legacy/l-03");
            assert!(ne[1].1.contains("does not end with \\n"), "{ne:?}");
            assert_eq!(ne[2].0, "legacy/l-04");
            assert!(ne[2].1.contains("more than 16 identities"), "{ne:?}");
        }
    }

    #[test]
    fn backend_and_glob_selection() {
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(None, Some("web"), Some("web-0[12]")),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["web/web-01", "web/web-02"]);
        assert!(t.not_enrolled.is_empty());
        let t = Target::select(
            haproxy::parse_config(CONFIG),
            &selector(Some("b"), Some("web"), None),
            "cfg".into(),
        );
        assert_eq!(t.keys, vec!["web/web-02"]);
    }
}
