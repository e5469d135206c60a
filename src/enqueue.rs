//! Two-phase acquire: [`Client::enqueue`](crate::Client::enqueue) answers at
//! once, granted or queued; a queued request's [`Queued::wait`] collects
//! the grant later.
//!
//! A Lock that waits tells its caller nothing until it is granted (answers
//! on a connection come in request order). An Enqueue is answered as soon
//! as the request is in line, with its place, so the caller can act on
//! knowing that it waits; the request keeps its FIFO place until `wait`
//! collects the outcome. Like a Lock, it runs on a connection of its own
//! (see `owners.rs`), which a dropped [`Queued`] closes: the server then
//! withdraws the request, or releases a grant nobody collected.

use crate::client::Client;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::keys::IntoKeys;
use crate::lock::granted;
use crate::options::LockOptions;
use crate::proto::{RequestLock, RequestType, ResponseStatus};
use crate::request::{busy_if_no_wait, lease_of, lock_body};
use tokio::time::Instant;

/// What [`Client::enqueue`] got: the lock, or a place in line.
#[derive(Debug)]
// The guard is the common answer under no contention and moved once.
#[allow(clippy::large_enum_variant)]
pub enum Enqueued {
    /// The keys were free: held now, exactly as [`Client::lock`] would
    /// have returned them.
    Granted(LockGuard),
    /// The request waits in line; [`Queued::wait`] waits for the grant.
    Queued(Queued),
}

impl Enqueued {
    /// The lock: at once if it was granted, else after waiting in line.
    ///
    /// # Errors
    /// As [`Queued::wait`].
    pub async fn wait(self) -> Result<LockGuard> {
        match self {
            Enqueued::Granted(guard) => Ok(guard),
            Enqueued::Queued(q) => q.wait().await,
        }
    }
}

/// A request waiting in line, from [`Client::enqueue`]. Dropping it
/// withdraws the request (its connection closes).
#[derive(Debug)]
pub struct Queued {
    conn: Client,
    keys: Vec<String>,
    ticket: u64,
    place: u32,
    options: LockOptions,
    /// When the Enqueue was sent: the earliest the grant (and its lease)
    /// can have come.
    sent: Instant,
}

impl Queued {
    pub(crate) fn new(
        conn: Client,
        keys: Vec<String>,
        ticket: u64,
        place: u32,
        options: LockOptions,
        sent: Instant,
    ) -> Queued {
        Queued {
            conn,
            keys,
            ticket,
            place,
            options,
            sent,
        }
    }

    /// Requests ahead of this one when it was queued: over its keys, the
    /// most requests waiting for one key that came before it. 0: it is
    /// next, once the holders release.
    pub fn place(&self) -> u32 {
        self.place
    }

    /// The server's ticket for the request (what a Wait names).
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// The keys asked for.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Waits for the grant. Answers at once if the keys were granted
    /// before the call; the wait limit is the one given to
    /// [`Client::enqueue`], counted from the Enqueue.
    ///
    /// Cancel-safe: dropping the future closes the request's connection,
    /// and the server withdraws the request or releases its grant.
    ///
    /// # Errors
    /// [`crate::Error::Timeout`] with the busy keys when the wait limit
    /// passes; [`crate::Error::Server`] with
    /// [`crate::proto::ResponseStatus::UnknownTicket`] if the server no
    /// longer knows the request (a cluster whose session memory forgot it
    /// across a failover); connection errors.
    pub async fn wait(self) -> Result<LockGuard> {
        let body = RequestLock {
            ticket: self.ticket,
            ..RequestLock::default()
        };
        let release = Some(self.keys.clone());
        let resp = match self
            .conn
            .call_releasing(RequestType::Wait, body, release)
            .await
        {
            Ok(resp) => resp,
            Err(e) => {
                // Timed out or refused: the connection holds nothing.
                self.conn.recycle();
                return Err(busy_if_no_wait(e, &self.options));
            }
        };
        let lease = lease_of(&self.options);
        granted(self.conn, self.keys, resp.fence, lease, self.sent).await
    }
}

impl Client {
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
    /// As [`Client::lock`]; [`Error::Busy`](crate::Error::Busy) at once with [`LockWait::No`](crate::LockWait::No).
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
}
