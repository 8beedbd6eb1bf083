//! The served state on disk (`<state dir>/served-state.json`), so that a
//! restarted agent answers what it answered before: held keys stay held
//! through an upgrade, a watchdog kill, an OOM kill or a reboot; and its
//! runtime copy (`<runtime dir>/served-state.json`, a tmpfs), written
//! before each new state is served, so that an agent restarted while the
//! state folder's disk stalls starts from the newest state.
//!
//! Each copy is written atomically (a temporary file in the same folder,
//! fsync, rename over the old one, fsync of the folder) under an exclusive
//! `flock` of the folder, and carries a serial that only grows, across
//! restarts too (each new state takes the higher of the last serial plus 1
//! and the wall clock in microseconds,
//! [`crate::agent::state_copies::clock_micros`], so a later agent numbers
//! its states above an earlier one's even when it could not read their
//! copies at start): a write never puts an older state over a newer one,
//! even from a process that was stuck on a frozen disk and resumes after a
//! newer agent wrote; at start the copy with the higher serial is served.
//! Files from before serials (none: 0) and with serials counted from 1 load
//! as they are.

use std::fs::{self, File};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use crate::decision::served::ServedState;

/// The file's name in the state folder.
pub const FILE_NAME: &str = "served-state.json";

/// The start and end of a temporary file's name while it is written
/// (`.served-state.json.XXXXXX.tmp`, the middle random, from `tempfile`).
const TMP_PREFIX: &str = ".served-state.json.";
const TMP_SUFFIX: &str = ".tmp";

/// Removes the temporary files a writer killed mid-write left in `dir`
/// (an OOM kill, a watchdog kill); called under the folder's lock, so none
/// is being written. Errors are ignored: the next save tries again.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten().take(1000) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TMP_PREFIX) && name.ends_with(TMP_SUFFIX) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Where the served state lives.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

/// What reading the file at start-up found.
#[derive(Debug)]
pub enum Loaded {
    /// A served state, and its serial (0 in a file from before serials).
    State(ServedState, u64),
    /// No file: a first start, or the folder was emptied.
    Missing,
    /// A file that cannot be used; the text says why.
    Unusable(String),
}

/// What a [`StateFile::save`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The file holds the text given.
    Written,
    /// The file already held this serial or a higher one, written by this
    /// agent or by a newer one: left as it was. (The same serial: this
    /// state, written by this agent's writer before; a higher one: a newer
    /// state, or one from an earlier agent whose clock ran ahead.)
    AlreadyNewer(u64),
}

/// The text of the file for `state` served as number `serial`: the served
/// state's JSON (format version 1, [`ServedState::write_file`]) with a
/// leading `"serial"` member, which readers of the format that do not know
/// it ignore.
pub fn file_text(prefix: &str, state: &ServedState, serial: u64) -> Vec<u8> {
    let mut json = Vec::new();
    // Writing to memory cannot fail.
    let _ = state.write_file(prefix, &mut json);
    let mut out = format!("{{\"serial\":{serial},").into_bytes();
    out.extend_from_slice(json.strip_prefix(b"{").unwrap_or(&json));
    out
}

/// `text` ([`file_text`]) numbered `serial` instead: its leading
/// `"serial"` member replaced (or added, in a text without one).
pub fn renumbered(text: &[u8], serial: u64) -> Vec<u8> {
    let rest = text
        .strip_prefix(b"{\"serial\":")
        .map(|r| {
            let digits = r.iter().take_while(|b| b.is_ascii_digit()).count();
            r[digits..].strip_prefix(b",").unwrap_or(&r[digits..])
        })
        .or_else(|| text.strip_prefix(b"{"))
        .unwrap_or(text);
    let mut out = format!("{{\"serial\":{serial},").into_bytes();
    out.extend_from_slice(rest);
    out
}

