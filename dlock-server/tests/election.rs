//! Values, Proclaim and Watch over TCP with raw frames: a hold's value is
//! stored and shown, only its holder may replace it, a Watch answers as
//! soon as the first holder changes and not before (or at its limit), is
//! withdrawn when its connection ends, and is bounded.

mod common;

use common::{status, timed, TestClient, TestServer, PATIENCE};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock_server::Config;
use std::time::Duration;

fn with_value(mut r: Request, value: &[u8]) -> Request {
    if let Some(body) = r.lock.as_mut() {
        body.value = value.to_vec();
    }
    r
}

async fn lock_with(c: &mut TestClient, key: &str, value: &[u8]) -> u64 {
    let mut req = with_value(c.lock_request(&[key], 0, 0), value);
    if let Some(body) = req.lock.as_mut() {
        body.try_lock = true;
    }
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    r.fence
}

async fn proclaim(c: &mut TestClient, key: &str, fence: u64, value: &[u8]) -> Response {
    let mut req = with_value(c.request(RequestType::Proclaim, &[key]), value);
    if let Some(body) = req.lock.as_mut() {
        body.fence = fence;
    }
    c.call(req).await
}

/// A Watch of `key` by a caller that knows `fence` and `value`, waiting
/// at most `wait`.
fn watch_req(c: &mut TestClient, key: &str, fence: u64, value: &[u8], wait: Duration) -> Request {
    let mut req = with_value(c.request(RequestType::Watch, &[key]), value);
    if let Some(body) = req.lock.as_mut() {
        body.fence = fence;
        body.wait_micro = u64::try_from(wait.as_micros()).expect("small");
    }
    req
}

async fn connect(server: &TestServer) -> TestClient {
    TestClient::connect(server.addr).await
}

