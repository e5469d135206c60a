//! Raft's replication with a log per node: the model that justifies the
//! session model's one log.
//!
//! The session model ([`crate::cluster`]) keeps one log and calls a
//! command committed once "a majority has it"; that an acknowledged grant
//! then stays in the log of a majority, and in every later leader's, holds
//! there by construction. This model checks it against the rules that make
//! it true in Raft (and in openraft, which dlock runs): each node has its
//! own log of entries stamped with the term that wrote them, and
//! - a node stands for election in a term above its own and votes for
//!   itself; a voter grants at most one vote per term, and only to a
//!   candidate whose log is at least as up to date as its own (last entry's
//!   term higher, or the same term and at least as long); a majority of
//!   votes makes a leader, which appends a blank entry of its term (as
//!   openraft does);
//! - a leader appends a client's Lock to its own log, and copies a prefix
//!   of its log to a follower (AppendEntries, abstracted: sent from the
//!   log's start, so it always matches; the follower truncates its log at
//!   the first entry whose term differs and takes the leader's from there,
//!   keeping a longer suffix that does not conflict), which learns the
//!   leader's term; a node of a higher term refuses, and the leader learns
//!   that term and steps down;
//! - a leader commits the longest prefix a majority holds whose last entry
//!   is of its own term (entries of earlier terms only under one of its
//!   own), and answers each client whose Lock the prefix commits with what
//!   the real lock table (`dlock_server::table`) replies to the log's
//!   commands applied in order.
//!
//! A message and its answer are one step (a vote asked and given, a prefix
//! copied and acknowledged): a lost or late message is one whose step the
//! checker never takes, or takes later; a leader deposed and not yet told
//! goes on acting in its term. A re-introduced [`Bug`] drops one rule.

use dlock_server::table::{Command, LockResult, OwnerId, Reply, Sharing, Time, WaitLimit};
use stateright::{Model, Property};
use std::time::Duration;

use crate::config::Bug;
use crate::table::{Table, KEY};

/// The name of the property the replication bugs break: every grant a
/// client was told of is in the log of a majority of nodes.
pub const MAJORITY_KEEPS: &str = "an acknowledged grant is in the log of a majority";
/// The name of the leader-completeness property.
pub const LEADERS_KEEP: &str =
    "every leader of the grant's term or later has an acknowledged grant";
/// The name of the property a forgotten grant leads to.
pub const ONE_GRANTEE: &str = "at most one client is told it was granted the key";
/// The name of the log-matching property over committed prefixes.
pub const COMMITTED_AGREE: &str = "committed prefixes of the nodes' logs agree";
/// The name of the property that makes a model without answers fail.
pub const ACKNOWLEDGED: &str = "a client is told it was granted the key";
/// The name of the property that shows an election after a grant.
pub const LATER_LEADER: &str = "a leader of a later term holds an acknowledged grant";

/// What one run of the replication model explores.
#[derive(Debug, Clone)]
pub struct Replication {
    /// Nodes (2 to 5); node 0 leads term 1, every log empty.
    pub nodes: u8,
    /// The highest term a node may stand in: elections are bounded by
    /// this, not counted, so a term two nodes stand in counts once.
    pub max_term: u8,
    /// Clients, each sending one Lock of the key, with no lease and no
    /// wait.
    pub clients: u8,
    /// How many leaders may append one client's Lock (a client whose
    /// leader was deposed sends it again to the next).
    pub appends: u8,
    /// The bug the nodes carry, if any.
    pub bug: Option<Bug>,
}

impl Replication {
    /// The configuration CI checks: three nodes, terms up to 4 (three
    /// elections after the first term's), two clients, each Lock appended
    /// by at most one leader.
    pub fn ci() -> Replication {
        Replication {
            nodes: 3,
            max_term: 4,
            clients: 2,
            appends: 1,
            bug: None,
        }
    }

    /// The same with `bug` swapped in.
    pub fn with_bug(self, bug: Bug) -> Replication {
        Replication {
            bug: Some(bug),
            ..self
        }
    }

    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    fn majority(&self) -> usize {
        usize::from(self.nodes) / 2 + 1
    }
}

/// What an entry of the log carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Payload {
    /// The entry a new leader appends at the start of its term.
    Blank,
    /// A client's Lock of the key.
    Lock(u8),
}

/// One entry of a node's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The term of the leader that appended it.
    pub term: u8,
    /// What it carries.
    pub payload: Payload,
}

