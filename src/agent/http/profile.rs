//! On-demand CPU profiles on the HTTP port, as Go's `net/http/pprof` serves
//! them: `/debug/pprof/profile?seconds=N` answers a profile in the pprof
//! protobuf format (`go tool pprof` reads it), `/debug/pprof/flamegraph?
//! seconds=N` the same samples as an SVG flame graph.
//!
//! Sampling uses the `pprof` crate (tikv/pprof-rs): SIGPROF at
//! [`SAMPLE_HZ`], each sample unwound in the signal handler. Its maintainers
//! warn (tikv/pprof-rs#36) that libgcc's unwinder is not async-signal-safe,
//! so the profiler is never on by itself: it runs only on request, for a
//! bounded time ([`MAX_SECONDS`]), one profile at a time, and takes no sample
//! inside libgcc itself. Samples in libc, pthread and the vDSO are kept
//! (glibc's and the vDSO's unwind tables let the unwinder step out of them),
//! so the profile accounts for the system calls and the kernel time behind
//! them, where the responder spends most of its CPU. A static musl
//! build needs the `frame-pointer` feature and `-C force-frame-pointers=yes`
//! instead: libunwind cannot step through musl's signal trampoline, and
//! walking frame pointers from the interrupted context needs no unwinder at
//! all. The .deb and the container image both use the glibc build.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pprof::protos::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::answer::Answer;
use crate::agent::shared::Shared;

/// Samples per second: 99, as pprof-rs and Go's default of 100 (an odd
/// number so sampling does not beat with periodic work).
pub const SAMPLE_HZ: i32 = 99;

/// Profile length when `seconds` is not given: 30 s, as Go's pprof.
pub const DEFAULT_SECONDS: u64 = 30;

/// The longest profile: 60 s. Longer requests answer 400.
pub const MAX_SECONDS: u64 = 60;

/// Libraries in which a sample is not taken: libgcc, whose unwinder is not
/// reentrant (tikv/pprof-rs#36). pprof-rs drops a sample whose interrupted
/// instruction lies in a listed library, so libc, pthread and the vDSO are
/// not listed: the responder spends most of its time in system calls, and
/// a sample taken there (kernel time included) is where the time went.
const BLOCKLIST: &[&str] = &["libgcc"];

/// Set while a profile is being taken: SIGPROF and its timer are
/// process-wide, so there is one profiler.
static BUSY: AtomicBool = AtomicBool::new(false);

/// What a profile request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The pprof protobuf (`profile.proto`), `application/octet-stream`.
    Pprof,
    /// An SVG flame graph.
    Flamegraph,
}

impl Format {
    /// The format served at `path`, if it is a profile path.
    pub fn for_path(path: &str) -> Option<Format> {
        match path {
            "/debug/pprof/profile" => Some(Format::Pprof),
            "/debug/pprof/flamegraph" => Some(Format::Flamegraph),
            _ => None,
        }
    }
}

/// Reads `seconds=N` from a query string: an integer in `1..=MAX_SECONDS`,
/// [`DEFAULT_SECONDS`] when absent.
///
/// # Errors
///
/// A message for a value that is not such an integer.
pub fn parse_seconds(query: Option<&str>) -> Result<u64, String> {
    let value = query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == "seconds")
        .map(|(_, v)| v);
    let Some(value) = value else {
        return Ok(DEFAULT_SECONDS);
    };
    match value.parse::<u64>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(n),
        _ => Err(format!(
            "seconds must be an integer from 1 to {MAX_SECONDS}, not {value:?}"
        )),
    }
}

/// Checks that a file can be created in the temporary directory
/// (`$TMPDIR`, else `/tmp`), as pprof-rs needs.
///
/// # Errors
///
/// A message naming the directory and the system error.
pub fn temp_dir_usable() -> Result<(), String> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir();
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(
        ".gitlab-haproxy-agent-{}-{n}.tmp",
        std::process::id()
    ));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            Ok(())
        }
        Err(e) => Err(format!(
            "no file can be created in the temporary directory {} ({e}); \
             create it, make it writable or set TMPDIR, and ask again",
            dir.display()
        )),
    }
}

/// Releases [`BUSY`] when the profile ends, however it ends.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        BUSY.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        BUSY.store(false, Ordering::Release);
    }
}

