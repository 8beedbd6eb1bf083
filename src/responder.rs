//! The agent-check responder: HAProxy connects every `agent-inter`, sends its
//! agent-send line, reads one reply line and closes (doc configuration.txt
//! "agent-check"). Every connection is bounded in count, bytes and time, and
//! answers come from the in-memory snapshot without waiting on Consul.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::shared::Shared;
use crate::state::{validate_identity, Answer, AnswerKind, InvalidIdentity};

/// Longest agent-send line accepted, LF included: 1 KiB. Real lines are a
/// row key and a few groups.
pub const MAX_LINE: usize = 1024;

/// Most identities accepted on one line.
pub const MAX_IDENTITIES: usize = 16;

/// Responder settings.
#[derive(Debug, Clone, Copy)]
pub struct ResponderConfig {
    /// Connections served at once; more are closed at once, unanswered.
    /// Default 1024.
    pub max_connections: usize,
    /// Time a client has to send its line. Default 500 ms, well under the
    /// 2 s agent-inter: a silent client cannot hold a slot.
    pub check_timeout: Duration,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        ResponderConfig {
            max_connections: 1024,
            check_timeout: Duration::from_millis(500),
        }
    }
}

/// Why an agent-send line was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadLine {
    /// No identities.
    #[error("empty agent-send line")]
    Empty,
    /// More than [`MAX_IDENTITIES`].
    #[error("more than {MAX_IDENTITIES} identities")]
    TooMany,
    /// An identity that is not a group or row key.
    #[error(transparent)]
    Identity(#[from] InvalidIdentity),
    /// Not UTF-8.
    #[error("agent-send line is not UTF-8")]
    NotUtf8,
}

/// Parses an agent-send line without its LF (a trailing CR is dropped):
/// identities separated by spaces or tabs, in order (row key first).
///
/// # Errors
///
/// [`BadLine`] for an empty line, too many identities, or an identity that
/// is not a valid group or row key.
pub fn parse_line(line: &[u8]) -> Result<Vec<&str>, BadLine> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| BadLine::NotUtf8)?;
    let mut ids = Vec::with_capacity(4);
    for id in text.split([' ', '\t']).filter(|s| !s.is_empty()) {
        if ids.len() == MAX_IDENTITIES {
            return Err(BadLine::TooMany);
        }
        validate_identity(id)?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Err(BadLine::Empty);
    }
    Ok(ids)
}

/// Serves agent-checks on `listener` until `shutdown` is cancelled; each
/// connection runs on `tracker` so shutdown can wait for answers in flight.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    config: ResponderConfig,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut accept_failures: u32 = 0;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                shared.responder_heartbeat.beat();
                continue;
            }
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                accept_failures = 0;
                stream
            }
            Err(e) => {
                shared.metrics.accept_errors.inc();
                if is_per_connection(&e) {
                    continue;
                }
                // Out of file descriptors or memory: back off and keep going;
                // connections already open finish and free what they hold.
                accept_failures = accept_failures.saturating_add(1);
                if accept_failures == 1 || accept_failures.is_power_of_two() {
                    warn!(error = %e, failures = accept_failures, "accept failed; backing off");
                }
                let pause = Duration::from_millis(10u64 << accept_failures.min(6));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            shared.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        let shared = shared.clone();
        tracker.spawn(async move {
            let started = Instant::now();
            shared.metrics.connections_in_flight.inc();
            handle(stream, &shared, config.check_timeout).await;
            shared.metrics.connections_in_flight.dec();
            shared
                .metrics
                .answer_duration
                .observe(started.elapsed().as_secs_f64());
            drop(permit);
        });
    }
}

/// Accept errors that concern one connection only (it was reset before we
/// took it): retry at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

async fn handle(mut stream: TcpStream, shared: &Shared, timeout: Duration) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; MAX_LINE];
    let line_len = match tokio::time::timeout(timeout, read_line(&mut stream, &mut buf)).await {
        Ok(Ok(Some(n))) => n,
        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
            shared.metrics.answers(AnswerKind::BadRequest).inc();
            return;
        }
    };
    let line = &buf[..line_len];
    let identities = match parse_line(line) {
        Ok(ids) => ids,
        Err(e) => {
            debug!(error = %e, "bad agent-send line");
            shared.metrics.answers(AnswerKind::BadRequest).inc();
            return;
        }
    };
    shared
        .metrics
        .last_check_timestamp
        .set(crate::metrics::unix_now());
    // parse_line accepted the line, so it is UTF-8.
    let row = std::str::from_utf8(line).unwrap_or_default().trim();
    let Some(snapshot) = shared.snapshot.load_full() else {
        shared.metrics.answers(AnswerKind::Unsynced).inc();
        shared.seen.record(row, AnswerKind::Unsynced, None);
        return;
    };
    let answer = snapshot.lookup(identities.iter().copied());
    let kind = answer.kind();
    shared.metrics.answers(kind).inc();
    match answer {
        Answer::Invalid { .. } => shared.seen.record(row, kind, None),
        Answer::State { state, .. } => {
            let reply = state.reply();
            let text = std::str::from_utf8(reply.as_bytes()).unwrap_or_default();
            shared.seen.record(row, kind, Some(text.trim_end()));
            let _ = tokio::time::timeout(timeout, async {
                stream.write_all(reply.as_bytes()).await?;
                stream.shutdown().await
            })
            .await;
        }
    }
}

/// Reads until the first LF. Returns the line length without the LF, or
/// `None` when the peer closed first or the line exceeds [`MAX_LINE`].
async fn read_line(stream: &mut TcpStream, buf: &mut [u8; MAX_LINE]) -> io::Result<Option<usize>> {
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Ok(None);
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(pos) = buf[filled..filled + n].iter().position(|&b| b == b'\n') {
            return Ok(Some(filled + pos));
        }
        filled += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_identities_in_order() {
        assert_eq!(
            parse_line(b"web/web-cny-01 canary"),
            Ok(vec!["web/web-cny-01", "canary"])
        );
        assert_eq!(
            parse_line(b"web/web-01\tcanary  zone:b\r"),
            Ok(vec!["web/web-01", "canary", "zone:b"])
        );
    }

    #[test]
    fn refuses_bad_lines() {
        assert_eq!(parse_line(b""), Err(BadLine::Empty));
        assert_eq!(parse_line(b" \t\r"), Err(BadLine::Empty));
        assert_eq!(parse_line(b"\xff\xfe"), Err(BadLine::NotUtf8));
        assert!(matches!(
            parse_line(b"web/web-01 $HOME"),
            Err(BadLine::Identity(_))
        ));
        assert!(matches!(parse_line(b"a/b/c"), Err(BadLine::Identity(_))));
        let many = vec!["g"; MAX_IDENTITIES + 1].join(" ");
        assert_eq!(parse_line(many.as_bytes()), Err(BadLine::TooMany));
    }
}
