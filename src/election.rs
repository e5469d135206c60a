//! Leader election on a key, after etcd's `concurrency.Election` and
//! spindle: campaigners queue for the key (FIFO, like any Lock), the holder
//! is the leader, its hold's value says who it is.
//!
//! - [`Election::campaign`] waits until this process leads and returns a
//!   [`Leadership`]; [`Leadership::lost`] resolves as soon as it can no
//!   longer be assumed (the typed reason of [`LockGuard::lost`]).
//! - [`Election::leader`] says who leads now; [`Election::observe`]
//!   follows every change, pushed by the server (Watch), without
//!   campaigning.
//!
//! Leadership is a lock *bound to the connection* (on a cluster: to the
//! client's session) by default, not a lease: a leader whose process ends
//! or whose connection breaks hands over at once, while the client's
//! pings keep it as long as it is connected; on a cluster the session
//! survives a change of leader node. [`Election::lease`] makes it a lease
//! renewed by [`LockGuard::keep_alive`] instead, which outlives a brief
//! network drop but leaves the key held for up to the lease after a crash.

use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::inspect::KeyState;
use crate::options::LockOptions;
use crate::proto::ResponseStatus;
use crate::safety::Lost;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// An election on one key.
///
/// ```
/// use dlock::{Client, Election};
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), dlock::Error> {
/// // A real server on a free loopback port, for this example; in production
/// // the address is your dlock-server's (default "127.0.0.1:7436").
/// let server = dlock_server::testing::TestServer::start(dlock_server::Config::default()).await;
/// let client = Client::connect(&server.addr_string()).await?;
/// let election = Election::new(&client, "services/scheduler");
/// let leadership = election.campaign("host-a:4000").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!((leader.value.as_slice(), leader.fence), (&b"host-a:4000"[..], leadership.fence()));
/// tokio::select! {
///     _ = async { /* lead: the work, fenced with leadership.fence() */ } => {}
///     reason = leadership.lost() => eprintln!("no longer leader: {reason}"),
/// }
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// Ok(())
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    key: String,
    lease: Option<Duration>,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's value: what it campaigned with, or proclaimed since.
    pub value: Vec<u8>,
    /// The fencing token of its leadership: higher for every later leader.
    pub fence: u64,
    /// When it became leader, by the server's clock.
    pub since: SystemTime,
}

impl Leader {
    /// The leader of a key as [`Client::inspect`] or [`Client::watch`]
    /// saw it: its first holder.
    pub fn of(state: &KeyState) -> Option<Leader> {
        state.first().map(|h| Leader {
            value: h.value.clone(),
            fence: h.fence,
            since: h.since,
        })
    }

    /// Whether `other` is the same leadership with the same value (`since`
    /// is computed from each answer's clock, so it is not compared).
    fn same(a: &Option<Leader>, b: &Option<Leader>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.fence == b.fence && a.value == b.value,
            _ => false,
        }
    }
}

/// Longest a Watch of [`Election::observe`] waits before it is sent again;
/// shorter when the server's session timeout is.
const OBSERVE_WATCH: Duration = Duration::from_secs(30);

/// Pause after a failed Watch before the next (a server that refuses
/// Watches, a cluster between leaders), so a broken path is not hammered.
const OBSERVE_RETRY: Duration = Duration::from_millis(250);

/// Longest pause between failed Watches of [`Election::observe`].
const OBSERVE_MAX_RETRY: Duration = Duration::from_secs(5);

impl Election {
    /// An election on `key`, through `client`.
    pub fn new(client: &Client, key: impl Into<String>) -> Election {
        Election {
            client: client.clone(),
            key: key.into(),
            lease: None,
        }
    }

    /// Leads on a lease of `lease`, renewed at a third of its length,
    /// instead of on the connection (see the module documentation).
    pub fn lease(mut self, lease: Duration) -> Election {
        self.lease = Some(lease);
        self
    }

