//! What the service keeps of one client connection: the sessions it acts
//! for, the tickets it has yet to wait for, and who it is.
//!
//! Sessions themselves live in the table; this is only which of them this
//! connection may name. An older client that never opens one gets one
//! opened for it on its first request that needs an owner: the connection's
//! *implicit* session, which ends with the connection however it ends.

use crate::table::{OwnerId, ReqId};
use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Tickets a connection remembers as waited for. A second Wait for an
/// older one is answered from the session's memory, as a Wait sent again
/// after a failover is: the same outcome, never a second grant.
pub(super) const ANSWERED_TICKETS: usize = 64;

/// One client connection, as the service sees it.
#[derive(Debug)]
pub struct Conn {
    /// Unique on this server, for the outcome registry.
    pub(super) id: u64,
    /// The client's address, shown by Inspect for the sessions it holds.
    pub(super) peer: SocketAddr,
    /// The names of the connection's TLS client certificate, if any.
    pub(super) peer_names: Vec<String>,
    state: Mutex<ConnState>,
    /// Wakes the session keeper when a session with a shorter TTL appears.
    pub(super) ttl_changed: Notify,
    /// Cancelled when this node stops leading while keeping the
    /// connection's sessions: the connection is then reset (see
    /// `session::keep_connection_alive`).
    pub deposed: CancellationToken,
}

#[derive(Debug, Default)]
pub(super) struct ConnState {
    /// Opened for a client that names no session.
    pub(super) implicit: Option<OwnerId>,
    /// Opened or resumed with OpenSession.
    pub(super) named: Vec<OwnerId>,
    /// The connection has ended; sessions opened for it afterwards (by a
    /// request still in flight) must be ended at once.
    pub(super) closed: bool,
    /// The shortest TTL of its sessions, for the keeper's pace.
    pub(super) shortest_ttl: Option<Duration>,
    /// The access-control identity of the latest request (empty without
    /// access control): the owner of the sessions it opens.
    pub(super) identity: String,
    /// The first session of this connection found ended (a keep-alive or
    /// a request answered UnknownSession).
    pub(super) ended: Option<OwnerId>,
    /// Tickets of queued Enqueues answered on this connection and not yet
    /// waited for: at most `--max-pipeline`.
    pub(super) tickets: BTreeSet<(OwnerId, ReqId)>,
    /// The latest tickets waited for on this connection, so a second Wait
    /// is refused: at most [`ANSWERED_TICKETS`].
    pub(super) waited: VecDeque<(OwnerId, ReqId)>,
}

impl Conn {
    /// A new connection from `peer`, whose TLS client certificate (if any)
    /// has `peer_names`.
    pub fn new(peer: SocketAddr, peer_names: Vec<String>) -> Conn {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Conn {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            peer,
            peer_names,
            state: Mutex::default(),
            ttl_changed: Notify::new(),
            deposed: CancellationToken::new(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every session of the connection, implicit and named.
    pub(super) fn all(&self) -> Vec<OwnerId> {
        let st = self.state();
        let mut all: Vec<OwnerId> = st.implicit.iter().chain(&st.named).copied().collect();
        // A resume may name the implicit session too.
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether the connection acts for a named session, which outlives it
    /// on a cluster and can be resumed elsewhere.
    pub fn has_named_sessions(&self) -> bool {
        !self.state().named.is_empty()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.state().closed
    }

    pub(super) fn note_ttl(&self, ttl: Duration) {
        let mut st = self.state();
        if st.shortest_ttl.is_none_or(|t| ttl < t) {
            st.shortest_ttl = Some(ttl);
            drop(st);
            self.ttl_changed.notify_one();
        }
    }
}
