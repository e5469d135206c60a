//! A key's waiting requests, in arrival order.

use super::ReqId;
use std::collections::BTreeSet;

/// A key's waiting requests. Request ids only grow, so id order is arrival
/// order, and removing any waiter costs O(log n).
///
/// Most held keys have no waiters, so the set is boxed and allocated only
/// when someone waits: an empty queue costs 8 bytes, not the 24 of an inline
/// set, which adds up over millions of held keys.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)] // The box is the point: see above.
pub(super) struct Queue(Option<Box<BTreeSet<ReqId>>>);

impl Queue {
    pub(super) fn insert(&mut self, req: ReqId) {
        self.0.get_or_insert_with(Default::default).insert(req);
    }

    pub(super) fn remove(&mut self, req: &ReqId) {
        if let Some(set) = &mut self.0 {
            set.remove(req);
            if set.is_empty() {
                self.0 = None;
            }
        }
    }

    pub(super) fn first(&self) -> Option<&ReqId> {
        self.0.as_ref().and_then(|s| s.first())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    pub(super) fn contains(&self, req: &ReqId) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(req))
    }

    /// The waiting requests, earliest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &ReqId> {
        self.0.iter().flat_map(|s| s.iter())
    }
}

impl FromIterator<ReqId> for Queue {
    fn from_iter<I: IntoIterator<Item = ReqId>>(iter: I) -> Self {
        let set: BTreeSet<ReqId> = iter.into_iter().collect();
        Queue((!set.is_empty()).then(|| Box::new(set)))
    }
}
