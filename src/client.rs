//! The client: one TCP connection shared by any number of tasks.
//!
//! Requests are pipelined: each call is written as soon as it is made and
//! matched to its response by position, since the server answers in order.
//! A writer task and a reader task own the two halves of the socket, so a
//! slow reader never stalls writes and the other way round. At most
//! [`ClientOptions::max_in_flight`] requests are unanswered at once; further
//! calls wait for a slot.
//!
//! On connecting, the client asks the server for its limits (Hello): above
//! all its session timeout, after which a quiet connection may be ended and
//! its locks released. The writer sends a Ping whenever nothing was written
//! for a quarter of that timeout (or [`ClientOptions::heartbeat`], if
//! shorter), so the server never drops a healthy, quiet connection (Pings
//! behind a waiting Lock still count for the server). The reader notes the
//! send time of every answered request: the basis of each guard's safety
//! deadline (see [`crate::safety`]). When the connection ends, every pending
//! call fails with [`Error::ConnectionLost`], every later call fails at once,
//! and [`Client::closed`] resolves: there is no silent reconnect, because the
//! server released every lock bound to the connection.

use crate::dial::Dial;
use crate::error::{Disconnect, Error, Result};
use crate::event::Event;
use crate::inspect::{server_time, KeyState, Overview};
use crate::keys::IntoKeys;
use crate::options::ClientOptions;
use crate::owners::{Conn, Owners};
use crate::proto::{RequestLock, RequestType, Response, ServerStats};
use crate::request::micros;
use crate::servers::Servers;
use crate::Limits;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// A connection to a dlock server, shared by cloning.
///
/// ```
/// use dlock::{Client, Error, LockOptions};
/// use std::time::Duration;
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), dlock::Error> {
/// // A real server on a free loopback port, for this example; in production
/// // the address is your dlock-server's (default "127.0.0.1:7436").
/// let server = dlock_server::testing::TestServer::start(dlock_server::Config::default()).await;
/// let addr = server.addr_string();
///
/// let client = Client::connect(&addr).await?;
/// let guard = client
///     .lock(["reports/daily"], LockOptions::new().wait(Duration::from_secs(30)))
///     .await?;
/// println!("holding {:?} with fencing token {}", guard.keys(), guard.fence());
///
/// // Another connection finds the key busy.
/// let other = Client::connect(&addr).await?;
/// match other.lock(["reports/daily"], LockOptions::new().no_wait()).await {
///     Err(Error::Busy { busy }) => assert_eq!(busy, ["reports/daily"]),
///     other => panic!("expected busy, got {other:?}"),
/// }
///
/// guard.unlock().await?;
/// Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Conn>,
    owners: Arc<Owners>,
}

impl Client {
    /// Connects with default options to `servers`: one address
    /// (`"127.0.0.1:7436"`), or several nodes of a cluster as a
    /// comma-separated list or a list of addresses (see [`Servers`]).
    ///
    /// # Errors
    /// [`Error::Connect`] or [`Error::ConnectTimeout`] for one address;
    /// [`Error::Unreachable`] naming every address tried for several;
    /// [`Error::NotOneCluster`] when one of several is a single server.
    pub async fn connect(servers: impl Into<Servers>) -> Result<Client> {
        Self::connect_with(servers, ClientOptions::default()).await
    }

    /// Connects with `options`.
    ///
    /// Against a cluster (a node whose Hello says its sessions are
    /// resumable) the client finds the leader, following the address a
    /// node that is not the leader names, and opens a session; when the
    /// connection breaks it resumes the session on the (new) leader within
    /// its TTL and sends again every request not answered, which the
    /// cluster recognises: nothing is lost or done twice. See
    /// [`Client::events`].
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub async fn connect_with(
        servers: impl Into<Servers>,
        options: ClientOptions,
    ) -> Result<Client> {
        let servers = servers.into();
        if servers.addrs().is_empty() {
            return Err(Error::Unreachable {
                attempts: Vec::new(),
            });
        }
        let owners = Arc::new(Owners::new(Dial::new(servers, options)));
        Self::open(owners).await
    }

