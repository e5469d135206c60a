//! Shared locks and semaphores over TCP: readers overlap, a writer waits for
//! them, a reader waits behind a waiting writer, mixed requests are
//! all-or-nothing, a semaphore admits its limit, disagreements and mode
//! changes are refused, and a disconnect hands a shared hold on.

mod common;

use common::{status, TestClient, TestServer};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock_server::Config;

/// A Lock of `exclusive` and `shared` keys under `limit`: waiting without
/// limit, or failing at once with `try_lock`.
fn lock_req(
    c: &mut TestClient,
    exclusive: &[&str],
    shared: &[&str],
    limit: u32,
    try_lock: bool,
) -> Request {
    let keys: Vec<&str> = exclusive.iter().chain(shared).copied().collect();
    let mut r = c.lock_request(&keys, 0, 0);
    if let Some(body) = r.lock.as_mut() {
        body.shared_keys = shared.iter().map(|k| k.to_string()).collect();
        body.limit = limit;
        body.try_lock = try_lock;
    }
    r
}

/// Sends [`lock_req`] and returns the answer.
async fn call_lock(
    c: &mut TestClient,
    exclusive: &[&str],
    shared: &[&str],
    limit: u32,
    try_lock: bool,
) -> Response {
    let req = lock_req(c, exclusive, shared, limit, try_lock);
    c.call(req).await
}

async fn must_read(c: &mut TestClient, key: &str) -> u64 {
    let req = lock_req(c, &[], &[key], 0, true);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    r.fence
}

/// Sends a Lock that must wait, and waits until `watcher` sees it queued
/// as the key's `nth` waiter.
async fn queue(c: &mut TestClient, req: Request, watcher: &mut TestClient, key: &str, nth: u32) {
    c.send(&req).await;
    watcher.await_waiters(key, nth).await;
}

fn granted(r: &Response) -> u64 {
    assert_eq!(status(r), ResponseStatus::Ok, "{r:?}");
    r.fence
}

#[tokio::test]
async fn readers_overlap_each_under_its_own_fence_and_inspect_lists_them_all() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let mut b = TestClient::connect(server.addr).await;
    let fa = must_read(&mut a, "config").await;
    let fb = must_read(&mut b, "config").await;
    assert!(fb > fa);
    let info = a.inspect("config").await;
    assert!(info.shared);
    assert_eq!(info.limit, 0);
    assert_eq!(info.fence, fb, "the latest grant");
    assert!(!info.held_by_caller, "a holds, but not the latest grant");
    let holders: Vec<(u64, bool)> = info
        .holders
        .iter()
        .map(|h| (h.fence, h.held_by_caller))
        .collect();
    assert_eq!(holders, vec![(fa, true), (fb, false)]);
    assert!(info.holders.iter().all(|h| !h.holder_addr.is_empty()));
    assert_eq!(a.stats().await.held_keys, 2, "each shared hold counts");
}

#[tokio::test]
async fn a_writer_waits_for_every_reader_and_a_reader_behind_it_waits_too() {
    let server = TestServer::start(Config::default()).await;
    let mut r1 = TestClient::connect(server.addr).await;
    let mut r2 = TestClient::connect(server.addr).await;
    let mut w = TestClient::connect(server.addr).await;
    let mut late = TestClient::connect(server.addr).await;
    let mut watch = TestClient::connect(server.addr).await;
    must_read(&mut r1, "k").await;
    must_read(&mut r2, "k").await;
    let req = lock_req(&mut w, &["k"], &[], 0, false);
    queue(&mut w, req, &mut watch, "k", 1).await;
    // The key has room for readers, but a writer waits: no starvation.
    let r = call_lock(&mut late, &[], &["k"], 0, true).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    let req = lock_req(&mut late, &[], &["k"], 0, false);
    queue(&mut late, req, &mut watch, "k", 2).await;
    assert_eq!(status(&r1.unlock(&["k"]).await), ResponseStatus::Ok);
    // One reader left: the writer still waits.
    assert_eq!(watch.inspect("k").await.holders.len(), 1);
    assert_eq!(status(&r2.unlock(&["k"]).await), ResponseStatus::Ok);
    let fw = granted(&w.recv().await);
    let info = watch.inspect("k").await;
    assert!(!info.shared && info.fence == fw && info.waiters == 1);
    assert_eq!(status(&w.unlock(&["k"]).await), ResponseStatus::Ok);
    assert!(granted(&late.recv().await) > fw);
}

