//! The options of `state`, the writer's command line: its subcommands,
//! selectors, write, confirmation, idle and ramp options. What they mean
//! when run is in [`crate::writer`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::help::EXIT_CODES_HELP;
use super::values::parse_duration;

/// Read and write the desired state in Consul KV, validated, with
/// compare-and-set, in the drain -> wait -> maint order.
#[derive(Debug, Args, Clone)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct StateArgs {
    /// Print one JSON object on stdout instead of tables (progress and
    /// errors still go to stderr).
    #[arg(long, global = true, help_heading = GLOBAL_OPTIONS)]
    pub json: bool,

    /// The Prometheus that scrapes every agent (its base URL, plain http,
    /// e.g. `http://prometheus:9090`) [default: none]. With it, a write
    /// first checks that some load balancer names the group it writes
    /// (see --new-group), then confirms each write step: every agent holds
    /// a snapshot at or past the write's ModifyIndex and answers the
    /// servers the write decides from it (else exit 68, the lagging agents
    /// and the servers another key decides named; the next step is not
    /// written); `state status` and `release-rollback` show what the agents
    /// hold. `--confirm-prometheus` is the former name. An empty value is
    /// none.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_URL",
        alias = "confirm-prometheus",
        help_heading = GLOBAL_OPTIONS
    )]
    pub prometheus: Option<String>,

    /// The `agent-inter` of the enrolled servers (HAProxy's default: 2s).
    /// With --agent-read-delay it sets the shortest --drain-wait,
    /// --maint-wait, --until-idle and --ramp-every accepted: 2 x agent-inter + read delay (5s with the
    /// defaults); shorter waits exit 64, because agents and HAProxy could
    /// skip the intermediate state (drain, or the maint that fires
    /// slowstart).
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL_OPTIONS,
        env = "GITLAB_HAPROXY_AGENT_AGENT_INTER",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub agent_inter: Duration,

    /// The longest an agent takes from a Consul write to serving it (its
    /// --min-query-interval, default 100ms, plus Consul and a timed-out
    /// check); see --agent-inter.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL_OPTIONS,
        env = "GITLAB_HAPROXY_AGENT_READ_DELAY",
        default_value = "1s",
        value_parser = parse_duration
    )]
    pub agent_read_delay: Duration,

    /// What to do.
    #[command(subcommand)]
    pub command: StateCommand,
}

