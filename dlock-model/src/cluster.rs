//! The server side: a few nodes over one linearizable log.
//!
//! Raft is abstracted to what a client can observe of it. The log is one
//! [`Table`], changed by one command at a time; a node whose belief that it
//! leads is current commits into it and answers; a node that leads no term
//! answers NotLeader; a deposed leader that has not yet learned it (a
//! paused node, a partitioned one) cannot commit, and answers Unavailable.
//! Answers already written before a node was deposed are in flight and
//! reach the client later: every interleaving of those is explored. A
//! paused node is one whose deliveries the checker does not schedule while
//! time passes, which every interleaving also covers.
//!
//! What a node keeps of its connections, and what it does when one ends,
//! is in [`crate::sessions`].

use dlock::proto::ResponseStatus;
use dlock_server::table::{
    Command, LockResult, OwnerId, Reply, ReqId, Sharing, TicketState, Time, WaitLimit, WaitOutcome,
};

use std::time::Duration;

use crate::config::{Bug, Config};
use crate::network::{Answer, Conn, Ended, Kind, Parked, Request};
use crate::sessions::{self, Attached};
use crate::table::{Table, KEY};

/// The cluster's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cluster {
    /// The current term.
    pub term: u8,
    /// For each node, the term it believes it leads, if any.
    pub leads: Vec<Option<u8>>,
    /// Elections held so far.
    pub elections: u8,
    /// The replicated lock table.
    pub table: Table,
    /// The highest fence granted so far (0: none).
    pub last_fence: u64,
    /// Whether a grant ever came with a fence not above every earlier one.
    pub fence_fell: bool,
    /// The numbered Locks granted, as (client, seq, fence): the answers a
    /// Lock sent again may rightly repeat.
    pub granted: Vec<(u8, u8, u64)>,
    /// The fences of the grants committed: in the log of a majority.
    pub committed_grants: Vec<u64>,
    /// Whether a client was ever told of a grant not in the log of a
    /// majority.
    pub forgotten: bool,
    /// The bug the nodes carry, if any.
    pub bug: Option<Bug>,
    /// The sessions' TTL, for the implicit sessions nodes open.
    pub ttl: Duration,
    /// Which connection each node last attached each session to.
    pub attached: Attached,
    /// Whether a leading node ever saw a connection end and its implicit
    /// session still held the key after.
    pub orphan_held: bool,
    /// Waiting requests the last step's commands decided, in order: the
    /// node holding each one's connection answers it (`SessionModel`
    /// delivers them at the end of the step, so a state never keeps any).
    pub woken: Vec<Wake>,
    /// Sessions the last step's commands ended (a TTL, a Disconnect): a
    /// request of theirs waiting at a node is answered `UnknownSession`
    /// (`ended_while_waiting`). Emptied at the end of the step.
    pub ended: Vec<OwnerId>,
    /// The fences of the grants made to requests that had waited in line.
    pub waited_grants: Vec<u64>,
}

/// A waiting request the table decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wake {
    /// Whose.
    pub owner: OwnerId,
    /// Which.
    pub ticket: ReqId,
    /// Its answer: `Ok` with the fence, `AcquireTimeout`, `LimitReached`.
    pub status: ResponseStatus,
    /// The fence of a grant.
    pub fence: Option<u64>,
}

/// The answer a waiting request's `outcome` gives (`reply::woken`).
pub fn outcome_answer(outcome: &WaitOutcome) -> (ResponseStatus, Option<u64>) {
    match outcome {
        WaitOutcome::Granted { fence } => (ResponseStatus::Ok, Some(*fence)),
        WaitOutcome::TimedOut(_) => (ResponseStatus::AcquireTimeout, None),
        WaitOutcome::LimitReached => (ResponseStatus::LimitReached, None),
    }
}

/// What a node is, as far as answering goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It leads the current term: it commits and answers.
    Leader,
    /// It led an earlier term and has not learned it was deposed.
    Deposed,
    /// It leads nothing.
    Follower,
}

