//! Errors of the client library.

use crate::proto::ResponseStatus;
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
    /// The wait limit passed with keys still busy.
    #[error("lock not acquired in time: busy keys {busy:?}")]
    Timeout {
        /// The keys that were not available.
        busy: Vec<String>,
    },
    /// A Lock that was not to wait ([`crate::Wait::No`]) found keys busy.
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
    /// Reading or writing the connection failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The connection is gone; locks bound to it are released by the server.
    #[error("connection to the server lost: {0}")]
    ConnectionLost(String),
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
