//! Sessions: several owners on one connection (OpenSession, Request.session),
//! each holding and waiting apart from the others as separate connections do.

mod common;

use common::{in_session, status, TestClient, TestServer};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock_server::Config;

async fn call_in(c: &mut TestClient, kind: RequestType, keys: &[&str], session: u64) -> Response {
    c.call_in(kind, keys, session).await
}

async fn open_session(c: &mut TestClient) -> u64 {
    let req = c.request(RequestType::OpenSession, &[]);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert_ne!(r.session, 0, "a session id");
    assert_eq!(
        r.session_ttl_micro, 0,
        "a single server ties sessions to the connection"
    );
    r.session
}

async fn try_lock_in(c: &mut TestClient, session: u64, keys: &[&str]) -> Response {
    let mut req = c.lock_request(keys, 0, 0);
    if let Some(l) = req.lock.as_mut() {
        l.try_lock = true;
    }
    c.call(in_session(req, session)).await
}

async fn unlock_in(c: &mut TestClient, session: u64, keys: &[&str]) -> Response {
    let req = c.request(RequestType::Unlock, keys);
    c.call(in_session(req, session)).await
}

#[tokio::test]
async fn sessions_of_one_connection_exclude_each_other() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let (a, b) = (open_session(&mut c).await, open_session(&mut c).await);
    assert_ne!(a, b);

    let held = try_lock_in(&mut c, a, &["k"]).await;
    assert_eq!(status(&held), ResponseStatus::Ok);
    // The connection's own owner re-takes what it holds; another session
    // of the same connection is just another client.
    let r = try_lock_in(&mut c, b, &["k"]).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout, "{r:?}");
    assert_eq!(r.keys, ["k"]);
    let r = try_lock_in(&mut c, 0, &["k"]).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout, "{r:?}");

    // Releasing in one session never releases another's key.
    let r = unlock_in(&mut c, b, &["k"]).await;
    assert_eq!(status(&r), ResponseStatus::NotHeld, "{r:?}");
    let r = call_in(&mut c, RequestType::Inspect, &["k"], a).await;
    assert!(
        r.key_info[0].held_by_caller,
        "Inspect answers for the session: {r:?}"
    );
    assert_eq!(r.key_info[0].fence, held.fence);
    let r = call_in(&mut c, RequestType::Inspect, &["k"], b).await;
    assert!(!r.key_info[0].held_by_caller);

    let r = unlock_in(&mut c, a, &["k"]).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    let r = try_lock_in(&mut c, b, &["k"]).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert!(r.fence > held.fence);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_session_waits_in_fifo_order_with_other_connections() {
    let server = TestServer::start(Config::default()).await;
    let mut holder = TestClient::connect(server.addr).await;
    let mut first = TestClient::connect(server.addr).await;
    let mut c = TestClient::connect(server.addr).await;
    let mut observer = TestClient::connect(server.addr).await;
    let session = open_session(&mut c).await;

    let fence = holder.must_lock(&["k"]).await;
    let req = first.lock_request(&["k"], 0, 0);
    first.send(&req).await;
    observer.await_waiters("k", 1).await;
    let req = in_session(c.lock_request(&["k"], 0, 0), session);
    let second_id = req.id;
    c.send(&req).await;
    observer.await_waiters("k", 2).await;

    assert_eq!(status(&holder.unlock(&["k"]).await), ResponseStatus::Ok);
    let r = first.recv().await;
    assert_eq!(
        status(&r),
        ResponseStatus::Ok,
        "the earlier waiter first: {r:?}"
    );
    assert!(r.fence > fence);
    assert_eq!(
        observer.inspect("k").await.fence,
        r.fence,
        "the session still waits"
    );
    assert_eq!(status(&first.unlock(&["k"]).await), ResponseStatus::Ok);
    let r = c.recv().await;
    assert_eq!((r.request_id, status(&r)), (second_id, ResponseStatus::Ok));
    let info = observer.inspect("k").await;
    assert_eq!(info.fence, r.fence, "the session holds it");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn closing_a_session_or_the_connection_releases_its_keys() {
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let mut other = TestClient::connect(server.addr).await;
    let (a, b) = (open_session(&mut c).await, open_session(&mut c).await);
    assert_eq!(
        status(&try_lock_in(&mut c, a, &["x"]).await),
        ResponseStatus::Ok
    );
    assert_eq!(
        status(&try_lock_in(&mut c, b, &["y"]).await),
        ResponseStatus::Ok
    );

    let r = call_in(&mut c, RequestType::CloseSession, &[], a).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert_eq!(status(&other.try_lock(&["x"]).await), ResponseStatus::Ok);
    assert_eq!(
        status(&other.try_lock(&["y"]).await),
        ResponseStatus::AcquireTimeout
    );
    // A closed session is gone: nothing it names acts.
    let r = try_lock_in(&mut c, a, &["z"]).await;
    assert_eq!(status(&r), ResponseStatus::UnknownSession, "{r:?}");
    assert!(r.error_text.contains(&a.to_string()), "{}", r.error_text);

    drop(c);
    let r = other.lock(&["y"], 20_000_000, 0).await;
    assert_eq!(
        status(&r),
        ResponseStatus::Ok,
        "disconnect ends every session: {r:?}"
    );
    assert_eq!(status(&other.unlock(&["x", "y"]).await), ResponseStatus::Ok);
    other.await_empty_server().await;
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn sessions_are_checked_and_limited() {
    let server = TestServer::start(Config {
        max_sessions: 2,
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let mut other = TestClient::connect(server.addr).await;
    let theirs = open_session(&mut other).await;

    // Another connection's session, a made-up one: refused, nothing done.
    for session in [theirs, u64::MAX] {
        let r = try_lock_in(&mut c, session, &["k"]).await;
        assert_eq!(status(&r), ResponseStatus::UnknownSession, "{r:?}");
    }
    assert_eq!(other.inspect("k").await.fence, 0);

    open_session(&mut c).await;
    open_session(&mut c).await;
    let r = call_in(&mut c, RequestType::OpenSession, &[], 0).await;
    assert_eq!(status(&r), ResponseStatus::LimitReached, "{r:?}");
    assert!(
        r.error_text.contains("--max-sessions 2"),
        "{}",
        r.error_text
    );

    // A single server has nothing to resume, and the connection's own
    // owner is not a session to close.
    let r = call_in(&mut c, RequestType::OpenSession, &[], theirs).await;
    assert_eq!(status(&r), ResponseStatus::UnknownSession, "{r:?}");
    let r = call_in(&mut c, RequestType::CloseSession, &[], 0).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
    assert_eq!(status(&c.ping().await), ResponseStatus::Ok);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_single_server_ignores_request_numbers() {
    // Its sessions end with the connection, so nothing is ever sent again
    // to it: every request acts, numbered or not.
    let server = TestServer::start(Config::default()).await;
    let mut c = TestClient::connect(server.addr).await;
    let s = open_session(&mut c).await;
    let mut lock = c.lock_request(&["k"], 0, 0);
    lock.seq = 1;
    let lock = in_session(lock, s);
    let first = c.call(lock.clone()).await;
    assert_eq!(status(&first), ResponseStatus::Ok, "{first:?}");
    let again = dlock::proto::Request {
        id: c.next_id(),
        ..lock
    };
    let second = c.call(again).await;
    assert_eq!(status(&second), ResponseStatus::Ok, "{second:?}");
    assert!(second.fence > first.fence, "granted anew: {second:?}");
}

#[tokio::test]
async fn a_cluster_refuses_sessions_beyond_its_limit_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dlock_server::Config {
        data_dir: Some(dir.path().join("node1")),
        max_cluster_sessions: 2,
        ..dlock_server::Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let open = |c: &mut TestClient| c.request(RequestType::OpenSession, &[]);
    // A cluster of one answers once it has elected itself.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let first = loop {
        let req = open(&mut c);
        let r = c.call(req).await;
        if status(&r) == ResponseStatus::Ok {
            break r.session;
        }
        assert!(std::time::Instant::now() < deadline, "never a leader");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let req = open(&mut c);
    assert_eq!(status(&c.call(req).await), ResponseStatus::Ok);
    let req = open(&mut c);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::LimitReached);
    assert!(
        r.error_text.contains("--max-cluster-sessions 2"),
        "{}",
        r.error_text
    );
    let mut close = c.request(RequestType::CloseSession, &[]);
    close.session = first;
    assert_eq!(status(&c.call(close).await), ResponseStatus::Ok);
    let req = open(&mut c);
    assert_eq!(status(&c.call(req).await), ResponseStatus::Ok);
}

/// A durable node, a cluster of one, in a directory of its own (kept as
/// long as the node runs).
async fn cluster_of_one() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dlock_server::Config {
        data_dir: Some(dir.path().join("node1")),
        ..dlock_server::Config::default()
    })
    .await;
    (dir, server)
}

/// Sends the request `make` builds until the node, a cluster of one that
/// answers once it has elected itself, answers other than NotLeader.
async fn once_leading(c: &mut TestClient, make: impl Fn(&mut TestClient) -> Request) -> Response {
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        let req = make(c);
        let r = c.call(req).await;
        if status(&r) != ResponseStatus::NotLeader {
            return r;
        }
        assert!(std::time::Instant::now() < deadline, "never a leader");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_cluster_node_shows_the_address_of_the_sessions_attached_to_it() {
    // Which connection a session came through is the answering node's
    // knowledge: Inspect there names it, as a single server does.
    let (_dir, server) = cluster_of_one().await;
    let mut holder = TestClient::connect(server.addr).await;
    let r = once_leading(&mut holder, |c| c.lock_request(&["k"], 0, 0)).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let mut other = TestClient::connect(server.addr).await;
    let info = other.inspect("k").await;
    assert_eq!(
        info.holder_addr,
        holder.stream().local_addr().unwrap().to_string()
    );
    assert!(!info.held_by_caller);
    server.stop().await.expect("clean stop");
}

/// The leader's log once everything in it is applied: its last index.
async fn settled_log(c: &mut TestClient, at_least: u64) -> u64 {
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        let req = c.request(RequestType::ClusterStatus, &[]);
        let info = c.call(req).await.cluster.expect("a cluster status");
        if info.last_applied_index >= at_least && info.last_applied_index == info.last_log_index {
            return info.last_applied_index;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {info:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_ping_keeps_every_session_of_its_connection_alive_in_one_commit() {
    let (_dir, server) = cluster_of_one().await;
    let mut c = TestClient::connect(server.addr).await;
    // A TTL long enough that the connection's own keeper (a third of it
    // apart) stays quiet during the test: only the Ping keeps them alive.
    let open = |c: &mut TestClient| Request {
        session_ttl_micro: 60_000_000,
        ..c.request(RequestType::OpenSession, &[])
    };
    let r = once_leading(&mut c, open).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    for _ in 0..4 {
        let req = open(&mut c);
        assert_eq!(status(&c.call(req).await), ResponseStatus::Ok);
    }
    let before = settled_log(&mut c, 0).await;
    assert_eq!(status(&c.ping().await), ResponseStatus::Ok);
    let after = settled_log(&mut c, before + 1).await;
    assert_eq!(after, before + 1, "five sessions kept alive by one entry");
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_cluster_session_ttl_is_at_least_a_second_and_at_most_the_servers_ceiling() {
    let (_dir, server) = cluster_of_one().await;
    let mut c = TestClient::connect(server.addr).await;
    let open = |c: &mut TestClient, ttl_micro| Request {
        session_ttl_micro: ttl_micro,
        ..c.request(RequestType::OpenSession, &[])
    };
    // Refusals come before the cluster is asked, so no leader is needed;
    // the second opens once the node leads.
    for (ttl, says) in [(999_999, "shortest"), (301_000_000, "--max-session-ttl")] {
        let req = open(&mut c, ttl);
        let r = c.call(req).await;
        assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
        assert!(r.error_text.contains(says), "{}", r.error_text);
    }
    let r = once_leading(&mut c, |c| open(c, 1_000_000)).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert_eq!(r.session_ttl_micro, 1_000_000);
    server.stop().await.unwrap();
}