impl Cluster {
    /// `nodes` nodes, node 0 leading term 1, over `table`, whose sessions
    /// last `ttl`.
    pub fn new(nodes: u8, table: Table, ttl: Duration) -> Cluster {
        let mut leads = vec![None; usize::from(nodes)];
        if let Some(first) = leads.first_mut() {
            *first = Some(1);
        }
        Cluster {
            term: 1,
            leads,
            elections: 0,
            table,
            last_fence: 0,
            fence_fell: false,
            granted: Vec::new(),
            committed_grants: Vec::new(),
            forgotten: false,
            bug: None,
            ttl,
            attached: Attached::default(),
            orphan_held: false,
            woken: Vec::new(),
            ended: Vec::new(),
            waited_grants: Vec::new(),
        }
    }

    /// Whether `client` believes it holds a grant made to a request that
    /// had waited in line.
    pub fn holds_waited(&self, client: &crate::client::Client) -> bool {
        client
            .held
            .is_some_and(|h| self.waited_grants.contains(&h.fence))
    }

    /// The role of `node`.
    pub fn role(&self, node: u8) -> Role {
        match self.leads.get(usize::from(node)).copied().flatten() {
            Some(t) if t == self.term => Role::Leader,
            Some(_) => Role::Deposed,
            None => Role::Follower,
        }
    }

    /// `node` wins an election for the next term. The old leader keeps
    /// believing it leads until it learns otherwise ([`Cluster::learn`]).
    pub fn elect(&mut self, node: u8) {
        self.term += 1;
        self.elections += 1;
        if let Some(l) = self.leads.get_mut(usize::from(node)) {
            *l = Some(self.term);
        }
    }

    /// A client read that it was granted `fence`: it must be in the log of
    /// a majority, or a later leader may grant the key again.
    pub fn acknowledged(&mut self, fence: u64) {
        self.forgotten |= !self.committed_grants.contains(&fence);
    }

    /// The leader `conn` goes to reads `req` on it and applies it, but
    /// loses its leadership before it knows that a majority has it; the
    /// next node wins the election. With `kept` the new leader's log has
    /// the command, which takes effect; without, it is lost with the old
    /// leader. Either way the answer says nothing was done for sure
    /// (`Unavailable`: the client sends it again, under its number); with
    /// [`Bug::AnswerBeforeCommit`] a lost command is answered as applied.
    pub fn answer_uncommitted(
        &mut self,
        client: u8,
        session: Option<OwnerId>,
        conn: &mut Conn,
        req: Request,
        now: Time,
        kept: bool,
    ) -> Answer {
        let node = conn.node;
        let unsure = Answer::bare(req, ResponseStatus::Unavailable);
        let applied = if kept {
            self.answer(node, client, session, conn, req, now);
            // Answered Unavailable, not waited for at this node.
            conn.parked = None;
            unsure
        } else {
            let mut lost = self.clone();
            let answer = lost.answer(node, client, session, &mut conn.clone(), req, now);
            match answer {
                Some(answer) if self.bug == Some(Bug::AnswerBeforeCommit) => answer,
                _ => unsure,
            }
        };
        self.elect((node + 1) % u8::try_from(self.leads.len()).unwrap_or(1).max(1));
        applied
    }

    /// A deposed `node` learns of the newer term.
    pub fn learn(&mut self, node: u8) {
        if let Some(l) = self.leads.get_mut(usize::from(node)) {
            *l = None;
        }
    }

    /// Applies `cmd` to the table at server time `now`, after an Advance
    /// (expiry runs only on Advance, and the real server advances on its
    /// own timer, so the model advances before every command: nothing that
    /// fell due waits for the next one).
    pub fn commit(&mut self, cmd: Command, now: Time) -> Reply {
        let mut table = self.table.read();
        let advanced = table.apply(Command::Advance, now);
        self.decided(&advanced, None);
        let disconnected = match cmd {
            Command::Disconnect { owner } => Some(owner),
            _ => None,
        };
        let out = table.apply(cmd, now);
        self.decided(&out, disconnected);
        self.table = Table::write(&table);
        out.reply
    }

