//! The daemon, on the decision core, the model and the Consul client: the
//! [`watcher`] performs the Consul requests the core
//! ([`crate::decision`]) asks for, keeps the served state in the
//! [`state_file`], and swaps in a new
//! [`Snapshot`](crate::model::snapshot::Snapshot) per change; the
//! [`responder`] answers each agent-send line from it; [`http`] serves
//! metrics, health, readiness and status; [`shared`] is what they share.
//! [`run`] wires them together with one shutdown path.

pub mod config;
pub mod finder;
pub mod http;
pub mod log_summary;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod old_workers;
pub mod records;
pub mod responder;
pub use gitlab_haproxy_agent_core::{discovery, route};
pub mod seen;
pub mod shared;
pub mod state_copies;
pub mod state_file;
pub mod watcher;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::cli::OnStartupTimeout;
use crate::consul::{ConsulClient, ConsulError, TokenSource};
use config::AgentConfig;
use shared::{ReadyStep, Shared};
use watcher::Watcher;

/// How long shutdown waits for answers and HTTP requests in flight: 5 s.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the daemon until SIGTERM or SIGINT.
///
/// Binds both listeners (connections before the first sync get no answer),
/// then reads the prefix once, retrying for `startup_timeout` (then exits or,
/// with `--on-startup-timeout retry`, stays up unready and keeps retrying);
/// then holds the blocking query and serves until a signal, then stops accepting and waits
/// up to [`SHUTDOWN_GRACE`] for work in flight. SIGHUP re-reads the token.
///
/// # Errors
///
/// A listener that cannot be bound, or no Consul snapshot within
/// `startup_timeout` with `--on-startup-timeout exit` (the message names the
/// Consul address and the error).
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let shared = Shared::new(&config.consul.addr, &config.consul.prefix);
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();

    let agent_listener = responder::bind(config.listen)
        .with_context(|| format!("cannot bind the agent-check listener on {}", config.listen))?;
    let http_listener = TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot bind the HTTP listener on {}", config.http_listen))?;
    info!(
        listen = %agent_listener.local_addr()?,
        http_listen = %http_listener.local_addr()?,
        consul_addr = %config.consul.addr,
        consul_fallback_addrs = %match (&config.watcher.discovery, config.consul_fallbacks.is_empty()) {
            (Some(_), _) => "found from Consul".to_string(),
            (None, true) => "none".to_string(),
            (None, false) => config.consul_fallbacks.join(","),
        },
        prefix = %config.consul.prefix,
        version = env!("CARGO_PKG_VERSION"),
        "starting; no answers until the state file or the first Consul answer"
    );

    responder::serve(
        agent_listener,
        shared.clone(),
        config.responder,
        shutdown.clone(),
        tracker.clone(),
    )
    .context("cannot start the agent-check responder")?;
    shared.readiness.set(ReadyStep::ResponderBound);
    tracker.spawn(http::serve(
        http_listener,
        config.http_debug,
        shared.clone(),
        shutdown.clone(),
        tracker.clone(),
    ));
    shared.readiness.set(ReadyStep::HttpBound);

    // Every Consul address, listed or found, gets the same settings.
    let token_file = config.consul.token_file.clone();
    let tls = config.consul.loaded_tls.clone();
    let make: finder::ClientFactory = Arc::new(move |addr: &str| {
        ConsulClient::new(
            addr,
            TokenSource::new(token_file.clone()),
            Duration::from_secs(2),
            &tls,
        )
    });
    let clients = std::iter::once(&config.consul.addr)
        .chain(&config.consul_fallbacks)
        .map(|addr| {
            make(addr)
                .map(Arc::new)
                .context("cannot build the Consul client")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    shared.records.set_client(clients[0].clone());
    tracker.spawn(old_workers::watch(
        config.haproxy_pid_file.clone(),
        shared.metrics.haproxy_old_workers.clone(),
        shutdown.clone(),
    ));
    tracker.spawn(logging::report_dropped(
        shared.metrics.log_lines_dropped.clone(),
        shutdown.clone(),
    ));
    let opened = open_state_file(&config, &shared);
    let copies = (opened.disk.is_some() || opened.runtime.is_some()).then(|| {
        state_copies::Copies::start(
            &config.consul.prefix,
            opened.runtime.clone(),
            opened.disk.clone(),
            (opened.serial, opened.disk_serial),
            &shared,
        )
    });
    if let (Some(copies), Some(state), true) = (&copies, &opened.restored, opened.catch_up) {
        copies.catch_up(state, opened.serial);
    }
    let mut watcher = Watcher::new(
        clients.clone(),
        config.watcher.clone(),
        shared.clone(),
        copies.clone(),
        opened.restored,
        make,
    );
    let serving = shared.snapshot.load().is_some();
    if serving {
        // Answering already, from the state file: to systemd the agent is
        // up (a HAProxy reload is as safe now as during a Consul outage),
        // while /-/ready waits for Consul.
        notify::ready("answering from the state file; Consul not read yet");
    }

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;

    // The watchdog runs from the start: systemd arms it when the unit starts,
    // and the first sync can take up to `startup_timeout`.
    tracker.spawn(notify::watchdog(shared.clone(), shutdown.clone()));

    let first = tokio::select! {
        r = watcher.first_sync(config.startup_timeout) => r,
        _ = sigterm.recv() => return stop(shutdown, tracker, copies.as_deref(), "SIGTERM").await,
        _ = sigint.recv() => return stop(shutdown, tracker, copies.as_deref(), "SIGINT").await,
    };
    match first {
        Ok(()) => {
            shared.readiness.wait().await;
            announce_ready(&shared);
        }
        Err(e) if config.on_startup_timeout == OnStartupTimeout::Retry || serving => {
            keep_retrying_unready(
                &shared,
                config.startup_timeout,
                &e,
                serving,
                &shutdown,
                &tracker,
            );
        }
        Err(e) => {
            shutdown.cancel();
            return Err(anyhow::anyhow!(
                "no Consul snapshot within {}: {e}",
                humantime::format_duration(config.startup_timeout)
            ));
        }
    }

    tracker.spawn(watcher.run(shutdown.clone()));

    loop {
        tokio::select! {
            _ = sigterm.recv() => return stop(shutdown, tracker, copies.as_deref(), "SIGTERM").await,
            _ = sigint.recv() => return stop(shutdown, tracker, copies.as_deref(), "SIGINT").await,
            _ = sighup.recv() => {
                info!("SIGHUP: the Consul token file will be read again");
                for client in &clients {
                    client.token().invalidate();
                }
            }
        }
    }
}

/// The copies of the served state found at start.
struct Opened {
    /// The state file, when there is a state folder.
    disk: Option<state_file::StateFile>,
    /// The runtime copy, when there is a runtime folder.
    runtime: Option<state_file::StateFile>,
    /// The state to serve at once, from the copy with the higher serial.
    restored: Option<crate::decision::served::ServedState>,
    /// The higher serial of the two copies.
    serial: u64,
    /// The serial of the state file (0: none, or from before serials).
    disk_serial: u64,
    /// The runtime copy was newer than the state file: the file is written
    /// from it as soon as its disk takes it.
    catch_up: bool,
}

/// Reads the state file and its runtime copy at start-up, without writing
/// to the state folder (reads work on a frozen file system, writes wait):
/// the state to serve at once, or why there is none (logged, counted and
/// shown on `/status`).
fn open_state_file(config: &AgentConfig, shared: &Shared) -> Opened {
    let prefix = &config.consul.prefix;
    let mut status = shared.state_file.lock().unwrap();
    let runtime = config.runtime_dir.as_ref().and_then(|dir| {
        if !dir.is_dir() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                warn!(path = %dir.display(), error = %e, "cannot create the runtime folder; no runtime copy of the state served");
                return None;
            }
        }
        Some(state_file::StateFile::in_dir(dir))
    });
    status.runtime_copy = runtime.as_ref().map(|f| f.path().display().to_string());
    let from_runtime = runtime.as_ref().and_then(|file| match file.load(prefix) {
        state_file::Loaded::State(state, serial) => Some((state, serial)),
        state_file::Loaded::Missing => None,
        state_file::Loaded::Unusable(e) => {
            warn!(path = %file.path().display(), error = %e, "runtime copy of the state file unusable; not used");
            None
        }
    });
    let Some(dir) = &config.state_dir else {
        if runtime.is_some() {
            warn!("no --state-dir and no $STATE_DIRECTORY: held keys survive a restart (in the runtime copy) but not a reboot");
        } else {
            warn!("no --state-dir and no $STATE_DIRECTORY: held keys will not survive a restart");
        }
        status.load_error = Some("no state folder".into());
        let serial = from_runtime.as_ref().map_or(0, |(_, s)| *s);
        if let Some((state, _)) = &from_runtime {
            status.loaded_runtime_copy = true;
            info!(
                keys = state.keys.len(),
                consul_index = state.index,
                "runtime copy read: answering from it until Consul answers"
            );
            status.loaded = true;
            shared.metrics.state_file_loaded.set(1);
        }
        return Opened {
            disk: None,
            runtime,
            restored: from_runtime.map(|(state, _)| state),
            serial,
            disk_serial: 0,
            catch_up: false,
        };
    };
    // systemd's StateDirectory= and the pod's emptyDir exist already; a
    // folder named by hand may not yet. One that cannot be made is named
    // here, and every write retried until it can be. An existing folder is
    // not touched: mkdir waits on a frozen file system.
    if !dir.is_dir() {
        if let Err(e) = std::fs::create_dir_all(dir) {
            warn!(path = %dir.display(), error = %e, "cannot create the state folder; the state file cannot be written until it exists");
        }
    }
    let file = state_file::StateFile::in_dir(dir);
    status.path = Some(file.path().display().to_string());
    let from_disk = match file.load(prefix) {
        state_file::Loaded::State(state, serial) => Some((state, serial)),
        state_file::Loaded::Missing => {
            if from_runtime.is_none() {
                info!(path = %file.path().display(), "no state file yet (first start): answering nobody until Consul answers");
            }
            status.load_error = Some("missing".into());
            None
        }
        state_file::Loaded::Unusable(e) => {
            // Kept aside for a post-mortem: the first write replaces the
            // file. Renamed in the background: a rename waits on a frozen
            // file system.
            let (from, aside) = (
                file.path().to_path_buf(),
                file.path().with_extension("json.unusable"),
            );
            warn!(path = %from.display(), error = %e, copy = %aside.display(), "state file unusable: kept aside; starting with no memory of held keys unless the runtime copy has them");
            std::thread::spawn(move || std::fs::rename(from, aside));
            status.load_error = Some(e);
            None
        }
    };
    let disk_serial = from_disk.as_ref().map(|(_, s)| *s);
    let runtime_newer = matches!((&from_runtime, disk_serial), (Some((_, r)), Some(d)) if *r > d)
        || (from_runtime.is_some() && from_disk.is_none());
    let (restored, serial) = if runtime_newer {
        let (state, serial) = from_runtime.expect("a runtime copy");
        warn!(
            path = %file.path().display(),
            serial,
            state_file_serial = disk_serial.unwrap_or(0),
            keys = state.keys.len(),
            consul_index = state.index,
            "the runtime copy is newer than the state file (its disk lagged before this start): answering from the runtime copy until Consul answers; the state file is written from it as soon as its disk takes it"
        );
        status.loaded_runtime_copy = true;
        (Some(state), serial)
    } else if let Some((state, serial)) = from_disk {
        info!(path = %file.path().display(), keys = state.keys.len(), consul_index = state.index, serial, "state file read: answering from it until Consul answers");
        (Some(state), serial)
    } else {
        (None, 0)
    };
    if restored.is_some() {
        status.loaded = true;
        status.load_error = None;
        shared.metrics.state_file_loaded.set(1);
    }
    Opened {
        disk: Some(file),
        runtime,
        restored,
        serial,
        disk_serial: disk_serial.unwrap_or(0),
        catch_up: runtime_newer,
    }
}

