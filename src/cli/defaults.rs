//! The writer's Prometheus settings from the packaging's defaults file, so
//! that a console node configured once (by the cookbook or by hand) confirms
//! writes and checks groups without options: `--prometheus` >
//! `$GITLAB_HAPROXY_AGENT_PROMETHEUS_URL` > the file > none, and the same
//! for the selector. The file's values become the options' defaults
//! ([`with_file_defaults`]): the process environment is never changed.

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

/// `cmd` with each of `values` (variable, value; from [`from_defaults`])
/// as the default value of every argument of `cmd` and its subcommands
/// that clap reads from that variable, so that a flag, then the
/// environment, then the file decide. A global argument takes it before
/// clap copies it to the subcommands.
pub fn with_file_defaults(mut cmd: clap::Command, values: &[(String, String)]) -> clap::Command {
    let ids: Vec<(clap::Id, String)> = cmd
        .get_arguments()
        .filter_map(|arg| {
            let env = arg.get_env()?;
            let (_, value) = values.iter().find(|(name, _)| env == name.as_str())?;
            Some((arg.get_id().clone(), value.clone()))
        })
        .collect();
    for (id, value) in ids {
        cmd = cmd.mut_arg(id, |arg| arg.default_value(value));
    }
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|sub| sub.get_name().to_string())
        .collect();
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |sub| with_file_defaults(sub, values));
    }
    cmd
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

    #[test]
    fn the_file_gives_defaults_a_flag_overrides_in_every_subcommand() {
        use clap::{CommandFactory as _, FromArgMatches as _};

        use crate::cli::{Cli, Command, StateCommand};
        let values = [(
            "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL".to_string(),
            "http://file:9090".to_string(),
        )];
        let prometheus = |args: &[&str]| {
            let cmd = with_file_defaults(Cli::command(), &values);
            let matches = cmd.try_get_matches_from(args).unwrap();
            let cli = Cli::from_arg_matches(&matches).unwrap();
            let Some(Command::State(state)) = cli.command else {
                panic!("not state: {args:?}");
            };
            assert!(matches!(state.command, StateCommand::Get { .. }));
            state.prometheus
        };
        let base = ["gitlab-haproxy-agent", "state"];
        assert_eq!(
            prometheus(&[&base[..], &["get", "web/web-01"]].concat()).as_deref(),
            Some("http://file:9090")
        );
        for flag in [
            &[&base[..], &["--prometheus", "http://flag:9090", "get", "k"]].concat(),
            &[&base[..], &["get", "k", "--prometheus", "http://flag:9090"]].concat(),
        ] {
            assert_eq!(
                prometheus(flag).as_deref(),
                Some("http://flag:9090"),
                "{flag:?}"
            );
        }
    }
}
