//! The grammar of the HAProxy configuration the writer reads, pure (no
//! I/O): the servers of a configuration text (server lines,
//! `default-server`, agent-check and the agent-send line with its groups)
//! and of the stats socket's `show servers state` answer (which has no
//! agent-send line, so no zones). Reading the file and the socket is the
//! writer's.

use std::collections::{BTreeMap, HashMap};

use crate::model::identity::{parse_line, validate_identity, MAX_LINE};

/// Group name prefix that puts a server in a zone: `zone-us-east1-b`.
pub const ZONE_GROUP_PREFIX: &str = "zone-";

/// Most servers one `server-template` line may declare here (the cookbook
/// allows 1000); a larger count is read as a line that declares none.
pub const MAX_TEMPLATE_SERVERS: u32 = 10_000;

/// `CHK_ST_ENABLED` in `srv_agent_state` of `show servers state`: the agent
/// check runs.
const CHK_ST_ENABLED: u32 = 0x04;

/// `SRV_ADMF_FDRAIN` in `srv_admin_state` of `show servers state`: the
/// server was put in DRAIN (by the agent or the CLI).
pub const ADMIN_FORCED_DRAIN: u32 = 0x08;

/// `SRV_ADMF_FMAINT` in `srv_admin_state` of `show servers state`: the
/// server was put in MAINT (by the agent or the CLI).
pub const ADMIN_FORCED_MAINT: u32 = 0x01;

/// One server of the HAProxy configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Backend (or listen) section name.
    pub backend: String,
    /// Server name; for a `server-template` line, `<prefix><N>` as HAProxy
    /// names them.
    pub name: String,
    /// What the agent is asked about this server, when it is enrolled.
    pub enrolment: Enrolment,
    /// The group identities (no `/`) of the agent-send line, in order, also
    /// of a server whose agent-check is off or whose line the agent refuses.
    pub groups: Vec<String>,
    /// Declared by a `server-template` line: all its servers send the same
    /// line, so none has a row key of its own.
    pub template: bool,
}

/// Whether the agent decides a server's admin state, and through which keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolment {
    /// agent-check is on and the agent answers the agent-send line.
    Enrolled {
        /// Every identity of the agent-send line, in order (row key first
        /// by convention), as the agent reads them.
        identities: Vec<String>,
    },
    /// The agent is not asked about this server or never answers its
    /// agent-send line: why, in words.
    NotEnrolled(String),
}

impl Server {
    /// `<backend>/<server>`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.backend, self.name)
    }

    /// The identities the agent reads for it, in order; empty when not
    /// enrolled.
    pub fn identities(&self) -> &[String] {
        match &self.enrolment {
            Enrolment::Enrolled { identities } => identities,
            Enrolment::NotEnrolled(_) => &[],
        }
    }

    /// The row key a write for this server alone must use: the first
    /// identity of its line when that is a row key (`<backend>/<server>`),
    /// the one the agent reads first. `None` when not enrolled, for a
    /// server-template server, and for a line that starts with a group.
    pub fn row_key(&self) -> Option<&str> {
        let first = self.identities().first()?;
        (!self.template && first.contains('/')).then_some(first.as_str())
    }

    /// Why no row key of its own decides it, for a report.
    pub fn no_row_key(&self) -> String {
        match &self.enrolment {
            Enrolment::NotEnrolled(why) => why.clone(),
            _ if self.template => format!(
                "server-template: no row key of its own; its groups decide ({})",
                self.groups.join(" ")
            ),
            Enrolment::Enrolled { identities } => format!(
                "its agent-send line starts with the group `{}`, which the agent reads first",
                identities[0]
            ),
        }
    }
}

/// Section keywords of HAProxy 2.x; lines starting with any other word belong
/// to the section above.
const SECTIONS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "peers",
    "resolvers",
    "userlist",
    "mailers",
    "program",
    "http-errors",
    "ring",
    "cache",
    "log-forward",
    "crt-store",
    "traces",
    "acme",
    "dynamic-update",
];

