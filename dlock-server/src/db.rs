//! The shared lock state: the [`LockTable`] behind a mutex, the one clock
//! its commands are stamped with, and the delivery of its outputs to the
//! connections waiting for them.
//!
//! Every change to the table goes through [`LockTable::apply`] as a
//! [`Command`], including the decisions taken here (releasing a grant whose
//! connection has gone, stopping), and every command's time comes from one
//! read of [`Clock`] in `Db::apply`: a log of what was applied replays to the
//! same table.
//!
//! The mutex is a std one and only synchronous methods touch it, so no guard
//! ever lives across an `.await`. Wake-ups are collected under the lock and
//! sent after it is dropped. One timer task sleeps until the table's next
//! deadline (a lease or a wait limit) and is nudged whenever an operation
//! creates an earlier one: expiry happens on time, with no periodic sweep.

use crate::clock::Clock;
use crate::fence::FenceAlarm;
use crate::handler;
use crate::table::{
    Command, FirstHolder, Key, LockResult, LockTable, Output, OwnerId, Reply, ReqId, Sharing,
    Snapshot, TableLimits, Time, WaitLimit, WaitOutcome, Woken,
};
use crate::watch::ChangeHub;
use dlock::proto::{KeyInfo, ServerStats};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

/// A cheap, cloneable handle to the lock state.
#[derive(Clone, Debug)]
pub struct Db {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    clock: Clock,
    /// Wakes the timer task when a deadline earlier than its target appears.
    timer: Notify,
    /// Rings when the fence file needs a new reservation.
    fence_alarm: FenceAlarm,
    next_owner: AtomicU64,
    /// Outcomes handed to waiting connections so far.
    deliveries: AtomicU64,
    /// Rung after every change, for parked Watches.
    hub: ChangeHub,
}

#[derive(Debug)]
struct State {
    table: LockTable,
    /// Where to deliver the outcome of each waiting request.
    pending: HashMap<ReqId, oneshot::Sender<Woken>>,
    /// Peer address of every connected owner (connections and their
    /// sessions), for Inspect.
    peers: HashMap<OwnerId, SocketAddr>,
    /// Connections open, for Inspect.
    connections: usize,
    /// The deadline the timer task sleeps until.
    timer_at: Option<Time>,
    /// Every command applied, when [`Db::record_commands`] asked for it.
    log: Option<Vec<Applied>>,
}

/// One command as the table applied it, for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The command.
    pub cmd: Command,
    /// The time it was applied at.
    pub at: Time,
    /// What it returned.
    pub out: Output,
}

/// The answer to a Lock request.
#[derive(Debug)]
pub enum LockReply {
    /// Held under this fencing token.
    Granted(u64),
    /// Waiting; the outcome arrives on the receiver.
    Wait(oneshot::Receiver<Woken>),
    /// Not waiting, and these keys were unavailable.
    Busy(Vec<Key>),
    /// A server-wide limit was reached.
    LimitReached(&'static str),
    /// The server is stopping; nothing changed.
    ShuttingDown,
    /// The owner holds or waits for these keys in the other mode.
    ModeConflict(Vec<Key>),
    /// These keys are shared under another limit.
    LimitMismatch(Vec<Key>),
}

impl Db {
    /// A handle to a new, empty table on tokio's clock.
    pub fn new(limits: TableLimits, first_fence: u64) -> Db {
        Db::from_table(LockTable::new(limits, first_fence), Clock::tokio())
    }

    /// A handle to `table`, whose commands are stamped by `clock`.
    pub fn from_table(table: LockTable, clock: Clock) -> Db {
        Db {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    table,
                    pending: HashMap::new(),
                    peers: HashMap::new(),
                    connections: 0,
                    timer_at: None,
                    log: None,
                }),
                clock,
                timer: Notify::new(),
                fence_alarm: FenceAlarm::default(),
                next_owner: AtomicU64::new(1),
                deliveries: AtomicU64::new(0),
                hub: ChangeHub::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in the table; the
        // state it left is still the best information there is, so keep
        // serving rather than poisoning every later request.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `cmd` at the clock's current time: the one place a command's
    /// time is read, and the one way the table changes. (Inspect reads the
    /// same clock to say how much of a lease is left; it changes nothing.)
    fn apply(&self, st: &mut State, cmd: Command) -> Output {
        let at = self.inner.clock.now();
        let out = match &mut st.log {
            None => st.table.apply(cmd, at),
            Some(log) => {
                let out = st.table.apply(cmd.clone(), at);
                log.push(Applied {
                    cmd,
                    at,
                    out: out.clone(),
                });
                out
            }
        };
        if out.expired_leases > 0 {
            crate::metrics::leases_expired(out.expired_leases);
        }
        out
    }

