//! Keeps the lock while the command runs, and says when it must be given up.
//!
//! The rule is the library's ([`dlock::safety`]): a lock is lost a safety
//! margin before the moment the server could hand it to someone else, unless
//! an answer from the server moved that moment on. Without `--lease` the
//! client's pings keep the lock, and it is lost when the connection ends or
//! the server stops answering. With `--lease` the lease is renewed at a
//! third of its length; when the connection drops, the keeper reconnects and
//! takes the lease over by its fencing token, as long as there is time left
//! before the lease's deadline, so a brief network drop does not cost the lock.

use crate::exit::{self, Failure};
use crate::say;
use dlock::{Client, ClientOptions, LockGuard, Lost};
use std::time::Duration;
use tokio::time::Instant;

/// Shortest pause between reconnection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// What the keeper needs to reconnect.
#[derive(Clone)]
pub struct Reconnect {
    /// Server address.
    pub server: String,
    /// Client options (token, timeouts).
    pub options: ClientOptions,
    /// Report reconnections on stderr.
    pub verbose: bool,
}

/// Watches over a held lock.
pub struct Keeper {
    guard: LockGuard,
    reconnect: Reconnect,
}

impl Keeper {
    /// Starts watching over `guard`.
    pub fn new(guard: LockGuard, reconnect: Reconnect) -> Keeper {
        Keeper { guard, reconnect }
    }

    /// The lock being kept.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Gives the lock back to the caller, for the final release.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Keeps the lock (renewing a lease, reconnecting when the connection
    /// drops) and resolves when it is lost, with the reason. Cancel-safe:
    /// the guard is replaced only once a reconnection has taken it over.
    pub async fn lost(&mut self) -> Lost {
        loop {
            let lost = self.guard.keep_alive().await;
            let Some(lease) = self.guard.lease() else {
                return lost;
            };
            if !matches!(lost, Lost::ConnectionLost(_)) {
                return lost;
            }
            // The lease runs on without the connection; take it over from a
            // new one while it is certainly still ours.
            let alarm = self.guard.deadline() - self.guard.margin();
            if self.reconnect.verbose {
                say!("connection lost; reconnecting to keep the lease");
            }
            let Some(guard) = self.take_over(alarm, lease).await else {
                return Lost::Jeopardy {
                    lease: true,
                    deadline: self.guard.deadline(),
                };
            };
            if self.reconnect.verbose {
                say!(
                    "reconnected to {}; lease renewed by its fencing token",
                    self.reconnect.server
                );
            }
            // The old guard must not release the lock when dropped.
            let old = std::mem::replace(&mut self.guard, guard);
            let _ = old.into_parts();
        }
    }

    async fn take_over(&self, until: Instant, lease: Duration) -> Option<LockGuard> {
        let r = &self.reconnect;
        let keys = self.guard.keys().to_vec();
        let fence = self.guard.fence();
        while Instant::now() < until {
            let attempt = async {
                let client = Client::connect_with(&r.server, r.options.clone()).await?;
                client.take_over(keys.clone(), fence, lease).await
            };
            match tokio::time::timeout_at(until, attempt).await {
                Ok(Ok(guard)) => return Some(guard),
                // Someone released it by fence, or it ran out: no use trying.
                Ok(Err(dlock::Error::NotHeld { .. })) => return None,
                Ok(Err(_)) => {
                    tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(until)).await;
                }
                Err(_) => return None,
            }
        }
        None
    }
}

/// Connects, mapping failures to exit codes.
///
/// # Errors
/// Exit code 69 with a message naming the address and the fix.
pub async fn connect(server: &str, options: ClientOptions) -> Result<Client, Failure> {
    Client::connect_with(server, options)
        .await
        .map_err(|e| exit::from_client_error(e, server))
}