#[tokio::test]
async fn a_mixed_request_takes_all_its_keys_or_none() {
    let server = TestServer::start(Config::default()).await;
    let mut holder = TestClient::connect(server.addr).await;
    let mut mixed = TestClient::connect(server.addr).await;
    let mut watch = TestClient::connect(server.addr).await;
    holder.must_lock(&["deploy/web"]).await;
    let r = call_lock(&mut mixed, &["deploy/web"], &["config"], 0, true).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    assert_eq!(r.keys, vec!["deploy/web".to_string()]);
    assert_eq!(watch.inspect("config").await.fence, 0, "config not taken");
    let req = lock_req(&mut mixed, &["deploy/web"], &["config"], 0, false);
    queue(&mut mixed, req, &mut watch, "config", 1).await;
    // A reader of config now queues behind the waiting request.
    let r = call_lock(&mut watch, &[], &["config"], 0, true).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    holder.unlock(&["deploy/web"]).await;
    let fence = granted(&mixed.recv().await);
    let web = watch.inspect("deploy/web").await;
    let config = watch.inspect("config").await;
    assert_eq!((web.fence, web.shared), (fence, false));
    assert_eq!((config.fence, config.shared), (fence, true));
    // Now a reader joins the shared key at once.
    must_read(&mut watch, "config").await;
}

#[tokio::test]
async fn a_semaphore_admits_its_limit_and_queues_the_next() {
    let server = TestServer::start(Config::default()).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(TestClient::connect(server.addr).await);
    }
    let mut watch = TestClient::connect(server.addr).await;
    for c in clients.iter_mut().take(3) {
        granted(&call_lock(c, &[], &["pool"], 3, true).await);
    }
    let fourth = &mut clients[3];
    let req = lock_req(fourth, &[], &["pool"], 3, false);
    queue(fourth, req, &mut watch, "pool", 1).await;
    let info = watch.inspect("pool").await;
    assert_eq!((info.shared, info.limit, info.holders.len()), (true, 3, 3));
    assert_eq!(
        status(&clients[1].unlock(&["pool"]).await),
        ResponseStatus::Ok
    );
    granted(&clients[3].recv().await);
    assert_eq!(watch.inspect("pool").await.holders.len(), 3);
}

#[tokio::test]
async fn another_limit_or_mode_is_refused_with_the_keys_named() {
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    let mut b = TestClient::connect(server.addr).await;
    granted(&call_lock(&mut a, &[], &["pool"], 2, true).await);
    let r = call_lock(&mut b, &[], &["pool"], 5, false).await;
    assert_eq!(status(&r), ResponseStatus::LimitMismatch);
    assert_eq!(r.keys, vec!["pool".to_string()]);
    assert!(r.error_text.contains("limit"), "{}", r.error_text);
    // Upgrading shared to exclusive is refused, and changes nothing.
    let r = call_lock(&mut a, &["pool"], &[], 0, false).await;
    assert_eq!(status(&r), ResponseStatus::ModeConflict);
    assert_eq!(r.keys, vec!["pool".to_string()]);
    assert!(b.inspect("pool").await.shared);
    // Malformed requests.
    let mut req = lock_req(&mut b, &["x"], &[], 0, false);
    req.lock.as_mut().expect("body").limit = 2;
    assert_eq!(status(&b.call(req).await), ResponseStatus::InvalidArgument);
    let mut req = lock_req(&mut b, &["x"], &[], 0, false);
    req.lock.as_mut().expect("body").shared_keys = vec!["y".into()];
    assert_eq!(status(&b.call(req).await), ResponseStatus::InvalidArgument);
}

#[tokio::test]
async fn a_disconnect_releases_a_shared_hold_and_grants_the_next() {
    let server = TestServer::start(Config::default()).await;
    let mut r1 = TestClient::connect(server.addr).await;
    let mut r2 = TestClient::connect(server.addr).await;
    let mut next = TestClient::connect(server.addr).await;
    let mut watch = TestClient::connect(server.addr).await;
    must_read(&mut r1, "sem").await;
    let req = lock_req(&mut r2, &[], &["sem"], 1, false);
    let r = r2.call(req).await;
    assert_eq!(status(&r), ResponseStatus::LimitMismatch, "limit 0 vs 1");
    let req = lock_req(&mut next, &["sem"], &[], 0, false);
    queue(&mut next, req, &mut watch, "sem", 1).await;
    drop(r1);
    granted(&next.recv().await);
    drop(next);
    drop(r2);
    watch.await_empty_server().await;
}

#[tokio::test]
async fn exclusive_requests_are_answered_as_before() {
    // What an older client sends and sees: no sharing fields either way.
    let server = TestServer::start(Config::default()).await;
    let mut a = TestClient::connect(server.addr).await;
    a.must_lock(&["k"]).await;
    let info = a.inspect("k").await;
    assert!(!info.shared && info.limit == 0 && info.holders.is_empty());
    let req = a.request(RequestType::Inspect, &["free"]);
    let r = a.call(req).await;
    assert_eq!(r.key_info[0].holders.len(), 0);
}

