//! Before a node bootstraps from an empty data directory: is a cluster
//! already running that once had this node in it?
//!
//! A node listed in `--initial-cluster` whose data directory is fresh
//! writes the initial membership and joins the election. At the cluster's
//! first start that is right, however late the node comes. But a node whose
//! directory was wiped (a new disk, a mistaken `rm`) would do the same: it
//! comes back under its old id with its log and its vote forgotten, and may
//! vote twice in one term. A lost raft log beside other files is caught
//! when the directory is opened; a wholly empty directory looks fresh.
//!
//! So a fresh node asks the other initial members over the peer port (same
//! cluster id, same TLS) what they know of it, and the leader they name. A
//! leader whose replication shows this node once acknowledged entries means
//! the node lost its data: it refuses to start under that id at all (see
//! [`Finding::LostItsLog`]). A leader whose membership lacks this node means
//! the cluster runs without it: it refuses to bootstrap, and starts only
//! when told it joins (`--initial-cluster-state existing`), to wait for
//! `dlock cluster add`. A member that cannot be asked (down, older, still
//! starting) says nothing either way: at a first start of all the nodes
//! together none of them can answer yet, and they bootstrap as before.
//!
//! A member that refuses this node's hello (another `--cluster-id`, another
//! `--initial-cluster` list, an address that reaches another node) while it
//! knows a leader says so in its refusal: then a cluster runs whose nodes
//! agree with each other and not with this one, so this node's flags are
//! the wrong ones ([`Finding::Refused`]). It does not start, and its data
//! directory stays empty for a start with the right flags. Had it started,
//! it would sit apart, refused at every dial. Except for a node that joins
//! (`--initial-cluster-state existing`) and dialled an address that now
//! reaches another node: its list only says where to ask, and may be older
//! than the cluster's membership, which it learns once added.

use super::peer_client::Network;
use super::types::{Member, NodeId};
use super::wire::Standing;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long each member gets to answer. Bounded so that a member that
/// accepts and never answers (still opening its own data directory,
/// paused) delays a start by this at most.
const ASK_LIMIT: Duration = Duration::from_secs(2);

/// What a running cluster's leader said of this node.
#[derive(Debug)]
pub(crate) enum Finding {
    /// This node once acknowledged log entries: starting empty, it has
    /// lost its log and its vote. openraft does not let a follower's log go
    /// back, and a forgotten vote could be cast twice in one term: it must
    /// not come back under its id at all.
    LostItsLog {
        /// The leader that said so.
        leader: NodeId,
        /// The last index this node acknowledged.
        index: u64,
    },
    /// A cluster runs without this node among its members.
    NotAMember {
        /// The leader that said so.
        leader: NodeId,
        /// Its term.
        term: u64,
    },
    /// A member of a running cluster refused this node's hello: their
    /// flags disagree (see the module documentation).
    Refused {
        /// The member that refused.
        by: NodeId,
        /// Its reason, naming both sides' values.
        why: String,
    },
}

/// Words a refusal carries when the refusing node knows a leader, for a
/// fresh dialler to tell it from a refusal at a first start.
const RUNNING: &str = "is a member of a running cluster";

/// Words of the refusal of a hello that reached another node than the
/// one dialled.
pub(crate) const REACHED_ANOTHER: &str = "but reached node";

/// A hello refusal (`why`) from a node that knows `leader` in `term`.
pub(crate) fn refused_by_a_running_cluster(why: &str, leader: NodeId, term: u64) -> String {
    format!("{why}; the refusing node {RUNNING} (leader: node {leader}, term {term})")
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::LostItsLog { leader, index } => write!(
                f,
                "this node is a member of a running cluster whose leader, node {leader}, has log \
                 entries up to index {index} acknowledged by it, but its data directory is empty: it \
                 has lost its log and its vote, and could vote twice in one term"
            ),
            Finding::NotAMember { leader, term } => write!(
                f,
                "a cluster is running (leader: node {leader}, term {term}) and this node is not (or \
                 no longer) one of its members"
            ),
            Finding::Refused { by, why } => write!(f, "node {by} refused this node: {why}"),
        }
    }
}

