//! The writer's Prometheus settings from the packaging's defaults file, so
//! that a console node configured once (by the cookbook or by hand) confirms
//! writes and checks groups without options: `--prometheus` >
//! `$GITLAB_HAPROXY_AGENT_PROMETHEUS_URL` > the file > none, and the same
//! for the selector.

/// The defaults file the package installs and the systemd unit reads
/// (`EnvironmentFile=`); `$GITLAB_HAPROXY_AGENT_DEFAULTS_FILE` names another.
pub const DEFAULTS_FILE: &str = "/etc/default/gitlab-haproxy-agent";

/// The variables the writer takes from the defaults file. Only these: the
/// Consul address and token of a console node stay those of its shell (as
/// for the `consul` CLI).
pub const FILE_VARIABLES: [&str; 2] = [
    "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL",
    "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR",
];

/// The [`FILE_VARIABLES`] that `text` (lines `NAME=value`, `#` comments,
/// optional `export`, optional matching quotes) sets and `is_set` says the
/// environment does not already set (an empty value in the environment is
/// set: it means none).
pub fn from_defaults(text: &str, is_set: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let name = name.trim();
        if !FILE_VARIABLES.contains(&name) || is_set(name) {
            continue;
        }
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
            .unwrap_or(value);
        // The last line wins, as for a shell or systemd.
        out.retain(|(n, _)| n != name);
        out.push((name.to_string(), value.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_the_prometheus_settings_not_set_already() {
        let text = "# comment\n#GITLAB_HAPROXY_AGENT_PROMETHEUS_URL=http://old:9090\n\
                    GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://c:8500\n\
                    GITLAB_HAPROXY_AGENT_PROMETHEUS_URL=http://p:9090\n\
                    export GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR='job=\"a\",environment=\"gprd\"'\n";
        assert_eq!(
            from_defaults(text, |_| false),
            [
                (
                    "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL".to_string(),
                    "http://p:9090".to_string()
                ),
                (
                    "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR".to_string(),
                    "job=\"a\",environment=\"gprd\"".to_string()
                ),
            ]
        );
        let set = from_defaults(text, |n| n == "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL");
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].0, "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR");
    }
}
