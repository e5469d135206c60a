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
use crate::enqueue::{Enqueued, Queued};
use crate::error::{Disconnect, Error, Result};
use crate::event::Event;
use crate::guard::{LockGuard, LockParts};
use crate::inspect::{server_time, KeyState, Overview};
use crate::keys::IntoKeys;
use crate::Limits;
use crate::link::{Call, Link};
use crate::proto::{Request, RequestLock, RequestType, Response, ResponseStatus, ServerStats};
use crate::safety::DEFAULT_SAFETY_MARGIN;
use crate::servers::Servers;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::time::Instant;

/// Settings of a [`Client`]. Its `Debug` shows whether an access token is
/// set, never the token, so options can be logged.
#[derive(Clone)]
pub struct ClientOptions {
    /// Give up connecting after this long. Default 5 s.
    pub connect_timeout: Duration,
    /// Send a Ping when nothing was written for this long, or for a quarter
    /// of the server's session timeout if that is shorter. Default 10 s.
    pub heartbeat: Duration,
    /// Most requests unanswered at once. Default 256, under the server's
    /// default pipeline limit of 1024.
    pub max_in_flight: usize,
    /// Access token sent with every request.
    pub access_token: Option<String>,
    /// TCP keepalive idle time; probes follow at a third of it and the
    /// connection is declared dead after three unanswered ones. Unacknowledged
    /// writes (heartbeats) fail the connection after the same total time.
    /// Default 10 s.
    pub keepalive: Duration,
    /// How long before a held lock's safety deadline it is reported lost
    /// ([`crate::Lost::Jeopardy`]) when no answer from the server has
    /// renewed it: the time the holder gets to stop. At most a quarter of
    /// the lease or session timeout is used. Default 2 s.
    pub safety_margin: Duration,
    /// The session timeout assumed for a server that does not state one
    /// (one that predates Hello). Default 10 s, this server's default
    /// session timeout (its write timeout); set it to the least of the old
    /// server's idle, keepalive and write timeouts.
    pub fallback_session_timeout: Duration,
    /// Connect with TLS, trusting and presenting what this configuration
    /// holds (see [`crate::tls::client_config`]); the server's certificate
    /// must name the host part of the address. `None` (the default): plain
    /// TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// On a cluster: the TTL asked for this client's sessions, how long
    /// one outlives a broken connection (and so how long a failover may
    /// take without losing locks), from 1 s up to the cluster's
    /// `--max-session-ttl`. `None` (the default): the cluster's default
    /// (`--session-ttl`, 10 s). Ignored by a single server.
    pub session_ttl: Option<Duration>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field by name, so a field added later is not left out
        // without the compiler saying so.
        let ClientOptions {
            connect_timeout,
            heartbeat,
            max_in_flight,
            access_token,
            keepalive,
            safety_margin,
            fallback_session_timeout,
            tls,
            session_ttl,
        } = self;
        f.debug_struct("ClientOptions")
            .field("connect_timeout", connect_timeout)
            .field("heartbeat", heartbeat)
            .field("max_in_flight", max_in_flight)
            .field("access_token", &access_token.as_ref().map(|_| "(set)"))
            .field("keepalive", keepalive)
            .field("safety_margin", safety_margin)
            .field("fallback_session_timeout", fallback_session_timeout)
            .field("tls", &tls.is_some())
            .field("session_ttl", session_ttl)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(10),
            max_in_flight: 256,
            access_token: None,
            keepalive: Duration::from_secs(10),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            fallback_session_timeout: Duration::from_secs(10),
            tls: None,
            session_ttl: None,
        }
    }
}

/// How long a Lock may wait for busy keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockWait {
    /// Wait as long as it takes (the default).
    #[default]
    Forever,
    /// Wait at most this long.
    AtMost(Duration),
    /// Do not wait: fail at once if any key is busy.
    No,
}

/// Options of a Lock request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// How long to wait for busy keys.
    pub wait: LockWait,
    /// Take the keys as a lease of this length: it outlives the connection
    /// and expires unless renewed. `None`: held until unlocked or until the
    /// connection ends.
    pub lease: Option<Duration>,
    /// Take every key shared: alongside other shared holders, never
    /// alongside an exclusive one. See docs/PROTOCOL.md, "Shared locks and
    /// semaphores".
    pub shared: bool,
    /// Take every key shared, at most this many holders at once (a
    /// semaphore); 0 is no limit. Everyone sharing a key must name the same
    /// limit. Implies [`LockOptions::shared`] when above 0.
    pub limit: u32,
}