/// Server keywords that take one argument: skipped with it, so that an
/// argument is never read as a keyword.
const ONE_ARG: &[&str] = &[
    "addr",
    "agent-addr",
    "agent-inter",
    "agent-port",
    "agent-send",
    "alpn",
    "ca-file",
    "check-alpn",
    "check-proto",
    "check-sni",
    "ciphers",
    "ciphersuites",
    "cookie",
    "crl-file",
    "crt",
    "curves",
    "downinter",
    "error-limit",
    "fall",
    "fastinter",
    "guid",
    "hash-key",
    "id",
    "init-addr",
    "inter",
    "log-proto",
    "max-reuse",
    "maxconn",
    "maxqueue",
    "minconn",
    "namespace",
    "npn",
    "observe",
    "on-error",
    "on-marked-down",
    "on-marked-up",
    "pool-conn-name",
    "pool-low-conn",
    "pool-max-conn",
    "pool-purge-delay",
    "port",
    "proto",
    "proxy-v2-options",
    "redir",
    "resolve-net",
    "resolve-prefer",
    "resolvers",
    "rise",
    "shard",
    "sigalgs",
    "client-sigalgs",
    "slowstart",
    "sni",
    "socks4",
    "source",
    "ssl-max-ver",
    "ssl-min-ver",
    "tcp-ut",
    "track",
    "usesrc",
    "verify",
    "verifyhost",
    "weight",
    "ws",
];

/// The agent options a server line ends up with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct AgentOptions {
    check: bool,
    send: Option<String>,
}

impl AgentOptions {
    /// Applies server keywords in order; later ones win, as in HAProxy.
    fn apply(&mut self, params: &[String]) {
        let mut i = 0;
        while i < params.len() {
            match params[i].as_str() {
                "agent-check" => self.check = true,
                "no-agent-check" => self.check = false,
                "agent-send" => {
                    if let Some(v) = params.get(i + 1) {
                        self.send = Some(v.clone());
                    }
                }
                _ => {}
            }
            i += if ONE_ARG.contains(&params[i].as_str()) {
                2
            } else {
                1
            };
        }
    }
}

#[derive(Default)]
struct Proxy {
    name: String,
    defaults: AgentOptions,
}

/// Parses HAProxy configuration text into its servers, in file order.
///
/// Reads `backend` and `listen` sections' `server` and `default-server`
/// and `server-template` lines (HAProxy configuration.txt 5.2
/// "server-template": `server-template <prefix> <num | range> <fqdn>[:port]
/// [params*]` declares `<prefix>1..<prefix><num>`, or `<prefix><N>..<M>`
/// for a range `N-M`), with `default-server` of the `defaults` section in
/// force (named defaults and `from` included). Environment variables in
/// values are not expanded.
pub fn parse_config(text: &str) -> Vec<Server> {
    let mut servers = Vec::new();
    let mut named: HashMap<String, AgentOptions> = HashMap::new();
    let mut last_defaults = AgentOptions::default();
    // The section being read: a defaults section (its name), a proxy with
    // servers, or anything else.
    enum Section {
        Defaults(Option<String>),
        Proxy(Proxy),
        Other,
    }
    let mut section = Section::Other;
    for raw in text.lines() {
        let words = tokenize(raw);
        let Some(first) = words.first() else {
            continue;
        };
        if SECTIONS.contains(&first.as_str()) {
            section = match first.as_str() {
                "defaults" => {
                    // `defaults [<name>] [from <other>]`: starts from the
                    // named one, else from nothing.
                    let name = words.get(1).filter(|w| *w != "from").cloned();
                    let from = words
                        .iter()
                        .position(|w| w == "from")
                        .and_then(|i| words.get(i + 1));
                    last_defaults = from.and_then(|f| named.get(f).cloned()).unwrap_or_default();
                    if let Some(n) = &name {
                        named.insert(n.clone(), last_defaults.clone());
                    }
                    Section::Defaults(name)
                }
                "backend" | "listen" => {
                    let from = words
                        .iter()
                        .position(|w| w == "from")
                        .and_then(|i| words.get(i + 1));
                    let defaults = match from {
                        Some(f) => named.get(f).cloned().unwrap_or_default(),
                        None => last_defaults.clone(),
                    };
                    Section::Proxy(Proxy {
                        name: words.get(1).cloned().unwrap_or_default(),
                        defaults,
                    })
                }
                _ => Section::Other,
            };
            continue;
        }
        match &mut section {
            Section::Defaults(name) if first == "default-server" => {
                last_defaults.apply(&words[1..]);
                if let Some(n) = name {
                    named.insert(n.clone(), last_defaults.clone());
                }
            }
            Section::Proxy(proxy) if first == "default-server" => {
                proxy.defaults.apply(&words[1..]);
            }
            Section::Proxy(proxy) if first == "server" && words.len() >= 3 => {
                let mut options = proxy.defaults.clone();
                options.apply(&words[3..]);
                servers.push(server(&proxy.name, &words[1], &options, false));
            }
            Section::Proxy(proxy) if first == "server-template" && words.len() >= 4 => {
                let mut options = proxy.defaults.clone();
                options.apply(&words[4..]);
                for n in template_numbers(&words[2]) {
                    let name = format!("{}{n}", words[1]);
                    servers.push(server(&proxy.name, &name, &options, true));
                }
            }
            _ => {}
        }
    }
    servers
}

