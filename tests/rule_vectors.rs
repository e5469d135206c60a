//! The client rules' shared test vectors: `clients/conformance/rules.json`
//! holds inputs and the answers of `dlock::rules` (src/rules.rs), the one
//! written form of the rules. The Python, Go and TypeScript clients run the
//! same file against their own code, so a rule changed in one client and not
//! in the others fails somewhere.
//!
//! This test fails when the file no longer matches the rules; after a
//! deliberate change, write it again with
//! `DLOCK_WRITE_RULE_VECTORS=1 cargo test --test rule_vectors` and commit it.

use dlock::proto::{RequestType, ResponseStatus};
use dlock::rules::{self, Hold};
use dlock::Disconnect;
use serde_json::{json, Value};
use std::time::Duration;

const FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/clients/conformance/rules.json"
);

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("test durations fit")
}

fn d(micros: u64) -> Duration {
    Duration::from_micros(micros)
}

/// Every value of a proto enum, by trying each number up to 255.
fn every<E: TryFrom<i32>>() -> Vec<E> {
    (0..256).filter_map(|n| E::try_from(n).ok()).collect()
}

/// Durations that reach the rules' edges: zero, a microsecond, the
/// windows a client meets (a session TTL, leases short and long), and
/// values whose 0.1 % is not a whole microsecond.
const WINDOWS: [u64; 8] = [
    0,
    1,
    999,
    1_000,
    1_999,
    400_000,
    10_000_000,
    2_592_000_000_000,
];

fn deadlines() -> Value {
    let cases: Vec<Value> = [0u64, 7, 1_000_000]
        .iter()
        .flat_map(|&sent| {
            WINDOWS.iter().map(move |&w| {
                json!({"sent_us": sent, "window_us": w,
                       "deadline_us": us(rules::deadline(d(sent), d(w)))})
            })
        })
        .collect();
    Value::Array(cases)
}

fn margins() -> Value {
    let configured = [0u64, 500_000, 2_000_000];
    let cases: Vec<Value> = configured
        .iter()
        .flat_map(|&c| {
            WINDOWS.iter().map(move |&w| {
                json!({"configured_us": c, "window_us": w,
                       "margin_us": us(rules::margin(d(c), d(w)))})
            })
        })
        .collect();
    Value::Array(cases)
}

fn jeopardy() -> Value {
    let deadline = 10_000_000u64;
    let cases: Vec<Value> = [
        0u64, 7_999_999, 8_000_000, 8_000_001, 10_000_000, 12_000_000,
    ]
    .iter()
    .map(|&now| {
        let margin = 2_000_000;
        json!({"now_us": now, "deadline_us": deadline, "margin_us": margin,
                   "jeopardy": rules::in_jeopardy(d(now), d(deadline), d(margin))})
    })
    .collect();
    Value::Array(cases)
}

fn answers() -> Value {
    let mut cases = Vec::new();
    for on_session in [false, true] {
        for kind in every::<RequestType>() {
            for status in every::<ResponseStatus>() {
                cases.push(json!({
                    "on_session": on_session,
                    "kind": kind.as_str_name(),
                    "status": status.as_str_name(),
                    "moves_deadline": rules::moves_deadline(on_session, kind, status),
                }));
            }
        }
    }
    Value::Array(cases)
}

/// What `rules::elsewhere` means, named for every client: `null` (acted on
/// here), `session_ended`, `not_leader` (with the leader it named, if
/// any) or `no_quorum`.
fn elsewhere() -> Value {
    let mut cases = Vec::new();
    for status in every::<ResponseStatus>() {
        for leader in [None, Some("127.0.0.1:7437".to_string())] {
            let (means, named) = match rules::elsewhere(status, leader.clone()) {
                None => (Value::Null, Value::Null),
                Some(Disconnect::SessionEnded) => (json!("session_ended"), Value::Null),
                Some(Disconnect::NotLeader { leader }) => (json!("not_leader"), json!(leader)),
                Some(Disconnect::NoQuorum) => (json!("no_quorum"), Value::Null),
                Some(other) => panic!("rules::elsewhere gave {other:?}, unknown to the vectors"),
            };
            cases.push(json!({"status": status.as_str_name(), "leader": leader,
                              "means": means, "moves_to": named}));
        }
    }
    Value::Array(cases)
}

fn kinds() -> Value {
    let cases: Vec<Value> = every::<RequestType>()
        .into_iter()
        .map(|kind| {
            let (owned, numbered) = rules::session_use(kind);
            json!({"kind": kind.as_str_name(), "acts_for_session": owned,
                   "numbered": numbered, "may_wait": rules::may_wait(kind)})
        })
        .collect();
    Value::Array(cases)
}

