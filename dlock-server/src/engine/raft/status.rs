//! What `dlock cluster status` shows: every member and this node's view.

use super::types::{Member, NodeId};
use openraft::{RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};

/// A node's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Takes writes and replicates them.
    Leader,
    /// Asking for votes.
    Candidate,
    /// A voter following a leader.
    Follower,
    /// Receives the log but does not vote: joining, or not a member.
    Learner,
    /// The engine has stopped.
    Stopped,
    /// Leader in openraft's eyes, but no majority has acknowledged it lately
    /// (or it is stopping): it refuses requests as a node without a leader
    /// and names none (`quorum.rs`).
    SteppedAside,
}

impl Role {
    /// The role as a metric label: `leader`, `stepped_aside`, ...
    pub fn label(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Candidate => "candidate",
            Role::Follower => "follower",
            Role::Learner => "learner",
            Role::Stopped => "stopped",
            Role::SteppedAside => "stepped_aside",
        }
    }
}

/// One member, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Its node id.
    pub id: NodeId,
    /// Where clients reach it.
    pub client_addr: String,
    /// Where peers reach it.
    pub peer_addr: String,
    /// Whether it votes (else it is a learner).
    pub voter: bool,
    /// The last log index known to be on its disk: only a leader knows.
    pub matched_index: Option<u64>,
    /// How many entries it is behind the leader's log: only a leader knows.
    pub lag: Option<u64>,
    /// How long this node's RPCs to it have failed, while they do; `None`
    /// when they get through (or none was tried: only a leader tries every
    /// member all the time).
    #[serde(default)]
    pub unreachable_for: Option<std::time::Duration>,
}

/// The cluster as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This node's id.
    pub node_id: NodeId,
    /// This node's role.
    pub role: Role,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// The last index in this node's log.
    pub last_log_index: Option<u64>,
    /// The last index committed, as this node knows.
    pub committed_index: Option<u64>,
    /// The last index applied to this node's table.
    pub last_applied_index: Option<u64>,
    /// The last index covered by this node's snapshot.
    pub snapshot_index: Option<u64>,
    /// The last index removed from this node's log.
    pub purged_index: Option<u64>,
    /// Every member of the current membership, voters and learners, by id.
    pub members: Vec<MemberStatus>,
}

impl ClusterStatus {
    /// This node's view from openraft's metrics and the committed index
    /// the log store last saved.
    pub(crate) fn from_metrics(m: &RaftMetrics<NodeId, Member>, committed: Option<u64>) -> Self {
        let role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Follower => Role::Follower,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Stopped,
        };
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let matched = match &m.replication {
                    Some(r) if *id == m.id => {
                        m.last_log_index
                            .or(r.get(id).copied().flatten().map(|l| l.index))
                    }
                    Some(r) => r.get(id).copied().flatten().map(|l| l.index),
                    None => None,
                };
                let lag = match (&m.replication, m.last_log_index) {
                    // Nothing matched yet: the whole log is still to send.
                    (Some(_), Some(last)) => {
                        Some(matched.map_or(last.saturating_add(1), |i| last.saturating_sub(i)))
                    }
                    _ => None,
                };
                MemberStatus {
                    id: *id,
                    client_addr: node.client_addr.clone(),
                    peer_addr: node.peer_addr.clone(),
                    voter: voters.contains(id),
                    matched_index: matched,
                    lag,
                    unreachable_for: None,
                }
            })
            .collect();
        ClusterStatus {
            node_id: m.id,
            role,
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            committed_index: committed,
            last_applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            members,
        }
    }
}