    /// The election's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Waits until this campaigner leads, in line behind earlier ones, and
    /// returns its leadership, announcing `value` (at most
    /// [`crate::MAX_VALUE_LEN`] bytes). Cancel-safe: dropping the future
    /// leaves the line.
    ///
    /// # Errors
    /// Connection and server errors (a value over the limit among them).
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let mut options = LockOptions::new();
        if let Some(lease) = self.lease {
            options = options.lease(lease);
        }
        let value = value.into();
        let guard = self
            .client
            .lock_with_value(self.key.as_str(), options, value.clone())
            .await?;
        let guard = Arc::new(guard);
        let (tx, lost) = watch::channel(None);
        let keeper = {
            let guard = guard.clone();
            let this = self.clone();
            tokio::spawn(async move {
                // The guard sees its connection, lease and deadline; the
                // Watch sees the key taken from under it (released by its
                // fence elsewhere), which a lock bound to its connection
                // would otherwise learn only from the next Unlock.
                let reason = tokio::select! {
                    reason = guard.keep_alive() => reason,
                    reason = this.deposed(guard.fence(), value) => reason,
                };
                let _ = tx.send(Some(reason));
            })
        };
        Ok(Leadership {
            guard: Some(guard),
            client: self.client.clone(),
            key: self.key.clone(),
            lost,
            keeper,
        })
    }

    /// Resolves when the key's first holder is no longer `fence`, as the
    /// server pushes it; never while it is (a value proclaimed is followed,
    /// an error retried).
    async fn deposed(&self, fence: u64, mut value: Vec<u8>) -> Lost {
        let limit = self.watch_limit();
        loop {
            let known = Some((fence, value.as_slice()));
            match self.client.watch(self.key.as_str(), known, limit).await {
                Ok(state) => match state.first() {
                    Some(h) if h.fence == fence => value = h.value.clone(),
                    _ => return Lost::NotHeld,
                },
                // A server without Watch: the guard alone tells.
                Err(Error::Server {
                    status: ResponseStatus::InvalidType,
                    ..
                }) => std::future::pending::<()>().await,
                // The guard reports a lost connection itself.
                Err(_) => tokio::time::sleep(OBSERVE_RETRY).await,
            }
        }
    }

    /// How long each Watch waits: within the server's session timeout, so
    /// a connection that only waits is never taken for idle.
    fn watch_limit(&self) -> Duration {
        OBSERVE_WATCH
            .min(self.client.session_timeout() / 2)
            .max(Duration::from_millis(100))
    }

    /// Who leads now, if anyone.
    ///
    /// # Errors
    /// Connection and server errors.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let states = self.client.inspect(self.key.as_str()).await?;
        let state = states
            .first()
            .ok_or_else(|| Error::Protocol("Inspect answered without key_info".into()))?;
        Ok(Leader::of(state))
    }

    /// Follows the leadership: the receiver holds the current leader (or
    /// `None`) and changes with every new leader or proclaimed value,
    /// pushed by the server through Watch (one outstanding at a time,
    /// sent again after its limit or an error; against a cluster, also to
    /// a new leader node). A server that refuses Watch (its
    /// `--max-watchers` reached, or 0) is read instead, every 5 s at most.
    /// A change and its reversal between two answers may be seen as none.
    /// The task stops when every receiver is dropped.
    ///
    /// # Errors
    /// The first read of the leader failed.
    pub async fn observe(&self) -> Result<watch::Receiver<Option<Leader>>> {
        let first = self.leader().await?;
        let (tx, rx) = watch::channel(first);
        let this = self.clone();
        let limit = self.watch_limit();
        tokio::spawn(async move {
            let mut pause = Backoff::new(OBSERVE_RETRY, OBSERVE_MAX_RETRY);
            loop {
                let known = tx.borrow().clone();
                let known_ref = known.as_ref().map(|l| (l.fence, l.value.as_slice()));
                let watched = this.client.watch(this.key.as_str(), known_ref, limit);
                let answer = tokio::select! {
                    _ = tx.closed() => return,
                    a = watched => a,
                };
                match answer {
                    Ok(state) => {
                        pause.reset();
                        let now = Leader::of(&state);
                        if !Leader::same(&known, &now) {
                            tx.send_replace(now);
                        }
                    }
                    Err(Error::ConnectionLost(_)) if this.client.is_closed() => return,
                    Err(_) => {
                        tokio::select! {
                            _ = tx.closed() => return,
                            _ = tokio::time::sleep(pause.pause()) => {}
                        }
                        // Doubling up to a bound: a server that keeps
                        // refusing (WatchLimit, no Watch at all) is not
                        // hammered, but read at that pace, so the receiver
                        // does not keep a state that is long gone.
                        pause.grow();
                        let read = tokio::select! {
                            _ = tx.closed() => return,
                            r = this.leader() => r,
                        };
                        if let Ok(now) = read {
                            if !Leader::same(&tx.borrow(), &now) {
                                tx.send_replace(now);
                            }
                        }
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// This process leads an election. Dropping it resigns (in the
/// background, as dropping a [`LockGuard`] unlocks).
#[derive(Debug)]
pub struct Leadership {
    /// `None` once resigned.
    guard: Option<Arc<LockGuard>>,
    client: Client,
    key: String,
    /// Set once, by the keeper task, when leadership is lost.
    lost: watch::Receiver<Option<Lost>>,
    keeper: JoinHandle<()>,
}

impl Leadership {
    /// The fencing token of this leadership: fence what you do as leader
    /// with it, and a deposed leader's late writes are refused.
    pub fn fence(&self) -> u64 {
        self.guard.as_ref().map_or(0, |g| g.fence())
    }

    /// The election's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Resolves when this process can no longer be assumed to lead, with
    /// the reason (see [`LockGuard::lost`]): its connection (or session)
    /// ended, the server said the key is not held, or no answer came in
    /// time. Any number of callers may wait.
    pub async fn lost(&self) -> Lost {
        let mut lost = self.lost.clone();
        let reason = match lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The keeper ended without a word: only a panic does that.
            Err(_) => None,
        };
        reason.unwrap_or(Lost::NotHeld)
    }

    /// Whether [`Leadership::lost`] would resolve at once.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some() || self.guard.as_ref().is_none_or(|g| g.is_lost())
    }

    /// Announces `value` (at most [`crate::MAX_VALUE_LEN`] bytes) as the
    /// leader's, for [`Election::leader`] and observers.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this process no longer leads; connection and
    /// server errors.
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        self.client
            .proclaim(self.key.as_str(), self.fence(), value)
            .await
    }

    /// Gives up leadership: the next campaigner in line leads.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when it was lost already; connection errors.
    pub async fn resign(mut self) -> Result<()> {
        self.keeper.abort();
        let _ = (&mut self.keeper).await;
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        match Arc::try_unwrap(guard) {
            Ok(guard) => guard.unlock().await,
            // The keeper is gone, so nobody else holds it; dropping it
            // unlocks in the background all the same.
            Err(guard) => {
                drop(guard);
                Ok(())
            }
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // The keeper holds a clone of the guard; once it stops, the last
        // clone's drop unlocks.
        self.keeper.abort();
    }
}
