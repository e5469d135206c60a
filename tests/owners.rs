//! One `Client` shared by many tasks: every lock is its own owner, so tasks
//! exclude each other as processes do, and a waiting lock delays nothing else.

use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::{server_binary, NodeProcesses};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(30);

/// A resource that checks its writers as a fenced store would: one writer
/// at a time, and fences that only go up.
#[derive(Default)]
struct Register {
    busy: AtomicBool,
    last_fence: AtomicU64,
}

impl Register {
    fn enter(&self, fence: u64) {
        assert!(
            !self.busy.swap(true, Ordering::SeqCst),
            "two holders at once"
        );
        let last = self.last_fence.swap(fence, Ordering::SeqCst);
        assert!(fence > last, "fence {fence} after {last}");
    }

    fn leave(&self) {
        self.busy.store(false, Ordering::SeqCst);
    }
}

/// `tasks` tasks sharing `shared`, and one task of `other` (another owner,
/// as another process is), each lock `key` `rounds` times and hold it
/// across a yield: the register sees one holder at a time and fences that
/// rise in grant order (the ownership rule, docs/CLIENTS.md).
async fn take_turns(shared: &Client, other: &Client, key: &str, tasks: u32, rounds: u32) {
    let register = Arc::new(Register::default());
    let mut running = Vec::new();
    let clients = (0..tasks).map(|_| shared).chain([other]);
    for c in clients {
        let (c, register, key) = (c.clone(), register.clone(), key.to_string());
        running.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = c.lock([key.as_str()], LockOptions::new()).await.unwrap();
                register.enter(g.fence());
                tokio::task::yield_now().await;
                assert!(!g.is_lost(), "a holder was told it lost the key it holds");
                register.leave();
                g.unlock().await.unwrap();
            }
        }));
    }
    for t in running {
        tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sharing_a_client_and_another_client_take_turns_on_a_single_server() {
    let server = TestServer::start(Config::default()).await;
    let shared = Client::connect(&server.addr_string()).await.unwrap();
    let other = Client::connect(&server.addr_string()).await.unwrap();
    take_turns(&shared, &other, "turns", 4, 25).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sharing_a_client_and_another_client_take_turns_on_a_cluster() {
    let nodes = NodeProcesses::start(
        server_binary(),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "500ms"],
    );
    let servers = nodes.servers();
    let shared = Client::connect(servers.as_str()).await.unwrap();
    let other = Client::connect(servers.as_str()).await.unwrap();
    take_turns(&shared, &other, "turns", 4, 10).await;
}

async fn waiters(c: &Client, key: &str, n: u32) {
    let deadline = Instant::now() + PATIENCE;
    while c.inspect([key]).await.unwrap()[0].waiters != n {
        assert!(Instant::now() < deadline, "{key} never had {n} waiters");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sharing_a_client_never_hold_a_key_together() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let register = Arc::new(Register::default());
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (c, register) = (c.clone(), register.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                let g = c.lock(["shared"], LockOptions::new()).await.unwrap();
                register.enter(g.fence());
                tokio::task::yield_now().await;
                register.leave();
                // Half release explicitly, half by dropping the guard.
                if (t + i) % 2 == 0 {
                    g.unlock().await.unwrap();
                } else {
                    drop(g);
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
    }
    // A dropped guard's release is sent in the background: wait for it.
    let deadline = Instant::now() + PATIENCE;
    while c.inspect(["shared"]).await.unwrap()[0].fence().is_some() {
        assert!(Instant::now() < deadline, "the last release never arrived");
        tokio::task::yield_now().await;
    }
    waiters(&c, "shared", 0).await;
}

#[tokio::test]
async fn a_second_task_of_one_client_queues_in_fifo_order() {
    let server = TestServer::start(Config::default()).await;
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let first = c.lock(["fifo"], LockOptions::new()).await.unwrap();
    let second = tokio::spawn({
        let c = c.clone();
        async move { c.lock(["fifo"], LockOptions::new()).await.unwrap() }
    });
    waiters(&c, "fifo", 1).await;
    assert!(!first.is_lost(), "the first holder keeps its lock");
    // The first task releases and asks again at once: it goes behind.
    first.unlock().await.unwrap();
    let again = tokio::spawn({
        let c = c.clone();
        async move { c.lock(["fifo"], LockOptions::new()).await.unwrap() }
    });
    let second = tokio::time::timeout(PATIENCE, second)
        .await
        .unwrap()
        .unwrap();
    waiters(&c, "fifo", 1).await;
    let second_fence = second.fence();
    second.unlock().await.unwrap();
    let again = tokio::time::timeout(PATIENCE, again)
        .await
        .unwrap()
        .unwrap();
    assert!(again.fence() > second_fence);
    again.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_delays_no_ping_unlock_or_other_lock() {
    let server = TestServer::start(Config::default()).await;
    let other = Client::connect(&server.addr_string()).await.unwrap();
    let hot = other.lock(["hot"], LockOptions::new()).await.unwrap();
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.lock(["hot"], LockOptions::new()).await }
    });
    waiters(&other, "hot", 1).await;
    let mut tasks = Vec::new();
    for t in 0..100 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("own-{t}");
            for _ in 0..100 {
                let g = c.lock([key.as_str()], LockOptions::new()).await.unwrap();
                g.unlock().await.unwrap();
            }
            c.ping().await.unwrap();
        }));
    }
    for t in tasks {
        tokio::time::timeout(PATIENCE, t)
            .await
            .expect("no call waits behind the waiting lock")
            .unwrap();
    }
    assert!(!waiting.is_finished(), "the waiting lock still waits");
    hot.unlock().await.unwrap();
    let g = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn an_abandoned_lock_future_leaves_nothing_queued() {
    let server = TestServer::start(Config::default()).await;
    let other = Client::connect(&server.addr_string()).await.unwrap();
    let _hot = other.lock(["gone"], LockOptions::new()).await.unwrap();
    let c = Client::connect(&server.addr_string()).await.unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        c.lock(["gone"], LockOptions::new()),
    )
    .await;
    assert!(gave_up.is_err(), "the key is busy");
    waiters(&other, "gone", 0).await;
    // The client itself is unharmed.
    c.ping().await.unwrap();
}

#[tokio::test]
async fn dropping_the_client_closes_every_connection_it_opened() {
    let server = TestServer::start(Config::default()).await;
    let watcher = Client::connect(&server.addr_string()).await.unwrap();
    let c = Client::connect(&server.addr_string()).await.unwrap();
    for key in ["a", "b", "c"] {
        c.lock([key], LockOptions::new())
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
    let _parts = c
        .lock(["kept"], LockOptions::new())
        .await
        .unwrap()
        .into_parts();
    assert!(watcher.stats().await.unwrap().connections > 2);
    drop(c);
    // Only the watcher stays (the server closes the rest as they close).
    let deadline = Instant::now() + PATIENCE;
    while watcher.stats().await.unwrap().connections != 1 {
        assert!(Instant::now() < deadline, "connections left open");
        tokio::task::yield_now().await;
    }
    assert_eq!(watcher.inspect(["kept"]).await.unwrap()[0].fence(), None);
}