    /// The leader advances the table to `now` on its own timer: leases,
    /// wait limits and sessions' TTLs due by then expire.
    pub fn advance(&mut self, now: Time) {
        let mut table = self.table.read();
        let out = table.apply(Command::Advance, now);
        self.decided(&out, None);
        self.table = Table::write(&table);
    }

    /// Notes what `out` decided for waiting requests: their answers, and
    /// the grants among them, which are new (fences must rise).
    fn decided(&mut self, out: &dlock_server::table::Output, disconnected: Option<OwnerId>) {
        for w in &out.woken {
            let (status, fence) = outcome_answer(&w.wake);
            if let Some(fence) = fence {
                self.fence_fell |= fence <= self.last_fence;
                self.last_fence = self.last_fence.max(fence);
                self.committed_grants.push(fence);
                self.waited_grants.push(fence);
            }
            self.woken.push(Wake {
                owner: w.owner,
                ticket: w.req,
                status,
                fence,
            });
        }
        self.ended.extend(out.ended_sessions.iter().copied());
        self.ended.extend(disconnected);
    }

    /// `node` reads `req` on `conn`, of `client` and its named `session`
    /// (`None`: the connection's implicit session, opened now if need
    /// be), at server time `now`, and writes its answer; or, for a request
    /// that waits in the table's queue, parks it on `conn` (`None`), to be
    /// answered when the table decides it.
    pub fn answer(
        &mut self,
        node: u8,
        client: u8,
        session: Option<OwnerId>,
        conn: &mut Conn,
        req: Request,
        now: Time,
    ) -> Option<Answer> {
        let refused = |status| Some(Answer::bare(req, status));
        match self.role(node) {
            Role::Follower => return refused(ResponseStatus::NotLeader),
            Role::Deposed => return refused(ResponseStatus::Unavailable),
            Role::Leader => {}
        }
        if let Kind::Wait(ticket) = req.kind {
            return self.wait(session.or(conn.implicit), conn, req, ticket);
        }
        let owner = match (session, conn.implicit) {
            (Some(s), _) | (None, Some(s)) => s,
            (None, None) => match self.commit(
                Command::OpenSession {
                    ttl: self.ttl,
                    identity: String::new(),
                },
                now,
            ) {
                Reply::Session { id, .. } => {
                    conn.implicit = Some(id);
                    self.attached.attach(node, id, (client, conn.id));
                    id
                }
                other => panic!("a table with sessions answered OpenSession with {other:?}"),
            },
        };
        let keys = vec![KEY.into()];
        let lock = |wait, lease| Command::Lock {
            owner,
            keys: vec![KEY.into()],
            sharing: Sharing::exclusive(),
            wait,
            lease,
            value: Vec::new(),
        };
        let cmd = match req.kind {
            Kind::Lock(lease) => lock(WaitLimit::No, lease),
            Kind::LockWaiting(wait) | Kind::Enqueue(wait) => lock(WaitLimit::For(wait), None),
            // Answered above: a Wait reads the table, it commits nothing.
            Kind::Wait(_) => return refused(ResponseStatus::InvalidArgument),
            Kind::Renew(lease) => Command::Renew {
                owner,
                keys,
                fence: None,
                lease,
            },
            Kind::Ping => Command::KeepAlive { owner },
            Kind::Unlock => Command::Unlock {
                owner,
                keys,
                fence: None,
            },
            Kind::Resume => Command::Resume {
                owner,
                identity: String::new(),
            },
        };
        // Numbered as the service numbers (`Service::numbered`): a
        // request of a named session with a `seq`.
        let cmd = if session.is_some() && req.seq != 0 {
            Command::Sequenced {
                seq: u64::from(req.seq),
                done: u64::from(req.done),
                cmd: Box::new(cmd),
            }
        } else {
            cmd
        };
        let reply = self.commit(cmd, now);
        if req.kind == Kind::Resume && matches!(reply, Reply::Session { .. }) {
            self.attached.attach(node, owner, (client, conn.id));
        }
        let (status, fence) = match reply {
            Reply::Lock(LockResult::Waiting(ticket)) => {
                if let Kind::Enqueue(_) = req.kind {
                    return Some(Answer {
                        ticket: Some(ticket),
                        ..Answer::bare(req, ResponseStatus::Queued)
                    });
                }
                conn.parked = Some(Parked { req, owner, ticket });
                return None;
            }
            // A waiting Lock (or Enqueue) sent again, its wait decided:
            // answered as its outcome was, no new grant.
            Reply::Waited { outcome, .. } => {
                let (status, fence) = outcome_answer(&outcome);
                return Some(Answer {
                    fence,
                    ..Answer::bare(req, status)
                });
            }
            Reply::Lock(LockResult::Granted { fence }) => (ResponseStatus::Ok, Some(fence)),
            Reply::Lock(LockResult::Busy(_)) => (ResponseStatus::AcquireTimeout, None),
            Reply::NotHeld(keys) if keys.is_empty() => (ResponseStatus::Ok, None),
            Reply::NotHeld(_) => (ResponseStatus::NotHeld, None),
            Reply::Session { .. } => (ResponseStatus::Ok, None),
            Reply::UnknownSession => (ResponseStatus::UnknownSession, None),
            // A number the session applied and no longer remembers (only a
            // copy read late on an ended connection, after the client said
            // it has the answer): the service refuses it naming the `seq`.
            Reply::Forgotten => (ResponseStatus::InvalidArgument, None),
            // Nothing else answers these commands on a table with
            // sessions and room to spare, whose sessions remember every
            // answer the model's few requests get.
            other => panic!("the table answered {:?} with {other:?}", req.kind),
        };
        if let Some(fence) = fence {
            // A Lock sent again is answered as the first time, with its
            // first fence: only a new grant must rise.
            let again = (client, req.seq, fence);
            if req.seq == 0 || !self.granted.contains(&again) {
                self.fence_fell |= fence <= self.last_fence;
                self.last_fence = self.last_fence.max(fence);
                self.committed_grants.push(fence);
                if req.seq != 0 {
                    self.granted.push(again);
                }
            }
        }
        Some(Answer {
            fence,
            ..Answer::bare(req, status)
        })
    }

