//! [`LockGuard`]: a held lock, its fencing token, and how to tell it is lost.

use crate::client::{micros, Client};
use crate::error::Result;
use crate::proto::{RequestLock, RequestType};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Keys held by this client. Dropping the guard releases them in the
/// background without blocking; [`LockGuard::unlock`] releases them and
/// reports the outcome.
///
/// Watch for loss while working:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// # let server = dlock_server::testing::TestServer::start(&[]).await;
/// use dlock::{Client, LockOptions};
/// use std::time::Duration;
///
/// let client = Client::connect(&server.addr_string()).await?;
/// let mut guard = client
///     .lock(["jobs/nightly"], LockOptions::new().lease(Duration::from_secs(30)))
///     .await?;
/// tokio::select! {
///     _ = async { /* the work, writing with guard.fence() */ } => {}
///     reason = guard.lost() => eprintln!("stop: lock lost ({reason})"),
/// }
/// guard.renew(Duration::from_secs(60)).await?; // still ours
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LockGuard {
    client: Client,
    keys: Vec<String>,
    fence: u64,
    lease: Option<Duration>,
    /// Local, conservative end of the lease: counted from when the request
    /// was sent, so never later than the server's.
    lease_end: watch::Sender<Option<Instant>>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(
        client: Client,
        keys: Vec<String>,
        fence: u64,
        lease: Option<Duration>,
        sent: Instant,
    ) -> Self {
        let (lease_end, _) = watch::channel(lease.map(|l| sent + l));
        LockGuard {
            client,
            keys,
            fence,
            lease,
            lease_end,
            released: false,
        }
    }

    /// The keys held.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The fencing token of the grant: pass it to the resource the lock
    /// protects, which should refuse writes with a lower token than it has seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The lease length, if the lock is a lease.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// Releases the keys.
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] if (some of) the keys were no longer held,
    /// for example because the lease expired; connection errors.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.client.unlock_fence(&self.keys, self.fence).await
    }

    /// Stops managing the lock without releasing it: dropping the result
    /// sends nothing. The keys stay held until released by fence
    /// ([`Client::unlock_fence`]), until the lease ends, or, without a lease,
    /// until the connection closes. Returns the keys and the fencing token.
    pub fn into_parts(mut self) -> (Vec<String>, u64) {
        self.released = true;
        (std::mem::take(&mut self.keys), self.fence)
    }

    /// Sets the lease to now + `lease`. A lock taken without a lease becomes
    /// a lease: it then survives the connection.
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] if the keys are no longer held; connection errors.
    pub async fn renew(&mut self, lease: Duration) -> Result<()> {
        let sent = Instant::now();
        let body = RequestLock {
            keys: self.keys.clone(),
            fence: self.fence,
            release_micro: micros(lease).max(1),
            ..RequestLock::default()
        };
        self.client.call(RequestType::Renew, body).await?;
        self.lease = Some(lease);
        self.lease_end.send_replace(Some(sent + lease));
        Ok(())
    }

    /// Resolves when the lock can no longer be assumed held, with the reason:
    /// the connection ended (a lock without a lease is then released by the
    /// server), or the lease ran out without being renewed.
    pub async fn lost(&self) -> String {
        let mut lease_end = self.lease_end.subscribe();
        loop {
            let end = *lease_end.borrow_and_update();
            match end {
                None => return self.client.closed().await,
                Some(end) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(end) => {
                            if *lease_end.borrow() == Some(end) {
                                return "lease expired".to_string();
                            }
                        }
                        _ = lease_end.changed() => {}
                    }
                }
            }
        }
    }

    /// Whether [`LockGuard::lost`] would resolve at once.
    pub fn is_lost(&self) -> bool {
        match *self.lease_end.borrow() {
            None => self.client.is_closed(),
            Some(end) => Instant::now() >= end,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let body = RequestLock {
            keys: std::mem::take(&mut self.keys),
            fence: self.fence,
            ..RequestLock::default()
        };
        self.client.send_detached(RequestType::Unlock, body);
    }
}
