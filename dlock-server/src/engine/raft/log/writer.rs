//! The log's one writer: a thread that writes every change to the log's
//! files (`wal`) in the order it was asked for, and makes appends that
//! queue up behind each other durable with one `fdatasync`.
//!
//! An append returns to openraft as soon as its entries are queued (they
//! are readable from then on through [`Pending`]); the writer calls
//! openraft's flush callback once the sync after their write returned, so
//! a busy node writes many entries per sync. (openraft 0.9 waits for that
//! callback before it takes its next write; the cluster's `batcher` is what
//! puts concurrent commands into one entry.) Every other change (vote,
//! truncation, purge, the committed id) goes through the same queue, which
//! keeps openraft's rule that storage writes complete in order.

use super::error::DiskError;
use super::format::Batch;
use super::segment::Loc;
use super::Wal;
use crate::engine::raft::types::{LogId, TypeConfig, Vote};
use openraft::storage::LogFlushed;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Queued changes at most; openraft waits when it is full.
const QUEUE: usize = 1024;
/// How long a committed id saved waits for an append to carry it before it
/// is written on its own (see [`CommittedSlot`]).
const COMMITTED_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Appends grouped into one write at most: bounds one write's size.
const GROUP: usize = 256;

/// What the log holds on disk, as the writer last made durable (or, for the
/// committed id, last wrote): what readers see besides [`Pending`].
#[derive(Default)]
pub(crate) struct Written {
    /// Every entry not purged, by index.
    pub(crate) entries: BTreeMap<u64, Loc>,
    /// The last vote saved.
    pub(crate) vote: Option<Vote>,
    /// The last committed id saved.
    pub(crate) committed: Option<LogId>,
    /// The last purged entry's id.
    pub(crate) purged: Option<LogId>,
}

/// [`Written`], shared by the writer and the readers.
#[derive(Clone, Default)]
pub(crate) struct Shared(Arc<Mutex<Written>>);

impl Shared {
    pub(crate) fn new(written: Written) -> Shared {
        Shared(Arc::new(Mutex::new(written)))
    }

