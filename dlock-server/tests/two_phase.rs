//! Two-phase acquire over TCP (issue 17, part 5): Enqueue answers at once,
//! granted or queued with a ticket and a place in line; Wait collects the
//! queued request's outcome. The queued request keeps its FIFO place, is
//! withdrawn on disconnect, and works for multi-key and shared requests.

mod common;

use common::{status, timed, TestClient, TestServer};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock_server::Config;
use std::time::Duration;

/// An Enqueue for `keys` with a wait limit and a lease in microseconds.
fn enqueue_request(c: &mut TestClient, keys: &[&str], wait_micro: u64, lease: u64) -> Request {
    let mut r = c.lock_request(keys, wait_micro, lease);
    r.r#type = RequestType::Enqueue as i32;
    r
}

async fn enqueue(c: &mut TestClient, keys: &[&str], wait_micro: u64, lease: u64) -> Response {
    let r = enqueue_request(c, keys, wait_micro, lease);
    c.call(r).await
}

/// Enqueues `keys`, which must be busy; returns the ticket and the place.
async fn must_queue(c: &mut TestClient, keys: &[&str]) -> (u64, u32) {
    let r = enqueue(c, keys, 0, 0).await;
    assert_eq!(status(&r), ResponseStatus::Queued, "{r:?}");
    assert!(r.ticket > 0 && r.fence == 0, "{r:?}");
    (r.ticket, r.place)
}

fn wait_request(c: &mut TestClient, ticket: u64) -> Request {
    let mut r = c.request(RequestType::Wait, &[]);
    r.lock.get_or_insert_with(Default::default).ticket = ticket;
    r
}

#[tokio::test]
async fn an_enqueue_for_free_keys_is_granted_at_once_as_a_lock_is() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let r = enqueue(&mut a, &["free"], 0, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert!(r.fence > 0 && r.ticket == 0, "{r:?}");
    let info = a.inspect("free").await;
    assert!(info.held_by_caller && info.fence == r.fence, "{info:?}");
    assert_eq!(status(&a.unlock(&["free"]).await), ResponseStatus::Ok);
    a.await_empty_server().await;
}

#[tokio::test]
async fn a_queued_enqueue_keeps_its_place_ahead_of_a_later_lock_and_wait_gets_the_grant() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["q"]).await;
    let mut first = TestClient::connect(server.addr).await;
    let req = first.lock_request(&["q"], 0, 0);
    first.send(&req).await;
    h.await_waiters("q", 1).await;

    let mut a = TestClient::connect(server.addr).await;
    let (ticket, place) = must_queue(&mut a, &["q"]).await;
    assert_eq!(place, 1, "one request ahead of it");
    // Answered at once: the connection goes on serving while it queues.
    assert_eq!(status(&a.ping().await), ResponseStatus::Ok);
    let mut later = TestClient::connect(server.addr).await;
    let req = later.lock_request(&["q"], 0, 0);
    later.send(&req).await;
    h.await_waiters("q", 3).await;

    let wait = wait_request(&mut a, ticket);
    a.send(&wait).await;
    assert_eq!(status(&h.unlock(&["q"]).await), ResponseStatus::Ok);
    let r = first.recv().await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert_eq!(status(&first.unlock(&["q"]).await), ResponseStatus::Ok);
    let got = a.recv().await;
    assert_eq!(
        (got.request_id, status(&got)),
        (wait.id, ResponseStatus::Ok),
        "{got:?}"
    );
    assert!(got.fence > r.fence);
    // The later Lock still waits behind the Enqueue's grant.
    let info = h.inspect("q").await;
    assert_eq!((info.fence, info.waiters), (got.fence, 1), "{info:?}");
    assert_eq!(status(&a.unlock(&["q"]).await), ResponseStatus::Ok);
    let r = later.recv().await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert!(r.fence > got.fence);
}

