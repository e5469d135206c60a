//! The local engine: one server's [`LockTable`] in memory behind a mutex,
//! the one clock its commands are stamped with, and the timer that expires
//! leases and wait limits on time.
//!
//! Every change to the table goes through [`LockTable::apply`] as a
//! [`Command`], including the decisions taken here (releasing a grant nobody
//! received), and every command's time comes from one read of [`Clock`] in
//! `Local::apply`: a log of what was applied replays to the same table.
//!
//! The mutex is a std one and only synchronous methods touch it, so no guard
//! ever lives across an `.await`. The service's sink sees each command under
//! the lock (so it sees them in apply order) and only sorts outcomes; they
//! are sent after the lock is dropped, so woken tasks never contend with the
//! guard that woke them. One timer task sleeps until the table's next
//! deadline and is nudged whenever a command creates an earlier one: expiry
//! happens on time, with no periodic sweep.

use super::alarm::Armed;
use super::fence::{FenceAlarm, FenceSource};
use crate::engine::clock::Clock;
use crate::table::{
    Command, LockTable, Output, OwnerId, Snapshot, TableLimits, Time, WaitOutcome, Woken,
};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{oneshot, Notify};

/// What the service is told of every applied command, under the engine's
/// lock: the session a Disconnect ended, and the output, whose outcomes of
/// waiting requests it takes; the deliveries it returns are sent once the
/// lock is dropped.
pub type LocalSink = Arc<dyn Fn(Option<OwnerId>, &mut Output) -> Deliveries + Send + Sync>;

/// Outcomes of waiting requests found by the sink, to send.
#[derive(Debug, Default)]
pub struct Deliveries {
    /// Each outcome and where its request waits for it.
    pub sends: Vec<(oneshot::Sender<Woken>, Woken)>,
    /// Grants to sessions attached nowhere (their connection ended as the
    /// grant was decided).
    pub unattached: Vec<Woken>,
}

impl Deliveries {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.unattached.is_empty()
    }

    /// Sends every outcome; returns the grants that reached nobody (their
    /// receiver was dropped, or their session was attached nowhere).
    pub fn send(self) -> Vec<Woken> {
        let mut orphans = self.unattached;
        for (tx, w) in self.sends {
            if let Err(w) = tx.send(w) {
                orphans.push(w);
            }
        }
        orphans.retain(|w| matches!(w.wake, WaitOutcome::Granted { .. }));
        orphans
    }
}

/// A cheap, cloneable handle to the in-memory table.
#[derive(Clone)]
pub struct Local {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").finish_non_exhaustive()
    }
}

struct Inner {
    state: Mutex<State>,
    clock: Clock,
    sink: LocalSink,
    /// Wakes the timer task when a deadline earlier than its target appears.
    timer: Notify,
    /// Rings when the fence file needs a new reservation.
    fence_alarm: FenceAlarm,
}

struct State {
    table: LockTable,
    /// The deadline the expiry task sleeps until.
    timer_at: Armed,
    /// Every command applied, when [`Local::record_commands`] asked for it.
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

/// A new in-memory table for a single server: every owner is a session,
/// opened by the service for a connection and ended with it.
pub fn table(limits: TableLimits, first_fence: u64) -> LockTable {
    LockTable::with_sessions(limits, first_fence)
}

impl Local {
    /// A handle to `table`, whose commands are stamped by `clock` and seen
    /// by `sink`.
    pub fn new(table: LockTable, clock: Clock, sink: LocalSink) -> Local {
        Local {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    table,
                    timer_at: Armed::default(),
                    log: None,
                }),
                clock,
                sink,
                timer: Notify::new(),
                fence_alarm: FenceAlarm::default(),
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

    /// Applies `cmd` now and delivers the outcomes it decided; returns its
    /// output, whose outcomes of waiting requests the service has taken.
    pub fn submit(&self, cmd: Command) -> Output {
        let mut st = self.state();
        let (out, deliveries) = self.apply(&mut st, cmd);
        self.deliver(st, deliveries);
        out
    }