fn unanswered() -> Value {
    let ttl = 10_000_000u64;
    let mut cases = Vec::new();
    for kind in every::<RequestType>() {
        for waited in [0u64, 4_999_999, 5_000_000, 60_000_000] {
            cases.push(
                json!({"kind": kind.as_str_name(), "waited_us": waited, "ttl_us": ttl,
                "too_long": rules::unanswered_too_long(kind, d(waited), d(ttl))}),
            );
        }
    }
    Value::Array(cases)
}

fn session_lives() -> Value {
    let cases: Vec<Value> = [(1_000u64, 5_000u64), (5_000, 1_000), (3_000, 3_000)]
        .iter()
        .map(|&(acked, broke)| {
            let ttl = 10_000_000;
            json!({"acked_us": acked, "broke_us": broke, "ttl_us": ttl,
                   "until_us": us(rules::session_lives_until(d(acked), d(broke), d(ttl)))})
        })
        .collect();
    Value::Array(cases)
}

/// One step of a hold's life in the vectors.
enum Step {
    Sent(u64, u64),
    Answered(u64, u64),
}

/// Lives of a lock: granted, renewals sent and answered (or not), then the
/// deadline, the lease known, the margin's window and the keeper's next
/// renewal (`Hold::renewal`).
fn holds() -> Value {
    use Step::{Answered, Sent};
    let lives: Vec<(&str, Option<u64>, Vec<Step>)> = vec![
        ("a lease, untouched", Some(30_000_000), vec![]),
        ("bound to its owner, untouched", None, vec![]),
        (
            "a lease renewed and answered",
            Some(30_000_000),
            vec![
                Sent(10_000_000, 30_000_000),
                Answered(10_000_000, 30_000_000),
            ],
        ),
        (
            "a renewal to a shorter lease, answer lost",
            Some(30_000_000),
            vec![Sent(10_000_000, 1_000_000)],
        ),
        (
            "a renewal to a longer lease, answer lost",
            Some(30_000_000),
            vec![Sent(10_000_000, 60_000_000)],
        ),
        (
            "the first Renew of a lock without a lease, answer lost",
            None,
            vec![Sent(6_000_000, 1_000_000)],
        ),
        (
            "the first Renew of a lock without a lease, answered",
            None,
            vec![Sent(6_000_000, 1_000_000), Answered(6_000_000, 1_000_000)],
        ),
        (
            "a later renewal answered supersedes an earlier one unanswered",
            Some(30_000_000),
            vec![
                Sent(10_000_000, 2_000_000),
                Sent(11_000_000, 30_000_000),
                Answered(11_000_000, 30_000_000),
            ],
        ),
        (
            "an earlier renewal answered does not supersede a later one unanswered",
            Some(30_000_000),
            vec![
                Sent(10_000_000, 30_000_000),
                Sent(11_000_000, 2_000_000),
                Answered(10_000_000, 30_000_000),
            ],
        ),
        (
            "two renewals sent at one instant: the first answer clears only itself",
            Some(30_000_000),
            vec![
                Sent(10_000_000, 4_000_000),
                Sent(10_000_000, 2_000_000),
                Answered(10_000_000, 4_000_000),
            ],
        ),
        (
            "an answer before the last renewal's keeps the bound of those still in flight",
            Some(30_000_000),
            vec![
                Sent(1_000_000, 2_000_000),
                Sent(2_000_000, 30_000_000),
                Sent(3_000_000, 5_000_000),
                Answered(1_000_000, 2_000_000),
                Answered(2_000_000, 30_000_000),
            ],
        ),
        (
            "answers that come out of order: the latest sent is in force",
            Some(30_000_000),
            vec![
                Sent(10_000_000, 30_000_000),
                Sent(11_000_000, 5_000_000),
                Answered(11_000_000, 5_000_000),
                Answered(10_000_000, 30_000_000),
            ],
        ),
    ];
    let owner_acked = 5_000_000u64;
    let owner_timeout = 10_000_000u64;
    let cases: Vec<Value> = lives
        .into_iter()
        .map(|(name, lease, steps)| {
            let mut hold = Hold::granted(Duration::ZERO, lease.map(d));
            let mut shown = Vec::new();
            for step in &steps {
                match *step {
                    Sent(t, l) => {
                        hold.renew_sent(d(t), d(l));
                        shown.push(json!({"renew_sent": {"sent_us": t, "lease_us": l}}));
                    }
                    Answered(t, l) => {
                        hold.renew_answered(d(t), d(l));
                        shown.push(json!({"renew_answered": {"sent_us": t, "lease_us": l}}));
                    }
                }
            }
            json!({
                "name": name,
                "granted": {"sent_us": 0, "lease_us": lease},
                "steps": shown,
                "owner_acked_us": owner_acked,
                "owner_timeout_us": owner_timeout,
                "deadline_us": us(hold.deadline(d(owner_acked), d(owner_timeout))),
                "lease_us": hold.lease.map(|(_, l)| us(l)),
                "window_us": us(hold.window(d(owner_timeout))),
                // In nanoseconds: a third of a lease is seldom whole
                // microseconds, and every client computes it in nanoseconds.
                "renewal": hold.renewal().map(|(at, lease)| json!({
                    "at_ns": u64::try_from(at.as_nanos()).expect("test times fit"),
                    "lease_us": us(lease),
                })),
            })
        })
        .collect();
    Value::Array(cases)
}

