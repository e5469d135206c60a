//! Lifetimes: disconnects, leases, fencing across restarts, idle and write
//! timeouts, server-wide limits, graceful shutdown.
//!
//! Timing tests run on real time but never sleep: they wait for an event
//! (a grant, a close) and check it did not come early. An upper bound would
//! make them flaky on a loaded machine; the wait limit of the event itself
//! (PATIENCE) catches a server that never acts.

mod common;

use common::{status, TestClient, TestServer};
use dlock::proto::{RequestType, ResponseStatus};
use dlock_server::Config;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn fin_releases_locks_and_hands_them_on() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["f"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["f"], 0, 0);
    w.send(&req).await;
    a.await_waiters("f", 1).await;
    a.stream().shutdown().await.unwrap();
    assert_eq!(status(&w.recv().await), ResponseStatus::Ok);
}

#[tokio::test]
async fn rst_releases_locks_and_hands_them_on() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["r"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["r"], 0, 0);
    w.send(&req).await;
    a.await_waiters("r", 1).await;
    // Linger 0 makes close send RST instead of FIN.
    socket2::SockRef::from(a.raw.stream())
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(a);
    assert_eq!(status(&w.recv().await), ResponseStatus::Ok);
}

#[tokio::test]
async fn waiter_that_disconnects_is_removed_and_never_granted() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["g"]).await;
    let mut gone = TestClient::connect(server.addr).await;
    let req = gone.lock_request(&["g"], 0, 0);
    gone.send(&req).await;
    let mut next = TestClient::connect(server.addr).await;
    let req = next.lock_request(&["g"], 0, 0);
    next.send(&req).await;
    h.await_waiters("g", 2).await;
    drop(gone);
    h.await_waiters("g", 1).await;
    h.unlock(&["g"]).await;
    let r = next.recv().await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let info = h.inspect("g").await;
    assert_eq!((info.fence, info.waiters), (r.fence, 0));
}

#[tokio::test]
async fn lease_expires_while_holder_is_connected() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let mut w = TestClient::connect(server.addr).await;
    // The stopwatch starts before the grant, so the lease ends no earlier
    // than 200 ms after it.
    let start = std::time::Instant::now();
    let r = a.lock(&["l"], 0, 200_000).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let r = w.lock(&["l"], 20_000_000, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "granted after {took:?}, before the lease ended"
    );
    let r = a.unlock(&["l"]).await;
    assert_eq!(
        (status(&r), r.keys),
        (ResponseStatus::NotHeld, vec!["l".to_string()])
    );
}

#[tokio::test]
async fn lease_survives_disconnect_until_it_expires() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let mut w = TestClient::connect(server.addr).await;
    let start = std::time::Instant::now();
    let r = a.lock(&["s"], 0, 300_000).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    drop(a);
    assert_eq!(
        status(&w.try_lock(&["s"]).await),
        ResponseStatus::AcquireTimeout
    );
    let r = w.lock(&["s"], 20_000_000, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "granted after {took:?}, before the lease ended"
    );
}

#[tokio::test]
async fn lease_lock_is_renewed_and_unlocked_by_fence_from_another_connection() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let fence = a.lock(&["job"], 0, 10_000_000).await.fence;
    drop(a);
    let mut b = TestClient::connect(server.addr).await;
    let mut renew = b.request(RequestType::Renew, &["job"]);
    renew.lock.as_mut().unwrap().release_micro = 600_000_000;
    renew.lock.as_mut().unwrap().fence = fence;
    assert_eq!(status(&b.call(renew).await), ResponseStatus::Ok);
    let info = b.inspect("job").await;
    assert!(
        info.lease_remaining_micro > 10_000_000,
        "lease moved: {info:?}"
    );
    assert_eq!(info.fence, fence);
    let mut wrong = b.request(RequestType::Unlock, &["job"]);
    wrong.lock.as_mut().unwrap().fence = fence + 1;
    let r = b.call(wrong).await;
    assert_eq!(
        (status(&r), r.keys),
        (ResponseStatus::NotHeld, vec!["job".to_string()])
    );
    let mut unlock = b.request(RequestType::Unlock, &["job"]);
    unlock.lock.as_mut().unwrap().fence = fence;
    assert_eq!(status(&b.call(unlock).await), ResponseStatus::Ok);
    TestClient::connect(server.addr)
        .await
        .must_lock(&["job"])
        .await;
}