    /// Opens one connection sharing `owners`.
    async fn open(owners: Arc<Owners>) -> Result<Client> {
        Ok(Client {
            inner: owners.open().await?,
            owners,
        })
    }

    /// A connection of its own for one lock: an idle one, or a new one.
    pub(crate) async fn owner_connection(&self) -> Result<Client> {
        Ok(Client {
            inner: self.owners.take().await?,
            owners: self.owners.clone(),
        })
    }

    /// A new connection of this client, to the server (or the cluster's
    /// leader) it would connect to now.
    pub(crate) async fn reopen(&self) -> Result<Client> {
        Self::open(self.owners.clone()).await
    }

    /// Tells [`Client::events`]' subscribers.
    pub(crate) fn announce(&self, event: Event) {
        let _ = self.owners.dial.events.send(event);
    }

    /// Gives back a lock connection that holds nothing any more.
    pub(crate) fn recycle(self) {
        self.owners.recycle(self.inner);
    }

    /// Keeps a lock connection open as long as the `Client` lives, since
    /// closing it would release the lock it holds.
    pub(crate) fn park(self) {
        self.owners.park(self.inner);
    }

    /// The limits the server stated when this client connected; `None` for
    /// a server that predates the Hello request.
    pub fn limits(&self) -> Option<Limits> {
        self.inner.link.limits
    }

    /// How long the server may go without a request from this client
    /// before it ends the connection and releases its locks without lease:
    /// as the server stated, or [`ClientOptions::fallback_session_timeout`].
    /// On a cluster: the session's TTL.
    pub fn session_timeout(&self) -> Duration {
        self.inner.link.session_timeout
    }

    /// The cluster session this client's connection acts for; `None`
    /// against a single server, where the connection is the owner.
    pub fn session(&self) -> Option<u64> {
        Some(self.inner.link.session).filter(|&s| s != 0)
    }

    pub(crate) fn safety_margin(&self) -> Duration {
        self.owners.dial.options.safety_margin
    }

    /// Send time of the latest request the server answered.
    pub(crate) fn last_acked(&self) -> Instant {
        self.inner.link.acked.last()
    }

    /// The address of the server (on a cluster: the node) this client's
    /// connection goes to now.
    pub fn addr(&self) -> String {
        self.inner.link.addr()
    }

    /// The addresses this client was given.
    pub fn servers(&self) -> &Servers {
        &self.owners.dial.servers
    }

