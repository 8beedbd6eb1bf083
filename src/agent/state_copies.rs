//! Keeping the copies of the served state ([`crate::agent::state_file`])
//! without ever holding a change back.
//!
//! Each new state gets the next serial ([`Copies::before_serving`]): the
//! higher of the last one plus 1 and the wall clock in microseconds since
//! the Unix epoch, so that serials grow across agent lifetimes, not only
//! within one (see [`clock_micros`] for what the clock is trusted for).
//! The runtime copy (`--runtime-dir`,
//! a tmpfs) is written before the state is served, bounded by
//! [`RUNTIME_COPY_TIMEOUT`]; then the state is served; then it is handed to
//! the state file's writer, which writes the newest state it was handed
//! (older ones it had not started are skipped) and retries a failed write
//! every [`STATE_FILE_RETRY`] or at the next change. A disk that stalls
//! (frozen, a dying device) delays only the state file: the watcher, the
//! responder, the HTTP port and the watchdog go on, and
//! `gitlab_haproxy_agent_state_file_behind_seconds` counts how long the file
//! has lagged the state served.
//!
//! The state file is written by a child process (this binary, started as
//! [`STATE_WRITER_ARG0`], reading frames on its standard input): a process
//! blocked in a write to a frozen file system cannot exit until the file
//! system thaws (the wait is uninterruptible), and if that were a thread of
//! the agent it would keep the agent's listening ports bound, so an agent
//! restarted during the stall could not bind them. The child holds no port;
//! the agent exits at once whatever the child is waiting for.

use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::agent::shared::Shared;
use crate::agent::state_file::{file_text, renumbered, Saved, StateFile};
use crate::decision::served::ServedState;

/// `argv[0]` of the state file's writer process.
pub const STATE_WRITER_ARG0: &str = "gitlab-haproxy-agent-state-writer";

/// Longest wait for the runtime copy before a new state is served anyway:
/// 1 s (a tmpfs answers in microseconds; a failure is counted and logged).
pub const RUNTIME_COPY_TIMEOUT: Duration = Duration::from_secs(1);

/// A state-file write that failed is retried this often, or at the next
/// change, until it succeeds: 5 s.
pub const STATE_FILE_RETRY: Duration = Duration::from_secs(5);

/// The wall clock in microseconds since the Unix epoch (0 before 1970):
/// the floor of every serial handed out.
///
/// Trusted only to have moved forward between two agent lifetimes on one
/// node, so that an agent that could not read its state folder at start (a
/// file at its path, an I/O error) still numbers its states above any state
/// file a previous agent left there, and writes over it once the folder is
/// back (the file's serial is otherwise taken for newer:
/// [`Saved::AlreadyNewer`]). Within one agent the serials grow by at least
/// 1 whatever the clock does; a clock stepped back between two lifetimes is
/// still bounded by the serials read at start ([`Copies::start`]) when the
/// copies are readable. About 1.8e15 today: exact in JSON readers that use
/// doubles (up to 2^53, the year 2255).
pub fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A state serialised for its copies: its serial and the file's text.
#[derive(Clone)]
pub struct Job {
    serial: u64,
    text: Arc<Vec<u8>>,
}

/// The runtime copy and the state file of one agent.
pub struct Copies {
    prefix: String,
    /// The last serial handed out.
    serial: AtomicU64,
    /// The serial before the first one this agent gave: a job at or below
    /// it is a state read at start ([`Copies::catch_up`]).
    first_below: u64,
    runtime: Option<(StateFile, Arc<Mutex<()>>)>,
    disk: Option<Disk>,
}

struct Disk {
    file: StateFile,
    /// The newest job handed to the writer.
    pending: watch::Sender<Option<Job>>,
    /// The serial the file holds.
    written: watch::Sender<u64>,
    /// Since when the file has not held the state served.
    behind_since: Mutex<Option<Instant>>,
}

