//! [`LockGuard`]: a held lock, its fencing token, and when it must be given up.

use crate::client::Client;
use crate::error::{Disconnect, Error, Result};
use crate::event::Event;
use crate::proto::{RequestLock, RequestType};
use crate::request::micros;
use crate::rules::{self, Hold};
use crate::safety::{self, Lost};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A held lock outside any guard, from [`LockGuard::into_parts`]: what a
/// process needs to take it over ([`Client::from_parts`]) or release it
/// ([`Client::unlock_fence`]). Plain data: store it, print it, hand it to
/// another process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockParts {
    /// The keys, in the order they were locked.
    pub keys: Vec<String>,
    /// The grant's fencing token.
    pub fence: u64,
    /// The lease the lock was taken or last renewed with; `None` for a lock
    /// bound to its connection (or session), which nobody else can take
    /// over.
    pub lease: Option<Duration>,
}

/// Keys held by this client, on a connection of their own (see
/// [`Client::lock`]). Dropping the guard releases them in the
/// background without blocking; [`LockGuard::unlock`] releases them and
/// reports the outcome.
///
/// A lock without a lease ends with its connection, so a dropped guard
/// whose connection has ended needs nothing more. A lease outlives it: if
/// the lock may be one (taken with a lease, or renewed) and its connection
/// (on a cluster, its session) has ended, or ends before the Unlock is
/// answered, the Unlock is sent again by fence on a new connection, within
/// 10 s, as [`LockGuard::unlock`] does. That runs in a task of the tokio
/// runtime the guard is dropped on, which [`Client::close`] waits for
/// before the program exits; a guard dropped outside any runtime can only
/// send its Unlock on its own connection, and a lease it misses runs out.
///
/// Every guard has a *safety deadline* (see [`crate::safety`]): the latest
/// moment the lock is certainly still held, judged from this side alone.
/// [`LockGuard::lost`] resolves a safety margin before it unless an answer
/// from the server moves it on, and at once when the connection of a lock
/// without a lease ends.
///
/// Watch for loss while working, renewing a lease as you go:
///
/// ```
/// use dlock::{Client, LockOptions};
/// use std::time::Duration;
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), dlock::Error> {
/// // A real server on a free loopback port, for this example; in production
/// // the address is your dlock-server's (default "127.0.0.1:7436").
/// let server = dlock_server::testing::TestServer::start(dlock_server::Config::default()).await;
/// let client = Client::connect(&server.addr_string()).await?;
/// let guard = client
///     .lock(["jobs/nightly"], LockOptions::new().lease(Duration::from_secs(30)))
///     .await?;
/// tokio::select! {
///     _ = async { /* the work, writing with guard.fence() */ } => {}
///     reason = guard.keep_alive() => eprintln!("stop: lock lost ({reason})"),
/// }
/// guard.unlock().await?;
/// Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct LockGuard {
    /// Replaced when a lease whose connection ended is recovered on a new
    /// one (see [`LockGuard::keep_alive`]).
    client: Mutex<Client>,
    keys: Vec<String>,
    fence: u64,
    /// How long the lock lasts at the server, as far as the client knows:
    /// its lease, if any, and renewals whose answer has not come
    /// ([`rules::Hold`]).
    hold: watch::Sender<Hold<Instant>>,
    released: bool,
    /// `client` is a connection of this lock's own, to be given back to
    /// the `Client` once the lock is released.
    own_connection: bool,
}

