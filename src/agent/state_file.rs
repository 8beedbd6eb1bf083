//! The served state on disk (`<state dir>/served-state.json`), so that a
//! restarted agent answers what it answered before: held keys stay held
//! through an upgrade, a watchdog kill, an OOM kill or a reboot.
//!
//! Written atomically on every change (a temporary file in the same folder,
//! fsync, rename over the old one, fsync of the folder), before the new state
//! is served: a crash between the two leaves the file one step ahead of the
//! answers, never behind them.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::shared::Shared;
use crate::decision::served::ServedState;

/// The file's name in the state folder.
pub const FILE_NAME: &str = "served-state.json";

/// Where the served state lives, and what happened the last time it was read
/// and written.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

/// What reading the file at start-up found.
#[derive(Debug)]
pub enum Loaded {
    /// A served state.
    State(ServedState),
    /// No file: a first start, or the folder was emptied.
    Missing,
    /// A file that cannot be used; the text says why.
    Unusable(String),
}

impl StateFile {
    /// The file in folder `dir`.
    pub fn in_dir(dir: &Path) -> StateFile {
        StateFile {
            path: dir.join(FILE_NAME),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the served state written for `prefix`.
    pub fn load(&self, prefix: &str) -> Loaded {
        match fs::read_to_string(&self.path) {
            Ok(text) => match ServedState::from_file(prefix, &text) {
                Ok(state) => Loaded::State(state),
                Err(e) => Loaded::Unusable(e.to_string()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Loaded::Missing,
            Err(e) => Loaded::Unusable(e.to_string()),
        }
    }

    /// Writes `state` atomically: temporary file, fsync, rename, fsync of
    /// the folder.
    ///
    /// # Errors
    ///
    /// The I/O error of any step; the old file is then left as it was.
    pub fn save(&self, prefix: &str, state: &ServedState) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".{FILE_NAME}.tmp"));
        let result = (|| {
            let f = File::create(&tmp)?;
            let mut writer = std::io::BufWriter::new(f);
            state.write_file(prefix, &mut writer)?;
            writer.flush()?;
            let f = writer.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// A state-file write that failed is retried this often until it succeeds
/// or a newer state is written: 5 s.
const STATE_FILE_RETRY: Duration = Duration::from_secs(5);

/// The state file, written by the watcher on every change and by
/// [`Persister::retry`] when that write failed: a state served but not on
/// disk is written as soon as the disk takes it (space freed, the folder
/// writable again), not only at the next change, which may never come.
pub struct Persister {
    file: StateFile,
    prefix: String,
    /// Serialises the writes (the watcher's and the retries').
    writing: tokio::sync::Mutex<()>,
    /// The newest state whose write failed.
    behind: std::sync::Mutex<Option<Arc<ServedState>>>,
}

impl Persister {
    /// A persister of `file` for the watched `prefix`, nothing behind.
    pub fn new(file: StateFile, prefix: String) -> Persister {
        Persister {
            file,
            prefix,
            writing: tokio::sync::Mutex::new(()),
            behind: std::sync::Mutex::new(None),
        }
    }

    /// Writes `state`. A retry (`retry`) writes only if `state` is still the
    /// newest unwritten one, so it never puts an older state over a newer.
    pub async fn write(&self, shared: &Shared, state: &Arc<ServedState>, retry: bool) {
        let _writing = self.writing.lock().await;
        if retry
            && !self
                .behind
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|b| Arc::ptr_eq(b, state))
        {
            return;
        }
        let (file, prefix, to_write) = (self.file.clone(), self.prefix.clone(), Arc::clone(state));
        let result = tokio::task::spawn_blocking(move || file.save(&prefix, &to_write)).await;
        let result = match result {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let metrics = &shared.metrics;
        let mut status = shared.state_file.lock().unwrap();
        let mut behind = self.behind.lock().unwrap();
        match result {
            Ok(()) => {
                metrics.state_file_writes.with_label_values(&["ok"]).inc();
                *behind = None;
                if status.write_error.take().is_some() {
                    info!(path = %self.file.path().display(), "state file written again: it holds the state served");
                }
            }
            Err(e) => {
                metrics
                    .state_file_writes
                    .with_label_values(&["error"])
                    .inc();
                *behind = Some(Arc::clone(state));
                if status.write_error.is_none() {
                    warn!(error = %e, path = %self.file.path().display(), "cannot write the state file; retrying every 5 s. Until it is written, a restart would start from an older state (answering only its drain and maint until Consul answers)");
                }
                status.write_error = Some(e);
            }
        }
        metrics.state_file_behind.set(i64::from(behind.is_some()));
    }

    /// Retries the newest failed write every 5 s until
    /// `shutdown`.
    pub async fn retry(self: Arc<Self>, shared: Arc<Shared>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(STATE_FILE_RETRY) => {}
            }
            let behind = self.behind.lock().unwrap().clone();
            if let Some(state) = behind {
                self.write(&shared, &state, true).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::served::{AnswerView, MergeInput};
    use crate::model::snapshot::KvPair;

    fn pair(key: &str, value: &str, modify_index: u64) -> KvPair {
        KvPair {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            modify_index,
            flags: 0,
        }
    }

    #[test]
    fn a_saved_state_loads_as_it_was_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::in_dir(dir.path());
        assert!(matches!(file.load("p/"), Loaded::Missing));
        let view = AnswerView::new(
            "p/",
            9,
            &[
                pair("p/canary", "drain", 3),
                pair("p/web/s1", "mantenance", 9),
                pair("p/~store-id", "abc", 1),
            ],
        );
        let (state, _) = ServedState::default().merge(view, &MergeInput::default());
        file.save("p/", &state).unwrap();
        match file.load("p/") {
            Loaded::State(s) => assert_eq!(s, state),
            other => panic!("{other:?}"),
        }
        match file.load("other/") {
            Loaded::Unusable(e) => assert!(e.contains("prefix"), "{e}"),
            other => panic!("{other:?}"),
        }
        fs::write(file.path(), "{not json").unwrap();
        assert!(matches!(file.load("p/"), Loaded::Unusable(_)));
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_save_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::in_dir(&dir.path().join("missing-folder"));
        assert!(file.save("p/", &ServedState::default()).is_err());
    }
}