/// Serves one profile request: 200 with the profile after `seconds`; 400 for
/// a bad `seconds`; 409 (with `Retry-After`) while another profile runs; 500
/// naming the cause if the profiler cannot start or report (a temporary
/// directory that is missing or read-only: the next request after it is
/// fixed succeeds); 503 if the agent shuts down meanwhile. Each
/// outcome is counted in `gitlab_haproxy_agent_profiles_total`.
pub async fn serve(
    format: Format,
    query: Option<&str>,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Answer {
    let count = |outcome: &str| {
        shared
            .metrics
            .http
            .profiles
            .with_label_values(&[outcome])
            .inc()
    };
    let seconds = match parse_seconds(query) {
        Ok(s) => s,
        Err(e) => {
            count("bad_request");
            return Answer::plain(400, format!("{e}\n"));
        }
    };
    let Some(slot) = Slot::take() else {
        count("busy");
        return Answer::plain(409, "a profile is already being taken; one at a time\n")
            .with_header("Retry-After", MAX_SECONDS.to_string());
    };
    // pprof-rs keeps its sample buffer in a temporary file and creates its
    // one profiler on first use; if that fails, it stays failed until the
    // process restarts. So the directory is checked first, and a request
    // made while it is unusable leaves the profiler untouched.
    if let Err(e) = temp_dir_usable() {
        count("failed");
        warn!(error = %e, "cannot start the CPU profiler");
        return Answer::plain(500, format!("cannot start the profiler: {e}\n"));
    }
    info!(seconds, ?format, "CPU profile started");
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(SAMPLE_HZ)
        .blocklist(BLOCKLIST)
        .build()
    {
        Ok(g) => g,
        Err(e) => {
            count("failed");
            warn!(error = %e, "cannot start the CPU profiler");
            let cause = match e {
                pprof::Error::Running => {
                    "the profiler did not stop after an earlier profile (its temporary \
                     directory went away meanwhile); restart the agent to profile again"
                        .to_string()
                }
                e => format!("{e}"),
            };
            return Answer::plain(500, format!("cannot start the profiler: {cause}\n"));
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        _ = shutdown.cancelled() => {
            drop(guard);
            count("failed");
            return Answer::plain(503, "shutting down\n");
        }
    }
    // Symbolising is CPU work of its own: off the async workers.
    let rendered = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let report = guard
            .report()
            .frames_post_processor(drop_profiler_frames)
            .build()
            .map_err(|e| e.to_string())?;
        drop(guard);
        render(&report, format)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match rendered {
        Ok((content_type, body)) => {
            count("ok");
            info!(seconds, bytes = body.len(), "CPU profile served");
            Answer::new(200, content_type, body)
        }
        Err(e) => {
            count("failed");
            warn!(error = %e, "CPU profile failed");
            Answer::plain(500, format!("profile failed: {e}\n"))
        }
    }
}

/// Drops the profiler's own frames (the unwinder called from the signal
/// handler) from the leaf end of a sample, so each sample's leaf is the
/// function that was interrupted. pprof-rs drops the handler and the
/// signal trampoline itself, but not the frames the handler called when they
/// are not inlined.
fn drop_profiler_frames(frames: &mut pprof::Frames) {
    let ours = frames
        .frames
        .iter()
        .take_while(|symbols| {
            symbols.iter().any(|s| {
                let name = s.name();
                ["backtrace::", "pprof::", "<pprof::", "<backtrace::"]
                    .iter()
                    .any(|p| name.starts_with(p))
            })
        })
        .count();
    frames.frames.drain(..ours);
}

/// The flame graph of a profile with no samples: an idle agent spends no
/// CPU time to sample.
const IDLE_SVG: &str = concat!(
    r#"<?xml version="1.0" standalone="no"?>"#,
    r#"<svg version="1.1" width="600" height="40" xmlns="http://www.w3.org/2000/svg">"#,
    r#"<text x="10" y="25" font-family="monospace">no CPU samples: the agent was idle</text></svg>"#,
    "\n"
);

fn render(report: &pprof::Report, format: Format) -> Result<(&'static str, Vec<u8>), String> {
    let mut body = Vec::new();
    match format {
        Format::Pprof => {
            let profile = report.pprof().map_err(|e| e.to_string())?;
            profile.encode(&mut body).map_err(|e| e.to_string())?;
            Ok(("application/octet-stream", body))
        }
        Format::Flamegraph => {
            if report.data.is_empty() {
                // inferno writes nothing for no stacks: say so instead.
                body.extend_from_slice(IDLE_SVG.as_bytes());
            } else {
                report.flamegraph(&mut body).map_err(|e| e.to_string())?;
            }
            Ok(("image/svg+xml", body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_to_30_and_are_bounded() {
        assert_eq!(parse_seconds(None), Ok(30));
        assert_eq!(parse_seconds(Some("")), Ok(30));
        assert_eq!(parse_seconds(Some("debug=1")), Ok(30));
        assert_eq!(parse_seconds(Some("seconds=1")), Ok(1));
        assert_eq!(parse_seconds(Some("x=y&seconds=60")), Ok(60));
        for bad in [
            "seconds=0",
            "seconds=61",
            "seconds=",
            "seconds",
            "seconds=1.5",
            "seconds=-1",
        ] {
            assert!(parse_seconds(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_profile_at_a_time() {
        let first = Slot::take().expect("free");
        assert!(Slot::take().is_none());
        drop(first);
        assert!(Slot::take().is_some());
    }
}