/// Sends `READY=1` with the snapshot's size and index.
fn announce_ready(shared: &Shared) {
    let snapshot = shared.snapshot.load_full();
    let keys = snapshot.as_ref().map_or(0, |s| s.keys.len());
    let index = snapshot.as_ref().map_or(0, |s| s.index);
    notify::ready(&format!("synced, {keys} keys, index {index}"));
}

/// `--on-startup-timeout retry`, or a state file being served: logs that
/// the agent stays up unready (the
/// watcher loop, started next, keeps retrying with its backoff and sets
/// readiness at its first snapshot) and announces readiness when it comes.
fn keep_retrying_unready(
    shared: &Arc<Shared>,
    startup_timeout: Duration,
    error: &ConsulError,
    serving: bool,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) {
    let answers = if serving {
        "answering from the state file"
    } else {
        "answering nobody"
    };
    warn!(
        error = %error,
        startup_timeout = %humantime::format_duration(startup_timeout),
        "no Consul answer yet; staying up, not ready and {answers}, retrying"
    );
    notify::status("not synced yet: retrying Consul");
    let shared = shared.clone();
    let shutdown = shutdown.clone();
    tracker.spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = shared.readiness.wait() => {
                info!("first Consul snapshot applied; ready");
                announce_ready(&shared);
            }
        }
    });
}

/// How long shutdown waits for the state file to hold the state served
/// (its disk may be stalled; the runtime copy holds it anyway): 2 s.
pub const FINAL_FLUSH: Duration = Duration::from_secs(2);

async fn stop(
    shutdown: CancellationToken,
    tracker: TaskTracker,
    copies: Option<&state_copies::Copies>,
    signal: &str,
) -> anyhow::Result<()> {
    info!(
        signal,
        "shutting down: no new connections, finishing answers in flight"
    );
    notify::stopping(signal);
    shutdown.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        warn!("work still in flight after {SHUTDOWN_GRACE:?}; exiting anyway");
    }
    if let Some(copies) = copies {
        if !copies.flush(FINAL_FLUSH).await {
            warn!(
                behind_seconds = copies.behind_for().map_or(0.0, |d| d.as_secs_f64()),
                "the state file does not hold the state served after {FINAL_FLUSH:?} (its disk stalled or failing); exiting anyway: the next start reads the newer runtime copy if there is one"
            );
        }
    }
    info!("stopped");
    Ok(())
}