/// What the leader of a running cluster says of node `me`, found by
/// asking `members` (and the leader they name); `None` when no leader
/// answered, or it had nothing to say.
pub(crate) async fn ask_the_cluster(
    network: &Network,
    me: NodeId,
    members: &BTreeMap<NodeId, Member>,
    joins: bool,
) -> Option<Finding> {
    let ask_node = |id: NodeId, addr: String| ask(network, id, addr, joins);
    let asks = members
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, m)| ask_node(*id, m.peer_addr.clone()));
    let mut answers: Vec<(NodeId, Standing)> = Vec::new();
    for (id, said) in futures_util::future::join_all(asks).await {
        match said {
            Said::Standing(s) => answers.push((id, s)),
            Said::Refused(why) => return Some(Finding::Refused { by: id, why }),
            Said::Nothing => {}
        }
    }
    let mut leaders: Vec<(NodeId, Standing)> = Vec::new();
    for (_, s) in &answers {
        if s.leading {
            continue;
        }
        // A follower names the leader: ask it too, unless it answered.
        if let Some((leader, addr)) = &s.leader {
            let asked = answers.iter().chain(&leaders).any(|(a, _)| a == leader);
            if !asked && *leader != me {
                match ask_node(*leader, addr.clone()).await {
                    (id, Said::Standing(s)) => leaders.push((id, s)),
                    (by, Said::Refused(why)) => return Some(Finding::Refused { by, why }),
                    (_, Said::Nothing) => {}
                }
            }
        }
    }
    answers
        .iter()
        .chain(&leaders)
        .filter(|(_, s)| s.leading)
        .find_map(|(leader, s)| finding(*leader, s))
}

/// What a leader's answer says of the asking node.
fn finding(leader: NodeId, s: &Standing) -> Option<Finding> {
    if let Some(index) = s.acknowledged {
        return Some(Finding::LostItsLog { leader, index });
    }
    (!s.member).then_some(Finding::NotAMember {
        leader,
        term: s.term,
    })
}

/// What one member said when asked.
enum Said {
    Standing(Standing),
    /// It refused this node's hello, and knows a leader: the refusal.
    Refused(String),
    /// Nothing to go by: down, older, still starting, or refused while it
    /// knows no leader (every node's first start).
    Nothing,
}

/// Asks node `id` at `peer_addr`; `joins`: this node joins a running
/// cluster (see the module documentation).
async fn ask(network: &Network, id: NodeId, peer_addr: String, joins: bool) -> (NodeId, Said) {
    match network.client(id, &peer_addr).standing(ASK_LIMIT).await {
        Ok(s) => (id, Said::Standing(s)),
        Err(why) if says_this_node_is_wrong(&why, joins) => {
            // Said after "node N refused this node: ".
            let why = why.strip_prefix("refused: ").unwrap_or(&why).to_owned();
            (id, Said::Refused(why))
        }
        Err(why) => {
            tracing::debug!(node = id, addr = %peer_addr, reason = %why, "cannot ask before bootstrapping");
            (id, Said::Nothing)
        }
    }
}

/// Whether a failed ask's error (`why`) is a refusal that shows this
/// node's flags are the wrong ones.
fn says_this_node_is_wrong(why: &str, joins: bool) -> bool {
    why.contains(RUNNING) && !(joins && why.contains(REACHED_ANOTHER))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_from_a_running_cluster_says_so_and_is_told_apart() {
        let why = super::refused_by_a_running_cluster("cluster id \"a\" from node 3", 2, 7);
        assert!(why.starts_with("cluster id \"a\" from node 3; "), "{why}");
        assert!(why.ends_with("(leader: node 2, term 7)"), "{why}");
        assert!(why.contains(super::RUNNING));
        assert!(!"cluster id \"a\" from node 3".contains(super::RUNNING));
        assert!(super::says_this_node_is_wrong(&why, false));
        assert!(
            super::says_this_node_is_wrong(&why, true),
            "a joiner's cluster id"
        );
        assert!(!super::says_this_node_is_wrong(
            "cluster id \"a\" from node 3",
            false
        ));
    }

    #[test]
    fn a_joiner_whose_hint_reaches_another_node_of_the_cluster_goes_on() {
        let why = format!("node 4 dialled node 2 {} 1", super::REACHED_ANOTHER);
        let why = super::refused_by_a_running_cluster(&why, 1, 3);
        assert!(
            super::says_this_node_is_wrong(&why, false),
            "a bootstrapping node's list"
        );
        assert!(!super::says_this_node_is_wrong(&why, true));
    }
}