    /// Applies `cmd` at the clock's current time: the one place a command's
    /// time is read, and the one way the table changes. (A read takes the
    /// same clock to say how much of a lease is left; it changes nothing.)
    fn apply(&self, st: &mut State, cmd: Command) -> (Output, Deliveries) {
        let at = self.inner.clock.now();
        let disconnected = match cmd {
            Command::Disconnect { owner } => Some(owner),
            _ => None,
        };
        let mut out = match &mut st.log {
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
        let deliveries = (self.inner.sink)(disconnected, &mut out);
        let next = st.table.next_deadline();
        st.timer_at.rearm(next, &self.inner.timer);
        self.inner.fence_alarm.check(st.table.next_fence());
        (out, deliveries)
    }

    /// Sends `deliveries` after dropping the lock. A grant whose requester
    /// has gone is released again at once, as a [`Command::Undelivered`]:
    /// a lease given to a departed client would otherwise stay held,
    /// unknown to anyone, until it expired.
    fn deliver(&self, st: MutexGuard<'_, State>, deliveries: Deliveries) {
        drop(st);
        if deliveries.is_empty() {
            return;
        }
        let orphans = deliveries.send();
        self.release_undelivered(orphans);
    }

    /// Releases grants whose requester will never learn of them.
    pub fn release_undelivered(&self, grants: Vec<Woken>) {
        let mut pending = grants;
        while !pending.is_empty() {
            let mut st = self.state();
            let mut next = Deliveries::default();
            for w in pending {
                if let WaitOutcome::Granted { fence } = w.wake {
                    let cmd = Command::Undelivered {
                        keys: w.keys,
                        fence,
                    };
                    let (_, more) = self.apply(&mut st, cmd);
                    next.sends.extend(more.sends);
                    next.unattached.extend(more.unattached);
                }
            }
            drop(st);
            pending = next.send();
        }
    }

    /// Runs `f` on the table and the clock's time now.
    pub fn read<R>(&self, f: impl FnOnce(&LockTable, Time) -> R) -> R {
        let st = self.state();
        f(&st.table, self.inner.clock.now())
    }

    /// Resolves when a lease or wait limit is due by the clock; never on
    /// a manual clock, whose owner calls [`Local::advance`] itself.
    pub async fn due(&self) {
        loop {
            let next = {
                let mut st = self.state();
                let next = st.table.next_deadline();
                st.timer_at.set(next);
                next
            };
            let target = next.and_then(|t| self.inner.clock.instant_of(t));
            tokio::select! {
                _ = self.inner.timer.notified() => {}
                _ = async {
                    if let Some(t) = target {
                        tokio::time::sleep_until(t).await
                    }
                }, if target.is_some() => return,
            }
        }
    }

    /// Expires the leases and wait limits due by the clock's time and
    /// delivers the outcomes: what the expiry task submits (see
    /// `Service::run_expiry` in the service); the fuzz harness calls it after
    /// moving its manual clock.
    pub fn advance(&self) -> Output {
        self.submit(Command::Advance)
    }

    /// The earliest time at which [`Local::advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Time> {
        self.state().table.next_deadline()
    }

    /// Starts stopping the server: every waiting Lock is withdrawn (its
    /// delivery is dropped, so its connection answers ShuttingDown) and
    /// later Locks are refused with ShuttingDown. Called before connections
    /// close, so the releases of closing holders hand keys to nobody: a
    /// grant given during shutdown would be useless to its client and tell
    /// it something false. Outcomes decided before this keep their answer.
    pub fn close(&self) {
        self.submit(Command::Close);
    }

    /// Starts keeping every command applied from now on, for
    /// [`Local::take_log`]. For the fuzz harness: it replays the log on a
    /// second table to show that nothing changes the table beside it.
    pub fn record_commands(&self) {
        self.state().log.get_or_insert_with(Vec::new);
    }

    /// The commands applied since [`Local::record_commands`] or the last call.
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
        self.state().table.check_invariants()
    }

    /// The token the next grant will get.
    pub fn next_fence(&self) -> u64 {
        self.state().table.next_fence()
    }

    /// The alarm the fence file's keeper (see [`super::fence::run_keeper`])
    /// sets and this table rings as tokens are issued.
    pub fn fence_alarm(&self) -> &FenceAlarm {
        &self.inner.fence_alarm
    }
}

impl FenceSource for Local {
    fn fence_alarm(&self) -> &FenceAlarm {
        Local::fence_alarm(self)
    }

    fn next_fence(&self) -> u64 {
        Local::next_fence(self)
    }
}
