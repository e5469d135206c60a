//! Keeps the lock while the command runs, and says when it must be given up.
//!
//! The rule is the library's ([`dlock::safety`]): a lock is lost a safety
//! margin before the moment the server could hand it to someone else, unless
//! an answer from the server moved that moment on. Without `--lease` the
//! client's pings keep the lock, and it is lost when the connection ends or
//! the server stops answering (against a cluster: when the session could
//! not be resumed on the new leader in time). With `--lease` the lease is
//! renewed at a third of its length; when the connection drops, the library
//! ([`LockGuard::keep_alive`]) takes the lease over by its fencing token on a
//! new connection while there is time left before its deadline, so a brief
//! network drop does not cost the lock. `-v` reports both (see `run.rs`).

use crate::guardian::Guardian;
use dlock::{Disconnect, LockGuard, Lost};
use std::cell::RefCell;
use std::time::Duration;
use tokio::time::Instant;

/// Watches over a held lock, and keeps the guardian's deadline current.
pub struct Keeper {
    /// In a cell: the renewal loop borrows it across awaits while the
    /// guardian's ticker reads its deadline; only a reconnection, with no
    /// other borrow alive, replaces it.
    guard: RefCell<LockGuard>,
    guardian: Option<Guardian>,
    /// Whether the guardian enforces the deadline (not with --on-lost ignore).
    enforce: bool,
}

impl Keeper {
    /// Starts watching over `guard`; `guardian` is told the deadline from
    /// now on if `enforce`.
    pub fn new(guard: LockGuard, guardian: Option<Guardian>, enforce: bool) -> Keeper {
        let mut keeper = Keeper {
            guard: RefCell::new(guard),
            guardian,
            enforce,
        };
        keeper.tell_guardian();
        keeper
    }

    /// The lock being kept.
    pub fn guard(&self) -> std::cell::Ref<'_, LockGuard> {
        self.guard.borrow()
    }

    /// The guardian's pipe, for COMMAND to name itself on.
    pub fn guardian_fd(&self) -> Option<std::os::fd::RawFd> {
        self.guardian.as_ref().map(Guardian::fd)
    }

    /// Whether the guardian killed COMMAND (asked once COMMAND has ended).
    pub fn guardian_killed(&mut self) -> bool {
        self.guardian.as_mut().is_some_and(Guardian::killed)
    }

    /// Ends the watch: the guardian is told COMMAND has ended, and the lock
    /// is given back for the final release.
    pub fn into_guard(self) -> LockGuard {
        if let Some(g) = self.guardian {
            g.done();
        }
        self.guard.into_inner()
    }

    /// Keeps the lock (renewing a lease, reconnecting when the connection
    /// drops) and resolves when it is lost, with the reason and when
    /// COMMAND must be gone by ([`stop_by`]). Meant to be polled as one
    /// future for as long as COMMAND runs: a renewal or a reconnection in
    /// flight is not restarted by other events.
    pub async fn lost(&mut self) -> (Lost, Instant) {
        let period = (self.guard.borrow().margin() / 2)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        let Keeper {
            guard,
            guardian,
            enforce,
        } = self;
        let watch = keep(guard);
        tokio::pin!(watch);
        loop {
            tokio::select! {
                lost = &mut watch => {
                    let by = stop_by(&lost, &guard.borrow(), Instant::now());
                    return (lost, by);
                }
                _ = tick.tick() => {
                    if let Some(g) = guardian.as_mut() {
                        g.deadline(enforce.then(|| guardian_deadline(&guard.borrow())));
                    }
                }
            }
        }
    }

    fn tell_guardian(&mut self) {
        let deadline = self
            .enforce
            .then(|| guardian_deadline(&self.guard.borrow()));
        if let Some(g) = self.guardian.as_mut() {
            g.deadline(deadline);
        }
    }
}

/// When COMMAND must be gone once the lock is lost for `reason`, at `now`:
/// half the margin before the lock's deadline, the last moment the server
/// could not yet have handed it on; at once when the server has let it go
/// already, or may have (it says the keys are not held, ended the session,
/// or the connection a lock without a lease was bound to ended).
pub fn stop_by(reason: &Lost, guard: &LockGuard, now: Instant) -> Instant {
    let gone = match reason {
        Lost::NotHeld => true,
        Lost::ConnectionLost(Disconnect::SessionEnded) => true,
        // The link ended for good and its socket is gone: the server
        // releases a lock without a lease as it notices. (A lease's lost
        // connection is recovered by `keep_alive`; when that fails it
        // runs until its deadline.)
        Lost::ConnectionLost(_) => guard.lease().is_none(),
        _ => false,
    };
    let deadline = match reason {
        Lost::Jeopardy { deadline, .. } => *deadline,
        _ => guard.deadline(),
    };
    match gone {
        true => now,
        false => deadline.checked_sub(guard.margin() / 2).unwrap_or(now),
    }
}

/// When the guardian kills COMMAND if dlock has not said otherwise: before
/// the deadline, since SIGKILL and the exit take time too. dlock itself,
/// when it can, acts sooner still (at half the margin).
fn guardian_deadline(guard: &LockGuard) -> Instant {
    guard.deadline() - guard.margin() / 4
}

/// The renewal (and lease recovery) loop behind [`Keeper::lost`].
#[allow(clippy::await_holding_refcell_ref)] // shared borrows only; see Keeper::guard
async fn keep(guard: &RefCell<LockGuard>) -> Lost {
    guard.borrow().keep_alive().await
}