    /// Registers a new connection and returns its owner id.
    pub fn connect(&self, peer: SocketAddr) -> OwnerId {
        let owner = self.open_session(peer);
        self.state().connections += 1;
        owner
    }

    /// Ends a connection: withdraws its waiting request and releases its
    /// keys held without a lease.
    pub fn disconnect(&self, owner: OwnerId) {
        let mut st = self.state();
        st.connections = st.connections.saturating_sub(1);
        self.end_owner(st, owner);
    }

    /// Registers a new owner (a session) on a connection from `peer`; owner
    /// ids are never reused.
    pub fn open_session(&self, peer: SocketAddr) -> OwnerId {
        let owner = self.inner.next_owner.fetch_add(1, Ordering::Relaxed);
        self.state().peers.insert(owner, peer);
        owner
    }

    /// Ends a session as [`Db::disconnect`] ends a connection.
    pub fn close_session(&self, owner: OwnerId) {
        self.end_owner(self.state(), owner);
    }

    fn end_owner(&self, mut st: MutexGuard<'_, State>, owner: OwnerId) {
        st.peers.remove(&owner);
        let out = self.apply(&mut st, Command::Disconnect { owner });
        self.deliver(st, out);
    }

    /// Asks for `keys`; see [`Command::Lock`].
    pub fn lock(
        &self,
        owner: OwnerId,
        keys: Vec<Key>,
        sharing: Sharing,
        wait: WaitLimit,
        lease: Option<Duration>,
    ) -> LockReply {
        self.lock_valued(owner, keys, sharing, wait, lease, Vec::new())
    }

    /// [`Db::lock`], the holds to get `value` (see [`Command::Lock`]).
    pub fn lock_valued(
        &self,
        owner: OwnerId,
        keys: Vec<Key>,
        sharing: Sharing,
        wait: WaitLimit,
        lease: Option<Duration>,
        value: Vec<u8>,
    ) -> LockReply {
        self.lock_placed(owner, keys, sharing, wait, lease, value).0
    }

    /// Asks for `keys` as [`Db::lock_valued`] does, for an Enqueue: a request
    /// that waits also comes with its id (the ticket) and its place in line
    /// (see [`LockTable::place_in_line`]), read under the same lock.
    pub fn lock_placed(
        &self,
        owner: OwnerId,
        keys: Vec<Key>,
        sharing: Sharing,
        wait: WaitLimit,
        lease: Option<Duration>,
        value: Vec<u8>,
    ) -> (LockReply, Option<(ReqId, usize)>) {
        let mut st = self.state();
        let mut out = self.apply(
            &mut st,
            Command::Lock {
                owner,
                keys,
                sharing,
                wait,
                lease,
                value,
            },
        );
        let mut place = None;
        let reply = match std::mem::take(&mut out.reply) {
            Reply::Lock(LockResult::Granted { fence }) => LockReply::Granted(fence),
            Reply::Lock(LockResult::Waiting(req)) => {
                let (tx, rx) = oneshot::channel();
                st.pending.insert(req, tx);
                place = Some((req, st.table.place_in_line(req).unwrap_or(0)));
                LockReply::Wait(rx)
            }
            Reply::Lock(LockResult::Busy(keys)) => LockReply::Busy(keys),
            Reply::Lock(LockResult::LimitReached(what)) => LockReply::LimitReached(what),
            Reply::Lock(LockResult::ShuttingDown) => LockReply::ShuttingDown,
            Reply::Lock(LockResult::ModeConflict(keys)) => LockReply::ModeConflict(keys),
            Reply::Lock(LockResult::LimitMismatch(keys)) => LockReply::LimitMismatch(keys),
            other => unreachable!("the table answered a Lock with {other:?}"),
        };
        self.deliver(st, out);
        (reply, place)
    }

    /// Releases keys; returns the named keys that were not held.
    pub fn unlock(&self, owner: OwnerId, keys: Vec<Key>, fence: Option<u64>) -> Vec<Key> {
        let mut st = self.state();
        let out = self.apply(&mut st, Command::Unlock { owner, keys, fence });
        self.deliver_not_held_reply(st, out)
    }

