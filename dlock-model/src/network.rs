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

use dlock::proto::{RequestType, ResponseStatus};
use dlock_server::table::{OwnerId, ReqId};
use std::fmt;
use std::time::Duration;

use crate::tick::Tick;

/// The requests a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Lock the key, for `lease` or (`None`) for as long as the session
    /// lives; never waits (a busy key is answered at once).
    Lock(Option<Duration>),
    /// Lock the key for as long as the session lives, waiting up to this
    /// long for it (the table's `WaitLimit::For`): the node answers when
    /// the table decides, on a release, a lease's or the limit's expiry.
    LockWaiting(Duration),
    /// Enqueue (request type 12): a Lock waiting up to this long,
    /// answered at once, `Ok` with a fence or `Queued` with a ticket.
    Enqueue(Duration),
    /// Wait (request type 13) for the queued Enqueue of this ticket:
    /// answered as the Lock would have been.
    Wait(ReqId),
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
    /// The request type on the wire.
    pub fn request_type(self) -> RequestType {
        match self {
            Kind::Lock(_) | Kind::LockWaiting(_) => RequestType::Lock,
            Kind::Enqueue(_) => RequestType::Enqueue,
            Kind::Wait(_) => RequestType::Wait,
            Kind::Renew(_) => RequestType::Renew,
            Kind::Ping => RequestType::Ping,
            Kind::Unlock => RequestType::Unlock,
            Kind::Resume => RequestType::OpenSession,
        }
    }

    /// Whether the request changes the table, and so is numbered (`seq`)
    /// on a named session and sent again under its number after a resume:
    /// `dlock::rules::session_use` of its type.
    pub fn numbered(self) -> bool {
        dlock::rules::session_use(self.request_type()).1
    }

    /// Whether it asks for the key (a Lock of any kind, or an Enqueue).
    pub fn locks(self) -> bool {
        matches!(
            self,
            Kind::Lock(_) | Kind::LockWaiting(_) | Kind::Enqueue(_)
        )
    }

    /// The wait limit of a request that may queue for the key.
    pub fn wait_limit(self) -> Option<Duration> {
        match self {
            Kind::LockWaiting(d) | Kind::Enqueue(d) => Some(d),
            _ => None,
        }
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
    /// The ticket of a queued Enqueue (`Queued`).
    pub ticket: Option<ReqId>,
}

impl Answer {
    /// `status` to `to`, with nothing else.
    pub fn bare(to: Request, status: ResponseStatus) -> Answer {
        Answer {
            to,
            status,
            fence: None,
            ticket: None,
        }
    }
}

/// A request the node read and answers later: one that waits in the
/// table's queue (a waiting Lock, or a Wait on a queued ticket). Answers
/// on a connection come in request order, so nothing else is read on the
/// connection meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Parked {
    /// The request.
    pub req: Request,
    /// The session it waits for.
    pub owner: OwnerId,
    /// The table's id of the waiting request.
    pub ticket: ReqId,
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
    /// The node's side: a request read and waiting for the table's
    /// decision, answered when the decision is applied on this node.
    pub parked: Option<Parked>,
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
            parked: None,
        }
    }

    /// Whether a request whose kind matches `pred` is sent and not yet
    /// answered.
    pub fn awaits(&self, pred: impl Fn(Kind) -> bool) -> bool {
        self.out.iter().any(|r| pred(r.kind))
            || self.back.iter().any(|a| pred(a.to.kind))
            || self.parked.is_some_and(|p| pred(p.req.kind))
    }

    /// Whether anything is in flight on it (a request waiting at the node
    /// included).
    pub fn busy(&self) -> bool {
        !self.out.is_empty() || !self.back.is_empty() || self.parked.is_some()
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
            Kind::LockWaiting(wait) => write!(f, "Lock(no lease, wait {}s)", wait.as_secs_f64()),
            Kind::Enqueue(wait) => write!(f, "Enqueue(wait {}s)", wait.as_secs_f64()),
            Kind::Wait(ticket) => write!(f, "Wait(ticket {ticket})"),
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
        if let Some(ticket) = self.ticket {
            write!(f, " ticket {ticket}")?;
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
