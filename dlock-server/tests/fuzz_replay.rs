//! The fuzz target's harness (`dlock_server::fuzzing::session`) run on
//! generated scripts in the ordinary test suite, so every `cargo test` does
//! a bounded piece of the fuzzer's work: raw bytes, and well-formed requests
//! of every type split at random points across connections.

mod common;

use dlock::codec::encode_frame;
use dlock::proto::{Request, RequestLock, RequestType};
use proptest::prelude::*;

/// fuzz/fuzz_targets/session.rs calls the harness with libFuzzer's input and
/// nothing else; CI does not compile that crate (it has its own dependency
/// tree), so its one assumption is kept here.
const _FUZZ_TARGET_CALLS: fn(&[u8]) = dlock_server::fuzzing::session;

/// A step of a script, before encoding.
#[derive(Debug, Clone)]
// A test's script of a few hundred steps: boxing would only add noise.
#[allow(clippy::large_enum_variant)]
enum Step {
    Bytes(u8, Vec<u8>),
    Request(u8, Request, usize),
    Close(u8),
    Tick,
}

fn request() -> impl Strategy<Value = Request> {
    let keys = prop::collection::vec(
        prop_oneof![
            8 => "[a-d]",
            1 => Just(String::new()),
            1 => "[a-z]{17}",
        ],
        0..10,
    );
    (
        prop_oneof![4 => Just(2u32), 1 => 0u32..4],
        any::<u64>(),
        prop_oneof![1 => 0i32..16, 1 => Just(12), 1 => Just(13), 1 => any::<i32>()],
        keys,
        prop_oneof![3 => Just(0u64), 1 => 1u64..20_000, 1 => any::<u64>()],
        prop_oneof![3 => Just(0u64), 1 => 1u64..20_000, 1 => any::<u64>()],
        any::<bool>(),
        prop_oneof![4 => Just(0u64), 1 => 1u64..100, 1 => any::<u64>()],
        // Owner ids in the harness are small: these hit its open sessions.
        prop_oneof![4 => Just(0u64), 1 => 1u64..16],
        // Which keys are shared (a bit each), under a limit that
        // disagrees now and then.
        (
            any::<u16>(),
            prop_oneof![2 => Just(0u32), 2 => 1u32..3, 1 => any::<u32>()],
            // A value now and then, once too long.
            prop_oneof![4 => Just(Vec::new()), 1 => prop::collection::vec(any::<u8>(), 1..4), 1 => Just(vec![0u8; 1025])],
        ),
        // Wait's ticket: request ids are small and count up from 1.
        prop_oneof![2 => Just(0u64), 2 => 1u64..40, 1 => any::<u64>()],
    )
        .prop_map(
            |(
                version,
                id,
                kind,
                keys,
                wait,
                lease,
                try_lock,
                fence,
                session,
                (mask, limit, value),
                ticket,
            )| {
                Request {
                    version,
                    id,
                    r#type: kind,
                    session,
                    lock: Some(RequestLock {
                        wait_micro: wait,
                        release_micro: lease,
                        shared_keys: keys
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| mask & (1 << i) != 0)
                            .map(|(_, k)| k.clone())
                            .collect(),
                        limit,
                        keys,
                        try_lock,
                        fence,
                        ticket,
                        value,
                    }),
                    ..Request::default()
                }
            },
        )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (any::<u8>(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(c, b)| Step::Bytes(c, b)),
        8 => (any::<u8>(), request(), any::<usize>())
            .prop_map(|(c, r, split)| Step::Request(c, r, split)),
        1 => any::<u8>().prop_map(Step::Close),
        1 => Just(Step::Tick),
    ]
}

/// Encodes steps in the harness's script format.
fn script(steps: &[Step]) -> Vec<u8> {
    fn feed(out: &mut Vec<u8>, conn: u8, bytes: &[u8]) {
        for chunk in bytes.chunks(255) {
            out.push(conn & 3);
            out.push(chunk.len() as u8);
            out.extend_from_slice(chunk);
        }
    }
    let mut out = Vec::new();
    for s in steps {
        match s {
            Step::Bytes(c, b) => feed(&mut out, *c, b),
            Step::Request(c, r, split) => {
                let mut frame = bytes::BytesMut::new();
                encode_frame(r, &mut frame);
                let at = split % (frame.len() + 1);
                feed(&mut out, *c, &frame[..at]);
                feed(&mut out, *c, &frame[at..]);
            }
            Step::Close(c) => out.push((c & 3) | (2 << 2)),
            Step::Tick => out.push(3 << 2),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::proptest_cases(2_000)))]

    #[test]
    fn generated_sessions_keep_every_rule(steps in prop::collection::vec(step(), 0..80)) {
        dlock_server::fuzzing::session(&script(&steps));
    }

    #[test]
    fn raw_bytes_keep_every_rule(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        dlock_server::fuzzing::session(&bytes);
    }
}

/// A request of `kind` for `keys`, naming `ticket`.
fn frame_request(id: u64, kind: RequestType, keys: &[&str], ticket: u64) -> Request {
    Request {
        version: 2,
        id,
        r#type: kind as i32,
        lock: Some(RequestLock {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ticket,
            ..RequestLock::default()
        }),
        ..Request::default()
    }
}

#[test]
fn a_grant_answered_after_a_later_grant_is_no_broken_fence() {
    // Connection 0 waits for k (a Lock, then an Enqueue collected by its
    // Wait); 1 releases k, granting it to 0; 2 takes j under a higher token
    // and is answered first. 0's grant is answered on its next step, with
    // the lower token: the harness must not take that for tokens going
    // backwards.
    for (ask, collect) in [
        (RequestType::Lock, None),
        (RequestType::Enqueue, Some(RequestType::Wait)),
    ] {
        let mut steps = vec![
            Step::Request(1, frame_request(1, RequestType::Lock, &["k"], 0), 0),
            Step::Request(0, frame_request(1, ask, &["k"], 0), 0),
            Step::Request(1, frame_request(2, RequestType::Unlock, &["k"], 0), 0),
            Step::Request(2, frame_request(1, RequestType::Lock, &["j"], 0), 0),
        ];
        if let Some(wait) = collect {
            steps.push(Step::Request(0, frame_request(2, wait, &[], 1), 0));
        }
        steps.push(Step::Request(
            0,
            frame_request(3, RequestType::Ping, &[], 0),
            0,
        ));
        dlock_server::fuzzing::session(&script(&steps));
    }
}
