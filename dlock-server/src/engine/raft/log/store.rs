//! The Raft log and vote, durable in the log's segment files (`wal`,
//! `raft-log/` in the data directory).
//!
//! Every change to the log or the vote is written in order and made
//! durable with an `fdatasync` before it counts: openraft is told an append
//! is flushed (its `LogFlushed` callback) only after that sync, and counts
//! this node towards a majority only then. So an acknowledged write is on
//! the disk of a majority of nodes. Who writes ([`WrittenBy`]): openraft's
//! core itself when the node's consensus tasks have a thread of their own
//! (`inline.rs`), else the writer thread (`writer.rs`), where appends
//! queued behind each other share one sync; both through `disk.rs`.
//!
//! Reads (replication streams read entries concurrently with appends) see
//! the entries still queued for the writer thread, then the written ones,
//! read back from their segment by position.

use super::committed::CommittedSlot;
use super::disk::Disk;
use super::error::DiskError;
use super::format::Batch;
use super::inline::Inline;
use super::writer::Writer;
use super::written::{Pending, Shared, Then, Written};
use super::Wal;
use crate::engine::raft::encoding;
use crate::engine::raft::types::{Entry, LogId, NodeId, TypeConfig, Vote};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, StorageError, StorageIOError};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A file created in the data directory after the log's first durable
/// write. A log that is empty while it exists has lost what it held (files
/// cut short, replaced or deleted): such a node could vote twice in one
/// term, so it must not start (see `start::open_data_dir`). Named for the
/// redb file that held the log before `raft-log/`: a version that still
/// reads `raft.redb` finds it and refuses a directory whose log it cannot
/// see, instead of starting with an empty one.
pub(crate) const WRITTEN_MARKER: &str = "raft.redb.written";

impl DiskError {
    fn storage(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> StorageError<NodeId> {
        StorageIOError::new(subject, verb, &self).into()
    }
}

/// Who writes the log's changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrittenBy {
    /// The writer thread: openraft's core queues each change to it. For a
    /// node whose consensus tasks share a runtime with the client
    /// connections (`--threads 1`), which an fsync must not stall.
    WriterThread,
    /// The caller, openraft's core, on the node's consensus thread
    /// (`inline.rs`): no hand-off to another thread and back per write.
    Caller,
}

/// One of the two, opened (see [`WrittenBy`]).
enum Writes {
    Thread(Writer),
    Caller(Inline),
}

impl Writes {
    async fn append(
        &self,
        entries: Vec<(LogId, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), DiskError> {
        match self {
            Writes::Thread(w) => w.append(entries, callback).await,
            Writes::Caller(w) => w.append(entries, callback),
        }
    }

    fn write_committed(&self, slot: &CommittedSlot) -> Result<(), DiskError> {
        match self {
            Writes::Thread(w) => w.write_committed(slot),
            Writes::Caller(w) => w.write_committed(slot),
        }
    }

    async fn write(&self, batch: Batch, then: Then, purged: Option<u64>) -> Result<(), DiskError> {
        match self {
            Writes::Thread(w) => w.write(batch, then, purged).await,
            Writes::Caller(w) => w.write(batch, then, purged),
        }
    }
}

/// The Raft log and vote. openraft owns the one `LogStore` and drops it
/// when it stops, which closes the log: the [`LogReader`]s it hands to
/// replication tasks hold it weakly, because those tasks may outlive the
/// engine briefly (asleep in a backoff), and the data directory must be
/// reusable as soon as the engine has stopped.
pub(crate) struct LogStore {
    written: Shared,
    /// The last committed index this node knows of, plus one (0: none),
    /// for status reports; openraft's metrics do not carry it.
    committed: Arc<AtomicU64>,
    /// Appended entries the writer thread has not written yet (always
    /// empty when the caller writes).
    pending: Pending,
    /// The committed id waiting to be written.
    committed_slot: CommittedSlot,
    /// Whether [`WRITTEN_MARKER`] was there when the log was opened.
    written_before: bool,
    /// Declared last, so it is dropped last: its drop waits for the writer
    /// thread, which holds the log open until it ends (or, written by the
    /// caller, closes the log itself).
    writes: Writes,
}

impl LogStore {
    /// Opens (or creates) the log in the data directory `dir`, importing
    /// the `raft.redb` of an older version first if that is what it holds,
    /// to be written by `by`.
    ///
    /// # Errors
    /// The log cannot be opened or created (it is open in another process,
    /// is damaged, or the directory is not writable), or the writer thread
    /// cannot be started.
    pub(crate) fn open(dir: &Path, by: WrittenBy) -> Result<LogStore, DiskError> {
        super::redb_import::import(dir)?;
        let (wal, replayed) = Wal::open(dir)?;
        let written = Shared::new(Written {
            entries: replayed.entries,
            vote: replayed.vote,
            committed: replayed.committed,
            purged: replayed.purged,
        });
        let pending = Pending::default();
        let committed_slot = CommittedSlot::default();
        let marker = dir.join(WRITTEN_MARKER);
        let written_before = marker.exists();
        let disk = Disk::new(
            wal,
            written.clone(),
            pending.clone(),
            committed_slot.clone(),
            (!written_before).then_some(marker),
        );
        let store = LogStore {
            writes: match by {
                WrittenBy::WriterThread => Writes::Thread(Writer::start(disk)?),
                WrittenBy::Caller => Writes::Caller(Inline::new(disk)),
            },
            committed_slot,
            written_before,
            committed: Arc::new(AtomicU64::new(0)),
            pending,
            written: written.clone(),
        };
        store.note_committed(written.lock().committed.as_ref());
        Ok(store)
    }

