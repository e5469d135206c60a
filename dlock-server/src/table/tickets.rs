//! What the two-phase acquire (Enqueue, then Wait) asks of the table: a
//! waiting request's place in line, and what became of a request a session
//! waits for by its ticket.
//!
//! Read-only on purpose: an Enqueue is applied as a plain
//! [`Command::Lock`](super::Command::Lock) and a Wait changes nothing, so
//! the log, the snapshot and the determinism contract are those of Lock.
//! The ticket a client holds is the request's [`ReqId`], which every node
//! of a cluster assigns alike.

use super::resend::Answers;
use super::{LockTable, OwnerId, Reply, ReqId, WaitOutcome};

/// What the table knows of a ticket, for a Wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketState {
    /// The request still waits in line, for this owner.
    Waiting,
    /// The session remembers the outcome (a numbered request, see
    /// `resend`): the answer a Wait gives.
    Decided(WaitOutcome),
    /// Not a waiting request of this owner, and no outcome remembered.
    Unknown,
}

impl LockTable {
    /// How many requests are ahead of waiting request `req`: over its keys,
    /// the most requests queued for one key that arrived before it. `None`
    /// when `req` does not wait.
    pub fn place_in_line(&self, req: ReqId) -> Option<usize> {
        let waiter = self.waiters.get(&req)?;
        let ahead = waiter
            .keys
            .iter()
            .filter_map(|k| self.keys.get(k))
            .map(|s| s.queue.iter().take_while(|r| **r < req).count())
            .max()
            .unwrap_or(0);
        Some(ahead)
    }

    /// What became of request `req` of `owner`, as far as the table knows.
    pub fn ticket(&self, owner: OwnerId, req: ReqId) -> TicketState {
        if self.waiters.get(&req).is_some_and(|w| w.owner == owner) {
            return TicketState::Waiting;
        }
        match self.sessions.answers(owner).and_then(|a| a.outcome_of(req)) {
            Some(outcome) => TicketState::Decided(outcome.clone()),
            None => TicketState::Unknown,
        }
    }
}

impl Answers {
    /// The remembered outcome of waiting request `req`, if it was numbered
    /// and its reply is still remembered. A scan: at most
    /// [`super::MAX_REMEMBERED`] replies, and a Wait asks once.
    pub(super) fn outcome_of(&self, req: ReqId) -> Option<&WaitOutcome> {
        self.replies().find_map(|r| match r {
            Reply::Waited { req: r, outcome } if *r == req => Some(outcome),
            _ => None,
        })
    }
}
