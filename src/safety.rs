//! When a held lock must be given up: the client-side safety deadline.
//!
//! The server may hand a lock to someone else at two moments the client can
//! bound from its own side, without synchronised clocks:
//!
//! - a **lease** ends `lease` after the server received the Lock or Renew that
//!   set it, which is no earlier than when the client *sent* it;
//! - a lock **without a lease** is released when the server ends the
//!   connection, which it may do once no request has arrived for its session
//!   timeout (stated in the answer to Hello). The server received every
//!   request the client got an answer to, so the timeout runs at the earliest
//!   from the send time of the last answered request.
//!
//! So the client's deadline is *send time + window*, shortened by
//! [`CLOCK_RATE_BOUND`] of the window in case the client's clock runs slower
//! than the server's. A lock whose deadline comes within the safety margin
//! without a fresher answer is *in jeopardy*: its holder must stop before the
//! deadline, because from then on the server may give the lock away.
//!
//! The same rule serves any owner that lives for a window after its last
//! acknowledged request (a connection today, a session in a cluster).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

pub use crate::rules::CLOCK_RATE_BOUND;

/// Default time between a lock falling into jeopardy and its deadline: the
/// time a holder gets to stop. Capped at a quarter of the window, so short
/// timeouts and leases still leave three quarters for renewing.
pub const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// The latest moment the lock is still certainly held, for a window that
/// started (at the server) no earlier than `sent`.
pub fn deadline(sent: Instant, window: Duration) -> Instant {
    crate::rules::deadline(sent, window)
}

/// The safety margin in force for `window`.
pub fn margin(configured: Duration, window: Duration) -> Duration {
    crate::rules::margin(configured, window)
}

/// Why a lock can no longer be assumed held. New kinds may be added in a minor release, so a `match`
/// needs a `_` arm.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Lost {
    /// The connection ended. A lock without a lease was released by the
    /// server; a lease still runs until its deadline (see
    /// [`crate::LockGuard::deadline`]) and can be taken over from a new
    /// connection with [`crate::Client::take_over`].
    ConnectionLost(crate::disconnect::Disconnect),
    /// No answer from the server proves the lock held much longer: its
    /// deadline is within the safety margin. Stop using it now; the server
    /// may hand it on after `deadline`.
    Jeopardy {
        /// The lock is a lease (else it is bound to the connection).
        lease: bool,
        /// When the server may hand the lock on.
        deadline: Instant,
    },
    /// The server answered that the keys are not held under this lock's
    /// fencing token (the lease ran out, or someone released it by fence).
    NotHeld,
    /// The server refused to renew the lease for another reason.
    RenewRefused(String),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::ConnectionLost(reason) => write!(f, "{reason}"),
            Lost::Jeopardy { lease, deadline } => {
                let left = deadline.saturating_duration_since(Instant::now());
                let what = if *lease {
                    "the lease could not be renewed"
                } else {
                    "the server has not answered"
                };
                write!(
                    f,
                    "{what}; the server may hand the lock on in {:.1}s",
                    left.as_secs_f64()
                )
            }
            Lost::NotHeld => write!(f, "the server says the lock is no longer held"),
            Lost::RenewRefused(reason) => write!(f, "cannot renew the lease: {reason}"),
        }
    }
}

/// The send time of the latest request the server answered, shared by a
/// connection's reader (which records it) and the guards that read it.
/// Atomic rather than a channel: it changes with every answer and is read
/// only when a guard's timer fires.
#[derive(Debug)]
pub(crate) struct AckClock {
    base: Instant,
    /// Microseconds after `base`.
    acked: AtomicU64,
}

impl AckClock {
    /// A clock whose first acknowledgement is `now` (the handshake).
    pub(crate) fn new(now: Instant) -> Self {
        AckClock {
            base: now,
            acked: AtomicU64::new(0),
        }
    }

    /// Notes that the request sent at `sent` was answered.
    pub(crate) fn record(&self, sent: Instant) {
        let micros = u64::try_from(sent.saturating_duration_since(self.base).as_micros())
            .unwrap_or(u64::MAX);
        self.acked.fetch_max(micros, Ordering::Relaxed);
    }

    /// The send time of the latest answered request.
    pub(crate) fn last(&self) -> Instant {
        self.base + Duration::from_micros(self.acked.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_allows_for_a_faster_server_clock() {
        let t = Instant::now();
        assert_eq!(
            deadline(t, Duration::from_secs(10)),
            t + Duration::from_millis(9990)
        );
    }

    #[test]
    fn margin_leaves_three_quarters_of_a_short_window() {
        let m = DEFAULT_SAFETY_MARGIN;
        assert_eq!(margin(m, Duration::from_secs(60)), m);
        assert_eq!(
            margin(m, Duration::from_secs(2)),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn ack_clock_only_moves_forward() {
        let t = Instant::now();
        let c = AckClock::new(t);
        c.record(t + Duration::from_millis(5));
        c.record(t + Duration::from_millis(3));
        assert_eq!(c.last(), t + Duration::from_millis(5));
    }
}
