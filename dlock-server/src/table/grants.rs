//! Who may take a key, and handing keys on: the availability rules, the
//! grant itself, and `grant_waiters`, run when keys change.

use super::{Hold, Key, LockTable, OwnerId, ReqId, Time, WaitOutcome, Woken};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

impl LockTable {
    pub(super) fn holder(&self, key: &str) -> Option<OwnerId> {
        self.keys
            .get(key)
            .and_then(|s| s.hold.as_ref())
            .map(|h| h.owner)
    }

    pub(super) fn is_held_by(&self, key: &str, owner: OwnerId, fence: Option<u64>) -> bool {
        let hold = self.keys.get(key).and_then(|s| s.hold.as_ref());
        match (hold, fence) {
            (Some(h), Some(f)) => h.fence == f,
            (Some(h), None) => h.owner == owner,
            (None, _) => false,
        }
    }

    /// A new request may take `key` at once: the owner holds it already, or
    /// it is free and everyone waiting for it waits for a key this owner
    /// holds. The exception keeps a holder that asks for one more key from
    /// deadlocking with a waiter that wants both: the waiter cannot go before
    /// the holder releases anyway, and the holder's requests run in order, so
    /// its release would otherwise be stuck behind its own waiting Lock.
    pub(super) fn free_for_newcomer(&self, key: &str, owner: OwnerId) -> bool {
        match self.keys.get(key) {
            None => true,
            Some(s) => match &s.hold {
                Some(h) => h.owner == owner,
                None => s.queue.iter().all(|r| self.waits_for_owner(*r, owner)),
            },
        }
    }

    /// Whether waiting request `req` needs a key that `owner` holds.
    pub(super) fn waits_for_owner(&self, req: ReqId, owner: OwnerId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.owner != owner && w.keys.iter().any(|k| self.holder(k) == Some(owner))
        })
    }

    /// A queued request may take `key`: the owner holds it already, or it is
    /// free and the request is first in line.
    pub(super) fn available_to_waiter(&self, key: &str, owner: OwnerId, req: ReqId) -> bool {
        match self.keys.get(key) {
            None => false,
            Some(s) => match &s.hold {
                Some(h) => h.owner == owner,
                None => s.queue.first() == Some(&req),
            },
        }
    }

    pub(super) fn grantable(&self, req: ReqId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.keys
                .iter()
                .all(|k| self.available_to_waiter(k, w.owner, req))
        })
    }

    /// Gives `keys` to `owner` under a new token.
    pub(super) fn grant(
        &mut self,
        owner: OwnerId,
        keys: &[Key],
        lease: Option<Duration>,
        now: Time,
    ) -> u64 {
        let fence = self.next_fence;
        self.next_fence += 1;
        let deadline = lease.map(|d| now.saturating_add(d));
        let owner_state = self.owners.entry(owner).or_default();
        for k in keys {
            let (slot, state) = self.keys.get_or_default(k);
            let previous = state.hold.replace(Hold {
                owner,
                fence,
                lease: deadline,
            });
            match previous {
                None => self.held_keys += 1,
                Some(p) if p.lease.is_some() => self.live_leases -= 1,
                Some(_) => {}
            }
            match deadline {
                Some(t) => {
                    owner_state.bound.remove(k);
                    self.live_leases += 1;
                    self.deadlines.push_lease((t, fence, slot));
                }
                None => {
                    owner_state.bound.insert(k.clone());
                }
            }
        }
        self.forget_owner_if_idle(owner);
        self.compact_heaps();
        fence
    }

    /// Clears the hold on `key`; the caller passes the key to `grant_waiters` afterwards.
    pub(super) fn release(&mut self, key: &Key) {
        let Some(hold) = self.keys.get_mut(key).and_then(|s| s.hold.take()) else {
            return;
        };
        self.held_keys -= 1;
        if hold.lease.is_some() {
            self.live_leases -= 1;
        } else if let Some(o) = self.owners.get_mut(&hold.owner) {
            o.bound.remove(key);
            self.forget_owner_if_idle(hold.owner);
        }
    }

    /// Removes a withdrawn request from its queues; keys whose front changed
    /// go to `work` for `grant_waiters`.
    pub(super) fn dequeue(&mut self, req: ReqId, keys: &[Key], work: &mut Vec<Key>) {
        for k in keys {
            if let Some(s) = self.keys.get_mut(k) {
                if s.queue.first() == Some(&req) {
                    work.push(k.clone());
                }
                s.queue.remove(&req);
                if s.hold.is_none() && s.queue.is_empty() {
                    self.keys.remove(k);
                }
            }
        }
    }

    /// Grants every waiter that became grantable because the keys in `work`
    /// changed, earliest request first: when one change lets several
    /// waiters in, they get their tokens in arrival order. A waiter is
    /// usually first in a queue; the exception is a key its own owner holds,
    /// so after each grant the owner's other waiting requests are checked
    /// too.
    pub(super) fn grant_waiters(&mut self, mut work: Vec<Key>, now: Time, woken: &mut Vec<Woken>) {
        // A request can be pushed twice; the second pop finds it gone.
        let mut candidates: BinaryHeap<Reverse<ReqId>> = BinaryHeap::new();
        loop {
            for k in work.drain(..) {
                let Some(state) = self.keys.get(&k) else {
                    continue;
                };
                match state.queue.first() {
                    Some(&front) => candidates.push(Reverse(front)),
                    None => {
                        if state.hold.is_none() {
                            self.keys.remove(&k);
                        }
                    }
                }
            }
            let Some(Reverse(req)) = candidates.pop() else {
                break;
            };
            if !self.grantable(req) {
                continue;
            }
            let Some(w) = self.waiters.remove(&req) else {
                continue;
            };
            if let Some(o) = self.owners.get_mut(&w.owner) {
                o.waiting.retain(|r| *r != req);
                candidates.extend(o.waiting.iter().map(|&r| Reverse(r)));
            }
            let newly_held = w
                .keys
                .iter()
                .filter(|k| self.holder(k) != Some(w.owner))
                .count();
            if self.held_keys + newly_held > self.limits.max_held_keys {
                // Withdrawn like a timeout: the keys it queued on move on.
                self.dequeue(req, &w.keys, &mut work);
                self.forget_owner_if_idle(w.owner);
                woken.push(Woken {
                    req,
                    owner: w.owner,
                    keys: w.keys,
                    wake: WaitOutcome::LimitReached,
                });
                continue;
            }
            for key in &w.keys {
                if let Some(s) = self.keys.get_mut(key) {
                    s.queue.remove(&req);
                }
            }
            let fence = self.grant(w.owner, &w.keys, w.lease, now);
            work.extend(w.keys.iter().cloned());
            woken.push(Woken {
                req,
                owner: w.owner,
                keys: w.keys,
                wake: WaitOutcome::Granted { fence },
            });
        }
    }

    pub(super) fn forget_owner_if_idle(&mut self, owner: OwnerId) {
        if self
            .owners
            .get(&owner)
            .is_some_and(|o| o.bound.is_empty() && o.waiting.is_empty())
        {
            self.owners.remove(&owner);
        }
    }

    pub(super) fn compact_heaps(&mut self) {
        let (keys, waiters) = (&self.keys, &self.waiters);
        self.deadlines.compact(
            self.live_leases,
            waiters.len(),
            |&(t, f, slot)| {
                keys.at(slot)
                    .and_then(|(_, s)| s.hold.as_ref())
                    .is_some_and(|h| h.fence == f && h.lease == Some(t))
            },
            |r| waiters.contains_key(&r),
        );
    }
}