/// `state` subcommands.
#[derive(Debug, Subcommand, Clone)]
pub enum StateCommand {
    /// Show one key: its value, what the agent makes of it, its ModifyIndex.
    #[command(after_help = EXIT_CODES_HELP)]
    Get {
        /// Key relative to the prefix, e.g. `canary` or `web/web-01`.
        key: String,
    },
    /// List every key below the prefix; invalid values are flagged.
    #[command(after_help = EXIT_CODES_HELP)]
    List,
    /// Write one validated value, only if the key has not changed since it
    /// was read (compare-and-set).
    ///
    /// The key is written with Consul Flags 0: set by hand. A row key at
    /// drain, maint or 0% set this way is left alone by `drain --backend` and
    /// `undrain --backend`, also when it replaces the same value `drain`
    /// wrote.
    #[command(after_help = EXIT_CODES_HELP)]
    Set {
        /// Key relative to the prefix.
        key: String,
        /// `ready`, `drain`, `maint` or `N%` (0..=256).
        value: String,
        /// Write only if the key's ModifyIndex is still INDEX (as shown by
        /// `state get`); 0: only if the key does not exist.
        #[arg(long, value_name = "INDEX")]
        cas: Option<u64>,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// Remove one key, only if it has not changed since it was read.
    ///
    /// The servers it selected fall back to their next key, or to ready
    /// without slowstart; `canary enable` and `undrain` go through maint.
    #[command(after_help = EXIT_CODES_HELP)]
    Clear {
        /// Key relative to the prefix.
        key: String,
        /// Remove only if the key's ModifyIndex is still INDEX.
        #[arg(long, value_name = "INDEX")]
        cas: Option<u64>,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// Take the canary group out (`disable`) or bring it back (`enable`),
    /// through the `canary` key.
    ///
    /// The same as `drain --group canary` and `undrain --group canary`.
    /// ChatOps' `/chatops run canary --disable` and `--enable` run these.
    #[command(after_help = EXIT_CODES_HELP)]
    Canary {
        /// disable or enable.
        #[command(subcommand)]
        action: CanaryAction,
    },
    /// Drain servers: drain, wait --drain-wait (or with --until-idle until
    /// their sessions have ended), then maint.
    ///
    /// `--zone Z` (or `--group G`) writes one group key, `zone-Z` (`G`),
    /// which every agent of the datacenter answers for every server whose
    /// agent-send line names that group, server-template servers included:
    /// no HAProxy configuration is needed. A server whose row key has a value
    /// is decided by it, not by the group (a row key overrides its groups).
    /// The group key is taken over whoever set it.
    ///
    /// `--backend B --server NAME` (exact names) writes the row key `B/NAME`.
    /// A glob or a whole backend is expanded from --haproxy-config (or the
    /// default configuration, when it exists) or --haproxy-socket. Row keys
    /// are written with the drain mark, Consul Flags 1; a row key at drain,
    /// maint, 0% or an invalid value (agents answer its last valid value)
    /// without it (even Flags) was set by hand and is left alone and listed. Keys at a weight above 0 are drained; undrain clears them
    /// (ready 100%).
    ///
    /// With a configuration, the report shows what the agents answer for
    /// each selected server at the end, and which key decides.
    ///
    /// `--until-idle 10m` writes maint as soon as no load balancer reports
    /// a session on the servers (HAProxy's exporter, through Prometheus), or
    /// after 10m; the report names those still in session then.
    #[command(after_help = EXIT_CODES_HELP)]
    Drain {
        /// Which servers.
        #[command(flatten)]
        select: Selector,
        /// How long drained servers keep their sessions before maint.
        /// At least 2 x --agent-inter + --agent-read-delay (5s with the
        /// defaults); a shorter wait exits 64.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        drain_wait: Duration,
        /// Wait for the sessions to end.
        #[command(flatten)]
        idle: IdleArgs,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// Bring servers back: a key at drain goes to maint first and is held
    /// there for --maint-wait, then it and keys at maint are removed, so
    /// HAProxy's slowstart ramps the servers up.
    ///
    /// `--zone Z` (`--group G`) brings back the group key `zone-Z` (`G`)
    /// whoever set it; servers whose row key is at drain or maint stay out.
    /// With `--backend`, only row keys with the drain mark (odd Consul Flags,
    /// written by `state drain` or `consul kv put -flags=1`) are taken
    /// back; row keys at drain, maint, 0% or an invalid value set by hand
    /// (even Flags: a server out for repair) are left alone and listed; `state clear` releases
    /// one. Keys that are absent or in service (ready, N%) are left alone.
    ///
    /// `--ramp 25%,50%,100%` writes each weight in turn after maint, each
    /// held --ramp-every, before the key is removed: for backends without
    /// slowstart. Interrupted, a key stays at its step (a valid value);
    /// running the same command again goes on from it.
    #[command(after_help = EXIT_CODES_HELP)]
    Undrain {
        /// Which servers.
        #[command(flatten)]
        select: Selector,
        /// How long maint is held before the key is removed, for keys that
        /// were at drain, so every HAProxy applies it and fires slowstart.
        /// At least 2 x --agent-inter + --agent-read-delay (5s with the
        /// defaults); a shorter wait exits 64.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        maint_wait: Duration,
        /// Bring them back in weight steps.
        #[command(flatten)]
        ramp: RampArgs,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// Every agent as the Prometheus that scrapes them sees it, against the
    /// prefix's X-Consul-Index now: its snapshot's index, the index its
    /// rows were last answered from, its last Consul sync, its rows by
    /// answer. Writes nothing; exit 68 when an agent lags.
    #[command(after_help = EXIT_CODES_HELP)]
    Status(StatusArgs),
    /// What the agent answers for an agent-send line, and which key decides.
    ///
    /// IDENTITY... is the line: the row key, then the groups, in order
    /// (`web/web-01 zone-us-east1-b canary`). Given one row key (or, for a
    /// server-template server, which has none, `<backend>/<server>`), the
    /// server's own agent-send line is read from --haproxy-config (or the
    /// default configuration, when it exists). Without it, when the row key
    /// has no value, the answer is `unknown`: the set group keys that could
    /// decide are listed (exit 0), and the server's identities or
    /// --haproxy-config are asked for.
    #[command(after_help = EXIT_CODES_HELP)]
    Explain {
        /// The identities of the agent-send line, in order.
        #[arg(required = true, value_name = "IDENTITY")]
        identities: Vec<String>,
        /// Read the server's agent-send line from this HAProxy
        /// configuration when one row key is given [default:
        /// $GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG, else
        /// /etc/haproxy/haproxy.cfg, when it exists].
        #[arg(long, value_name = "PATH")]
        haproxy_config: Option<PathBuf>,
        /// Also show what this running HAProxy (its stats socket, `show
        /// stat`) has for the server now: its status and weight, and
        /// whether its agent check was forced down at runtime (`set server
        /// B/S agent down`), which keeps it DOWN whatever the agent answers
        /// until `set server B/S agent up`.
        #[arg(long, value_name = "PATH")]
        haproxy_socket: Option<PathBuf>,
    },
    /// Release, on every agent, the keys held since Consul's data went
    /// backwards (index reset: a -dev restart, a rebuilt cluster, an old
    /// snapshot restored).
    ///
    /// After such a reset the agents keep answering drain, maint or a
    /// weight for keys that vanished or went to ready, and page
    /// (GitLabHAProxyAgentStateRolledBack). Restore the keys that should
    /// stay (`state set`), then run this: it writes the key
    /// `~release-rollback` below the prefix, which every agent sees through
    /// its blocking query, and they all follow Consul again. A new write to
    /// a held key releases that key alone.
    #[command(after_help = EXIT_CODES_HELP)]
    ReleaseRollback {
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// Move the writer's records of who wrote each key, why and until when
    /// from below the prefix (`<prefix>~meta/<key>`, where writers up to
    /// 0.1 kept them and every agent downloads them with each write) to the
    /// sibling prefix (`gitlab-haproxy-agent/state~meta/<key>`), unchanged.
    ///
    /// Each move writes the record there and deletes it here in one
    /// transaction (compare-and-set on the record read, advancing the write
    /// generation), so a writer of either version racing it loses nothing.
    /// Agents serve the same answers throughout: records are never state.
    /// Any write of a key moves its record too; this moves them all.
    #[command(after_help = EXIT_CODES_HELP)]
    MigrateRecords {
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
}

/// `state canary` actions.
#[derive(Debug, Subcommand, Clone)]
pub enum CanaryAction {
    /// `canary` = drain, wait --drain-wait (or --until-idle), then maint.
    /// Interrupted during the wait, drain stays and maint is not written;
    /// re-running finishes.
    /// Written with Consul Flags 0: the `canary` key is taken over and
    /// cleared whoever set it.
    #[command(after_help = EXIT_CODES_HELP)]
    Disable {
        /// How long canary servers keep their sessions before maint.
        /// At least 2 x --agent-inter + --agent-read-delay (5s with the
        /// defaults); a shorter wait exits 64.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        drain_wait: Duration,
        /// Wait for the sessions to end.
        #[command(flatten)]
        idle: IdleArgs,
        /// The HAProxy configuration that says which servers name `canary`,
        /// for --until-idle [default: $GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG,
        /// else /etc/haproxy/haproxy.cfg, when it exists].
        #[arg(long, value_name = "PATH")]
        haproxy_config: Option<PathBuf>,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
    /// maint -> ready: removes the `canary` key (from drain, through maint
    /// held for --maint-wait), so slowstart ramps the servers up; with
    /// --ramp, through weight steps first.
    #[command(after_help = EXIT_CODES_HELP)]
    Enable {
        /// How long maint is held first when the key is at drain.
        /// At least 2 x --agent-inter + --agent-read-delay (5s with the
        /// defaults); a shorter wait exits 64.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        maint_wait: Duration,
        /// Bring them back in weight steps.
        #[command(flatten)]
        ramp: RampArgs,
        /// Dry run.
        #[command(flatten)]
        write: WriteOpts,
    },
}

/// The `--help` heading of the options every `state` command takes, listed
/// after the command's own (its selectors first).
pub const GLOBAL_OPTIONS: &str = "Global options";

/// `--until-idle`: end the drain wait when the servers have no sessions.
#[derive(Debug, Args, Clone, Default)]
pub struct IdleArgs {
    /// Instead of the fixed --drain-wait, write maint as soon as every load
    /// balancer reports no current session on the drained servers
    /// (`haproxy_server_current_sessions{proxy,server}` of HAProxy's own
    /// Prometheus exporter, asked every 500 ms from the Prometheus of
    /// --prometheus, which is then required: exit 64 without it), or
    /// after MAX at the latest; the report names the servers and load
    /// balancers (`instance`) still in session then. It waits at least 2 x
    /// --agent-inter + --agent-read-delay, and MAX may not be shorter (exit
    /// 64). The servers are the row keys' `<backend>/<server>`; a --zone,
    /// --group or `canary` needs the HAProxy configuration to know which
    /// servers name the group (exit 64 without one). A server no load
    /// balancer reports counts as in session; only samples scraped after
    /// the drain count, a load balancer that reported the server before
    /// and does not since counts as in session, and so does one whose
    /// HAProxy reloaded after the drain (its old workers' sessions are not
    /// in the exporter) until MAX, or whose agent counts old HAProxy
    /// workers (gitlab_haproxy_agent_haproxy_old_workers, agents from
    /// --confirm-selector, matched by host) left by a reload before it.
    /// Maint does not close sessions still open. Not with --drain-wait.
    #[arg(
        long,
        value_name = "MAX",
        value_parser = parse_duration,
        conflicts_with = "drain_wait"
    )]
    pub until_idle: Option<Duration>,
    /// PromQL label matchers that select the HAProxy exporter series for
    /// --until-idle (e.g. `job="haproxy",environment="gprd"`); empty: every
    /// series with the servers' `proxy` and `server` labels.
    #[arg(
        long,
        value_name = "MATCHERS",
        default_value = "",
        env = "GITLAB_HAPROXY_AGENT_SESSIONS_SELECTOR"
    )]
    pub sessions_selector: String,
}

/// `--ramp`: bring servers back through weight steps.
#[derive(Debug, Args, Clone, Default)]
pub struct RampArgs {
    /// Weight steps, e.g. `25%,50%,100%`: after maint, each key is written
    /// `N%` (answered `ready N%`) for each step in turn (each held for --ramp-every, and
    /// confirmed like every write with --prometheus), then removed
    /// (ready 100%). Steps are 1% to 100%, increasing; the last is 100%,
    /// added when left out. A key left at a step by an interrupted ramp (a
    /// row key with the drain mark, or a group key) goes on from there when
    /// the command is run again. For backends without slowstart, or whose
    /// slowstart is too short. A bad list exits 64.
    #[arg(long, value_name = "STEPS", value_parser = parse_ramp)]
    pub ramp: Option<RampSteps>,
    /// How long each --ramp step is held. At least 2 x --agent-inter +
    /// --agent-read-delay (5s with the defaults); a shorter one exits 64.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub ramp_every: Duration,
}

impl RampArgs {
    /// The weights below 100% of `--ramp`, increasing; empty without it.
    pub fn weights(&self) -> &[u16] {
        self.ramp.as_ref().map_or(&[], |r| &r.0)
    }
}

/// The weights of `--ramp` below 100%, increasing (the last step, 100%, is
/// the removal of the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RampSteps(pub Vec<u16>);

/// Parses `--ramp`: `N%` steps separated by commas, each 1..=100 and above
/// the one before; a last step below 100% implies 100%.
///
/// # Errors
///
/// A message naming the bad step (exit 64).
pub fn parse_ramp(text: &str) -> Result<RampSteps, String> {
    let mut steps: Vec<u16> = Vec::new();
    for part in text.split(',').map(str::trim) {
        let n = part
            .strip_suffix('%')
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u16>().ok())
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| format!("{part:?} is not a weight step from 1% to 100% (N%)"))?;
        if steps.last().is_some_and(|last| n <= *last) {
            return Err(format!("{part} does not increase over the step before it"));
        }
        steps.push(n);
    }
    steps.retain(|n| *n < 100);
    Ok(RampSteps(steps))
}

/// Options of every command that writes.
#[derive(Debug, Args, Clone)]
pub struct WriteOpts {
    /// Show what would be written, and what the agents would answer then;
    /// write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write a group key (`--zone`, `--group`, `canary`, `set` of a group)
    /// that no load balancer names yet. Without it, when --prometheus is
    /// set and answers, a group no agent has been asked about in the last
    /// hour is refused (exit 65, nothing written, the groups that exist
    /// listed closest first). Prometheus unset, unreachable or without
    /// agents: the group is not checked, a warning says so, and the write
    /// goes on (a drain is never held up by monitoring).
    #[arg(long)]
    pub new_group: bool,
    /// Confirmation of each write step by the fleet, through Prometheus.
    #[command(flatten)]
    pub confirm: ConfirmArgs,
    /// Who the write is for, recorded with every key written (a ChatOps bot
    /// names the person it acts for) [default: $SUDO_USER, else $USER,
    /// else $LOGNAME, else `uid N on host H`].
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Why, recorded with every key written and shown by `state get`,
    /// `state list` and the agents' /status (1 KiB at most). Required to
    /// write drain or maint (`drain`, `canary disable`, `set KEY
    /// drain|maint`): without it they exit 64 and write nothing.
    #[arg(long, value_name = "TEXT", env = "GITLAB_HAPROXY_AGENT_REASON")]
    pub reason: Option<String>,
    /// Until when the servers are meant to stay out: a duration from now
    /// (`2h`, `3d`) or an RFC 3339 time with its zone
    /// (`2026-12-01T18:00:00Z`, `2026-12-01T19:00:00+01:00`; one without a
    /// zone is refused). Recorded
    /// with the write; past it the agents' metrics raise
    /// GitLabHAProxyAgentKeyPastUntil (a ticket). A reminder: nothing is
    /// undone on its own.
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
}

impl StateCommand {
    /// The write options of a command that writes; `None` for `get`,
    /// `list`, `explain` and `status`.
    pub fn write_opts(&self) -> Option<&WriteOpts> {
        match self {
            StateCommand::Set { write, .. }
            | StateCommand::Clear { write, .. }
            | StateCommand::Drain { write, .. }
            | StateCommand::Undrain { write, .. }
            | StateCommand::ReleaseRollback { write }
            | StateCommand::MigrateRecords { write }
            | StateCommand::Canary {
                action: CanaryAction::Disable { write, .. } | CanaryAction::Enable { write, .. },
            } => Some(write),
            StateCommand::Get { .. }
            | StateCommand::List
            | StateCommand::Explain { .. }
            | StateCommand::Status(_) => None,
        }
    }
}

/// The default `--confirm-selector` and `state status --selector`: the
/// scrape job the alerts and the dashboard use.
pub const DEFAULT_PROMETHEUS_SELECTOR: &str = r#"job="gitlab-haproxy-agent""#;

/// The options every write command takes to confirm its writes through
/// Prometheus (see [`crate::writer::confirm`]).
#[derive(Debug, Args, Clone, Default)]
pub struct ConfirmArgs {
    /// The global `--prometheus` (or `--confirm-prometheus`, or
    /// `$GITLAB_HAPROXY_AGENT_PROMETHEUS_URL`), copied here by the writer:
    /// confirmation runs when it is set and not empty.
    #[arg(skip)]
    pub confirm_prometheus: Option<String>,
    /// Go on although some servers that name the written group are decided
    /// by another key (their row key, or a group earlier on their
    /// agent-send line); they are still named. Without it, once every agent
    /// is at the write's index, such servers fail the confirmation of a
    /// drain or maint step (exit 68, the next step not written); a step
    /// that takes servers back only names them.
    #[arg(long)]
    pub accept_overridden: bool,
    /// How long to wait for every agent to confirm each write step. Make it
    /// longer than the scrape interval plus agent-inter.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub confirm_timeout: Duration,
    /// PromQL label matchers that select the agents' scrape targets (every
    /// agent reading this Consul datacenter, e.g. add
    /// `environment="gprd"`).
    #[arg(
        long,
        value_name = "MATCHERS",
        default_value = DEFAULT_PROMETHEUS_SELECTOR,
        env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR"
    )]
    pub confirm_selector: String,
}

