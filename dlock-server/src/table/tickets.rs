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

#[cfg(test)]
mod tests {
    use super::TicketState;
    use crate::table::{
        Command, Key, LockResult, LockTable, OwnerId, Reply, ReqId, Sharing, TableLimits, Time,
        WaitLimit, WaitOutcome,
    };
    use std::time::Duration;

    fn limits() -> TableLimits {
        TableLimits {
            max_waiters: 100,
            max_held_keys: 100,
        }
    }

    fn lock(owner: OwnerId, keys: &[&str]) -> Command {
        Command::Lock {
            owner,
            keys: keys.iter().map(|k| Key::from(*k)).collect(),
            sharing: Sharing::exclusive(),
            wait: WaitLimit::Forever,
            lease: None,
            value: Vec::new(),
        }
    }

    fn waits(t: &mut LockTable, cmd: Command) -> ReqId {
        match t.apply(cmd, Time::ZERO).reply {
            Reply::Lock(LockResult::Waiting(req)) => req,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn the_place_is_the_longest_queue_ahead_among_the_keys() {
        let mut t = LockTable::new(limits(), 1);
        t.apply(lock(1, &["a", "b"]), Time::ZERO);
        let first = waits(&mut t, lock(2, &["a"]));
        waits(&mut t, lock(3, &["a"]));
        waits(&mut t, lock(4, &["b"]));
        let both = waits(&mut t, lock(5, &["b", "a"]));
        assert_eq!(t.place_in_line(first), Some(0));
        assert_eq!(t.place_in_line(both), Some(2));
        // Requests ahead that leave move it up.
        t.apply(Command::Disconnect { owner: 3 }, Time::ZERO);
        assert_eq!(t.place_in_line(both), Some(1));
        assert_eq!(t.place_in_line(999), None);
    }

    #[test]
    fn a_ticket_is_waiting_then_decided_in_a_numbered_session_and_unknown_to_others() {
        let mut t = LockTable::with_sessions(limits(), 1);
        let open = |t: &mut LockTable| match t
            .apply(
                Command::OpenSession {
                    ttl: Duration::from_secs(10),
                    identity: String::new(),
                },
                Time::ZERO,
            )
            .reply
        {
            Reply::Session { id, .. } => id,
            other => panic!("OpenSession answered {other:?}"),
        };
        let (h, a) = (open(&mut t), open(&mut t));
        t.apply(lock(h, &["k"]), Time::ZERO);
        let numbered = Command::Sequenced {
            seq: 1,
            done: 0,
            cmd: Box::new(lock(a, &["k"])),
        };
        let req = waits(&mut t, numbered);
        assert_eq!(t.ticket(a, req), TicketState::Waiting);
        assert_eq!(t.ticket(h, req), TicketState::Unknown, "not h's");
        let out = t.apply(
            Command::Unlock {
                owner: h,
                keys: vec![Key::from("k")],
                fence: None,
            },
            Time::ZERO,
        );
        let fence = match out.woken.first().map(|w| &w.wake) {
            Some(WaitOutcome::Granted { fence }) => *fence,
            other => panic!("a's request should be granted: {other:?}"),
        };
        assert_eq!(
            t.ticket(a, req),
            TicketState::Decided(WaitOutcome::Granted { fence })
        );
        // An unnumbered request's outcome is not remembered.
        let unnumbered = waits(&mut t, lock(h, &["k"]));
        t.apply(Command::Disconnect { owner: a }, Time::ZERO);
        assert_eq!(t.ticket(h, unnumbered), TicketState::Unknown);
        assert_eq!(t.ticket(a, req), TicketState::Unknown, "a ended");
    }
}
