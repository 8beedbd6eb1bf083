//! Log set-up: structured entries to journald when stderr is the journal,
//! human-readable text otherwise, JSON lines on request. `RUST_LOG` filters
//! (default `info`).

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

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

/// Installs the global subscriber. Falls back to text on stderr when the
/// journal socket cannot be opened.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match resolve(format) {
        LogFormat::Journald => match tracing_journald::layer() {
            Ok(layer) => {
                registry
                    .with(
                        layer
                            .with_syslog_identifier("gitlab-haproxy-agent".into())
                            // Fields as KEY, VALUE, CONSUL_INDEX, ERROR: none
                            // of ours clashes with a journal field.
                            .with_field_prefix(None),
                    )
                    .init();
            }
            Err(e) => {
                registry
                    .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                    .init();
                tracing::warn!(error = %e, "cannot open the journal; logging to stderr");
            }
        },
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Text | LogFormat::Auto => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .init(),
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
