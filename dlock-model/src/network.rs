//! What travels between a client and the node its connection goes to.
//!
//! A client has at most one connection at a time, to one node. Requests
//! arrive in the order sent and answers come back in the order of their
//! requests (one TCP stream each way), each after any delay: TCP loses no
//! message in the middle of a stream and delivers none twice, so a loss is
//! a message never delivered, until the client resets the connection. A connection
//! ends in one of two ways the node tells apart ([`Close`]): a clean close
//! (FIN) or a reset (RST). Its end travels to the node as an [`Ended`],
//! with the requests still on their way, which the node may read before
//! it reads the end (their answers go nowhere), or not at all; meanwhile
//! the client opens a connection to any node, and a client of a named
//! session resumes it there first (a handshake: nothing else is sent until
//! it is answered) and sends again what was unanswered. So one request may
//! be applied twice, once from each connection, in either order: the
//! duplicates and the reordering across connections that the session's
//! numbering (`seq`) must absorb.

use dlock::proto::ResponseStatus;
use dlock_server::table::OwnerId;
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
    /// OpenSession naming the client's session: resume it on this
    /// connection.
    Resume,
}

impl Kind {
    /// Whether the request changes the table, and so is numbered (`seq`)
    /// on a named session and sent again after a resume
    /// (`dlock::rules::session_use`).
    pub fn numbered(self) -> bool {
        matches!(self, Kind::Lock(_) | Kind::Renew(_) | Kind::Unlock)
    }
}

/// A request, with its send times by the sender's clock (what the rules
/// measure deadlines from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// What it asks.
    pub kind: Kind,
    /// When it was last written, by the client's clock: sent again after a
    /// resume it is restamped, as the library's link does, since a session
    /// is kept alive by the command sent again as by the first.
    pub sent: Tick,
    /// When it was first written: a lease set by it started at the server
    /// no earlier than this, whichever copy was applied (the guard's own
    /// send time, never restamped).
    pub first: Tick,
    /// Its number in the session (0: none).
    pub seq: u8,
    /// The client has the answers numbered up to here (`seq_done`).
    pub done: u8,
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

/// How a connection ends, which a cluster node tells apart: a clean close
/// says the client is done and ends its sessions; a reset says the path
/// broke, and leaves a named session to be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Close {
    /// A clean close (TCP FIN).
    Fin,
    /// A reset (TCP RST), or a path that broke.
    Rst,
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The resume of the client's session is sent, unanswered: nothing
    /// else goes on this connection yet.
    Resuming,
    /// Requests flow.
    Open,
}

/// A client's connection: the node it goes to and what is in flight, and
/// what the node keeps of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Conn {
    /// The node.
    pub node: u8,
    /// The client's count of its connections: how the node tells this one
    /// from the client's others.
    pub id: u8,
    /// Whether it is still resuming.
    pub phase: Phase,
    /// Requests sent and not yet read by the node, oldest first.
    pub out: Vec<Request>,
    /// Answers written by the node and not yet read by the client, oldest
    /// first.
    pub back: Vec<Answer>,
    /// The node's side: the connection's implicit session, opened by its
    /// first request that needed an owner, for a client that names none.
    pub implicit: Option<OwnerId>,
}

impl Conn {
    /// A new connection, the client's `id`th, to `node`.
    pub fn new(node: u8, id: u8, phase: Phase) -> Conn {
        Conn {
            node,
            id,
            phase,
            out: Vec::new(),
            back: Vec::new(),
            implicit: None,
        }
    }

    /// Whether a request whose kind matches `pred` is sent and not yet
    /// answered.
    pub fn awaits(&self, pred: impl Fn(Kind) -> bool) -> bool {
        self.out.iter().any(|r| pred(r.kind)) || self.back.iter().any(|a| pred(a.to.kind))
    }

    /// Whether anything is in flight on it.
    pub fn busy(&self) -> bool {
        !self.out.is_empty() || !self.back.is_empty()
    }
}

/// A connection's end on its way to its node: the node acts on it when it
/// reads it (see `Cluster::connection_ended`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ended {
    /// The node.
    pub node: u8,
    /// Which of the client's connections.
    pub conn: u8,
    /// How it ended.
    pub how: Close,
    /// Its implicit session, if the node opened one.
    pub implicit: Option<OwnerId>,
    /// Requests still on their way to the node, oldest first.
    pub out: Vec<Request>,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Lock(Some(lease)) => write!(f, "Lock(lease {}s)", lease.as_secs_f64()),
            Kind::Lock(None) => write!(f, "Lock(no lease)"),
            Kind::Renew(lease) => write!(f, "Renew({}s)", lease.as_secs_f64()),
            Kind::Ping => write!(f, "Ping"),
            Kind::Unlock => write!(f, "Unlock"),
            Kind::Resume => write!(f, "Resume"),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if self.seq != 0 {
            write!(f, " #{}", self.seq)?;
        }
        write!(f, " sent {}", self.sent)?;
        if self.first != self.sent {
            write!(f, " (first {})", self.first)?;
        }
        Ok(())
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

impl fmt::Display for Close {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Close::Fin => "FIN",
            Close::Rst => "RST",
        })
    }
}
