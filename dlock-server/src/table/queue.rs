//! A key's waiting requests, in arrival order, with how each takes the key.

use super::mode::Mode;
use super::ReqId;
use std::collections::BTreeMap;

/// A key's waiting requests. Request ids only grow, so id order is arrival
/// order, and removing any waiter costs O(log n).
///
/// Most held keys have no waiters, so the queue is boxed and allocated only
/// when someone waits: an empty queue costs 8 bytes, which adds up over
/// millions of held keys.
#[derive(Debug, Default, Clone)]
pub(super) struct Queue(Option<Box<Inner>>);

#[derive(Debug, Default, Clone)]
struct Inner {
    reqs: BTreeMap<ReqId, Mode>,
    /// How many of `reqs` are shared: they all agree on one limit, and a
    /// newcomer learns it here without a walk over the queue.
    shared: usize,
    /// The limit the shared ones agree on, while there are any.
    limit: u32,
}

impl Queue {
    pub(super) fn insert(&mut self, req: ReqId, mode: Mode) {
        let inner = self.0.get_or_insert_with(Default::default);
        if inner.reqs.insert(req, mode).is_none() {
            if let Mode::Shared { limit } = mode {
                inner.shared += 1;
                inner.limit = limit;
            }
        }
    }

    pub(super) fn remove(&mut self, req: &ReqId) {
        if let Some(inner) = &mut self.0 {
            if let Some(Mode::Shared { .. }) = inner.reqs.remove(req) {
                inner.shared -= 1;
            }
            if inner.reqs.is_empty() {
                self.0 = None;
            }
        }
    }

    pub(super) fn first(&self) -> Option<&ReqId> {
        self.0.as_ref().and_then(|s| s.reqs.keys().next())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.reqs.len())
    }

    pub(super) fn contains(&self, req: &ReqId) -> bool {
        self.0.as_ref().is_some_and(|s| s.reqs.contains_key(req))
    }

    /// How `req` waits, if it does.
    pub(super) fn mode_of(&self, req: &ReqId) -> Option<Mode> {
        self.0.as_ref().and_then(|s| s.reqs.get(req).copied())
    }

    /// The limit the shared waiters agree on, if any waits shared.
    pub(super) fn shared_limit(&self) -> Option<u32> {
        self.0
            .as_ref()
            .and_then(|s| (s.shared > 0).then_some(s.limit))
    }

    /// The waiting requests, earliest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &ReqId> {
        self.0.iter().flat_map(|s| s.reqs.keys())
    }
}

impl FromIterator<(ReqId, Mode)> for Queue {
    fn from_iter<I: IntoIterator<Item = (ReqId, Mode)>>(iter: I) -> Self {
        let mut q = Queue::default();
        for (req, mode) in iter {
            q.insert(req, mode);
        }
        q
    }
}
