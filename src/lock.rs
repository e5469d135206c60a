//! Taking locks: [`Client::lock`] and its kin, and taking over a lease by
//! its fence. Each lock is taken on a connection of its own from the
//! owner pool and handed to the caller as a [`LockGuard`].

use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::{LockGuard, LockParts};
use crate::keys::IntoKeys;
use crate::options::LockOptions;
use crate::proto::{RequestLock, RequestType, ResponseStatus};
use crate::request::{busy_if_no_wait, lease_of, lock_body, micros};
use std::time::Duration;
use tokio::time::Instant;

impl Client {
    /// Takes all `keys` at once, on a connection of the lock's own: tasks
    /// sharing a `Client` exclude each other as separate processes do (FIFO
    /// included), and a Lock that waits delays no other call.
    ///
    /// Cancel-safe: if the returned future is dropped while the request
    /// waits, its connection closes and the server withdraws the request.
    /// A grant that crossed the close (the server granted before it read
    /// it) is still read and released by fence, a lease too, on a
    /// connection opened for it, within 10 s; also when the whole `Client`
    /// is dropped. That happens in the background, on the runtime: before
    /// a program exits after giving up a wait, [`Client::close`] waits for
    /// it.
    ///
    /// # Errors
    /// [`Error::Timeout`] with the busy keys when the wait limit passes, or
    /// [`Error::Busy`] at once with [`LockWait::No`](crate::LockWait::No); [`Error::Server`] for
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
        // As Renew carries it: whole microseconds, at least one.
        let lease = Duration::from_micros(micros(lease).max(1));
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
