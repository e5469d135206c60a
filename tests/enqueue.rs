//! `Client::enqueue`: granted at once, or queued with a place in line and
//! collected by `wait`; dropping a queued request withdraws it.

use dlock::proto::ResponseStatus;
use dlock::{Client, Enqueued, Error, LockOptions};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::time::Duration;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(30);

async fn waiters(c: &Client, key: &str, n: u32) {
    let deadline = Instant::now() + PATIENCE;
    while c.inspect([key]).await.unwrap()[0].waiters != n {
        assert!(Instant::now() < deadline, "{key} never had {n} waiters");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn free_keys_are_granted_at_once() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let Enqueued::Granted(g) = c.enqueue(["free"], LockOptions::new()).await.unwrap() else {
        panic!("free keys are granted at once");
    };
    assert!(g.fence() > 0);
    assert!(c.inspect(["free"]).await.unwrap()[0].fence() == Some(g.fence()));
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn a_queued_request_reports_its_place_and_wait_returns_the_lock() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let holder = c.lock(["q"], LockOptions::new()).await.unwrap();
    let first = c.enqueue(["q"], LockOptions::new()).await.unwrap();
    let second = c
        .enqueue(["q"], LockOptions::new().lease(Duration::from_secs(30)))
        .await
        .unwrap();
    let (Enqueued::Queued(first), Enqueued::Queued(second)) = (first, second) else {
        panic!("q is held: both queue");
    };
    assert_eq!((first.place(), second.place()), (0, 1));
    assert_eq!(first.keys(), ["q"]);
    waiters(&c, "q", 2).await;
    let waiting = tokio::spawn(second.wait());
    holder.unlock().await.unwrap();
    let g1 = first.wait().await.unwrap();
    assert!(g1.fence() > 0);
    g1.unlock().await.unwrap();
    let g2 = waiting.await.unwrap().unwrap();
    assert!(g2.fence() > 0 && g2.lease() == Some(Duration::from_secs(30)));
    g2.unlock().await.unwrap();
}

#[tokio::test]
async fn wait_times_out_at_the_enqueues_limit_and_try_is_busy() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let _holder = c.lock(["t"], LockOptions::new()).await.unwrap();
    match c.enqueue(["t"], LockOptions::new().no_wait()).await {
        Err(Error::Busy { busy }) => assert_eq!(busy, ["t"]),
        other => panic!("expected busy, got {other:?}"),
    }
    let q = c
        .enqueue(["t"], LockOptions::new().wait(Duration::from_millis(200)))
        .await
        .unwrap();
    match q.wait().await {
        Err(Error::Timeout { busy }) => assert_eq!(busy, ["t"]),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn dropping_a_queued_request_withdraws_it() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let holder = c.lock(["d"], LockOptions::new()).await.unwrap();
    let q = c.enqueue(["d"], LockOptions::new()).await.unwrap();
    waiters(&c, "d", 1).await;
    drop(q);
    waiters(&c, "d", 0).await;
    holder.unlock().await.unwrap();
    let s = c.stats().await.unwrap();
    assert_eq!((s.held_keys, s.waiting_requests), (0, 0));
}

#[tokio::test]
async fn shared_enqueues_share_the_key() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let writer = c.lock(["cfg"], LockOptions::new()).await.unwrap();
    let r1 = c
        .enqueue(["cfg"], LockOptions::new().shared())
        .await
        .unwrap();
    let r2 = c.enqueue(["cfg"], LockOptions::new().limit(2)).await;
    // A reader lock and a semaphore disagree on the limit.
    match r2 {
        Err(Error::Server { status, .. }) => assert_eq!(status, ResponseStatus::LimitMismatch),
        other => panic!("expected LimitMismatch, got {other:?}"),
    }
    let r2 = c
        .enqueue(["cfg"], LockOptions::new().shared())
        .await
        .unwrap();
    writer.unlock().await.unwrap();
    let (g1, g2) = (r1.wait().await.unwrap(), r2.wait().await.unwrap());
    assert_ne!(g1.fence(), g2.fence());
    let info = &c.inspect(["cfg"]).await.unwrap()[0];
    assert!(info.shared && info.holders.len() == 2, "{info:?}");
}
