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
//! The sync mark that vouches for what a sync covered (wal.rs, "sync
//! marks") is not written after every change, as the writer thread does
//! when it runs out of work: the next write carries it in front of its own
//! records, in the same `pwrite`, and only a log that stays unwritten for
//! [`MARK_WAIT`] gets one on its own. Written by the caller the log is
//! "out of work" after every change, so a mark of its own cost one more
//! `pwrite` per append on every node (issue 44; BENCHMARKS.md, "the sync
//! mark carried by the next write"). The mark was never synced: a power cut
//! could always lose it, and then only what it vouches for is checked less
//! strictly, so a wait of the same order as the committed id's changes
//! what can be lost by nothing.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long the log may go without a write before the sync mark the last
/// write left due is written on its own.
const MARK_WAIT: Duration = Duration::from_millis(50);

/// The log's files, written by whoever calls. The mutex is only ever taken
/// on the consensus thread (openraft's core, and the committed id's wait,
/// a task beside it), so it never waits; it is there because that task
/// needs the log too, and holds it only weakly, so that dropping the store
/// closes the log at once.
pub(crate) struct Inline {
    disk: Arc<Mutex<Disk>>,
    /// A wait for the sync mark is pending ([`Inline::mark_later`]).
    mark_queued: Arc<AtomicBool>,
}

impl Inline {
    pub(crate) fn new(disk: Disk) -> Inline {
        Inline {
            disk: Arc::new(Mutex::new(disk)),
            mark_queued: Arc::new(AtomicBool::new(false)),
        }
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
        lock(&self.disk)?.append(vec![(entries, callback)]);
        self.mark_later();
        Ok(())
    }

    /// Writes the committed id in `slot` within the slot's wait: with the
    /// next append if one comes, else on its own. Not waited for.
    ///
    /// # Errors
    /// None: the result matches the writer thread's.
    pub(crate) fn write_committed(&self, slot: &CommittedSlot) -> Result<(), DiskError> {
        let disk = Arc::downgrade(&self.disk);
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
        let result = lock(&self.disk)?.change(batch, then, purged);
        self.mark_later();
        result
    }

    /// Has the sync mark the last write left due written after
    /// [`MARK_WAIT`], unless a write carries it first (then the wait finds
    /// nothing due). One wait at a time: under load a write comes long
    /// before it ends, so it costs a timer per [`MARK_WAIT`], not per write.
    fn mark_later(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to wait on (not the case on a node): mark now.
            if let Ok(mut disk) = lock(&self.disk) {
                disk.idle();
            }
            return;
        };
        if self.mark_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let disk = Arc::downgrade(&self.disk);
        let queued = Arc::clone(&self.mark_queued);
        runtime.spawn(async move {
            tokio::time::sleep(MARK_WAIT).await;
            // Before the mark: a write from now on needs a wait of its own.
            queued.store(false, Ordering::Release);
            // Gone: the store was dropped, and its drop wrote the mark.
            if let Some(disk) = disk.upgrade() {
                if let Ok(mut disk) = lock(&disk) {
                    disk.idle();
                }
            }
        });
    }

    /// Whether a sync mark is due and not written yet.
    #[cfg(test)]
    fn mark_due(&self) -> bool {
        lock(&self.disk).is_ok_and(|disk| disk.mark_due())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::raft::log::written::{Pending, Shared};
    use crate::engine::raft::log::Wal;
    use crate::engine::raft::types::Vote;

    fn vote(term: u64) -> Batch {
        let mut batch = Batch::default();
        batch
            .vote(crate::engine::raft::encoding::encode(&Vote::new(term, 1)).expect("encode"))
            .expect("vote");
        batch
    }

    /// The mark a write leaves due is not written at once: the next write
    /// carries it, and a log left alone gets it after [`MARK_WAIT`].
    #[tokio::test(start_paused = true)]
    async fn the_sync_mark_rides_with_the_next_write_or_follows_on_its_own() {
        let dir = tempfile::tempdir().expect("dir");
        let (wal, _) = Wal::open(dir.path()).expect("open");
        let inline = Inline::new(Disk::new(
            wal,
            Shared::default(),
            Pending::default(),
            CommittedSlot::default(),
            None,
        ));
        inline
            .write(vote(1), Box::new(|_| {}), None)
            .expect("vote 1");
        assert!(inline.mark_due(), "no write of its own right after a sync");
        tokio::time::sleep(MARK_WAIT / 2).await;
        inline
            .write(vote(2), Box::new(|_| {}), None)
            .expect("vote 2");
        assert!(inline.mark_due(), "vote 2's sync is not vouched for yet");
        // The wait vote 1 started (one at a time) marks vote 2's sync.
        tokio::time::sleep(MARK_WAIT / 2 + Duration::from_millis(1)).await;
        assert!(!inline.mark_due(), "left alone, the log gets its mark");
        // A write after that wait ended starts a wait of its own.
        inline
            .write(vote(3), Box::new(|_| {}), None)
            .expect("vote 3");
        assert!(inline.mark_due());
        tokio::time::sleep(MARK_WAIT + Duration::from_millis(1)).await;
        assert!(!inline.mark_due(), "vote 3's sync is marked too");
        drop(inline);
        let (_wal, r) = Wal::open(dir.path()).expect("reopens");
        assert_eq!(r.vote, Some(Vote::new(3, 1)));
    }
}