#[tokio::test]
async fn renew_turns_a_connection_lock_into_a_lease() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["n"]).await;
    let mut renew = a.request(RequestType::Renew, &["n"]);
    renew.lock.as_mut().unwrap().release_micro = 60_000_000;
    assert_eq!(status(&a.call(renew).await), ResponseStatus::Ok);
    a.stream().shutdown().await.unwrap();
    a.expect_closed().await;
    let mut b = TestClient::connect(server.addr).await;
    assert_eq!(
        status(&b.try_lock(&["n"]).await),
        ResponseStatus::AcquireTimeout
    );
}

/// Restarts a server three times with `config`; every token must be above
/// every earlier one.
async fn assert_fences_increase_across_restarts(config: Config) -> u64 {
    let mut last = 0;
    for _ in 0..3 {
        let server = TestServer::start(config.clone()).await;
        let mut c = TestClient::connect(server.addr).await;
        for key in ["a", "b", "a"] {
            let f = c.lock(&[key], 0, 0).await.fence;
            assert!(f > last, "fence {f} not above {last}");
            last = f;
        }
        server.stop().await.unwrap();
    }
    last
}

#[tokio::test]
async fn fencing_tokens_increase_across_restarts_from_the_clock() {
    assert_fences_increase_across_restarts(Config::default()).await;
}

#[tokio::test]
async fn fencing_tokens_increase_across_restarts_with_a_fence_file() {
    let dir = tempfile::tempdir().unwrap();
    let fence_file = dir.path().join("fence");
    let last = assert_fences_increase_across_restarts(Config {
        fence_file: Some(fence_file.clone()),
        ..Config::default()
    })
    .await;
    let stored: u64 = std::fs::read_to_string(&fence_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        stored > last,
        "the fence file reserves tokens above every one issued"
    );
}

#[tokio::test]
async fn idle_connection_is_closed_and_its_locks_released() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_millis(300),
        ..Config::default()
    })
    .await;
    let mut idle = TestClient::connect(server.addr).await;
    // Measured from before the last request the idle client sends.
    let start = std::time::Instant::now();
    idle.must_lock(&["i"]).await;
    idle.expect_closed().await;
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(300), "closed after {took:?}");
    // Its lock went with it.
    let mut other = TestClient::connect(server.addr).await;
    other.must_lock(&["i"]).await;
}

#[tokio::test]
async fn pings_keep_a_waiting_connection_alive() {
    // Pings every 100 ms against a 2 s idle timeout: a stall would have to
    // last most of two seconds to drop the client.
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["hb"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["hb"], 0, 0);
    w.send(&lock).await;
    // Keep pinging for longer than the idle timeout while the Lock waits.
    // The pings are answered only after the Lock, but they count as activity.
    let mut ids = Vec::new();
    let mut interval = tokio::time::interval(Duration::from_millis(100));
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(2_500) {
        interval.tick().await;
        let p = w.request(RequestType::Ping, &[]);
        ids.push(p.id);
        w.send(&p).await;
        // The holder pings too, so it is not dropped either.
        assert_eq!(status(&h.ping().await), ResponseStatus::Ok);
    }
    assert_eq!(
        h.inspect("hb").await.waiters,
        1,
        "the waiting client was not dropped"
    );
    h.unlock(&["hb"]).await;
    assert_eq!(status(&w.recv().await), ResponseStatus::Ok);
    for id in ids {
        assert_eq!(w.recv().await.request_id, id);
    }
}

