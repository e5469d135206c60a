//! The silent-node probe over the client–session model: a leader may pause
//! at any moment, and a client on it that has heard nothing from it for the
//! probe's limit (`dlock::rules::silence_limit`, `gone_silent`) breaks off
//! and resumes its session at the other node, while the session can still
//! be resumed (`SessionModel::probe_in_time`). Without the limit's cap of
//! a quarter TTL the client waits out its session. Each test prints its
//! counts (`cargo test -p dlock-model --test probe -- --nocapture`), which
//! docs/RELIABILITY.md quotes.

use dlock_model::check::{find, run, Report};
use dlock_model::model::{ONE_BELIEVER, PROBE_IN_TIME, RESUMED_AFTER_SILENCE};
use dlock_model::trace::timeline;
use dlock_model::{Bug, Config, SessionModel};
use std::time::Duration;

fn say(what: &str, r: &Report) {
    eprintln!(
        "{what}: {} states ({} distinct), depth {}, {:.1?}",
        r.states, r.unique, r.depth, r.took
    );
}

#[test]
fn a_client_on_a_paused_leader_breaks_off_while_its_session_can_still_be_resumed() {
    let cfg = Config::probe();
    // The limit is the capped one: a quarter of the 4 s TTL.
    assert_eq!(cfg.silence_limit(), Duration::from_secs(1));
    let r = run(cfg.clone(), false);
    say("the probe, every interleaving", &r);
    for property in [ONE_BELIEVER, PROBE_IN_TIME] {
        if let Some(path) = r.path(property) {
            let trace = timeline(&SessionModel::new(cfg), path.clone());
            panic!("{property} broken:\n{trace}");
        }
    }
    // Not vacuous: a client breaks off and resumes its session elsewhere.
    assert!(r.path(RESUMED_AFTER_SILENCE).is_some(), "never resumed");
}

#[test]
fn a_probe_limit_without_its_quarter_ttl_cap_outlasts_the_session() {
    let cfg = Config::probe().with_bug(Bug::SilenceUncapped);
    assert_eq!(cfg.silence_limit(), Duration::from_secs(6));
    let model = SessionModel::new(cfg);
    let r = find(model.clone(), PROBE_IN_TIME);
    let Some(path) = r.path(PROBE_IN_TIME) else {
        panic!("no counterexample within the bound ({} states)", r.unique);
    };
    let steps = path.clone().into_actions().len();
    say(&format!("counterexample in {steps} steps"), &r);
    let trace = timeline(&model, path.clone());
    eprintln!("{trace}");
    assert!(trace.contains("pauses"), "{trace}");
    assert!(trace.contains("time passes to 4.000s"), "{trace}");
    assert!(steps <= 6, "{steps} steps");
}
