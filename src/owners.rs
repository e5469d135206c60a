//! The connections of one [`Client`]: each lock is taken on a connection of
//! its own (the server counts a connection, on a cluster a session, as one
//! owner), and a connection whose lock is released is kept for the next.
//!
//! [`Client`]: crate::Client

use crate::dial::Dial;
use crate::error::{Disconnect, Error, Result};
use crate::link::{Call, Drains, Link};
use crate::liveness::Watches;
use crate::proto::{Request, RequestLock, RequestType, Response, ResponseStatus};
use crate::request::check;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// One connection (a [`Link`]) and what calls on it share: the slots that
/// bound the calls in flight and the request ids.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) link: Link,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
}

impl Conn {
    pub(crate) fn is_closed(&self) -> bool {
        self.link.is_closed()
    }

    /// Sends one request and waits for its response, mapping error
    /// statuses to [`Error`]. `release`: for a request whose answer may be a grant of
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
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.lost_error())?;
        let req = self.request(kind, body);
        if let Some((room, max)) = self.link.request_room() {
            // What takes a lock leaves room for the fencing token that its
            // Renew and Unlock add (a tag and up to 10 bytes), which are
            // then never refused: refusing those would give up a lock that
            // is held. A Wait names a ticket the Enqueue was checked with.
            let room = match kind {
                RequestType::Lock | RequestType::Enqueue => room.saturating_sub(11),
                RequestType::Renew | RequestType::Unlock | RequestType::Wait => usize::MAX,
                _ => room,
            };
            let len = prost::Message::encoded_len(&req);
            if len > room {
                return Err(Error::Server {
                    status: ResponseStatus::FrameTooLarge,
                    text: format!(
                        "not sent: the request would be about {len} bytes, over the server's \
                         frame limit of {max} bytes (its --max-frame); use fewer or shorter keys"
                    ),
                });
            }
        }
        let (tx, rx) = oneshot::channel();
        let call = Call {
            req,
            reply: Some(tx),
            slot: Some(slot),
            release,
        };
        self.link
            .calls
            .send(call)
            .await
            .map_err(|_| self.lost_error())?;
        let resp = rx.await.map_err(|_| self.lost_error())??;
        check(resp)
    }

    /// Sends a request without waiting for its answer; used where waiting is
    /// impossible (a guard being dropped). Best effort: on a lost connection
    /// the server has released connection-bound locks anyway (a lease's
    /// Unlock goes through [`Conn::release_detached`] instead).
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
        if let Err(mpsc::error::TrySendError::Full(call)) = self.link.calls.try_send(call) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let calls = self.link.calls.clone();
                rt.spawn(async move {
                    let _ = calls.send(call).await;
                });
            }
        }
    }

    /// Sends the Unlock of `keys` held under `fence` by a lock that may be
    /// a lease without waiting for its answer (a guard being dropped), and
    /// sends it again by fence on a connection opened for it if this one
    /// ended before the answer: a lease outlives its connection.
    pub(crate) fn release_detached(&self, keys: Vec<String>, fence: u64) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.link.release_detached(id, keys, fence);
    }

    fn request(&self, kind: RequestType, body: RequestLock) -> Request {
        Request {
            version: crate::PROTOCOL_VERSION,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            r#type: kind as i32,
            lock: Some(body),
            ..Request::default()
        }
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        match self.link.lost.borrow().as_ref() {
            Some(reason) => Err(Error::ConnectionLost(reason.clone())),
            None => Ok(()),
        }
    }

    fn lost_error(&self) -> Error {
        let reason = self.link.lost.borrow().clone();
        Error::ConnectionLost(reason.unwrap_or(Disconnect::Closed))
    }
}

/// Most connections kept open for later locks once their lock is released.
const MAX_IDLE_OWNERS: usize = 64;

/// The owner pool. The server counts a connection (on a cluster, a session) as one owner:
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
pub(crate) struct Owners {
    pub(crate) dial: Arc<Dial>,
    /// The probes of the nodes the connections are on (`liveness.rs`).
    watches: Arc<Watches>,
    /// What the connections leave running once nobody holds them: what
    /// `Client::close` waits for.
    pub(crate) drains: Drains,
    /// Connections holding nothing, ready for the next lock.
    idle: Mutex<Vec<Arc<Conn>>>,
    /// Connections whose lock was handed over with `into_parts` without a
    /// lease: kept open, since closing them would release the lock.
    parked: Mutex<Vec<Arc<Conn>>>,
}

impl Owners {
    /// Takes back a connection that holds nothing.
    pub(crate) fn recycle(&self, conn: Arc<Conn>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_OWNERS {
            idle.push(conn);
        }
    }

    /// A pool for the connections to `dial`'s servers.
    pub(crate) fn new(dial: Dial) -> Owners {
        Owners {
            dial: Arc::new(dial),
            watches: Arc::new(Watches::default()),
            drains: Drains::default(),
            idle: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
        }
    }

    /// Opens a new connection, to the server (or the cluster's leader) it
    /// would connect to now.
    pub(crate) async fn open(&self) -> Result<Arc<Conn>> {
        let link = Link::open(self.dial.clone(), self.watches.clone(), self.drains.clone()).await?;
        let slots = Arc::new(Semaphore::new(self.dial.options.max_in_flight.max(1)));
        Ok(Arc::new(Conn {
            link,
            slots,
            next_id: AtomicU64::new(1),
        }))
    }

    /// A connection of its own for one lock: an idle one, or a new one.
    pub(crate) async fn take(&self) -> Result<Arc<Conn>> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match idle {
                Some(conn) if !conn.is_closed() => return Ok(conn),
                Some(_) => continue,
                None => return self.open().await,
            }
        }
    }

    /// Keeps a lock connection open as long as the pool lives, since
    /// closing it would release the lock it holds.
    pub(crate) fn park(&self, conn: Arc<Conn>) {
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
    }
}