    pub(crate) fn from_arc(written: Arc<Mutex<Written>>) -> Shared {
        Shared(written)
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<Mutex<Written>> {
        Arc::downgrade(&self.0)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Written> {
        // Plain data, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a change does to [`Written`] once it is written.
pub(crate) type Then = Box<dyn FnOnce(&mut Written) + Send>;

/// The latest committed id saved and not yet written, shared by the store
/// and the writer. openraft saves one after every commit, and a write of
/// its own per save woke the writer thread once more per commit on every
/// node. Instead the next append writes it in the same batch (and the same
/// sync), and only one that no append carried within [`COMMITTED_WAIT`]
/// is queued for a write of its own: while that wait or write is pending,
/// later saves only replace the value.
#[derive(Clone, Default)]
pub(crate) struct CommittedSlot(Arc<Mutex<SlotState>>);

#[derive(Default)]
struct SlotState {
    latest: Option<Option<LogId>>,
    /// A wait or a write for the slot is pending.
    queued: bool,
}

impl CommittedSlot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // Two plain fields, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `id` to be written; true when no write is queued yet, so the
    /// caller must queue one.
    pub(crate) fn put(&self, id: Option<LogId>) -> bool {
        let mut s = self.lock();
        s.latest = Some(id);
        !std::mem::replace(&mut s.queued, true)
    }

    fn take(&self) -> Option<Option<LogId>> {
        let mut s = self.lock();
        s.queued = false;
        s.latest.take()
    }

    /// The value saved and not written yet, if any.
    pub(crate) fn peek(&self) -> Option<Option<LogId>> {
        self.lock().latest
    }

    /// Takes the value for an append to carry, unless it points past
    /// `written_to` (the pending wait or write stays pending either way).
    fn take_within(&self, written_to: Option<u64>) -> Option<Option<LogId>> {
        let mut s = self.lock();
        match s.latest {
            Some(id) if points_past(id, written_to) => None,
            _ => s.latest.take(),
        }
    }

    /// At the end of the wait: true when a value is still unwritten (a
    /// write must be queued; it ends the pending state), else ends it.
    fn unwritten(&self) -> bool {
        let mut s = self.lock();
        if s.latest.is_none() {
            s.queued = false;
        }
        s.latest.is_some()
    }

    /// Gives back a value not written yet, unless a newer one came.
    fn put_back(&self, id: Option<LogId>) {
        self.lock().latest.get_or_insert(id);
    }
}

enum Op {
    /// Write what [`CommittedSlot`] holds (not synced).
    Committed,
    Append {
        entries: Vec<(LogId, Vec<u8>)>,
        callback: LogFlushed<TypeConfig>,
    },
    Write {
        batch: Batch,
        then: Then,
        /// A purge: segments at or below this index may go once it is durable.
        purged: Option<u64>,
        done: oneshot::Sender<Result<(), DiskError>>,
    },
}

/// Entries appended but not yet written, by index: readers see them as if
/// they were on disk.
#[derive(Clone, Default)]
pub(crate) struct Pending(Arc<Mutex<BTreeMap<u64, crate::engine::raft::types::Entry>>>);

impl Pending {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, crate::engine::raft::types::Entry>> {
        // Plain entries, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    /// Starts the writer thread for `wal`.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    /// `marker`, when given, is created (and synced) after the first
    /// durable write: see `log_store::WRITTEN_MARKER`.
    pub(crate) fn start(
        wal: Wal,
        shared: Shared,
        pending: Pending,
        slot: CommittedSlot,
        marker: Option<PathBuf>,
    ) -> Result<Writer, DiskError> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run(wal, &shared, &pending, &slot, rx, marker))
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

    /// Writes the committed id in `slot` within [`COMMITTED_WAIT`]: with
    /// the next append if one comes, else on its own (see
    /// [`CommittedSlot`]). Not waited for. The wait holds no sender, so it
    /// never keeps the writer from finishing.
    pub(crate) fn write_committed(&self, slot: &CommittedSlot) -> Result<(), DiskError> {
        let tx = self.tx.as_ref().ok_or_else(gone)?.downgrade();
        let slot = slot.clone();
        tokio::spawn(async move {
            tokio::time::sleep(COMMITTED_WAIT).await;
            if slot.unwritten() {
                if let Some(tx) = tx.upgrade() {
                    // Fails only when the writer is stopping.
                    let _ = tx.send(Op::Committed).await;
                }
            }
        });
        Ok(())
    }

    /// Writes and syncs `batch` after everything queued before it, and
    /// waits for that. `purged`: see [`Wal::drop_purged`].
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

/// Writes `batch`, and syncs it if `sync`: what a slow disk stalls is timed.
fn write(wal: &mut Wal, batch: Batch, sync: bool) -> Result<Vec<Loc>, DiskError> {
    let locs = wal.write(batch)?;
    if sync {
        let started = std::time::Instant::now();
        wal.sync()?;
        crate::ops::metrics::log_fsync(started.elapsed());
    }
    Ok(locs)
}

/// Writes the committed id `slot` holds, unsynced: the next append's sync
/// carries it. One that points past the entries written so far waits for a
/// later save (on openraft 0.9 it never does: openraft saves the committed
/// id only after the appends before it are flushed), so the record never
/// points past entries this node has on disk.
fn write_committed(wal: &mut Wal, shared: &Shared, slot: &CommittedSlot) {
    let Some(id) = slot.take() else {
        return;
    };
    if points_past(id, written_to(shared)) {
        slot.put_back(id);
        return;
    }
    let mut batch = Batch::default();
    let result = crate::engine::raft::encoding::encode(&id)
        .map_err(DiskError::from)
        .and_then(|bytes| batch.committed(bytes))
        .and_then(|()| write(wal, batch, false));
    match result {
        Ok(_) => shared.lock().committed = id,
        Err(e) => tracing::error!(error = %e, "cannot write to the raft log"),
    }
}

/// The last index the log holds on disk (or purged).
fn written_to(shared: &Shared) -> Option<u64> {
    let w = shared.lock();
    let last = w.entries.keys().next_back().copied();
    last.max(w.purged.map(|p| p.index))
}

/// Whether a committed id points past entries written up to `written_to`.
fn points_past(id: Option<LogId>, written_to: Option<u64>) -> bool {
    id.is_some_and(|id| written_to.is_none_or(|w| id.index > w))
}

/// Creates the marker once a write is durable; on failure keeps it for the
/// next one.
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

fn run(
    mut wal: Wal,
    shared: &Shared,
    pending: &Pending,
    slot: &CommittedSlot,
    mut rx: mpsc::Receiver<Op>,
    mut marker: Option<PathBuf>,
) {
    let mut next = None;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => match rx.try_recv() {
                Ok(op) => op,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Out of work: vouch for what the last sync covered
                    // (wal.rs, "sync marks"), unsynced, while nothing waits.
                    if let Err(e) = wal.mark_synced() {
                        tracing::error!(error = %e, "cannot write to the raft log");
                    }
                    match rx.blocking_recv() {
                        Some(op) => op,
                        None => {
                            write_committed(&mut wal, shared, slot);
                            return;
                        }
                    }
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    // Closing: what no append carried yet is written now.
                    write_committed(&mut wal, shared, slot);
                    return;
                }
            },
        };
        let (entries, callback) = match op {
            Op::Committed => {
                write_committed(&mut wal, shared, slot);
                continue;
            }
            Op::Write {
                batch,
                then,
                purged,
                done,
            } => {
                let result = write(&mut wal, batch, true).map(|_| ());
                if result.is_ok() {
                    then(&mut shared.lock());
                    mark_written(&mut marker);
                    if let Some(index) = purged {
                        if let Err(e) = wal.drop_purged(index) {
                            tracing::error!(error = %e, "cannot drop the purged raft log segments; nothing more is written");
                        }
                    }
                }
                // The waiter may be gone (openraft stopping).
                drop(done.send(result));
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
        let mut callbacks = Vec::with_capacity(group.len());
        let mut batch = Batch::default();
        let mut encoded = Ok(());
        let mut last = None;
        for (entries, callback) in group {
            for (id, bytes) in &entries {
                if encoded.is_ok() {
                    encoded = batch.entry(*id, bytes);
                }
                last = last.max(Some(id.index));
            }
            callbacks.push(callback);
        }
        // The committed id saved since the last write rides along, after
        // the entries (a torn write that keeps it keeps them too).
        let committed = slot.take_within(last.max(written_to(shared)));
        if let Some(id) = committed {
            if encoded.is_ok() {
                encoded = crate::engine::raft::encoding::encode(&id)
                    .map_err(DiskError::from)
                    .and_then(|bytes| batch.committed(bytes));
            }
        }
        let written = encoded.and_then(|()| write(&mut wal, batch, true));
        match written {
            Ok(locs) => {
                mark_written(&mut marker);
                if let Some(id) = committed {
                    shared.lock().committed = id;
                }
                let ids: Vec<LogId> = locs.iter().map(|l| l.id).collect();
                {
                    let mut written = shared.lock();
                    for loc in locs {
                        written.entries.insert(loc.id.index, loc);
                    }
                }
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
                if let Some(id) = committed {
                    slot.put_back(id);
                }
                for callback in callbacks {
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                }
            }
        }
    }
}
