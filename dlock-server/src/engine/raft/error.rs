//! What a cluster request can fail with.

use super::types::{Member, NodeId};

/// Why a [`super::Cluster`] request did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// This node is not the leader (or stopped being it before the request
    /// was taken), and the request was not acted on. `leader` is the leader
    /// this node knows of, if any: clients should go there.
    #[error("not the leader{}", match leader { Some((id, m)) => format!("; node {id} at {} is", m.client_addr), None => "; no leader is known".into() })]
    NotLeader {
        /// The leader's id and addresses, when known.
        leader: Option<(NodeId, Member)>,
    },
    /// The request could not be completed in time (no quorum answered) or
    /// the node is shutting down. For a proposal the outcome is unknown: the
    /// command may still be committed later, and then reaches the apply sink
    /// like any other.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// A membership change was refused as asked (another change is in
    /// progress, it would leave no voter, the node is unknown).
    #[error("refused: {0}")]
    Refused(String),
    /// The consensus engine stopped on an unrecoverable error (a storage
    /// failure); this node serves nothing more until restarted. Boxed:
    /// openraft's error is large and rare.
    #[error("cluster engine stopped: {0}")]
    Fatal(#[source] Box<openraft::error::Fatal<NodeId>>),
}
