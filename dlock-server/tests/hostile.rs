//! Arbitrary bytes and arbitrary well-formed requests against a live server
//! over TCP: no panic, no hang, every well-formed request answered in order,
//! and nothing left behind once the clients are gone.

mod common;

use common::{TestClient, TestServer, PATIENCE};
use dlock::proto::{Request, RequestLock, Response, ResponseStatus};
use dlock_server::Config;
use proptest::prelude::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// A request of any type whose answer cannot take long: Lock always has a
/// short wait limit or is a try, and leases are short or over the limit.
fn request() -> impl Strategy<Value = Request> {
    let keys = prop::collection::vec(
        prop_oneof![8 => "[a-e]", 1 => Just(String::new()), 1 => "[a-z]{40}"],
        0..6,
    );
    (
        prop_oneof![6 => Just(2u32), 1 => any::<u32>()],
        prop_oneof![1 => 0i32..15, 1 => any::<i32>()],
        keys,
        1u64..30_000,
        prop_oneof![3 => Just(0u64), 2 => 1u64..200_000, 1 => any::<u64>()],
        any::<bool>(),
        prop_oneof![4 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![6 => Just(String::new()), 1 => ".{0,8}"],
        // Which keys are shared (a bit each, and some names of no key),
        // under a limit that disagrees now and then.
        (
            any::<u8>(),
            prop_oneof![2 => Just(0u32), 2 => 1u32..3, 1 => any::<u32>()],
        ),
        // Wait's ticket: request ids are small and count up from 1.
        prop_oneof![2 => Just(0u64), 2 => 1u64..40, 1 => any::<u64>()],
    )
        .prop_map(
            |(version, kind, keys, wait, lease, try_lock, fence, token, (mask, limit), ticket)| {
                Request {
                    version,
                    id: 0,
                    access_token: token,
                    r#type: kind,
                    session: 0,
                    session_ttl_micro: 0,
                    lock: Some(RequestLock {
                        wait_micro: if try_lock { 0 } else { wait },
                        release_micro: lease,
                        shared_keys: keys
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| mask & (1 << i) != 0)
                            .map(|(_, k)| k.clone())
                            .chain((mask & 0x80 != 0).then(|| "z".to_owned()))
                            .collect(),
                        limit,
                        keys,
                        try_lock,
                        fence,
                        ticket,
                        // Values are the election tests' (a Watch with wait
                        // 0 would wait 10 minutes, so no Watch is sent here).
                        value: Vec::new(),
                    }),
                    ..Request::default()
                }
            },
        )
}

/// Reads responses until the server closes the connection; each must be a
/// valid frame holding a valid Response.
async fn drain(conn: &mut TestClient) -> Vec<Response> {
    let mut out = Vec::new();
    while let Some(r) = conn.try_recv().await {
        out.push(r);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::proptest_cases(48)))]

    #[test]
    fn arbitrary_bytes_never_break_the_server(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 1..8)
    ) {
        runtime().block_on(async {
            let server = TestServer::start(Config {max_frame: 512, ..Config::default() }).await;
            let mut c = TestClient::connect(server.addr).await;
            for chunk in &chunks {
                // The server may already have closed on an oversize length.
                if c.raw.send_bytes(chunk).await.is_err() {
                    break;
                }
            }
            let _ = c.stream().shutdown().await;
            drain(&mut c).await;
            let mut control = TestClient::connect(server.addr).await;
            control.ping().await;
            control.await_empty_server().await;
        });
    }

    #[test]
    fn every_well_formed_request_is_answered_in_order(
        batches in prop::collection::vec(prop::collection::vec(request(), 1..24), 1..4)
    ) {
        runtime().block_on(async {
            let server = TestServer::start(Config {max_lease: Duration::from_secs(1), max_key_len: 32, ..Config::default() }).await;
            let mut conns = Vec::new();
            for batch in &batches {
                let mut c = TestClient::connect(server.addr).await;
                let mut ids = Vec::new();
                let mut frames = bytes::BytesMut::new();
                for req in batch {
                    let mut req = req.clone();
                    req.id = c.next_id();
                    ids.push(req.id);
                    dlock::codec::encode_frame(&req, &mut frames);
                }
                // All of a connection's requests in one pipelined write.
                c.send_raw(&frames).await;
                conns.push((c, ids));
            }
            for (c, ids) in &mut conns {
                for &id in ids.iter() {
                    let r = tokio::time::timeout(PATIENCE, c.recv()).await.expect("answered");
                    assert_eq!(r.request_id, id, "answers in request order");
                    // Queued is not a failure: an Enqueue waits in line,
                    // and the answer carries its ticket and place.
                    let queued = r.status == ResponseStatus::Queued as i32 && r.ticket != 0;
                    assert!(
                        r.status == 0 || queued || !r.error_text.is_empty(),
                        "a failure names its cause: {r:?}"
                    );
                }
            }
            drop(conns);
            let mut control = TestClient::connect(server.addr).await;
            control.await_empty_server().await;
        });
    }
}