    /// Reconnects of this client's connections: resumed sessions on a
    /// cluster, leases taken over by fence on a new connection (see
    /// [`LockGuard::keep_alive`](crate::LockGuard::keep_alive)). Events before the call are not seen.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.owners.dial.events.subscribe()
    }

    /// Resolves when the connection has ended, with the reason.
    pub async fn closed(&self) -> Disconnect {
        let mut lost = self.inner.link.lost.clone();
        loop {
            if let Some(reason) = lost.borrow_and_update().as_ref() {
                return reason.clone();
            }
            if lost.changed().await.is_err() {
                return Disconnect::Dropped;
            }
        }
    }

    /// Lets go of this handle, as dropping it would, then waits until what
    /// the client's connections do once nobody holds them has been done, 10 s
    /// at most: call it before a program exits, or ends its runtime, after
    /// giving up a wait.
    ///
    /// A `lock` future dropped while its Lock waited (an `enqueue` or a
    /// [`Queued::wait`](crate::Queued::wait) too), and the connections the
    /// last handle takes with it, end in the background: the connection is
    /// half-closed and read on, and a grant that crossed the close, a lease
    /// too, is released by fence on a connection opened for it. That work
    /// is made of tasks of the tokio runtime and dies with it: a program
    /// that exits right after giving up a wait may leave a lease granted as
    /// it gave up holding the key, for nobody, until the lease ends. `close`
    /// returns once every such connection of this client (whichever clone
    /// let go of it, before this call or by it) has ended and each grant it
    /// read was released, or after 10 s (the limit of the drain and its
    /// release together, as in the Python, Go and TypeScript clients); it
    /// returns at once when there is nothing to wait for. So too for a
    /// [`LockGuard`](crate::LockGuard) of a lease dropped without
    /// `unlock`: `close` waits for its Unlock's answer and, if its
    /// connection had ended, for its release by fence on a new one.
    ///
    /// Only this handle goes. Other clones, the guards of locks taken with
    /// it (each holds a `Client`) and Locks still waiting in other tasks
    /// keep their connections: drop or abort those first, and `close` waits
    /// for what they leave behind.
    pub async fn close(self) {
        let drains = self.owners.drains.clone();
        // Counts this handle's connections among the drains, when it was
        // the last to hold them, before the wait starts.
        drop(self);
        drains.finished().await;
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Round trip to the server.
    ///
    /// # Errors
    /// Any error of the connection or the server.
    pub async fn ping(&self) -> Result<Duration> {
        let start = Instant::now();
        self.call(RequestType::Ping, RequestLock::default()).await?;
        Ok(start.elapsed())
    }

    /// Releases `keys` held under `fence`, whichever connection took them:
    /// how a restarted process releases a lease it took earlier.
    ///
    /// # Errors
    /// [`Error::NotHeld`] with the keys not held under `fence`.
    pub async fn unlock_fence(&self, keys: impl IntoKeys, fence: u64) -> Result<()> {
        let body = RequestLock {
            keys: keys.into_keys(),
            fence,
            ..RequestLock::default()
        };
        self.call(RequestType::Unlock, body).await.map(drop)
    }

    /// Sets the lease of `keys` held under `fence` to now + `lease`.
    ///
    /// # Errors
    /// [`Error::NotHeld`] with the keys not held under `fence`.
    pub async fn renew_fence(
        &self,
        keys: impl IntoKeys,
        fence: u64,
        lease: Duration,
    ) -> Result<()> {
        let body = RequestLock {
            keys: keys.into_keys(),
            fence,
            release_micro: micros(lease).max(1),
            ..RequestLock::default()
        };
        self.call(RequestType::Renew, body).await.map(drop)
    }

    /// Who holds and who waits for `keys`, one [`KeyState`] per key in
    /// the order named.
    ///
    /// # Errors
    /// Any error of the connection or the server.
    pub async fn inspect(&self, keys: impl IntoKeys) -> Result<Vec<KeyState>> {
        let body = RequestLock {
            keys: keys.into_keys(),
            ..RequestLock::default()
        };
        let resp = self.call(RequestType::Inspect, body).await?;
        let at = server_time(resp.server_unix_time);
        Ok(resp
            .key_info
            .into_iter()
            .map(|i| KeyState::from_proto(i, at))
            .collect())
    }

    /// Replaces the value of `keys` held under `fence` (see
    /// [`Client::lock_with_value`]), whichever connection took them.
    ///
    /// # Errors
    /// [`Error::NotHeld`] with the keys not held under `fence`;
    /// [`ResponseStatus::ValueTooLarge`](crate::proto::ResponseStatus::ValueTooLarge) for a value over
    /// [`crate::MAX_VALUE_LEN`].
    pub async fn proclaim(
        &self,
        keys: impl IntoKeys,
        fence: u64,
        value: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let body = RequestLock {
            keys: keys.into_keys(),
            fence,
            value: value.into(),
            ..RequestLock::default()
        };
        self.call(RequestType::Proclaim, body).await.map(drop)
    }

    /// Waits until the first holder of `key` (the one with the lowest
    /// fencing token: the only one of a key held exclusively) is not
    /// `known` (its token and value; `None`: the key is free), or until
    /// `limit` passes, and returns the key as it is then: no polling, the
    /// server answers as soon as the change is applied (on a cluster,
    /// committed). Compare [`KeyState::first`] with `known` to tell a
    /// change from the limit. The server caps `limit` (10 minutes).
    ///
    /// Runs on a connection of its own, so it delays no other call; if the
    /// future is dropped, that connection closes and the server forgets
    /// the Watch. Against a cluster, a Watch is the leader's alone: after
    /// a failover the library sends it again to the new leader.
    ///
    /// # Errors
    /// [`ResponseStatus::WatchLimit`](crate::proto::ResponseStatus::WatchLimit) when the server has its most
    /// Watches parked; connection and server errors.
    pub async fn watch(
        &self,
        key: impl Into<String>,
        known: Option<(u64, &[u8])>,
        limit: Duration,
    ) -> Result<KeyState> {
        let (fence, value) = known.unwrap_or((0, &[]));
        let body = RequestLock {
            keys: vec![key.into()],
            fence,
            value: value.to_vec(),
            wait_micro: micros(limit).max(1),
            ..RequestLock::default()
        };
        self.check_open()?;
        let conn = self.owner_connection().await?;
        let resp = conn.call(RequestType::Watch, body).await;
        conn.recycle();
        let resp = resp?;
        let at = server_time(resp.server_unix_time);
        resp.key_info
            .into_iter()
            .next()
            .map(|i| KeyState::from_proto(i, at))
            .ok_or_else(|| Error::Protocol("Watch answered without key_info".into()))
    }

    /// The server's counts: connections, held keys, waiting requests.
    ///
    /// # Errors
    /// Any error of the connection or the server.
    pub async fn stats(&self) -> Result<ServerStats> {
        self.overview(0).await.map(|o| o.stats)
    }

    /// The server's counts and its `busiest` busiest keys (at most 100):
    /// the most waiters first, then held longest. What a live view such as
    /// `dlock top` shows; `grants` and `handoffs` are counters, so a rate
    /// is the difference between two overviews.
    ///
    /// # Errors
    /// [`ResponseStatus::InvalidArgument`](crate::proto::ResponseStatus::InvalidArgument) for more than 100 keys; any error
    /// of the connection or the server.
    pub async fn overview(&self, busiest: u32) -> Result<Overview> {
        let body = RequestLock {
            limit: busiest,
            ..RequestLock::default()
        };
        let resp = self.call(RequestType::Inspect, body).await?;
        let server_time = server_time(resp.server_unix_time);
        let mut stats = resp.server_stats.ok_or_else(|| {
            Error::Protocol("Inspect without keys answered no server_stats".into())
        })?;
        let busiest = std::mem::take(&mut stats.busiest)
            .into_iter()
            .map(|i| KeyState::from_proto(i, server_time))
            .collect();
        Ok(Overview {
            stats: *stats,
            busiest,
            server_time,
        })
    }

    /// Sends one request and waits for its response, mapping error statuses
    /// to [`Error`].
    pub(crate) async fn call(&self, kind: RequestType, body: RequestLock) -> Result<Response> {
        self.call_releasing(kind, body, None).await
    }

    /// [`Client::call`] for a request whose answer may be a grant of
    /// `release` (a Wait): a grant that arrives once nobody waits for it
    /// is released. Lock and Enqueue name their keys themselves.
    pub(crate) async fn call_releasing(
        &self,
        kind: RequestType,
        body: RequestLock,
        release: Option<Vec<String>>,
    ) -> Result<Response> {
        self.inner.call_releasing(kind, body, release).await
    }

    /// Sends the Unlock of `keys` held under `fence` without waiting for
    /// its answer: a guard being dropped, where waiting is impossible. A
    /// lock without a lease ends with the connection anyway, so on a lost
    /// connection nothing more is needed. One that `may_be_lease` outlives
    /// it: if the connection (on a cluster, its session) has ended or ends
    /// before the answer, the Unlock is sent again by fence on a connection
    /// opened for it, within 10 s, in a task of the current runtime that
    /// [`Client::close`] waits for.
    pub(crate) fn unlock_detached(&self, keys: Vec<String>, fence: u64, may_be_lease: bool) {
        if may_be_lease {
            self.inner.release_detached(keys, fence);
            return;
        }
        let body = RequestLock {
            keys,
            fence,
            ..RequestLock::default()
        };
        self.inner.send_detached(RequestType::Unlock, body);
    }

    /// An error if this client's connection has ended.
    pub(crate) fn check_open(&self) -> Result<()> {
        self.inner.check_open()
    }
}
