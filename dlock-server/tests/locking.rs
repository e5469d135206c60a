//! Lock semantics over TCP: atomicity, FIFO, no overtaking, no deadlock,
//! waiting, try-lock, pipelining order.

mod common;

use common::{status, timed, TestClient, TestServer};
use dlock::proto::{RequestType, ResponseStatus};
use dlock_server::Config;
use std::time::Duration;

#[tokio::test]
async fn multi_key_lock_is_all_or_nothing() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["k2"]).await;
    let mut b = TestClient::connect(server.addr).await;
    let r = b.try_lock(&["k1", "k2", "k3"]).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    assert_eq!(r.keys, vec!["k2".to_string()]);
    // Neither k1 nor k3 was taken by the failed request.
    let mut c = TestClient::connect(server.addr).await;
    c.must_lock(&["k1", "k3"]).await;
}

#[tokio::test]
async fn duplicate_keys_are_folded_and_relock_is_granted() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let f1 = a.must_lock(&["d", "d", "d"]).await;
    // dlock compatibility: the holder locking again succeeds at once.
    let f2 = a.must_lock(&["d", "e"]).await;
    assert!(f2 > f1);
    assert_eq!(a.inspect("d").await.fence, f2);
    assert_eq!(status(&a.unlock(&["d", "e"]).await), ResponseStatus::Ok);
}

#[tokio::test]
async fn waiters_are_granted_in_fifo_order() {
    let server = TestServer::start(Config::default()).await;
    let mut holder = TestClient::connect(server.addr).await;
    holder.must_lock(&["q"]).await;
    let mut waiters = Vec::new();
    for i in 0..8u32 {
        let mut w = TestClient::connect(server.addr).await;
        let req = w.lock_request(&["q"], 0, 0);
        w.send(&req).await;
        // Each waiter is queued before the next one asks.
        holder.await_waiters("q", i + 1).await;
        waiters.push(w);
    }
    holder.unlock(&["q"]).await;
    let mut last = 0;
    for w in &mut waiters {
        let r = w.recv().await;
        assert_eq!(status(&r), ResponseStatus::Ok);
        assert!(r.fence > last);
        last = r.fence;
        // Nobody behind was granted while this one holds the key.
        assert_eq!(holder.inspect("q").await.fence, r.fence);
        assert_eq!(status(&w.unlock(&["q"]).await), ResponseStatus::Ok);
    }
    assert_eq!(holder.inspect("q").await.fence, 0);
}

#[tokio::test]
async fn single_key_requests_do_not_overtake_a_multi_key_waiter() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["a"]).await;
    let mut multi = TestClient::connect(server.addr).await;
    let req = multi.lock_request(&["a", "b"], 0, 0);
    multi.send(&req).await;
    h.await_waiters("b", 1).await;
    // "b" is free, but the multi-key request asked first.
    let mut single = TestClient::connect(server.addr).await;
    assert_eq!(
        status(&single.try_lock(&["b"]).await),
        ResponseStatus::AcquireTimeout
    );
    let req = single.lock_request(&["b"], 0, 0);
    single.send(&req).await;
    h.await_waiters("b", 2).await;
    h.unlock(&["a"]).await;
    let granted = multi.recv().await;
    assert_eq!(status(&granted), ResponseStatus::Ok);
    assert_eq!(h.inspect("b").await.fence, granted.fence);
    multi.unlock(&["a", "b"]).await;
    assert_eq!(status(&single.recv().await), ResponseStatus::Ok);
}

