//! One connection's tickets: its Enqueues that went into line, from the
//! Queued answer until the Wait that collects their outcome (a single
//! server; a cluster node keeps its own in `replicated`).
//!
//! A queued Enqueue is a waiting Lock whose outcome nobody awaits yet: its
//! delivery (the receiver `Db` sends the grant or timeout to) is parked
//! here, under the table's request id, which is the ticket. The Wait takes
//! it out and the connection's pipeline awaits it exactly as it awaits a
//! Lock, so an outcome decided before the Wait arrived is answered at once.
//!
//! Bounded: a connection holds at most `--max-pipeline` tickets (an answer
//! it has yet to collect costs about what an unanswered request does). A
//! ticket goes when its Wait comes, when its session is closed, or with
//! the connection; a grant nobody collected is then released (see
//! [`Db::abandon`]), so no lease outlives a client that never learned its
//! fencing token.

use crate::acl;
use crate::db::Db;
use crate::table::{OwnerId, ReqId, Woken};
use std::collections::BTreeMap;
use tokio::sync::oneshot;

/// The tickets of one connection.
#[derive(Debug)]
pub struct Tickets {
    db: Db,
    held: BTreeMap<ReqId, Ticket>,
    max: usize,
}

/// A queued Enqueue, waiting for its Wait.
#[derive(Debug)]
pub struct Ticket {
    /// The owner (connection or session) the Enqueue acted for: only a Wait
    /// of the same owner may collect it.
    owner: OwnerId,
    /// Where the outcome arrives.
    pub rx: oneshot::Receiver<Woken>,
    /// What access control notes if it is granted.
    pub grant_note: Option<acl::Pending>,
}

/// What a Wait found for its ticket.
#[derive(Debug)]
pub enum Collected {
    /// The ticket, taken: await its outcome.
    Ticket(Ticket),
    /// No such ticket for this owner: never issued to it, already waited
    /// for, or its session closed.
    Unknown,
}

impl Tickets {
    /// No tickets yet; at most `max` at once.
    pub fn new(db: &Db, max: usize) -> Tickets {
        Tickets {
            db: db.clone(),
            held: BTreeMap::new(),
            max: max.max(1),
        }
    }

    /// Whether another ticket would pass the limit.
    pub fn is_full(&self) -> bool {
        self.held.len() >= self.max
    }

    /// The most tickets held at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Parks the delivery of `req`, a queued Enqueue of `owner`.
    pub fn insert(
        &mut self,
        req: ReqId,
        owner: OwnerId,
        rx: oneshot::Receiver<Woken>,
        grant_note: Option<acl::Pending>,
    ) {
        let ticket = Ticket {
            owner,
            rx,
            grant_note,
        };
        if let Some(old) = self.held.insert(req, ticket) {
            // Request ids are never reused, so this is a bug; the old
            // delivery is still released rather than leaked.
            debug_assert!(false, "ticket {req} issued twice");
            self.db.abandon(old.rx);
        }
    }

    /// Takes ticket `req` for a Wait of `owner`. A ticket of another owner
    /// of the connection stays where it is.
    pub fn collect(&mut self, req: ReqId, owner: OwnerId) -> Collected {
        match self.held.get(&req) {
            Some(t) if t.owner == owner => {}
            _ => return Collected::Unknown,
        }
        match self.held.remove(&req) {
            Some(t) => Collected::Ticket(t),
            None => Collected::Unknown,
        }
    }

    /// Drops the tickets of `owner`, whose session ends: its waiting
    /// requests are withdrawn by the table, its uncollected grants released.
    pub fn close_owner(&mut self, owner: OwnerId) {
        let theirs: Vec<ReqId> = self
            .held
            .iter()
            .filter(|(_, t)| t.owner == owner)
            .map(|(&r, _)| r)
            .collect();
        for req in theirs {
            if let Some(t) = self.held.remove(&req) {
                self.db.abandon(t.rx);
            }
        }
    }
}

impl Drop for Tickets {
    /// The connection ended: no Wait will come.
    fn drop(&mut self) {
        for (_, t) in std::mem::take(&mut self.held) {
            self.db.abandon(t.rx);
        }
    }
}
