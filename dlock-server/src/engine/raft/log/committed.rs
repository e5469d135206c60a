//! The committed id saved and not yet written ([`CommittedSlot`]), and the
//! wait after which it is written on its own if no append carried it.

use crate::engine::raft::types::LogId;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

/// How long a committed id saved waits for an append to carry it before it
/// is written on its own (see [`CommittedSlot`]).
const COMMITTED_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The latest committed id saved and not yet written, shared by the store
/// and the log's writes. openraft saves one after every commit, and a write
/// of its own per save woke the writer thread once more per commit on
/// every node. Instead the next append writes it in the same batch (and the
/// same sync), and only one that no append carried within
/// [`COMMITTED_WAIT`] is written on its own: while that wait or write is
/// pending, later saves only replace the value.
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

    /// Keeps `id` to be written; true when no write is pending yet, so the
    /// caller must start one ([`CommittedSlot::write_after_wait`]).
    pub(crate) fn put(&self, id: Option<LogId>) -> bool {
        let mut s = self.lock();
        s.latest = Some(id);
        !std::mem::replace(&mut s.queued, true)
    }

    /// Takes the value to write on its own; ends the pending state.
    pub(crate) fn take(&self) -> Option<Option<LogId>> {
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
    pub(crate) fn take_within(&self, written_to: Option<u64>) -> Option<Option<LogId>> {
        let mut s = self.lock();
        match s.latest {
            Some(id) if points_past(id, written_to) => None,
            _ => s.latest.take(),
        }
    }

    /// At the end of the wait: true when a value is still unwritten (a
    /// write must follow; it ends the pending state), else ends it.
    fn unwritten(&self) -> bool {
        let mut s = self.lock();
        if s.latest.is_none() {
            s.queued = false;
        }
        s.latest.is_some()
    }

    /// Gives back a value not written yet, unless a newer one came.
    pub(crate) fn put_back(&self, id: Option<LogId>) {
        self.lock().latest.get_or_insert(id);
    }

    /// Runs `write` (which writes the slot's value on its own) after
    /// [`COMMITTED_WAIT`], unless an append carried the value meanwhile.
    /// Spawned on the caller's runtime, not waited for. `write` should hold
    /// the log only weakly, so that the wait never keeps it open.
    pub(crate) fn write_after_wait<F>(&self, write: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let slot = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(COMMITTED_WAIT).await;
            if slot.unwritten() {
                write.await;
            }
        });
    }
}

/// Whether a committed id points past entries written up to `written_to`.
pub(crate) fn points_past(id: Option<LogId>, written_to: Option<u64>) -> bool {
    id.is_some_and(|id| written_to.is_none_or(|w| id.index > w))
}
