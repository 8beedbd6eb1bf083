//! Entries for the journal in its native protocol
//! (systemd.io/JOURNAL_NATIVE_PROTOCOL), one datagram each to
//! `/run/systemd/journal/socket`, built by [`Layer`] on the logging thread
//! and sent by the log writer thread ([`Socket`]), so that a journald that
//! stops reading (its socket's queue full, where a send blocks) holds back
//! no task of the agent: lines are dropped and counted instead.
//!
//! The fields are those `tracing-journald` 0.3 wrote with no field prefix:
//! `MESSAGE`, `PRIORITY` (error 3, warn 4, info 5, debug 6, trace 7),
//! `TARGET`, `CODE_FILE`, `CODE_LINE`, `SYSLOG_IDENTIFIER`, and each event
//! field upper-cased (`consul_index` as `CONSUL_INDEX`). Spans are not
//! recorded (the agent opens none).

use std::fmt;
use std::io::{self, Write as _};
use std::os::unix::net::UnixDatagram;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_appender::non_blocking::NonBlocking;
use tracing_subscriber::layer::Context;

/// journald's socket for native entries.
const JOURNALD_PATH: &str = "/run/systemd/journal/socket";

/// The journal socket as a writer: each `write` is one entry, sent as one
/// datagram. Used only by the log writer thread, where a send may block.
pub struct Socket(UnixDatagram);

impl Socket {
    /// An unbound datagram socket, checked by sending an empty entry, which
    /// journald discards.
    ///
    /// # Errors
    ///
    /// No journal socket, or none listening.
    pub fn open() -> io::Result<Socket> {
        let socket = UnixDatagram::unbound()?;
        socket.send_to(&[], JOURNALD_PATH)?;
        Ok(Socket(socket))
    }
}

impl io::Write for Socket {
    fn write(&mut self, entry: &[u8]) -> io::Result<usize> {
        // An entry over the datagram limit (EMSGSIZE, about 200 KiB) is
        // lost; the agent's entries are a few hundred bytes.
        self.0.send_to(entry, JOURNALD_PATH)?;
        Ok(entry.len())
    }

    fn write_all(&mut self, entry: &[u8]) -> io::Result<()> {
        self.write(entry).map(|_| ())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A `tracing` layer that hands every event, as one journal entry, to a
/// lossy non-blocking writer.
pub struct Layer {
    identifier: String,
    writer: NonBlocking,
}

impl Layer {
    /// Entries with `SYSLOG_IDENTIFIER=identifier`, queued on `writer`.
    pub fn new(identifier: &str, writer: NonBlocking) -> Layer {
        Layer {
            identifier: identifier.to_string(),
            writer,
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut entry = Vec::with_capacity(256);
        let priority = match *meta.level() {
            Level::ERROR => b"3",
            Level::WARN => b"4",
            Level::INFO => b"5",
            Level::DEBUG => b"6",
            Level::TRACE => b"7",
        };
        put(&mut entry, "PRIORITY", priority);
        put(&mut entry, "TARGET", meta.target().as_bytes());
        if let Some(file) = meta.file() {
            put(&mut entry, "CODE_FILE", file.as_bytes());
        }
        if let Some(line) = meta.line() {
            put(&mut entry, "CODE_LINE", line.to_string().as_bytes());
        }
        put(&mut entry, "SYSLOG_IDENTIFIER", self.identifier.as_bytes());
        event.record(&mut Fields(&mut entry));
        // Lossy: a full queue drops the entry and counts it.
        let _ = self.writer.clone().write_all(&entry);
    }
}

/// Appends a field in the length-prefixed form, safe for any value: the
/// name, a newline, the value's length as 64-bit little-endian, the value,
/// a newline.
fn put(entry: &mut Vec<u8>, name: &str, value: &[u8]) {
    let start = entry.len();
    entry.extend(
        name.bytes()
            .map(|c| if c == b'.' { b'_' } else { c })
            .skip_while(|&c| c == b'_')
            .filter(|&c| c == b'_' || c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_uppercase()),
    );
    if entry.len() == start {
        return;
    }
    entry.push(b'\n');
    entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    entry.extend_from_slice(value);
    entry.push(b'\n');
}

/// An event's fields, `message` as `MESSAGE`.
struct Fields<'a>(&'a mut Vec<u8>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        put(self.0, field.name(), value.as_bytes());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        put(self.0, field.name(), format!("{value:?}").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_upper_cased_and_length_prefixed() {
        let mut entry = Vec::new();
        put(&mut entry, "consul.index", b"a\nb");
        put(&mut entry, "_x-y", b"1");
        put(&mut entry, "__", b"dropped: no name");
        let mut want = b"CONSUL_INDEX\n".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"a\nb\nXY\n");
        want.extend_from_slice(&1u64.to_le_bytes());
        want.extend_from_slice(b"1\n");
        assert_eq!(entry, want);
    }
}