#[tokio::test]
async fn the_place_in_line_is_the_longest_queue_ahead_among_the_keys() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["p1", "p2"]).await;
    let mut waiters = Vec::new();
    for (i, key) in ["p1", "p1", "p2"].into_iter().enumerate() {
        let mut w = TestClient::connect(server.addr).await;
        let req = w.lock_request(&[key], 0, 0);
        w.send(&req).await;
        let n = if i < 2 { i as u32 + 1 } else { 1 };
        h.await_waiters(key, n).await;
        waiters.push(w);
    }
    let mut a = TestClient::connect(server.addr).await;
    let (_, place) = must_queue(&mut a, &["p2", "p1"]).await;
    assert_eq!(place, 2);
    let mut b = TestClient::connect(server.addr).await;
    let (_, place) = must_queue(&mut b, &["p2"]).await;
    assert_eq!(place, 2, "p2: the Lock and a's Enqueue");
}

#[tokio::test]
async fn a_wait_times_out_at_the_enqueues_wait_limit() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["t"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let (r, waited) = timed(async {
        let r = enqueue(&mut a, &["t", "u"], 300_000, 0).await;
        assert_eq!(status(&r), ResponseStatus::Queued, "{r:?}");
        let wait = wait_request(&mut a, r.ticket);
        a.call(wait).await
    })
    .await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout, "{r:?}");
    assert_eq!(r.keys, ["t"]);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert_eq!(h.inspect("t").await.waiters, 0);
    assert_eq!(h.inspect("u").await.fence, 0, "nothing taken");
}

#[tokio::test]
async fn a_grant_decided_before_the_wait_is_answered_at_once() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["g"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let (ticket, place) = must_queue(&mut a, &["g"]).await;
    assert_eq!(place, 0);
    assert_eq!(status(&h.unlock(&["g"]).await), ResponseStatus::Ok);
    // Granted already, before any Wait.
    let info = h.inspect("g").await;
    assert!(info.fence > 0 && !info.held_by_caller && info.waiters == 0);
    let (r, _) = timed(async {
        let wait = wait_request(&mut a, ticket);
        a.call(wait).await
    })
    .await;
    assert_eq!((status(&r), r.fence), (ResponseStatus::Ok, info.fence));
    assert!(a.inspect("g").await.held_by_caller);
}

#[tokio::test]
async fn a_disconnect_between_enqueue_and_wait_withdraws_the_request() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["d"]).await;
    let mut a = TestClient::connect(server.addr).await;
    must_queue(&mut a, &["d"]).await;
    let mut b = TestClient::connect(server.addr).await;
    let req = b.lock_request(&["d"], 0, 0);
    b.send(&req).await;
    h.await_waiters("d", 2).await;
    drop(a);
    h.await_waiters("d", 1).await;
    assert_eq!(status(&h.unlock(&["d"]).await), ResponseStatus::Ok);
    let r = b.recv().await;
    assert_eq!(
        status(&r),
        ResponseStatus::Ok,
        "the next waiter gets the key"
    );
    drop(b);
    h.await_empty_server().await;
}

#[tokio::test]
async fn a_leased_grant_never_collected_is_released_with_the_connection() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["l"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let r = enqueue(&mut a, &["l"], 0, 60_000_000).await;
    assert_eq!(status(&r), ResponseStatus::Queued, "{r:?}");
    assert_eq!(status(&h.unlock(&["l"]).await), ResponseStatus::Ok);
    assert!(
        h.inspect("l").await.fence > 0,
        "granted to a, not collected"
    );
    drop(a);
    // A lease of a minute, yet gone with the client that never learned it.
    h.await_empty_server().await;
}

