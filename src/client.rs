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

use crate::codec::{encode_frame, FrameCodec, FrameError};
use crate::error::{Disconnect, Error, Result};
use crate::guard::LockGuard;
use crate::limits::Limits;
use crate::proto::{
    KeyInfo, Request, RequestLock, RequestType, Response, ResponseStatus, ServerStats,
};
use crate::safety::{AckClock, DEFAULT_SAFETY_MARGIN};
use crate::transport::{self, Stream};
use bytes::BytesMut;
use futures_util::StreamExt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Settings of a [`Client`].
#[derive(Debug, Clone)]
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

/// Most connections kept open for later locks once their lock is released.
const MAX_IDLE_OWNERS: usize = 64;

/// The server counts a connection as one owner: a key it holds is granted
/// again to the same connection. So every lock is taken on a connection of
/// its own, and tasks sharing a `Client` exclude each other exactly as
/// processes do; a Lock that waits also delays nothing else (answers on one
/// connection come in request order). Connections whose lock is released
/// are kept for the next lock.
///
/// Kept connections are held without their `Client` wrapper: a `Client`
/// holds the `Owners`, and the cycle would keep every connection open after
/// the last `Client` is dropped.
#[derive(Debug)]
struct Owners {
    options: ClientOptions,
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

#[derive(Debug)]
struct Inner {
    calls: mpsc::Sender<Call>,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
    lost: watch::Receiver<Option<Disconnect>>,
    addr: String,
    /// What the server said in answer to Hello; `None` for an older server.
    limits: Option<Limits>,
    /// The server's session timeout, stated or assumed.
    session_timeout: Duration,
    acked: Arc<AckClock>,
}

impl Inner {
    fn is_closed(&self) -> bool {
        self.lost.borrow().is_some()
    }
}

/// What the writer needs to send one request.
#[derive(Debug)]
struct Call {
    req: Request,
    reply: Option<oneshot::Sender<Result<Response>>>,
    /// Held until the response arrives: bounds requests in flight.
    slot: Option<OwnedSemaphorePermit>,
}

/// A request written and not yet answered.
#[derive(Debug)]
struct Pending {
    id: u64,
    /// When the request was written: once it is answered, the server has
    /// seen the connection alive no earlier than this.
    sent: Instant,
    reply: Option<oneshot::Sender<Result<Response>>>,
    /// For Lock: the keys, so a grant nobody waits for any more is released.
    lock_keys: Option<Vec<String>>,
    _slot: Option<OwnedSemaphorePermit>,
}

/// The queue of unanswered requests; `None` once the reader has stopped, so
/// the writer fails calls instead of queueing them for nobody.
type PendingQueue = Arc<Mutex<Option<VecDeque<Pending>>>>;

impl Client {
    /// Connects with default options.
    ///
    /// # Errors
    /// [`Error::Connect`] or [`Error::ConnectTimeout`].
    pub async fn connect(addr: &str) -> Result<Client> {
        Self::connect_with(addr, ClientOptions::default()).await
    }

    /// Connects with `options`.
    ///
    /// # Errors
    /// [`Error::Connect`] or [`Error::ConnectTimeout`].
    pub async fn connect_with(addr: &str, options: ClientOptions) -> Result<Client> {
        let owners = Arc::new(Owners {
            options: options.clone(),
            idle: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
        });
        Self::open(addr, owners).await
    }

