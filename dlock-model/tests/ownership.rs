//! The checker over the ownership model: two tasks sharing one client take
//! turns on a key, and the client never tells the wrong one it lost; the
//! Go client as it was before 796fce3 (issue 41's (e)) is found telling
//! the wrong one.

use dlock_model::check::{find, run_model, Report};
use dlock_model::ownership::{
    Ownership, OwnershipModel, CURRENT_GRANT, ONE_TASK, RIGHT_LOSER, TURNS_TAKEN,
};
use dlock_model::trace::ownership_timeline;
use dlock_model::Bug;

fn say(what: &str, r: &Report<OwnershipModel>) {
    eprintln!(
        "{what}: {} states ({} distinct), depth {}, {:.1?}",
        r.states, r.unique, r.depth, r.took
    );
}

#[test]
fn tasks_sharing_a_client_take_turns_and_no_lock_is_reported_lost_wrongly() {
    let r = run_model(OwnershipModel::new(Ownership::ci()), false);
    say("the claim rule", &r);
    for property in [RIGHT_LOSER, CURRENT_GRANT, ONE_TASK] {
        if let Some(path) = r.path(property) {
            panic!("{property} broken:\n{}", ownership_timeline(path.clone()));
        }
    }
    assert!(r.path(TURNS_TAKEN).is_some(), "the tasks never took turns");
}

#[test]
fn the_old_go_client_reports_the_wrong_lock_lost() {
    // The re-grant breaks CURRENT_GRANT first; the wrong loss comes after.
    let r = find(
        OwnershipModel::new(Ownership::ci().with_bug(Bug::LostByRecordOrder)),
        RIGHT_LOSER,
    );
    say("bug (e)", &r);
    let Some(path) = r.path(RIGHT_LOSER) else {
        panic!("no wrong loss within the bound ({} states)", r.unique);
    };
    let steps = path.clone().into_actions().len();
    let trace = ownership_timeline(path.clone());
    eprintln!("{trace}");
    // The server granted T1 last (fence 2), and T0 returned after it.
    assert!(trace.contains("server: fence 2"), "{trace}");
    assert!(trace.contains("told lost (fence 2)"), "{trace}");
    assert!(steps <= 6, "{steps} steps");
    // The same re-grant leaves a task holding a superseded fence.
    assert!(r.path(CURRENT_GRANT).is_some());
}