impl LockOptions {
    /// Wait without limit, no lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wait at most `limit`.
    pub fn wait(mut self, limit: Duration) -> Self {
        self.wait = LockWait::AtMost(limit);
        self
    }

    /// Fail at once if busy.
    pub fn no_wait(mut self) -> Self {
        self.wait = LockWait::No;
        self
    }

    /// Take a lease of `lease`. A zero lease means no lease, as on the wire.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Take every key shared (a reader lock): any number of shared holders
    /// at once, or one exclusive holder. A Lock for a key this guard's
    /// owner holds in the other mode fails with
    /// [`ResponseStatus::ModeConflict`].
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Take every key as a semaphore of `n` holders: shared, at most `n` at
    /// once. Holders and waiters that name another limit for the key fail
    /// with [`ResponseStatus::LimitMismatch`]. 0 is a plain shared lock.
    pub fn limit(mut self, n: u32) -> Self {
        self.shared = true;
        self.limit = n;
        self
    }

    fn shares(&self) -> bool {
        self.shared || self.limit > 0
    }
}

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
    inner: Arc<Inner>,
    owners: Arc<Owners>,
}

/// One connection (a [`Link`]) and what calls on it share.
#[derive(Debug)]
struct Inner {
    link: Link,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
}

impl Inner {
    fn is_closed(&self) -> bool {
        self.link.is_closed()
    }
}

/// Most connections kept open for later locks once their lock is released.
const MAX_IDLE_OWNERS: usize = 64;

/// The server counts a connection (on a cluster, a session) as one owner:
/// a key it holds is granted again to the same owner. So every lock is
/// taken on a connection of its own, and tasks sharing a `Client` exclude
/// each other exactly as processes do; a Lock that waits also delays
/// nothing else (answers on one connection come in request order).
/// Connections whose lock is released are kept for the next lock.
///
/// Kept connections are held without their `Client` wrapper: a `Client`
/// holds the `Owners`, and the cycle would keep every connection open after
/// the last `Client` is dropped.
#[derive(Debug)]
struct Owners {
    dial: Arc<Dial>,
    /// Connections holding nothing, ready for the next lock.
    idle: Mutex<Vec<Arc<Inner>>>,
    /// Connections whose lock was handed over with `into_parts` without a
    /// lease: kept open, since closing them would release the lock.
    parked: Mutex<Vec<Arc<Inner>>>,
}

impl Owners {
    /// Takes back a connection that holds nothing.
    fn recycle(&self, conn: Arc<Inner>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_OWNERS {
            idle.push(conn);
        }
    }
}

