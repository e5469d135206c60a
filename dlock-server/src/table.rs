//! The lock table: every rule of who holds which key lives here.
//!
//! It is a synchronous state machine. It does no I/O, spawns nothing and reads
//! no clock: time comes in as an argument and what happened (a grant, a wait
//! timeout, an expired lease) comes out as values for the caller to deliver.
//! That keeps the server's mutex short, makes the rules testable without a
//! network, and lets the same table later be driven by a replicated log.
//!
//! Waiting is FIFO per key. A request that cannot be granted at once is
//! appended to the queue of every key it names, all in one step, so all queues
//! agree on one arrival order. A waiter is granted when, for each of its keys,
//! the key is free and the waiter is first in that key's queue (or the key is
//! already held by the waiter's own owner). Because the queues agree on one
//! order, the earliest waiter is never blocked by a later one: there is no
//! deadlock between overlapping key sets and no overtaking. The one exception
//! is for an owner that already holds keys: see `free_for_newcomer`.
//!
//! Leases and wait limits are kept in two min-heaps keyed by deadline. Entries
//! are removed lazily (a renewed lease or a granted waiter leaves a stale entry
//! that is skipped when it surfaces) and the heaps are rebuilt when stale
//! entries outnumber live ones, so they stay proportional to live state. Every
//! operation costs time in the number of keys it names (plus the log of the
//! heap size), never in the number of keys or connections the table holds.

use crate::keymap::{KeyMap, Slot};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A lock name. Shared between the key map, the queues and the heaps.
pub type Key = Arc<str>;

/// Who holds or waits: one id per client connection, never reused.
pub type OwnerId = u64;

/// A waiting request, as returned by [`LockTable::lock`].
pub type ReqId = u64;

/// How long a Lock request may wait for busy keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Do not wait: answer at once.
    No,
    /// Wait without limit.
    Forever,
    /// Wait until this instant.
    Until(Instant),
}

/// Server-wide limits the table enforces.
#[derive(Debug, Clone, Copy)]
pub struct TableLimits {
    /// Requests waiting at once, over all connections.
    pub max_waiters: usize,
    /// Keys held at once, over all connections.
    pub max_held_keys: usize,
}

/// What became of a Lock request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockResult {
    /// All keys are now held under this fencing token.
    Granted {
        /// The fencing token of the grant.
        fence: u64,
    },
    /// The request waits; its outcome comes later as a [`Woken`].
    Waiting(ReqId),
    /// `Wait::No` and these keys were not available.
    Busy(Vec<Key>),
    /// The named limit would be exceeded; nothing changed.
    LimitReached(&'static str),
}

/// The outcome of a request that had to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// The request holds its keys under this fencing token.
    Granted {
        /// The fencing token of the grant.
        fence: u64,
    },
    /// The wait limit passed; these keys were still unavailable.
    TimedOut(Vec<Key>),
    /// Granting it would have exceeded the held-keys limit; it was withdrawn.
    LimitReached,
}

/// A waiting request that finished, for the caller to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Woken {
    /// The request, as returned in [`LockResult::Waiting`].
    pub req: ReqId,
    /// Its owner.
    pub owner: OwnerId,
    /// The keys it asked for, without duplicates.
    pub keys: Vec<Key>,
    /// What happened to it.
    pub wake: Wake,
}

/// The answer to Unlock and Renew: which named keys were not held, and which
/// waiters a release let in.
#[derive(Debug, Default)]
pub struct ReleaseResult {
    /// Named keys the caller did not hold; all others were acted on.
    pub not_held: Vec<Key>,
    /// Waiters granted or timed out as a consequence.
    pub woken: Vec<Woken>,
}

/// What [`LockTable::advance`] did.
#[derive(Debug, Default)]
pub struct Advanced {
    /// Waiters granted or timed out.
    pub woken: Vec<Woken>,
    /// Number of keys whose lease ran out.
    pub expired_leases: usize,
}

/// What [`LockTable::disconnect`] did.
#[derive(Debug, Default)]
pub struct Disconnected {
    /// The owner's waiting requests, withdrawn without an answer.
    pub withdrawn: Vec<ReqId>,
    /// Other owners' waiters granted as a consequence.
    pub woken: Vec<Woken>,
}

