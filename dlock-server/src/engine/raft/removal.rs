//! A node removed from the cluster stops, saying so, as an etcd member does.
//!
//! openraft 0.9 stops replicating to a removed voter once the change is
//! committed, so the node never sees the final membership: it keeps the
//! joint one (which names it on the old side only), hears no leader, and
//! stands for election again and again, with terms that only climb. The
//! others turn those votes down while their leader's lease lasts, but the
//! node itself answered `dlock cluster status` as a candidate and logged
//! nothing: its operator could not tell it had been removed. A leader that
//! removed itself steps down with the final membership, which leaves it out.
//!
//! So a node whose committed membership leaves it out, and that no other
//! leader replicates to, stops once that has lasted [`grace`]: the process
//! exits zero, so a supervisor's `Restart=on-failure` does not start it
//! again. A restart finds the same membership in its log and stops the same
//! way. A node being removed is still led, and so left running, for as long
//! as the change takes. A learner removed is not noticed: it was never in a
//! joint membership, and nothing tells it.

use super::types::{LogId, NodeId, Raft, StoredMembership};
use openraft::ServerState;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a node must be left out, and unled, before it stops: two
/// elections' worth, so that a leader elected while the change was under
/// way (which replicates to every node of the joint membership) has time
/// to show itself.
pub(crate) fn grace(election_timeout_max: Duration) -> Duration {
    election_timeout_max
        .saturating_mul(2)
        .max(Duration::from_secs(1))
}

/// Whether the membership `m`, applied at this node up to `applied`,
/// leaves node `me` out: it is committed, and `me` is neither a voter of
/// its last configuration (the new side of a joint one) nor a learner.
/// An uninitialised node (a joiner not yet added) has no membership and is
/// not left out.
pub(crate) fn left_out(me: NodeId, m: &StoredMembership, applied: Option<&LogId>) -> bool {
    let Some(at) = m.log_id() else {
        return false;
    };
    if applied.is_none_or(|a| a.index < at.index) {
        return false;
    }
    let membership = m.membership();
    let in_last = membership
        .get_joint_config()
        .last()
        .is_some_and(|voters| voters.contains(&me));
    !in_last && !membership.learner_ids().any(|l| l == me)
}

/// Watches node `me` of `raft` until `stop`; returns why it must stop once
/// it has been left out and unled for `grace`, or `None` at `stop`.
pub(crate) async fn watch(
    raft: Raft,
    me: NodeId,
    grace: Duration,
    stop: CancellationToken,
) -> Option<String> {
    // A few readings per grace period: the membership and the leader change
    // rarely, and this keeps the watcher off openraft's per-turn metrics.
    let mut tick = tokio::time::interval(grace / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tick.tick() => {}
        }
        let (out, at) = {
            let metrics = raft.metrics();
            let m = metrics.borrow();
            let led = m.state == ServerState::Leader || m.current_leader.is_some_and(|l| l != me);
            let out = !led && left_out(me, &m.membership_config, m.last_applied.as_ref());
            (out, m.membership_config.log_id().map(|l| l.index))
        };
        if !out {
            since = None;
            continue;
        }
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() >= grace {
            return Some(format!(
                "node {me} was removed from the cluster (the membership committed at log index \
                 {} leaves it out) and no leader has replicated to it for {}: it stops. Its \
                 data directory can be deleted; to bring this machine back, add it as a new \
                 node with a new id (dlock cluster add)",
                at.unwrap_or_default(),
                humantime::format_duration(grace)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::raft::types::Member;
    use openraft::{CommittedLeaderId, Membership};
    use std::collections::{BTreeMap, BTreeSet};

    fn member() -> Member {
        Member {
            client_addr: "127.0.0.1:1".into(),
            peer_addr: "127.0.0.1:2".into(),
        }
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Voters in `configs` (one: uniform; two: joint), learners beside.
    fn at(index: u64, configs: &[&[NodeId]], learners: &[NodeId]) -> StoredMembership {
        let configs: Vec<BTreeSet<NodeId>> = configs
            .iter()
            .map(|c| c.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<NodeId, Member> = configs
            .iter()
            .flatten()
            .chain(learners)
            .map(|&id| (id, member()))
            .collect();
        StoredMembership::new(Some(log_id(index)), Membership::new(configs, nodes))
    }

    #[test]
    fn a_node_is_left_out_only_by_a_committed_membership_without_it() {
        let applied = log_id(4);
        let a = Some(&applied);
        // Removing 3: the joint membership names it on the old side only.
        assert!(left_out(3, &at(3, &[&[1, 2, 3], &[1, 2]], &[]), a));
        // The final one, as a leader that removed itself has it.
        assert!(left_out(3, &at(4, &[&[1, 2]], &[]), a));
        // Not yet committed here.
        assert!(!left_out(3, &at(5, &[&[1, 2]], &[]), a));
        assert!(!left_out(3, &at(3, &[&[1, 2]], &[]), None));
        // A member, a voter being added, a learner.
        assert!(!left_out(3, &at(3, &[&[1, 2, 3]], &[]), a));
        assert!(!left_out(3, &at(3, &[&[1, 2], &[1, 2, 3]], &[]), a));
        assert!(!left_out(3, &at(3, &[&[1, 2]], &[3]), a));
        // A joiner not yet added has no membership.
        assert!(!left_out(3, &StoredMembership::default(), a));
    }
}