    /// Moves leases; returns the named keys that were not held.
    pub fn renew(
        &self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        lease: Duration,
    ) -> Vec<Key> {
        let mut st = self.state();
        let cmd = Command::Renew {
            owner,
            keys,
            fence,
            lease,
        };
        let out = self.apply(&mut st, cmd);
        self.deliver_not_held_reply(st, out)
    }

    /// Replaces the value of held keys; returns the named keys that were
    /// not held. See [`Command::Proclaim`].
    pub fn proclaim(
        &self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        value: Vec<u8>,
    ) -> Vec<Key> {
        let mut st = self.state();
        let cmd = Command::Proclaim {
            owner,
            keys,
            fence,
            value,
        };
        let out = self.apply(&mut st, cmd);
        self.deliver_not_held_reply(st, out)
    }

    /// What tells parked Watches that the table changed.
    pub fn hub(&self) -> &ChangeHub {
        &self.inner.hub
    }

    /// For a Watch: `key` as seen by `owner`, if its first holder is not
    /// the one named by `fence` and `value` (0 and empty: free).
    pub fn changed_from(
        &self,
        owner: OwnerId,
        key: &str,
        fence: u64,
        value: &[u8],
    ) -> Option<KeyInfo> {
        let st = self.state();
        let first = st.table.first_holder(key);
        if FirstHolder::is_known(first.as_ref(), fence, value) {
            return None;
        }
        Some(self.key_info(&st, owner, key))
    }

    /// `key` as seen by `owner`, for Inspect and Watch.
    pub fn inspect_key(&self, owner: OwnerId, key: &str) -> KeyInfo {
        self.key_info(&self.state(), owner, key)
    }

    fn key_info(&self, st: &State, owner: OwnerId, key: &str) -> KeyInfo {
        let view = st.table.inspect(key, self.inner.clock.now());
        let addr = |o| st.peers.get(&o).map(|a| a.to_string()).unwrap_or_default();
        handler::key_info(key, view, Some(owner), addr)
    }

    /// `deliver` for an Unlock or Renew, returning the keys its reply
    /// says were not held.
    fn deliver_not_held_reply<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        mut out: Output,
    ) -> Vec<Key> {
        let not_held = match std::mem::take(&mut out.reply) {
            Reply::NotHeld(keys) => keys,
            other => unreachable!("the table answered an Unlock or Renew with {other:?}"),
        };
        self.deliver(st, out);
        not_held
    }

    /// Describes `keys` as seen by `owner`.
    pub fn inspect(&self, owner: OwnerId, keys: &[String]) -> Vec<KeyInfo> {
        let st = self.state();
        keys.iter().map(|k| self.key_info(&st, owner, k)).collect()
    }

    /// Server-wide counts, for Inspect without keys.
    pub fn stats(&self) -> ServerStats {
        let st = self.state();
        ServerStats {
            connections: st.connections as u64,
            held_keys: st.table.held_keys() as u64,
            waiting_requests: st.table.waiting() as u64,
        }
    }

    /// How many outcomes have been handed to waiting connections so far. A
    /// connection compares it before and after running requests to learn
    /// whether they woke another connection.
    pub fn deliveries(&self) -> u64 {
        self.inner.deliveries.load(Ordering::Relaxed)
    }

    /// Starts stopping the server: every waiting Lock is withdrawn (its
    /// delivery is dropped, so its connection answers ShuttingDown) and
    /// later Locks are refused with ShuttingDown. Called before connections
    /// close, so the releases of closing holders hand keys to nobody: a
    /// grant given during shutdown would be useless to its client and tell
    /// it something false. Outcomes decided before this keep their answer.
    pub fn close(&self) {
        let mut st = self.state();
        let out = self.apply(&mut st, Command::Close);
        self.deliver(st, out);
    }

