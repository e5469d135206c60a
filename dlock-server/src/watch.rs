//! Watch: a long poll on one key, answered as soon as the key's first
//! holder (token and value) differs from what the caller says it knows, or
//! when its wait limit runs out.
//!
//! Watchers are not part of the lock table: they change nothing, so they
//! are neither commands nor replicated. A parked Watch is a task that
//! re-reads its key whenever the table may have changed. What tells it is a
//! [`ChangeHub`]: the single server's `Db` rings it after applying a
//! command, a cluster node's apply sink after applying a committed entry,
//! so every answer is read from applied (on a cluster: committed) state.
//! The hub costs one atomic load per command while nobody watches.
//!
//! Bounds: a connection answers in request order, so it has at most one
//! Watch parked at a time; a server has at most `--max-watchers` (a
//! semaphore, [`WatchPermits`]); a Watch waits at most [`MAX_WATCH_WAIT`].
//! A Watch whose connection ends is withdrawn: its task sees the answer's
//! receiver dropped and ends, giving back its permit.

use crate::handler::Refusal;
use crate::table::{Key, MAX_VALUE_LEN};
use dlock::proto::{RequestLock, ResponseStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Longest a Watch waits before it is answered with the key as it is; also
/// the wait of a Watch that names none (wait_micro 0). A client re-arms it.
pub const MAX_WATCH_WAIT: Duration = Duration::from_secs(600);

/// Tells parked Watches that the table may have changed.
#[derive(Debug, Default)]
pub struct ChangeHub {
    /// Watches parked now: while 0, `changed` does nothing but load it.
    active: AtomicUsize,
    notify: Notify,
}

impl ChangeHub {
    /// The table may have changed: wakes every parked Watch to look.
    pub fn changed(&self) {
        if self.active.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits until `check` finds what it looks for (it runs now and after
    /// every change) and returns that, or returns `None` at `deadline`.
    /// Cancel-safe: dropping it only stops the waiting.
    pub async fn wait_for<R>(
        &self,
        deadline: Instant,
        mut check: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        let _parked = Parked::new(self);
        loop {
            // Registered before the check, so a change between the check
            // and the await still wakes it.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(found) = check() {
                return Some(found);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }
}

/// Counts one parked Watch in its hub while it lives.
struct Parked<'a>(&'a ChangeHub);

impl<'a> Parked<'a> {
    fn new(hub: &'a ChangeHub) -> Self {
        hub.active.fetch_add(1, Ordering::SeqCst);
        Parked(hub)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The server-wide bound on parked Watches.
#[derive(Debug, Clone)]
pub struct WatchPermits {
    permits: Arc<Semaphore>,
    max: usize,
}

impl WatchPermits {
    /// At most `max` Watches at once.
    pub fn new(max: usize) -> WatchPermits {
        WatchPermits {
            permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
        }
    }

    /// A place for one more Watch.
    ///
    /// # Errors
    /// WatchLimit when every place is taken.
    pub fn take(&self) -> Result<OwnedSemaphorePermit, Refusal> {
        self.permits.clone().try_acquire_owned().map_err(|_| {
            Refusal::new(
                ResponseStatus::WatchLimit,
                format!(
                    "the server's --max-watchers {} Watches are parked; try again later",
                    self.max
                ),
            )
        })
    }
}

/// A Watch's arguments, checked.
#[derive(Debug)]
pub struct WatchArgs {
    /// The key watched.
    pub key: Key,
    /// The first holder's token the caller knows; 0: it knows the key free.
    pub fence: u64,
    /// The first holder's value the caller knows.
    pub value: Vec<u8>,
    /// When to answer anyway.
    pub deadline: Instant,
}

/// Checks a Watch request: exactly one valid key, a value within bounds.
///
/// # Errors
/// The refusal to answer with.
pub fn watch_args(config: &crate::config::Config, body: RequestLock) -> Result<WatchArgs, Refusal> {
    let mut keys = crate::handler::checked_keys(config, body.keys)?;
    if keys.len() != 1 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "Watch names exactly one key",
        ));
    }
    check_value(&body.value)?;
    let wait = match body.wait_micro {
        0 => MAX_WATCH_WAIT,
        micros => Duration::from_micros(micros).min(MAX_WATCH_WAIT),
    };
    Ok(WatchArgs {
        key: keys.remove(0),
        fence: body.fence,
        value: body.value,
        deadline: Instant::now() + wait,
    })
}

/// Refuses a value longer than [`MAX_VALUE_LEN`].
///
/// # Errors
/// ValueTooLarge.
pub fn check_value(value: &[u8]) -> Result<(), Refusal> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Refusal::new(
            ResponseStatus::ValueTooLarge,
            format!(
                "value is {} bytes long; the limit is {MAX_VALUE_LEN}",
                value.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_wakes_the_waiter_and_nothing_else_does_until_the_deadline() {
        let hub = Arc::new(ChangeHub::default());
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, f) = (hub.clone(), flag.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        let waiter = tokio::spawn(async move {
            h.wait_for(deadline, || f.load(Ordering::SeqCst).then_some(()))
                .await
        });
        tokio::task::yield_now().await;
        hub.changed();
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "a change that is not the one looked for"
        );
        flag.store(true, Ordering::SeqCst);
        hub.changed();
        assert_eq!(waiter.await.ok(), Some(Some(())));
        assert_eq!(hub.active.load(Ordering::SeqCst), 0);
        let none = hub.wait_for(Instant::now() + Duration::from_secs(1), || None::<()>);
        assert_eq!(none.await, None, "answered at its deadline");
    }
}
