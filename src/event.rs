//! [`Event`]: what a client tells a program that wants to know about
//! reconnects.

use crate::error::Disconnect;
use std::time::Duration;

/// A change of the connection under a [`crate::Client`], from
/// [`crate::Client::events`]. Only a cluster's sessions are resumed; against
/// a single server a broken connection ends the client (see
/// [`crate::Client::closed`]), and only leases are kept, by fence.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// The connection to `from` broke; the client is looking for the
    /// (new) leader to resume its session on. Requests wait meanwhile;
    /// locks stay held as long as the session lives.
    Reconnecting {
        /// The node the connection went to.
        from: String,
        /// Why it ended.
        reason: Disconnect,
    },
    /// The session was resumed on `addr`; requests that were not answered
    /// were sent again.
    Resumed {
        /// The node now serving the session (the leader).
        addr: String,
        /// The session.
        session: u64,
        /// How long the client was without a connection.
        after: Duration,
    },
    /// A lease whose connection ended was renewed by its fencing token on
    /// a new connection, to `addr`: it is still held.
    LeaseRecovered {
        /// The server (or leader) the new connection goes to.
        addr: String,
        /// The lease's fencing token.
        fence: u64,
        /// How long the lease was without a connection.
        after: Duration,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Reconnecting { from, reason } => {
                write!(
                    f,
                    "connection to {from} lost ({}); reconnecting",
                    reason.reason()
                )
            }
            Event::Resumed {
                addr,
                session,
                after,
            } => write!(
                f,
                "session {session} resumed on {addr} after {}",
                crate::duration::human(*after)
            ),
            Event::LeaseRecovered { addr, fence, after } => write!(
                f,
                "reconnected to {addr}; lease renewed by its fencing token {fence} after {}",
                crate::duration::human(*after)
            ),
        }
    }
}