    /// Opens one connection sharing `owners`.
    async fn open(addr: &str, owners: Arc<Owners>) -> Result<Client> {
        let options = &owners.options;
        let token = options.access_token.clone().unwrap_or_default();
        let handshake = async {
            let mut stream = transport::connect(addr, options, |s| configure(s, options))
                .await
                .map_err(|source| Error::Connect {
                    addr: addr.to_string(),
                    source,
                })?;
            let sent = Instant::now();
            let limits = hello(&mut stream, &token).await?;
            Ok::<_, Error>((stream, sent, limits))
        };
        let (stream, hello_sent, limits) =
            match tokio::time::timeout(options.connect_timeout, handshake).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(Error::ConnectTimeout {
                        addr: addr.to_string(),
                        timeout: options.connect_timeout,
                    })
                }
            };
        let session_timeout =
            limits.map_or(options.fallback_session_timeout, |l| l.session_timeout);
        // Four pings per session timeout: one may be lost or late and the
        // next still arrives with half the timeout to spare.
        let heartbeat = options.heartbeat.min(session_timeout / 4);
        let acked = Arc::new(AckClock::new(hello_sent));
        let (rd, wr) = tokio::io::split(stream);
        let (calls, calls_rx) = mpsc::channel(options.max_in_flight.max(1));
        let (lost_tx, lost) = watch::channel(None);
        let pending: PendingQueue = Arc::new(Mutex::new(Some(VecDeque::new())));
        let lost_tx = Arc::new(lost_tx);
        tokio::spawn(write_loop(
            wr,
            calls_rx,
            pending.clone(),
            heartbeat,
            token,
            lost_tx.clone(),
        ));
        tokio::spawn(read_loop(
            rd,
            pending,
            calls.downgrade(),
            lost_tx,
            acked.clone(),
        ));
        Ok(Client {
            inner: Arc::new(Inner {
                calls,
                slots: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
                next_id: AtomicU64::new(1),
                lost,
                addr: addr.to_string(),
                limits,
                session_timeout,
                acked,
            }),
            owners: owners.clone(),
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
                None => return Self::open(&self.inner.addr, self.owners.clone()).await,
            }
        }
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
        self.inner.limits
    }

    /// How long the server may go without a request from this client
    /// before it ends the connection and releases its locks without lease:
    /// as the server stated, or [`ClientOptions::fallback_session_timeout`].
    pub fn session_timeout(&self) -> Duration {
        self.inner.session_timeout
    }

    pub(crate) fn safety_margin(&self) -> Duration {
        self.owners.options.safety_margin
    }

    /// Send time of the latest request the server answered.
    pub(crate) fn last_acked(&self) -> Instant {
        self.inner.acked.last()
    }

    /// The address this client connected to.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Resolves when the connection has ended, with the reason.
    pub async fn closed(&self) -> Disconnect {
        let mut lost = self.inner.lost.clone();
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
    /// invalid keys or a server limit; connection errors.
    pub async fn lock<I, K>(&self, keys: I, options: LockOptions) -> Result<LockGuard>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        // On the wire a zero lease means none; so it does here.
        let lease = options.lease.filter(|l| !l.is_zero());
        let mut body = RequestLock {
            keys: keys.clone(),
            release_micro: lease.map_or(0, micros),
            ..RequestLock::default()
        };
        match options.wait {
            LockWait::Forever => {}
            // A positive limit below a microsecond still means "wait a little".
            LockWait::AtMost(d) => body.wait_micro = micros(d).max(1),
            LockWait::No => body.try_lock = true,
        }
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
                return Err(match e {
                    Error::Timeout { busy } if options.wait == LockWait::No => Error::Busy { busy },
                    e => e,
                });
            }
        };
        let mut guard = LockGuard::new(
            conn,
            keys,
            resp.fence,
            lease.map(|lease| (sent, lease)),
            true,
        );
        // The server's lease runs from the grant, but all the client knows
        // is that the grant came after the request was sent: after a long
        // wait that bound says little, and the guard would be in jeopardy
        // at once. A renewal now gives a bound as fresh as the grant.
        if let Some(lease) = lease {
            if sent.elapsed() >= lease / 3 {
                guard.renew(lease).await?;
            }
        }
        Ok(guard)
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
    pub async fn take_over<I, K>(&self, keys: I, fence: u64, lease: Duration) -> Result<LockGuard>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
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

    /// Releases `keys` held under `fence`, whichever connection took them:
    /// how a restarted process releases a lease it took earlier.
    ///
    /// # Errors
    /// [`Error::NotHeld`] with the keys not held under `fence`.
    pub async fn unlock_fence<I, K>(&self, keys: I, fence: u64) -> Result<()>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let body = RequestLock {
            keys: keys.into_iter().map(Into::into).collect(),
            fence,
            ..RequestLock::default()
        };
        self.call(RequestType::Unlock, body).await.map(drop)
    }

    /// Sets the lease of `keys` held under `fence` to now + `lease`.
    ///
    /// # Errors
    /// [`Error::NotHeld`] with the keys not held under `fence`.
    pub async fn renew_fence<I, K>(&self, keys: I, fence: u64, lease: Duration) -> Result<()>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let body = RequestLock {
            keys: keys.into_iter().map(Into::into).collect(),
            fence,
            release_micro: micros(lease).max(1),
            ..RequestLock::default()
        };
        self.call(RequestType::Renew, body).await.map(drop)
    }

    /// Who holds and who waits for `keys`.
    ///
    /// # Errors
    /// Any error of the connection or the server.
    pub async fn inspect<I, K>(&self, keys: I) -> Result<Vec<KeyInfo>>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let body = RequestLock {
            keys: keys.into_iter().map(Into::into).collect(),
            ..RequestLock::default()
        };
        Ok(self.call(RequestType::Inspect, body).await?.key_info)
    }

    /// The server's counts: connections, held keys, waiting requests.
    ///
    /// # Errors
    /// Any error of the connection or the server.
    pub async fn stats(&self) -> Result<ServerStats> {
        let resp = self
            .call(RequestType::Inspect, RequestLock::default())
            .await?;
        resp.server_stats
            .ok_or_else(|| Error::Protocol("Inspect without keys answered no server_stats".into()))
    }

    /// Sends one request and waits for its response, mapping error statuses
    /// to [`Error`].
    pub(crate) async fn call(&self, kind: RequestType, body: RequestLock) -> Result<Response> {
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
        };
        self.inner
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
        };
        if let Err(mpsc::error::TrySendError::Full(call)) = self.inner.calls.try_send(call) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let calls = self.inner.calls.clone();
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
        match self.inner.lost.borrow().as_ref() {
            Some(reason) => Err(Error::ConnectionLost(reason.clone())),
            None => Ok(()),
        }
    }

    fn lost_error(&self) -> Error {
        let reason = self.inner.lost.borrow().clone();
        Error::ConnectionLost(reason.unwrap_or(Disconnect::Closed))
    }
}