#[tokio::test]
async fn a_value_is_stored_with_the_hold_and_shown_with_its_age() {
    let server = TestServer::start(Config::default()).await;
    let mut a = connect(&server).await;
    let mut probe = connect(&server).await;
    let fence = lock_with(&mut a, "leader", b"host-a:1").await;
    let info = probe.inspect("leader").await;
    assert_eq!(
        (info.fence, info.value.as_slice()),
        (fence, &b"host-a:1"[..])
    );
    let first_age = info.held_micro;
    // The age grows: a later Inspect sees an older hold.
    loop {
        let later = probe.inspect("leader").await;
        if later.held_micro > first_age {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Older clients that send no value see an empty one.
    let f = a.must_lock(&["plain"]).await;
    let plain = probe.inspect("plain").await;
    assert_eq!((plain.fence, plain.value.len()), (f, 0));
}

#[tokio::test]
async fn only_the_holder_proclaims_by_owner_or_by_fence() {
    let server = TestServer::start(Config::default()).await;
    let mut a = connect(&server).await;
    let mut b = connect(&server).await;
    let fence = lock_with(&mut a, "k", b"one").await;
    // By owner (fence 0): a holds it, b does not.
    assert_eq!(
        status(&proclaim(&mut a, "k", 0, b"two").await),
        ResponseStatus::Ok
    );
    let r = proclaim(&mut b, "k", 0, b"evil").await;
    assert_eq!(
        (status(&r), r.keys.clone()),
        (ResponseStatus::NotHeld, vec!["k".to_string()])
    );
    // By fence, from any connection; a wrong fence is not held.
    assert_eq!(
        status(&proclaim(&mut b, "k", fence, b"three").await),
        ResponseStatus::Ok
    );
    assert_eq!(
        status(&proclaim(&mut b, "k", fence + 100, b"x").await),
        ResponseStatus::NotHeld
    );
    assert_eq!(b.inspect("k").await.value, b"three");
    // Too long a value is refused and changes nothing.
    let big = vec![b'v'; dlock::MAX_VALUE_LEN + 1];
    let r = proclaim(&mut a, "k", 0, &big).await;
    assert_eq!(status(&r), ResponseStatus::ValueTooLarge, "{r:?}");
    assert!(!r.error_text.is_empty());
    let mut req = with_value(b.lock_request(&["other"], 0, 0), &big);
    req.lock.as_mut().expect("body").try_lock = true;
    assert_eq!(status(&b.call(req).await), ResponseStatus::ValueTooLarge);
    assert_eq!(b.inspect("other").await.fence, 0, "nothing was locked");
}

#[tokio::test]
async fn a_watch_answers_at_once_when_the_caller_is_behind() {
    let server = TestServer::start(Config::default()).await;
    let mut a = connect(&server).await;
    let mut w = connect(&server).await;
    let fence = lock_with(&mut a, "k", b"a").await;
    // The caller says the key is free: it is not, so the answer is now.
    let req = watch_req(&mut w, "k", 0, b"", Duration::from_secs(600));
    let (r, took) = timed(w.call(req)).await;
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert_eq!(r.key_info[0].fence, fence);
    assert_eq!(r.key_info[0].value, b"a");
    assert!(took < PATIENCE);
}

#[tokio::test]
async fn a_watch_answers_on_the_change_and_carries_the_new_holder() {
    let server = TestServer::start(Config::default()).await;
    let mut a = connect(&server).await;
    let mut b = connect(&server).await;
    let mut w = connect(&server).await;
    let fence = lock_with(&mut a, "k", b"a").await;
    // b queues behind a.
    let queued = with_value(b.lock_request(&["k"], 0, 0), b"b");
    b.send(&queued).await;
    w.await_waiters("k", 1).await;
    // The watch parks: the caller knows the current holder.
    let req = watch_req(&mut w, "k", fence, b"a", Duration::from_secs(600));
    w.send(&req).await;
    // No answer while nothing changes: a Ping on another connection is
    // answered, and the watch is still parked (its answer has not come).
    assert_eq!(status(&a.ping().await), ResponseStatus::Ok);
    // A proclaim is a change: answered with the new value.
    assert_eq!(
        status(&proclaim(&mut a, "k", fence, b"a2").await),
        ResponseStatus::Ok
    );
    let r = w.recv().await;
    assert_eq!(r.request_id, req.id);
    assert_eq!(
        (r.key_info[0].fence, r.key_info[0].value.as_slice()),
        (fence, &b"a2"[..])
    );
    // Park again, knowing a2; a releases, b gets it: answered with b.
    let req = watch_req(&mut w, "k", fence, b"a2", Duration::from_secs(600));
    w.send(&req).await;
    assert_eq!(status(&a.unlock(&["k"]).await), ResponseStatus::Ok);
    let granted = b.recv().await;
    assert_eq!(status(&granted), ResponseStatus::Ok);
    let r = w.recv().await;
    assert_eq!(r.request_id, req.id);
    assert_eq!(r.key_info[0].fence, granted.fence);
    assert_eq!(r.key_info[0].value, b"b");
}

#[tokio::test]
async fn without_a_change_a_watch_answers_only_at_its_limit() {
    let server = TestServer::start(Config::default()).await;
    let mut a = connect(&server).await;
    let mut w = connect(&server).await;
    let fence = lock_with(&mut a, "k", b"a").await;
    let limit = Duration::from_millis(300);
    let req = watch_req(&mut w, "k", fence, b"a", limit);
    let (r, took) = timed(w.call(req)).await;
    assert!(took >= limit, "answered after {took:?}, before its limit");
    assert_eq!(status(&r), ResponseStatus::Ok);
    assert_eq!(
        (r.key_info[0].fence, r.key_info[0].value.as_slice()),
        (fence, &b"a"[..])
    );
    // Other keys changing do not answer it early either.
    let req = watch_req(&mut w, "k", fence, b"a", limit);
    w.send(&req).await;
    for i in 0..20 {
        a.must_lock(&[&format!("other-{i}")]).await;
    }
    let (r, _) = timed(w.recv()).await;
    assert_eq!(r.key_info[0].fence, fence, "still the same holder");
}

#[tokio::test]
async fn a_watch_is_withdrawn_with_its_connection_and_bounded() {
    let config = Config {
        max_watchers: 1,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut w1 = connect(&server).await;
    let mut w2 = connect(&server).await;
    // A free key, known free: parks.
    let req = watch_req(&mut w1, "k", 0, b"", Duration::from_secs(600));
    w1.send(&req).await;
    // The second is refused while the first is parked.
    loop {
        let req = watch_req(&mut w2, "k", 0, b"", Duration::from_millis(1));
        let r = w2.call(req).await;
        if status(&r) == ResponseStatus::WatchLimit {
            assert!(r.error_text.contains("max-watchers"), "{r:?}");
            break;
        }
        // The first may not have parked yet: its 1 ms turn came first.
        tokio::task::yield_now().await;
    }
    // Closing the first withdraws it: its place comes free.
    drop(w1);
    let got_place = tokio::time::timeout(PATIENCE, async {
        loop {
            let req = watch_req(&mut w2, "k", 0, b"", Duration::from_millis(1));
            if status(&w2.call(req).await) == ResponseStatus::Ok {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        got_place.is_ok(),
        "the closed connection's Watch was not withdrawn"
    );
    // Watch needs exactly one key.
    let mut req = watch_req(&mut w2, "a", 0, b"", Duration::from_millis(1));
    req.lock.as_mut().expect("body").keys.push("b".into());
    assert_eq!(status(&w2.call(req).await), ResponseStatus::InvalidArgument);
}

#[tokio::test]
async fn watch_can_be_turned_off() {
    let config = Config {
        max_watchers: 0,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut w = connect(&server).await;
    let req = watch_req(&mut w, "k", 0, b"", Duration::from_millis(1));
    assert_eq!(status(&w.call(req).await), ResponseStatus::WatchLimit);
}
