//! The `gitlab-haproxy-agent` binary: parse options, set up logging, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory as _, FromArgMatches as _};
use gitlab_haproxy_agent::agent::config::AgentConfig;
use gitlab_haproxy_agent::agent::state_copies;
use gitlab_haproxy_agent::cli::{Cli, Command, EX_USAGE};
use gitlab_haproxy_agent::consul::config::{Fallbacks, TOKEN_CREDENTIAL};
use gitlab_haproxy_agent::writer;

fn fallbacks() -> Fallbacks {
    let credential_token_file = std::env::var_os("CREDENTIALS_DIRECTORY")
        .map(|dir| PathBuf::from(dir).join(TOKEN_CREDENTIAL))
        .filter(|p| p.is_file());
    Fallbacks {
        consul_http_addr: std::env::var("CONSUL_HTTP_ADDR")
            .ok()
            .filter(|s| !s.is_empty()),
        credential_token_file,
        state_directory: std::env::var("STATE_DIRECTORY")
            .ok()
            .and_then(|v| v.split(':').next().map(str::to_string))
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        runtime_directory: std::env::var("RUNTIME_DIRECTORY")
            .ok()
            .and_then(|v| v.split(':').next().map(str::to_string))
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        consul_http_token_file: std::env::var_os("CONSUL_HTTP_TOKEN_FILE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        consul_http_token: std::env::var("CONSUL_HTTP_TOKEN")
            .ok()
            .filter(|s| !s.is_empty()),
        consul_http_ssl: std::env::var("CONSUL_HTTP_SSL").ok(),
        consul_cacert: std::env::var_os("CONSUL_CACERT").map(PathBuf::from),
        consul_client_cert: std::env::var_os("CONSUL_CLIENT_CERT").map(PathBuf::from),
        consul_client_key: std::env::var_os("CONSUL_CLIENT_KEY").map(PathBuf::from),
        consul_tls_server_name: std::env::var("CONSUL_TLS_SERVER_NAME").ok(),
        consul_http_ssl_verify: std::env::var("CONSUL_HTTP_SSL_VERIFY").ok(),
    }
}

/// clap's error summary on one line: the lines before "Usage:", joined
/// (e.g. "the following required arguments were not provided: <VALUE>").
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let summary: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let text = summary.join(" ");
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    if text.is_empty() {
        "invalid options".to_string()
    } else {
        text.to_string()
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("gitlab-haproxy-agent: {message}");
    ExitCode::from(EX_USAGE as u8)
}

/// For `state`: the Prometheus settings of the defaults file
/// (`/etc/default/gitlab-haproxy-agent`, or
/// `$GITLAB_HAPROXY_AGENT_DEFAULTS_FILE`) that the environment does not
/// set, as the options' defaults, so that flag > environment > file > none.
/// The environment is read, never changed.
fn writer_defaults() -> Vec<(String, String)> {
    if !std::env::args_os().skip(1).any(|a| a == "state") {
        return Vec::new();
    }
    let path = std::env::var_os("GITLAB_HAPROXY_AGENT_DEFAULTS_FILE").map_or_else(
        || PathBuf::from(gitlab_haproxy_agent::cli::defaults::DEFAULTS_FILE),
        PathBuf::from,
    );
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    gitlab_haproxy_agent::cli::defaults::from_defaults(&text, |n| std::env::var_os(n).is_some())
}

/// The options: the command line, the environment, then the defaults
/// file's values ([`writer_defaults`]).
fn parse() -> Result<Cli, clap::Error> {
    let mut cmd =
        gitlab_haproxy_agent::cli::defaults::with_file_defaults(Cli::command(), &writer_defaults());
    let mut matches = cmd.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

fn main() -> ExitCode {
    // Started by the agent as its state file's writer (argv[0] says so).
    let mut args = std::env::args_os();
    let arg0 = args.next().map(PathBuf::from);
    if arg0.as_deref().and_then(|p| p.file_name())
        == Some(std::ffi::OsStr::new(state_copies::STATE_WRITER_ARG0))
    {
        return match args.next() {
            Some(dir) => state_copies::writer_main(PathBuf::from(dir)),
            None => ExitCode::from(EX_USAGE as u8),
        };
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `state` or `state canary` alone: the help says what is missing.
            let _ = e.print();
            return ExitCode::from(EX_USAGE as u8);
        }
        Err(e) => {
            let message = format!("{} (see --help)", one_line(&e));
            // `state ... --json`: a JSON object on stdout, as for every
            // other writer failure.
            if std::env::args_os().any(|a| a == "--json") {
                return writer::usage_error(true, &message);
            }
            return usage_error(&message);
        }
    };
    match &cli.command {
        Some(Command::State(state)) => {
            return writer::main(&cli.consul, state, &fallbacks());
        }
        Some(Command::CheckReady(args)) => {
            return gitlab_haproxy_agent::check_ready::main(&cli.agent, args);
        }
        None => {}
    }
    let config = match AgentConfig::from_cli(&cli, &fallbacks()) {
        Ok(c) => c,
        Err(e) => return usage_error(&e.to_string()),
    };
    // Kept to the end of main: dropping it writes what is still queued.
    let _log =
        gitlab_haproxy_agent::agent::logging::init(config.log_format, config.log_buffer_lines);
    // A panic in any task or thread ends the process (systemd restarts it)
    // rather than leaving it half-alive, e.g. healthy with no responder.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gitlab-haproxy-agent: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(gitlab_haproxy_agent::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Through the log, so that it has the log's format (a JSON line
            // with --log-format json, an entry with fields in the journal).
            tracing::error!(error = format!("{e:#}"), "exiting on a fatal error");
            ExitCode::FAILURE
        }
    };
    // A blocking task still in flight (a file write on a stalled disk) must
    // not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
