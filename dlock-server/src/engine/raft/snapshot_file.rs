//! The latest snapshot on disk: one file, `snapshot`, replaced atomically.
//!
//! The file is the snapshot's metadata as one line of JSON, a newline, then
//! the snapshot data exactly as it is sent to peers (see `machine`). A new
//! snapshot is written to `snapshot.tmp`, fsynced, renamed over `snapshot`,
//! and the directory fsynced, so after a crash the file is either the old
//! snapshot or the new one, whole. Snapshots are large (the whole lock
//! table) and written rarely, which is why they live in a plain file beside
//! the redb log instead of inside it: a redb write transaction holding a
//! snapshot would block log appends while it is written.

use super::types::{LogId, SnapshotMeta};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

const NAME: &str = "snapshot";
const TMP_NAME: &str = "snapshot.tmp";

/// A snapshot read from disk: its metadata and its data.
pub(crate) type Stored = (SnapshotMeta, Vec<u8>);

/// The snapshot file of one data directory; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotFile {
    dir: PathBuf,
    /// What the file holds now. Writers (a snapshot being built and one
    /// being installed can race) take it, so an older snapshot never
    /// replaces a newer one.
    current: Arc<Mutex<Option<LogId>>>,
}

impl SnapshotFile {
    /// The snapshot file in `dir`, and the snapshot it holds, if any.
    ///
    /// # Errors
    /// The file exists but cannot be read, or its metadata line does not
    /// decode.
    pub(crate) fn open(dir: &Path) -> io::Result<(SnapshotFile, Option<Stored>)> {
        let file = SnapshotFile {
            dir: dir.to_path_buf(),
            current: Arc::new(Mutex::new(None)),
        };
        // A leftover from a crash while writing: never renamed, so never used.
        match fs::remove_file(dir.join(TMP_NAME)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let found = file.read()?;
        *file.lock() = found.as_ref().and_then(|(meta, _)| meta.last_log_id);
        Ok((file, found))
    }

    fn lock(&self) -> MutexGuard<'_, Option<LogId>> {
        // Holds only a log id, valid whatever a panicking writer did.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot on disk, if any. Blocking.
    ///
    /// # Errors
    /// The file cannot be read or its metadata does not decode.
    pub(crate) fn read(&self) -> io::Result<Option<Stored>> {
        let bytes = match fs::read(self.dir.join(NAME)) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(newline) = bytes.iter().position(|b| *b == b'\n') else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "snapshot file has no metadata line",
            ));
        };
        let meta: SnapshotMeta = serde_json::from_slice(&bytes[..newline])?;
        Ok(Some((meta, bytes[newline + 1..].to_vec())))
    }

    /// Makes `data` the snapshot on disk, durably, unless the file already
    /// holds a later one; returns whether it was written. Blocking.
    ///
    /// # Errors
    /// Writing, syncing or renaming failed; the previous snapshot is intact.
    pub(crate) fn write(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<bool> {
        let mut current = self.lock();
        if *current > meta.last_log_id {
            return Ok(false);
        }
        let tmp = self.dir.join(TMP_NAME);
        let mut f = File::create(&tmp)?;
        serde_json::to_writer(&mut f, meta)?;
        f.write_all(b"\n")?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.dir.join(NAME))?;
        // The rename is durable only once the directory is.
        File::open(&self.dir)?.sync_all()?;
        *current = meta.last_log_id;
        Ok(true)
    }
}
