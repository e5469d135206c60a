//! What a caller sets, before anything is sent: a [`Client`](crate::Client)'s options
//! ([`ClientOptions`]) and one lock's ([`LockOptions`], [`LockWait`]).
//!
//! [`Client`](crate::Client): crate::Client

use crate::safety::DEFAULT_SAFETY_MARGIN;
use std::sync::Arc;
use std::time::Duration;

/// Settings of a [`Client`](crate::Client). Its `Debug` shows whether an access token is
/// set, never the token, so options can be logged.
#[derive(Clone)]
pub struct ClientOptions {
    /// Give up connecting after this long. Default 5 s.
    pub connect_timeout: Duration,
    /// Send a Ping when nothing was written for this long, or for a quarter
    /// of the server's session timeout if that is shorter. Default 10 s.
    pub heartbeat: Duration,
    /// Most requests unanswered at once. Default 256, under the server's
    /// default pipeline limit of 1024.
    pub max_in_flight: usize,
    /// Access token sent with every request.
    pub access_token: Option<String>,
    /// TCP keepalive idle time; probes follow at a third of it and the
    /// connection is declared dead after three unanswered ones. Unacknowledged
    /// writes (heartbeats) fail the connection after the same total time.
    /// Default 10 s.
    pub keepalive: Duration,
    /// How long before a held lock's safety deadline it is reported lost
    /// ([`crate::Lost::Jeopardy`]) when no answer from the server has
    /// renewed it: the time the holder gets to stop. At most a quarter of
    /// the lease or session timeout is used. Default 2 s.
    pub safety_margin: Duration,
    /// The session timeout assumed for a server that does not state one
    /// (one that predates Hello). Default 10 s, this server's default
    /// session timeout (its write timeout); set it to the least of the old
    /// server's idle, keepalive and write timeouts.
    pub fallback_session_timeout: Duration,
    /// Connect with TLS, trusting and presenting what this configuration
    /// holds (see [`crate::tls::client_config`]); the server's certificate
    /// must name the host part of the address. `None` (the default): plain
    /// TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// On a cluster: the TTL asked for this client's sessions, how long
    /// one outlives a broken connection (and so how long a failover may
    /// take without losing locks), from 1 s up to the cluster's
    /// `--max-session-ttl`. `None` (the default): the cluster's default
    /// (`--session-ttl`, 10 s). Ignored by a single server.
    pub session_ttl: Option<Duration>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field by name, so a field added later is not left out
        // without the compiler saying so.
        let ClientOptions {
            connect_timeout,
            heartbeat,
            max_in_flight,
            access_token,
            keepalive,
            safety_margin,
            fallback_session_timeout,
            tls,
            session_ttl,
        } = self;
        f.debug_struct("ClientOptions")
            .field("connect_timeout", connect_timeout)
            .field("heartbeat", heartbeat)
            .field("max_in_flight", max_in_flight)
            .field("access_token", &access_token.as_ref().map(|_| "(set)"))
            .field("keepalive", keepalive)
            .field("safety_margin", safety_margin)
            .field("fallback_session_timeout", fallback_session_timeout)
            .field("tls", &tls.is_some())
            .field("session_ttl", session_ttl)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(10),
            max_in_flight: 256,
            access_token: None,
            keepalive: Duration::from_secs(10),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            fallback_session_timeout: Duration::from_secs(10),
            tls: None,
            session_ttl: None,
        }
    }
}

/// How long a Lock may wait for busy keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockWait {
    /// Wait as long as it takes (the default).
    #[default]
    Forever,
    /// Wait at most this long.
    AtMost(Duration),
    /// Do not wait: fail at once if any key is busy.
    No,
}

/// Options of a Lock request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// How long to wait for busy keys.
    pub wait: LockWait,
    /// Take the keys as a lease of this length: it outlives the connection
    /// and expires unless renewed. `None`: held until unlocked or until the
    /// connection ends.
    pub lease: Option<Duration>,
    /// Take every key shared: alongside other shared holders, never
    /// alongside an exclusive one. See docs/PROTOCOL.md, "Shared locks and
    /// semaphores".
    pub shared: bool,
    /// Take every key shared, at most this many holders at once (a
    /// semaphore); 0 is no limit. Everyone sharing a key must name the same
    /// limit. Implies [`LockOptions::shared`] when above 0.
    pub limit: u32,
}

impl LockOptions {
    /// Wait without limit, no lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wait at most `limit`.
    pub fn wait(mut self, limit: Duration) -> Self {
        self.wait = LockWait::AtMost(limit);
        self
    }

    /// Fail at once if busy.
    pub fn no_wait(mut self) -> Self {
        self.wait = LockWait::No;
        self
    }

    /// Take a lease of `lease`. A zero lease means no lease, as on the wire.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Take every key shared (a reader lock): any number of shared holders
    /// at once, or one exclusive holder. A Lock for a key this guard's
    /// owner holds in the other mode fails with
    /// [`ResponseStatus::ModeConflict`](crate::proto::ResponseStatus::ModeConflict).
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// Take every key as a semaphore of `n` holders: shared, at most `n` at
    /// once. Holders and waiters that name another limit for the key fail
    /// with [`ResponseStatus::LimitMismatch`](crate::proto::ResponseStatus::LimitMismatch). 0 is a plain shared lock.
    pub fn limit(mut self, n: u32) -> Self {
        self.shared = true;
        self.limit = n;
        self
    }

    pub(crate) fn shares(&self) -> bool {
        self.shared || self.limit > 0
    }
}

#[cfg(test)]
mod tests {
    use super::ClientOptions;

    #[test]
    fn debug_says_a_token_is_set_without_showing_it() {
        let options = ClientOptions {
            access_token: Some("s3cret-token".into()),
            ..ClientOptions::default()
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("access_token: Some(\"(set)\")"), "{shown}");
        let none = format!("{:?}", ClientOptions::default());
        assert!(none.contains("access_token: None"), "{none}");
    }
}
