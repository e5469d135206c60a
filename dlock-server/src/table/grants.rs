//! Who may take a key, and handing keys on: the availability rules, the
//! grant itself, and `grant_waiters`, run when keys change.

use super::mode::same_kind;
use super::{
    Hold, Key, KeyState, LockResult, LockTable, Mode, OwnerId, ReqId, Sharing, Time, WaitOutcome,
    Woken,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

impl LockTable {
    /// Whether `owner` holds `key`, in any mode.
    pub(super) fn holds_key(&self, key: &str, owner: OwnerId) -> bool {
        self.keys
            .get(key)
            .is_some_and(|s| s.holds.of(owner).is_some())
    }

    /// Who holds `key` as an Unlock or Renew names it: under token `fence`
    /// when one is given (any owner), otherwise `owner` itself.
    pub(super) fn holding(&self, key: &str, owner: OwnerId, fence: Option<u64>) -> Option<OwnerId> {
        let holds = &self.keys.get(key)?.holds;
        match fence {
            Some(f) => holds.with_fence(f).map(|h| h.owner),
            None => holds.of(owner).map(|h| h.owner),
        }
    }

    /// Why a Lock by `owner` must be refused before anything else: it asks
    /// for a key in another mode than the owner holds or waits for it in
    /// (an upgrade from shared to exclusive among them), or shares a key
    /// under another limit than its shared holders and waiters agreed on.
    pub(super) fn refuse_modes(
        &self,
        owner: OwnerId,
        keys: &[Key],
        sharing: &Sharing,
    ) -> Option<LockResult> {
        let mut conflicts = Vec::new();
        let mut mismatches = Vec::new();
        let waiting = self.owners.get(&owner).map_or(&[][..], |o| &o.waiting[..]);
        for k in keys {
            let mode = sharing.mode(k);
            let state = self.keys.get(k);
            let held = state
                .and_then(|s| s.holds.of(owner))
                .and(state.and_then(|s| s.holds.mode()));
            // An owner's requests are few (its pipeline), so this walk
            // stays short.
            let waited = waiting
                .iter()
                .filter_map(|r| self.waiters.get(r))
                .filter(|w| w.keys.binary_search(k).is_ok())
                .map(|w| w.mode(k));
            if held.into_iter().chain(waited).any(|m| !same_kind(m, mode)) {
                conflicts.push(k.clone());
            } else if let Mode::Shared { limit } = mode {
                if state
                    .and_then(KeyState::agreed_limit)
                    .is_some_and(|l| l != limit)
                {
                    mismatches.push(k.clone());
                }
            }
        }
        if !conflicts.is_empty() {
            Some(LockResult::ModeConflict(conflicts))
        } else if !mismatches.is_empty() {
            Some(LockResult::LimitMismatch(mismatches))
        } else {
            None
        }
    }

    /// A new request may take `key` in `mode` at once: the owner holds it
    /// already (in that mode: see `refuse_modes`), or the holders admit one
    /// more and everyone waiting for it waits for a key this owner holds.
    /// The exception keeps a holder that asks for one more key from
    /// deadlocking with a waiter that wants both: the waiter cannot go
    /// before the holder releases anyway, and the holder's requests run in
    /// order, so its release would otherwise be stuck behind its own waiting
    /// Lock.
    pub(super) fn free_for_newcomer(&self, key: &str, owner: OwnerId, mode: Mode) -> bool {
        match self.keys.get(key) {
            None => true,
            Some(s) if s.holds.of(owner).is_some() => true,
            Some(s) => {
                s.holds.admits(mode) && s.queue.iter().all(|r| self.waits_for_owner(*r, owner))
            }
        }
    }

    /// Whether waiting request `req` is kept waiting by a key that `owner`
    /// holds: it needs the key in a mode the holders do not admit now. A
    /// reader waiting behind a writer is not kept waiting by another
    /// reader's hold, so that hold gives the other reader no exception.
    pub(super) fn waits_for_owner(&self, req: ReqId, owner: OwnerId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.owner != owner
                && w.keys.iter().any(|k| {
                    self.keys.get(k).is_some_and(|s| {
                        s.holds.of(owner).is_some()
                            && s.holds.of(w.owner).is_none()
                            && !s.holds.admits(w.mode(k))
                    })
                })
        })
    }

    /// A queued request may take `key` in `mode`: the owner holds it
    /// already, or the request is first in line and the holders admit it.
    /// Shared requests that reach the front one after another are so
    /// granted one after another.
    pub(super) fn available_to_waiter(
        &self,
        key: &str,
        owner: OwnerId,
        req: ReqId,
        mode: Mode,
    ) -> bool {
        match self.keys.get(key) {
            None => false,
            Some(s) if s.holds.of(owner).is_some() => true,
            Some(s) => s.queue.first() == Some(&req) && s.holds.admits(mode),
        }
    }

    pub(super) fn grantable(&self, req: ReqId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.keys
                .iter()
                .all(|k| self.available_to_waiter(k, w.owner, req, w.mode(k)))
        })
    }

    /// Gives `keys` to `owner` under a new token.
    pub(super) fn grant(
        &mut self,
        owner: OwnerId,
        keys: &[Key],
        sharing: &Sharing,
        lease: Option<Duration>,
        value: &[u8],
        now: Time,
    ) -> u64 {
        let fence = self.next_fence;
        self.next_fence += 1;
        let deadline = lease.map(|d| now.saturating_add(d));
        let owner_state = self.owners.entry(owner).or_default();
        for k in keys {
            let (slot, state) = self.keys.get_or_default(k);
            let hold = Hold {
                owner,
                fence,
                lease: deadline,
                value: value.into(),
                since: now,
            };
            let previous = state.holds.put(hold, sharing.mode(k));
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
        self.note_taker(owner, fence, keys);
        self.compact_heaps();
        fence
    }

    /// Clears `owner`'s hold on `key`; the caller passes the key to
    /// `grant_waiters` afterwards.
    pub(super) fn release(&mut self, key: &Key, owner: OwnerId) {
        let Some(hold) = self.keys.get_mut(key).and_then(|s| s.holds.take(owner)) else {
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
                if s.holds.is_free() && s.queue.is_empty() {
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
                        if state.holds.is_free() {
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
                .filter(|k| !self.holds_key(k, w.owner))
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
            let fence = self.grant(w.owner, &w.keys, &w.sharing, w.lease, &w.value, now);
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
                    .and_then(|(_, s)| s.holds.with_fence(f))
                    .is_some_and(|h| h.lease == Some(t))
            },
            |r| waiters.contains_key(&r),
        );
    }
}
