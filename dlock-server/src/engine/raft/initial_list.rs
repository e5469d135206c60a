//! The `--initial-cluster` list a node bootstrapped with, and the peer
//! hello's check that nodes bootstrapped with different lists never talk.
//!
//! Every initial node writes its list as the first membership entry, at
//! the same log position. Given different lists (a typo, a stale
//! template), the nodes' logs still look alike to openraft, and their
//! majorities may overlap: two leaders, two holders of one lock. So each
//! node records the list in its data directory's identity file at its
//! first start (`identity`), says it in every hello, and refuses a peer
//! whose hello names another; like etcd, which derives a cluster id from
//! the initial members and refuses peers whose id differs.
//!
//! Only nodes that bootstrapped with a list are checked: one added later
//! (`--initial-cluster-state existing`), or whose directory predates the
//! record, says none, and is neither checked nor checks.
//!
//! Both sides log a refusal paced (`paced`): openraft dials again every
//! few hundred milliseconds.

use super::types::{Member, NodeId};
use std::collections::BTreeMap;

/// Words every list refusal carries, for the dialler to tell it from other
/// refusals (it arrives as text, which older nodes read too).
const SAME_LIST: &str = "every initial node must be given the same --initial-cluster list";

/// `members` as `ID=CLIENT@PEER,...`, sorted by id: what goes into the
/// first membership, so two nodes that would write the same one record
/// the same text whatever order or spacing their flags had.
pub(crate) fn canonical(members: &BTreeMap<NodeId, Member>) -> String {
    members
        .iter()
        .map(|(id, m)| format!("{id}={}@{}", m.client_addr, m.peer_addr))
        .collect::<Vec<_>>()
        .join(",")
}

/// The list a node records when its directory is fresh: `members`
/// (`--initial-cluster`) in canonical form, which it bootstraps with;
/// `None` when it `joins` a running cluster (`--initial-cluster-state
/// existing`) or was given no list.
pub(crate) fn bootstrapped_with(members: &BTreeMap<NodeId, Member>, joins: bool) -> Option<String> {
    (!joins && !members.is_empty()).then(|| canonical(members))
}

/// Why node `local`, bootstrapped with `ours`, refuses node `from`,
/// bootstrapped with `theirs`; `None` when the lists agree or either is
/// not known.
pub(crate) fn refusal(
    from: NodeId,
    theirs: Option<&str>,
    local: NodeId,
    ours: Option<&str>,
) -> Option<String> {
    let (theirs, ours) = (theirs?, ours?);
    (theirs != ours).then(|| {
        format!(
            "node {from} was first started with --initial-cluster {theirs}, node {local} with \
             {ours}: {SAME_LIST}, or two leaders may be elected. Stop the nodes whose list is \
             wrong, empty their data directories, and start them again with the right list \
             (docs/CLUSTER.md, \"Whose a data directory is\")"
        )
    })
}

/// What to tell the operator when a later start's `--initial-cluster`
/// (`flag`, canonical) differs from the list this node bootstrapped with
/// (`recorded`): the flag is ignored once the directory holds data, but a
/// config template that says it will give the wrong list to the next node
/// started fresh from it. `None` when they agree or either is not known.
pub(crate) fn ignored_flag(recorded: Option<&str>, flag: Option<&str>) -> Option<String> {
    let (recorded, flag) = (recorded?, flag?);
    (recorded != flag).then(|| {
        format!(
            "--initial-cluster {flag} differs from the list this node was first started with, \
             {recorded}: the flag is ignored (the membership is read from the data directory), \
             but a node started fresh with it would refuse, and be refused by, this cluster's \
             nodes. Give every node the list the cluster was bootstrapped with, or leave the \
             flag out on restarts (docs/CLUSTER.md, \"Whose a data directory is\")"
        )
    })
}

/// Whether `why`, a peer's refusal, is [`refusal`]'s.
pub(crate) fn is_refusal(why: &str) -> bool {
    why.contains(SAME_LIST)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_later_start_with_another_list_is_told_its_flag_is_ignored() {
        let warned = super::ignored_flag(Some("1=a@b,2=c@d"), Some("1=a@b,2=c@e"))
            .expect("another list is worth a warning");
        assert!(warned.contains("1=a@b,2=c@d") && warned.contains("1=a@b,2=c@e"));
        assert!(warned.contains("ignored"), "{warned}");
        assert!(!warned.contains("  "), "one line of words: {warned}");
        assert_eq!(super::ignored_flag(Some("1=a@b"), Some("1=a@b")), None);
        // Joined with `existing`, from an older version, or no flag given.
        assert_eq!(super::ignored_flag(None, Some("1=a@b")), None);
        assert_eq!(super::ignored_flag(Some("1=a@b"), None), None);
    }

    use super::*;

    fn member(client: &str, peer: &str) -> Member {
        Member {
            client_addr: client.into(),
            peer_addr: peer.into(),
        }
    }

    #[test]
    fn the_canonical_list_is_sorted_by_id() {
        let members = BTreeMap::from([
            (2, member("127.0.0.1:2", "127.0.0.1:12")),
            (1, member("127.0.0.1:1", "127.0.0.1:11")),
        ]);
        assert_eq!(
            canonical(&members),
            "1=127.0.0.1:1@127.0.0.1:11,2=127.0.0.1:2@127.0.0.1:12"
        );
    }

    #[test]
    fn a_node_records_a_list_only_when_it_bootstraps_with_one() {
        let members = BTreeMap::from([(1, member("a", "b"))]);
        assert_eq!(bootstrapped_with(&members, false).as_deref(), Some("1=a@b"));
        assert_eq!(bootstrapped_with(&members, true), None, "existing");
        assert_eq!(bootstrapped_with(&BTreeMap::new(), false), None);
    }

    #[test]
    fn only_two_known_lists_that_differ_are_refused() {
        let (a, b) = ("1=a@b,2=c@d", "1=a@b,2=c@e");
        assert_eq!(refusal(3, Some(a), 1, Some(a)), None);
        assert_eq!(refusal(3, None, 1, Some(a)), None);
        assert_eq!(refusal(3, Some(a), 1, None), None);
        let why = refusal(3, Some(b), 1, Some(a)).expect("refused");
        assert!(
            why.contains("node 3 was first started with --initial-cluster 1=a@b,2=c@e"),
            "{why}"
        );
        assert!(why.contains("node 1 with 1=a@b,2=c@d"), "{why}");
        assert!(why.contains("empty their data directories"), "{why}");
        assert!(!why.contains("  "), "one line of words: {why}");
        assert!(is_refusal(&why));
        assert!(!is_refusal("cluster id \"x\" from node 3"));
    }
}
