//! The client gives a lock up before the server could hand it to someone
//! else: a frozen network path between holder and server (a forwarder that
//! stops passing anything, while both sockets stay open) must make the
//! holder's guard report the loss before a second client is granted the key.

use dlock::{Client, ClientOptions, LockOptions, Lost};
use dlock_server::testing::proxy::FreezableProxy;
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::time::Duration;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(30);

/// Holds `key` through `proxy`, freezes it, and returns when the guard's
/// loss and a direct client's grant of the same key were seen, asserting the
/// loss came first.
async fn loss_precedes_grant(server: &TestServer, options: LockOptions, expect_lease: bool) {
    let proxy = FreezableProxy::start(server.addr).await;
    let holder = Client::connect_with(&proxy.addr_string(), ClientOptions::default())
        .await
        .unwrap();
    let guard = holder.lock(["part"], options).await.unwrap();
    let other = Client::connect(&server.addr_string()).await.unwrap();
    let waiting = tokio::spawn(async move {
        let g = other.lock(["part"], LockOptions::new()).await;
        (Instant::now(), g)
    });
    proxy.freeze();
    let (lost, lost_at) = tokio::time::timeout(PATIENCE, async {
        let lost = guard.keep_alive().await;
        (lost, Instant::now())
    })
    .await
    .expect("the holder notices in time");
    let (granted_at, second) = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the server hands the key on")
        .unwrap();
    let second = second.expect("second client gets the key");
    assert!(second.fence() > guard.fence());
    assert!(
        matches!(lost, Lost::Jeopardy { lease, .. } if lease == expect_lease),
        "{lost}"
    );
    assert!(
        lost_at < granted_at,
        "holder gave up {:?} after the key was granted again",
        lost_at - granted_at
    );
    // The guard's deadline was not later than the grant either.
    assert!(guard.deadline() <= granted_at);
    proxy.thaw();
}

#[tokio::test]
async fn frozen_path_loses_a_connection_bound_lock_before_the_server_hands_it_on() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    })
    .await;
    loss_precedes_grant(&server, LockOptions::new(), false).await;
}

#[tokio::test]
async fn frozen_path_loses_a_lease_before_it_runs_out() {
    let server = TestServer::start(Config::default()).await;
    let lease = LockOptions::new().lease(Duration::from_secs(2));
    loss_precedes_grant(&server, lease, true).await;
}

