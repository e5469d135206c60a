//! Membership changes: adding a node (as a learner first) and removing one.

use super::types::{Member, NodeId};
use super::{Cluster, ClusterError, MEMBERSHIP_TIMEOUT};
use openraft::ChangeMembers;
use std::collections::BTreeSet;

impl Cluster {
    /// Adds node `id` at `member`'s addresses: first as a learner, waiting
    /// until it has caught up with the log, then as a voter. The node must
    /// be running with a fresh data directory and the same cluster id.
    ///
    /// # Errors
    /// [`ClusterError::NotLeader`] off the leader;
    /// [`ClusterError::Unavailable`] when the node did not catch up within
    /// [`MEMBERSHIP_TIMEOUT`] (it stays a learner; removing it undoes that);
    /// [`ClusterError::Refused`] when another membership change is running.
    pub async fn add_node(&self, id: u64, member: Member) -> Result<(), ClusterError> {
        self.leading_term()?;
        let learner = self.inner.raft.add_learner(id, member, true);
        self.bounded(MEMBERSHIP_TIMEOUT, learner)
            .await?
            .map_err(|e| self.write_error(e))?;
        tracing::info!(node = id, "new node caught up; making it a voter");
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await?;
        // The change restarts replication to the new voter, whose progress
        // reads 0 until its first answer: wait for that, so that a status
        // right after the add shows its real lag (0), not the whole log.
        let last = self.inner.raft.metrics().borrow().last_log_index;
        let caught_up = self
            .inner
            .raft
            .wait(Some(MEMBERSHIP_TIMEOUT))
            .metrics(
                |m| {
                    let matched = m
                        .replication
                        .as_ref()
                        .and_then(|r| r.get(&id).copied().flatten())
                        .map(|l| l.index);
                    matched.is_some() && matched >= last
                },
                "the new voter's replication reported",
            )
            .await;
        if let Err(e) = caught_up {
            tracing::warn!(node = id, error = %e, "the new voter has not answered since it was made one");
        }
        Ok(())
    }

    /// Removes node `id` from the cluster (voter or learner). Removing the
    /// leader itself makes it step down once the change is committed.
    ///
    /// # Errors
    /// As [`Cluster::add_node`]; [`ClusterError::Refused`] when it would
    /// leave no voter.
    pub async fn remove_node(&self, id: u64) -> Result<(), ClusterError> {
        self.leading_term()?;
        let (voter, known) = {
            let server = self.inner.raft.server_metrics();
            let m = server.borrow();
            let membership = m.membership_config.membership();
            let voter = membership.voter_ids().any(|v| v == id);
            (voter, membership.get_node(&id).is_some())
        };
        let ids = BTreeSet::from([id]);
        match (voter, known) {
            (true, _) => self.change(ChangeMembers::RemoveVoters(ids)).await,
            (false, true) => self.change(ChangeMembers::RemoveNodes(ids)).await,
            (false, false) => Ok(()),
        }
    }

    async fn change(&self, change: ChangeMembers<NodeId, Member>) -> Result<(), ClusterError> {
        // retain = false: a removed voter leaves the membership entirely
        // rather than staying on as a learner.
        let write = self.inner.raft.change_membership(change, false);
        self.bounded(MEMBERSHIP_TIMEOUT, write)
            .await?
            .map(|_| ())
            .map_err(|e| self.write_error(e))
    }
}