/// The backends (and listen sections) of `text` whose load-balancing
/// algorithm ignores server weights, with that algorithm: `static-rr` and
/// `first`, and the hashing ones (`source`, `uri`, `url_param`, `hdr(...)`,
/// `rdp-cookie`, `hash`) unless `hash-type consistent`. HAProxy applies
/// only 0% and 100% there at runtime (configuration.txt "balance": static
/// algorithms), so a weight or a ramp is answered and not applied. A
/// `balance` or `hash-type` of a `defaults` section (named, or the last
/// one) applies to the proxies after it, as HAProxy does.
pub fn static_backends(text: &str) -> BTreeMap<String, String> {
    #[derive(Clone, Default)]
    struct Algo {
        balance: Option<String>,
        consistent: bool,
    }
    impl Algo {
        fn apply(&mut self, words: &[String]) {
            match words.first().map(String::as_str) {
                Some("balance") => self.balance = words.get(1).map(|w| w.to_ascii_lowercase()),
                Some("hash-type") => {
                    self.consistent = words.get(1).is_some_and(|w| w == "consistent");
                }
                _ => {}
            }
        }
        fn ignores_weights(&self) -> bool {
            let Some(b) = &self.balance else {
                return false;
            };
            let name = b.split('(').next().unwrap_or_default();
            match name {
                "static-rr" | "first" => true,
                "source" | "uri" | "url_param" | "hdr" | "rdp-cookie" | "hash" => !self.consistent,
                _ => false,
            }
        }
    }
    let mut out = BTreeMap::new();
    let mut named: HashMap<String, Algo> = HashMap::new();
    let mut last = Algo::default();
    let mut current: Option<(Option<String>, Algo, bool)> = None;
    let finish = |current: &mut Option<(Option<String>, Algo, bool)>,
                  out: &mut BTreeMap<String, String>| {
        if let Some((Some(name), algo, true)) = current.take() {
            if algo.ignores_weights() {
                out.insert(name, algo.balance.unwrap_or_default());
            }
        }
    };
    for raw in text.lines() {
        let words = tokenize(raw);
        let Some(first) = words.first() else {
            continue;
        };
        if SECTIONS.contains(&first.as_str()) {
            finish(&mut current, &mut out);
            let from = words
                .iter()
                .position(|w| w == "from")
                .and_then(|i| words.get(i + 1));
            let name = words.get(1).filter(|w| *w != "from").cloned();
            current = match first.as_str() {
                "defaults" => {
                    last = from.and_then(|f| named.get(f).cloned()).unwrap_or_default();
                    Some((name, last.clone(), false))
                }
                "backend" | "listen" => {
                    let algo = match from {
                        Some(f) => named.get(f).cloned().unwrap_or_default(),
                        None => last.clone(),
                    };
                    Some((name, algo, true))
                }
                _ => None,
            };
            continue;
        }
        if let Some((name, algo, proxy)) = &mut current {
            algo.apply(&words);
            if !*proxy {
                last = algo.clone();
                if let Some(n) = name {
                    named.insert(n.clone(), algo.clone());
                }
            }
        }
    }
    finish(&mut current, &mut out);
    out
}

/// The backends of `text` that ignore weights ([`static_backends`]) among
/// those a write selects: the backend of row key `key` (`B/S`), the
/// backends of the servers naming group `key`, or backend `key` when
/// `whole_backend`: why their weights are ignored, in words; `None` when
/// none is such a backend.
pub fn weights_ignored(text: &str, key: &str, whole_backend: bool) -> Option<String> {
    let statics = static_backends(text);
    if statics.is_empty() {
        return None;
    }
    let backends: Vec<String> = match key.split_once('/') {
        _ if whole_backend => vec![key.to_string()],
        Some((backend, _)) => vec![backend.to_string()],
        None => parse_config(text)
            .into_iter()
            .filter(|s| s.groups.iter().any(|g| g == key))
            .map(|s| s.backend)
            .collect(),
    };
    let mut out: Vec<String> = backends
        .into_iter()
        .filter_map(|b| statics.get(&b).map(|algo| format!("{b} (balance {algo})")))
        .collect();
    out.sort();
    out.dedup();
    (!out.is_empty()).then(|| {
        format!(
            "in {} the algorithm ignores server weights, and HAProxy applies only 0% and 100% \
             there, so the servers would jump to their full weight",
            out.join(", ")
        )
    })
}