#[tokio::test]
async fn a_kept_lease_outlives_many_lease_lengths() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let g = c
        .lock(
            ["kept"],
            LockOptions::new().lease(Duration::from_millis(1500)),
        )
        .await
        .unwrap();
    let first = g.deadline();
    // Keep it for three lease lengths; the keeper must not report a loss.
    let kept = tokio::time::timeout(Duration::from_millis(4500), g.keep_alive()).await;
    assert!(
        kept.is_err(),
        "lost while kept: {:?}",
        kept.map(|l| l.to_string())
    );
    assert!(g.deadline() > first + Duration::from_secs(2));
    let info = &c.inspect(["kept"]).await.unwrap()[0];
    assert_eq!(info.fence(), Some(g.fence()));
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn a_lease_is_taken_over_from_a_new_connection() {
    let server = TestServer::start(Config::default()).await;
    let first = Client::connect(&server.addr_string()).await.unwrap();
    let dlock::LockParts { keys, fence, .. } = first
        .lock(
            ["handed"],
            LockOptions::new().lease(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .into_parts();
    drop(first);
    let second = Client::connect(&server.addr_string()).await.unwrap();
    let g = second
        .take_over(keys.clone(), fence, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((g.keys(), g.fence()), (&keys[..], fence));
    assert_eq!(g.lease(), Some(Duration::from_secs(10)));
    assert!(matches!(
        second
            .take_over(["handed"], fence + 1, Duration::from_secs(1))
            .await,
        Err(dlock::Error::NotHeld { .. })
    ));
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn limits_are_learnt_when_connecting() {
    let server = TestServer::start(Config {
        max_lease: Duration::from_secs(3600),
        max_keys: 3,
        ..Config::default()
    })
    .await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let limits = c.limits().expect("this server states its limits");
    assert_eq!(limits.max_lease, Duration::from_secs(3600));
    assert_eq!(limits.max_keys, 3);
    // The least of idle (60 s), keepalive (60 s) and write (10 s) timeouts.
    assert_eq!(c.session_timeout(), Duration::from_secs(10));
    let err = limits.check_lease(Duration::from_secs(7200)).unwrap_err();
    assert_eq!(err.to_string(), "exceeds the server's maximum lease of 1h");
    let keys: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
    assert!(limits.check_keys(&keys).is_err());
    assert!(limits.check_keys(&keys[..3]).is_ok());
}

#[tokio::test]
async fn a_lease_granted_after_a_long_wait_is_not_lost_at_once() {
    let server = TestServer::start(Config::default()).await;
    let holder = Client::connect(&server.addr_string()).await.unwrap();
    let first = holder.lock(["slow"], LockOptions::new()).await.unwrap();
    let waiter = Client::connect(&server.addr_string()).await.unwrap();
    let lease = Duration::from_millis(600);
    // Judged when the grant arrives, not when this test gets to look: on a
    // loaded machine that may be later than the lease's safety margin.
    let waiting = tokio::spawn(async move {
        let g = waiter
            .lock(["slow"], LockOptions::new().lease(lease))
            .await?;
        let granted_at = Instant::now();
        let lost_at_grant = g.is_lost();
        Ok::<_, dlock::Error>((g, granted_at, lost_at_grant, waiter))
    });
    // Wait two lease lengths before releasing, as the waiter sees it.
    let deadline = Instant::now() + PATIENCE;
    while holder.inspect(["slow"]).await.unwrap()[0].waiters != 1 {
        assert!(Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(2 * lease).await;
    first.unlock().await.unwrap();
    let (g, granted_at, lost_at_grant, _waiter) = waiting.await.unwrap().unwrap();
    assert!(!lost_at_grant, "a fresh grant must not start in jeopardy");
    assert!(g.deadline() > granted_at + lease / 2);
}

#[tokio::test]
async fn a_renewal_to_a_shorter_lease_moves_the_deadline_back() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let mut g = c
        .lock(
            ["shorter"],
            LockOptions::new().lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let before = Instant::now();
    g.renew(Duration::from_secs(2)).await.unwrap();
    // The server replaced the 60 s lease with 2 s: so must the guard.
    assert!(g.deadline() <= before + Duration::from_secs(2) + Duration::from_millis(500));
    assert_eq!(g.lease(), Some(Duration::from_secs(2)));
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn keep_alive_recovers_a_lease_on_a_new_connection_after_a_reset() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let c = Client::connect(proxy.addr_string()).await.unwrap();
    let mut events = c.events();
    let guard = c
        .lock(
            ["recover"],
            LockOptions::new().lease(Duration::from_secs(6)),
        )
        .await
        .unwrap();
    let fence = guard.fence();
    let mut keeping = Box::pin(guard.keep_alive());
    proxy.sever();
    let mut healed = false;
    let recovered = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::select! {
                lost = &mut keeping => panic!("the lease was given up: {lost:?}"),
                e = events.recv() => match e.expect("an event") {
                    dlock::Event::Reconnecting { .. } if !healed => {
                        // Cut off until the guard has noticed; then the
                        // path comes back.
                        healed = true;
                        proxy.heal();
                    }
                    dlock::Event::LeaseRecovered { fence: f, .. } => break f,
                    _ => {}
                },
            }
        }
    })
    .await
    .expect("recovered in time");
    assert_eq!(recovered, fence);
    assert!(!guard.is_lost());
    // Still the same grant, and the guard now renews on the new connection.
    let probe = Client::connect(&server.addr_string()).await.unwrap();
    assert_eq!(
        probe.inspect(["recover"]).await.unwrap()[0].fence(),
        Some(fence)
    );
    assert!(!guard.client().is_closed());
    drop(keeping);
    guard.unlock().await.unwrap();
    assert_eq!(probe.inspect(["recover"]).await.unwrap()[0].fence(), None);
}

#[tokio::test]
async fn a_renewal_that_gets_no_answer_fails_at_the_alarm_not_later() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let c = Client::connect(proxy.addr_string()).await.unwrap();
    let mut g = c
        .lock(["stuck"], LockOptions::new().lease(Duration::from_secs(4)))
        .await
        .unwrap();
    let deadline = g.deadline();
    // Nothing gets through, and nothing tells the client so.
    proxy.freeze();
    let renewed = tokio::time::timeout(PATIENCE, g.renew(Duration::from_secs(4)))
        .await
        .expect("the renewal returns by the alarm, not when TCP gives up");
    match renewed {
        Err(dlock::Error::Lost(Lost::Jeopardy { lease: true, .. })) => {}
        other => panic!("expected the lock lost, got {other:?}"),
    }
    // The unanswered renewal did not move the deadline it failed at.
    assert_eq!(g.deadline(), deadline);
    assert!(g.is_lost());
    proxy.thaw();
}

#[tokio::test]
async fn a_shorter_lease_counts_from_its_sending_even_when_its_answer_never_comes() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let holder = Client::connect_with(&proxy.addr_string(), ClientOptions::default())
        .await
        .unwrap();
    let mut guard = holder
        .lock(["short"], LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .unwrap();
    // The Renew goes out (the proxy passes it on once thawed, or the server
    // has it already); its answer does not come back in time.
    proxy.freeze();
    let sent = Instant::now();
    let renewed = tokio::time::timeout(
        Duration::from_millis(100),
        guard.renew(Duration::from_secs(3)),
    )
    .await;
    assert!(renewed.is_err(), "no answer through a frozen path");
    // The server may apply it: the guard must not go on trusting the
    // 60 s lease.
    assert!(
        guard.deadline() <= sent + Duration::from_secs(3),
        "deadline {:?} from now",
        guard.deadline() - Instant::now()
    );
    proxy.thaw();
}
