//! Lock, Enqueue and Wait: asking for keys, at once or in two steps.
//!
//! A Lock is one table command. One that waits is answered with its outcome
//! when a later command decides it (see `outcomes`). An Enqueue is the same
//! command; one that waits is answered Queued with the table's request id
//! as its ticket, and its outcome waits in the registry until the Wait. A
//! Wait on a node the session moved to (a cluster's failover) finds the
//! request in the table's queues, or its outcome in the session's memory of
//! numbered requests (`table::tickets`).
//!
//! Requests sent again: a Lock of a named session that carries a `seq` is
//! submitted as [`Command::Sequenced`], and the table answers a number it
//! applied already from the session's memory, without acting again.

use super::conn::ANSWERED_TICKETS;
use super::reply::{self, Refusal};
use super::validate::lock_args;
use super::{Answer, Conn, Service};
use crate::table::{LockResult, OwnerId, Reply, ReqId, TicketState, WaitOutcome, Woken};
use dlock_proto::proto::Request;
use std::time::Instant;

impl Service {
    pub(super) async fn lock(&self, conn: &Conn, mut req: Request) -> Result<Answer, Refusal> {
        let id = req.id;
        self.named_if_any(conn, req.session)?;
        let args = lock_args(&self.config, req.lock.take().unwrap_or_default())?;
        let owner = self.owner(conn, req.session).await?;
        let cmd = self.numbered(&req, args.into_command(owner));
        let out = self.engine.submit(cmd).await?;
        let result = match self.lock_reply(conn, id, owner, req.seq, out.reply)? {
            Ok(result) => result,
            Err(answered) => return Ok(Answer::Now(answered)),
        };
        match reply::lock_result(&self.config, id, result) {
            Ok(r) => Ok(Answer::Now(r)),
            Err(waiting) => Ok(Answer::Outcome {
                owner,
                req: waiting,
            }),
        }
    }

    /// Enqueue: a Lock that answers at once. Granted at once, it is
    /// answered as a Lock; queued, it is answered Queued with its ticket
    /// and place in line, and noted as this connection's ticket.
    pub(super) async fn enqueue(&self, conn: &Conn, mut req: Request) -> Result<Answer, Refusal> {
        let id = req.id;
        self.named_if_any(conn, req.session)?;
        let args = lock_args(&self.config, req.lock.take().unwrap_or_default())?;
        let owner = self.owner(conn, req.session).await?;
        if conn.state().tickets.len() >= self.config.max_pipeline {
            return Err(reply::too_many_tickets(self.config.max_pipeline));
        }
        let cmd = self.numbered(&req, args.into_command(owner));
        let out = self.engine.submit(cmd).await?;
        let result = match out.reply {
            Reply::Lock(LockResult::Waiting(ticket)) => {
                conn.state().tickets.insert((owner, ticket));
                // Read after the apply: the place now, which the requests
                // decided meanwhile may have moved up.
                let place = self
                    .engine
                    .read(|table, _| table.place_in_line(ticket))
                    .unwrap_or(0);
                return Ok(Answer::Now(reply::queued(id, ticket, place)));
            }
            other => match self.lock_reply(conn, id, owner, req.seq, other)? {
                Ok(result) => result,
                Err(answered) => return Ok(Answer::Now(answered)),
            },
        };
        match reply::lock_result(&self.config, id, result) {
            Ok(r) => Ok(Answer::Now(r)),
            // Handled above; the table answers a Lock that waits only so.
            Err(ticket) => Ok(Answer::Now(reply::queued(id, ticket, 0))),
        }
    }

