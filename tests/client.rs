//! The client library against a real server on 127.0.0.1:0.

use dlock::{Client, ClientOptions, Error, LockOptions, Lost};
use dlock_server::testing::proxy::FreezableProxy;
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::time::Instant;

async fn client(server: &TestServer) -> Client {
    Client::connect(&server.addr_string())
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_pipelined_connection() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let mut tasks = Vec::new();
    for t in 0..32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("task-{t}");
            let mut last = 0;
            for _ in 0..20 {
                let g = c
                    .lock([key.as_str()], LockOptions::new().no_wait())
                    .await
                    .expect("own key is free");
                assert!(g.fence() > last);
                last = g.fence();
                c.ping().await.expect("ping");
                g.unlock().await.expect("unlock");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    // Every task released its key.
    let info = c
        .inspect(
            (0..32)
                .map(|t| format!("task-{t}"))
                .collect::<dlock::Keys>(),
        )
        .await
        .unwrap();
    assert!(info.iter().all(|k| k.is_free() && k.waiters == 0));
}

#[tokio::test]
async fn dropping_the_guard_releases_the_lock() {
    let server = TestServer::start(Config::default()).await;
    let a = client(&server).await;
    let b = client(&server).await;
    let g = a.lock(["d"], LockOptions::new()).await.unwrap();
    assert!(matches!(
        b.lock(["d"], LockOptions::new().no_wait()).await,
        Err(Error::Busy { .. })
    ));
    drop(g);
    let g = b
        .lock(["d"], LockOptions::new().wait(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(g.keys(), ["d"]);
}

#[tokio::test]
async fn loss_is_visible_to_guards_and_calls() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server).await;
    let waiter = client(&server).await;
    let g = holder.lock(["lost"], LockOptions::new()).await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock(["lost"], LockOptions::new()).await }
    });
    // The waiter's request is queued before the server goes away.
    loop {
        if holder.inspect(["lost"]).await.unwrap()[0].waiters == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    server.stop().await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(20), g.lost())
        .await
        .expect("loss noticed");
    assert!(matches!(reason, Lost::ConnectionLost(_)), "{reason}");
    assert!(g.is_lost());
    match waiting.await.unwrap() {
        Err(Error::Server { status, .. }) => {
            assert_eq!(status, dlock::proto::ResponseStatus::ShuttingDown)
        }
        Err(Error::ConnectionLost(_)) => {}
        other => panic!("pending lock should fail, got {other:?}"),
    }
    waiter.closed().await;
    assert!(matches!(holder.ping().await, Err(Error::ConnectionLost(_))));
    assert!(matches!(
        holder.lock(["again"], LockOptions::new()).await,
        Err(Error::ConnectionLost(_))
    ));
}

#[tokio::test]
async fn errors_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "t0ken\n").unwrap();
    let server = TestServer::start(Config {
        token_file: Some(tokens.to_path_buf()),
        ..Config::default()
    })
    .await;

    // A missing token is found out when connecting (the Hello handshake).
    assert!(matches!(
        Client::connect(&server.addr_string()).await,
        Err(Error::AccessDenied(_))
    ));

    let options = || ClientOptions {
        access_token: Some("t0ken".into()),
        ..ClientOptions::default()
    };
    let a = Client::connect_with(&server.addr_string(), options())
        .await
        .unwrap();
    let b = Client::connect_with(&server.addr_string(), options())
        .await
        .unwrap();
    let _held = a.lock(["x"], LockOptions::new()).await.unwrap();
    match b
        .lock(
            ["x", "y"],
            LockOptions::new().wait(Duration::from_millis(50)),
        )
        .await
    {
        Err(Error::Timeout { busy }) => assert_eq!(busy, ["x"]),
        other => panic!("expected timeout, got {other:?}"),
    }
    match b.unlock_fence(&["x".to_string()], 1).await {
        Err(Error::NotHeld { keys }) => assert_eq!(keys, ["x"]),
        other => panic!("expected not held, got {other:?}"),
    }
    match b.lock([""], LockOptions::new()).await {
        Err(e @ Error::Server { .. }) => {
            assert_eq!(e.status(), Some(dlock::proto::ResponseStatus::InvalidKey));
        }
        other => panic!("expected invalid key, got {other:?}"),
    }

    // A port with nothing listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    match Client::connect(&addr).await {
        Err(e @ Error::Connect { .. }) => assert!(e.to_string().contains(&addr)),
        other => panic!("expected connect error, got {other:?}"),
    }
}

