//! Why a connection ended: the reason every call on it fails with and every
//! guard on it reports, apart from the errors (`error.rs`) and the lost
//! locks (`safety.rs`) that both carry it.

use std::fmt;
use std::io;
use std::sync::Arc;

/// Why a connection to the server ended: the reason every call on it fails
/// with ([`crate::Error::ConnectionLost`]) and every guard on it reports
/// ([`crate::Lost::ConnectionLost`]). Cheap to clone: all calls pending on
/// a connection share one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Disconnect {
    /// Writing to the connection failed.
    Write(Arc<io::Error>),
    /// Reading from the connection failed.
    Read(Arc<io::Error>),
    /// The server closed the connection.
    Closed,
    /// The server sent a frame over this client's limit
    /// ([`crate::MAX_RESPONSE_FRAME`]); the stream cannot be followed.
    FrameTooLarge {
        /// The announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The server sent a frame that is not a Response.
    Undecodable(prost::DecodeError),
    /// The server turned the connection away, saying why (request id 0:
    /// too many connections, shutting down).
    TurnedAway(String),
    /// The server answered a request that was not the next one due.
    UnexpectedAnswer {
        /// The request id answered.
        request_id: u64,
    },
    /// Every handle on the connection was dropped.
    Dropped,
    /// A cluster said the client's session is unknown: it ended (its TTL
    /// ran out while the client was away, or it was closed). Its locks
    /// without a lease are released.
    SessionEnded,
    /// The cluster node stopped leading (it did not act on the request
    /// it said so to); the client moves its session to the new leader.
    NotLeader {
        /// The new leader's address, if the node knew it.
        leader: Option<String>,
    },
    /// The cluster node could not commit the request in time (no quorum
    /// reachable), or told the client's liveness probe it cannot serve
    /// (`Unavailable`); the client looks for the leader again and sends
    /// the request again under the same number.
    NoQuorum,
    /// A request other than a waiting Lock went unanswered this long (half
    /// the session's TTL): the node is paused, stalled or cut off.
    NoAnswer {
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// No node of the cluster resumed the session before its TTL ran out;
    /// the text says what the last attempts found.
    NotResumed(Arc<String>),
}

impl Disconnect {
    /// What happened, without the prefix "connection to the server lost"
    /// and without the text of the underlying error (see
    /// [`source`](std::error::Error::source)).
    pub fn reason(&self) -> impl fmt::Display + '_ {
        Reason(self)
    }

    /// The I/O error that ended the connection, if one did.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            Disconnect::Write(e) | Disconnect::Read(e) => Some(e),
            _ => None,
        }
    }
}

struct Reason<'a>(&'a Disconnect);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Disconnect::Write(_) => write!(f, "write failed"),
            Disconnect::Read(_) => write!(f, "read failed"),
            Disconnect::Closed => write!(f, "the server closed the connection"),
            Disconnect::FrameTooLarge { len, max } => write!(
                f,
                "response frame of {len} bytes exceeds the limit of {max} bytes"
            ),
            Disconnect::Undecodable(_) => write!(f, "undecodable response"),
            Disconnect::TurnedAway(text) => write!(f, "turned away by the server: {text}"),
            Disconnect::UnexpectedAnswer { request_id } => {
                write!(f, "unexpected response to request {request_id}")
            }
            Disconnect::Dropped => write!(f, "the client was dropped"),
            Disconnect::SessionEnded => write!(f, "the cluster ended the session"),
            Disconnect::NotLeader { leader: Some(l) } => {
                write!(f, "the node is no longer the leader ({l} is)")
            }
            Disconnect::NotLeader { leader: None } => write!(f, "the node is no longer the leader"),
            Disconnect::NoQuorum => {
                write!(f, "the node cannot commit now (Unavailable)")
            }
            Disconnect::NoAnswer { waited } => {
                write!(f, "no answer for {}", crate::duration::human(*waited))
            }
            Disconnect::NotResumed(why) => {
                write!(f, "the session was not resumed within its TTL: {why}")
            }
        }
    }
}

impl fmt::Display for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "connection to the server lost: {}", self.reason())
    }
}

impl std::error::Error for Disconnect {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Disconnect::Write(e) | Disconnect::Read(e) => Some(&**e),
            Disconnect::Undecodable(e) => Some(e),
            _ => None,
        }
    }
}