/// Microseconds of `d`, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Maps a response's status to a result.
fn check(resp: Response) -> Result<Response> {
    let status = ResponseStatus::try_from(resp.status)
        .map_err(|_| Error::Protocol(format!("unknown response status {}", resp.status)))?;
    match status {
        ResponseStatus::Ok => Ok(resp),
        ResponseStatus::AcquireTimeout => Err(Error::Timeout { busy: resp.keys }),
        ResponseStatus::AccessDenied => Err(Error::AccessDenied(resp.error_text)),
        ResponseStatus::NotHeld => Err(Error::NotHeld { keys: resp.keys }),
        status => Err(Error::Server {
            status,
            text: resp.error_text,
        }),
    }
}

/// Asks the server for its limits on a fresh connection, before the
/// connection is split between the writer and reader tasks.
async fn hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
) -> Result<Option<Limits>> {
    let req = Request {
        version: crate::PROTOCOL_VERSION,
        // Outside the range of call ids (counting up from 1) and heartbeat
        // ids (counting down below the maximum).
        id: u64::MAX,
        access_token: token.to_string(),
        r#type: RequestType::Hello as i32,
        ..Request::default()
    };
    let mut buf = BytesMut::new();
    encode_frame(&req, &mut buf);
    write_flush(stream, &buf)
        .await
        .map_err(|e| Disconnect::Write(Arc::new(e)))?;
    buf.clear();
    let mut codec = FrameCodec::new(crate::MAX_RESPONSE_FRAME);
    let body = loop {
        if let Some(body) = tokio_util::codec::Decoder::decode(&mut codec, &mut buf)
            .map_err(|e| Error::Protocol(format!("bad answer to Hello: {e}")))?
        {
            break body;
        }
        let read = stream.read_buf(&mut buf).await;
        if read.map_err(|e| Disconnect::Read(Arc::new(e)))? == 0 {
            return Err(Disconnect::Closed.into());
        }
    };
    let resp: Response = prost::Message::decode(body)
        .map_err(|e| Error::Protocol(format!("undecodable answer to Hello: {e}")))?;
    if resp.status == ResponseStatus::InvalidType as i32 {
        // A server that predates Hello.
        return Ok(None);
    }
    let resp = check(resp)?;
    Ok(resp.limits.as_ref().map(Limits::from))
}