/// A snapshot of one key, for Inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    /// Holder's owner and fencing token, if the key is held.
    pub holder: Option<(OwnerId, u64)>,
    /// Time left on the holder's lease, if it has one.
    pub lease_remaining: Option<Duration>,
    /// Requests waiting for the key.
    pub waiters: usize,
}

#[derive(Debug, Clone)]
struct Hold {
    owner: OwnerId,
    fence: u64,
    lease: Option<Instant>,
}

#[derive(Debug, Default)]
struct KeyState {
    hold: Option<Hold>,
    /// Waiting requests. Request ids only grow, so id order is arrival
    /// order, and removing any waiter costs O(log n).
    queue: Queue,
}

/// A key's waiting requests. Most held keys have none, so the set is boxed
/// and allocated only when someone waits: an empty queue costs 8 bytes, not
/// the 24 of an inline set, which adds up over millions of held keys.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)] // The box is the point: see above.
struct Queue(Option<Box<BTreeSet<ReqId>>>);

impl Queue {
    fn insert(&mut self, req: ReqId) {
        self.0.get_or_insert_with(Default::default).insert(req);
    }

    fn remove(&mut self, req: &ReqId) {
        if let Some(set) = &mut self.0 {
            set.remove(req);
            if set.is_empty() {
                self.0 = None;
            }
        }
    }

    fn first(&self) -> Option<&ReqId> {
        self.0.as_ref().and_then(|s| s.first())
    }

    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    fn contains(&self, req: &ReqId) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(req))
    }

    fn iter(&self) -> impl Iterator<Item = &ReqId> {
        self.0.iter().flat_map(|s| s.iter())
    }
}

#[derive(Debug)]
struct Waiter {
    owner: OwnerId,
    keys: Vec<Key>,
    lease: Option<Duration>,
}

/// Per-owner state: what must go when the connection ends.
#[derive(Debug, Default)]
struct OwnerState {
    /// Keys held without a lease, released on disconnect.
    bound: HashSet<Key>,
    /// Requests still waiting.
    waiting: Vec<ReqId>,
}

/// Heaps get rebuilt when they hold this many more entries than live ones;
/// the slack keeps rebuilds rare for small tables.
const HEAP_SLACK: usize = 64;

/// The lock table. See the module documentation for the rules.
#[derive(Debug)]
pub struct LockTable {
    limits: TableLimits,
    keys: KeyMap<KeyState>,
    waiters: HashMap<ReqId, Waiter>,
    owners: HashMap<OwnerId, OwnerState>,
    /// (deadline, fence, slot): the fence tells a live lease from a stale
    /// entry, even after the slot has been reused by another key.
    leases: BinaryHeap<Reverse<(Instant, u64, Slot)>>,
    live_leases: usize,
    timeouts: BinaryHeap<Reverse<(Instant, ReqId)>>,
    held_keys: usize,
    next_fence: u64,
    next_req: ReqId,
}

impl LockTable {
    /// An empty table whose first fencing token will be `first_fence`
    /// (at least 1: 0 means "no token" on the wire).
    pub fn new(limits: TableLimits, first_fence: u64) -> Self {
        LockTable {
            limits,
            keys: KeyMap::default(),
            waiters: HashMap::new(),
            owners: HashMap::new(),
            leases: BinaryHeap::new(),
            live_leases: 0,
            timeouts: BinaryHeap::new(),
            held_keys: 0,
            next_fence: first_fence.max(1),
            next_req: 1,
        }
    }

    /// The token the next grant will get; every token issued so far is lower.
    pub fn next_fence(&self) -> u64 {
        self.next_fence
    }

    /// Keys currently held.
    pub fn held_keys(&self) -> usize {
        self.held_keys
    }

    /// Requests currently waiting.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Entries in the deadline heaps, live and stale: stays within a small
    /// multiple of live leases plus waiters. For tests and metrics.
    pub fn deadline_entries(&self) -> usize {
        self.leases.len() + self.timeouts.len()
    }

    /// Keys with any state (held or waited for). Free keys have none.
    pub fn tracked_keys(&self) -> usize {
        self.keys.len()
    }

