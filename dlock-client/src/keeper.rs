//! Keeps the lock while the command runs, and says when it is lost.
//!
//! Without `--lease` the lock lives as long as the connection, so it is lost
//! exactly when the connection ends. With `--lease` the lock is renewed at a
//! third of its length; when the connection drops, the keeper reconnects and
//! renews by fencing token until the lease would have run out, so a brief
//! network drop does not cost the lock.

use crate::exit::{self, Failure};
use dlock::{Client, ClientOptions, Error};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Shortest pause between reconnection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// Watches over a held lock.
pub enum Keeper {
    /// A lock bound to the connection.
    Bound(Client),
    /// A lease, renewed by a background task.
    Lease {
        current: watch::Receiver<Client>,
        lost: oneshot::Receiver<String>,
        task: JoinHandle<()>,
    },
}

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

impl Keeper {
    /// Starts watching. `sent` is when the Lock request was sent: the
    /// lease is counted from then, which is never later than the server's view.
    pub fn start(
        client: Client,
        keys: Vec<String>,
        fence: u64,
        lease: Option<Duration>,
        sent: Instant,
        reconnect: Reconnect,
    ) -> Keeper {
        let Some(lease) = lease else {
            return Keeper::Bound(client);
        };
        let (current_tx, current) = watch::channel(client.clone());
        let (lost_tx, lost) = oneshot::channel();
        let task = tokio::spawn(async move {
            let reason =
                renew_until_lost(client, &keys, fence, lease, sent, &reconnect, &current_tx).await;
            let _ = lost_tx.send(reason);
        });
        Keeper::Lease {
            current,
            lost,
            task,
        }
    }

    /// The client currently connected.
    pub fn client(&self) -> Client {
        match self {
            Keeper::Bound(c) => c.clone(),
            Keeper::Lease { current, .. } => current.borrow().clone(),
        }
    }

    /// Resolves when the lock is lost, with the reason.
    pub async fn lost(&mut self) -> String {
        match self {
            Keeper::Bound(c) => c.closed().await,
            Keeper::Lease { lost, .. } => {
                lost.await.unwrap_or_else(|_| "lease keeper stopped".into())
            }
        }
    }

    /// A connected client for the final release: the current one, or, if
    /// its connection is gone in lease mode, a new one (the lease can still be
    /// released by its fencing token).
    pub async fn final_client(&self, reconnect: &Reconnect) -> Client {
        let current = self.client();
        if current.is_closed() && matches!(self, Keeper::Lease { .. }) {
            if let Ok(c) = Client::connect_with(&reconnect.server, reconnect.options.clone()).await
            {
                return c;
            }
        }
        current
    }

    /// Stops renewing.
    pub fn stop(&self) {
        if let Keeper::Lease { task, .. } = self {
            task.abort();
        }
    }
}

async fn renew_until_lost(
    mut client: Client,
    keys: &[String],
    fence: u64,
    lease: Duration,
    sent: Instant,
    reconnect: &Reconnect,
    current: &watch::Sender<Client>,
) -> String {
    let mut lease_end = sent + lease;
    loop {
        // Renew at a third of the lease, or at once when the connection
        // drops, so as much of the lease as possible is left to reconnect in.
        tokio::select! {
            _ = tokio::time::sleep(lease / 3) => {}
            _ = client.closed() => {}
        }
        let mut reconnected = false;
        loop {
            let sent = Instant::now();
            match client.renew_fence(keys, fence, lease).await {
                Ok(()) => {
                    lease_end = sent + lease;
                    if reconnected && reconnect.verbose {
                        eprintln!("dlock: reconnected; lease renewed by its fencing token");
                    }
                    break;
                }
                Err(Error::NotHeld { .. }) => return "the lease is no longer held".into(),
                Err(Error::ConnectionLost(_) | Error::Io(_)) => {
                    if reconnect.verbose {
                        eprintln!("dlock: connection lost; reconnecting to keep the lease");
                    }
                    match reconnect_until(lease_end, reconnect).await {
                        Some(c) => {
                            client = c;
                            current.send_replace(client.clone());
                            reconnected = true;
                        }
                        None => return "lease ran out while the server was unreachable".into(),
                    }
                }
                Err(e) => return format!("cannot renew the lease: {e}"),
            }
        }
    }
}

async fn reconnect_until(deadline: Instant, r: &Reconnect) -> Option<Client> {
    while Instant::now() < deadline {
        let attempt =
            tokio::time::timeout_at(deadline, Client::connect_with(&r.server, r.options.clone()))
                .await;
        match attempt {
            Ok(Ok(c)) => return Some(c),
            Ok(Err(_)) => {
                tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(deadline)).await;
            }
            Err(_) => return None,
        }
    }
    None
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