/// See [`ClientOptions::keepalive`]. tokio exposes neither keepalive timing
/// nor TCP_USER_TIMEOUT, hence socket2.
fn configure(stream: &TcpStream, options: &ClientOptions) {
    let _ = stream.set_nodelay(true);
    let sock = socket2::SockRef::from(stream);
    let interval = (options.keepalive / 3).max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(options.keepalive)
        .with_interval(interval);
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let keepalive = keepalive.with_retries(3);
    let _ = sock.set_tcp_keepalive(&keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = sock.set_tcp_user_timeout(Some(options.keepalive + 3 * interval));
}

/// Writes all of `buf` and flushes: TLS may keep written records until a
/// flush (for TCP the flush is free).
async fn write_flush<W: AsyncWrite + Unpin>(wr: &mut W, buf: &[u8]) -> std::io::Result<()> {
    wr.write_all(buf).await?;
    wr.flush().await
}

fn mark_lost(lost: &watch::Sender<Option<Disconnect>>, reason: Disconnect) {
    lost.send_if_modified(|r| {
        if r.is_none() {
            *r = Some(reason);
            true
        } else {
            false
        }
    });
}

/// Most calls encoded into one write.
const MAX_BATCH: usize = 64;

/// The writer task: waits for a call (or a heartbeat's turn), writes it with
/// every call queued behind it, and on the way out fails what is left.
async fn write_loop(
    mut wr: WriteHalf<Stream>,
    mut calls: mpsc::Receiver<Call>,
    pending: PendingQueue,
    heartbeat: Duration,
    token: String,
    lost: Arc<watch::Sender<Option<Disconnect>>>,
) {
    let mut lost_rx = lost.subscribe();
    let mut out = BytesMut::new();
    let mut ping_id = u64::MAX;
    let mut last_write = Instant::now();
    let mut tick = tokio::time::interval(heartbeat.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            _ = lost_rx.changed() => break,
            call = calls.recv() => match call {
                Some(c) => c,
                None => break,
            },
            _ = tick.tick() => {
                if last_write.elapsed() < heartbeat {
                    continue;
                }
                heartbeat_call(&mut ping_id)
            }
        };
        let batch = with_queued_calls(first, &mut calls);
        if let Err(batch) = encode_batch(batch, &pending, &token, &mut out) {
            let reason = lost.borrow().clone().unwrap_or(Disconnect::Closed);
            fail_calls(batch, &reason);
            break;
        }
        if let Err(e) = write_flush(&mut wr, &out).await {
            mark_lost(&lost, Disconnect::Write(Arc::new(e)));
            break;
        }
        out.clear();
        last_write = Instant::now();
    }
    fail_unsent_calls(calls, &lost);
    let _ = wr.shutdown().await;
}

/// A Ping of the writer's own. Heartbeat ids count down from the top so
/// they never meet the ids of real calls, which count up from 1.
fn heartbeat_call(ping_id: &mut u64) -> Call {
    *ping_id -= 1;
    let req = Request {
        version: crate::PROTOCOL_VERSION,
        id: *ping_id,
        r#type: RequestType::Ping as i32,
        ..Request::default()
    };
    Call {
        req,
        reply: None,
        slot: None,
    }
}

/// `first` and the calls already waiting behind it, up to [`MAX_BATCH`]:
/// one write for many calls under load, no waiting for more when idle.
fn with_queued_calls(first: Call, calls: &mut mpsc::Receiver<Call>) -> Vec<Call> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match calls.try_recv() {
            Ok(c) => batch.push(c),
            Err(_) => break,
        }
    }
    batch
}