/// The silent-node probe's limit (`rules::silence_limit`) for election
/// timeouts as a node states them (`null`: it states none; `0` too, as the
/// wire's 0 reads, though the rule is given it here as a stated 0), from a
/// microsecond to absurd ones (the wire's largest), against TTLs from none through
/// ones so short that only the floor is left, to a month.
fn silence_limits() -> Value {
    let elections = [
        None,
        Some(0u64),
        Some(1),
        Some(100_000),
        Some(200_000),
        Some(500_000),
        Some(700_000),
        Some(1_000_000),
        Some(10_000_000),
        // 127 years: thrice it overflows 64-bit nanoseconds (Go's
        // time.Duration) into a negative.
        Some(4_000_000_000_000_000),
        Some(u64::MAX),
    ];
    let ttls = [
        0u64,
        1,
        999,
        400_000,
        999_999,
        1_000_000,
        1_000_001,
        3_000_000,
        4_000_000,
        6_000_000,
        10_000_000,
        60_000_000,
        2_592_000_000_000,
    ];
    let cases: Vec<Value> = elections
        .iter()
        .flat_map(|&election| {
            ttls.iter().map(move |&ttl| {
                json!({"election_timeout_us": election, "ttl_us": ttl,
                       "limit_us": us(rules::silence_limit(election.map(d), d(ttl)))})
            })
        })
        .collect();
    Value::Array(cases)
}

/// Whether a link has gone silent (`rules::gone_silent`): last heard
/// from its node at a few moments, against limits from none through the
/// floor and the usual ones, and moments just before, at and after the
/// limit runs out (and before the link last heard, as a clock read
/// earlier may be).
fn gone_silent() -> Value {
    let cases: Vec<Value> = [0u64, 7, 1_000_000]
        .iter()
        .flat_map(|&heard| {
            [0u64, 1, 250_000, 1_500_000, 2_500_000]
                .iter()
                .flat_map(move |&limit| {
                    let end = heard + limit;
                    let nows: std::collections::BTreeSet<u64> = [
                        0,
                        heard,
                        end.saturating_sub(1),
                        end,
                        end + 1,
                        end + 3_000_000,
                    ]
                    .into();
                    nows.into_iter().map(move |now| {
                        json!({"last_heard_us": heard, "now_us": now, "limit_us": limit,
                               "gone": rules::gone_silent(d(heard), d(now), d(limit))})
                    })
                })
        })
        .collect();
    Value::Array(cases)
}

fn vectors() -> Value {
    json!({
        "about": "Test vectors of the dlock client rules, written by tests/rule_vectors.rs from src/rules.rs; every client runs them (docs/CLIENTS.md). Times and durations in microseconds; kinds and statuses by their names in proto/dlock.proto.",
        "clock_rate_bound": dlock::safety::CLOCK_RATE_BOUND,
        "deadline": deadlines(),
        "margin": margins(),
        "in_jeopardy": jeopardy(),
        "moves_deadline": answers(),
        "elsewhere": elsewhere(),
        "kinds": kinds(),
        "unanswered_too_long": unanswered(),
        "session_lives_until": session_lives(),
        "holds": holds(),
        "silence_limits": silence_limits(),
        "gone_silent": gone_silent(),
    })
}

#[test]
fn the_shared_vectors_are_the_rules_answers() {
    let text = serde_json::to_string_pretty(&vectors()).expect("vectors encode") + "\n";
    if std::env::var_os("DLOCK_WRITE_RULE_VECTORS").is_some() {
        std::fs::write(FILE, &text).expect("rules.json is writable");
    }
    let on_disk = std::fs::read_to_string(FILE).unwrap_or_default();
    assert!(
        on_disk == text,
        "{FILE} does not match src/rules.rs; after a deliberate change run \
         DLOCK_WRITE_RULE_VECTORS=1 cargo test --test rule_vectors and commit the file"
    );
}
