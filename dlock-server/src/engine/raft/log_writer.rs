//! The log store's one writer: a thread that commits every change to
//! `raft.redb` in the order it was asked for, and commits appends that
//! queue up behind each other in one transaction (one fsync for many).
//!
//! An append returns to openraft as soon as its entries are queued (they
//! are readable from then on through [`Pending`]); the writer calls
//! openraft's flush callback once the commit holding them returned, which
//! with `Durability::Immediate` is after the fsync, so a busy node writes
//! many entries per fsync. (openraft 0.9 waits for that callback before it
//! takes its next write; the cluster's `batcher` is what puts concurrent
//! commands into one entry.) Every other change (vote,
//! truncation, purge) goes through the same queue and is awaited, which
//! keeps openraft's rule that storage writes complete in order.

use super::disk::{redb, DiskError, LOG};
use super::types::{Entry, LogId, TypeConfig};
use openraft::storage::LogFlushed;
use redb::{Database, Durability, WriteTransaction};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Queued changes at most; openraft waits when it is full.
const QUEUE: usize = 1024;
/// Appends grouped into one commit at most: bounds one transaction's size.
const GROUP: usize = 256;

/// A change to run in a write transaction of its own.
pub(crate) type Change = Box<dyn FnOnce(&WriteTransaction) -> Result<(), DiskError> + Send>;

enum Op {
    Append {
        entries: Vec<(LogId, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    },
    Write {
        durability: Durability,
        change: Change,
        done: oneshot::Sender<Result<(), DiskError>>,
    },
}

/// Entries appended but not yet committed, by index: readers see them as if
/// they were in the file.
#[derive(Clone, Default)]
pub(crate) struct Pending(Arc<Mutex<BTreeMap<u64, Entry>>>);

impl Pending {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        // Plain entries, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The handle to the writer thread; dropping it lets the thread finish
/// what is queued and waits for it, so the file is closed afterwards.
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
    /// Starts the writer thread for `db`.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    /// `marker`, when given, is created (and synced) after the first
    /// commit: see `log_store::WRITTEN_MARKER`.
    pub(crate) fn start(
        db: Arc<Database>,
        pending: Pending,
        marker: Option<PathBuf>,
    ) -> Result<Writer, DiskError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(&db, &pending, rx, marker))
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
        tx.send(Op::Append { entries, callback })
            .await
            .map_err(|_| gone())
    }

    /// Queues `change` to run in a transaction of its own, after everything
    /// queued before it, without waiting for it; a failure is logged.
    pub(crate) async fn write_detached(
        &self,
        durability: Durability,
        change: Change,
    ) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        let (done, _) = oneshot::channel();
        tx.send(Op::Write {
            durability,
            change,
            done,
        })
        .await
        .map_err(|_| gone())
    }

    /// Runs `change` in a transaction of its own, after everything queued
    /// before it, and waits for its commit.
    pub(crate) async fn write(
        &self,
        durability: Durability,
        change: Change,
    ) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?;
        let (done, result) = oneshot::channel();
        tx.send(Op::Write {
            durability,
            change,
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
            // Only what is already queued is left: at most a commit or two.
            if thread.join().is_err() {
                tracing::error!("the raft log writer thread panicked");
            }
        }
    }
}

fn commit(db: &Database, durability: Durability, change: Change) -> Result<(), DiskError> {
    let durable = matches!(durability, Durability::Immediate);
    let mut txn = db.begin_write().map_err(redb)?;
    txn.set_durability(durability);
    change(&txn)?;
    let started = std::time::Instant::now();
    txn.commit().map_err(redb)?;
    if durable {
        // The commit of a durable transaction is its fsync, give or take
        // the page writes before it: what a slow disk stalls.
        crate::ops::metrics::log_fsync(started.elapsed());
    }
    Ok(())
}

/// Creates the marker once a commit succeeded; on failure keeps it for the
/// next commit.
fn mark_written(marker: &mut Option<PathBuf>) {
    let Some(path) = marker.take() else {
        return;
    };
    let written = std::fs::File::create(&path)
        .and_then(|f| f.sync_all())
        .and_then(|()| match path.parent() {
            // The new name must be durable too.
            Some(dir) => std::fs::File::open(dir).and_then(|d| d.sync_all()),
            None => Ok(()),
        });
    if let Err(e) = written {
        tracing::warn!(error = %e, path = %path.display(), "cannot create the log's written-marker; will retry");
        *marker = Some(path);
    }
}

fn run(db: &Database, pending: &Pending, mut rx: mpsc::Receiver<Op>, mut marker: Option<PathBuf>) {
    let mut next = None;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => match rx.blocking_recv() {
                Some(op) => op,
                None => return,
            },
        };
        let (entries, callback) = match op {
            Op::Write {
                durability,
                change,
                done,
            } => {
                let result = commit(db, durability, change);
                if result.is_ok() {
                    mark_written(&mut marker);
                }
                if let Err(Err(e)) = done.send(result) {
                    // Nobody waits for this one (see `write_detached`).
                    tracing::error!(error = %e, "cannot write to the raft log");
                }
                continue;
            }
            Op::Append { entries, callback } => (entries, callback),
        };
        let mut group = vec![(entries, callback)];
        while group.len() < GROUP {
            match rx.try_recv() {
                Ok(Op::Append { entries, callback }) => group.push((entries, callback)),
                Ok(other) => {
                    next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let ids: Vec<LogId> = group
            .iter()
            .flat_map(|(entries, _)| entries.iter().map(|(id, _)| *id))
            .collect();
        let mut callbacks = Vec::with_capacity(group.len());
        let mut all = Vec::new();
        for (entries, callback) in group {
            all.extend(entries);
            callbacks.push(callback);
        }
        let written = commit(
            db,
            Durability::Immediate,
            Box::new(move |txn| {
                let mut log = txn.open_table(LOG).map_err(redb)?;
                for (id, bytes) in &all {
                    log.insert(id.index, bytes.as_slice()).map_err(redb)?;
                }
                Ok(())
            }),
        );
        match written {
            Ok(()) => {
                mark_written(&mut marker);
                {
                    let mut pending = pending.lock();
                    for id in ids {
                        // Unless a later append already replaced it.
                        if pending.get(&id.index).is_some_and(|e| e.log_id == id) {
                            pending.remove(&id.index);
                        }
                    }
                }
                // Only now is the append on disk.
                for callback in callbacks {
                    callback.log_io_completed(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the raft log");
                for callback in callbacks {
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                }
            }
        }
    }
}
