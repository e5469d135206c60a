//! Membership changes: adding a node (as a learner first) and removing one.

use super::types::{Member, NodeId};
use super::{Cluster, ClusterError, MEMBERSHIP_TIMEOUT};
use openraft::ChangeMembers;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long a node being added has to answer the leader at all, before
/// it is left a learner: a node that runs answers within a heartbeat or
/// two, and a mistyped address or a node not started never does.
const FIRST_ANSWER: Duration = Duration::from_secs(5);

impl Cluster {
    /// Adds node `id` at `member`'s addresses: first as a learner, waiting
    /// until it has answered and caught up with the log up to the entry that
    /// made it a learner, then as a voter. The node must be running with a
    /// fresh data directory and the same cluster id.
    ///
    /// # Errors
    /// [`ClusterError::NotLeader`] off the leader;
    /// [`ClusterError::Refused`] when the node did not answer within
    /// 5 s (`FIRST_ANSWER`), another membership change is running, or `id`
    /// is a removed voter's;
    /// [`ClusterError::Unavailable`] when it did not catch up within
    /// [`MEMBERSHIP_TIMEOUT`]. Either way it stays a learner, which
    /// removing it undoes, and which adding it again picks up.
    pub async fn add_node(&self, id: u64, member: Member) -> Result<(), ClusterError> {
        self.leading_term()?;
        if self.inner.ephemeral_peer_port {
            return Err(ClusterError::Refused(self.on_an_ephemeral_port()));
        }
        // A removed voter started again with its data would answer as the
        // new node of that id: two nodes with one id, one vote each. Once
        // the latest membership is applied: a new leader may not have
        // applied the removal its predecessor committed yet.
        let membership = |m: &openraft::RaftMetrics<NodeId, Member>| {
            m.membership_config.log_id().map(|l| l.index) <= m.last_applied.map(|l| l.index)
        };
        self.inner
            .raft
            .wait(Some(FIRST_ANSWER))
            .metrics(membership, "the latest membership applied")
            .await
            .map_err(|e| ClusterError::Unavailable(format!("{e}")))?;
        if self.inner.machine.lock().retired.contains(&id) {
            return Err(ClusterError::Refused(format!(
                "node {id} was a voter of this cluster and was removed; an id is never given to \
                 another node (the old one, started again with its data, would answer for it): \
                 add this node with a new id"
            )));
        }
        let peer_addr = member.peer_addr.clone();
        let learner = self.inner.raft.add_learner(id, member, false);
        let added = self
            .bounded(MEMBERSHIP_TIMEOUT, learner)
            .await?
            .map_err(|e| self.write_error(e))?;
        // Not openraft's own wait (`add_learner` blocking): it counts a
        // learner as caught up when its lag is under
        // `replication_lag_threshold` (5,000 entries), which a node that
        // never answered also is while the log is short; made a voter, a
        // node that does not exist costs the cluster its majority.
        let matched = |m: &openraft::RaftMetrics<NodeId, Member>| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map(|l| l.index)
        };
        let answered = self
            .inner
            .raft
            .wait(Some(FIRST_ANSWER))
            .metrics(|m| matched(m).is_some(), "the new node's first answer")
            .await;
        if answered.is_err() {
            return Err(ClusterError::Refused(format!(
                "node {id} has not answered at its peer address {peer_addr} within {FIRST_ANSWER:?}, \
                 so it is not made a voter: start it there (an empty data directory, \
                 --initial-cluster-state existing, this cluster's --cluster-id) and run the add \
                 again, or undo it with `dlock cluster remove {id}` (it is a learner meanwhile)"
            )));
        }
        let caught_up = self
            .inner
            .raft
            .wait(Some(MEMBERSHIP_TIMEOUT))
            .metrics(
                |m| matched(m) >= Some(added.log_id.index),
                "the new node caught up",
            )
            .await;
        if caught_up.is_err() {
            return Err(ClusterError::Unavailable(format!(
                "node {id} answers but has not caught up with the log within \
                 {MEMBERSHIP_TIMEOUT:?}, so it is not made a voter: run the add again once it has \
                 (`dlock cluster status` shows its lag), or undo it with `dlock cluster remove {id}`"
            )));
        }
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
                    let matched = matched(m);
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

    /// Why no node is added while this leader listens for peers on a port
    /// the kernel chose at its start (no `--peer-listen`): the new node
    /// would dial it at that port, which changes at its next restart, and
    /// the cluster could then no longer elect it or hear from it.
    fn on_an_ephemeral_port(&self) -> String {
        let id = self.inner.id;
        let at = self
            .status()
            .members
            .into_iter()
            .find(|m| m.id == id)
            .map(|m| format!(" ({})", m.peer_addr))
            .unwrap_or_default();
        format!(
            "node {id}, the leader, was started without --peer-listen, so it listens for peers on \
             a port the kernel chose at its start{at}, which changes at every restart: a node \
             added now could not reach it after one. Restart node {id} with --peer-listen ADDR \
             (a fixed address the new nodes can reach; its data is kept, and it records ADDR as \
             its peer address once it leads again), then run the add again"
        )
    }

    /// Records `me` as this node's addresses in the membership, once it
    /// leads (see `own_addresses_to_record` in `start.rs`).
    pub(super) async fn record_own_addresses(&self, me: Member) {
        let id = self.inner.id;
        let mut server = self.inner.raft.server_metrics();
        loop {
            if server.borrow_and_update().current_leader == Some(id) {
                break;
            }
            tokio::select! {
                r = server.changed() => if r.is_err() { return },
                () = self.inner.stop.cancelled() => return,
            }
        }
        let change = ChangeMembers::SetNodes(BTreeMap::from([(id, me.clone())]));
        match self.change(change).await {
            Ok(()) => {
                tracing::info!(node = id, client = %me.client_addr, peer = %me.peer_addr, "recorded this node's new addresses in the membership")
            }
            Err(e) => {
                tracing::warn!(node = id, error = %e, "cannot record this node's new addresses in the membership; they are recorded at its next start")
            }
        }
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