    /// Asks for all of `keys` at once for `owner`.
    ///
    /// Duplicate keys are folded. Keys the owner already holds count as
    /// available, and are re-granted under the new token and lease. `lease`
    /// of `None` means the keys are held until unlocked or until the owner
    /// disconnects.
    pub fn lock(
        &mut self,
        owner: OwnerId,
        mut keys: Vec<Key>,
        wait: Wait,
        lease: Option<Duration>,
        now: Instant,
    ) -> LockResult {
        keys.sort_unstable();
        keys.dedup();
        let unavailable: Vec<Key> = keys
            .iter()
            .filter(|k| !self.free_for_newcomer(k, owner))
            .cloned()
            .collect();
        if unavailable.is_empty() {
            // Checked only here: a waiter's later grant is bounded by
            // max_waiters times the per-request key limit.
            let newly_held = keys
                .iter()
                .filter(|k| self.holder(k) != Some(owner))
                .count();
            if self.held_keys + newly_held > self.limits.max_held_keys {
                return LockResult::LimitReached("held keys");
            }
            let fence = self.grant(owner, &keys, lease, now);
            return LockResult::Granted { fence };
        }
        let deadline = match wait {
            Wait::No => return LockResult::Busy(unavailable),
            Wait::Until(t) if t <= now => return LockResult::Busy(unavailable),
            Wait::Until(t) => Some(t),
            Wait::Forever => None,
        };
        if self.waiters.len() >= self.limits.max_waiters {
            return LockResult::LimitReached("waiters");
        }
        let req = self.next_req;
        self.next_req += 1;
        for k in &keys {
            self.keys.get_or_default(k).1.queue.insert(req);
        }
        self.owners.entry(owner).or_default().waiting.push(req);
        if let Some(t) = deadline {
            self.timeouts.push(Reverse((t, req)));
        }
        self.waiters.insert(req, Waiter { owner, keys, lease });
        self.compact_heaps();
        LockResult::Waiting(req)
    }

    /// Releases the named keys held by `owner`, or, when `fence` is given,
    /// held under that token by any owner.
    pub fn unlock(
        &mut self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        now: Instant,
    ) -> ReleaseResult {
        let mut result = ReleaseResult::default();
        let mut work = Vec::new();
        for k in dedup(keys) {
            if self.is_held_by(&k, owner, fence) {
                self.release(&k);
                work.push(k);
            } else {
                result.not_held.push(k);
            }
        }
        self.pump(work, now, &mut result.woken);
        result
    }

    /// Sets the lease of the named held keys to `now + lease` (see
    /// [`LockTable::unlock`] for which keys count as held). A key held without
    /// a lease becomes a lease and so outlives its connection.
    pub fn renew(
        &mut self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        lease: Duration,
        now: Instant,
    ) -> ReleaseResult {
        let mut result = ReleaseResult::default();
        let deadline = now + lease;
        for k in dedup(keys) {
            if !self.is_held_by(&k, owner, fence) {
                result.not_held.push(k);
                continue;
            }
            let Some(slot) = self.keys.slot(&k) else {
                continue;
            };
            let Some(hold) = self.keys.at_mut(slot).and_then(|s| s.hold.as_mut()) else {
                continue;
            };
            let was_bound = hold.lease.is_none();
            hold.lease = Some(deadline);
            let (fence, holder) = (hold.fence, hold.owner);
            if was_bound {
                self.live_leases += 1;
                if let Some(o) = self.owners.get_mut(&holder) {
                    o.bound.remove(&k);
                }
                self.forget_owner_if_idle(holder);
            }
            self.leases.push(Reverse((deadline, fence, slot)));
        }
        self.compact_heaps();
        result
    }

    /// Ends everything `owner` has that is tied to its connection: its
    /// waiting requests are withdrawn (never granted) and its keys held
    /// without a lease are released. Leases stay until they expire.
    pub fn disconnect(&mut self, owner: OwnerId, now: Instant) -> Disconnected {
        let mut out = Disconnected::default();
        let Some(state) = self.owners.remove(&owner) else {
            return out;
        };
        let mut work = Vec::new();
        for req in state.waiting {
            if let Some(w) = self.waiters.remove(&req) {
                self.dequeue(req, &w.keys, &mut work);
                out.withdrawn.push(req);
            }
        }
        for k in state.bound {
            self.release(&k);
            work.push(k);
        }
        self.pump(work, now, &mut out.woken);
        self.compact_heaps();
        out
    }