impl Copies {
    /// The copies of `prefix`'s state: in `runtime` and in `disk` (either
    /// may be absent), serials above `serial` (the higher of the two read
    /// at start) and above [`clock_micros`] now, the state file holding
    /// `disk_serial`. The state file's writer runs as a task from here on.
    pub fn start(
        prefix: &str,
        runtime: Option<StateFile>,
        disk: Option<StateFile>,
        (serial, disk_serial): (u64, u64),
        shared: &Arc<Shared>,
    ) -> Arc<Copies> {
        let base = serial.max(clock_micros());
        let copies = Arc::new(Copies {
            prefix: prefix.to_string(),
            serial: AtomicU64::new(base),
            first_below: base,
            runtime: runtime.map(|f| (f, Arc::new(Mutex::new(())))),
            disk: disk.map(|file| Disk {
                file,
                pending: watch::channel(None).0,
                written: watch::channel(disk_serial).0,
                behind_since: Mutex::new(None),
            }),
        });
        if copies.disk.is_some() {
            tokio::spawn(Arc::clone(&copies).write_disk(Arc::clone(shared)));
        }
        copies
    }

    /// Writes the runtime copy of `state` under a new serial (the higher of
    /// the last one plus 1 and [`clock_micros`]; bounded by
    /// [`RUNTIME_COPY_TIMEOUT`]; a failure is counted and logged, and the
    /// state is served all the same), and returns the job for
    /// [`Copies::to_disk`], to be handed over once the state is served.
    pub async fn before_serving(&self, shared: &Shared, state: &ServedState) -> Job {
        let serial = self.next_serial();
        let job = Job {
            serial,
            text: Arc::new(file_text(&self.prefix, state, serial)),
        };
        if let Some((file, lock)) = &self.runtime {
            let (file, lock, text) = (file.clone(), Arc::clone(lock), Arc::clone(&job.text));
            let path = file.path().display().to_string();
            let write = tokio::task::spawn_blocking(move || {
                let _one_at_a_time = lock.lock().unwrap_or_else(|e| e.into_inner());
                file.save(&text, serial)
            });
            let error = match tokio::time::timeout(RUNTIME_COPY_TIMEOUT, write).await {
                Ok(Ok(Ok(_))) => None,
                Ok(Ok(Err(e))) => Some(e.to_string()),
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("not written within {RUNTIME_COPY_TIMEOUT:?}")),
            };
            let result = if error.is_some() { "error" } else { "ok" };
            shared
                .metrics
                .runtime_copy_writes
                .with_label_values(&[result])
                .inc();
            if let Some(e) = error {
                warn!(path, error = %e, "cannot write the runtime copy of the state served; serving the new state all the same (a restart while the state file lags would start from an older state)");
            }
        }
        job
    }

    /// A new serial: the higher of the last one plus 1 and
    /// [`clock_micros`].
    fn next_serial(&self) -> u64 {
        let now = clock_micros();
        let next = |last: u64| last.saturating_add(1).max(now);
        let last = self
            .serial
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(next(last))
            })
            .unwrap_or_else(|last| last);
        next(last)
    }

    /// After the state file was found holding `on_disk`, a serial above
    /// any this agent gave (an earlier agent's, whose clock ran ahead):
    /// serials from now on are above it, and the newest state handed to
    /// the writer is renumbered so, unless a newer one came meanwhile
    /// (numbered above it already).
    fn renumber_above(&self, on_disk: u64) {
        let Some(disk) = &self.disk else { return };
        self.serial.fetch_max(on_disk, Ordering::Relaxed);
        let Some(old) = disk.pending.borrow().as_ref().map(|j| j.serial) else {
            return;
        };
        if old > on_disk {
            return;
        }
        let serial = self.next_serial();
        disk.pending.send_if_modified(|pending| match pending {
            Some(job) if job.serial == old => {
                *job = Job {
                    serial,
                    text: Arc::new(renumbered(&job.text, serial)),
                };
                true
            }
            _ => false,
        });
    }

    /// Hands `job` to the state file's writer, which writes it unless a
    /// newer one comes first. Never waits.
    pub fn to_disk(&self, job: Job) {
        let Some(disk) = &self.disk else { return };
        disk.behind_since
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        disk.pending.send_replace(Some(job));
    }

    /// Hands the state served at start, read from the runtime copy as
    /// number `serial` because the state file held an older one (its disk
    /// lagged before the restart), to the state file's writer.
    pub fn catch_up(&self, state: &ServedState, serial: u64) {
        self.to_disk(Job {
            serial,
            text: Arc::new(file_text(&self.prefix, state, serial)),
        });
    }

    /// How long the state file has not held the state served; `None` when
    /// it holds it (or there is none).
    pub fn behind_for(&self) -> Option<Duration> {
        let disk = self.disk.as_ref()?;
        disk.behind_since.lock().unwrap().map(|t| t.elapsed())
    }

    /// Exports [`Copies::behind_for`] to the state-file gauges.
    pub fn export(&self, shared: &Shared) {
        let behind = self.behind_for();
        let metrics = &shared.metrics;
        metrics.state_file_behind.set(i64::from(behind.is_some()));
        metrics
            .state_file_behind_seconds
            .set(behind.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Waits at most `limit` for the state file to hold the newest state
    /// handed to it; true when it does.
    pub async fn flush(&self, limit: Duration) -> bool {
        let Some(disk) = &self.disk else { return true };
        let want = disk.pending.borrow().as_ref().map_or(0, |j| j.serial);
        let mut written = disk.written.subscribe();
        tokio::time::timeout(limit, written.wait_for(|w| *w >= want))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The state file's writer: writes the newest job, through the writer
    /// process, until the agent exits.
    async fn write_disk(self: Arc<Self>, shared: Arc<Shared>) {
        let Some(disk) = &self.disk else { return };
        let mut pending = disk.pending.subscribe();
        let mut child: Option<WriterChild> = None;
        let mut failing = false;
        let mut newer_in_a_row = 0u32;
        loop {
            let job = loop {
                let newest = pending.borrow_and_update().clone();
                if let Some(job) = newest.filter(|j| j.serial > *disk.written.borrow()) {
                    break job;
                }
                if pending.changed().await.is_err() {
                    return;
                }
            };
            let result = match &mut child {
                Some(c) => c.write(&job).await,
                None => match WriterChild::spawn(disk.file.path()) {
                    Ok(c) => child.insert(c).write(&job).await,
                    Err(e) => Err(format!("cannot start the state file's writer: {e}")),
                },
            };
            let metrics = &shared.metrics;
            // A state read at start, found older than the file (the
            // previous agent's writer finished a newer one since): the file
            // holds a newer state than this job, as it should.
            let result = match result {
                Ok(Reply::Newer(_)) if job.serial <= self.first_below => Ok(Reply::Written),
                other => other,
            };
            if !matches!(result, Ok(Reply::Newer(_))) {
                newer_in_a_row = 0;
            }
            match result {
                Ok(Reply::Newer(on_disk)) => {
                    warn!(path = %disk.file.path().display(), serial = job.serial, state_file_serial = on_disk, "the state file holds a higher serial than this agent ever gave: written by an earlier agent whose clock ran ahead of this one's; writing the state served again above it");
                    self.renumber_above(on_disk);
                    newer_in_a_row += 1;
                    if newer_in_a_row > 1 {
                        tokio::select! {
                            _ = tokio::time::sleep(STATE_FILE_RETRY) => {}
                            _ = pending.changed() => {}
                        }
                    }
                }
                Ok(Reply::Written) => {
                    metrics.state_file_writes.with_label_values(&["ok"]).inc();
                    disk.written.send_replace(job.serial);
                    let newest = disk.pending.borrow().as_ref().map_or(0, |j| j.serial);
                    if newest <= job.serial {
                        *disk.behind_since.lock().unwrap() = None;
                    }
                    shared.state_file.lock().unwrap().write_error = None;
                    if std::mem::take(&mut failing) {
                        info!(path = %disk.file.path().display(), "state file written again: it holds the state served");
                    }
                }
                Err(e) => {
                    metrics
                        .state_file_writes
                        .with_label_values(&["error"])
                        .inc();
                    if !failing {
                        warn!(error = %e, path = %disk.file.path().display(), "cannot write the state file; retrying every 5 s and at each change. Until it is written, a restart would start from an older state, unless the runtime copy is newer");
                    }
                    failing = true;
                    if child.as_ref().is_some_and(|c| c.broken) {
                        child = None;
                    }
                    shared.state_file.lock().unwrap().write_error = Some(e);
                    tokio::select! {
                        _ = tokio::time::sleep(STATE_FILE_RETRY) => {}
                        _ = pending.changed() => {}
                    }
                }
            }
            self.export(&shared);
        }
    }
}

/// What the writer process did with a job.
enum Reply {
    /// The file holds the job's state (written now, or before under the
    /// same serial by a writer whose reply was lost).
    Written,
    /// The file holds a higher serial than the job's, left as it was. For
    /// a job numbered by this agent, not a serial of this agent's (its
    /// writers only ever hold serials up to the newest job's) but one from
    /// an earlier agent whose clock ran ahead.
    Newer(u64),
}

/// The state file's writer process and its pipes.
struct WriterChild {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its pipes failed: a new one is started for the next write.
    broken: bool,
}

impl WriterChild {
    fn spawn(path: &Path) -> std::io::Result<WriterChild> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut child = tokio::process::Command::new("/proc/self/exe")
            .arg0(STATE_WRITER_ARG0)
            .arg(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(false)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("no pipes to the writer"));
        };
        Ok(WriterChild {
            _child: child,
            stdin,
            stdout: BufReader::new(stdout),
            broken: false,
        })
    }

    /// Sends `job` and waits, however long the disk takes, for the reply.
    async fn write(&mut self, job: &Job) -> Result<Reply, String> {
        let result = async {
            let head = format!("{} {}\n", job.serial, job.text.len());
            self.stdin.write_all(head.as_bytes()).await?;
            self.stdin.write_all(&job.text).await?;
            self.stdin.flush().await?;
            let mut reply = String::new();
            if self.stdout.read_line(&mut reply).await? == 0 {
                return Err(std::io::Error::other("the state file's writer exited"));
            }
            Ok(reply)
        }
        .await;
        match result {
            Ok(reply) if reply.trim_end() == "ok" => Ok(Reply::Written),
            Ok(reply) if reply.starts_with("newer ") => {
                match reply["newer ".len()..].trim_end().parse() {
                    Ok(on_disk) => Ok(Reply::Newer(on_disk)),
                    Err(_) => Err(format!(
                        "unexpected reply from the state file's writer: {reply:?}"
                    )),
                }
            }
            Ok(reply) => Err(reply
                .trim_end()
                .strip_prefix("error ")
                .unwrap_or(reply.trim_end())
                .to_string()),
            Err(e) => {
                self.broken = true;
                Err(e.to_string())
            }
        }
    }
}

