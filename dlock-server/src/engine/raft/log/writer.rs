//! The log's writer thread: every change to the log's files, taken off a
//! queue in the order it was asked for and written there (`disk.rs`), with
//! appends that queued up behind each other made durable by one
//! `fdatasync`. Used where an fsync on the caller would stall more than
//! the consensus (`inline.rs` says where the caller writes instead).
//!
//! An append returns to openraft as soon as its entries are queued (they
//! are readable from then on through `Pending`); the writer calls
//! openraft's flush callback once the sync after their write returned.
//! (openraft 0.9 waits for that callback before it takes its next write;
//! the cluster's `batcher` is what puts concurrent commands into one
//! entry.) Every other change (vote, truncation, purge, the committed id)
//! goes through the same queue, which keeps openraft's rule that storage
//! writes complete in order.

use super::committed::CommittedSlot;
use super::disk::{Append, Disk};
use super::error::DiskError;
use super::format::Batch;
use super::written::Then;
use crate::engine::raft::types::{LogId, TypeConfig};
use openraft::storage::LogFlushed;
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Queued changes at most; openraft waits when it is full.
const QUEUE: usize = 1024;
/// Appends grouped into one write at most: bounds one write's size.
const GROUP: usize = 256;

enum Op {
    /// Write what [`CommittedSlot`] holds (not synced).
    Committed,
    Append(Append),
    Write {
        batch: Batch,
        then: Then,
        /// A purge: segments at or below this index may go once it is durable.
        purged: Option<u64>,
        done: oneshot::Sender<Result<(), DiskError>>,
    },
}

/// The handle to the writer thread; dropping it lets the thread finish
/// what is queued and waits for it, so the log is closed (and its lock
/// released) afterwards.
pub(crate) struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
}

/// The writer thread is gone (it only ends when its handle is dropped, or
/// when spawning it failed).
fn gone() -> DiskError {
    DiskError::Io(std::io::Error::other("the raft log writer has stopped"))
}

impl Writer {
    /// Starts the writer thread for `disk`.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub(crate) fn start(disk: Disk) -> Result<Writer, DiskError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(disk, rx))
            .map_err(DiskError::Io)?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues an append; `callback` is called once it is on disk (or failed).
    pub(crate) async fn append(
        &self,
        entries: Vec<(LogId, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        tx.send(Op::Append((entries, callback)))
            .await
            .map_err(|_| gone())
    }

    /// Writes the committed id in `slot` within the slot's wait: with the
    /// next append if one comes, else on its own. Not waited for. The
    /// wait holds no sender, so it never keeps the writer from finishing.
    pub(crate) fn write_committed(&self, slot: &CommittedSlot) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?.downgrade();
        slot.write_after_wait(async move {
            if let Some(tx) = tx.upgrade() {
                // Fails only when the writer is stopping.
                let _ = tx.send(Op::Committed).await;
            }
        });
        Ok(())
    }

    /// Writes and syncs `batch` after everything queued before it, and
    /// waits for that. `purged`: see [`Disk::change`].
    pub(crate) async fn write(
        &self,
        batch: Batch,
        then: Then,
        purged: Option<u64>,
    ) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        let (done, result) = oneshot::channel();
        tx.send(Op::Write {
            batch,
            then,
            purged,
            done,
        })
        .await
        .map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            // Only what is already queued is left: a write or two.
            if thread.join().is_err() {
                tracing::error!("the raft log writer thread panicked");
            }
        }
    }
}

/// The thread: takes each change off the queue in order, and appends
/// queued behind each other as one write. Ends when the queue closes;
/// dropping `disk` then writes what no append carried and closes the log.
fn run(mut disk: Disk, mut rx: mpsc::Receiver<Op>) {
    let mut next = None;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => match rx.try_recv() {
                Ok(op) => op,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Out of work.
                    disk.idle();
                    match rx.blocking_recv() {
                        Some(op) => op,
                        None => return,
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            },
        };
        match op {
            Op::Committed => disk.committed(),
            Op::Write {
                batch,
                then,
                purged,
                done,
            } => {
                // The waiter may be gone (openraft stopping).
                drop(done.send(disk.change(batch, then, purged)));
            }
            Op::Append(append) => {
                let mut group = vec![append];
                while group.len() < GROUP {
                    match rx.try_recv() {
                        Ok(Op::Append(append)) => group.push(append),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                disk.append(group);
            }
        }
    }
}