    /// Runs the timer task: expires leases and wait limits on time, until
    /// `shutdown` is cancelled.
    pub async fn run_timer(self, shutdown: CancellationToken) {
        loop {
            let next = {
                let mut st = self.state();
                let next = st.table.next_deadline();
                st.timer_at = next;
                next
            };
            let sleep_target = next.and_then(|t| self.inner.clock.instant_of(t));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.inner.timer.notified() => {}
                _ = async {
                    if let Some(t) = sleep_target {
                        tokio::time::sleep_until(t).await
                    }
                }, if sleep_target.is_some() => self.advance(),
            }
        }
    }

    /// Expires the leases and wait limits due by the clock's time and
    /// delivers the outcomes. The timer task calls it on time; the fuzz
    /// harness calls it after moving its manual clock.
    pub fn advance(&self) {
        let mut st = self.state();
        let out = self.apply(&mut st, Command::Advance);
        if out.expired_leases > 0 {
            // Only the timer task gets here, never a request, so this line
            // costs the request path nothing; one line per batch due at once.
            tracing::info!(keys = out.expired_leases, "leases expired");
        }
        self.deliver(st, out);
    }

    /// The earliest time at which [`Db::advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Time> {
        self.state().table.next_deadline()
    }

    /// Starts keeping every command applied from now on, for
    /// [`Db::take_log`]. For the fuzz harness: it replays the log on a
    /// second table to show that nothing changes the table beside it.
    pub fn record_commands(&self) {
        self.state().log.get_or_insert_with(Vec::new);
    }

    /// The commands applied since [`Db::record_commands`] or the last call.
    pub fn take_log(&self) -> Vec<Applied> {
        self.state()
            .log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The table's whole state; see [`LockTable::snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        self.state().table.snapshot()
    }

    /// Checks the lock table's invariants; see [`LockTable::check_invariants`].
    ///
    /// # Errors
    /// A description of the first invariant that does not hold.
    pub fn check_invariants(&self) -> Result<(), String> {
        let st = self.state();
        st.table.check_invariants()?;
        if st.pending.len() != st.table.waiting() {
            return Err(format!(
                "{} deliveries pending for {} waiting requests",
                st.pending.len(),
                st.table.waiting()
            ));
        }
        Ok(())
    }

    /// The token the next grant will get.
    pub fn next_fence(&self) -> u64 {
        self.state().table.next_fence()
    }

    /// The alarm the fence file's keeper (see [`crate::fence::run_keeper`])
    /// sets and this state rings as tokens are issued.
    pub fn fence_alarm(&self) -> &FenceAlarm {
        &self.inner.fence_alarm
    }

    /// Wakes the timer task if the table's next deadline is earlier than the
    /// one it sleeps until.
    fn rearm(&self, st: &mut State) {
        let next = st.table.next_deadline();
        if next.is_some() && (st.timer_at.is_none() || next < st.timer_at) {
            st.timer_at = next;
            self.inner.timer.notify_one();
        }
    }

    /// Acts on a command's output: forgets the deliveries of withdrawn
    /// requests, then delivers wake-ups after releasing the lock, so woken
    /// tasks never contend with the guard that woke them. A grant whose
    /// connection is already gone is released again at once, as a
    /// [`Command::Undelivered`]: a lease given to a departed client would
    /// otherwise stay held, unknown to anyone, until it expired.
    fn deliver<'a>(&'a self, mut st: MutexGuard<'a, State>, mut out: Output) {
        loop {
            // Watches look after the guard is dropped below; a Watch that
            // looks before that waits for the lock and sees this command.
            self.inner.hub.changed();
            for req in &out.withdrawn {
                st.pending.remove(req);
            }
            let mut sends = Vec::with_capacity(out.woken.len());
            for w in out.woken.drain(..) {
                if let Some(tx) = st.pending.remove(&w.req) {
                    sends.push((tx, w));
                }
            }
            self.rearm(&mut st);
            self.inner.fence_alarm.check(st.table.next_fence());
            drop(st);
            if sends.is_empty() {
                return;
            }
            let mut orphans = Vec::new();
            self.inner
                .deliveries
                .fetch_add(sends.len() as u64, Ordering::Relaxed);
            for (tx, w) in sends {
                if let Err(w) = tx.send(w) {
                    if let WaitOutcome::Granted { fence } = w.wake {
                        orphans.push((w.keys, fence));
                    }
                }
            }
            if orphans.is_empty() {
                return;
            }
            st = self.state();
            out = Output::default();
            for (keys, fence) in orphans {
                let more = self.apply(&mut st, Command::Undelivered { keys, fence });
                out.woken.extend(more.woken);
                out.withdrawn.extend(more.withdrawn);
            }
        }
    }

    /// Stops listening for a waiting Lock's outcome: a grant that already
    /// arrived unanswered is released, and one that comes later is released
    /// by `deliver`, so no lease outlives a client that never learned its
    /// fencing token.
    pub fn abandon(&self, mut rx: oneshot::Receiver<Woken>) {
        rx.close();
        let Ok(w) = rx.try_recv() else {
            return;
        };
        if let WaitOutcome::Granted { fence } = w.wake {
            let mut st = self.state();
            let out = self.apply(
                &mut st,
                Command::Undelivered {
                    keys: w.keys,
                    fence,
                },
            );
            self.deliver(st, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::net::{Ipv4Addr, SocketAddr};
    use tokio::sync::oneshot::error::TryRecvError;

    fn db() -> Db {
        Db::new(
            TableLimits {
                max_waiters: 10,
                max_held_keys: 10,
            },
            1,
        )
    }

    fn keys(k: &str) -> Vec<Key> {
        vec![Key::from(k)]
    }

    #[tokio::test]
    async fn a_closed_db_hands_released_keys_to_nobody() {
        let db = db();
        let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let (a, b) = (db.connect(peer), db.connect(peer));
        assert!(matches!(
            db.lock(a, keys("k"), Sharing::exclusive(), WaitLimit::Forever, None),
            LockReply::Granted(_)
        ));
        let LockReply::Wait(mut rx) =
            db.lock(b, keys("k"), Sharing::exclusive(), WaitLimit::Forever, None)
        else {
            panic!("b should wait for k");
        };
        db.close();
        // The holder's connection closes as part of the shutdown.
        db.disconnect(a);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Closed)));
        assert!(matches!(
            db.lock(
                b,
                keys("other"),
                Sharing::exclusive(),
                WaitLimit::Forever,
                None
            ),
            LockReply::ShuttingDown
        ));
        db.check_invariants().expect("invariants hold");
        let stats = db.stats();
        assert_eq!((stats.held_keys, stats.waiting_requests), (0, 0));
    }

    fn manual() -> (Db, ManualClock) {
        let clock = ManualClock::default();
        let table = LockTable::new(
            TableLimits {
                max_waiters: 10,
                max_held_keys: 10,
            },
            1,
        );
        let db = Db::from_table(table, Clock::Manual(clock.clone()));
        db.record_commands();
        (db, clock)
    }

    #[test]
    fn on_a_manual_clock_leases_end_only_when_it_is_moved() {
        let (db, clock) = manual();
        let a = db.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)));
        let lease = Some(Duration::from_secs(1));
        assert!(matches!(
            db.lock(a, keys("k"), Sharing::exclusive(), WaitLimit::No, lease),
            LockReply::Granted(_)
        ));
        assert_eq!(db.next_deadline(), Some(Time::from_micros(1_000_000)));
        db.advance();
        assert_eq!(db.stats().held_keys, 1, "nothing due yet");
        clock.set(Time::from_micros(1_000_000));
        db.advance();
        assert_eq!(db.stats().held_keys, 0);
        let times: Vec<u64> = db.take_log().iter().map(|a| a.at.as_micros()).collect();
        assert_eq!(times, [0, 0, 1_000_000]);
    }

    #[test]
    fn a_grant_nobody_receives_is_released_by_a_command() {
        let (db, _clock) = manual();
        let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let (a, b) = (db.connect(peer), db.connect(peer));
        db.lock(
            a,
            keys("k"),
            Sharing::exclusive(),
            WaitLimit::No,
            Some(Duration::from_secs(5)),
        );
        let LockReply::Wait(rx) =
            db.lock(b, keys("k"), Sharing::exclusive(), WaitLimit::Forever, None)
        else {
            panic!("b should wait for k");
        };
        drop(rx);
        assert!(db.unlock(a, keys("k"), None).is_empty());
        assert_eq!(db.stats().held_keys, 0, "the grant to b was released");
        let log = db.take_log();
        assert!(matches!(
            log.last().map(|a| &a.cmd),
            Some(Command::Undelivered { .. })
        ));
        db.check_invariants().expect("invariants hold");
    }

    #[tokio::test]
    async fn an_outcome_decided_before_close_is_kept() {
        let db = db();
        let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let (a, b) = (db.connect(peer), db.connect(peer));
        db.lock(a, keys("k"), Sharing::exclusive(), WaitLimit::Forever, None);
        let LockReply::Wait(mut rx) =
            db.lock(b, keys("k"), Sharing::exclusive(), WaitLimit::Forever, None)
        else {
            panic!("b should wait for k");
        };
        db.disconnect(a);
        db.close();
        assert!(matches!(
            rx.try_recv().map(|w| w.wake),
            Ok(WaitOutcome::Granted { .. })
        ));
    }
}
