//! Wire-level conformance: framing, request types, statuses, validation.

mod common;

use bytes::BytesMut;
use common::{request, status, TestClient, TestServer};
use dlock::codec::encode_frame;
use dlock::proto::{Request, RequestLock, RequestType, ResponseStatus};
use dlock_server::Config;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn frame(req: &Request) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_frame(req, &mut b);
    b.to_vec()
}

#[tokio::test]
async fn ping_echoes_id_version_and_time() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let mut req = request(42, RequestType::Ping, &[]);
    req.version = 0; // proto3 clients that omit the version are accepted
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert_eq!((r.version, r.request_id), (2, 42));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (r.server_unix_time - now).abs() < 60 * 1_000_000_000,
        "server_unix_time is in nanoseconds"
    );
}

#[tokio::test]
async fn hello_states_the_limits_a_client_must_respect() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(7),
        max_lease: Duration::from_secs(3600),
        max_keys: 9,
        max_key_len: 33,
        max_pipeline: 17,
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let r = c.call(request(5, RequestType::Hello, &[])).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let limits = r.limits.expect("Hello is answered with limits");
    assert_eq!(limits.session_timeout_micro, 7_000_000);
    assert_eq!(limits.max_lease_micro, 3_600_000_000);
    assert_eq!((limits.max_keys, limits.max_key_len), (9, 33));
    assert_eq!((limits.max_frame, limits.max_pipeline), (16384, 17));
    // Other answers stay as small as before.
    assert!(c.ping().await.limits.is_none());
}

#[tokio::test]
async fn frame_split_into_single_bytes() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    for b in frame(&request(1, RequestType::Ping, &[])) {
        c.send_raw(&[b]).await;
        tokio::task::yield_now().await;
    }
    assert_eq!(c.recv().await.request_id, 1);
}

#[tokio::test]
async fn many_frames_in_one_write_answered_in_order() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    // Far more than the original server's 4 KB read buffer in one burst.
    let mut burst = Vec::new();
    for id in 1..=500u64 {
        let kind = if id % 2 == 0 {
            RequestType::Ping
        } else {
            RequestType::Inspect
        };
        burst.extend(frame(&request(id, kind, &["k"])));
    }
    c.send_raw(&burst).await;
    for id in 1..=500u64 {
        let r = c.recv().await;
        assert_eq!(r.request_id, id);
        assert_eq!(status(&r), ResponseStatus::Ok);
    }
}

#[tokio::test]
async fn oversize_length_gets_status_then_close() {
    let server = TestServer::start(Config {
        max_frame: 1024,
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let mut bytes = frame(&request(1, RequestType::Ping, &[]));
    bytes.extend_from_slice(&1025u32.to_be_bytes());
    c.send_raw(&bytes).await;
    assert_eq!(
        c.recv().await.request_id,
        1,
        "requests before the bad frame are answered"
    );
    let r = c.recv().await;
    assert_eq!(status(&r), ResponseStatus::FrameTooLarge);
    assert!(r.error_text.contains("1025"), "{}", r.error_text);
    c.expect_closed().await;
    // Other clients are unaffected.
    assert_eq!(
        status(&TestClient::connect(server.addr).await.ping().await),
        ResponseStatus::Ok
    );
}

#[tokio::test]
async fn garbage_body_gets_general_and_connection_survives() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let garbage = [0xffu8, 0xff, 0xff, 0xff, 0x0f, 0x07];
    let mut bytes = (garbage.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&garbage);
    c.send_raw(&bytes).await;
    let r = c.recv().await;
    assert_eq!(status(&r), ResponseStatus::General);
    assert!(!r.error_text.is_empty());
    assert_eq!(status(&c.ping().await), ResponseStatus::Ok);
}

#[tokio::test]
async fn unknown_and_unset_types_are_invalid() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let mut req = request(1, RequestType::Ping, &[]);
    req.r#type = 99;
    assert_eq!(status(&c.call(req).await), ResponseStatus::InvalidType);
    let req = request(2, RequestType::Invalid, &[]);
    assert_eq!(status(&c.call(req).await), ResponseStatus::InvalidType);
}

#[tokio::test]
async fn wrong_version_has_no_effect() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let mut req = request(1, RequestType::Lock, &["v"]);
    req.version = 3;
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Version);
    assert!(r.error_text.contains('3'));
    let mut other = TestClient::connect(server.addr).await;
    other.must_lock(&["v"]).await;
}