/// Options of `state status`.
#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// The global `--prometheus`, copied here by the writer (required by
    /// `state status`).
    #[arg(skip)]
    pub prometheus: String,
    /// PromQL label matchers that select the agents' scrape targets.
    #[arg(
        long,
        value_name = "MATCHERS",
        default_value = DEFAULT_PROMETHEUS_SELECTOR,
        env = "GITLAB_HAPROXY_AGENT_PROMETHEUS_SELECTOR"
    )]
    pub selector: String,
}

/// Which servers `drain` and `undrain` act on: a group (--zone, --group)
/// or row keys (--backend, with --server).
///
/// Combinations are checked by the writer, not by clap, so that a bad one is
/// reported like every other failure (a JSON object with `--json`).
#[derive(Debug, Args, Clone, Default)]
pub struct Selector {
    /// Servers whose agent-send line names the group `zone-ZONE`: writes the
    /// group key `zone-ZONE`, no HAProxy configuration needed.
    #[arg(long, value_name = "ZONE")]
    pub zone: Option<String>,
    /// Servers whose agent-send line names the group GROUP (`canary`,
    /// `rack-7`): writes the group key GROUP. `--group zone-b` is `--zone b`.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Servers of this backend (or listen section), by their row keys
    /// `BACKEND/SERVER`.
    #[arg(long, value_name = "BACKEND")]
    pub backend: Option<String>,
    /// Only servers of --backend named NAME (written as the row key
    /// BACKEND/NAME, no configuration needed; a configuration that lists the
    /// server gives its real row key), or matching a glob (`*`, `?`,
    /// `[a-c]`; quote it), which needs --haproxy-config or --haproxy-socket.
    /// Repeat it for several.
    #[arg(long, value_name = "NAME|GLOB")]
    pub server: Vec<String>,
    /// HAProxy configuration to read the servers from: expands --backend and
    /// a --server glob, and previews what each server will be answered
    /// (with --zone too). Optional [default:
    /// $GITLAB_HAPROXY_AGENT_HAPROXY_CONFIG, else /etc/haproxy/haproxy.cfg,
    /// used only when it exists].
    #[arg(long, value_name = "PATH")]
    pub haproxy_config: Option<PathBuf>,
    /// The running HAProxy's stats socket: after the drain wait, `drain`
    /// checks there (`show servers state`) that every selected server went
    /// to DRAIN, and stops before maint (exit 65) when one did not; after
    /// maint, that every one went to MAINT (exit 65 when one did not). The
    /// servers come from the configuration when there is one; without it,
    /// from this socket, which shows no agent-send line: row keys are then
    /// assumed to be `<backend>/<server>`, and --zone or --group cannot be
    /// checked (exit 64).
    #[arg(long, value_name = "PATH")]
    pub haproxy_socket: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_steps_increase_from_1_to_100_percent_and_imply_100() {
        assert_eq!(parse_ramp("25%,50%,100%"), Ok(RampSteps(vec![25, 50])));
        assert_eq!(parse_ramp("25%, 50%"), Ok(RampSteps(vec![25, 50])));
        assert_eq!(parse_ramp("100%"), Ok(RampSteps(vec![])));
        for bad in [
            "",
            "0%",
            "25",
            "50%,25%",
            "25%,25%",
            "101%",
            "25%,,50%",
            "+5%",
            "5.5%",
            "50%,100%,100%",
        ] {
            assert!(parse_ramp(bad).is_err(), "{bad:?}");
        }
    }
}