impl LockGuard {
    pub(crate) fn new(
        client: Client,
        keys: Vec<String>,
        fence: u64,
        lease: Option<(Instant, Duration)>,
        own_connection: bool,
    ) -> Self {
        LockGuard {
            client: Mutex::new(client),
            keys,
            fence,
            hold: watch::channel(Hold {
                lease,
                unconfirmed: None,
                latest: None,
            })
            .0,
            released: false,
            own_connection,
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
        self.hold.borrow().lease.map(|(_, lease)| lease)
    }

    /// The client this guard's lock was taken or taken over on (or, once
    /// [`LockGuard::keep_alive`] recovered a lease on a new connection,
    /// that connection).
    pub fn client(&self) -> Client {
        self.conn().clone()
    }

    fn conn(&self) -> MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The safety deadline: after it the server may hand the lock to
    /// someone else. For a lease, the send time of the latest successful
    /// Lock or Renew plus the lease; for a lock bound to the connection, the
    /// send time of the latest request the server answered plus the
    /// server's session timeout; either capped by a renewal whose answer has
    /// not come, which the server may have applied ([`rules::Hold`]). All
    /// are shortened by [`safety::CLOCK_RATE_BOUND`].
    pub fn deadline(&self) -> Instant {
        let c = self.conn();
        let hold = *self.hold.borrow();
        hold.deadline(c.last_acked(), c.session_timeout())
    }

    /// The safety margin in force for this lock: [`LockGuard::lost`]
    /// resolves this long before [`LockGuard::deadline`].
    pub fn margin(&self) -> Duration {
        let c = self.conn();
        let window = self.hold.borrow().window(c.session_timeout());
        safety::margin(c.safety_margin(), window)
    }

    /// Releases the keys.
    ///
    /// A lease outlives its connection (on a cluster, its session): if that
    /// ends before the Unlock is answered, perhaps before it was sent (a
    /// session that ends while it moves to a new leader), the Unlock is sent
    /// again by fence on a new connection, within 10 s, and its outcome is
    /// returned.
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] if (some of) the keys were no longer held,
    /// for example because the lease expired (or, sent again, because the
    /// first Unlock was applied after all); connection errors (a lease
    /// whose Unlock could not be sent again then runs until it ends).
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let client = self.client();
        let mut result = client.unlock_fence(&self.keys, self.fence).await;
        if matches!(result, Err(Error::ConnectionLost(_))) && self.may_be_lease() {
            result = unlock_again(&client, &self.keys, self.fence, result).await;
        }
        if self.own_connection && matches!(result, Ok(()) | Err(crate::Error::NotHeld { .. })) {
            // Holds nothing now: fit for the next lock.
            self.own_connection = false;
            client.recycle();
        }
        result
    }

    /// Whether the server may hold the keys as a lease, which outlives the
    /// connection: taken with one, or a Renew sent.
    fn may_be_lease(&self) -> bool {
        let hold = self.hold.borrow();
        hold.lease.is_some() || hold.unconfirmed.is_some() || hold.latest.is_some()
    }

    /// Stops managing the lock without releasing it: dropping the result
    /// sends nothing. The keys stay held until released by fence
    /// ([`Client::unlock_fence`]), until the lease ends, or, without a lease,
    /// until the connection closes. Returns what names the lock: the keys,
    /// the fencing token and the lease, which [`Client::from_parts`] (in
    /// this process or another) takes over again.
    pub fn into_parts(mut self) -> LockParts {
        let lease = self.lease();
        self.released = true;
        if self.own_connection && self.hold.borrow().lease.is_none() {
            // The lock lives as long as its connection.
            self.client().park();
        }
        // A lease's connection is closed, never reused: the server would
        // grant its keys again to a later Lock on it.
        self.own_connection = false;
        LockParts {
            keys: std::mem::take(&mut self.keys),
            fence: self.fence,
            lease,
        }
    }

    /// Sets the lease to now + `lease`. A lock taken without a lease becomes
    /// a lease: it then survives the connection.
    ///
    /// Returns by the lock's alarm ([`LockGuard::lost`]) at the latest: a
    /// renewal held up (a failover, a frozen path) never keeps its caller
    /// past the moment the lock must be given up. Called after the alarm,
    /// it fails at once (the Renew may still go out, and extend the lease
    /// on the server, but the caller has already been told to stop).
    ///
    /// # Errors
    /// [`crate::Error::NotHeld`] if the keys are no longer held;
    /// [`crate::Error::Lost`] if the lock was lost before the answer came
    /// (use it no more); connection errors.
    pub async fn renew(&mut self, lease: Duration) -> Result<()> {
        tokio::select! {
            // An answer that came with the alarm still moved the deadline.
            biased;
            renewed = self.renew_shared(lease) => renewed,
            lost = self.lost() => Err(Error::Lost(lost)),
        }
    }

    /// Renews through `&self`, so [`LockGuard::keep_alive`] can watch the
    /// deadline while a renewal is in flight.
    pub(crate) async fn renew_shared(&self, lease: Duration) -> Result<()> {
        let sent = Instant::now();
        let body = RequestLock {
            keys: self.keys.clone(),
            fence: self.fence,
            release_micro: micros(lease).max(1),
            ..RequestLock::default()
        };
        let client = self.client();
        // Once sent, the server may apply it though its answer never comes
        // (the call fails, or is dropped at the alarm): a lease that would
        // end sooner than the lock's deadline bounds it from now on,
        // answered or not, also for a lock without a lease, which the
        // Renew may have made a lease.
        self.hold.send_if_modified(|h| h.renew_sent(sent, lease));
        client.call(RequestType::Renew, body).await?;
        self.hold
            .send_if_modified(|h| h.renew_answered(sent, lease));
        Ok(())
    }

    /// Resolves when the lock can no longer be assumed held, with the
    /// reason: the connection of a lock without a lease ended (the server
    /// released it), or the safety deadline is within the margin
    /// ([`Lost::Jeopardy`]). Renewals ([`LockGuard::renew`]) and, for a lock
    /// without a lease, every answer on the connection move the deadline on.
    ///
    /// Answers come in request order, so while a Lock waits on the same
    /// client no answer arrives: a lock without a lease held meanwhile falls
    /// into jeopardy once the wait outlasts the session timeout (a false
    /// alarm, on the safe side). Take independent locks on separate clients.
    pub async fn lost(&self) -> Lost {
        let client = self.client();
        let mut hold = self.hold.subscribe();
        loop {
            let is_lease = hold.borrow_and_update().lease.is_some();
            let deadline = self.deadline();
            let alarm = deadline.checked_sub(self.margin()).unwrap_or(deadline);
            if Instant::now() >= alarm {
                return Lost::Jeopardy {
                    lease: is_lease,
                    deadline,
                };
            }
            tokio::select! {
                // Woken at the alarm, the deadline is computed afresh: an
                // answer may have moved it on meanwhile.
                _ = tokio::time::sleep_until(alarm) => {}
                _ = hold.changed() => {}
                reason = client.closed(), if !is_lease => {
                    // A renewal that made this a lease may have raced the
                    // close: a lease survives the connection.
                    if self.hold.borrow().lease.is_none() {
                        return Lost::ConnectionLost(reason);
                    }
                }
            }
        }
    }

    /// Renews a lease at a third of its length until the lock is lost, and
    /// returns why; for a lock without a lease, the same as
    /// [`LockGuard::lost`] (the client's pings keep it). A renewal that gets
    /// no answer does not delay the verdict: the safety deadline is watched
    /// throughout.
    ///
    /// When the connection of a lease ends for good (against a single
    /// server, any broken connection; against a cluster, a session that
    /// could not be resumed), the lease still runs until
    /// [`LockGuard::deadline`]: a new connection of the same client takes
    /// it over by its fencing token while it is certainly still held
    /// ([`Event::LeaseRecovered`]), so a brief network drop does not cost
    /// the lock. Only if that fails before the safety margin is the lock
    /// lost.
    pub async fn keep_alive(&self) -> Lost {
        loop {
            let lost = self.keep_renewing().await;
            let Lost::ConnectionLost(reason) = lost else {
                return lost;
            };
            if self.lease().is_none() {
                return Lost::ConnectionLost(reason);
            }
            if let Err(lost) = self.recover(reason).await {
                return lost;
            }
        }
    }

    async fn keep_renewing(&self) -> Lost {
        loop {
            let Some((at, lease)) = self.hold.borrow().renewal() else {
                return self.lost().await;
            };
            let client = self.client();
            tokio::select! {
                lost = self.lost() => return lost,
                // No renewal can get through: say so at once, so there is
                // as much of the lease as possible left to reconnect in.
                reason = client.closed() => return Lost::ConnectionLost(reason),
                _ = tokio::time::sleep_until(at) => {}
            }
            let renewed = tokio::select! {
                lost = self.lost() => return lost,
                r = self.renew_shared(lease) => r,
            };
            match renewed {
                Ok(()) => {}
                Err(Error::NotHeld { .. }) => return Lost::NotHeld,
                Err(Error::ConnectionLost(reason)) => return Lost::ConnectionLost(reason),
                Err(e) => return Lost::RenewRefused(e.to_string()),
            }
        }
    }

    /// Takes the lease over on a new connection of the same client, by its
    /// fencing token, before the safety margin; the lock is lost otherwise.
    async fn recover(&self, reason: Disconnect) -> std::result::Result<(), Lost> {
        let old = self.client();
        let Some(lease) = self.lease() else {
            return Err(Lost::ConnectionLost(reason));
        };
        old.announce(Event::Reconnecting {
            from: old.addr(),
            reason,
        });
        let broke = Instant::now();
        let alarm = self.deadline().checked_sub(self.margin()).unwrap_or(broke);
        while Instant::now() < alarm {
            let attempt = async {
                let fresh = old.reopen().await?;
                let sent = Instant::now();
                fresh.renew_fence(&self.keys, self.fence, lease).await?;
                Ok::<_, Error>((fresh, sent))
            };
            match tokio::time::timeout_at(alarm, attempt).await {
                Ok(Ok((fresh, sent))) => {
                    fresh.announce(Event::LeaseRecovered {
                        addr: fresh.addr(),
                        fence: self.fence,
                        after: broke.elapsed(),
                    });
                    *self.conn() = fresh;
                    // Only the lease: a renewal still in flight on the old
                    // connection may be applied after this one (two
                    // connections keep no order), so its bound stays.
                    self.hold.send_modify(|h| h.lease = Some((sent, lease)));
                    return Ok(());
                }
                // Released by fence, or it ran out: no use trying.
                Ok(Err(Error::NotHeld { .. })) => return Err(Lost::NotHeld),
                Ok(Err(_)) => {
                    let pause = (Instant::now() + RECOVERY_PAUSE).min(alarm);
                    tokio::time::sleep_until(pause).await;
                }
                Err(_) => break,
            }
        }
        Err(Lost::Jeopardy {
            lease: true,
            deadline: self.deadline(),
        })
    }

    /// Whether [`LockGuard::lost`] would resolve at once.
    pub fn is_lost(&self) -> bool {
        if self.hold.borrow().lease.is_none() && self.conn().is_closed() {
            return true;
        }
        rules::in_jeopardy(Instant::now(), self.deadline(), self.margin())
    }
}