#[tokio::test]
async fn overlapping_key_sets_do_not_deadlock() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["x", "y", "z"]).await;
    let sets: [&[&str]; 4] = [&["x", "y"], &["y", "x"], &["z", "x"], &["y", "z"]];
    let mut clients = Vec::new();
    for keys in sets {
        let mut c = TestClient::connect(server.addr).await;
        let req = c.lock_request(keys, 0, 0);
        c.send(&req).await;
        clients.push((c, keys));
    }
    h.await_waiters("x", 3).await;
    h.await_waiters("y", 3).await;
    h.await_waiters("z", 2).await;
    h.unlock(&["x", "y", "z"]).await;
    // Every client gets its keys in turn; each releases when granted.
    let mut tasks = Vec::new();
    for (mut c, keys) in clients {
        tasks.push(tokio::spawn(async move {
            let r = c.recv().await;
            assert_eq!(status(&r), ResponseStatus::Ok);
            assert_eq!(status(&c.unlock(keys).await), ResponseStatus::Ok);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for k in ["x", "y", "z"] {
        let info = h.inspect(k).await;
        assert_eq!((info.fence, info.waiters), (0, 0));
    }
}

#[tokio::test]
async fn wait_limit_reports_busy_keys() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["busy"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let (r, took) = timed(w.lock(&["busy", "free"], 100_000, 0)).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    assert_eq!(r.keys, vec!["busy".to_string()]);
    assert!(
        took >= Duration::from_millis(100),
        "answered after {took:?}"
    );
    // The timed-out request left nothing behind.
    let info = h.inspect("free").await;
    assert_eq!((info.fence, info.waiters), (0, 0));
    assert_eq!(h.inspect("busy").await.waiters, 0);
}

#[tokio::test]
async fn wait_zero_waits_without_limit_and_try_lock_not_at_all() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["k"]).await;
    let mut t = TestClient::connect(server.addr).await;
    let (r, _) = timed(t.try_lock(&["k"])).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    assert_eq!(r.keys, vec!["k".to_string()]);
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["k"], 0, 0);
    w.send(&req).await;
    h.await_waiters("k", 1).await;
    h.unlock(&["k"]).await;
    let r = w.recv().await;
    assert_eq!((status(&r), r.request_id), (ResponseStatus::Ok, req.id));
}

#[tokio::test]
async fn requests_behind_a_waiting_lock_run_after_it_in_order() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["p"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["p"], 0, 0);
    let ping1 = w.request(RequestType::Ping, &[]);
    let inspect = w.request(RequestType::Inspect, &["p"]);
    let ping2 = w.request(RequestType::Ping, &[]);
    for r in [&lock, &ping1, &inspect, &ping2] {
        w.send(r).await;
    }
    h.await_waiters("p", 1).await;
    assert_eq!(h.ping().await.status, 0);
    h.unlock(&["p"]).await;
    let r = w.recv().await;
    assert_eq!((r.request_id, status(&r)), (lock.id, ResponseStatus::Ok));
    assert_eq!(w.recv().await.request_id, ping1.id);
    let r = w.recv().await;
    assert_eq!(r.request_id, inspect.id);
    // The Inspect ran after the Lock took effect.
    assert!(r.key_info[0].held_by_caller);
    assert_eq!(w.recv().await.request_id, ping2.id);
}

#[tokio::test]
async fn pipeline_limit_pauses_reading_without_losing_requests() {
    let server = TestServer::start(Config {
        max_pipeline: 4,
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["pl"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["pl"], 0, 0);
    w.send(&lock).await;
    let mut ids = vec![lock.id];
    for _ in 0..50 {
        let p = w.request(RequestType::Ping, &[]);
        ids.push(p.id);
        w.send(&p).await;
    }
    h.await_waiters("pl", 1).await;
    h.unlock(&["pl"]).await;
    for id in ids {
        assert_eq!(w.recv().await.request_id, id);
    }
}

#[tokio::test]
async fn large_requests_parked_behind_a_lock_are_all_answered() {
    let server = TestServer::start(Config {
        max_frame: 1024,
        max_key_len: 1000,
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["big"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let lock = w.lock_request(&["big"], 0, 0);
    // Far more bytes than the server parks per connection, written by a
    // separate task: the server stops reading at its cap, and the writer
    // must not hold up the holder's unlock below.
    let long_key = "k".repeat(900);
    let mut burst = bytes::BytesMut::new();
    dlock::codec::encode_frame(&lock, &mut burst);
    let mut ids = vec![lock.id];
    for _ in 0..100 {
        let r = w.request(RequestType::Inspect, &[&long_key]);
        ids.push(r.id);
        dlock::codec::encode_frame(&r, &mut burst);
    }
    let (rd, mut wr) = w.raw.into_stream().into_split();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        wr.write_all(&burst).await.unwrap();
        wr
    });
    h.await_waiters("big", 1).await;
    h.unlock(&["big"]).await;
    let mut rd = dlock::raw::RawClient::new(rd).with_max_frame(1 << 20);
    for id in ids {
        let r = tokio::time::timeout(common::PATIENCE, rd.recv())
            .await
            .expect("answered in time")
            .expect("a response");
        assert_eq!((r.request_id, status(&r)), (id, ResponseStatus::Ok));
    }
    writer.await.unwrap();
}