impl Client {
    /// Connects with default options to `servers`: one address
    /// (`"127.0.0.1:7436"`), or several nodes of a cluster as a
    /// comma-separated list or a list of addresses (see [`Servers`]).
    ///
    /// # Errors
    /// [`Error::Connect`] or [`Error::ConnectTimeout`] for one address;
    /// [`Error::Unreachable`] naming every address tried for several.
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
        let owners = Arc::new(Owners {
            dial: Arc::new(Dial::new(servers, options)),
            idle: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
        });
        Self::open(owners).await
    }

    /// Opens one connection sharing `owners`.
    async fn open(owners: Arc<Owners>) -> Result<Client> {
        let link = Link::open(owners.dial.clone()).await?;
        let slots = Arc::new(Semaphore::new(owners.dial.options.max_in_flight.max(1)));
        Ok(Client {
            inner: Arc::new(Inner {
                link,
                slots,
                next_id: AtomicU64::new(1),
            }),
            owners,
        })
    }

    /// A connection of its own for one lock: an idle one, or a new one.
    async fn owner_connection(&self) -> Result<Client> {
        loop {
            let idle = self
                .owners
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop();
            match idle {
                Some(inner) if !inner.is_closed() => {
                    return Ok(Client {
                        inner,
                        owners: self.owners.clone(),
                    })
                }
                Some(_) => continue,
                None => return Self::open(self.owners.clone()).await,
            }
        }
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
        self.owners
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.inner);
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
    /// [`LockGuard::keep_alive`]). Events before the call are not seen.
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

    /// Takes all `keys` at once, on a connection of the lock's own: tasks
    /// sharing a `Client` exclude each other as separate processes do (FIFO
    /// included), and a Lock that waits delays no other call.
    ///
    /// Cancel-safe: if the returned future is dropped while the request
    /// waits, its connection closes and the server withdraws the request.
    ///
    /// # Errors
    /// [`Error::Timeout`] with the busy keys when the wait limit passes, or
    /// [`Error::Busy`] at once with [`LockWait::No`]; [`Error::Server`] for
    /// invalid keys, a server limit, a mode or limit the key's other holders
    /// disagree with ([`ResponseStatus::ModeConflict`],
    /// [`ResponseStatus::LimitMismatch`]); connection errors.
    pub async fn lock(&self, keys: impl IntoKeys, options: LockOptions) -> Result<LockGuard> {
        self.lock_with_value(keys, options, Vec::new()).await
    }

    /// [`Client::lock`], each hold carrying `value` (at most
    /// [`crate::MAX_VALUE_LEN`] bytes): [`Client::inspect`] and
    /// [`Client::watch`] show it, [`Client::proclaim`] replaces it. An
    /// election's leader puts its identity here.
    ///
    /// # Errors
    /// As [`Client::lock`]; [`ResponseStatus::ValueTooLarge`] for a value
    /// over the limit.
    pub async fn lock_with_value(
        &self,
        keys: impl IntoKeys,
        options: LockOptions,
        value: impl Into<Vec<u8>>,
    ) -> Result<LockGuard> {
        let keys: Vec<String> = keys.into_keys();
        let mut body = lock_body(&keys, &options);
        body.value = value.into();
        self.send_lock(keys, body, &options).await
    }

    /// [`Client::lock`] with modes per key: all of `exclusive` and all of
    /// `shared` at once (still all or nothing, FIFO, deadlock-free), the
    /// first exclusively, the second shared under `options.limit` (0: a
    /// reader lock; `options.shared` is not needed). For example exclusive
    /// on `deploy/web`, shared on `config`.
    ///
    /// # Errors
    /// As [`Client::lock`].
    pub async fn lock_mixed(
        &self,
        exclusive: impl IntoKeys,
        shared: impl IntoKeys,
        options: LockOptions,
    ) -> Result<LockGuard> {
        let shared: Vec<String> = shared.into_keys();
        let mut keys: Vec<String> = exclusive.into_keys();
        keys.extend(shared.iter().cloned());
        let exclusive_only = LockOptions {
            shared: false,
            limit: 0,
            ..options
        };
        let mut body = lock_body(&keys, &exclusive_only);
        if !shared.is_empty() {
            body.shared_keys = shared;
            body.limit = options.limit;
        }
        self.send_lock(keys, body, &options).await
    }

    /// Sends a Lock for `keys` on a connection of its own and makes its
    /// guard.
    async fn send_lock(
        &self,
        keys: Vec<String>,
        body: RequestLock,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        // A Client whose connection is gone stays gone, for locks too:
        // there is no silent reconnect.
        self.check_open()?;
        let conn = self.owner_connection().await?;
        let sent = Instant::now();
        let resp = match conn.call(RequestType::Lock, body).await {
            Ok(resp) => resp,
            Err(e) => {
                // Busy, refused or timed out: the connection holds nothing.
                conn.recycle();
                return Err(busy_if_no_wait(e, options));
            }
        };
        granted(conn, keys, resp.fence, lease_of(options), sent).await
    }

    /// Asks for all `keys` at once as [`Client::lock`] does, in two steps:
    /// the server answers at once, with the lock if the keys were free
    /// ([`Enqueued::Granted`]), or with the request's place in line
    /// ([`Enqueued::Queued`]), whose [`Queued::wait`] then waits for the
    /// grant. In between the request keeps its place in every queue, FIFO,
    /// and the caller can act on knowing that it waits (tell someone, show
    /// a progress line). The wait limit in `options` counts from this call.
    ///
    /// Cancel-safe: dropping the [`Queued`] (or this future, or the
    /// `wait` future) closes the request's connection, and the server
    /// withdraws the request or releases what it granted.
    ///
    /// # Errors
    /// As [`Client::lock`]; [`Error::Busy`] at once with [`LockWait::No`].
    pub async fn enqueue(&self, keys: impl IntoKeys, options: LockOptions) -> Result<Enqueued> {
        let keys: Vec<String> = keys.into_keys();
        let body = lock_body(&keys, &options);
        self.check_open()?;
        let conn = self.owner_connection().await?;
        let sent = Instant::now();
        let resp = match conn.call_releasing(RequestType::Enqueue, body, None).await {
            Ok(resp) => resp,
            Err(e) => {
                conn.recycle();
                return Err(busy_if_no_wait(e, &options));
            }
        };
        if resp.status == ResponseStatus::Queued as i32 {
            return Ok(Enqueued::Queued(Queued::new(
                conn,
                keys,
                resp.ticket,
                resp.place,
                options,
                sent,
            )));
        }
        let guard = granted(conn, keys, resp.fence, lease_of(&options), sent).await?;
        Ok(Enqueued::Granted(guard))
    }

    /// Takes over a lease held under `fence` (taken by this process on an
    /// earlier connection, or handed over by another process): renews it to
    /// `lease` from now and returns a guard for it, whose safety deadline
    /// counts from this renewal.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the keys are not (all) held under `fence`;
    /// [`Error::Server`] for a lease over the server's maximum; connection
    /// errors.
    pub async fn take_over(
        &self,
        keys: impl IntoKeys,
        fence: u64,
        lease: Duration,
    ) -> Result<LockGuard> {
        let keys: Vec<String> = keys.into_keys();
        let sent = Instant::now();
        self.renew_fence(&keys, fence, lease).await?;
        Ok(LockGuard::new(
            self.clone(),
            keys,
            fence,
            Some((sent, lease)),
            false,
        ))
    }

    /// Takes over a lock handed over as [`LockParts`] (by
    /// [`LockGuard::into_parts`], here or in another process): the round
    /// trip of `into_parts`. The same as [`Client::take_over`] with the
    /// parts' lease, renewed from now.
    ///
    /// # Errors
    /// Parts without a lease are refused before anything is sent, as
    /// [`Error::Server`] with [`ResponseStatus::InvalidArgument`]: such a
    /// lock lives and dies with the connection that took it, and nobody
    /// else can take it over. Otherwise as [`Client::take_over`].
    pub async fn from_parts(&self, parts: LockParts) -> Result<LockGuard> {
        let Some(lease) = parts.lease else {
            return Err(Error::Server {
                status: ResponseStatus::InvalidArgument,
                text: format!(
                    "the lock on {:?} (fence {}) has no lease: it is bound to the connection that took it and cannot be taken over",
                    parts.keys, parts.fence
                ),
            });
        };
        self.take_over(parts.keys, parts.fence, lease).await
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
    /// [`ResponseStatus::ValueTooLarge`] for a value over
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
    /// [`ResponseStatus::WatchLimit`] when the server has its most
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
    /// [`ResponseStatus::InvalidArgument`] for more than 100 keys; any error
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
        self.check_open()?;
        let slot = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.lost_error())?;
        let req = self.request(kind, body);
        let (tx, rx) = oneshot::channel();
        let call = Call {
            req,
            reply: Some(tx),
            slot: Some(slot),
            release,
        };
        self.inner
            .link
            .calls
            .send(call)
            .await
            .map_err(|_| self.lost_error())?;
        let resp = rx.await.map_err(|_| self.lost_error())??;
        check(resp)
    }

    /// Sends a request without waiting for its answer; used where waiting is
    /// impossible (a guard being dropped). Best effort: on a lost connection
    /// the server has released connection-bound locks anyway.
    pub(crate) fn send_detached(&self, kind: RequestType, body: RequestLock) {
        if self.is_closed() {
            return;
        }
        let call = Call {
            req: self.request(kind, body),
            reply: None,
            slot: None,
            release: None,
        };
        if let Err(mpsc::error::TrySendError::Full(call)) = self.inner.link.calls.try_send(call) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let calls = self.inner.link.calls.clone();
                rt.spawn(async move {
                    let _ = calls.send(call).await;
                });
            }
        }
    }

    fn request(&self, kind: RequestType, body: RequestLock) -> Request {
        Request {
            version: crate::PROTOCOL_VERSION,
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            r#type: kind as i32,
            lock: Some(body),
            ..Request::default()
        }
    }

    fn check_open(&self) -> Result<()> {
        match self.inner.link.lost.borrow().as_ref() {
            Some(reason) => Err(Error::ConnectionLost(reason.clone())),
            None => Ok(()),
        }
    }

    fn lost_error(&self) -> Error {
        let reason = self.inner.link.lost.borrow().clone();
        Error::ConnectionLost(reason.unwrap_or(Disconnect::Closed))
    }
}