/// The serial at the start of a file's text; 0 when it has none (a file
/// from before serials, or not one of ours).
pub fn serial_of(text: &[u8]) -> u64 {
    let Some(rest) = text.strip_prefix(b"{\"serial\":") else {
        return 0;
    };
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .take(20)
        .collect();
    std::str::from_utf8(&digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
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

    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Reads the served state written for `prefix`. Only reads: safe on a
    /// frozen file system.
    pub fn load(&self, prefix: &str) -> Loaded {
        match fs::read_to_string(&self.path) {
            Ok(text) => match ServedState::from_file(prefix, &text) {
                Ok(state) => Loaded::State(state, serial_of(text.as_bytes())),
                Err(e) => Loaded::Unusable(e.to_string()),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Loaded::Missing,
            Err(e) => Loaded::Unusable(e.to_string()),
        }
    }

    /// The serial of the file now there; 0 when there is none.
    fn serial_now(&self) -> u64 {
        let mut head = [0u8; 32];
        let Ok(mut f) = File::open(&self.path) else {
            return 0;
        };
        let mut n = 0;
        while n < head.len() {
            match f.read(&mut head[n..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        serial_of(&head[..n])
    }

    /// Writes `text` ([`file_text`] of number `serial`) atomically, unless
    /// the file holds `serial` or a higher one already: under an exclusive
    /// `flock` of the folder, a temporary file in the folder
    /// (`tempfile::NamedTempFile`), fsync, rename over the file
    /// (`NamedTempFile::persist`), fsync of the folder, so that the rename
    /// itself survives a power loss.
    ///
    /// # Errors
    ///
    /// The I/O error of any step; the old file is then left as it was.
    pub fn save(&self, text: &[u8], serial: u64) -> std::io::Result<Saved> {
        let dir = self.dir();
        let folder = File::open(dir)?;
        rustix::fs::flock(&folder, rustix::fs::FlockOperation::LockExclusive)?;
        let on_disk = self.serial_now();
        if on_disk >= serial && serial > 0 {
            return Ok(Saved::AlreadyNewer(on_disk));
        }
        // One writer at a time holds the lock: a temporary file of ours
        // found now was left by a writer killed mid-write.
        remove_stale_temporaries(dir);
        let result = (|| {
            let mut tmp = tempfile::Builder::new()
                .prefix(TMP_PREFIX)
                .suffix(TMP_SUFFIX)
                // As `File::create`: 0666 less the umask.
                .permissions(fs::Permissions::from_mode(0o666))
                .tempfile_in(dir)?;
            tmp.write_all(text)?;
            tmp.as_file().sync_all()?;
            // On an error the temporary file is removed when dropped.
            tmp.persist(&self.path).map_err(|e| e.error)?;
            folder.sync_all()
        })();
        // The lock goes with `folder`.
        result.map(|()| Saved::Written)
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
        let text = file_text("p/", &state, 7);
        assert_eq!(serial_of(&text), 7);
        assert_eq!(file.save(&text, 7).unwrap(), Saved::Written);
        match file.load("p/") {
            Loaded::State(s, serial) => {
                assert_eq!(s, state);
                assert_eq!(serial, 7);
            }
            other => panic!("{other:?}"),
        }
        // The format without the serial reads the same state.
        assert_eq!(
            ServedState::from_file("p/", std::str::from_utf8(&text).unwrap()).unwrap(),
            state
        );
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
    fn an_older_serial_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::in_dir(dir.path());
        let state = ServedState::default();
        // A file from before serials counts as 0.
        fs::write(file.path(), state.to_file("p/")).unwrap();
        assert!(matches!(file.load("p/"), Loaded::State(_, 0)));
        assert_eq!(
            file.save(&file_text("p/", &state, 5), 5).unwrap(),
            Saved::Written
        );
        assert_eq!(
            file.save(&file_text("p/", &state, 4), 4).unwrap(),
            Saved::AlreadyNewer(5)
        );
        assert_eq!(
            file.save(&file_text("p/", &state, 5), 5).unwrap(),
            Saved::AlreadyNewer(5)
        );
        assert!(matches!(file.load("p/"), Loaded::State(_, 5)));
        assert_eq!(serial_of(b"{\"version\":1}"), 0);
        // Renumbered, the same state under the new serial.
        let text = renumbered(&file_text("p/", &state, 5), 1_764_900_000_000_001);
        assert_eq!(text, file_text("p/", &state, 1_764_900_000_000_001));
        assert_eq!(
            renumbered(&state.to_file("p/").into_bytes(), 6),
            file_text("p/", &state, 6)
        );
    }

    #[test]
    fn a_failed_save_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::in_dir(&dir.path().join("missing-folder"));
        assert!(file.save(b"{}", 1).is_err());
        // The rename fails (a folder at the file's path): the temporary
        // file goes, the folder stays.
        let file = StateFile::in_dir(dir.path());
        fs::create_dir(file.path()).unwrap();
        assert!(file.save(b"{}", 1).is_err());
        assert!(file.path().is_dir());
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_temporary_file_left_by_a_killed_writer_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::in_dir(dir.path());
        let left = dir.path().join(".served-state.json.a1B2c3.tmp");
        fs::write(&left, "{half").unwrap();
        let other = dir.path().join("served-state.json.unusable");
        fs::write(&other, "kept").unwrap();
        let state = ServedState::default();
        assert_eq!(
            file.save(&file_text("p/", &state, 1), 1).unwrap(),
            Saved::Written
        );
        assert!(!left.exists());
        assert!(other.exists());
        assert!(matches!(file.load("p/"), Loaded::State(_, 1)));
        // The mode `File::create` gives (0666 less the umask), not
        // tempfile's 0600.
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(file.path()), mode(&other));
    }
}