/// Encodes `batch` into `out` and queues each call for its answer, in
/// order. Gives the batch back if the reader has stopped: nobody would
/// answer it.
fn encode_batch(
    batch: Vec<Call>,
    pending: &PendingQueue,
    token: &str,
    out: &mut BytesMut,
) -> std::result::Result<(), Vec<Call>> {
    // Stamped before the write, so never later than the server's receipt.
    let sent = Instant::now();
    let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
    let Some(queue) = guard.as_mut() else {
        return Err(batch);
    };
    for mut call in batch {
        // Every request, the writer's own heartbeats and releases
        // included, carries the token.
        call.req.access_token = token.to_owned();
        encode_frame(&call.req, out);
        // The request is not needed once encoded: keep a Lock's keys
        // without copying them.
        let lock_keys = (call.req.r#type == RequestType::Lock as i32)
            .then(|| call.req.lock.take().map(|l| l.keys).unwrap_or_default());
        queue.push_back(Pending {
            id: call.req.id,
            sent,
            reply: call.reply,
            lock_keys,
            _slot: call.slot,
        });
    }
    Ok(())
}

/// Closes the call queue and fails every call still in it with the reason
/// the connection ended.
fn fail_unsent_calls(mut calls: mpsc::Receiver<Call>, lost: &watch::Sender<Option<Disconnect>>) {
    calls.close();
    let mut rest = Vec::new();
    while let Ok(c) = calls.try_recv() {
        rest.push(c);
    }
    let reason = lost.borrow().clone().unwrap_or(Disconnect::Dropped);
    fail_calls(rest, &reason);
}

fn fail_calls(calls: Vec<Call>, reason: &Disconnect) {
    for c in calls {
        if let Some(reply) = c.reply {
            let _ = reply.send(Err(Error::ConnectionLost(reason.clone())));
        }
    }
}

async fn read_loop(
    rd: ReadHalf<Stream>,
    pending: PendingQueue,
    calls: mpsc::WeakSender<Call>,
    lost: Arc<watch::Sender<Option<Disconnect>>>,
    acked: Arc<AckClock>,
) {
    let mut lost_rx = lost.subscribe();
    let mut reader =
        tokio_util::codec::FramedRead::new(rd, FrameCodec::new(crate::MAX_RESPONSE_FRAME));
    let reason = loop {
        let frame = tokio::select! {
            _ = lost_rx.changed() => break None,
            frame = reader.next() => frame,
        };
        let body = match frame {
            Some(Ok(body)) => body,
            Some(Err(FrameError::Io(e))) => break Some(Disconnect::Read(Arc::new(e))),
            Some(Err(FrameError::TooLarge { len, max })) => {
                break Some(Disconnect::FrameTooLarge { len, max })
            }
            None => break Some(Disconnect::Closed),
        };
        let resp: Response = match prost::Message::decode(body) {
            Ok(r) => r,
            Err(e) => break Some(Disconnect::Undecodable(e)),
        };
        let next = {
            let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_mut().and_then(|q| q.pop_front())
        };
        let Some(p) = next.filter(|p| p.id == resp.request_id) else {
            // An answer to nothing: the server turned the connection away
            // (request_id 0, e.g. too many connections) or broke ordering.
            break Some(if resp.error_text.is_empty() {
                Disconnect::UnexpectedAnswer {
                    request_id: resp.request_id,
                }
            } else {
                Disconnect::TurnedAway(resp.error_text)
            });
        };
        acked.record(p.sent);
        deliver(p, resp, &calls);
    };
    if let Some(reason) = reason {
        mark_lost(&lost, reason);
    }
    let reason = lost.borrow().clone().unwrap_or(Disconnect::Closed);
    let left = pending.lock().unwrap_or_else(|p| p.into_inner()).take();
    for p in left.into_iter().flatten() {
        if let Some(reply) = p.reply {
            let _ = reply.send(Err(Error::ConnectionLost(reason.clone())));
        }
    }
}

/// Hands a response to its caller. A Lock granted to a caller that stopped
/// waiting is released at once, so a cancelled `lock` leaks nothing.
fn deliver(p: Pending, resp: Response, calls: &mpsc::WeakSender<Call>) {
    let granted_fence = (resp.status == ResponseStatus::Ok as i32).then_some(resp.fence);
    let undelivered = match p.reply {
        Some(reply) => reply.send(Ok(resp)).is_err(),
        None => false,
    };
    if !undelivered {
        return;
    }
    if let (Some(keys), Some(fence), Some(calls)) = (p.lock_keys, granted_fence, calls.upgrade()) {
        let req = Request {
            version: crate::PROTOCOL_VERSION,
            // Nobody reads the answer; reusing the grant's id keeps ids unique
            // among requests in flight.
            id: p.id,
            r#type: RequestType::Unlock as i32,
            lock: Some(RequestLock {
                keys,
                fence,
                ..RequestLock::default()
            }),
            ..Request::default()
        };
        let call = Call {
            req,
            reply: None,
            slot: None,
        };
        if let Err(mpsc::error::TrySendError::Full(call)) = calls.try_send(call) {
            tokio::spawn(async move {
                let _ = calls.send(call).await;
            });
        }
    }
}
