//! What tells parked Watches that the table may have changed.
//!
//! Watchers are not part of the lock table: they change nothing, so they
//! are neither commands nor replicated. A parked Watch re-reads its key
//! whenever the table may have changed, and the [`ChangeHub`] tells it: the
//! outcome registry rings it for every applied command (on a cluster: every
//! committed entry), so every answer is read from applied state. The hub
//! costs one atomic load per command while nobody watches.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;
use tokio::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

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
