//! A node removed from the cluster stops, saying so, as an etcd member does.
//!
//! openraft 0.9 stops replicating to a removed voter once the change that
//! removes it is appended, so the node never learns of it: it keeps the
//! joint membership (or an older one, if it was down), hears no leader, and
//! stands for election again and again, with terms that only climb. The
//! others turn those votes down while their leader's lease lasts, but the
//! node itself answered `dlock cluster status` as a candidate and logged
//! nothing: its operator could not tell it had been removed. A leader that
//! removed itself sat as a learner, naming itself leader.
//!
//! Its own log cannot settle it: a joint membership that names the node on
//! its old side only is committed before the change completes, and if the
//! leader is lost between the two steps it stays in force, with the node
//! counted in the old side's majority. So a node that has been part of a
//! cluster and heard from no other leader for [`grace`] asks its members
//! over the peer port (and the leader they name, which may have joined
//! since this node last heard of the membership); it stops only when a leader that stands (a majority
//! acknowledged it lately, `quorum.rs`) answers that its membership lacks
//! the node. The process then exits zero, so a supervisor's
//! `Restart=on-failure` does not start it again; a restart asks again and
//! stops the same way. A node cut off from the others finds no leader to
//! ask, and asks again after another grace. A learner removed is not
//! noticed: it keeps counting the leader whose vote it last saw as its
//! leader, and nothing tells it otherwise.

use super::peer_client::Network;
use super::types::{NodeId, Raft};
use super::wire::Standing;
use openraft::ServerState;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long each member gets to answer.
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// How long a node must go unled before it asks whether it is still a
/// member: twice the longest election timeout (an election normally ends
/// within one), at least a second.
pub(crate) fn grace(election_timeout_max: Duration) -> Duration {
    election_timeout_max
        .saturating_mul(2)
        .max(Duration::from_secs(1))
}

/// The leader, and its term, whose answer says the asking node is no
/// member: of the answers from leaders that stand, the one of the highest
/// term (a deposed leader may not know it yet). `None` when no standing
/// leader answered, or the latest counts the node a member.
pub(crate) fn removed_by(answers: &[(NodeId, Standing)]) -> Option<(NodeId, u64)> {
    answers
        .iter()
        .filter(|(_, s)| s.leading && s.stands)
        .max_by_key(|(_, s)| s.term)
        .filter(|(_, s)| !s.member)
        .map(|(id, s)| (*id, s.term))
}

/// Watches node `me` of `raft` until `stop`; returns why it must stop once
/// a standing leader says it is no member, or `None` at `stop`.
pub(crate) async fn watch(
    raft: Raft,
    network: Network,
    me: NodeId,
    grace: Duration,
    stop: CancellationToken,
) -> Option<String> {
    // A few readings per grace period: the role and the leader change
    // rarely, and this keeps the watcher off openraft's per-turn metrics.
    let mut tick = tokio::time::interval(grace / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tick.tick() => {}
        }
        let unled = {
            let metrics = raft.metrics();
            let m = metrics.borrow();
            let led = m.state == ServerState::Leader || m.current_leader.is_some_and(|l| l != me);
            // A joiner not yet added has no membership: it waits, unled.
            !led && m.membership_config.log_id().is_some()
        };
        if !unled {
            since = None;
            continue;
        }
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() < grace {
            continue;
        }
        // Read only when asking, not at every tick of the grace.
        let asked: Vec<(NodeId, String)> = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != me)
            .map(|(id, node)| (*id, node.peer_addr.clone()))
            .collect();
        let mut answers = ask_all(&network, &asked, &stop).await?;
        // The leader may be a node added after this one's membership (it
        // was down meanwhile): ask the leaders the others name, once.
        let named = not_asked_leaders(&answers, &asked, me);
        if removed_by(&answers).is_none() && !named.is_empty() {
            answers.extend(ask_all(&network, &named, &stop).await?);
        }
        if let Some((leader, term)) = removed_by(&answers) {
            return Some(format!(
                "node {me} is no member of the cluster: its leader, node {leader} (term {term}), \
                 says so; it was removed (dlock cluster remove), and it stops. Its data directory \
                 can be deleted; to bring this machine back, add it as a new node with a new id \
                 (dlock cluster add)"
            ));
        }
        // Asked again after another grace, not at every tick.
        since = Some(Instant::now());
    }
}

/// Asks each of `nodes` (id, peer address) what it knows of this node, at
/// once; the answers that came, or `None` at `stop`.
async fn ask_all(
    network: &Network,
    nodes: &[(NodeId, String)],
    stop: &CancellationToken,
) -> Option<Vec<(NodeId, Standing)>> {
    let asks = nodes.iter().map(|(id, addr)| {
        let client = network.client(*id, addr);
        async move { (*id, client.standing(ASK_LIMIT).await) }
    });
    tokio::select! {
        _ = stop.cancelled() => None,
        all = futures_util::future::join_all(asks) => Some(
            all.into_iter()
                .filter_map(|(id, said)| said.ok().map(|s| (id, s)))
                .collect(),
        ),
    }
}

/// The leaders `answers` name that are not among `asked` (nor `me`).
fn not_asked_leaders(
    answers: &[(NodeId, Standing)],
    asked: &[(NodeId, String)],
    me: NodeId,
) -> Vec<(NodeId, String)> {
    let mut named: Vec<(NodeId, String)> = Vec::new();
    for (id, addr) in answers.iter().filter_map(|(_, s)| s.leader.clone()) {
        let known =
            id == me || asked.iter().any(|(a, _)| *a == id) || named.iter().any(|(n, _)| *n == id);
        if !known {
            named.push((id, addr));
        }
    }
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(term: u64, leading: bool, stands: bool, member: bool) -> Standing {
        Standing {
            term,
            leader: None,
            acknowledged: None,
            leading,
            stands,
            member,
        }
    }

    #[test]
    fn only_the_latest_standing_leader_can_say_a_node_is_no_member() {
        // The leader that stands says so.
        assert_eq!(removed_by(&[(1, said(3, true, true, false))]), Some((1, 3)));
        // A member, as in a joint membership that names the node on its
        // old side only.
        assert_eq!(removed_by(&[(1, said(3, true, true, true))]), None);
        // A leader cut off from its majority, a follower, an older node
        // that does not say whether it stands: not enough.
        assert_eq!(removed_by(&[(1, said(3, true, false, false))]), None);
        assert_eq!(removed_by(&[(1, said(3, false, false, false))]), None);
        // A deposed leader of an older term that still stands in its own
        // eyes is outweighed by the newer one.
        let two = [
            (1, said(3, true, true, false)),
            (2, said(4, true, true, true)),
        ];
        assert_eq!(removed_by(&two), None);
        let two = [
            (1, said(4, true, true, false)),
            (2, said(3, true, true, true)),
        ];
        assert_eq!(removed_by(&two), Some((1, 4)));
        assert_eq!(removed_by(&[]), None);
    }

    #[test]
    fn a_leader_the_others_name_is_asked_once_unless_asked_already() {
        let naming = |leader: NodeId| Standing {
            leader: Some((leader, format!("h:{leader}"))),
            ..said(3, false, false, true)
        };
        let asked = [(1, "h:1".to_string()), (2, "h:2".to_string())];
        let answers = [(1, naming(5)), (2, naming(5))];
        assert_eq!(
            not_asked_leaders(&answers, &asked, 3),
            vec![(5, "h:5".into())]
        );
        let answers = [(1, naming(2)), (2, naming(3))];
        assert!(
            not_asked_leaders(&answers, &asked, 3).is_empty(),
            "asked, or me"
        );
    }
}
