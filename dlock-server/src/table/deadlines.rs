//! The table's two deadline heaps: when leases end and when wait limits
//! pass.
//!
//! Entries are removed lazily: a renewed lease or a granted waiter leaves a
//! stale entry that is skipped when it surfaces, and a heap is rebuilt when
//! its stale entries outnumber the live ones, so it stays proportional to
//! live state. Every entry is a tuple ordered in full (a lease by deadline,
//! then fence, then slot; a wait limit by deadline, then request), so the
//! order in which entries surface depends only on which entries there are,
//! not on the heap's layout: a heap rebuilt from a snapshot pops in the same
//! order as the one it was taken from.
//!
//! The heaps are kept in shared chunks (`chunks::Heap`), so a snapshot copies
//! them in microseconds under the lock, whatever the number of leases.

use super::chunks::Heap;
use super::{ReqId, Time};
use crate::table::keymap::Slot;

/// A lease entry: (deadline, fence, slot). The fence tells a live lease from
/// a stale entry, even after the slot has been reused by another key.
pub(super) type LeaseEntry = (Time, u64, Slot);

/// A wait-limit entry: (deadline, request).
pub(super) type TimeoutEntry = (Time, ReqId);

/// Heaps get rebuilt when they hold this many more entries than live ones;
/// the slack keeps rebuilds rare for small tables.
const HEAP_SLACK: usize = 64;

/// See the module documentation.
///
/// A clone shares the heaps' chunks (see `chunks::Heap`): it is how a snapshot
/// takes them.
#[derive(Debug, Default, Clone)]
pub(super) struct Deadlines {
    leases: Heap<LeaseEntry>,
    timeouts: Heap<TimeoutEntry>,
}

impl Deadlines {
    /// Heaps holding exactly these entries.
    pub(super) fn from_entries(leases: Vec<LeaseEntry>, timeouts: Vec<TimeoutEntry>) -> Self {
        Deadlines {
            leases: leases.into_iter().collect(),
            timeouts: timeouts.into_iter().collect(),
        }
    }

    pub(super) fn push_lease(&mut self, entry: LeaseEntry) {
        self.leases.push(entry);
    }

    pub(super) fn push_timeout(&mut self, entry: TimeoutEntry) {
        self.timeouts.push(entry);
    }

    /// Removes and returns the earliest lease entry due at `now`.
    pub(super) fn pop_lease_due(&mut self, now: Time) -> Option<LeaseEntry> {
        let &entry = self.leases.peek()?;
        (entry.0 <= now).then(|| {
            self.leases.pop();
            entry
        })
    }

    /// Removes and returns the earliest wait-limit entry due at `now`.
    pub(super) fn pop_timeout_due(&mut self, now: Time) -> Option<TimeoutEntry> {
        let &entry = self.timeouts.peek()?;
        (entry.0 <= now).then(|| {
            self.timeouts.pop();
            entry
        })
    }

    /// The earliest deadline of either kind, stale entries included (an
    /// early wake-up that finds nothing to do is harmless).
    pub(super) fn next(&self) -> Option<Time> {
        let lease = self.leases.peek().map(|(t, _, _)| *t);
        let timeout = self.timeouts.peek().map(|(t, _)| *t);
        match (lease, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Entries in both heaps, live and stale.
    pub(super) fn len(&self) -> usize {
        self.leases.len() + self.timeouts.len()
    }

    /// Forgets every wait limit: nobody waits any more.
    pub(super) fn clear_timeouts(&mut self) {
        self.timeouts.clear();
    }

    /// Rebuilds a heap once its stale entries outnumber live ones, so memory
    /// stays proportional to live leases and waiters. The counts decide when,
    /// the predicates which entries stay.
    pub(super) fn compact(
        &mut self,
        live_leases: usize,
        waiters: usize,
        lease_is_live: impl Fn(&LeaseEntry) -> bool,
        timeout_is_live: impl Fn(ReqId) -> bool,
    ) {
        if self.leases.len() > 2 * live_leases + HEAP_SLACK {
            self.leases.retain(lease_is_live);
        }
        if self.timeouts.len() > 2 * waiters + HEAP_SLACK {
            self.timeouts.retain(|(_, r)| timeout_is_live(*r));
        }
    }

    /// Every entry in the heaps' own order, without copying them: enough
    /// for a snapshot, since entries surface by value, not by layout.
    pub(super) fn iter(
        &self,
    ) -> (
        impl Iterator<Item = &LeaseEntry>,
        impl Iterator<Item = &TimeoutEntry>,
    ) {
        (self.leases.iter(), self.timeouts.iter())
    }

    /// How many entries each heap holds, stale ones included.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.leases.len(), self.timeouts.len())
    }

    /// Every entry, sorted: the heaps' contents without their layout.
    pub(super) fn entries(&self) -> (Vec<LeaseEntry>, Vec<TimeoutEntry>) {
        let mut leases: Vec<LeaseEntry> = self.leases.iter().copied().collect();
        let mut timeouts: Vec<TimeoutEntry> = self.timeouts.iter().copied().collect();
        leases.sort_unstable();
        timeouts.sort_unstable();
        (leases, timeouts)
    }
}