    /// Withdraws every waiting request, for a server that is stopping: no
    /// waiter is granted afterwards, whoever releases what. Returns the
    /// withdrawn requests.
    pub fn withdraw_all(&mut self) -> Vec<ReqId> {
        let reqs: Vec<ReqId> = self.waiters.keys().copied().collect();
        // Nobody is left to pump keys to.
        let mut fronts_changed = Vec::new();
        for &req in &reqs {
            if let Some(w) = self.waiters.remove(&req) {
                self.dequeue(req, &w.keys, &mut fronts_changed);
                if let Some(o) = self.owners.get_mut(&w.owner) {
                    o.waiting.clear();
                }
                self.forget_owner_if_idle(w.owner);
            }
        }
        self.timeouts.clear();
        reqs
    }

    /// The earliest instant at which [`LockTable::advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let lease = self.leases.peek().map(|Reverse((t, _, _))| *t);
        let timeout = self.timeouts.peek().map(|Reverse((t, _))| *t);
        match (lease, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Expires the leases and wait limits due at `now`. Leases go first, so a
    /// waiter whose limit falls at the same instant a lease ends gets the key.
    pub fn advance(&mut self, now: Instant) -> Advanced {
        let mut out = Advanced::default();
        let mut work = Vec::new();
        while let Some(Reverse((t, fence, slot))) = self.leases.peek().copied() {
            if t > now {
                break;
            }
            self.leases.pop();
            let expired = self.keys.at(slot).and_then(|(k, s)| {
                s.hold
                    .as_ref()
                    .filter(|h| h.fence == fence && h.lease == Some(t))
                    .map(|_| k.clone())
            });
            if let Some(key) = expired {
                self.release(&key);
                work.push(key);
                out.expired_leases += 1;
            }
        }
        self.pump(work, now, &mut out.woken);
        while let Some(Reverse((t, req))) = self.timeouts.peek().copied() {
            if t > now {
                break;
            }
            self.timeouts.pop();
            let Some(w) = self.waiters.remove(&req) else {
                continue;
            };
            let busy = w
                .keys
                .iter()
                .filter(|k| !self.available_to_waiter(k, w.owner, req))
                .cloned()
                .collect();
            if let Some(o) = self.owners.get_mut(&w.owner) {
                o.waiting.retain(|r| *r != req);
            }
            let mut work = Vec::new();
            self.dequeue(req, &w.keys, &mut work);
            out.woken.push(Woken {
                req,
                owner: w.owner,
                keys: w.keys,
                wake: Wake::TimedOut(busy),
            });
            self.pump(work, now, &mut out.woken);
            self.forget_owner_if_idle(w.owner);
        }
        self.compact_heaps();
        out
    }

    /// What the table knows of `key` at `now`.
    pub fn inspect(&self, key: &str, now: Instant) -> KeyView {
        let state = self.keys.get(key);
        let hold = state.and_then(|s| s.hold.as_ref());
        KeyView {
            holder: hold.map(|h| (h.owner, h.fence)),
            lease_remaining: hold
                .and_then(|h| h.lease)
                .map(|t| t.saturating_duration_since(now)),
            waiters: state.map_or(0, |s| s.queue.len()),
        }
    }

    /// Checks the table's internal invariants; used by tests and the torture
    /// checker. Returns a description of the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut held = 0;
        let mut leases = 0;
        for (k, s) in self.keys.iter() {
            if s.hold.is_none() && s.queue.is_empty() {
                return Err(format!("free key {k:?} still has state"));
            }
            if let Some(h) = &s.hold {
                held += 1;
                if h.fence >= self.next_fence {
                    return Err(format!("key {k:?} has fence {} not below next", h.fence));
                }
                match h.lease {
                    Some(_) => leases += 1,
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
        for (r, w) in &self.waiters {
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
        }
        for (o, st) in &self.owners {
            if st.bound.is_empty() && st.waiting.is_empty() {
                return Err(format!("owner {o} has empty state"));
            }
            for k in &st.bound {
                let ok = self
                    .keys
                    .get(k)
                    .and_then(|s| s.hold.as_ref())
                    .is_some_and(|h| h.owner == *o && h.lease.is_none());
                if !ok {
                    return Err(format!("owner {o} lists {k:?} it does not hold"));
                }
            }
        }
        Ok(())
    }

    fn holder(&self, key: &str) -> Option<OwnerId> {
        self.keys
            .get(key)
            .and_then(|s| s.hold.as_ref())
            .map(|h| h.owner)
    }

    fn is_held_by(&self, key: &str, owner: OwnerId, fence: Option<u64>) -> bool {
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
    fn free_for_newcomer(&self, key: &str, owner: OwnerId) -> bool {
        match self.keys.get(key) {
            None => true,
            Some(s) => match &s.hold {
                Some(h) => h.owner == owner,
                None => s.queue.iter().all(|r| self.waits_for_owner(*r, owner)),
            },
        }
    }

    /// Whether waiting request `req` needs a key that `owner` holds.
    fn waits_for_owner(&self, req: ReqId, owner: OwnerId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.owner != owner && w.keys.iter().any(|k| self.holder(k) == Some(owner))
        })
    }

    /// A queued request may take `key`: the owner holds it already, or it is
    /// free and the request is first in line.
    fn available_to_waiter(&self, key: &str, owner: OwnerId, req: ReqId) -> bool {
        match self.keys.get(key) {
            None => false,
            Some(s) => match &s.hold {
                Some(h) => h.owner == owner,
                None => s.queue.first() == Some(&req),
            },
        }
    }

    fn grantable(&self, req: ReqId) -> bool {
        self.waiters.get(&req).is_some_and(|w| {
            w.keys
                .iter()
                .all(|k| self.available_to_waiter(k, w.owner, req))
        })
    }

    /// Gives `keys` to `owner` under a new token.
    fn grant(
        &mut self,
        owner: OwnerId,
        keys: &[Key],
        lease: Option<Duration>,
        now: Instant,
    ) -> u64 {
        let fence = self.next_fence;
        self.next_fence += 1;
        let deadline = lease.map(|d| now + d);
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
                    self.leases.push(Reverse((t, fence, slot)));
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

    /// Clears the hold on `key`; the caller pumps the key afterwards.
    fn release(&mut self, key: &Key) {
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
    /// go to `work` for pumping.
    fn dequeue(&mut self, req: ReqId, keys: &[Key], work: &mut Vec<Key>) {
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
    /// changed. A waiter is usually first in a queue; the exception is a key
    /// its own owner holds, so after each grant the owner's other waiting
    /// requests are checked too.
    fn pump(&mut self, mut work: Vec<Key>, now: Instant, woken: &mut Vec<Woken>) {
        let mut candidates: Vec<ReqId> = Vec::new();
        loop {
            let req = if let Some(r) = candidates.pop() {
                r
            } else if let Some(k) = work.pop() {
                let Some(state) = self.keys.get(&k) else {
                    continue;
                };
                match state.queue.first() {
                    Some(&front) => front,
                    None => {
                        if state.hold.is_none() {
                            self.keys.remove(&k);
                        }
                        continue;
                    }
                }
            } else {
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
                candidates.extend(o.waiting.iter().rev().copied());
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
                    wake: Wake::LimitReached,
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
                wake: Wake::Granted { fence },
            });
        }
    }

    fn forget_owner_if_idle(&mut self, owner: OwnerId) {
        if self
            .owners
            .get(&owner)
            .is_some_and(|o| o.bound.is_empty() && o.waiting.is_empty())
        {
            self.owners.remove(&owner);
        }
    }

    /// Rebuilds a heap once stale entries outnumber live ones, so memory
    /// stays proportional to live leases and waiters.
    fn compact_heaps(&mut self) {
        if self.leases.len() > 2 * self.live_leases + HEAP_SLACK {
            let keys = &self.keys;
            self.leases.retain(|Reverse((t, f, slot))| {
                keys.at(*slot)
                    .and_then(|(_, s)| s.hold.as_ref())
                    .is_some_and(|h| h.fence == *f && h.lease == Some(*t))
            });
        }
        if self.timeouts.len() > 2 * self.waiters.len() + HEAP_SLACK {
            let waiters = &self.waiters;
            self.timeouts
                .retain(|Reverse((_, r))| waiters.contains_key(r));
        }
    }
}

fn dedup(mut keys: Vec<Key>) -> Vec<Key> {
    keys.sort_unstable();
    keys.dedup();
    keys
}
