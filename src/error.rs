//! Errors of the client library.

use crate::proto::ResponseStatus;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// What can go wrong talking to a dlock server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TCP connection could not be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address tried.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TCP connection was not made within the connect timeout.
    #[error("cannot connect to {addr}: no answer within {timeout:?}")]
    ConnectTimeout {
        /// The address tried.
        addr: String,
        /// The limit in force.
        timeout: Duration,
    },
    /// No server among several addresses could be used.
    #[error("no server reachable: {}", attempts.iter().map(|(a, why)| format!("{a}: {why}")).collect::<Vec<_>>().join("; "))]
    Unreachable {
        /// Each address tried and why it failed (the latest reason).
        attempts: Vec<(String, String)>,
    },
    /// The wait limit passed with keys still busy.
    #[error("lock not acquired in time: busy keys {busy:?}")]
    Timeout {
        /// The keys that were not available.
        busy: Vec<String>,
    },
    /// A Lock that was not to wait ([`crate::LockWait::No`]) found keys busy.
    #[error("lock not acquired: busy keys {busy:?}")]
    Busy {
        /// The keys that were not available.
        busy: Vec<String>,
    },
    /// The server wants an access token that this client did not give or
    /// that it does not accept.
    #[error("access denied: {0}")]
    AccessDenied(String),
    /// Unlock or Renew named keys that are not held (any more).
    #[error("keys not held: {keys:?}")]
    NotHeld {
        /// The keys not held.
        keys: Vec<String>,
    },
    /// The server refused the request: bad input, a limit, shutting down.
    #[error("server answered {status:?}: {text}")]
    Server {
        /// The status.
        status: ResponseStatus,
        /// The server's explanation.
        text: String,
    },
    /// The server sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server answered with TLS to a client without TLS.
    #[error("the server speaks TLS: give the CA certificate that signed its certificate with --tls-ca (DLOCK_TLS_CA)")]
    ServerSpeaksTls,
    /// A TLS client's handshake found no TLS on the other end.
    #[error("the server at {addr} does not speak TLS ({source}): connect without --tls-ca (DLOCK_TLS_CA), or start dlock-server with --tls-cert and --tls-key")]
    ServerSpeaksNoTls {
        /// The address tried.
        addr: String,
        /// What the handshake read.
        #[source]
        source: std::io::Error,
    },
    /// The server's certificate is a CA certificate presented as its own
    /// (one self-signed certificate given as both `--tls-cert` and the
    /// clients' `--tls-ca`), which TLS refuses.
    #[error("the server at {addr} presents a CA certificate as its own ({source}): make a CA and a server certificate signed by it (dlock-server cert create-ca, then create-node), give the server the node's and the clients the CA's")]
    CaUsedAsServerCertificate {
        /// The address tried.
        addr: String,
        /// The TLS error.
        #[source]
        source: std::io::Error,
    },
    /// The connection is gone; locks bound to it are released by the server.
    /// Its [`source`](std::error::Error::source) is the I/O or decoding
    /// error that ended it, if one did.
    #[error(transparent)]
    ConnectionLost(#[from] Disconnect),
    /// The lock fell into jeopardy (or its connection ended) before the
    /// renewal was answered: it can no longer be assumed held, though the
    /// renewal may still reach the server.
    #[error("lock lost before the renewal was answered: {0}")]
    Lost(crate::safety::Lost),
}

/// Why a connection to the server ended: the reason every call on it fails
/// with ([`Error::ConnectionLost`]) and every guard on it reports
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
    /// reachable); the client looks for the leader again and sends the
    /// request again under the same number.
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
            Disconnect::NoQuorum => write!(f, "the node could not commit in time (no quorum)"),
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

impl Error {
    /// The status the server answered with, for errors that come from one.
    pub fn status(&self) -> Option<ResponseStatus> {
        match self {
            Error::Timeout { .. } | Error::Busy { .. } => Some(ResponseStatus::AcquireTimeout),
            Error::AccessDenied(_) => Some(ResponseStatus::AccessDenied),
            Error::NotHeld { .. } => Some(ResponseStatus::NotHeld),
            Error::Server { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_lost_connection_says_why_and_keeps_the_io_error_as_its_source() {
        let io = io::Error::new(io::ErrorKind::BrokenPipe, "pipe gone");
        let e = Error::from(Disconnect::Write(Arc::new(io)));
        assert_eq!(e.to_string(), "connection to the server lost: write failed");
        let source = e.source().expect("the io error");
        let io = source.downcast_ref::<io::Error>().expect("an io::Error");
        assert_eq!(io.kind(), io::ErrorKind::BrokenPipe);
        let Error::ConnectionLost(lost) = e else {
            unreachable!("built above")
        };
        assert_eq!(lost.reason().to_string(), "write failed");
        assert_eq!(
            lost.io_error().map(io::Error::kind),
            Some(io::ErrorKind::BrokenPipe)
        );
    }

    #[test]
    fn a_close_by_the_server_has_no_source() {
        let e = Error::from(Disconnect::Closed);
        assert_eq!(
            e.to_string(),
            "connection to the server lost: the server closed the connection"
        );
        assert!(e.source().is_none());
    }
}
