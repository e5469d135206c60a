//! The table's internal invariants, checked by tests, by the fuzz harness
//! after every step, and by [`LockTable::restore`] on every snapshot it is
//! given.

use super::mode::{same_kind, Holds};
use super::{LockTable, Mode};
use std::collections::BTreeSet;

impl LockTable {
    /// Checks the table's internal invariants. Returns a description of the
    /// first violation found, in a deterministic order.
    ///
    /// # Errors
    /// The first invariant that does not hold.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.sessions.check()?;
        for (owner, req) in self.sessions.remembered_waits() {
            if self.waiters.get(&req).is_none_or(|w| w.owner != owner) {
                return Err(format!(
                    "session {owner} remembers request {req} as waiting"
                ));
            }
        }
        if self.sessions.required {
            if let Some(o) = self.owners.keys().find(|o| !self.sessions.is_open(**o)) {
                return Err(format!("owner {o} has state but no open session"));
            }
        }
        let (lease_entries, timeout_entries) = self.deadlines.entries();
        let lease_entries: BTreeSet<_> = lease_entries.into_iter().collect();
        let timeout_entries: BTreeSet<_> = timeout_entries.into_iter().collect();
        let mut held = 0;
        let mut leases = 0;
        for (slot, k, s) in self.keys.iter_slots() {
            if s.holds.is_free() && s.queue.is_empty() {
                return Err(format!("free key {k:?} still has state"));
            }
            if let Holds::Shared(sh) = &s.holds {
                if sh.limit != 0 && sh.holders.len() > sh.limit as usize {
                    return Err(format!("{k:?} has more shared holders than its limit"));
                }
                if sh.holders.iter().any(|(o, h)| *o != h.owner) {
                    return Err(format!(
                        "a shared hold of {k:?} is filed under another owner"
                    ));
                }
                if !sh.indexed() {
                    return Err(format!("the fence index of {k:?} is off"));
                }
            }
            if let (Some(l), Some(Mode::Shared { limit })) =
                (s.queue.shared_limit(), s.holds.mode())
            {
                if l != limit {
                    return Err(format!(
                        "{k:?} is waited for under limit {l}, held under {limit}"
                    ));
                }
            }
            for h in s.holds.iter() {
                held += 1;
                if h.fence >= self.next_fence {
                    return Err(format!("key {k:?} has fence {} not below next", h.fence));
                }
                match h.lease {
                    Some(t) => {
                        leases += 1;
                        if !lease_entries.contains(&(t, h.fence, slot)) {
                            return Err(format!("lease of {k:?} has no deadline entry"));
                        }
                    }
                    None => {
                        let bound = self
                            .owners
                            .get(&h.owner)
                            .is_some_and(|o| o.bound.contains(k));
                        if !bound {
                            return Err(format!(
                                "connection-bound key {k:?} missing from its owner"
                            ));
                        }
                    }
                }
            }
            for r in s.queue.iter() {
                let w = self
                    .waiters
                    .get(r)
                    .ok_or(format!("queue of {k:?} has gone request {r}"))?;
                if !w.keys.contains(k) {
                    return Err(format!("request {r} queued on {k:?} it did not ask for"));
                }
                let mode = w.mode(k);
                if s.queue.mode_of(r) != Some(mode) {
                    return Err(format!("request {r} queued on {k:?} in another mode"));
                }
                if let Mode::Shared { limit } = mode {
                    if s.queue.shared_limit() != Some(limit) {
                        return Err(format!("request {r} shares {k:?} under another limit"));
                    }
                }
                if let Some(held) = s.holds.of(w.owner).and(s.holds.mode()) {
                    if !same_kind(held, mode) {
                        return Err(format!(
                            "owner {} holds and waits for {k:?} in two modes",
                            w.owner
                        ));
                    }
                }
            }
            if let Some(front) = s.queue.first() {
                if self.grantable(*front) {
                    return Err(format!("request {front} is grantable but waits on {k:?}"));
                }
            }
        }
        if held != self.held_keys || leases != self.live_leases {
            return Err(format!(
                "counters off: held {held} vs {}, leases {leases} vs {}",
                self.held_keys, self.live_leases
            ));
        }
        if self.closed && !self.waiters.is_empty() {
            return Err("a closed table has waiting requests".into());
        }
        for (r, w) in &self.waiters {
            if *r >= self.next_req {
                return Err(format!("waiter {r} not below the next request id"));
            }
            if !w.keys.windows(2).all(|p| p[0] < p[1]) || w.keys.is_empty() {
                return Err(format!("waiter {r} has unsorted, repeated or no keys"));
            }
            let shared = &w.sharing.keys;
            if !shared.windows(2).all(|p| p[0] < p[1])
                || shared.iter().any(|k| w.keys.binary_search(k).is_err())
            {
                return Err(format!("waiter {r} shares keys unsorted or not its own"));
            }
            for k in &w.keys {
                let queued = self.keys.get(k).is_some_and(|s| s.queue.contains(r));
                if !queued {
                    return Err(format!("waiter {r} missing from queue of {k:?}"));
                }
            }
            if !self
                .owners
                .get(&w.owner)
                .is_some_and(|o| o.waiting.contains(r))
            {
                return Err(format!("waiter {r} missing from its owner"));
            }
            if let Some(t) = w.deadline {
                if !timeout_entries.contains(&(t, *r)) {
                    return Err(format!("wait limit of {r} has no deadline entry"));
                }
            }
        }
        for (o, st) in &self.owners {
            if st.bound.is_empty() && st.waiting.is_empty() {
                return Err(format!("owner {o} has empty state"));
            }
            if !st.waiting.windows(2).all(|p| p[0] < p[1]) {
                return Err(format!("owner {o} lists its requests out of order"));
            }
            for r in &st.waiting {
                if self.waiters.get(r).is_none_or(|w| w.owner != *o) {
                    return Err(format!("owner {o} lists request {r} it does not have"));
                }
            }
            for k in &st.bound {
                let ok = self
                    .keys
                    .get(k)
                    .and_then(|s| s.holds.of(*o))
                    .is_some_and(|h| h.lease.is_none());
                if !ok {
                    return Err(format!("owner {o} lists {k:?} it does not hold"));
                }
            }
        }
        Ok(())
    }
}
