//! What a server allows, as it states in the answer to Hello.

use crate::proto;
use std::time::Duration;

/// The server's limits and timeouts, learnt when the client connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The server may end a connection that sent no request for this long;
    /// locks without a lease end with it.
    pub session_timeout: Duration,
    /// Longest lease.
    pub max_lease: Duration,
    /// Most keys in one request.
    pub max_keys: usize,
    /// Longest key, in bytes.
    pub max_key_len: usize,
    /// Largest request frame body, in bytes.
    pub max_frame: usize,
    /// Most unanswered requests per connection.
    pub max_pipeline: usize,
    /// Sessions outlive a broken connection and can be resumed through
    /// another node: the server is a cluster node.
    pub resumable_sessions: bool,
    /// A cluster node's election timeout: a silent leader is replaced
    /// within about 3 to 4 times this. `None` for a single server, or a
    /// node that does not say.
    pub election_timeout: Option<Duration>,
}

/// A request the server would refuse, found before sending it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// No keys.
    #[error("no key given")]
    NoKeys,
    /// More keys than the server takes in one request.
    #[error("{count} keys; the server takes at most {max} in one request")]
    TooManyKeys {
        /// Keys given.
        count: usize,
        /// The server's limit.
        max: usize,
    },
    /// An empty key.
    #[error("an empty key is not allowed")]
    EmptyKey,
    /// A key longer than the server allows.
    #[error("key {key:?} is {len} bytes long; the server allows at most {max}")]
    KeyTooLong {
        /// The key, cut to 64 characters for the message.
        key: String,
        /// Its length in bytes.
        len: usize,
        /// The server's limit.
        max: usize,
    },
    /// A lease longer than the server allows.
    #[error("exceeds the server's maximum lease of {}", crate::duration::format(*.max))]
    LeaseTooLong {
        /// The server's limit.
        max: Duration,
    },
}

impl Limits {
    /// Checks `keys` against the server's key rules.
    ///
    /// # Errors
    /// The first rule broken.
    pub fn check_keys(&self, keys: &[String]) -> Result<(), LimitError> {
        if keys.is_empty() {
            return Err(LimitError::NoKeys);
        }
        if keys.len() > self.max_keys {
            return Err(LimitError::TooManyKeys {
                count: keys.len(),
                max: self.max_keys,
            });
        }
        for key in keys {
            if key.is_empty() {
                return Err(LimitError::EmptyKey);
            }
            if key.len() > self.max_key_len {
                return Err(LimitError::KeyTooLong {
                    key: key.chars().take(64).collect(),
                    len: key.len(),
                    max: self.max_key_len,
                });
            }
        }
        Ok(())
    }

    /// Checks a lease length against the server's maximum.
    ///
    /// # Errors
    /// [`LimitError::LeaseTooLong`].
    pub fn check_lease(&self, lease: Duration) -> Result<(), LimitError> {
        if lease > self.max_lease {
            return Err(LimitError::LeaseTooLong {
                max: self.max_lease,
            });
        }
        Ok(())
    }
}

impl From<&proto::ServerLimits> for Limits {
    fn from(l: &proto::ServerLimits) -> Self {
        let size = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Limits {
            session_timeout: Duration::from_micros(l.session_timeout_micro),
            max_lease: Duration::from_micros(l.max_lease_micro),
            max_keys: size(l.max_keys),
            max_key_len: size(l.max_key_len),
            max_frame: size(l.max_frame),
            max_pipeline: size(l.max_pipeline),
            resumable_sessions: l.resumable_sessions,
            election_timeout: (l.election_timeout_micro > 0)
                .then(|| Duration::from_micros(l.election_timeout_micro)),
        }
    }
}
