//! The checker over the replication model: with Raft's vote and commit
//! rules an acknowledged grant stays in the log of a majority and in every
//! later leader's, within the CI bound; each rule dropped lets the cluster
//! forget a grant it acknowledged. Counts print with `-- --nocapture`
//! (docs/RELIABILITY.md quotes them).

use dlock_model::check::{run_model, Report};
use dlock_model::replication::{
    Replication, ReplicationModel, ACKNOWLEDGED, COMMITTED_AGREE, LATER_LEADER, LEADERS_KEEP,
    MAJORITY_KEEPS, ONE_GRANTEE,
};
use dlock_model::trace::replication_timeline;
use dlock_model::Bug;

const ALWAYS: [&str; 4] = [MAJORITY_KEEPS, LEADERS_KEEP, ONE_GRANTEE, COMMITTED_AGREE];

fn say(what: &str, r: &Report<ReplicationModel>) {
    eprintln!(
        "{what}: {} states ({} distinct), depth {}, {:.1?}",
        r.states, r.unique, r.depth, r.took
    );
}

/// Checks `cfg` until a property of [`ALWAYS`] breaks, and returns which,
/// the counterexample as a timeline, and its number of steps.
fn counterexample(cfg: Replication) -> (&'static str, String, usize) {
    let r = run_model(ReplicationModel::new(cfg), true);
    let Some((property, path)) = ALWAYS
        .into_iter()
        .find_map(|p| r.path(p).map(|path| (p, path)))
    else {
        panic!("no counterexample within the bound ({} states)", r.unique);
    };
    let steps = path.clone().into_actions().len();
    say(&format!("{property:?} broken in {steps} steps"), &r);
    (property, replication_timeline(path.clone()), steps)
}

#[test]
fn raft_rules_keep_every_acknowledged_grant_in_a_majority_and_every_later_leader() {
    let r = run_model(ReplicationModel::new(Replication::ci()), false);
    say("raft's rules", &r);
    for property in ALWAYS {
        if let Some(path) = r.path(property) {
            panic!("{property} broken:\n{}", replication_timeline(path.clone()));
        }
    }
    // Not vacuous: a grant is acknowledged, and a later leader has it.
    assert!(r.path(ACKNOWLEDGED).is_some(), "no grant acknowledged");
    assert!(
        r.path(LATER_LEADER).is_some(),
        "no later leader holds an acknowledged grant"
    );
}

#[test]
fn a_vote_without_the_up_to_date_check_elects_a_leader_that_forgets_a_grant() {
    let (property, trace, steps) =
        counterexample(Replication::ci().with_bug(Bug::VoteWithoutUpToDate));
    eprintln!("{trace}");
    // The new leader lacks the grant, then overwrites the follower that had it.
    assert!(
        [LEADERS_KEEP, MAJORITY_KEEPS].contains(&property),
        "{property}"
    );
    assert!(trace.contains("told Ok fence 1"), "{trace}");
    assert!(steps <= 5, "{steps} steps");
}

#[test]
fn committing_an_earlier_terms_entry_by_counting_replicas_lets_a_later_leader_overwrite_it() {
    let (property, trace, steps) =
        counterexample(Replication::ci().with_bug(Bug::CommitEarlierTermByCount));
    eprintln!("{trace}");
    assert!(
        [LEADERS_KEEP, MAJORITY_KEEPS].contains(&property),
        "{property}"
    );
    // Raft's Figure 8 on three nodes: the grant is committed in term 3 as
    // an entry of term 1, and a node whose log ends in term 2 wins term 4.
    assert!(trace.contains("@1 | -@3]"), "{trace}");
    assert!(trace.contains("t4 leader"), "{trace}");
    assert!(steps <= 11, "{steps} steps");
}

/// A deeper bound, by hand: `cargo test -p dlock-model --release --test
/// replication -- --ignored --nocapture`. The environment sets it:
/// `DLOCK_REPL_NODES` (default 3), `DLOCK_REPL_MAX_TERM` (5),
/// `DLOCK_REPL_CLIENTS` (2), `DLOCK_REPL_APPENDS` (1; 2: a client's Lock
/// sent again to the next leader, many times the states).
#[test]
#[ignore]
fn raft_rules_hold_within_a_deeper_bound() {
    let var = |name: &str, default: u8| {
        std::env::var(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v:?} is not a small number"))
        })
    };
    let cfg = Replication {
        nodes: var("DLOCK_REPL_NODES", 3),
        max_term: var("DLOCK_REPL_MAX_TERM", 5),
        clients: var("DLOCK_REPL_CLIENTS", 2),
        appends: var("DLOCK_REPL_APPENDS", 1),
        bug: None,
    };
    eprintln!("{cfg:?}");
    let r = run_model(ReplicationModel::new(cfg), true);
    say("deeper bound", &r);
    for property in ALWAYS {
        if let Some(path) = r.path(property) {
            panic!("{property} broken:\n{}", replication_timeline(path.clone()));
        }
    }
}
