//! A leader that stalls instead of dying (SIGSTOP, as a VM freeze, a long
//! fsync or CPU starvation would stall it) costs no `dlock` its lock and no
//! waiter its place in line, however long the stall, once the other nodes
//! have elected a new leader: the clients notice the silence within a
//! couple of seconds, even while a Lock waits, and resume their sessions
//! on the new leader. Stalled here for longer than the session TTL, so a
//! client that only waited would find its session ended. The same holds
//! for a leader cut off by a path that drops packets without a reset.

mod common;

use common::{code, dlock_at, lines, seen_by_the_others, stderr, wait_output, PATIENCE};
use dlock::{Client, LockGuard, LockOptions};
use dlock_server::testing::nodes::{server_binary, NodeProcesses};
use dlock_server::testing::peer_links::PeerLinks;
use dlock_server::testing::proxy::FreezableProxy;
use std::time::{Duration, Instant};

/// One cluster at a time: three node processes are load enough for two
/// cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The default session TTL (10 s), and an election timeout short enough
/// that a new leader is in office well within it on a loaded machine.
const NODE_FLAGS: &[&str] = &["--heartbeat", "100ms", "--election-timeout", "500ms"];

/// Longer than the session TTL.
const STALL: Duration = Duration::from_secs(12);

async fn holder_and_waiter_ride_through_a_stalled_leader(extra: &[&'static str]) {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let servers = nodes.servers();
    let dir = tempfile::tempdir().expect("temp dir");
    let done = dir.path().join("done");
    let log = dir.path().join("log");
    let with = |args: &[&'static str]| -> Vec<&'static str> {
        let mut all = vec!["-v"];
        all.extend_from_slice(extra);
        all.extend_from_slice(args);
        all
    };
    // The holder prints its fence, runs until the test says, then writes
    // its name; the waiter writes its name once it gets the key.
    let script = r#"echo "$DLOCK_FENCE"; while [ ! -e "$DONE" ]; do sleep 0.05; done; echo holder >> "$LOG""#;
    let mut holder = dlock_at(&servers, &with(&["-k", "w", "--", "sh", "-c", script]))
        .env("DONE", &done)
        .env("LOG", &log)
        .spawn()
        .expect("dlock starts");
    let fence: u64 = lines(&mut holder, 1).await[0].parse().expect("a fence");
    let waiter = dlock_at(
        &servers,
        &with(&["-k", "w", "--", "sh", "-c", r#"echo waiter >> "$LOG""#]),
    )
    .env("LOG", &log)
    .spawn()
    .expect("dlock starts");
    let observer = Client::connect(servers.as_str()).await.expect("connect");
    let deadline = Instant::now() + PATIENCE;
    while observer.inspect(["w"]).await.expect("inspect")[0].waiters != 1 {
        assert!(Instant::now() < deadline, "the waiter never got in line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = nodes.index_of(&observer.addr()).expect("a node");
    drop(observer);

    nodes.pause(old);
    let paused = Instant::now();
    // While the old leader sleeps, the new one holds the same grant and the
    // same waiter: both clients moved their sessions over.
    let (held, waiting) = seen_by_the_others(&nodes, old, "w").await;
    assert_eq!((held, waiting), (fence, 1), "after the election");
    tokio::time::sleep_until((paused + STALL).into()).await;
    let (held, waiting) = seen_by_the_others(&nodes, old, "w").await;
    assert_eq!(
        (held, waiting),
        (fence, 1),
        "a TTL after the stall began, both sessions live"
    );
    nodes.resume(old);

    std::fs::write(&done, b"").expect("tell the holder to end");
    let out = wait_output(holder).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "the holder's command ran to its end: {err}");
    assert!(err.contains("resumed on"), "{err}");
    let out = wait_output(waiter).await;
    assert_eq!(code(&out), 0, "the waiter ran: {}", stderr(&out));
    let order = std::fs::read_to_string(&log).expect("the log");
    assert_eq!(order, "holder\nwaiter\n", "one after the other, in line");
    assert!(!nodes.any_panicked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_costs_no_lock_and_no_place_in_line() {
    holder_and_waiter_ride_through_a_stalled_leader(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_costs_no_lease_and_no_place_in_line() {
    holder_and_waiter_ride_through_a_stalled_leader(&["--lease", "30s"]).await;
}

/// A cluster whose clients reach each node through a proxy the test
/// freezes (with `peers`, every peer link too), a holder of `key` and a
/// waiter in line behind it.
struct Proxied {
    nodes: NodeProcesses,
    links: Option<PeerLinks>,
    clients: Vec<FreezableProxy>,
    servers: Vec<String>,
    holder: Client,
    guard: LockGuard,
    waiting: tokio::task::JoinHandle<dlock::Result<LockGuard>>,
    /// The node the holder is on: the leader.
    leader: usize,
}

impl Proxied {
    async fn start(key: &'static str, peers: bool) -> Proxied {
        let mut nodes = NodeProcesses::prepare(server_binary(), 3, NODE_FLAGS);
        let links = if peers {
            Some(PeerLinks::install(&mut nodes).await)
        } else {
            None
        };
        let mut clients = Vec::new();
        for i in 0..nodes.len() {
            let p = FreezableProxy::start(nodes.addr(i)).await;
            nodes.advertise_client(i, p.addr);
            clients.push(p);
        }
        nodes.start_all();
        let servers = clients
            .iter()
            .map(FreezableProxy::addr_string)
            .collect::<Vec<_>>();
        let holder = Client::connect(servers.clone()).await.expect("connect");
        let guard = holder.lock([key], LockOptions::new()).await.expect("lock");
        let waiter = Client::connect(servers.clone()).await.expect("connect");
        let waiting = tokio::spawn(async move { waiter.lock([key], LockOptions::new()).await });
        let deadline = Instant::now() + PATIENCE;
        while holder.inspect([key]).await.expect("inspect")[0].waiters != 1 {
            assert!(Instant::now() < deadline, "the waiter never got in line");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let leader = clients
            .iter()
            .position(|p| p.addr_string() == holder.addr())
            .expect("the holder is on a node's proxy");
        Proxied {
            nodes,
            links,
            clients,
            servers,
            holder,
            guard,
            waiting,
            leader,
        }
    }

    /// The holder releases; the waiter, still in line, gets the key under a
    /// higher fence.
    async fn hand_off(self) {
        let fence = self.guard.fence();
        self.guard.unlock().await.expect("unlock");
        let next = tokio::time::timeout(PATIENCE, self.waiting)
            .await
            .expect("granted in time")
            .expect("task")
            .expect("the waiter kept its place and gets the key");
        assert!(next.fence() > fence);
        assert!(!self.nodes.any_panicked());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_by_a_silent_path_costs_no_lock_and_no_place_in_line() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Every path to and from a node goes through a proxy the test freezes:
    // packets dropped, no reset, both ends' sockets open.
    let c = Proxied::start("x", true).await;
    let (old, links) = (c.leader, c.links.as_ref().expect("peer proxies"));
    links.isolate(old, true);
    c.clients[old].freeze();
    let cut = Instant::now();
    let (held, in_line) = seen_by_the_others(&c.nodes, old, "x").await;
    assert_eq!((held, in_line), (c.guard.fence(), 1), "after the election");
    tokio::time::sleep_until((cut + STALL).into()).await;
    let (held, in_line) = seen_by_the_others(&c.nodes, old, "x").await;
    assert_eq!(
        (held, in_line),
        (c.guard.fence(), 1),
        "a TTL after the cut, both sessions live"
    );
    assert!(!c.guard.is_lost(), "the holder kept its lock throughout");
    assert_ne!(c.holder.addr(), c.servers[old], "the holder moved");
    links.isolate(old, false);
    c.clients[old].thaw();
    c.hand_off().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_clients_only_keeps_their_lock_and_place_once_the_path_heals() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Proxied::start("y", false).await;
    let leader = c.leader;
    // The leader keeps leading (its peers hear it); only the clients' path
    // to it goes silent, longer than the probe's limit. The clients find
    // no other leader and keep trying it until the path heals, well within
    // the session's TTL.
    c.clients[leader].freeze();
    let mut events = c.holder.events();
    match tokio::time::timeout(PATIENCE, events.recv()).await {
        Ok(Ok(dlock::Event::Reconnecting { .. })) => {}
        other => panic!("expected the silence noticed, got {other:?}"),
    }
    c.clients[leader].thaw();
    loop {
        match tokio::time::timeout(PATIENCE, events.recv()).await {
            Ok(Ok(dlock::Event::Resumed { addr, .. })) => {
                assert_eq!(addr, c.servers[leader], "resumed on the same leader");
                break;
            }
            Ok(Ok(_)) => continue,
            other => panic!("expected the session resumed, got {other:?}"),
        }
    }
    assert!(!c.guard.is_lost(), "the holder kept its lock");
    let (held, in_line) = seen_by_the_others(&c.nodes, usize::MAX, "y").await;
    assert_eq!((held, in_line), (c.guard.fence(), 1));
    c.hand_off().await;
}