    /// A Wait for `ticket` of `owner`, read on `conn` by the leader: the
    /// outcome the session remembers, or, while the request still waits in
    /// line, parked until it is decided; a ticket the session does not
    /// hold is `UnknownTicket` (`Service::wait`; the node's slot of an
    /// outcome applied before the Wait came is that outcome, which the
    /// session's memory of its numbered Enqueue holds as well).
    fn wait(
        &mut self,
        owner: Option<OwnerId>,
        conn: &mut Conn,
        req: Request,
        ticket: ReqId,
    ) -> Option<Answer> {
        let unknown = Some(Answer::bare(req, ResponseStatus::UnknownTicket));
        let Some(owner) = owner else {
            return unknown;
        };
        match self.table.ticket(owner, ticket) {
            TicketState::Waiting => {
                conn.parked = Some(Parked { req, owner, ticket });
                None
            }
            TicketState::Decided(outcome) => {
                let (status, fence) = outcome_answer(&outcome);
                Some(Answer {
                    fence,
                    ..Answer::bare(req, status)
                })
            }
            TicketState::Unknown => unknown,
        }
    }

    /// The node of `end` reads that `client`'s connection ended, at server
    /// time `now`, and ends the sessions the rules say end with it
    /// ([`sessions::ending`]); a node that does not lead cannot commit
    /// that, and they live out their TTL.
    pub fn connection_ended(&mut self, client: u8, end: &Ended, now: Time, cfg: &Config) {
        let attached = self.attached.detach_all(end.node, (client, end.conn));
        if self.role(end.node) != Role::Leader {
            return;
        }
        for owner in sessions::ending(end, attached, cfg) {
            self.commit(Command::Disconnect { owner }, now);
        }
        // An implicit session's locks are its connection's, as on a single
        // server: once a leader has seen the connection end they are free.
        if let Some(s) = end.implicit {
            let holder = self.table.holder(now);
            self.orphan_held |= holder.is_some_and(|(owner, _)| owner == s);
        }
    }
}
