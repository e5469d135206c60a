//! The lock table: every rule of who holds which key lives here.
//!
//! It is a synchronous, deterministic state machine. It does no I/O, spawns
//! nothing, reads no clock and draws no random numbers. Its input is one
//! [`Command`] at a time, applied by [`LockTable::apply`] together with the
//! command's [`Time`]; its output is an [`Output`] of values (a grant, a wait
//! timeout, an expired lease) for the caller to deliver. That keeps the
//! server's mutex short, makes the rules testable without a network, and
//! lets the same table be driven by a replicated log.
//!
//! # Determinism contract
//!
//! Two tables built by [`LockTable::new`] with the same limits and first
//! fencing token, or restored from equal [`Snapshot`]s, that are then given
//! the same commands with the same times, return equal outputs for every
//! command (the same grants, in the same order, with the same tokens) and
//! end with equal snapshots, on any machine. To keep it that way:
//!
//! - no iteration whose order can reach an output or a snapshot runs over a
//!   hashed collection: owners, waiters and an owner's keys are B-trees, and
//!   the key map's hash index is only ever looked up, never walked;
//! - time is a [`Time`] passed in, never read; wait limits and leases arrive
//!   as durations from the command's time;
//! - the deadline heaps order their entries in full (see `deadlines`), and
//!   key slots, which break ties between leases, are part of the snapshot;
//! - the first fencing token is part of the initial state, given to
//!   [`LockTable::new`] or carried by a snapshot.
//!
//! # Rules
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
//! A request may take any of its keys shared (see `mode`): a key is free
//! for it when nobody holds it, or when it is held shared under the same
//! limit with room for one more. The queue stays strict: a shared request
//! behind a waiting exclusive one waits, and shared requests that reach the
//! front one after another are granted one after another in the same
//! command. Every grant gets a fencing token of its own, so each shared
//! holder of a key has its own token.
//!
//! Leases and wait limits are kept in two min-heaps keyed by deadline (see
//! `deadlines`). Most commands cost time in the number of keys they name
//! plus the log of the heap size, whatever the number of keys or connections
//! the table holds; Disconnect and Close also touch what the departing owner
//! (or everyone) had.

mod busiest;
mod chunks;
mod command;
mod deadlines;
mod grants;
mod invariants;
pub mod keymap;
mod mode;
mod queue;
mod resend;
mod sessions;
mod snapshot;
mod takers;
mod tickets;
mod time;
mod value;

pub use busiest::Busy;
pub use command::{Command, LimitName, LockResult, Output, Reply, WaitOutcome, Woken};
pub use mode::{Mode, Sharing};
pub use resend::MAX_REMEMBERED;
pub use snapshot::{BadSnapshot, FrozenTable, LoadedSnapshot, Snapshot, SnapshotView};
pub use tickets::TicketState;
pub use time::Time;
pub use value::{FirstHolder, MAX_VALUE_LEN};

use deadlines::Deadlines;
pub use keymap::Key;
use keymap::KeyMap;
use mode::Holds;
use queue::Queue;
use serde::{Deserialize, Serialize};
use sessions::Sessions;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use takers::Takers;

/// Who holds or waits: one id per client connection, chosen by the caller
/// and never reused. The table needs no command to open an owner: one with
/// nothing held or waiting has no state.
pub type OwnerId = u64;

/// A waiting request, as returned in [`LockResult::Waiting`].
pub type ReqId = u64;

/// How long a Lock request may wait for busy keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitLimit {
    /// Do not wait: answer at once.
    No,
    /// Wait without limit.
    Forever,
    /// Wait this long after the command's time. A limit past the end of the
    /// timeline is no limit.
    For(Duration),
}

/// Server-wide limits the table enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLimits {
    /// Requests waiting at once, over all connections.
    pub max_waiters: usize,
    /// Holds at once, over all connections: a key held by three shared
    /// holders counts three.
    pub max_held_keys: usize,
}