    /// Wait: the outcome of queued Enqueue `ticket` of the session. Found,
    /// in this order, where it may be: an outcome applied here and kept for
    /// the session; the table's queues (still waiting: wait for it); the
    /// session's memory of numbered requests (decided before a failover
    /// moved the session here).
    pub(super) async fn wait(&self, conn: &Conn, req: Request) -> Result<Answer, Refusal> {
        let id = req.id;
        let ticket = req.lock.as_ref().map_or(0, |b| b.ticket);
        let owner = match req.session {
            0 => conn.state().implicit,
            s => Some(self.named(conn, s)?),
        };
        let Some(owner) = owner else {
            return Err(reply::unknown_ticket(ticket));
        };
        {
            let mut st = conn.state();
            if ticket == 0 || st.waited.contains(&(owner, ticket)) {
                return Err(reply::unknown_ticket(ticket));
            }
            st.tickets.remove(&(owner, ticket));
            if st.waited.len() >= ANSWERED_TICKETS {
                st.waited.pop_front();
            }
            st.waited.push_back((owner, ticket));
        }
        let since = Instant::now();
        if let Some(w) = self.outcomes.take_early(owner, ticket) {
            return Ok(Answer::Now(reply::woken(id, w, since)));
        }
        self.engine.read_index().await?;
        match self.engine.read(|table, _| table.ticket(owner, ticket)) {
            TicketState::Waiting => Ok(Answer::Outcome { owner, req: ticket }),
            TicketState::Decided(outcome) => {
                Ok(Answer::Now(self.ended_wait(id, owner, ticket, outcome)))
            }
            // Applied here between the first look and the read?
            TicketState::Unknown => match self.outcomes.take_early(owner, ticket) {
                Some(w) => Ok(Answer::Now(reply::woken(id, w, since))),
                None => Err(reply::unknown_ticket(ticket)),
            },
        }
    }

    /// What the table answered a Lock (or an Enqueue) submitted for
    /// `owner`: its result, or the answer already due to a numbered request
    /// sent again whose wait had ended (`Err`).
    fn lock_reply(
        &self,
        conn: &Conn,
        id: u64,
        owner: OwnerId,
        seq: u64,
        reply: Reply,
    ) -> Result<Result<LockResult, dlock_proto::proto::Response>, Refusal> {
        match reply {
            Reply::Lock(result) => Ok(Ok(result)),
            Reply::Waited { req, outcome } => Ok(Err(self.ended_wait(id, owner, req, outcome))),
            other => Err(self.unexpected(conn, owner, seq, other)),
        }
    }

    /// The answer to a request whose wait had ended before it was asked
    /// (a Lock sent again, a Wait after a failover): as its outcome was. An
    /// outcome applied here meanwhile waits in an early slot nobody will
    /// take: it is dropped.
    fn ended_wait(
        &self,
        id: u64,
        owner: OwnerId,
        req: ReqId,
        outcome: WaitOutcome,
    ) -> dlock_proto::proto::Response {
        self.outcomes.discard(owner, req);
        let w = Woken {
            req,
            owner,
            keys: Vec::new(),
            wake: outcome,
        };
        reply::woken(id, w, Instant::now())
    }

    /// Waits for the outcome of `req`, a waiting request of `owner`, on the
    /// raft engine. A node that stopped leading learns no more outcomes (a
    /// snapshot from the new leader skips the sink): it answers rather
    /// than wait forever; the wait stays the session's.
    pub(super) async fn await_outcome(&self, owner: OwnerId, req: ReqId) -> Result<Woken, Refusal> {
        let Some(rx) = self.outcomes.register(owner, req) else {
            return Err(reply::unknown_session(owner));
        };
        tokio::select! {
            r = rx => {
                // Detached: the session ended, or its connection went
                // (then nobody reads this answer).
                r.map_err(|_| reply::ended_while_waiting())
            }
            refusal = self.deposed() => Err(refusal),
        }
    }

    /// The refusal of a command the table answered unexpectedly: a session
    /// that ended (its TTL ran out), or a numbered request that is not the
    /// one first sent under its number.
    pub(super) fn unexpected(
        &self,
        conn: &Conn,
        owner: OwnerId,
        seq: u64,
        reply: Reply,
    ) -> Refusal {
        match reply {
            Reply::UnknownSession => {
                self.forget(conn, owner);
                reply::unknown_session(owner)
            }
            Reply::Forgotten => reply::forgotten(seq),
            Reply::NotHeld(_) | Reply::Lock(_) | Reply::Waited { .. } => reply::not_the_same(seq),
            other => reply::unexpected_reply(&other),
        }
    }
}
