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
use crate::guardian::Guardian;
use crate::say;
use dlock::{Client, ClientOptions, LockGuard, Lost};
use std::cell::RefCell;
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

/// Watches over a held lock, and keeps the guardian's deadline current.
pub struct Keeper {
    /// In a cell: the renewal loop borrows it across awaits while the
    /// guardian's ticker reads its deadline; only a reconnection, with no
    /// other borrow alive, replaces it.
    guard: RefCell<LockGuard>,
    reconnect: Reconnect,
    guardian: Option<Guardian>,
    /// Whether the guardian enforces the deadline (not with --on-lost ignore).
    enforce: bool,
}

impl Keeper {
    /// Starts watching over `guard`; `guardian` is told the deadline from
    /// now on if `enforce`.
    pub fn new(
        guard: LockGuard,
        reconnect: Reconnect,
        guardian: Option<Guardian>,
        enforce: bool,
    ) -> Keeper {
        let mut keeper = Keeper {
            guard: RefCell::new(guard),
            reconnect,
            guardian,
            enforce,
        };
        keeper.tell_guardian();
        keeper
    }

    /// The lock being kept.
    pub fn guard(&self) -> std::cell::Ref<'_, LockGuard> {
        self.guard.borrow()
    }

    /// The guardian's pipe, for COMMAND to name itself on.
    pub fn guardian_fd(&self) -> Option<std::os::fd::RawFd> {
        self.guardian.as_ref().map(Guardian::fd)
    }

    /// Ends the watch: the guardian is told COMMAND has ended, and the lock
    /// is given back for the final release.
    pub fn into_guard(self) -> LockGuard {
        if let Some(g) = self.guardian {
            g.done();
        }
        self.guard.into_inner()
    }

    /// Keeps the lock (renewing a lease, reconnecting when the connection
    /// drops) and resolves when it is lost, with the reason. Meant to be
    /// polled as one future for as long as COMMAND runs: a renewal or a
    /// reconnection in flight is not restarted by other events.
    pub async fn lost(&mut self) -> Lost {
        let period = (self.guard.borrow().margin() / 2)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        let Keeper {
            guard,
            reconnect,
            guardian,
            enforce,
        } = self;
        let watch = keep(guard, reconnect);
        tokio::pin!(watch);
        loop {
            tokio::select! {
                lost = &mut watch => return lost,
                _ = tick.tick() => {
                    if let Some(g) = guardian.as_mut() {
                        g.deadline(enforce.then(|| guardian_deadline(&guard.borrow())));
                    }
                }
            }
        }
    }

    fn tell_guardian(&mut self) {
        let deadline = self
            .enforce
            .then(|| guardian_deadline(&self.guard.borrow()));
        if let Some(g) = self.guardian.as_mut() {
            g.deadline(deadline);
        }
    }
}

/// When the guardian kills COMMAND if dlock has not said otherwise: before
/// the deadline, since SIGKILL and the exit take time too. dlock itself,
/// when it can, acts sooner still (at half the margin).
fn guardian_deadline(guard: &LockGuard) -> Instant {
    guard.deadline() - guard.margin() / 4
}

/// The renewal and reconnection loop behind [`Keeper::lost`].
#[allow(clippy::await_holding_refcell_ref)] // shared borrows only; see Keeper::guard
async fn keep(guard: &RefCell<LockGuard>, reconnect: &Reconnect) -> Lost {
    loop {
        let (lost, lease) = {
            let g = guard.borrow();
            (g.keep_alive().await, g.lease())
        };
        let Some(lease) = lease else {
            return lost;
        };
        if !matches!(lost, Lost::ConnectionLost(_)) {
            return lost;
        }
        // The lease runs on without the connection; take it over from a
        // new one while it is certainly still ours.
        if reconnect.verbose {
            say!("connection lost; reconnecting to keep the lease");
        }
        let (keys, fence, alarm, deadline) = {
            let g = guard.borrow();
            (
                g.keys().to_vec(),
                g.fence(),
                g.deadline() - g.margin(),
                g.deadline(),
            )
        };
        let taken = match take_over(reconnect, keys, fence, lease, alarm).await {
            Ok(taken) => taken,
            Err(TakeOver::NotHeld) => return Lost::NotHeld,
            Err(TakeOver::OutOfTime) => {
                return Lost::Jeopardy {
                    lease: true,
                    deadline,
                }
            }
        };
        if reconnect.verbose {
            say!(
                "reconnected to {}; lease renewed by its fencing token",
                reconnect.server
            );
        }
        // The old guard must not release the lock when dropped.
        let _ = guard.replace(taken).into_parts();
    }
}

/// Why a lease could not be taken over.
enum TakeOver {
    /// The server says it is not held under its fence any more.
    NotHeld,
    /// No connection got through before the alarm.
    OutOfTime,
}

async fn take_over(
    r: &Reconnect,
    keys: Vec<String>,
    fence: u64,
    lease: Duration,
    until: Instant,
) -> Result<LockGuard, TakeOver> {
    while Instant::now() < until {
        let attempt = async {
            let client = Client::connect_with(&r.server, r.options.clone()).await?;
            client.take_over(keys.clone(), fence, lease).await
        };
        match tokio::time::timeout_at(until, attempt).await {
            Ok(Ok(guard)) => return Ok(guard),
            // Someone released it by fence, or it ran out: no use trying.
            Ok(Err(dlock::Error::NotHeld { .. })) => return Err(TakeOver::NotHeld),
            Ok(Err(_)) => {
                tokio::time::sleep_until((Instant::now() + RECONNECT_PAUSE).min(until)).await;
            }
            Err(_) => return Err(TakeOver::OutOfTime),
        }
    }
    Err(TakeOver::OutOfTime)
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
