//! Which keys a sequence acts on: one group key (`canary`, `zone-b` for
//! --zone b, --group G), which needs no HAProxy configuration, or the row
//! keys of servers named exactly (--backend B --server NAME) or expanded
//! from the HAProxy configuration or stats socket (a glob, a whole backend).
//! A configuration, when there is one, previews what each server of the
//! selection will be answered.

use std::path::{Path, PathBuf};

use super::error::Failure;
use super::haproxy::{self, glob_match, Enrolment, Server};
use crate::cli::Selector;
use crate::model::identity::validate_identity;

/// The key of the canary group.
pub const CANARY_KEY: &str = "canary";

/// Where the HAProxy configuration is when `--haproxy-config` is not given:
/// `$GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG`, else this path; used only when
/// it exists (a console node or CI job has none) and lists at least one
/// server (Debian's `haproxy` package installs a sample that lists none).
pub const DEFAULT_HAPROXY_CONFIG: &str = "/etc/haproxy/haproxy.cfg";

/// What a report from `--haproxy-socket` says about its row keys.
pub(super) const ASSUMED_ROW_KEYS: &str =
    "row keys are assumed to be <backend>/<server>: the stats \
     socket does not show agent-send lines, so a server whose agent-send starts with another \
     key (a server-template server, a group first) is not decided by the key written (AGENT \
     ANSWERS is the answer for that key alone). `drain` checks on this HAProxy that the \
     servers went to DRAIN before it writes maint, and to MAINT after";

/// What a report of a row key written from its name alone says.
pub(super) const NAMED_ROW_KEY: &str =
    "row key written as named, <backend>/<server> (the cookbook's): no HAProxy \
     configuration here lists the server, to check it against its agent-send line";

/// What a sequence acts on.
pub(super) struct Target {
    /// The keys, relative to the prefix: one group key, or row keys.
    pub(super) keys: Vec<String>,
    /// The group key, when the selection is a group.
    pub(super) group: Option<String>,
    /// Enrolled servers selected, read from a configuration or socket
    /// (empty without one).
    pub(super) servers: Vec<Server>,
    /// Servers that matched but that the keys written do not decide, with
    /// why: not enrolled, or (for row keys) no row key of their own.
    pub(super) not_written: Vec<(Server, String)>,
    /// Where the servers came from, for the report.
    pub(super) source: Option<String>,
    /// The stats socket `drain` checks, after each step, that HAProxy
    /// applied it to the servers.
    pub(super) socket: Option<PathBuf>,
    /// The servers were read from the stats socket, which shows no
    /// agent-send line: their row keys are assumed to be
    /// `<backend>/<server>`.
    pub(super) assumed: bool,
    /// The selection, in words.
    pub(super) selection: String,
    /// With `--until-idle`: the `--sessions-selector` its wait reads with.
    pub(super) sessions: Option<String>,
}

/// The HAProxy configuration to read: `--haproxy-config` when given (it must
/// be readable), else [`DEFAULT_HAPROXY_CONFIG`] or
/// `$GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG` when that file exists and lists
/// a server, else none.
pub(super) fn config_path(given: Option<&Path>) -> Option<PathBuf> {
    let listed =
        |p: &PathBuf| p.is_file() && haproxy::servers_from_config(p).is_ok_and(|s| !s.is_empty());
    given
        .map(Path::to_path_buf)
        .or_else(|| Some(default_config()).filter(listed))
}