/// Shortest pause between attempts to take a lease over on a new
/// connection.
const RECOVERY_PAUSE: Duration = Duration::from_millis(200);

/// How long an Unlock sent again on a new connection may take, the
/// connect included: the Python, Go and TypeScript clients' drain limit.
const UNLOCK_AGAIN_LIMIT: Duration = Duration::from_secs(10);

/// Sends again, by fence on a new connection (on a cluster, a new session),
/// the Unlock of a lock that may be a lease, which failed with `lost`
/// because its connection (session) ended before the answer came: a lease
/// outlives the session, and would keep the key from everyone until it ran
/// out. Ok once that released the keys; its `NotHeld` if they were not so
/// held any more; `lost` if no server answered in time.
async fn unlock_again(
    client: &Client,
    keys: &[String],
    fence: u64,
    lost: Result<()>,
) -> Result<()> {
    let again = async {
        let fresh = client.reopen().await?;
        let result = fresh.unlock_fence(keys.to_vec(), fence).await;
        if matches!(result, Ok(()) | Err(Error::NotHeld { .. })) {
            // Holds nothing: fit for a later lock.
            fresh.recycle();
        }
        result
    };
    match tokio::time::timeout(UNLOCK_AGAIN_LIMIT, again).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e @ Error::NotHeld { .. })) => Err(e),
        _ => lost,
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // A lease outlives its connection: if that has ended (on a cluster,
        // its session), or ends before the answer, the Unlock goes again
        // by fence on a new connection, as `unlock` sends it again.
        let may_be_lease = self.may_be_lease();
        let keys = std::mem::take(&mut self.keys);
        let client = self.client.get_mut().unwrap_or_else(|p| p.into_inner());
        client.unlock_detached(keys, self.fence, may_be_lease);
        if self.own_connection {
            // The Unlock goes first on the connection: a later Lock on it
            // finds the keys released.
            client.clone().recycle();
        }
    }
}
