//! What readers of the log see: the entries, vote, committed and purged ids
//! on disk ([`Written`]), and the entries appended but not yet written
//! ([`Pending`]). The log's writes (`disk.rs`) update them once a change is
//! durable; openraft's reads and the replication tasks' (`store.rs`) read
//! them.

use super::segment::Loc;
use crate::engine::raft::types::{Entry, LogId, Vote};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the log holds on disk, as its writes last made durable (or, for
/// the committed id, last wrote): what readers see besides [`Pending`].
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

/// [`Written`], shared by the log's writes and its readers.
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

    /// The last index the log holds on disk (or purged).
    pub(crate) fn written_to(&self) -> Option<u64> {
        let w = self.lock();
        let last = w.entries.keys().next_back().copied();
        last.max(w.purged.map(|p| p.index))
    }
}

/// What a change does to [`Written`] once it is written.
pub(crate) type Then = Box<dyn FnOnce(&mut Written) + Send>;

/// Entries appended but not yet written, by index: readers see them as if
/// they were on disk. Only the writer thread leaves entries here; a log
/// written on the caller has them on disk before `append` returns.
#[derive(Clone, Default)]
pub(crate) struct Pending(Arc<Mutex<BTreeMap<u64, Entry>>>);

impl Pending {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        // Plain entries, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
