//! Errors of the client library.

pub use crate::disconnect::Disconnect;
use crate::proto::ResponseStatus;
use std::time::Duration;

/// What can go wrong talking to a dlock server. New kinds may be added in a minor release, so a `match`
/// needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[error("cannot connect to {addr}: no answer within {:.1}s", .timeout.as_secs_f64())]
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
    /// With [`ResponseStatus::FrameTooLarge`], the client refused to send a
    /// request over the server's frame limit (the server would have closed
    /// the connection).
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
    /// The server requires a client certificate (mutual TLS) and this
    /// client gave none.
    #[error("the server at {addr} requires a client certificate ({source}): give --tls-cert and --tls-key (DLOCK_TLS_CERT, DLOCK_TLS_KEY) of one signed by the CA of its --tls-client-ca (dlock-server cert create-client NAME)")]
    ClientCertificateRequired {
        /// The address tried.
        addr: String,
        /// The server's TLS alert.
        #[source]
        source: std::io::Error,
    },
    /// The server refused this client's certificate: not signed by a CA
    /// it trusts, expired, or otherwise unusable.
    #[error("the server at {addr} refused this client's certificate ({source}): --tls-cert must be signed by the CA of the server's --tls-client-ca (dlock-server cert create-client NAME) and be valid now")]
    ClientCertificateRefused {
        /// The address tried.
        addr: String,
        /// The server's TLS alert.
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
    /// The server's TLS refused the protocol name dlock offers: it is no
    /// dlock client port, most likely a cluster node's peer port.
    #[error("the server at {addr} refuses dlock's TLS protocol name ({source}): it is no dlock client port, most likely a cluster node's peer port (its --peer-listen): give a client port instead (a node's --listen)")]
    NotAClientPort {
        /// The address tried.
        addr: String,
        /// The server's TLS alert.
        #[source]
        source: std::io::Error,
    },
    /// Several addresses were given, and the one that answered is a single
    /// server, not a node of a cluster. The addresses of a list must be one
    /// cluster's nodes: single servers share no locks, so a client that
    /// moved to the next one when the first was down would lock on a
    /// server the others do not use.
    #[error("{addr} is a single server, not a cluster node: several addresses must be the nodes of one cluster, since single servers share no locks (give this server's address alone)")]
    NotOneCluster {
        /// The single server's address.
        addr: String,
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

/// What a node that is not the leader and knows none says, as an
/// [`Error::Unreachable`] attempt records it.
pub(crate) const NO_LEADER_KNOWN: &str = "not the leader, and no leader is known yet";

impl Error {
    /// Whether every node tried answered but none knew a leader: the nodes
    /// run, and the cluster has no majority that elects one (as opposed to
    /// nodes that do not answer at all).
    pub fn only_leaderless_nodes_answered(&self) -> bool {
        matches!(self, Error::Unreachable { attempts }
            if !attempts.is_empty() && attempts.iter().all(|(_, why)| why == NO_LEADER_KNOWN))
    }

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
    use std::io;
    use std::sync::Arc;

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
    fn nodes_that_all_answered_without_a_leader_are_told_from_nodes_down() {
        let tried = |whys: &[&str]| Error::Unreachable {
            attempts: whys
                .iter()
                .enumerate()
                .map(|(i, why)| (format!("h:{i}"), (*why).to_owned()))
                .collect(),
        };
        assert!(tried(&[NO_LEADER_KNOWN, NO_LEADER_KNOWN]).only_leaderless_nodes_answered());
        assert!(!tried(&[NO_LEADER_KNOWN, "Connection refused"]).only_leaderless_nodes_answered());
        assert!(!tried(&[]).only_leaderless_nodes_answered());
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