/// `$GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG`, else [`DEFAULT_HAPROXY_CONFIG`].
fn default_config() -> PathBuf {
    std::env::var_os("GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_HAPROXY_CONFIG), PathBuf::from)
}

/// True when `server` is a glob rather than one server's name.
fn is_glob(server: &str) -> bool {
    server.contains(['*', '?', '['])
}

impl Target {
    /// The group key `key` (`canary`), without servers.
    pub(super) fn group(key: &str) -> Target {
        Target {
            keys: vec![key.to_string()],
            group: Some(key.to_string()),
            servers: Vec::new(),
            not_written: Vec::new(),
            source: None,
            socket: None,
            assumed: false,
            selection: format!("group {key}"),
            sessions: None,
        }
    }

    /// The group key a selector names: `zone-ZONE` for --zone, GROUP for
    /// --group; `None` for a selection by backend. Checks the combination of
    /// options (64 when bad) and the key (65).
    pub(super) fn check_selector(select: &Selector) -> Result<Option<String>, Failure> {
        let usage = |p: &str| Err(Failure::usage(format!("{p}; nothing written (see --help)")));
        let group = match (&select.zone, &select.group) {
            (Some(_), Some(_)) => return usage("--zone and --group: give one"),
            (Some(z), None) if z.is_empty() => return usage("--zone needs a zone name"),
            (Some(z), None) => Some(format!("{}{z}", haproxy::ZONE_GROUP_PREFIX)),
            (None, Some(g)) => Some(g.clone()),
            (None, None) => None,
        };
        if !select.server.is_empty() && select.backend.is_none() {
            return usage("--server needs --backend (it names servers within one backend)");
        }
        match &group {
            None if select.backend.is_none() => {
                usage("which servers? Give --zone, --group or --backend")
            }
            Some(_) if select.backend.is_some() => usage(
                "--zone and --group write one group key for every backend, so not with \
                 --backend: to drain some servers of one backend, name them with --backend \
                 and --server",
            ),
            Some(g) => match validate_identity(g) {
                Err(e) => Err(Failure::invalid(format!("invalid group {g:?}: {e}"))),
                Ok(()) if g.contains('/') => Err(Failure::invalid(format!(
                    "invalid group {g:?}: a key with `/` is a row key; use --backend and \
                     --server"
                ))),
                Ok(()) => Ok(group),
            },
            None => Ok(None),
        }
    }

    /// The target of a selector: the group key, or the row keys, with the
    /// servers of the configuration (or socket) when there is one.
    ///
    /// # Errors
    ///
    /// 64 for a bad combination, or a glob or whole backend with nothing to
    /// expand it; 65 for an invalid key; 66 when the configuration or socket
    /// given cannot be read.
    pub(super) fn servers(select: &Selector) -> Result<Target, Failure> {
        let group = Target::check_selector(select)?;
        let config = config_path(select.haproxy_config.as_deref());
        if let (Some(_), Some(_), None) = (&group, &select.haproxy_socket, &config) {
            return Err(Failure::usage(
                "--zone and --group with --haproxy-socket need the HAProxy configuration too \
                 (--haproxy-config): the stats socket does not show which servers name the \
                 group. A group drain needs neither; nothing written",
            ));
        }
        // The configuration, when there is one, says which servers and row
        // keys; the socket is then only where HAProxy is checked.
        let (all, source, assumed) = match (&config, &select.haproxy_socket) {
            (Some(path), _) => (
                haproxy::servers_from_config(path)?,
                path.display().to_string(),
                false,
            ),
            (None, Some(socket)) => (
                haproxy::servers_from_socket(socket)?,
                format!("stats socket {}", socket.display()),
                true,
            ),
            (None, None) => {
                return match (group, Target::named(select)) {
                    (Some(g), _) => Ok(Target {
                        selection: Target::describe_selection(select),
                        ..Target::group(&g)
                    }),
                    (None, Some(named)) => named,
                    _ => Err(Failure::usage(format!(
                        "{} needs the servers of HAProxy: give --haproxy-config PATH (a copy \
                         of a load balancer's configuration) or --haproxy-socket PATH; {} {}. One \
                         server by exact name needs neither: --backend B --server NAME; \
                         nothing written",
                        if !select.server.is_empty() {
                            "a --server glob"
                        } else {
                            "a whole --backend"
                        },
                        default_config().display(),
                        match default_config().is_file() {
                            true => "lists no server (a package's sample), so it is not read",
                            false => "does not exist here",
                        },
                    ))),
                };
            }
        };
        let mut target = Target::select(all, select, group, source);
        // A server named exactly that this configuration does not list is
        // another load balancer's: the row keys are written as named.
        if let Some(named) = Target::named(select) {
            let listed = |name: &String| {
                let mut all = target
                    .servers
                    .iter()
                    .chain(target.not_written.iter().map(|(s, _)| s));
                all.any(|s| &s.name == name)
            };
            if !select.server.iter().all(listed) {
                target = named?;
            }
        }
        target.socket.clone_from(&select.haproxy_socket);
        target.assumed = assumed && target.source.is_some();
        Ok(target)
    }

    /// The row keys `BACKEND/NAME` of `--backend BACKEND --server NAME...`,
    /// exact names (no glob); `None` for any other selection.
    fn named(select: &Selector) -> Option<Result<Target, Failure>> {
        let b = select.backend.as_ref()?;
        if select.server.is_empty()
            || select.server.iter().any(|n| is_glob(n))
            || select.zone.is_some()
            || select.group.is_some()
        {
            return None;
        }
        let mut keys: Vec<String> = select.server.iter().map(|n| format!("{b}/{n}")).collect();
        keys.sort();
        keys.dedup();
        let checked: Result<(), Failure> = keys.iter().try_for_each(|k| super::error::check_key(k));
        Some(checked.map(|()| Target {
            keys,
            group: None,
            servers: Vec::new(),
            not_written: Vec::new(),
            source: None,
            socket: None,
            assumed: false,
            selection: Target::describe_selection(select),
            sessions: None,
        }))
    }

    /// Picks from `all` the servers of the selection: those whose line
    /// names `group`, or those of the backend (and glob) by their row keys.
    pub(super) fn select(
        all: Vec<Server>,
        select: &Selector,
        group: Option<String>,
        source: String,
    ) -> Target {
        let mut servers = Vec::new();
        let mut not_written = Vec::new();
        for server in all {
            let picked = match &group {
                Some(g) => server.groups.iter().any(|s| s == g),
                None => {
                    select.backend.as_ref() == Some(&server.backend)
                        && (select.server.is_empty()
                            || select.server.iter().any(|g| glob_match(g, &server.name)))
                }
            };
            if !picked {
                continue;
            }
            match (&server.enrolment, &group) {
                (Enrolment::NotEnrolled(why), _) => {
                    let why = why.clone();
                    not_written.push((server, why));
                }
                (_, None) if server.row_key().is_none() => {
                    let why = server.no_row_key();
                    not_written.push((server, why));
                }
                _ => servers.push(server),
            }
        }
        let mut keys: Vec<String> = match &group {
            Some(g) => vec![g.clone()],
            None => servers
                .iter()
                .filter_map(|s| s.row_key().map(str::to_string))
                .collect(),
        };
        keys.sort();
        keys.dedup();
        Target {
            keys,
            group,
            servers,
            not_written,
            source: Some(source),
            socket: None,
            assumed: false,
            selection: Target::describe_selection(select),
            sessions: None,
        }
    }

    /// The key written that concerns `server`: the group key, or its row
    /// key.
    pub(super) fn key_of<'a>(&'a self, server: &'a Server) -> Option<&'a str> {
        self.group.as_deref().or_else(|| server.row_key())
    }

    /// The failure (exit 65, `invalid`) for a selection with no key: no
    /// enrolled server matches, and those that matched but cannot be written
    /// are named with the reason.
    pub(super) fn nothing_selected(&self) -> Failure {
        let mut message = format!(
            "no server to write matches {} in {}; nothing written",
            self.selection,
            self.source.as_deref().unwrap_or("the configuration")
        );
        if !self.not_written.is_empty() {
            message.push_str(&format!(
                " (matched, but no row key of theirs decides them: {} server{}: {})",
                self.not_written.len(),
                if self.not_written.len() == 1 { "" } else { "s" },
                self.not_written
                    .iter()
                    .map(|(s, why)| format!("{} {why}", s.id()))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        Failure::invalid(message)
    }

    /// The servers `keys` decide: every server of a group, else those whose
    /// row key is one of `keys`.
    pub(super) fn servers_of(&self, keys: &[String]) -> Vec<&Server> {
        self.servers
            .iter()
            .filter(|s| self.key_of(s).is_some_and(|k| keys.iter().any(|w| w == k)))
            .collect()
    }

    /// The servers `keys` decide, as `<backend>/<server>` (HAProxy's
    /// `proxy` and `server` labels): those of the configuration or socket,
    /// else the row keys named.
    pub(super) fn session_servers(&self, keys: &[String]) -> Vec<String> {
        match self.source {
            Some(_) => self.servers_of(keys).iter().map(|s| s.id()).collect(),
            None => keys.iter().filter(|k| k.contains('/')).cloned().collect(),
        }
    }

    pub(super) fn describe_selection(select: &Selector) -> String {
        let mut parts = Vec::new();
        if let Some(z) = &select.zone {
            parts.push(format!("zone {z}"));
        }
        if let Some(g) = &select.group {
            parts.push(format!("group {g}"));
        }
        if let Some(b) = &select.backend {
            parts.push(format!("backend {b}"));
        }
        if !select.server.is_empty() {
            parts.push(format!("servers {}", select.server.join(" ")));
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
            group: None,
            backend: backend.map(Into::into),
            server: server.map(Into::into).into_iter().collect(),
            haproxy_config: None,
            haproxy_socket: None,
        }
    }

    pub(crate) const CONFIG: &str = "defaults\n  default-server agent-check\nbackend web\n  server web-01 1.1.1.1:80 agent-send \"web/web-01 zone-a\\n\"\n  server web-02 1.1.1.2:80 agent-send \"web/web-02 zone-b\\n\"\n  server web-03 1.1.1.3:80 no-agent-check agent-send \"web/web-03 zone-b\\n\"\n  server web-04 1.1.1.4:80 no-agent-check\n  server-template web-tpl 2 web.consul:80 agent-send \"zone-b\\n\"\nbackend api\n  server api-01 1.1.2.1:80 agent-send \"api/api-01 zone-b canary\\n\"\n";

    fn pick(select: &Selector) -> Target {
        let group = Target::check_selector(select).unwrap();
        Target::select(haproxy::parse_config(CONFIG), select, group, "cfg".into())
    }

    #[test]
    fn a_zone_is_one_group_key_and_previews_its_servers_templates_included() {
        let t = pick(&selector(Some("b"), None, None));
        assert_eq!(t.keys, vec!["zone-b"]);
        let ids: Vec<String> = t.servers.iter().map(Server::id).collect();
        assert_eq!(
            ids,
            ["web/web-02", "web/web-tpl1", "web/web-tpl2", "api/api-01"]
        );
        let ne: Vec<(String, &str)> = t
            .not_written
            .iter()
            .map(|(s, w)| (s.id(), w.as_str()))
            .collect();
        assert_eq!(ne, vec![("web/web-03".to_string(), "no agent-check")]);
    }

    #[test]
    fn a_backend_is_its_row_keys_and_template_servers_are_not_written() {
        let t = pick(&selector(None, Some("web"), None));
        assert_eq!(t.keys, vec!["web/web-01", "web/web-02"]);
        let ne: Vec<String> = t.not_written.iter().map(|(s, _)| s.id()).collect();
        assert_eq!(
            ne,
            ["web/web-03", "web/web-04", "web/web-tpl1", "web/web-tpl2"]
        );
        assert!(t.not_written[2].1.starts_with("server-template"));
        let t = pick(&selector(None, Some("web"), Some("web-0[12]")));
        assert_eq!(t.keys, vec!["web/web-01", "web/web-02"]);
        assert!(t.not_written.is_empty());
    }

    #[test]
    fn bad_combinations_are_usage_errors() {
        let mut both = selector(Some("b"), Some("web"), None);
        assert_eq!(Target::check_selector(&both).unwrap_err().code, 64);
        both.backend = None;
        both.group = Some("canary".into());
        assert_eq!(Target::check_selector(&both).unwrap_err().code, 64);
        // With the socket, the configuration is still where the servers
        // come from: read first (here missing: 66).
        let mut socket = selector(Some("b"), None, None);
        socket.haproxy_socket = Some("/nonexistent/admin.sock".into());
        socket.haproxy_config = Some("/nonexistent/haproxy.cfg".into());
        assert_eq!(
            Target::servers(&socket).err().unwrap().code,
            66,
            "config read"
        );
        assert_eq!(
            Target::check_selector(&selector(None, None, Some("x")))
                .unwrap_err()
                .code,
            64
        );
        assert_eq!(
            Target::check_selector(&selector(None, None, None))
                .unwrap_err()
                .code,
            64
        );
        assert_eq!(
            Target::check_selector(&selector(Some(""), None, None))
                .unwrap_err()
                .code,
            64
        );
        let mut row = selector(None, None, None);
        row.group = Some("web/web-01".into());
        assert_eq!(Target::check_selector(&row).unwrap_err().code, 65);
        row.group = Some("rack-7".into());
        assert_eq!(
            Target::check_selector(&row).unwrap(),
            Some("rack-7".to_string())
        );
        assert!(is_glob("web-0[12]") && is_glob("web-*") && !is_glob("web-01"));
        // An exact name is its row key; a glob or a group is not a name.
        let named = Target::named(&selector(None, Some("web"), Some("web-09")));
        assert_eq!(named.unwrap().unwrap().keys, ["web/web-09"]);
        let mut two = selector(None, Some("web"), Some("web-09"));
        two.server.push("web-01".into());
        assert_eq!(
            Target::named(&two).unwrap().unwrap().keys,
            ["web/web-01", "web/web-09"]
        );
        two.server.push("web-0*".into());
        assert!(Target::named(&two).is_none(), "a glob among them");
        assert!(Target::named(&selector(None, Some("web"), Some("web-*"))).is_none());
        assert!(Target::named(&selector(None, Some("web"), None)).is_none());
        let bad = Target::named(&selector(None, Some("web"), Some("a b")));
        assert_eq!(bad.unwrap().err().unwrap().code, 65);
    }
}