/// Sends `reqs` pipelined, a batch at a time (the server stops reading at
/// its pipeline limit), and returns their answers in order.
async fn pipelined(c: &mut TestClient, reqs: Vec<Request>) -> Vec<Response> {
    let mut out = Vec::with_capacity(reqs.len());
    for batch in reqs.chunks(256) {
        for r in batch {
            c.send(r).await;
        }
        for r in batch {
            let resp = c.recv().await;
            assert_eq!(resp.request_id, r.id);
            out.push(resp);
        }
    }
    out
}

#[tokio::test]
async fn an_answer_listing_thousands_of_holders_stays_within_the_client_frame_limit() {
    // 4,500 holders with 1 KiB values: about 4.8 MB listed, over the 4 MiB
    // a client accepts. Each holder is a session of one connection.
    const HOLDERS: usize = 4_500;
    let server = TestServer::start(Config {
        max_sessions: HOLDERS,
        ..Config::default()
    })
    .await;
    let mut c = TestClient::connect(server.addr).await;
    let opens = (0..HOLDERS)
        .map(|_| c.request(RequestType::OpenSession, &[]))
        .collect();
    let sessions: Vec<u64> = pipelined(&mut c, opens)
        .await
        .iter()
        .map(|r| {
            assert_eq!(status(r), ResponseStatus::Ok, "{r:?}");
            r.session
        })
        .collect();
    let locks = sessions
        .iter()
        .map(|&s| {
            let mut r = common::in_session(lock_req(&mut c, &[], &["pool"], 0, true), s);
            if let Some(body) = r.lock.as_mut() {
                body.value = vec![b'v'; dlock::MAX_VALUE_LEN];
            }
            r
        })
        .collect();
    let fences: Vec<u64> = pipelined(&mut c, locks).await.iter().map(granted).collect();
    let (oldest, latest) = (fences[0], fences[HOLDERS - 1]);

    let check = |info: &dlock::proto::KeyInfo| {
        assert_eq!(info.holders.len() + info.holders_omitted as usize, HOLDERS);
        assert!(info.holders_omitted > 0, "some are left out");
        assert!(info.holders.len() > HOLDERS / 2, "only as many as needed");
        let listed: Vec<u64> = info.holders.iter().map(|h| h.fence).collect();
        assert_eq!(listed[0], oldest, "the oldest grant first");
        assert_eq!(listed[listed.len() - 1], latest, "the latest grant last");
        assert_eq!(info.fence, latest);
        assert!(listed.windows(2).all(|w| w[0] < w[1]), "by fence");
    };
    let inspect = c.request(RequestType::Inspect, &["pool"]);
    let r = c.call(inspect).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert!(prost::Message::encoded_len(&r) <= dlock::MAX_RESPONSE_FRAME);
    check(&r.key_info[0]);

    // Naming the key many times shares one budget: every copy still
    // names the oldest grant and the latest.
    let names = vec!["pool"; 16];
    let inspect = c.request(RequestType::Inspect, &names);
    let r = c.call(inspect).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{}", r.error_text);
    assert!(prost::Message::encoded_len(&r) <= dlock::MAX_RESPONSE_FRAME);
    assert_eq!(r.key_info.len(), 16);
    let listed: usize = r.key_info.iter().map(|i| i.holders.len()).sum();
    assert!(listed < HOLDERS, "{listed} listed in all");
    for info in &r.key_info {
        assert_eq!(info.holders.len() + info.holders_omitted as usize, HOLDERS);
        assert_eq!(info.holders.first().map(|h| h.fence), Some(oldest));
        assert_eq!(info.holders.last().map(|h| h.fence), Some(latest));
        assert_eq!(info.fence, latest);
    }

    // The busiest keys are kept within it too.
    let mut overview = c.request(RequestType::Inspect, &[]);
    overview.lock = Some(dlock::proto::RequestLock {
        limit: 1,
        ..Default::default()
    });
    let r = c.call(overview).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert!(prost::Message::encoded_len(&r) <= dlock::MAX_RESPONSE_FRAME);
    check(&r.server_stats.as_ref().expect("server stats").busiest[0]);

    // The library, which refuses frames over the limit, reads it.
    let client = dlock::Client::connect(server.addr.to_string())
        .await
        .expect("connect");
    let states = client.inspect("pool").await.expect("inspect");
    let s = &states[0];
    assert_eq!(s.holders.len() + s.holders_omitted as usize, HOLDERS);
    assert_eq!(s.first().map(|h| h.fence), Some(oldest));
    assert_eq!(s.fence(), Some(latest));
}