    /// Whether nothing was ever written: no vote, no entry, nothing purged.
    /// A fresh node is the only kind that may be initialised.
    pub(crate) fn is_fresh(&self) -> Result<bool, DiskError> {
        let w = self.written.lock();
        Ok(w.vote.is_none()
            && w.purged.is_none()
            && w.entries.is_empty()
            && self.pending.lock().is_empty())
    }

    /// Whether the log held a vote or entries before and holds nothing now:
    /// the files lost what was written to them.
    pub(crate) fn lost_its_writes(&self) -> Result<bool, DiskError> {
        Ok(self.written_before && self.is_fresh()?)
    }

    /// The handle to the last committed index, shared with status reports.
    pub(crate) fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn note_committed(&self, id: Option<&LogId>) {
        let v = id.map_or(0, |id| id.index.saturating_add(1));
        self.committed.store(v, Ordering::Relaxed);
    }

    /// Writes and syncs `batch` after everything queued before it, then
    /// applies `then`, and waits for that.
    async fn write(
        &self,
        batch: Batch,
        then: impl FnOnce(&mut Written) + Send + 'static,
        purged: Option<u64>,
    ) -> Result<(), DiskError> {
        let then: Then = Box::new(then);
        self.writes.write(batch, then, purged).await
    }
}

/// The log of a data directory no node runs on (a backup being restored),
/// held open (and so locked) from [`OfflineLog::open`] on.
pub(crate) struct OfflineLog {
    wal: Wal,
    last: Option<LogId>,
}

impl OfflineLog {
    /// Opens the log of `dir` (importing an older `raft.redb` first).
    ///
    /// # Errors
    /// There is no log, a node runs on the directory, or the log is damaged.
    pub(crate) fn open(dir: &Path) -> Result<OfflineLog, DiskError> {
        super::redb_import::import(dir)?;
        let (wal, replayed) = Wal::open(dir)?;
        let last = replayed.entries.values().next_back().map(|l| l.id);
        let last = [last, replayed.purged]
            .into_iter()
            .flatten()
            .max_by_key(|id| id.index);
        Ok(OfflineLog { wal, last })
    }