/// The server numbers of a `server-template` `<num | range>`: `3` is 1..=3,
/// `5-7` is 5..=7; empty when it is neither, or declares more than
/// [`MAX_TEMPLATE_SERVERS`].
fn template_numbers(spec: &str) -> std::ops::RangeInclusive<u32> {
    let (low, high) = match spec.split_once('-') {
        Some((l, h)) => (l.parse().ok(), h.parse().ok()),
        None => (Some(1), spec.parse().ok()),
    };
    match (low, high) {
        (Some(l), Some(h)) if l >= 1 && l <= h && h - l < MAX_TEMPLATE_SERVERS => l..=h,
        _ => std::ops::RangeInclusive::new(1, 0),
    }
}

fn server(backend: &str, name: &str, options: &AgentOptions, template: bool) -> Server {
    let enrolment = match &options.send {
        _ if !options.check => Enrolment::NotEnrolled("no agent-check".into()),
        None => Enrolment::NotEnrolled("agent-check without agent-send".into()),
        Some(send) => enrolment(send),
    };
    Server {
        backend: backend.to_string(),
        name: name.to_string(),
        enrolment,
        groups: options.send.as_deref().map(groups).unwrap_or_default(),
        template,
    }
}

/// Whether the agent answers the agent-send line `send` (as HAProxy sends
/// it, LF included): the line ends with LF, fits the agent's 1 KiB, and the
/// agent's parser accepts it.
fn enrolment(send: &str) -> Enrolment {
    // The agent reads up to the first LF; without one it waits, times out
    // and answers nothing.
    let Some((line, _)) = send.split_once('\n') else {
        return Enrolment::NotEnrolled(
            "agent-send does not end with \\n: the agent never answers it".into(),
        );
    };
    if line.len() + 1 > MAX_LINE {
        return Enrolment::NotEnrolled(format!(
            "agent-send is longer than {MAX_LINE} bytes: the agent never answers it"
        ));
    }
    match parse_line(line.as_bytes()) {
        Ok(ids) => Enrolment::Enrolled {
            identities: ids.into_iter().map(str::to_string).collect(),
        },
        Err(e) => Enrolment::NotEnrolled(format!(
            "the agent refuses its agent-send ({e}) and never answers it"
        )),
    }
}

/// The group words (no `/`) of an agent-send line, also of a line the agent
/// refuses, so that a zone's preview lists that server as not decided by the
/// agent rather than leave it out.
fn groups(send: &str) -> Vec<String> {
    let line = send.split('\n').next().unwrap_or_default();
    line.split([' ', '\t', '\r'])
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .map(str::to_string)
        .collect()
}

/// Splits one configuration line into words the way HAProxy does: blanks
/// separate words, `#` starts a comment, double quotes group and keep
/// backslash escapes (`\n`, `\r`, `\t`, `\\`, `\"`, `\xNN`), single quotes
/// group literally, and a backslash outside quotes escapes the next
/// character.
pub fn tokenize(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Vec<u8> = Vec::new();
    let mut in_word = false;
    let bytes = line.as_bytes();
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match (quote, b) {
            (Some(b'\''), b'\'') | (Some(b'"'), b'"') => quote = None,
            (Some(b'\''), _) => word.push(b),
            (_, b'\\') if i + 1 < bytes.len() => {
                in_word = true;
                i += 1;
                match bytes[i] {
                    b'n' => word.push(b'\n'),
                    b'r' => word.push(b'\r'),
                    b't' => word.push(b'\t'),
                    b'x' if i + 2 < bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                        match u8::from_str_radix(hex, 16) {
                            Ok(v) => {
                                word.push(v);
                                i += 2;
                            }
                            Err(_) => word.extend_from_slice(b"\\x"),
                        }
                    }
                    other => word.push(other),
                }
            }
            (Some(_), _) => word.push(b),
            (None, b'"' | b'\'') => {
                quote = Some(b);
                in_word = true;
            }
            (None, b'#') => break,
            (None, b' ' | b'\t' | b'\r' | b'\n') => {
                if in_word {
                    words.push(String::from_utf8_lossy(&word).into_owned());
                    word.clear();
                    in_word = false;
                }
            }
            (None, _) => {
                word.push(b);
                in_word = true;
            }
        }
        i += 1;
    }
    if in_word {
        words.push(String::from_utf8_lossy(&word).into_owned());
    }
    words
}

