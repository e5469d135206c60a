//! What travels between a client and the node its connection goes to.
//!
//! One connection per client, to one node at a time. Requests arrive in the
//! order sent and answers come back in the order of their requests (one TCP
//! stream each way), but any message may be lost: the head of either
//! direction may be dropped, which stands for a silent path (a partition, a
//! paused node whose answers come never). A reset ends the connection with
//! everything in flight on it; the client then connects to the next node.

use dlock::proto::ResponseStatus;
use std::fmt;
use std::time::Duration;

use crate::tick::Tick;

/// The requests a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Lock the key, for `lease` or (`None`) for as long as the session
    /// lives; never waits (a busy key is answered at once).
    Lock(Option<Duration>),
    /// Set the held key's lease to this.
    Renew(Duration),
    /// Keep the session alive.
    Ping,
    /// Release the key.
    Unlock,
}

/// A request, with its send time by the sender's clock (what the rules
/// measure deadlines from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// What it asks.
    pub kind: Kind,
    /// When it was sent, by the client's clock.
    pub sent: Tick,
}

/// An answer to a [`Request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Answer {
    /// The request answered.
    pub to: Request,
    /// Its status.
    pub status: ResponseStatus,
    /// The fence of a granted Lock.
    pub fence: Option<u64>,
}

/// A client's connection: the node it goes to and what is in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Conn {
    /// The node.
    pub node: u8,
    /// Requests sent and not yet read by the node, oldest first.
    pub out: Vec<Request>,
    /// Answers written by the node and not yet read by the client, oldest
    /// first.
    pub back: Vec<Answer>,
}

impl Conn {
    /// Whether a request whose kind matches `pred` is sent and not yet
    /// answered.
    pub fn awaits(&self, pred: impl Fn(Kind) -> bool) -> bool {
        self.out.iter().any(|r| pred(r.kind)) || self.back.iter().any(|a| pred(a.to.kind))
    }

    /// The connection ended: what was in flight is gone, and the client
    /// connects to the next of `nodes`.
    pub fn reset(&mut self, nodes: u8) {
        self.out.clear();
        self.back.clear();
        self.node = (self.node + 1) % nodes.max(1);
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Lock(Some(lease)) => write!(f, "Lock(lease {}s)", lease.as_secs_f64()),
            Kind::Lock(None) => write!(f, "Lock(no lease)"),
            Kind::Renew(lease) => write!(f, "Renew({}s)", lease.as_secs_f64()),
            Kind::Ping => write!(f, "Ping"),
            Kind::Unlock => write!(f, "Unlock"),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} sent {}", self.kind, self.sent)
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.status)?;
        if let Some(fence) = self.fence {
            write!(f, " fence {fence}")?;
        }
        write!(f, " to {}", self.to)
    }
}