/// Where a node stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// It follows (or waits to hear of) a leader.
    Follower,
    /// It stands for election in its term.
    Candidate {
        /// The nodes that answered it, one bit each.
        asked: u8,
        /// The nodes that voted for it, one bit each.
        votes: u8,
    },
    /// It leads its term; `matched` is, per node, how much of its log that
    /// node is known to hold (its own: all of it).
    Leader {
        /// Per node, the length of the leader's log it holds.
        matched: Vec<u8>,
    },
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// Its current term.
    pub term: u8,
    /// Whom it voted for in its term.
    pub voted: Option<u8>,
    /// Its log.
    pub log: Vec<Entry>,
    /// How much of its log it knows committed.
    pub commit: u8,
    /// Where it stands.
    pub role: Role,
}

impl Node {
    /// (last entry's term, length): what "up to date" compares.
    fn last(&self) -> (u8, usize) {
        (self.log.last().map_or(0, |e| e.term), self.log.len())
    }

    /// Moves to the higher `term`, with no vote in it yet, as a follower.
    fn adopt(&mut self, term: u8) {
        if term > self.term {
            self.term = term;
            self.voted = None;
            self.role = Role::Follower;
        }
    }

    /// Whether it holds `entry` at `index` (counting from 1).
    fn holds(&self, index: u8, entry: Entry) -> bool {
        self.log.get(usize::from(index) - 1) == Some(&entry)
    }
}

/// A client told it was granted the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ack {
    /// Which client.
    pub client: u8,
    /// Where its Lock is in the log (from 1).
    pub index: u8,
    /// The entry.
    pub entry: Entry,
    /// The term of the leader that committed and answered it.
    pub by_term: u8,
    /// The fence it was told.
    pub fence: u64,
}

/// Everything the checker explores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// Per client, how many leaders appended its Lock.
    pub appended: Vec<u8>,
    /// Per client, whether it was answered.
    pub answered: Vec<bool>,
    /// The grants clients were told of.
    pub acks: Vec<Ack>,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `node` times out and stands for election in its next term.
    Stand {
        /// Who.
        node: u8,
    },
    /// `voter` is asked for its vote by `candidate` and answers.
    Vote {
        /// Who is asked.
        voter: u8,
        /// Who asks.
        candidate: u8,
    },
    /// Leader `node` appends `client`'s Lock.
    Append {
        /// The leader.
        node: u8,
        /// Whose Lock.
        client: u8,
    },
    /// Leader `leader` copies its log up to `len` entries to `follower`,
    /// which answers.
    Copy {
        /// From.
        leader: u8,
        /// To.
        follower: u8,
        /// How many entries of the leader's log.
        len: u8,
    },
}

/// The replication model under one [`Replication`] configuration.
#[derive(Debug, Clone)]
pub struct ReplicationModel {
    /// What it explores.
    pub cfg: Replication,
    /// The empty table with a session per client, and their ids.
    table: Table,
    sessions: Vec<OwnerId>,
}

impl ReplicationModel {
    /// The model of `cfg`.
    pub fn new(cfg: Replication) -> ReplicationModel {
        let (table, sessions) = Table::with_sessions(usize::from(cfg.clients), TTL);
        ReplicationModel {
            cfg,
            table,
            sessions,
        }
    }

    /// Whether a voter whose log is `voter` may vote for a candidate whose
    /// log is `candidate`: the candidate's is at least as up to date.
    fn up_to_date(&self, candidate: &Node, voter: &Node) -> bool {
        self.cfg.has(Bug::VoteWithoutUpToDate) || candidate.last() >= voter.last()
    }

    /// The fence the table grants the Lock at `index` (from 1) of `log`,
    /// its commands applied in order; `None` if it is not granted.
    fn fence(&self, log: &[Entry], index: u8) -> Option<u64> {
        let mut table = self.table.read();
        let mut reply = None;
        for entry in log.iter().take(usize::from(index)) {
            let Payload::Lock(client) = entry.payload else {
                continue;
            };
            let owner = *self.sessions.get(usize::from(client))?;
            let lock = Command::Lock {
                owner,
                keys: vec![KEY.into()],
                sharing: Sharing::exclusive(),
                wait: WaitLimit::No,
                lease: None,
                value: Vec::new(),
            };
            reply = Some(table.apply(lock, Time::ZERO).reply);
        }
        match reply? {
            Reply::Lock(LockResult::Granted { fence }) => Some(fence),
            _ => None,
        }
    }