#[tokio::test]
async fn key_validation_statuses() {
    let server = TestServer::start(Config {
        max_keys: 3,
        max_key_len: 8,
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let cases: [(&[&str], ResponseStatus); 4] = [
        (&[], ResponseStatus::NoKeys),
        (&["a", ""], ResponseStatus::InvalidKey),
        (&["123456789"], ResponseStatus::InvalidKey),
        (&["a", "b", "c", "d"], ResponseStatus::TooManyKeys),
    ];
    for kind in [
        RequestType::Lock,
        RequestType::Unlock,
        RequestType::Renew,
        RequestType::Inspect,
    ] {
        for (keys, expected) in cases {
            if kind == RequestType::Inspect && keys.is_empty() {
                continue; // Inspect without keys asks for server stats.
            }
            let mut req = c.request(kind, keys);
            req.lock
                .get_or_insert_with(RequestLock::default)
                .release_micro = 1_000_000;
            let r = c.call(req).await;
            assert_eq!(status(&r), expected, "{kind:?} {keys:?}");
            assert!(!r.error_text.is_empty());
        }
    }
    // None of it took effect.
    let mut other = TestClient::connect(server.addr).await;
    other.must_lock(&["a", "b", "c"]).await;
    // Eight bytes is within the limit.
    c.must_lock(&["12345678"]).await;
}

#[tokio::test]
async fn contradictory_or_out_of_range_options_are_invalid_arguments() {
    let server = TestServer::start(Config {
        max_lease: Duration::from_secs(3600),
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let mut try_and_wait = c.lock_request(&["k"], 1_000, 0);
    try_and_wait.lock.as_mut().unwrap().try_lock = true;
    let mut fence_on_lock = c.lock_request(&["k"], 0, 0);
    fence_on_lock.lock.as_mut().unwrap().fence = 5;
    let long_lease = c.lock_request(&["k"], 0, 2 * 3_600 * 1_000_000);
    let renew_without_lease = c.request(RequestType::Renew, &["k"]);
    for req in [try_and_wait, fence_on_lock, long_lease, renew_without_lease] {
        let r = c.call(req).await;
        assert_eq!(
            status(&r),
            ResponseStatus::InvalidArgument,
            "{}",
            r.error_text
        );
    }
    assert_eq!(c.inspect("k").await.fence, 0, "nothing was locked");
}

#[tokio::test]
async fn huge_wait_means_no_limit_not_a_crash() {
    let server = TestServer::start(Config::default()).await;
    let mut holder = TestClient::connect(server.addr).await;
    holder.must_lock(&["k"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["k"], u64::MAX, 0);
    w.send(&req).await;
    holder.await_waiters("k", 1).await;
    holder.unlock(&["k"]).await;
    assert_eq!(status(&w.recv().await), ResponseStatus::Ok);
}

#[tokio::test]
async fn access_tokens_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, "s3cret\nother\n").unwrap();
    let server = TestServer::start(Config {
        token_file: Some(path.to_path_buf()),
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let r = c.ping().await;
    assert_eq!(status(&r), ResponseStatus::AccessDenied);
    let mut req = c.request(RequestType::Lock, &["t"]);
    req.access_token = "wrong".into();
    assert_eq!(status(&c.call(req).await), ResponseStatus::AccessDenied);
    let mut req = c.request(RequestType::Lock, &["t"]);
    req.access_token = "other".into();
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    // The denied Lock had no effect: the second one was granted, and the key
    // is now held by this connection.
    let mut req = c.request(RequestType::Inspect, &["t"]);
    req.access_token = "s3cret".into();
    assert!(c.call(req).await.key_info[0].held_by_caller);
}

#[tokio::test]
async fn inspect_reports_holder_lease_and_waiters() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let r = a.lock(&["i"], 0, 60_000_000).await;
    let mut b = TestClient::connect(server.addr).await;
    let req = b.lock_request(&["i"], 0, 0);
    b.send(&req).await;
    a.await_waiters("i", 1).await;
    let info = a.inspect("i").await;
    assert_eq!(info.fence, r.fence);
    assert!(info.held_by_caller);
    assert!(info.lease_remaining_micro > 0 && info.lease_remaining_micro <= 60_000_000);
    assert_eq!(
        info.holder_addr,
        a.stream().local_addr().unwrap().to_string()
    );
    let free = b.request(RequestType::Inspect, &["free"]);
    let mut probe = TestClient::connect(server.addr).await;
    let info = probe.call(free).await.key_info.remove(0);
    assert_eq!(
        (info.fence, info.waiters, info.held_by_caller),
        (0, 0, false)
    );
}

#[tokio::test]
async fn unlock_and_renew_report_keys_not_held() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["mine"]).await;
    let mut b = TestClient::connect(server.addr).await;
    b.must_lock(&["theirs"]).await;
    let r = a.unlock(&["mine", "theirs", "nobody"]).await;
    assert_eq!(status(&r), ResponseStatus::NotHeld);
    assert_eq!(r.keys, vec!["nobody".to_string(), "theirs".to_string()]);
    // "mine" was released anyway; "theirs" was not touched.
    assert_eq!(a.inspect("mine").await.fence, 0);
    assert!(b.inspect("theirs").await.held_by_caller);
    let mut renew = a.request(RequestType::Renew, &["theirs"]);
    renew.lock.as_mut().unwrap().release_micro = 1_000_000;
    let r = a.call(renew).await;
    assert_eq!(
        (status(&r), r.keys),
        (ResponseStatus::NotHeld, vec!["theirs".to_string()])
    );
}

#[tokio::test]
async fn inspect_without_keys_reports_server_stats() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let s = a.stats().await;
    assert_eq!((s.connections, s.held_keys, s.waiting_requests), (1, 0, 0));
    a.must_lock(&["s1", "s2"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["s1"], 0, 0);
    w.send(&req).await;
    a.await_waiters("s1", 1).await;
    let s = a.stats().await;
    assert_eq!((s.connections, s.held_keys, s.waiting_requests), (2, 2, 1));
    drop(w);
    drop(a);
    let mut c = TestClient::connect(server.addr).await;
    c.await_empty_server().await;
}

/// An Inspect without keys asking for busiest keys, as `dlock top` does.
fn overview(limit: u32) -> Request {
    let mut req = request(9, RequestType::Inspect, &[]);
    req.lock = Some(RequestLock {
        limit,
        ..RequestLock::default()
    });
    req
}

#[tokio::test]
async fn inspect_lists_the_busiest_keys_and_counts_grants_and_hand_offs() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    // The counters are the process's, which other tests share: compare
    // with what they were before.
    let before = a.stats().await;
    a.must_lock(&["quiet"]).await;
    a.must_lock(&["busy"]).await;
    a.must_lock(&["busier"]).await;
    let mut waiters = Vec::new();
    for key in ["busy", "busier", "busier"] {
        let mut w = TestClient::connect(server.addr).await;
        let req = w.lock_request(&[key], 0, 0);
        w.send(&req).await;
        waiters.push(w);
    }
    a.await_waiters("busier", 2).await;
    a.await_waiters("busy", 1).await;

    let stats = a.call(overview(2)).await.server_stats.unwrap();
    let top: Vec<(&str, u32, bool)> = stats
        .busiest
        .iter()
        .map(|i| (i.key.as_str(), i.waiters, i.held_by_caller))
        .collect();
    assert_eq!(top, [("busier", 2, true), ("busy", 1, true)]);
    assert!(stats.grants >= before.grants + 3, "{stats:?}");
    // The sessions count the owners that have asked for a lock: the holder
    // and its three waiters.
    assert_eq!(stats.sessions, 4);
    let all = a.call(overview(100)).await.server_stats.unwrap();
    assert_eq!(all.busiest.len(), 3, "the quiet key comes last");
    assert_eq!(all.busiest[2].key, "quiet");
    // A key's wait is its first waiter's: several round trips old by now.
    assert!(all.busiest[0].waited_micro > 0, "{:?}", all.busiest[0]);
    assert_eq!(all.busiest[2].waited_micro, 0);
    // A plain Inspect without keys lists none.
    assert!(a.stats().await.busiest.is_empty());

    // Releasing hands "busy" to its waiter: a grant after a wait.
    assert_eq!(status(&a.unlock(&["busy"]).await), ResponseStatus::Ok);
    assert_eq!(status(&waiters[0].recv().await), ResponseStatus::Ok);
    let after = a.stats().await;
    assert!(after.handoffs > before.handoffs, "{after:?}");
    assert!(after.grants >= before.grants + 4, "{after:?}");

    let r = a.call(overview(101)).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument);
    assert!(r.error_text.contains("at most 100"), "{}", r.error_text);
}