/// Parses `srv_admin_state` of each server in `show servers state` output
/// (version 1), by `<backend>/<server>`.
///
/// # Errors
///
/// A message when the header or a row is not as expected.
pub fn parse_admin_states(out: &str) -> Result<HashMap<String, u32>, String> {
    let table = StateTable::parse(out)?;
    let (be, sv, admin) = (
        table.col("be_name")?,
        table.col("srv_name")?,
        table.col("srv_admin_state")?,
    );
    table
        .rows
        .iter()
        .map(|row| {
            let state = row.number(admin, "srv_admin_state")?;
            Ok((format!("{}/{}", row.get(be)?, row.get(sv)?), state))
        })
        .collect()
}

/// `show servers state` output (version 1): the column names and the rows.
struct StateTable<'a> {
    header: Vec<&'a str>,
    rows: Vec<StateRow<'a>>,
}

/// One server's row of `show servers state`.
struct StateRow<'a> {
    line: &'a str,
    fields: Vec<&'a str>,
}

impl<'a> StateTable<'a> {
    fn parse(out: &'a str) -> Result<Self, String> {
        let mut lines = out.lines();
        match lines.next().map(str::trim) {
            Some("1") => {}
            other => return Err(format!("expected format version 1, got {other:?}")),
        }
        let header = lines
            .next()
            .ok_or("no header line")?
            .trim_start_matches('#')
            .split_whitespace()
            .collect();
        let rows = lines
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|line| StateRow {
                line,
                fields: line.split_whitespace().collect(),
            })
            .collect();
        Ok(StateTable { header, rows })
    }

    /// The position of column `name`.
    fn col(&self, name: &str) -> Result<usize, String> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or(format!("no column {name}"))
    }
}

impl<'a> StateRow<'a> {
    fn get(&self, i: usize) -> Result<&'a str, String> {
        self.fields
            .get(i)
            .copied()
            .ok_or(format!("short row {:?}", self.line))
    }

    fn number(&self, i: usize, name: &str) -> Result<u32, String> {
        self.get(i)?
            .parse()
            .map_err(|_| format!("{name} is not a number in {:?}", self.line))
    }
}

/// Parses `show servers state` output (version 1).
///
/// # Errors
///
/// A message when the header or a row is not as expected.
pub fn parse_servers_state(out: &str) -> Result<Vec<Server>, String> {
    let table = StateTable::parse(out)?;
    let (be, sv, agent) = (
        table.col("be_name")?,
        table.col("srv_name")?,
        table.col("srv_agent_state")?,
    );
    let mut servers = Vec::new();
    for row in &table.rows {
        let (backend, name) = (row.get(be)?, row.get(sv)?);
        let agent_state = row.number(agent, "srv_agent_state")?;
        let row_key = format!("{backend}/{name}");
        let enrolment = if agent_state & CHK_ST_ENABLED == 0 {
            Enrolment::NotEnrolled("no agent-check".into())
        } else if validate_identity(&row_key).is_err() {
            Enrolment::NotEnrolled("name is not a valid key".into())
        } else {
            Enrolment::Enrolled {
                identities: vec![row_key],
            }
        };
        servers.push(Server {
            backend: backend.to_string(),
            name: name.to_string(),
            enrolment,
            groups: Vec::new(),
            template: false,
        });
    }
    Ok(servers)
}

/// Shell-style glob match (the `glob` crate's [`glob::Pattern`]): `*` any
/// run, `?` one character, `[abc]`, `[a-z]`, `[!a-z]` or `[^a-z]` one
/// character of (not of) a set; anything else literally. `**` is `*` (server
/// names have no `/`), and a `[` that is not closed is literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    shell_pattern(pattern).matches(text)
}

/// Compiles a shell glob for [`glob::Pattern`], which reads `**` as a path
/// wildcard, knows only `[!` as negation, and refuses an unclosed `[`.
fn shell_pattern(pattern: &str) -> glob::Pattern {
    let mut glob = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if c == '*' && glob.ends_with('*') {
            continue;
        }
        if c == '^' && glob.ends_with('[') && !glob.ends_with("[[]") {
            glob.push('!');
            continue;
        }
        glob.push(c);
    }
    loop {
        match glob::Pattern::new(&glob) {
            Ok(compiled) => return compiled,
            // Only an unclosed `[` is left to refuse; `[[]` is a literal `[`.
            Err(e) => match glob.char_indices().nth(e.pos) {
                Some((at, '[')) => glob.replace_range(at..at + 1, "[[]"),
                _ => {
                    return glob::Pattern::new(&glob::Pattern::escape(pattern))
                        .expect("an escaped pattern compiles")
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