    /// Leader `id` commits what a majority holds, the last entry of its
    /// own term (with [`Bug::CommitEarlierTermByCount`], of any term), and
    /// answers the clients whose Locks that commits.
    fn advance(&self, s: &mut State, id: u8) {
        let Some(node) = s.nodes.get(usize::from(id)) else {
            return;
        };
        let Role::Leader { matched } = &node.role else {
            return;
        };
        let mut commit = node.commit;
        for len in (node.commit + 1)..=u8::try_from(node.log.len()).unwrap_or(u8::MAX) {
            let holders = matched.iter().filter(|&&m| m >= len).count();
            let ours = node.log.get(usize::from(len) - 1).map(|e| e.term) == Some(node.term);
            if holders >= self.cfg.majority()
                && (ours || self.cfg.has(Bug::CommitEarlierTermByCount))
            {
                commit = len;
            }
        }
        let (term, log, from) = (node.term, node.log.clone(), node.commit);
        if let Some(n) = s.nodes.get_mut(usize::from(id)) {
            n.commit = commit;
        }
        for index in (from + 1)..=commit {
            let Some(&entry) = log.get(usize::from(index) - 1) else {
                continue;
            };
            let Payload::Lock(client) = entry.payload else {
                continue;
            };
            let Some(answered) = s.answered.get_mut(usize::from(client)) else {
                continue;
            };
            if *answered {
                continue;
            }
            *answered = true;
            if let Some(fence) = self.fence(&log, index) {
                s.acks.push(Ack {
                    client,
                    index,
                    entry,
                    by_term: term,
                    fence,
                });
            }
        }
    }

    /// Candidate `node` won its term's election: it leads, and appends a
    /// blank entry of its term, through which it commits what earlier
    /// terms left.
    fn win(&self, n: &mut Node, node: u8) {
        let term = n.term;
        n.log.push(Entry {
            term,
            payload: Payload::Blank,
        });
        let mut matched = vec![0; usize::from(self.cfg.nodes)];
        if let Some(m) = matched.get_mut(usize::from(node)) {
            *m = u8::try_from(n.log.len()).unwrap_or(u8::MAX);
        }
        n.role = Role::Leader { matched };
    }

    /// How many nodes hold `ack`'s entry at its index.
    pub fn holders(s: &State, ack: &Ack) -> usize {
        s.nodes
            .iter()
            .filter(|n| n.holds(ack.index, ack.entry))
            .count()
    }
}

/// The sessions' TTL: nothing in this model expires, so any will do.
const TTL: Duration = Duration::from_secs(4);