/// Two single servers share no locks: given as a list, the client moved to
/// the second when the first was down and locked there, beside a holder
/// of the same key on the first. A list must name one cluster's nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_leads_to_a_single_server_is_refused() {
    let first = TestServer::start(Config::default()).await;
    let second = TestServer::start(Config::default()).await;
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_addr = down.local_addr().unwrap().to_string();
    drop(down);
    for list in [
        format!("{down_addr},{}", second.addr_string()),
        format!("{},{}", first.addr_string(), second.addr_string()),
    ] {
        match Client::connect(list.as_str()).await {
            Err(e @ Error::NotOneCluster { .. }) => {
                let text = e.to_string();
                assert!(text.contains("is a single server"), "{text}");
                assert!(text.contains("alone"), "{text}");
            }
            other => panic!("{list}: expected NotOneCluster, got {other:?}"),
        }
    }
    // One address is a single server's, as always.
    let alone = client(&second).await;
    alone.ping().await.unwrap();
}

/// Keys within the key limits can still make a frame over the server's
/// --max-frame, which the server answers by closing the connection: every
/// other call on it failed too. The client refuses to send it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_servers_frame_limit_is_refused_before_it_is_sent() {
    let server = TestServer::start(Config {
        max_frame: 1024,
        ..Config::default()
    })
    .await;
    let c = client(&server).await;
    let held = c.lock(["small"], LockOptions::new()).await.unwrap();
    let keys: Vec<String> = (0..20)
        .map(|i| format!("{i:02}{}", "x".repeat(60)))
        .collect();
    match c.lock(keys, LockOptions::new()).await {
        Err(e @ Error::Server { .. }) => {
            assert_eq!(
                e.status(),
                Some(dlock::proto::ResponseStatus::FrameTooLarge)
            );
            let text = e.to_string();
            assert!(text.contains("not sent") && text.contains("1024"), "{text}");
        }
        other => panic!("expected FrameTooLarge, got {other:?}"),
    }
    // The connection, and the lock on it, are unharmed.
    assert!(!held.is_lost());
    c.ping().await.unwrap();
    held.unlock().await.unwrap();

    // The largest lock the check lets through: its Renew and Unlock carry
    // a fencing token the Lock did not, and must not be refused (that
    // would give up a lock that is held, and keep its lease on the server).
    let mut len = 1000;
    let mut guard = loop {
        let key = "k".repeat(len);
        match c
            .lock([key], LockOptions::new().lease(Duration::from_secs(30)))
            .await
        {
            Ok(g) => break g,
            Err(e) if e.status() == Some(dlock::proto::ResponseStatus::FrameTooLarge) => {
                len -= 1;
            }
            Err(e) => panic!("{e}"),
        }
    };
    guard.renew(Duration::from_secs(30)).await.unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn cancelled_lock_call_leaks_no_lock() {
    let server = TestServer::start(Config::default()).await;
    let a = client(&server).await;
    let b = client(&server).await;
    let g = a.lock(["c"], LockOptions::new()).await.unwrap();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), b.lock(["c"], LockOptions::new())).await;
    assert!(gave_up.is_err(), "b must still be waiting");
    drop(g);
    // b's request is granted after a's release and released again at once,
    // because nobody waits for it any more.
    let c = client(&server).await;
    let got = c
        .lock(["c"], LockOptions::new().wait(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(got.keys(), ["c"]);
}

#[tokio::test]
async fn lease_runs_out_unless_renewed() {
    let server = TestServer::start(Config::default()).await;
    let a = client(&server).await;
    let mut g = a
        .lock(["l"], LockOptions::new().lease(Duration::from_millis(200)))
        .await
        .unwrap();
    // The guard counts the lease from before the Renew is sent, so the
    // elapsed time is measured from before it too: a slow round trip must
    // not make the lease look short.
    let start = std::time::Instant::now();
    g.renew(Duration::from_millis(300)).await.unwrap();
    assert_eq!(g.lease(), Some(Duration::from_millis(300)));
    // The margin is a quarter of a short lease: lost at 299.7 - 75 ms.
    assert_eq!(g.margin(), Duration::from_millis(75));
    let reason = tokio::time::timeout(Duration::from_secs(20), g.lost())
        .await
        .unwrap();
    assert!(
        matches!(reason, Lost::Jeopardy { lease: true, .. }),
        "{reason}"
    );
    assert!(start.elapsed() >= Duration::from_millis(224));
    // Past the alarm a renewal is refused by the guard itself: the caller
    // was told to stop, and an answer cannot be awaited past that point.
    match g.renew(Duration::from_secs(1)).await {
        Err(Error::Lost(Lost::Jeopardy { lease: true, .. })) => {}
        other => panic!("expected the loss, got {other:?}"),
    }
}

#[tokio::test]
async fn heartbeats_keep_quiet_holders_and_waiters_connected() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_millis(300),
        ..Config::default()
    })
    .await;
    let fast = || ClientOptions {
        heartbeat: Duration::from_millis(50),
        ..ClientOptions::default()
    };
    let quiet = Client::connect_with(&server.addr_string(), fast())
        .await
        .unwrap();
    let _g = quiet.lock(["hb"], LockOptions::new()).await.unwrap();
    // Someone else waits three idle timeouts in vain: neither the quiet
    // holder nor the waiter was dropped for idleness, because both pinged.
    let other = Client::connect_with(&server.addr_string(), fast())
        .await
        .unwrap();
    let r = other
        .lock(["hb"], LockOptions::new().wait(Duration::from_millis(900)))
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(!quiet.is_closed());
}