/// The state file's writer process ([`STATE_WRITER_ARG0`]): for each frame
/// on standard input (`<serial> <length>\n` and the file's text) writes
/// the file in `dir` ([`StateFile::save`]) and answers on a line `ok` (the
/// file holds this serial), `newer <serial>` (it holds a higher one, left
/// as it was) or `error <why>`; exits 0 at the end of its input.
pub fn writer_main(dir: PathBuf) -> std::process::ExitCode {
    let file = StateFile::in_dir(&dir);
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    loop {
        let mut head = String::new();
        match input.read_line(&mut head) {
            Ok(0) => return std::process::ExitCode::SUCCESS,
            Ok(_) => {}
            Err(_) => return std::process::ExitCode::FAILURE,
        }
        let mut words = head.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(serial)), Some(Ok(len))) = (words.next(), words.next()) else {
            return std::process::ExitCode::FAILURE;
        };
        let mut text = vec![0; usize::try_from(len).unwrap_or(0)];
        if input.read_exact(&mut text).is_err() {
            return std::process::ExitCode::FAILURE;
        }
        let reply = match file.save(&text, serial) {
            Ok(Saved::Written) => "ok".to_string(),
            Ok(Saved::AlreadyNewer(on_disk)) if on_disk == serial => "ok".to_string(),
            Ok(Saved::AlreadyNewer(on_disk)) => format!("newer {on_disk}"),
            Err(e) => format!("error {e}"),
        };
        if writeln!(output, "{reply}")
            .and_then(|()| output.flush())
            .is_err()
        {
            return std::process::ExitCode::FAILURE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_grow_and_start_above_the_clock_and_the_serials_read() {
        let shared = Shared::new("http://127.0.0.1:8500", "p/");
        let before = clock_micros();
        // Serials read at start that count from 1 (an earlier agent, or a
        // file from before the clock): the clock is above them.
        let copies = Copies::start("p/", None, None, (7, 7), &shared);
        let first = copies.next_serial();
        assert!(first > before, "{first} <= {before}");
        let second = copies.next_serial();
        assert!(second > first);
        assert!(copies.next_serial() > second);
        // A serial read at start above the clock (an agent whose clock ran
        // ahead): the next ones follow it, whatever the clock says.
        let ahead = clock_micros() + 3_600_000_000;
        let copies = Copies::start("p/", None, None, (ahead, 0), &shared);
        assert_eq!(copies.next_serial(), ahead + 1);
        assert_eq!(copies.next_serial(), ahead + 2);
    }
}