impl Model for ReplicationModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.cfg.nodes;
        let nodes = (0..n)
            .map(|id| Node {
                term: 1,
                voted: Some(0),
                log: Vec::new(),
                commit: 0,
                role: if id == 0 {
                    Role::Leader {
                        matched: vec![0; usize::from(n)],
                    }
                } else {
                    Role::Follower
                },
            })
            .collect();
        let clients = usize::from(self.cfg.clients);
        vec![State {
            nodes,
            appended: vec![0; clients],
            answered: vec![false; clients],
            acks: Vec::new(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (id, node) in (0u8..).zip(&s.nodes) {
            match &node.role {
                Role::Leader { matched } => {
                    for (client, &n) in (0u8..).zip(&s.appended) {
                        let answered = s.answered.get(usize::from(client)) == Some(&true);
                        if n < self.cfg.appends && !answered {
                            actions.push(Action::Append { node: id, client });
                        }
                    }
                    let len = u8::try_from(node.log.len()).unwrap_or(u8::MAX);
                    for (follower, f) in (0u8..).zip(&s.nodes).filter(|&(f, _)| f != id) {
                        // A node of a later term refuses whatever is copied;
                        // one of this term or earlier already holds the
                        // prefix the leader knows it matched (only this
                        // leader wrote to it since), so only longer ones
                        // change anything.
                        let lens = if f.term > node.term {
                            len..=len
                        } else {
                            let from = matched.get(usize::from(follower)).map_or(0, |&m| m);
                            (from + 1)..=len
                        };
                        for len in lens {
                            actions.push(Action::Copy {
                                leader: id,
                                follower,
                                len,
                            });
                        }
                    }
                }
                Role::Candidate { asked, .. } => {
                    for voter in (0..self.cfg.nodes).filter(|&v| asked & (1 << v) == 0) {
                        actions.push(Action::Vote {
                            voter,
                            candidate: id,
                        });
                    }
                }
                Role::Follower => {}
            }
            if node.term < self.cfg.max_term && !matches!(node.role, Role::Leader { .. }) {
                actions.push(Action::Stand { node: id });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Stand { node } => {
                let n = s.nodes.get_mut(usize::from(node))?;
                n.term += 1;
                n.voted = Some(node);
                n.role = Role::Candidate {
                    asked: 1 << node,
                    votes: 1 << node,
                };
            }
            Action::Vote { voter, candidate } => {
                let c = s.nodes.get(usize::from(candidate))?.clone();
                let v = s.nodes.get_mut(usize::from(voter))?;
                if v.term > c.term {
                    // The candidate learns it is behind.
                    let term = v.term;
                    s.nodes.get_mut(usize::from(candidate))?.adopt(term);
                    return Some(s);
                }
                v.adopt(c.term);
                let granted = v.voted.is_none_or(|w| w == candidate) && self.up_to_date(&c, v);
                if granted {
                    v.voted = Some(candidate);
                }
                let c = s.nodes.get_mut(usize::from(candidate))?;
                if let Role::Candidate { asked, votes } = &mut c.role {
                    // A refusal is final for this term: a later ask is
                    // answered the same way, so the candidate asks no more.
                    *asked |= 1 << voter;
                    if granted {
                        *votes |= 1 << voter;
                    }
                    if votes.count_ones() as usize >= self.cfg.majority() {
                        self.win(c, candidate);
                    }
                }
            }
            Action::Append { node, client } => {
                let n = s.nodes.get_mut(usize::from(node))?;
                let term = n.term;
                n.log.push(Entry {
                    term,
                    payload: Payload::Lock(client),
                });
                let len = u8::try_from(n.log.len()).ok()?;
                if let Role::Leader { matched } = &mut n.role {
                    *matched.get_mut(usize::from(node))? = len;
                }
                *s.appended.get_mut(usize::from(client))? += 1;
            }
            Action::Copy {
                leader,
                follower,
                len,
            } => {
                let l = s.nodes.get(usize::from(leader))?.clone();
                let f = s.nodes.get_mut(usize::from(follower))?;
                if f.term > l.term {
                    let term = f.term;
                    s.nodes.get_mut(usize::from(leader))?.adopt(term);
                    return Some(s);
                }
                f.adopt(l.term);
                // A candidate of the leader's term learns there is a leader.
                f.role = Role::Follower;
                let prefix = l.log.get(..usize::from(len))?;
                for (i, entry) in prefix.iter().enumerate() {
                    match f.log.get(i) {
                        Some(e) if e == entry => {}
                        Some(_) => {
                            f.log.truncate(i);
                            f.log.push(*entry);
                        }
                        None => f.log.push(*entry),
                    }
                }
                f.commit = f.commit.max(l.commit.min(len));
                if let Role::Leader { matched } = &mut s.nodes.get_mut(usize::from(leader))?.role {
                    let m = matched.get_mut(usize::from(follower))?;
                    *m = (*m).max(len);
                }
                self.advance(&mut s, leader);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(MAJORITY_KEEPS, |m: &ReplicationModel, s: &State| {
                s.acks
                    .iter()
                    .all(|a| ReplicationModel::holders(s, a) >= m.cfg.majority())
            }),
            Property::always(LEADERS_KEEP, |_, s: &State| {
                s.nodes.iter().all(|n| {
                    !matches!(n.role, Role::Leader { .. })
                        || s.acks
                            .iter()
                            .all(|a| n.term < a.by_term || n.holds(a.index, a.entry))
                })
            }),
            Property::always(ONE_GRANTEE, |_, s: &State| {
                s.acks.iter().all(|a| a.client == s.acks[0].client)
            }),
            Property::always(COMMITTED_AGREE, |_, s: &State| {
                s.nodes.iter().all(|a| {
                    s.nodes.iter().all(|b| {
                        let k = usize::from(a.commit.min(b.commit));
                        a.log.get(..k) == b.log.get(..k)
                    })
                })
            }),
            Property::sometimes(ACKNOWLEDGED, |_, s: &State| !s.acks.is_empty()),
            Property::sometimes(LATER_LEADER, |_, s: &State| {
                s.nodes.iter().any(|n| {
                    matches!(n.role, Role::Leader { .. })
                        && s.acks
                            .iter()
                            .any(|a| n.term > a.by_term && n.holds(a.index, a.entry))
                })
            }),
        ]
    }
}