#[tokio::test]
async fn pings_follow_the_servers_session_timeout_not_the_configured_heartbeat() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(1),
        ..Config::default()
    })
    .await;
    let c = Client::connect_with(
        &server.addr_string(),
        ClientOptions {
            heartbeat: Duration::from_secs(3600),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.session_timeout(), Duration::from_secs(1));
    let g = c.lock(["quiet"], LockOptions::new()).await.unwrap();
    // Another client waits out three session timeouts: the quiet holder
    // was never dropped, nor did its guard fall into jeopardy.
    let other = client(&server).await;
    let r = other
        .lock(
            ["quiet"],
            LockOptions::new().wait(Duration::from_millis(2500)),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(!c.is_closed());
    assert!(!g.is_lost());
}

/// On paused time, so the period is exact: a Ping goes out one heartbeat
/// after the last write, every time. (A fixed tick that skipped when the
/// last write was a hair under a period old sent every other tick, which
/// halved what a cluster client had left to resume in after a failover.)
#[tokio::test(start_paused = true)]
async fn a_quiet_holder_is_answered_at_least_once_a_heartbeat() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(4),
        ..Config::default()
    })
    .await;
    let c = client(&server).await;
    let heartbeat = c.session_timeout() / 4;
    let g = c.lock(["quiet"], LockOptions::new()).await.unwrap();
    let window = dlock::safety::deadline(tokio::time::Instant::now(), c.session_timeout())
        - tokio::time::Instant::now();
    // A request on the lock's connection, off the beat of its first write.
    tokio::time::sleep(heartbeat / 3).await;
    g.client().inspect(["quiet"]).await.unwrap();
    let step = Duration::from_millis(50);
    for _ in 0..200 {
        tokio::time::sleep(step).await;
        let left = g.deadline() - tokio::time::Instant::now();
        // The last answered Ping was sent at most a heartbeat (and the
        // step this check lags by) ago.
        assert!(
            left + heartbeat + step >= window,
            "{left:?} left of {window:?}: no answer for longer than a heartbeat ({heartbeat:?})"
        );
    }
    assert!(!g.is_lost());
}

