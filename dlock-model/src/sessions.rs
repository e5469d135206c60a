//! What a node keeps of its client connections and the sessions they act
//! for, and what it does when a connection ends: the rules of
//! `dlock-server/src/service/session.rs` (`Service::connection_ended`, the
//! outcome registry's `attach`/`attached_through`), written again over the
//! model's state, since the service that holds them is asynchronous and
//! drives an engine. What they decide the cluster applies to the real
//! table (`Command::Disconnect`, in `Cluster::connection_ended`).
//!
//! The rules: a clean close (FIN) ends every session the connection acts
//! for, unless the session was resumed on another connection since (it is
//! that one's now); a reset (RST) ends only the connection's implicit
//! session, which nobody can resume, and leaves a named one to its TTL so
//! its client can resume it elsewhere. A node that does not lead cannot
//! commit the end: the session then lives out its TTL.

use dlock_server::table::OwnerId;

use crate::config::{Bug, Config};
use crate::network::{Close, Ended};

/// A connection as the nodes name it: (client, the client's count of its
/// connections).
pub type ConnId = (u8, u8);

/// Which connection each node last attached each session to: a session is
/// attached to the connection that opened or resumed it, on the node that
/// did (the registry is the node's own, not replicated).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Attached {
    /// (node, session, connection), sorted.
    entries: Vec<(u8, OwnerId, ConnId)>,
}

impl Attached {
    /// `node` attaches `session` to `conn` (replacing any earlier one).
    pub fn attach(&mut self, node: u8, session: OwnerId, conn: ConnId) {
        self.entries.retain(|&(n, s, _)| (n, s) != (node, session));
        self.entries.push((node, session, conn));
        self.entries.sort_unstable();
    }

    /// Forgets the entries of connections `live` says are gone and whose
    /// end their node will never read: nothing can look them up again (a
    /// connection ends once), and keeping them would only tell apart
    /// states that are the same.
    pub fn forget_unless(&mut self, live: impl Fn(ConnId) -> bool) {
        self.entries.retain(|&(_, _, c)| live(c));
    }

    /// The sessions `node` has attached to `conn`, detached now: only
    /// those, since one resumed on another connection since is that one's,
    /// and a clean close here must not end it.
    pub fn detach_all(&mut self, node: u8, conn: ConnId) -> Vec<OwnerId> {
        let mut gone = Vec::new();
        self.entries.retain(|&(n, s, c)| {
            let here = (n, c) == (node, conn);
            if here {
                gone.push(s);
            }
            !here
        });
        gone
    }
}

/// Of the sessions `attached` through the connection that ended as
/// `end`, those its end ends: with a FIN all of them, with a RST only its
/// implicit session (with [`Bug::ImplicitOutlivesConnection`], none).
pub fn ending(end: &Ended, attached: Vec<OwnerId>, cfg: &Config) -> Vec<OwnerId> {
    attached
        .into_iter()
        .filter(|&s| match end.how {
            Close::Fin => true,
            Close::Rst => Some(s) == end.implicit && !cfg.has(Bug::ImplicitOutlivesConnection),
        })
        .collect()
}