/// The Lock (or Enqueue) body for `keys` under `options`.
fn lock_body(keys: &[String], options: &LockOptions) -> RequestLock {
    let mut body = RequestLock {
        keys: keys.to_vec(),
        release_micro: lease_of(options).map_or(0, micros),
        ..RequestLock::default()
    };
    if options.shares() {
        // Only set when asked, so an exclusive Lock is encoded exactly
        // as by every older client.
        body.shared_keys = keys.to_vec();
        body.limit = options.limit;
    }
    match options.wait {
        LockWait::Forever => {}
        // A positive limit below a microsecond still means "wait a little".
        LockWait::AtMost(d) => body.wait_micro = micros(d).max(1),
        LockWait::No => body.try_lock = true,
    }
    body
}

/// The lease `options` ask for: on the wire a zero lease means none; so it
/// does here.
pub(crate) fn lease_of(options: &LockOptions) -> Option<Duration> {
    options.lease.filter(|l| !l.is_zero())
}

/// A try-lock's "timed out" is "busy".
pub(crate) fn busy_if_no_wait(e: Error, options: &LockOptions) -> Error {
    match e {
        Error::Timeout { busy } if options.wait == LockWait::No => Error::Busy { busy },
        e => e,
    }
}

/// The guard for keys granted under `fence` on `conn`, a connection of the
/// lock's own, to a request sent at `sent`.
pub(crate) async fn granted(
    conn: Client,
    keys: Vec<String>,
    fence: u64,
    lease: Option<Duration>,
    sent: Instant,
) -> Result<LockGuard> {
    let guard = LockGuard::new(conn, keys, fence, lease.map(|lease| (sent, lease)), true);
    // The server's lease runs from the grant, but all the client knows
    // is that the grant came after the request was sent: after a long
    // wait that bound says little, and the guard would be in jeopardy
    // at once. A renewal now gives a bound as fresh as the grant (not
    // `renew`, which would fail at an alarm this renewal is to lift).
    if let Some(lease) = lease {
        if sent.elapsed() >= lease / 3 {
            guard.renew_shared(lease).await?;
        }
    } else if sent.elapsed() >= guard.client().session_timeout() / 3 {
        // The same for a lock bound to the connection or session: the
        // pings parked behind the wait are answered one by one (on a
        // cluster, a commit each); one more round trip gives a fresh
        // bound before the caller relies on the lock.
        guard.client().ping().await?;
    }
    Ok(guard)
}

/// Microseconds of `d`, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Maps a response's status to a result.
pub(crate) fn check(resp: Response) -> Result<Response> {
    let status = ResponseStatus::try_from(resp.status)
        .map_err(|_| Error::Protocol(format!("unknown response status {}", resp.status)))?;
    match status {
        // Queued answers only an Enqueue, which reads its ticket.
        ResponseStatus::Ok | ResponseStatus::Queued => Ok(resp),
        ResponseStatus::AcquireTimeout => Err(Error::Timeout { busy: resp.keys }),
        ResponseStatus::AccessDenied => Err(Error::AccessDenied(resp.error_text)),
        ResponseStatus::NotHeld => Err(Error::NotHeld { keys: resp.keys }),
        status => Err(Error::Server {
            status,
            text: resp.error_text,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::ClientOptions;

    #[test]
    fn debug_says_a_token_is_set_without_showing_it() {
        let options = ClientOptions {
            access_token: Some("s3cret-token".into()),
            ..ClientOptions::default()
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("access_token: Some(\"(set)\")"), "{shown}");
        let none = format!("{:?}", ClientOptions::default());
        assert!(none.contains("access_token: None"), "{none}");
    }
}
