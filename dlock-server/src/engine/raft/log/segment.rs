//! The log's segment files: where one lives, how it grows and when a new
//! one starts, each beginning with a checkpoint; the deletion of segments
//! whose entries are all purged; and [`Loc`], where an entry is.

use super::error::DiskError;
use super::format::*;
use super::Wal;
use crate::engine::raft::encoding;
use crate::engine::raft::storage::StorageFile;
use crate::engine::raft::types::{Entry, LogId};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Files grow in steps of this many bytes.
pub(super) const STEP: u64 = 4 << 20;
/// A segment this full is closed and a new one started.
pub(super) const SEGMENT: u64 = 16 << 20;
pub(super) const EXT: &str = "seg";

/// Where an entry is: read back with [`Loc::read`]. Holds its segment open,
/// so a reader that found it can still read it after the segment is deleted.
#[derive(Clone)]
pub(crate) struct Loc {
    /// The entry's id.
    pub(crate) id: LogId,
    pub(super) file: Arc<StorageFile>,
    /// Where its record starts, and the record's length with its head.
    pub(super) at: u64,
    pub(super) len: usize,
}

impl Loc {
    /// Reads and decodes the entry.
    ///
    /// # Errors
    /// The read fails, or the record no longer checks out.
    pub(crate) fn read(&self) -> Result<Entry, DiskError> {
        // Once more from the file before giving up: a read that failed or
        // came back wrong may have met a transient fault (a page cache that
        // a FUSE filesystem or a flaky controller got wrong), and a failed
        // read stops the node.
        self.read_once().or_else(|first| {
            tracing::warn!(entry = self.id.index, at = self.at, error = %first, "reading a raft log record failed; reading it again");
            self.read_once()
        })
    }

    pub(super) fn read_once(&self) -> Result<Entry, DiskError> {
        let mut buf = vec![0; self.len];
        self.file.read_exact_at(&mut buf, self.at)?;
        match check(&buf, 0) {
            Some((Kind::Entry, payload)) => Ok(encoding::decode(payload)?),
            _ => Err(DiskError::Damaged(format!(
                "the raft log record of entry {} (byte {}) no longer checks out",
                self.id.index, self.at
            ))),
        }
    }
}

pub(super) struct Segment {
    pub(super) seq: u64,
    pub(super) file: Arc<StorageFile>,
    /// The highest entry index written to it.
    pub(super) max_index: Option<u64>,
}

pub(super) fn round_up(n: u64, step: u64) -> u64 {
    n.div_ceil(step).max(1).saturating_mul(step)
}

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.{EXT}"))
}

impl Wal {
    pub(super) fn active(&self) -> &Segment {
        // There is always one: `open` makes or finds it.
        &self.segments[self.segments.len() - 1]
    }

    /// Closes the last segment and starts the next, with room for `n` more
    /// bytes.
    pub(super) fn rotate(&mut self, n: u64) -> Result<(), DiskError> {
        // A segment that is not the last must hold no torn record.
        self.active().file.sync_data()?;
        let seq = self.active().seq.saturating_add(1);
        self.start_segment(seq, n)
    }

    /// Makes segment `seq`: a header, the checkpoint, room for `n` bytes.
    pub(super) fn start_segment(&mut self, seq: u64, n: u64) -> Result<(), DiskError> {
        let mut head = Batch::default();
        head.buf.extend_from_slice(&MAGIC);
        head.buf.push(VERSION);
        head.buf.resize(HEADER as usize, 0);
        let salt = new_salt();
        head.buf[SALT_AT..SALT_AT + 4].copy_from_slice(&salt.to_le_bytes());
        if let Some(v) = self.vote.clone() {
            head.vote(v)?;
        }
        if let Some(p) = self.purged.clone() {
            head.push(Kind::Purge, &p)?;
        }
        if let Some(c) = self.committed.clone() {
            head.committed(c)?;
        }
        let len = round_up(head.buf.len() as u64 + n, self.step);
        let path = segment_path(&self.dir, seq);
        let tmp = path.with_extension(format!("{EXT}.tmp"));
        let file = self.storage.create(&tmp, false)?;
        file.allocate(len)?;
        file.write_all_at(&head.buf, 0)?;
        file.sync_all()?;
        self.storage.rename(&tmp, &path)?;
        self.storage.sync_dir(&self.dir)?;
        self.segments.push(Segment {
            seq,
            file: Arc::new(file),
            max_index: None,
        });
        self.end = head.buf.len() as u64;
        self.len = len;
        // The checkpoint is synced: the first write vouches for it.
        self.synced = self.end;
        self.marked = 0;
        self.salt = salt;
        self.last_has_marks = true;
        Ok(())
    }

    /// Deletes the segments before the last whose entries are all at or
    /// below `purged`; when the last one's are too and it has grown past
    /// one step, starts a new one first, so that an idle log gives back
    /// its space. Call after the purge record is durable.
    ///
    /// # Errors
    /// Starting the new segment, or syncing the directory after a deletion,
    /// failed (then nothing more is written); a failed deletion is only
    /// logged.
    pub(crate) fn drop_purged(&mut self, purged: u64) -> Result<(), DiskError> {
        if self.failed {
            return Ok(());
        }
        let below = |s: &Segment| s.max_index.is_none_or(|m| m <= purged);
        if self.end > self.step && below(self.active()) && !self.failed {
            if let Err(e) = self.rotate(0) {
                self.failed = true;
                return Err(e);
            }
        }
        let keep_from = self.segments[..self.segments.len() - 1]
            .iter()
            .position(|s| !below(s))
            .unwrap_or(self.segments.len() - 1);
        // Oldest first, stopping at a failure: a segment left behind a
        // deleted one would be a gap (read as damage); it is tried again at
        // the next purge. The directory is synced after each deletion: a
        // power cut may keep or lose each unsynced one on its own (the
        // simulated disk found a later one kept and an earlier one back,
        // a gap that refused the start).
        let mut deleted = 0;
        let mut result = Ok(());
        for s in &self.segments[..keep_from] {
            let path = segment_path(&self.dir, s.seq);
            if let Err(e) = self.storage.remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot delete a purged raft log segment");
                break;
            }
            deleted += 1;
            if let Err(e) = self.storage.sync_dir(&self.dir) {
                // Whether the deletion is durable is unknown, and a later
                // one that is could leave this segment behind a gap: as
                // after any failed sync, nothing more is written.
                self.failed = true;
                result = Err(DiskError::Io(e));
                break;
            }
        }
        drop(self.segments.drain(..deleted));
        result
    }

    /// The segment files, oldest first.
    #[cfg(test)]
    pub(super) fn files(&self) -> Vec<PathBuf> {
        self.segments
            .iter()
            .map(|s| segment_path(&self.dir, s.seq))
            .collect()
    }
}