#[tokio::test]
async fn multi_key_and_shared_enqueues_wait_all_or_nothing() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["m2"]).await;
    let mut reader = TestClient::connect(server.addr).await;
    let mut req = reader.lock_request(&["cfg"], 0, 0);
    req.lock.as_mut().expect("body").shared_keys = vec!["cfg".into()];
    assert_eq!(status(&reader.call(req).await), ResponseStatus::Ok);

    let mut a = TestClient::connect(server.addr).await;
    let mut req = enqueue_request(&mut a, &["m1", "m2", "cfg"], 0, 0);
    req.lock.as_mut().expect("body").shared_keys = vec!["cfg".into()];
    let r = a.call(req).await;
    assert_eq!((status(&r), r.place), (ResponseStatus::Queued, 0), "{r:?}");
    // Nothing is taken while one key is busy.
    assert_eq!(h.inspect("m1").await.fence, 0);
    let wait = wait_request(&mut a, r.ticket);
    a.send(&wait).await;
    assert_eq!(status(&h.unlock(&["m2"]).await), ResponseStatus::Ok);
    let got = a.recv().await;
    assert_eq!(status(&got), ResponseStatus::Ok, "{got:?}");
    let cfg = h.inspect("cfg").await;
    assert!(cfg.shared && cfg.holders.len() == 2, "{cfg:?}");
    assert_eq!(h.inspect("m1").await.fence, got.fence);
    assert_eq!(h.inspect("m2").await.fence, got.fence);
}

#[tokio::test]
async fn bad_tickets_are_refused_with_unknown_ticket() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["b"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let (ticket, _) = must_queue(&mut a, &["b"]).await;

    let unknown = |r: &Response| {
        assert_eq!(status(r), ResponseStatus::UnknownTicket, "{r:?}");
        assert!(r.error_text.contains("ticket"), "{r:?}");
    };
    let req = wait_request(&mut a, 0);
    unknown(&a.call(req).await);
    let req = wait_request(&mut a, ticket + 1000);
    unknown(&a.call(req).await);
    // Another connection's ticket, and another session's on this one.
    let mut other = TestClient::connect(server.addr).await;
    let req = wait_request(&mut other, ticket);
    unknown(&other.call(req).await);
    let open = a.request(RequestType::OpenSession, &[]);
    let session = a.call(open).await.session;
    let mut req = wait_request(&mut a, ticket);
    req.session = session;
    unknown(&a.call(req).await);
    // A ticket is for Wait only.
    let mut req = a.lock_request(&["b"], 0, 0);
    req.lock.as_mut().expect("body").ticket = ticket;
    assert_eq!(status(&a.call(req).await), ResponseStatus::InvalidArgument);

    // The ticket still works where it belongs, once.
    assert_eq!(status(&h.unlock(&["b"]).await), ResponseStatus::Ok);
    let req = wait_request(&mut a, ticket);
    assert_eq!(status(&a.call(req).await), ResponseStatus::Ok);
    let req = wait_request(&mut a, ticket);
    unknown(&a.call(req).await);
}

#[tokio::test]
async fn a_connection_holds_at_most_max_pipeline_tickets() {
    let server = TestServer::start(Config {
        max_pipeline: 2,
        ..Config::default()
    })
    .await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["x", "z"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let (t1, _) = must_queue(&mut a, &["x"]).await;
    must_queue(&mut a, &["x"]).await;
    let r = enqueue(&mut a, &["x"], 0, 0).await;
    assert_eq!(status(&r), ResponseStatus::LimitReached, "{r:?}");
    assert_eq!(
        h.inspect("x").await.waiters,
        2,
        "the refused one never queued"
    );
    // A Wait frees its ticket's room.
    assert_eq!(status(&h.unlock(&["x"]).await), ResponseStatus::Ok);
    let req = wait_request(&mut a, t1);
    assert_eq!(status(&a.call(req).await), ResponseStatus::Ok);
    must_queue(&mut a, &["y", "z"]).await;
}

#[tokio::test]
async fn closing_a_session_withdraws_its_tickets() {
    let server = TestServer::start(Config::default()).await;
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["s"]).await;
    let mut a = TestClient::connect(server.addr).await;
    let open = a.request(RequestType::OpenSession, &[]);
    let session = a.call(open).await.session;
    let mut req = enqueue_request(&mut a, &["s"], 0, 0);
    req.session = session;
    let r = a.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Queued, "{r:?}");
    h.await_waiters("s", 1).await;
    let r = a.call_in(RequestType::CloseSession, &[], session).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert_eq!(h.inspect("s").await.waiters, 0);
}
