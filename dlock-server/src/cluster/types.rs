//! The types openraft is instantiated with: who a member is, what a log
//! entry carries, and the aliases the other files use.

use crate::table::{Command, Output, Time};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

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

/// A log entry's payload: a table command and the cluster time the leader
/// stamped it with. Every node applies `cmd` at `at`, so every node's
/// table takes the same steps (see the table's determinism contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamped {
    /// When, on the cluster's timeline.
    pub at: Time,
    /// What.
    pub cmd: Command,
}

openraft::declare_raft_types!(
    /// openraft's view of dlock: node ids are `u64`, nodes are [`Member`]s,
    /// entries carry [`Stamped`] commands and return the table's [`Output`].
    pub TypeConfig:
        D = Stamped,
        R = Output,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A node id.
pub type NodeId = u64;
/// A log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// The position of a log entry: term and leader of its writer, and index.
pub type LogId = openraft::LogId<NodeId>;
/// A vote, durable in the log store.
pub type Vote = openraft::Vote<NodeId>;
/// A membership as of the log entry that set it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