/// What the table knows of one key, for Inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    /// Holder's owner and fencing token, if the key is held; of a key held
    /// shared, the holder with the highest token (the latest grant).
    pub holder: Option<(OwnerId, u64)>,
    /// Time left on that holder's lease, if it has one.
    pub lease_remaining: Option<Duration>,
    /// Requests waiting for the key.
    pub waiters: usize,
    /// How the key is held, if it is.
    pub mode: Option<Mode>,
    /// Every holder, in token order (one for a key held exclusively).
    pub holders: Vec<HolderView>,
    /// The value of the holder in `holder`, and how long it has held.
    pub value: Vec<u8>,
    /// How long the holder in `holder` has held the key (since its grant).
    pub held_for: Duration,
    /// How long the first request in the key's queue has waited (zero
    /// when none waits).
    pub waited_for: Duration,
    /// Holders left out of `holders` to keep within the budget
    /// [`LockTable::inspect_within`] was given: never the oldest, the
    /// latest or the caller's own.
    pub holders_omitted: usize,
}

/// The highest next fencing token a table may hold: tokens count up by one
/// per grant and must never wrap, so every source a table starts its
/// tokens from (a fence file, a snapshot, a restore's floor) stays in the
/// lower half of u64, which no real server grants its way out of.
pub const MAX_NEXT_FENCE: u64 = u64::MAX / 2;

/// What one listed holder costs an Inspect answer besides its value:
/// its token, lease and hold time, its connection's address (up to an
/// IPv6 address with a port), and the framing around them.
pub const HOLDER_COST: usize = 96;

/// One holder of a key, for Inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    /// Who holds it.
    pub owner: OwnerId,
    /// The token of its grant.
    pub fence: u64,
    /// Time left on its lease, if it has one.
    pub lease_remaining: Option<Duration>,
    /// The value it set (see `value`); empty when none.
    pub value: Vec<u8>,
    /// How long it has held the key (since its grant).
    pub held_for: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Hold {
    owner: OwnerId,
    fence: u64,
    lease: Option<Time>,
    /// The holder's value (see `value`): left out of the encoding when
    /// empty, and empty in older snapshots.
    #[serde(default, skip_serializing_if = "value::is_empty")]
    value: value::HoldValue,
    /// When it was granted; older snapshots, which did not keep it, read
    /// as the timeline's origin.
    #[serde(default)]
    since: Time,
}

/// A key's holders and waiters. Cloned only when a snapshot still shares
/// the chunk of slots it is in (see `keymap`).
#[derive(Debug, Default, Clone)]
struct KeyState {
    holds: Holds,
    queue: Queue,
}

