//! Who a member of the cluster is, and the ids that name log positions and
//! votes: the parts of openraft's types that do not depend on the type
//! config, so the snapshot file can use them without a circle through it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One node of the cluster as the membership records it: where clients and
/// peers reach it. Stored in the log with every membership change, so it is
/// what a restarted node or a new leader knows of the others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The address clients connect to, given to them in NotLeader answers.
    pub client_addr: String,
    /// The address the other nodes' peer transport connects to.
    pub peer_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "clients {}, peers {}", self.client_addr, self.peer_addr)
    }
}

/// A node id.
pub type NodeId = u64;
/// The position of a log entry: term and leader of its writer, and index.
pub type LogId = openraft::LogId<NodeId>;
/// A vote, durable in the log store.
pub type Vote = openraft::Vote<NodeId>;
/// A membership as of the log entry that set it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
