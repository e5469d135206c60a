//! The log's writes as they reach its files ([`Disk`]): each change
//! written, and synced (but for the committed id), on the thread that
//! calls, in the order called; what readers see updated once it is durable;
//! openraft's flush callbacks called after the sync. Both ways of writing
//! the log do it through these: the writer thread (`writer.rs`) for what it
//! takes off its queue, and openraft's core itself on a node whose
//! consensus tasks have a thread of their own (`inline.rs`).

use super::committed::{points_past, CommittedSlot};
use super::error::DiskError;
use super::format::Batch;
use super::segment::Loc;
use super::written::{Pending, Shared, Then};
use super::Wal;
use crate::engine::raft::types::{LogId, TypeConfig};
use openraft::storage::LogFlushed;
use std::path::PathBuf;

/// One append: its entries, encoded, and openraft's callback, called once
/// they are on disk (or failed).
pub(crate) type Append = (Vec<(LogId, Vec<u8>)>, LogFlushed<TypeConfig>);

/// The open log and what its writes update. Dropping it writes the
/// committed id no append carried yet, then closes the log (which releases
/// its lock).
pub(crate) struct Disk {
    wal: Wal,
    shared: Shared,
    pending: Pending,
    slot: CommittedSlot,
    /// Created (and synced) after the first durable write: see
    /// `store::WRITTEN_MARKER`.
    marker: Option<PathBuf>,
}

impl Disk {
    pub(crate) fn new(
        wal: Wal,
        shared: Shared,
        pending: Pending,
        slot: CommittedSlot,
        marker: Option<PathBuf>,
    ) -> Disk {
        Disk {
            wal,
            shared,
            pending,
            slot,
            marker,
        }
    }

    /// Writes and syncs `batch` (a vote, a truncation, a purge), then
    /// applies `then` to what readers see. `purged`: segments at or below
    /// this index are deleted once the batch is durable (see
    /// [`Wal::drop_purged`]).
    ///
    /// # Errors
    /// The write or the sync failed, now or before: the log writes nothing
    /// more (see [`Wal::sync`]).
    pub(crate) fn change(
        &mut self,
        batch: Batch,
        then: Then,
        purged: Option<u64>,
    ) -> Result<(), DiskError> {
        write(&mut self.wal, batch, true)?;
        then(&mut self.shared.lock());
        mark_written(&mut self.marker);
        if let Some(index) = purged {
            if let Err(e) = self.wal.drop_purged(index) {
                tracing::error!(error = %e, "cannot drop the purged raft log segments; nothing more is written");
            }
        }
        Ok(())
    }

    /// Writes the entries of `group`, in order, with one write and one
    /// sync, and the committed id saved since the last write after them;
    /// then calls each append's callback: with `Ok` once the sync returned,
    /// else with the error (openraft's core then stops).
    pub(crate) fn append(&mut self, group: Vec<Append>) {
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
        let committed = self.slot.take_within(last.max(self.shared.written_to()));
        if let Some(id) = committed {
            if encoded.is_ok() {
                encoded = crate::engine::raft::encoding::encode(&id)
                    .map_err(DiskError::from)
                    .and_then(|bytes| batch.committed(bytes));
            }
        }
        let written = encoded.and_then(|()| write(&mut self.wal, batch, true));
        match written {
            Ok(locs) => {
                mark_written(&mut self.marker);
                let ids: Vec<LogId> = locs.iter().map(|l| l.id).collect();
                {
                    let mut written = self.shared.lock();
                    if let Some(id) = committed {
                        written.committed = id;
                    }
                    for loc in locs {
                        written.entries.insert(loc.id.index, loc);
                    }
                }
                {
                    let mut pending = self.pending.lock();
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
                    self.slot.put_back(id);
                }
                for callback in callbacks {
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                }
            }
        }
    }

    /// Writes the committed id the slot holds, unsynced: the next append's
    /// sync carries it. One that points past the entries written so far
    /// waits for a later save (on openraft 0.9 it never does: openraft
    /// saves the committed id only after the appends before it are
    /// flushed), so the record never points past entries this node has on
    /// disk.
    pub(crate) fn committed(&mut self) {
        let Some(id) = self.slot.take() else {
            return;
        };
        if points_past(id, self.shared.written_to()) {
            self.slot.put_back(id);
            return;
        }
        let mut batch = Batch::default();
        let result = crate::engine::raft::encoding::encode(&id)
            .map_err(DiskError::from)
            .and_then(|bytes| batch.committed(bytes))
            .and_then(|()| write(&mut self.wal, batch, false));
        match result {
            Ok(_) => self.shared.lock().committed = id,
            Err(e) => tracing::error!(error = %e, "cannot write to the raft log"),
        }
    }

    /// Nothing more to write for now: vouches for what the last sync
    /// covered (wal.rs, "sync marks") with a mark, unsynced, while nothing
    /// waits.
    pub(crate) fn idle(&mut self) {
        if let Err(e) = self.wal.mark_synced() {
            tracing::error!(error = %e, "cannot write to the raft log");
        }
    }

    /// Whether a sync mark is due and not written yet.
    #[cfg(test)]
    pub(crate) fn mark_due(&self) -> bool {
        self.wal.mark_due()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        // Closing: what no write carried yet is written now.
        self.committed();
        self.idle();
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