#[tokio::test]
async fn a_zero_lease_means_no_lease_and_busy_differs_from_timed_out() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let g = c
        .lock(["z"], LockOptions::new().lease(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(g.lease(), None);
    assert!(!g.is_lost(), "held, bound to its connection");
    let z = c.inspect(["z"]).await.unwrap().remove(0);
    assert_eq!(z.first().map(|h| h.lease_remaining), Some(None));
    let other = client(&server).await;
    match other.lock(["z"], LockOptions::new().no_wait()).await {
        Err(Error::Busy { busy }) => assert_eq!(busy, ["z"]),
        r => panic!("expected busy, got {r:?}"),
    }
    match other
        .lock(["z"], LockOptions::new().wait(Duration::from_millis(20)))
        .await
    {
        Err(Error::Timeout { busy }) => assert_eq!(busy, ["z"]),
        r => panic!("expected timed out, got {r:?}"),
    }
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn one_key_is_named_as_plainly_as_many() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let key = String::from("single");
    let guard = c
        .lock("single", LockOptions::new().lease(Duration::from_secs(60)))
        .await
        .unwrap();
    let parts = guard.into_parts();
    let (keys, fence) = (parts.keys.clone(), parts.fence);
    assert_eq!(keys, ["single"]);
    assert_eq!(parts.lease, Some(Duration::from_secs(60)));
    assert_eq!(c.inspect(&key).await.unwrap()[0].fence(), Some(fence));
    c.renew_fence(key.clone(), fence, Duration::from_secs(30))
        .await
        .unwrap();
    let taken = c
        .take_over(&keys, fence, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(taken.fence(), fence);
    // The round trip: parts out, parts in, on another connection.
    let parts = taken.into_parts();
    assert_eq!(parts.lease, Some(Duration::from_secs(30)));
    let other = client(&server).await;
    let again = other.from_parts(parts.clone()).await.unwrap();
    assert_eq!((again.keys(), again.fence()), (&keys[..], fence));
    assert_eq!(again.into_parts(), parts);
    // A lock bound to its connection cannot be taken over.
    let bound = c
        .lock("bound", LockOptions::new())
        .await
        .unwrap()
        .into_parts();
    assert_eq!(bound.lease, None);
    match other.from_parts(bound).await {
        Err(dlock::Error::Server { status, .. }) => {
            assert_eq!(status, dlock::proto::ResponseStatus::InvalidArgument)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    c.unlock_fence("single", fence).await.unwrap();
    assert_eq!(c.inspect(["single"]).await.unwrap()[0].fence(), None);
}

#[tokio::test]
async fn one_lock_takes_some_keys_exclusively_and_others_shared() {
    let server = TestServer::start(Config::default()).await;
    let (a, b) = (client(&server).await, client(&server).await);
    let mixed = a
        .lock_mixed("deploy/web", "config", LockOptions::new())
        .await
        .unwrap();
    assert_eq!(mixed.keys(), ["deploy/web", "config"]);
    // A reader shares `config`; `deploy/web` stays exclusive.
    let reader = b
        .lock("config", LockOptions::new().shared().no_wait())
        .await
        .unwrap();
    assert!(matches!(
        b.lock("deploy/web", LockOptions::new().no_wait()).await,
        Err(dlock::Error::Busy { .. })
    ));
    let infos = b.inspect(["deploy/web", "config"]).await.unwrap();
    assert!(!infos[0].shared && infos[1].shared);
    assert_eq!(infos[1].holders.len(), 2);
    reader.unlock().await.unwrap();
    mixed.unlock().await.unwrap();
}

/// A grant that crosses the close of its Lock's connection: `waiter`
/// (through `proxy`) waits for `key` with an hour's lease; the proxy is
/// frozen, the holder releases, and the server grants the lease, whose
/// answer waits in the frozen proxy. Returns the task of the Lock (spawned
/// on `runtime`, the waiter's), whose caller still waits.
async fn grant_on_the_wire(
    server: &TestServer,
    proxy: &FreezableProxy,
    waiter: &Client,
    runtime: &tokio::runtime::Handle,
    key: &'static str,
) -> tokio::task::JoinHandle<dlock::Result<dlock::LockGuard>> {
    let holder = client(server).await;
    let g = holder.lock([key], LockOptions::new()).await.unwrap();
    let waiting = runtime.spawn({
        let waiter = waiter.clone();
        async move { waiter.lock([key], LockOptions::new().lease(HOUR)).await }
    });
    let deadline = Instant::now() + PATIENCE;
    while holder.inspect([key]).await.unwrap()[0].waiters != 1 {
        assert!(Instant::now() < deadline, "{key}'s Lock never arrived");
        tokio::task::yield_now().await;
    }
    proxy.freeze();
    g.unlock().await.unwrap();
    let state = holder.inspect([key]).await.unwrap().remove(0);
    let lease = state.first().and_then(|h| h.lease_remaining);
    assert!(lease.is_some(), "the waiter holds {key} now: {state:?}");
    waiting
}

/// Takes `key` with a bounded wait: the hour's lease must have been
/// released long before it runs out.
async fn free_soon(server: &TestServer, key: &str) {
    let other = client(server).await;
    match other.lock([key], LockOptions::new().wait(PATIENCE)).await {
        Ok(g) => g.unlock().await.unwrap(),
        Err(e) => panic!("the hour's lease was not released, {key} stays held: {e}"),
    }
}

const HOUR: Duration = Duration::from_secs(3600);
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_lease_granted_as_its_lock_is_cancelled_is_released_though_the_connection_closed() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let waiter = Client::connect(proxy.addr_string()).await.unwrap();
    let waiting = grant_on_the_wire(&server, &proxy, &waiter, &Handle::current(), "crossed").await;
    // The caller stops waiting: the Lock's connection closes.
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    proxy.thaw();
    free_soon(&server, "crossed").await;
    assert!(!waiter.is_closed());
}

#[tokio::test]
async fn a_lease_granted_as_its_client_is_dropped_is_released() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let waiter = Client::connect(proxy.addr_string()).await.unwrap();
    let waiting = grant_on_the_wire(&server, &proxy, &waiter, &Handle::current(), "dropped").await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    drop(waiter);
    proxy.thaw();
    free_soon(&server, "dropped").await;
}

/// What the `dlock` command does when interrupted while it waits: the
/// program ends right after giving up the wait, and its runtime with it.
/// The waiter runs on a runtime of its own, which ends as soon as `close`
/// returns; `close` must not return before the grant that crossed the
/// close was released, since nothing of the waiter runs after it.
#[tokio::test]
async fn close_returns_once_a_lease_granted_as_its_lock_was_given_up_is_released() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let (own, waiter) = on_a_runtime_of_its_own(&proxy).await;
    let waiting = grant_on_the_wire(&server, &proxy, &waiter, own.handle(), "closed").await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let closing = own.spawn(waiter.close());
    proxy.thaw();
    closing.await.unwrap();
    end(own).await;
    free_soon(&server, "closed").await;
}

/// A client connected through `proxy` on a runtime of its own, as a
/// program's: dropping that runtime ([`end`]) ends every task the client
/// left, as the program's exit would.
async fn on_a_runtime_of_its_own(proxy: &FreezableProxy) -> (tokio::runtime::Runtime, Client) {
    let own = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = own
        .spawn(Client::connect(proxy.addr_string()))
        .await
        .unwrap()
        .unwrap();
    (own, client)
}

/// Ends every task of `own`, a release still under way included; a
/// runtime is dropped where blocking is allowed.
async fn end(own: tokio::runtime::Runtime) {
    tokio::task::spawn_blocking(move || drop(own))
        .await
        .unwrap();
}

/// Cuts the connection of `guard` (taken through `proxy`) and waits until
/// the guard's side has seen it end; then lets new connections through
/// again, the one a release by fence needs. The server keeps a lease.
async fn cut_off(guard: &dlock::LockGuard, proxy: &FreezableProxy) {
    proxy.sever();
    tokio::time::timeout(PATIENCE, guard.client().closed())
        .await
        .expect("the guard's connection ends");
    proxy.heal();
}

#[tokio::test]
async fn a_dropped_lease_guard_whose_connection_ended_is_released_by_fence() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let holder = Client::connect(proxy.addr_string()).await.unwrap();
    let guard = holder
        .lock(["cut"], LockOptions::new().lease(HOUR))
        .await
        .unwrap();
    cut_off(&guard, &proxy).await;
    // Its Unlock has no connection to go on; the lease would run an hour.
    drop(guard);
    free_soon(&server, "cut").await;
}

/// As a program that drops a lease's guard whose connection ended and
/// exits: the holder runs on a runtime of its own, which ends as soon as
/// `close` returns, so the release must be done by then.
#[tokio::test]
async fn close_returns_once_a_dropped_lease_guard_is_released_by_fence() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let (own, holder) = on_a_runtime_of_its_own(&proxy).await;
    let guard = own
        .spawn({
            let holder = holder.clone();
            async move { holder.lock(["exit"], LockOptions::new().lease(HOUR)).await }
        })
        .await
        .unwrap()
        .unwrap();
    cut_off(&guard, &proxy).await;
    own.spawn(async move {
        drop(guard);
        holder.close().await;
    })
    .await
    .unwrap();
    end(own).await;
    // Nothing of the holder runs any more.
    let other = client(&server).await;
    match other.lock(["exit"], LockOptions::new().no_wait()).await {
        Ok(g) => g.unlock().await.unwrap(),
        Err(e) => panic!("close returned before the dropped lease was released: {e}"),
    }
}