#[tokio::test]
async fn connection_limit_turns_extra_clients_away_with_a_status() {
    let server = TestServer::start(Config {
        max_connections: 2,
        ..Config::default()
    })
    .await;
    let mut a = TestClient::connect(server.addr).await;
    let mut b = TestClient::connect(server.addr).await;
    a.must_lock(&["c"]).await;
    b.ping().await;
    let mut extra = TestClient::connect(server.addr).await;
    let r = extra.recv().await;
    assert_eq!(status(&r), ResponseStatus::LimitReached);
    assert!(r.error_text.contains("too many connections"));
    extra.expect_closed().await;
    assert_eq!(status(&a.ping().await), ResponseStatus::Ok);
    // A slot frees once the server has seen a client leave; until then new
    // clients keep being turned away with the same status.
    drop(b);
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let mut c = TestClient::connect(server.addr).await;
        let ping = c.request(RequestType::Ping, &[]);
        c.send(&ping).await;
        let r = c.recv().await;
        if r.request_id == ping.id {
            assert_eq!(status(&r), ResponseStatus::Ok);
            break;
        }
        assert_eq!(status(&r), ResponseStatus::LimitReached);
        assert!(tokio::time::Instant::now() < deadline, "slot never freed");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn waiter_and_held_key_limits_give_limit_reached() {
    let server = TestServer::start(Config {
        max_waiters: 1,
        max_held_keys: 3,
        ..Config::default()
    })
    .await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["1", "2"]).await;
    let r = a.try_lock(&["3", "4"]).await;
    assert_eq!(status(&r), ResponseStatus::LimitReached);
    assert!(r.error_text.contains("held keys"));
    let mut w1 = TestClient::connect(server.addr).await;
    let req = w1.lock_request(&["1"], 0, 0);
    w1.send(&req).await;
    a.await_waiters("1", 1).await;
    let mut w2 = TestClient::connect(server.addr).await;
    let r = w2.lock(&["2"], 0, 0).await;
    assert_eq!(status(&r), ResponseStatus::LimitReached);
    assert!(r.error_text.contains("waiters"));
}

#[tokio::test]
async fn client_that_stops_reading_is_dropped_after_write_timeout() {
    let server = TestServer::start(Config {
        write_timeout: Duration::from_millis(200),
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    let mut flood = TestClient::connect(server.addr).await;
    flood.must_lock(&["w"]).await;
    // Pipeline pings without reading any answer until the server gives up.
    let mut burst = bytes::BytesMut::new();
    for id in 0..10_000u64 {
        dlock::codec::encode_frame(&common::request(id, RequestType::Ping, &[]), &mut burst);
    }
    let mut sent = 0usize;
    let closed = tokio::time::timeout(common::PATIENCE, async {
        for _ in 0..1_000 {
            if flood.raw.send_bytes(&burst).await.is_err() {
                return true;
            }
            sent += 10_000;
        }
        false
    })
    .await;
    assert_eq!(
        closed,
        Ok(true),
        "server kept the connection after {sent} requests"
    );
    // Other clients are served, and the dropped client's lock is released.
    let r = h.lock(&["w"], 20_000_000, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
}

#[tokio::test]
async fn shutdown_answers_waiters_and_stops() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["down"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["down"], 0, 0);
    let ping = w.request(RequestType::Ping, &[]);
    w.send(&lock).await;
    w.send(&ping).await;
    h.await_waiters("down", 1).await;
    server.stop().await.unwrap();
    let r = w.recv().await;
    assert_eq!(
        (r.request_id, status(&r)),
        (lock.id, ResponseStatus::ShuttingDown)
    );
    let r = w.recv().await;
    assert_eq!(
        (r.request_id, status(&r)),
        (ping.id, ResponseStatus::ShuttingDown)
    );
    w.expect_closed().await;
    h.expect_closed().await;
}

#[tokio::test]
async fn oversize_frame_behind_a_waiting_lock_answers_everything_then_closes() {
    let server = TestServer::start(Config {
        max_frame: 1024,
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["o"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["o"], 0, 0);
    let ping = w.request(RequestType::Ping, &[]);
    w.send(&lock).await;
    w.send(&ping).await;
    h.await_waiters("o", 1).await;
    w.send_raw(&4096u32.to_be_bytes()).await;
    let r = w.recv().await;
    assert_eq!(
        (r.request_id, status(&r)),
        (lock.id, ResponseStatus::FrameTooLarge)
    );
    let r = w.recv().await;
    assert_eq!(
        (r.request_id, status(&r)),
        (ping.id, ResponseStatus::FrameTooLarge)
    );
    let r = w.recv().await;
    assert_eq!(
        (r.request_id, status(&r)),
        (0, ResponseStatus::FrameTooLarge)
    );
    w.expect_closed().await;
    // The withdrawn Lock is never granted.
    h.await_waiters("o", 0).await;
}

#[tokio::test]
async fn holder_taking_one_more_key_is_not_deadlocked_by_a_waiter() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["x"]).await;
    let mut b = TestClient::connect(server.addr).await;
    let both = b.lock_request(&["x", "y"], 0, 0);
    b.send(&both).await;
    a.await_waiters("y", 1).await;
    // b waits for a's x; a asking for y must not queue behind b.
    a.must_lock(&["y"]).await;
    a.unlock(&["x", "y"]).await;
    assert_eq!(status(&b.recv().await), ResponseStatus::Ok);
}