    /// Appends one normal entry holding `payload` after the log's last entry
    /// (or after `snapshot`, the last log id the directory's snapshot covers,
    /// when that is later: a node can stop between installing a snapshot and
    /// purging the log it covers, and an entry at or below it would be
    /// purged unapplied), in that entry's term (as if its leader had
    /// appended it), and marks it committed, so every node started from a
    /// copy of the directory applies it. Entries the backup held
    /// uncommitted at its tail are committed with it, as a new leader's
    /// first entry would commit them. Returns the entry's id.
    ///
    /// `None` when the log holds no entry at all (nothing to restore).
    ///
    /// # Errors
    /// The log cannot be written.
    pub(crate) fn append_committed(
        mut self,
        snapshot: Option<LogId>,
        payload: crate::engine::raft::types::Stamped,
    ) -> Result<Option<LogId>, DiskError> {
        let Some(last) = [self.last, snapshot]
            .into_iter()
            .flatten()
            .max_by_key(|id| id.index)
        else {
            return Ok(None);
        };
        let id = LogId::new(last.leader_id, last.index.saturating_add(1));
        let entry = Entry {
            log_id: id,
            payload: openraft::EntryPayload::Normal(payload),
        };
        let mut batch = Batch::default();
        if let Some(covered) = snapshot.filter(|s| self.last.is_none_or(|l| s.index > l.index)) {
            // The log must go on from where the snapshot ends: what it
            // covers counts as purged, as if the node had purged it.
            batch.purge(covered)?;
        }
        batch.entry(id, &encoding::encode(&entry)?)?;
        batch.committed(encoding::encode(&Some(id))?)?;
        self.wal.write(batch)?;
        self.wal.sync()?;
        Ok(Some(id))
    }
}

fn entries<R: RangeBounds<u64>>(
    written: &Shared,
    pending: &Pending,
    range: R,
) -> Result<Vec<Entry>, DiskError> {
    let bounds: (Bound<u64>, Bound<u64>) =
        (range.start_bound().cloned(), range.end_bound().cloned());
    // Queued entries first: they only ever move from the queue to the
    // written ones, so reading the queue before those misses none.
    let queued: Vec<(u64, Entry)> = pending
        .lock()
        .range(bounds)
        .map(|(i, e)| (*i, e.clone()))
        .collect();
    let locs: Vec<_> = written
        .lock()
        .entries
        .range(bounds)
        .map(|(_, l)| l.clone())
        .collect();
    let mut out = BTreeMap::new();
    for loc in locs {
        out.insert(loc.id.index, loc.read()?);
    }
    out.extend(queued);
    Ok(out.into_values().collect())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        entries(&self.written, &self.pending, range)
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

/// Reads entries for a replication task while the engine runs.
pub(crate) struct LogReader {
    written: Weak<std::sync::Mutex<Written>>,
    pending: Pending,
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let Some(written) = self.written.upgrade().map(Shared::from_arc) else {
            let e = std::io::Error::other("the raft log is closed: the engine has stopped");
            return Err(StorageIOError::read_logs(&e).into());
        };
        entries(&written, &self.pending, range)
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_pending = self.pending.lock().last_key_value().map(|(_, e)| e.log_id);
        let w = self.written.lock();
        let last = last_pending.or_else(|| w.entries.values().next_back().map(|l| l.id));
        Ok(LogState {
            last_purged_log_id: w.purged,
            last_log_id: last.or(w.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            written: self.written.downgrade(),
            pending: self.pending.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError<NodeId>> {
        let to_err = |e: DiskError| e.storage(ErrorSubject::Vote, ErrorVerb::Write);
        let mut batch = Batch::default();
        batch
            .vote(encoding::encode(vote).map_err(|e| to_err(e.into()))?)
            .map_err(to_err)?;
        let vote = *vote;
        self.write(batch, move |w| w.vote = Some(vote), None)
            .await
            .map_err(to_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError<NodeId>> {
        Ok(self.written.lock().vote)
    }

    /// Kept so that a restarted node applies what it knows was committed at
    /// once, instead of waiting for a leader to tell it again. Written with
    /// the next append (in its batch and its sync), or on its own when none
    /// comes within 50 ms, never past the entries on disk (see
    /// `committed::CommittedSlot`), and not waited for, so it never holds
    /// openraft up behind an fsync or wakes the writer thread per commit.
    /// Written on its own it is not synced: the next append's sync carries
    /// it, and losing it only delays that re-apply.
    async fn save_committed(
        &mut self,
        committed: Option<LogId>,
    ) -> Result<(), StorageError<NodeId>> {
        self.note_committed(committed.as_ref());
        if !self.committed_slot.put(committed) {
            // A write is queued; it takes this newer value.
            return Ok(());
        }
        self.writes
            .write_committed(&self.committed_slot)
            .map_err(|e| e.storage(ErrorSubject::Store, ErrorVerb::Write))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<NodeId>> {
        // The latest saved, written or not yet.
        Ok(self
            .committed_slot
            .peek()
            .unwrap_or_else(|| self.written.lock().committed))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let queues = matches!(self.writes, Writes::Thread(_));
        let mut encoded = Vec::new();
        let mut queued = Vec::new();
        for e in entries {
            match encoding::encode(&e) {
                Ok(bytes) => encoded.push((e.log_id, bytes)),
                Err(e) => {
                    let e = DiskError::from(e);
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                    return Err(e.storage(ErrorSubject::Logs, ErrorVerb::Write));
                }
            }
            if queues {
                queued.push(e);
            }
        }
        // Queued for the writer thread, readable from now on, though not
        // yet on disk: openraft counts this node towards the majority only
        // once the writer calls `callback`. Written by the caller, they
        // are on disk (and readable) before `append` returns.
        if queues {
            let mut pending = self.pending.lock();
            for e in queued {
                pending.insert(e.log_id.index, e);
            }
        }
        self.writes
            .append(encoded, callback)
            .await
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Write))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let from = log_id.index;
        let to_err = |e: DiskError| e.storage(ErrorSubject::Logs, ErrorVerb::Delete);
        let mut batch = Batch::default();
        batch.truncate(from).map_err(to_err)?;
        self.write(batch, move |w| drop(w.entries.split_off(&from)), None)
            .await
            .map_err(to_err)?;
        // Every append queued before the truncation was written (and left
        // the queue) before it; nothing from `from` on may stay readable.
        // (Written by the caller, nothing is queued.)
        drop(self.pending.lock().split_off(&from));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let upto = log_id.index;
        let to_err = |e: DiskError| e.storage(ErrorSubject::Logs, ErrorVerb::Delete);
        let mut batch = Batch::default();
        batch.purge(log_id).map_err(to_err)?;
        self.write(
            batch,
            move |w| {
                w.entries = w.entries.split_off(&upto.saturating_add(1));
                w.purged = Some(log_id);
            },
            Some(upto),
        )
        .await
        .map_err(to_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::raft::types::Stamped;
    use crate::table::Time;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(3, 1), index)
    }

    /// A failed sync leaves what reached the disk unknown: the change
    /// fails, and so does every later one, even once the disk works again,
    /// whoever writes (the node stops on the first error and restarts).
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_failed_sync_fails_every_later_write_whoever_writes() {
        for by in [WrittenBy::WriterThread, WrittenBy::Caller] {
            let dir = tempfile::tempdir().expect("dir");
            let mut store = LogStore::open(dir.path(), by).expect("open");
            store
                .save_vote(&Vote::new(1, 1))
                .await
                .expect("a vote saved");
            let fault = dir.path().join(super::super::DIR).join("FAIL-SYNC");
            std::fs::write(&fault, b"").expect("the fault file");
            assert!(store.save_vote(&Vote::new(2, 1)).await.is_err(), "{by:?}");
            std::fs::remove_file(&fault).expect("healed");
            assert!(
                store.save_vote(&Vote::new(3, 1)).await.is_err(),
                "{by:?}: written after a failed sync"
            );
            assert!(store.purge(id(0)).await.is_err(), "{by:?}");
            assert_eq!(
                store.read_vote().await.expect("read"),
                Some(Vote::new(1, 1))
            );
            drop(store);
            let (_wal, r) = Wal::open(dir.path()).expect("reopens");
            assert!(r.purged.is_none(), "{by:?}");
        }
    }

    /// A node can stop between installing a snapshot and purging the log it
    /// covers: the restore entry goes after the snapshot, and the log must
    /// still open, starting there.
    #[test]
    fn a_restore_entry_after_a_snapshot_ahead_of_the_log_leaves_a_log_that_opens() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            let mut batch = Batch::default();
            for i in 0..=5 {
                let e = Entry {
                    log_id: id(i),
                    payload: EntryPayload::Blank,
                };
                batch
                    .entry(e.log_id, &encoding::encode(&e).expect("encode"))
                    .expect("entry");
            }
            wal.write(batch).expect("write");
            wal.sync().expect("sync");
        }
        let payload = Stamped {
            at: Time::ZERO,
            cmds: vec![crate::table::Command::Restore { fence_floor: 7 }],
        };
        let log = OfflineLog::open(dir.path()).expect("offline");
        let appended = log
            .append_committed(Some(id(100)), payload)
            .expect("append");
        assert_eq!(appended, Some(id(101)));
        let (_wal, r) = Wal::open(dir.path()).expect("the log opens");
        assert_eq!(r.purged, Some(id(100)));
        assert_eq!(r.committed, Some(id(101)));
        assert_eq!(r.entries.keys().copied().collect::<Vec<_>>(), [101]);
    }
}