impl KeyState {
    /// The limit the key's shared holders and waiters agree on, if any.
    fn agreed_limit(&self) -> Option<u32> {
        match self.holds.mode() {
            Some(Mode::Shared { limit }) => Some(limit),
            _ => self.queue.shared_limit(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    owner: OwnerId,
    /// Sorted, without duplicates.
    keys: Vec<Key>,
    lease: Option<Duration>,
    /// When its wait limit passes; its entry in the heap carries the same.
    deadline: Option<Time>,
    /// Which keys it takes shared; absent from older snapshots.
    #[serde(default, skip_serializing_if = "Sharing::is_exclusive")]
    sharing: Sharing,
    /// The value its holds get when granted; absent from older snapshots.
    #[serde(default, skip_serializing_if = "value::is_empty")]
    value: Box<[u8]>,
    /// When it began to wait; older snapshots, which did not keep it, read
    /// as the timeline's origin.
    #[serde(default)]
    since: Time,
}

impl Waiter {
    fn mode(&self, key: &str) -> Mode {
        self.sharing.mode(key)
    }
}

/// Per-owner state: what must go when the connection ends.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OwnerState {
    /// Keys held without a lease, released on disconnect in key order.
    /// An owner holds a key at most once, whatever the mode.
    bound: BTreeSet<Key>,
    /// Requests still waiting, in request order.
    waiting: Vec<ReqId>,
}

/// The lock table. See the module documentation for the rules.
#[derive(Debug)]
pub struct LockTable {
    limits: TableLimits,
    /// The latest command time seen; see [`LockTable::apply`].
    now: Time,
    /// Set by [`Command::Close`].
    closed: bool,
    keys: KeyMap<KeyState>,
    waiters: BTreeMap<ReqId, Waiter>,
    owners: BTreeMap<OwnerId, OwnerState>,
    deadlines: Deadlines,
    live_leases: usize,
    held_keys: usize,
    next_fence: u64,
    next_req: ReqId,
    sessions: Sessions,
    /// Who took each grant, for access control by fence (see `takers`).
    takers: Takers,
}

impl LockTable {
    /// An empty table whose first fencing token will be `first_fence`
    /// (at least 1: 0 means "no token" on the wire).
    pub fn new(limits: TableLimits, first_fence: u64) -> Self {
        LockTable {
            limits,
            now: Time::ZERO,
            closed: false,
            keys: KeyMap::default(),
            waiters: BTreeMap::new(),
            owners: BTreeMap::new(),
            deadlines: Deadlines::default(),
            live_leases: 0,
            held_keys: 0,
            next_fence: first_fence.max(1),
            next_req: 1,
            sessions: Sessions::default(),
            takers: Takers::default(),
        }
    }

    /// An empty table whose owners are sessions with a TTL (see
    /// `sessions`): the table of a cluster, where an owner must outlive the
    /// connection that opened it.
    pub fn with_sessions(limits: TableLimits, first_fence: u64) -> Self {
        LockTable {
            sessions: Sessions::required(),
            ..LockTable::new(limits, first_fence)
        }
    }

    /// Applies one command at time `now` and returns what it did.
    ///
    /// The table's time never runs back: a command stamped earlier than the
    /// latest time it has seen runs at that latest time, so a log whose
    /// stamps come from more than one clock still moves forward.
    pub fn apply(&mut self, cmd: Command, now: Time) -> Output {
        let now = now.max(self.now);
        self.now = now;
        let mut out = Output::default();
        if let Some(owner) = cmd.owner() {
            if !self.sessions.admit(owner, now) {
                out.reply = Reply::UnknownSession;
                return out;
            }
        }
        self.run(cmd, now, &mut out);
        if self.sessions.required && !out.woken.is_empty() {
            self.note_outcomes(&out);
        }
        out
    }

    /// Applies `cmd`, its owner admitted, into `out`.
    fn run(&mut self, cmd: Command, now: Time, out: &mut Output) {
        match cmd {
            Command::Lock {
                owner,
                keys,
                sharing,
                wait,
                lease,
                value,
            } => {
                let args = (sharing, wait, lease, value.into_boxed_slice());
                out.reply = Reply::Lock(self.lock(owner, keys, args, now));
            }
            Command::Proclaim {
                owner,
                keys,
                fence,
                value,
            } => out.reply = Reply::NotHeld(self.proclaim(owner, keys, fence, &value)),
            Command::Unlock { owner, keys, fence } => {
                out.reply = Reply::NotHeld(self.unlock(owner, keys, fence, now, &mut out.woken));
            }
            Command::Renew {
                owner,
                keys,
                fence,
                lease,
            } => out.reply = Reply::NotHeld(self.renew(owner, keys, fence, lease, now)),
            Command::Undelivered { keys, fence } => {
                // Only the token names the grant; owner 0 is nobody.
                self.unlock(0, keys, Some(fence), now, &mut out.woken);
            }
            Command::Disconnect { owner } => {
                self.sessions.end(owner);
                self.disconnect(owner, now, out);
            }
            Command::OpenSession { ttl, identity } if self.sessions.required => {
                let id = self.sessions.open(ttl, now, identity);
                out.reply = Reply::Session { id, ttl };
            }
            Command::OpenSession { .. } => out.reply = Reply::UnknownSession,
            Command::Resume { owner, identity } => {
                out.reply = if self.sessions.opened_by(owner, &identity) {
                    match self.sessions.keep_alive(owner, now) {
                        Some(ttl) => Reply::Session { id: owner, ttl },
                        None => Reply::UnknownSession,
                    }
                } else {
                    Reply::UnknownSession
                };
            }
            Command::KeepAlive { owner } => {
                out.reply = match self.sessions.keep_alive(owner, now) {
                    Some(ttl) => Reply::Session { id: owner, ttl },
                    None => Reply::UnknownSession,
                };
            }
            Command::Sequenced { seq, done, cmd } => self.sequenced(seq, done, *cmd, now, out),
            Command::Close => {
                out.withdrawn = self.close();
                self.note_shut_down();
            }
            Command::Advance => self.advance(now, out),
            Command::Restore { fence_floor } => self.restore_backup(fence_floor, now, out),
        }
    }

    /// The token the next grant will get; every token issued so far is lower.
    pub fn next_fence(&self) -> u64 {
        self.next_fence
    }

    /// Holds on keys: a key held by three shared holders counts three.
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
        self.deadlines.len()
    }

    /// Keys with any state (held or waited for). Free keys have none.
    pub fn tracked_keys(&self) -> usize {
        self.keys.len()
    }

    /// The earliest time at which [`Command::Advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Time> {
        match (self.deadlines.next(), self.sessions.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sessions open (a table made by [`LockTable::with_sessions`]).
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Whether `owner` is an open session.
    pub fn session_open(&self, owner: OwnerId) -> bool {
        self.sessions.is_open(owner)
    }

    /// What the table knows of `key` at `now`, every holder listed.
    pub fn inspect(&self, key: &str, now: Time) -> KeyView {
        self.inspect_within(key, now, usize::MAX, None)
    }

    /// What the table knows of `key` at `now`, listing holders while
    /// their values and a fixed allowance each ([`HOLDER_COST`]) add up to
    /// at most `budget` bytes: the oldest grants, and always the oldest,
    /// the latest and `caller`'s own. The rest are only counted, so a key
    /// with a hundred thousand readers costs an answer of bounded size,
    /// and no copy of every value under the engine's lock.
    pub fn inspect_within(
        &self,
        key: &str,
        now: Time,
        budget: usize,
        caller: Option<OwnerId>,
    ) -> KeyView {
        let state = self.keys.get(key);
        let view = |h: &Hold| HolderView {
            owner: h.owner,
            fence: h.fence,
            lease_remaining: h.lease.map(|t| t.saturating_duration_since(now)),
            value: h.value.to_vec(),
            held_for: now.saturating_duration_since(h.since),
        };
        let cost = |h: &Hold| h.value.len().saturating_add(HOLDER_COST);
        let count = state.map_or(0, |s| s.holds.count());
        let mut by_fence = state.into_iter().flat_map(|s| s.holds.by_fence());
        let latest = by_fence.next_back();
        let oldest = by_fence.next();
        let mut spent = latest
            .map_or(0, cost)
            .saturating_add(oldest.map_or(0, cost));
        let mut holders: Vec<HolderView> = oldest.into_iter().map(view).collect();
        for h in by_fence {
            spent = spent.saturating_add(cost(h));
            if spent > budget {
                break;
            }
            holders.push(view(h));
        }
        // The caller's own hold, if the budget ran out before it: it comes
        // after every hold listed and before the latest.
        let last_listed = holders.last().map_or(0, |h| h.fence);
        let mine = caller
            .and_then(|c| state.and_then(|s| s.holds.of(c)))
            .filter(|h| h.fence > last_listed && latest.is_some_and(|l| l.fence != h.fence));
        holders.extend(mine.map(view));
        let latest = latest.map(view);
        let holders_omitted = count.saturating_sub(holders.len() + usize::from(latest.is_some()));
        KeyView {
            holder: latest.as_ref().map(|h| (h.owner, h.fence)),
            lease_remaining: latest.as_ref().and_then(|h| h.lease_remaining),
            waiters: state.map_or(0, |s| s.queue.len()),
            mode: state.and_then(|s| s.holds.mode()),
            value: latest.as_ref().map(|h| h.value.clone()).unwrap_or_default(),
            held_for: latest.as_ref().map_or(Duration::ZERO, |h| h.held_for),
            waited_for: state
                .and_then(|s| s.queue.first())
                .and_then(|r| self.waiters.get(r))
                .map_or(Duration::ZERO, |w| now.saturating_duration_since(w.since)),
            holders: holders.into_iter().chain(latest).collect(),
            holders_omitted,
        }
    }

    fn lock(&mut self, owner: OwnerId, keys: Vec<Key>, args: LockArgs, now: Time) -> LockResult {
        let (sharing, wait, lease, value) = args;
        if self.closed {
            return LockResult::ShuttingDown;
        }
        let keys = dedup(keys);
        let sharing = sharing.normalise(&keys);
        if let Some(refused) = self.refuse_modes(owner, &keys, &sharing) {
            return refused;
        }
        let unavailable: Vec<Key> = keys
            .iter()
            .filter(|k| !self.free_for_newcomer(k, owner, sharing.mode(k)))
            .cloned()
            .collect();
        if unavailable.is_empty() {
            // Checked only here: a waiter's later grant is bounded by
            // max_waiters times the per-request key limit.
            let newly_held = keys.iter().filter(|k| !self.holds_key(k, owner)).count();
            if self.held_keys + newly_held > self.limits.max_held_keys {
                return LockResult::LimitReached("held keys");
            }
            let fence = self.grant(owner, &keys, &sharing, lease, &value, now);
            return LockResult::Granted { fence };
        }
        let deadline = match wait {
            WaitLimit::No => return LockResult::Busy(unavailable),
            WaitLimit::Forever => None,
            WaitLimit::For(d) => match now.checked_add(d) {
                Some(t) if t <= now => return LockResult::Busy(unavailable),
                t => t,
            },
        };
        if self.waiters.len() >= self.limits.max_waiters {
            return LockResult::LimitReached("waiters");
        }
        let req = self.next_req;
        self.next_req += 1;
        for k in &keys {
            let mode = sharing.mode(k);
            self.keys.get_or_default(k).1.queue.insert(req, mode);
        }
        self.owners.entry(owner).or_default().waiting.push(req);
        if let Some(t) = deadline {
            self.deadlines.push_timeout((t, req));
        }
        self.waiters.insert(
            req,
            Waiter {
                owner,
                keys,
                lease,
                deadline,
                sharing,
                value,
                since: now,
            },
        );
        self.compact_heaps();
        LockResult::Waiting(req)
    }

    /// Returns the named keys that were not held.
    fn unlock(
        &mut self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        now: Time,
        woken: &mut Vec<Woken>,
    ) -> Vec<Key> {
        let mut not_held = Vec::new();
        let mut work = Vec::new();
        for k in dedup(keys) {
            match self.holding(&k, owner, fence) {
                Some(holder) => {
                    self.release(&k, holder);
                    work.push(k);
                }
                None => not_held.push(k),
            }
        }
        self.grant_waiters(work, now, woken);
        not_held
    }

    /// Returns the named keys that were not held.
    fn renew(
        &mut self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        lease: Duration,
        now: Time,
    ) -> Vec<Key> {
        let mut not_held = Vec::new();
        let deadline = now.saturating_add(lease);
        for k in dedup(keys) {
            let Some(holder) = self.holding(&k, owner, fence) else {
                not_held.push(k);
                continue;
            };
            let Some(slot) = self.keys.slot(&k) else {
                continue;
            };
            let Some(state) = self.keys.at_mut(slot) else {
                continue;
            };
            let was_bound = state.holds.of(holder).is_some_and(|h| h.lease.is_none());
            let Some(hold) = state.holds.set_lease(holder, deadline) else {
                continue;
            };
            let fence = hold.fence;
            if was_bound {
                self.live_leases += 1;
                if let Some(o) = self.owners.get_mut(&holder) {
                    o.bound.remove(&k);
                }
                self.forget_owner_if_idle(holder);
            }
            self.deadlines.push_lease((deadline, fence, slot));
        }
        self.compact_heaps();
        not_held
    }

    fn disconnect(&mut self, owner: OwnerId, now: Time, out: &mut Output) {
        let Some(state) = self.owners.remove(&owner) else {
            return;
        };
        let mut work = Vec::new();
        for req in state.waiting {
            if let Some(w) = self.waiters.remove(&req) {
                self.dequeue(req, &w.keys, &mut work);
                out.withdrawn.push(req);
            }
        }
        for k in state.bound {
            self.release(&k, owner);
            work.push(k);
        }
        self.grant_waiters(work, now, &mut out.woken);
        self.compact_heaps();
    }

    /// See [`Command::Restore`].
    fn restore_backup(&mut self, fence_floor: u64, now: Time, out: &mut Output) {
        self.next_fence = self.next_fence.max(fence_floor);
        // The old cluster went on opening sessions and queueing requests
        // after the backup: their ids must not come round again, or a
        // client of the old cluster could resume another's session, or
        // wait on another's ticket. The floor is above them for the same
        // reason it is above the old fences.
        self.sessions.raise_next(fence_floor);
        self.next_req = self.next_req.max(fence_floor);
        let mut ended = Vec::new();
        while let Some(owner) = self.sessions.first() {
            self.sessions.end(owner);
            ended.push(owner);
        }
        // Every wait goes before any key is released: a key released here
        // must not be granted to a request that is itself withdrawn.
        let mut work = Vec::new();
        for owner in &ended {
            let waiting = match self.owners.get_mut(owner) {
                Some(o) => std::mem::take(&mut o.waiting),
                None => continue,
            };
            for req in waiting {
                if let Some(w) = self.waiters.remove(&req) {
                    self.dequeue(req, &w.keys, &mut work);
                    out.withdrawn.push(req);
                }
            }
        }
        for owner in ended {
            self.disconnect(owner, now, out);
            out.ended_sessions.push(owner);
        }
        self.grant_waiters(work, now, &mut out.woken);
    }

    /// Withdraws every waiting request and refuses later ones; returns the
    /// withdrawn requests.
    fn close(&mut self) -> Vec<ReqId> {
        self.closed = true;
        let waiters = std::mem::take(&mut self.waiters);
        // Nobody is left to grant keys to.
        let mut fronts_changed = Vec::new();
        for (&req, w) in &waiters {
            self.dequeue(req, &w.keys, &mut fronts_changed);
            if let Some(o) = self.owners.get_mut(&w.owner) {
                o.waiting.clear();
            }
            self.forget_owner_if_idle(w.owner);
        }
        self.deadlines.clear_timeouts();
        waiters.into_keys().collect()
    }

    /// Expires the leases and wait limits due at `now`. Leases go first, so a
    /// waiter whose limit falls at the same instant a lease ends gets the key.
    fn advance(&mut self, now: Time, out: &mut Output) {
        let mut work = Vec::new();
        while let Some((t, fence, slot)) = self.deadlines.pop_lease_due(now) {
            let expired = self.keys.at(slot).and_then(|(k, s)| {
                s.holds
                    .with_fence(fence)
                    .filter(|h| h.lease == Some(t))
                    .map(|h| (k.clone(), h.owner))
            });
            if let Some((key, holder)) = expired {
                self.release(&key, holder);
                work.push(key);
                out.expired_leases += 1;
            }
        }
        self.grant_waiters(work, now, &mut out.woken);
        // After leases, before wait limits: a session that ran out is as
        // gone as a closed connection, and its keys go to waiters in order.
        while let Some(owner) = self.sessions.pop_expired(now) {
            self.disconnect(owner, now, out);
            out.ended_sessions.push(owner);
        }
        while let Some((_, req)) = self.deadlines.pop_timeout_due(now) {
            let Some(w) = self.waiters.remove(&req) else {
                continue;
            };
            let busy = w
                .keys
                .iter()
                .filter(|k| !self.available_to_waiter(k, w.owner, req, w.mode(k)))
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
                wake: WaitOutcome::TimedOut(busy),
            });
            self.grant_waiters(work, now, &mut out.woken);
            self.forget_owner_if_idle(w.owner);
        }
        self.compact_heaps();
    }
}

/// A Lock's arguments besides its owner and keys: sharing, wait limit,
/// lease and value.
type LockArgs = (Sharing, WaitLimit, Option<Duration>, Box<[u8]>);

fn dedup(mut keys: Vec<Key>) -> Vec<Key> {
    // Distinct keys after dedup, so the unstable sort's order is the only one.
    keys.sort_unstable();
    keys.dedup();
    keys
}
