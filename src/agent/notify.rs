//! systemd service notifications (sd_notify(3)): `READY=1` once the agent is
//! ready, `STATUS=` lines, `WATCHDOG=1` only while the watcher and responder
//! loops prove they are alive, `STOPPING=1` on shutdown. Nothing is sent when
//! `$NOTIFY_SOCKET` is unset.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::agent::shared::Shared;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!(error = %e, "sd_notify failed");
    }
}

/// Sends `READY=1` with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Sends a `STATUS=` line.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Sends `STOPPING=1`.
pub fn stopping(signal: &str) {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status(&format!("stopping on {signal}")),
    ]);
}

/// Pings the systemd watchdog every half `WatchdogSec=` while both loops
/// have beaten within that half; stops pinging (so systemd restarts the
/// agent) when either has not. Returns at once when the watchdog is off.
pub async fn watchdog(shared: Arc<Shared>, shutdown: CancellationToken) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let every = (period / 2).max(Duration::from_millis(100));
    // Loops beat every second; allow a few missed beats.
    let stale = every.max(Duration::from_secs(3));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let watcher = shared.watcher_heartbeat.age();
        let responder = shared.responder_heartbeat.age();
        if watcher <= stale && responder <= stale {
            send(&[NotifyState::Watchdog]);
        } else {
            warn!(
                watcher_silent_ms = watcher.as_millis() as u64,
                responder_silent_ms = responder.as_millis() as u64,
                "a loop stopped beating; withholding the watchdog ping"
            );
        }
    }
}
