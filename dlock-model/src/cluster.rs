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

use dlock::proto::ResponseStatus;
use dlock_server::table::{Command, LockResult, OwnerId, Reply, Sharing, Time, WaitLimit};

use crate::network::{Answer, Kind, Request};
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
    /// `nodes` nodes, node 0 leading term 1, over `table`.
    pub fn new(nodes: u8, table: Table) -> Cluster {
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
        }
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

    /// A deposed `node` learns of the newer term.
    pub fn learn(&mut self, node: u8) {
        if let Some(l) = self.leads.get_mut(usize::from(node)) {
            *l = None;
        }
    }

    /// `node` reads `req` of session `owner` at server time `now` and
    /// writes its answer. The leader first commits an Advance (expiry runs
    /// only on Advance, and the real server advances on its own timer, so
    /// the model advances before every command: nothing that fell due
    /// waits for the next one).
    pub fn answer(&mut self, node: u8, owner: OwnerId, req: Request, now: Time) -> Answer {
        let refused = |status| Answer {
            to: req,
            status,
            fence: None,
        };
        match self.role(node) {
            Role::Follower => return refused(ResponseStatus::NotLeader),
            Role::Deposed => return refused(ResponseStatus::Unavailable),
            Role::Leader => {}
        }
        let keys = vec![KEY.into()];
        let cmd = match req.kind {
            Kind::Lock(lease) => Command::Lock {
                owner,
                keys,
                sharing: Sharing::exclusive(),
                wait: WaitLimit::No,
                lease,
                value: Vec::new(),
            },
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
        };
        let mut table = self.table.read();
        table.apply(Command::Advance, now);
        let out = table.apply(cmd, now);
        self.table = Table::write(&table);
        let (status, fence) = match out.reply {
            Reply::Lock(LockResult::Granted { fence }) => (ResponseStatus::Ok, Some(fence)),
            Reply::Lock(LockResult::Busy(_)) => (ResponseStatus::AcquireTimeout, None),
            Reply::NotHeld(keys) if keys.is_empty() => (ResponseStatus::Ok, None),
            Reply::NotHeld(_) => (ResponseStatus::NotHeld, None),
            Reply::Session { .. } => (ResponseStatus::Ok, None),
            Reply::UnknownSession => (ResponseStatus::UnknownSession, None),
            // Nothing else answers these four commands on a table with
            // sessions and room to spare.
            other => panic!("the table answered {:?} with {other:?}", req.kind),
        };
        if let Some(fence) = fence {
            self.fence_fell |= fence <= self.last_fence;
            self.last_fence = self.last_fence.max(fence);
        }
        Answer {
            to: req,
            status,
            fence,
        }
    }
}
