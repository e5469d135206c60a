//! The log written on the caller ([`Inline`]): on a node whose consensus
//! tasks run on a thread of their own (`own_thread.rs`), openraft's core
//! writes and syncs each change itself, in the order it asks for them,
//! instead of queueing it to the writer thread and sleeping until that
//! thread wakes it: a hand-off each way per write (issue 44; BENCHMARKS.md,
//! "openraft on a thread of its own per node").
//!
//! The writes are the writer thread's (`disk.rs`), one change at a time:
//! an append is written and synced, and its flush callback called, before
//! `append` returns; a vote, a truncation and a purge are durable before
//! theirs returns; the committed id rides with the next append, or is
//! written on its own (unsynced, as on the writer thread) after the slot's
//! wait, by a task on the same thread. openraft 0.9's core waits for every
//! append's flush callback before it takes its next command
//! (`RaftCore::append_to_log`), so appends never queued behind each other
//! there anyway: the one write per sync is the same, and the entries are
//! on disk before anyone can read them.
//!
//! A slow disk stalls the whole consensus thread now, not only openraft's
//! core. The core already waited out every fsync (above), and it is the
//! core that sends heartbeats and checks the election timeout; what waits
//! too now is the rest of the thread: the replication tasks, the peer port,
//! the state-machine task and the batcher. A leader whose fsync takes
//! longer than the election timeout so sends nothing, answers no peer and
//! applies nothing meanwhile, and its followers elect another leader, as
//! etcd's do when its raft loop blocks in its WAL's fsync; a follower
//! stalled so answers its leader late, and may start an election of its
//! own once the sync returns, as before. The client connections run on the
//! server's runtime and keep being served (what needs the consensus waits
//! for it). A failed write or sync marks the log failed (`Wal::sync`) and
//! openraft's core stops on the error, as on the writer thread.
//!
//! A node whose consensus tasks share the caller's runtime (`--threads 1`,
//! one thread for the client connections too) keeps the writer thread: an
//! fsync there would freeze every client connection.

use super::committed::CommittedSlot;
use super::disk::Disk;
use super::error::DiskError;
use super::format::Batch;
use super::written::Then;
use crate::engine::raft::types::{LogId, TypeConfig};
use openraft::storage::LogFlushed;
use std::sync::{Arc, Mutex, MutexGuard};

/// The log's files, written by whoever calls. The mutex is only ever taken
/// on the consensus thread (openraft's core, and the committed id's wait,
/// a task beside it), so it never waits; it is there because that task
/// needs the log too, and holds it only weakly, so that dropping the store
/// closes the log at once.
pub(crate) struct Inline(Arc<Mutex<Disk>>);

impl Inline {
    pub(crate) fn new(disk: Disk) -> Inline {
        Inline(Arc::new(Mutex::new(disk)))
    }

    /// Writes and syncs `entries`, then calls `callback`, before it returns.
    ///
    /// # Errors
    /// An earlier write panicked (a write or sync that fails is reported
    /// to `callback`).
    pub(crate) fn append(
        &self,
        entries: Vec<(LogId, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), DiskError> {
        let mut disk = lock(&self.0)?;
        disk.append(vec![(entries, callback)]);
        disk.idle();
        Ok(())
    }

    /// Writes the committed id in `slot` within the slot's wait: with the
    /// next append if one comes, else on its own. Not waited for.
    ///
    /// # Errors
    /// None: the result matches the writer thread's.
    pub(crate) fn write_committed(&self, slot: &CommittedSlot) -> Result<(), DiskError> {
        let disk = Arc::downgrade(&self.0);
        slot.write_after_wait(async move {
            // Gone: the store was dropped, and its drop wrote the value.
            if let Some(disk) = disk.upgrade() {
                if let Ok(mut disk) = lock(&disk) {
                    disk.committed();
                }
            }
        });
        Ok(())
    }

    /// Writes and syncs `batch`, then applies `then`. `purged`: see
    /// [`Disk::change`].
    ///
    /// # Errors
    /// The write or sync failed, now or before, or an earlier write
    /// panicked.
    pub(crate) fn write(
        &self,
        batch: Batch,
        then: Then,
        purged: Option<u64>,
    ) -> Result<(), DiskError> {
        let mut disk = lock(&self.0)?;
        let result = disk.change(batch, then, purged);
        disk.idle();
        result
    }
}

/// The log, unless a write panicked while it held it: what reached the
/// disk then is unknown, as after a failed write, so nothing more is.
fn lock(disk: &Mutex<Disk>) -> Result<MutexGuard<'_, Disk>, DiskError> {
    disk.lock().map_err(|_| {
        DiskError::Io(std::io::Error::other(
            "an earlier raft log write panicked; the node must restart to write again",
        ))
    })
}
