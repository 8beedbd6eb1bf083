//! Log set-up: structured entries to journald when stderr is the journal,
//! human-readable text otherwise, JSON lines on request. `RUST_LOG` filters
//! (default `info`).
//!
//! No log line ever waits for its sink: every format hands its lines to a
//! writer thread through a bounded queue (`tracing-appender`'s lossy
//! non-blocking writer), and a line that finds the queue full is dropped
//! and counted ([`dropped_lines`]). A sink that stops reading (journald
//! stuck, stderr into a pipe nobody reads) therefore costs log lines, never
//! a change held back: the watcher, the responder and the HTTP port never
//! block on a write to stderr or to the journal socket.

mod journal;

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The writer's count of lines dropped, set once by [`init`].
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines dropped since the start because the sink was not reading
/// and the queue was full; 0 before [`init`].
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Keeps the log writer thread alive; dropping it (at exit) writes what is
/// queued, waiting at most about a second for a sink that does not read.
/// Hold it for the whole life of the process.
#[must_use = "the log writer stops when the guard is dropped"]
pub struct LogGuard {
    _worker: WorkerGuard,
}

/// True when `$JOURNAL_STREAM` (`<device>:<inode>`, set by systemd) names
/// the file stderr is connected to, i.e. stderr goes to the journal
/// (systemd.exec(5), "$JOURNAL_STREAM").
pub fn stderr_is_journal(journal_stream: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    let (Some(var), Some((dev, ino))) = (journal_stream, stderr) else {
        return false;
    };
    let Some((d, i)) = var.split_once(':') else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

fn stderr_dev_ino() -> Option<(u64, u64)> {
    let meta = std::fs::metadata("/proc/self/fd/2").ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The format `auto` resolves to for this process.
pub fn resolve(format: LogFormat) -> LogFormat {
    match format {
        LogFormat::Auto => {
            let var = std::env::var("JOURNAL_STREAM").ok();
            if stderr_is_journal(var.as_deref(), stderr_dev_ino()) {
                LogFormat::Journald
            } else {
                LogFormat::Text
            }
        }
        other => other,
    }
}

/// The queue between the log layers and the writer thread: lossy, holding
/// at most `lines` lines.
fn queue(lines: usize) -> NonBlockingBuilder {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines.max(1))
        .thread_name("log-writer")
}

/// Installs the global subscriber, its lines queued for at most
/// `buffer_lines` lines ([`crate::cli::DEFAULT_LOG_BUFFER_LINES`] by default). Falls back
/// to text on stderr when the journal socket cannot be opened.
pub fn init(format: LogFormat, buffer_lines: usize) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let mut journal_error = None;
    let format = match resolve(format) {
        LogFormat::Journald => match journal::Socket::open() {
            Ok(socket) => {
                let (writer, guard) = queue(buffer_lines).finish(socket);
                let _ = DROPPED.set(writer.error_counter());
                // Fields as KEY, VALUE, CONSUL_INDEX, ERROR: none of ours
                // clashes with a journal field.
                registry
                    .with(journal::Layer::new("gitlab-haproxy-agent", writer))
                    .init();
                return LogGuard { _worker: guard };
            }
            Err(e) => {
                journal_error = Some(e);
                LogFormat::Text
            }
        },
        other => other,
    };
    let (writer, guard) = queue(buffer_lines).finish(std::io::stderr());
    let _ = DROPPED.set(writer.error_counter());
    match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(writer),
            )
            .init(),
        _ => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(writer),
            )
            .init(),
    }
    if let Some(e) = journal_error {
        tracing::warn!(error = %e, "cannot open the journal; logging to stderr");
    }
    LogGuard { _worker: guard }
}

/// Follows [`dropped_lines`]: adds what was dropped to `counter` every
/// second and, once a second passes with no line dropped after some were,
/// says how many in one line (the sink is reading again, or the line is
/// dropped too and said at the next chance).
pub async fn report_dropped(
    counter: prometheus::IntCounter,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let (mut seen, mut unsaid) = (dropped_lines(), 0u64);
    counter.inc_by(seen);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = dropped_lines();
        let new = now.saturating_sub(seen);
        seen = now;
        counter.inc_by(new);
        unsaid += new;
        if new == 0 && unsaid > 0 {
            tracing::warn!(
                dropped = unsaid,
                "{unsaid} log lines were dropped while the log sink was not reading"
            );
            // Said, unless this line was dropped too: then it is counted at
            // the next tick and the whole count said once the sink reads.
            if dropped_lines() == now {
                unsaid = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_only_when_device_and_inode_match() {
        assert!(stderr_is_journal(Some("8:12345"), Some((8, 12345))));
        assert!(!stderr_is_journal(Some("8:12345"), Some((8, 12346))));
        assert!(!stderr_is_journal(Some("9:12345"), Some((8, 12345))));
        assert!(!stderr_is_journal(None, Some((8, 12345))));
        assert!(!stderr_is_journal(Some("garbage"), Some((8, 12345))));
        assert!(!stderr_is_journal(Some("8:12345"), None));
    }
}
