//! A cluster of real `dlock-server` processes on loopback (issue 12): a
//! leader serves, followers redirect, and every acknowledged lock survives
//! the leader's SIGKILL, a paused or cut-off leader, and the whole
//! cluster's restart.
//! Faults come from the test: SIGKILL, SIGSTOP/SIGCONT, an RST, and
//! proxies on the peer links that cut a leader off. The nodes
//! are `dlock_server::testing::nodes::NodeProcesses`, as in every process
//! test of a cluster.

mod common;

use common::{in_session, status, TestClient, PATIENCE};
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock_server::testing::nodes::NodeProcesses;
use dlock_server::testing::peer_links::PeerLinks;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One cluster at a time: three processes each are load enough, and a
/// starved heartbeat would move leadership under a test.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The nodes (`dlock_server::testing::nodes`), with settings generous for
/// a loaded 2-core machine running other tests: a leader must not lose
/// office to a slow heartbeat mid-test.
struct Cluster {
    nodes: NodeProcesses,
}

impl Cluster {
    fn new(n: u64) -> Cluster {
        Cluster::with_flags(n, &[])
    }

    fn with_flags(n: u64, extra: &[&str]) -> Cluster {
        let mut flags = vec!["--heartbeat", "100ms", "--election-timeout", "1s"];
        flags.extend_from_slice(extra);
        let nodes = NodeProcesses::start(env!("CARGO_BIN_EXE_dlock-server"), n, &flags);
        Cluster { nodes }
    }

    fn start(&mut self, i: usize) {
        self.nodes.restart(i);
    }

    fn kill(&mut self, i: usize) {
        self.nodes.kill(i);
    }

    /// The leader, once it is settled: it answers an Inspect (only a
    /// leader with a quorum does) and every other running node (but
    /// `except`) names it in NotLeader. Panics after PATIENCE.
    async fn leader(&self, except: Option<usize>) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let answers = self.ask_all(except).await;
            let leaders: Vec<usize> = answers
                .iter()
                .filter(|(_, r)| status(r) == ResponseStatus::Ok)
                .map(|(i, _)| *i)
                .collect();
            if let [l] = leaders[..] {
                let named = self.nodes.addr(l).to_string();
                let settled = answers.iter().all(|(i, r)| {
                    *i == l || (status(r) == ResponseStatus::NotLeader && r.leader_addr == named)
                });
                if settled {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no settled leader within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every running node's answer to an Inspect without keys; a node that
    /// does not answer within a second is left out.
    async fn ask_all(&self, except: Option<usize>) -> Vec<(usize, Response)> {
        let mut out = Vec::new();
        for i in 0..self.nodes.len() {
            if Some(i) == except || !self.nodes.is_running(i) {
                continue;
            }
            let addr = self.nodes.addr(i);
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                    .await
            else {
                continue;
            };
            drop(stream);
            let mut c = TestClient::connect(addr).await;
            let req = c.request(RequestType::Inspect, &[]);
            c.send(&req).await;
            if let Ok(Some(r)) = tokio::time::timeout(Duration::from_secs(2), c.try_recv()).await {
                out.push((i, r));
            }
        }
        out
    }

    async fn conn(&self, i: usize) -> TestClient {
        TestClient::connect(self.nodes.addr(i)).await
    }
}

async fn call(c: &mut TestClient, kind: RequestType, keys: &[&str], session: u64) -> Response {
    c.call_in(kind, keys, session).await
}

/// Opens a session (`resume` 0) or resumes one; returns its id.
async fn session(c: &mut TestClient, resume: u64, ttl: Duration) -> Response {
    let mut req = c.request(RequestType::OpenSession, &[]);
    req.session = resume;
    req.session_ttl_micro = ttl.as_micros() as u64;
    c.call(req).await
}

async fn open(c: &mut TestClient) -> u64 {
    let r = session(c, 0, Duration::ZERO).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert_eq!(r.session_ttl_micro, 10_000_000, "the default TTL");
    r.session
}

fn lock_req(
    c: &mut TestClient,
    key: &str,
    session: u64,
    lease: Duration,
    try_lock: bool,
) -> Request {
    let mut req = c.lock_request(&[key], 0, lease.as_micros() as u64);
    if let Some(l) = req.lock.as_mut() {
        l.try_lock = try_lock;
    }
    in_session(req, session)
}

async fn must_lock(c: &mut TestClient, key: &str, session: u64, lease: Duration) -> u64 {
    let req = lock_req(c, key, session, lease, true);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "lock {key}: {r:?}");
    r.fence
}

async fn inspect(c: &mut TestClient, key: &str, session: u64) -> dlock::proto::KeyInfo {
    let r = call(c, RequestType::Inspect, &[key], session).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    r.key_info.into_iter().next().expect("one key")
}

async fn await_waiters(c: &mut TestClient, key: &str, n: u32) {
    let deadline = Instant::now() + PATIENCE;
    while inspect(c, key, 0).await.waiters != n {
        assert!(Instant::now() < deadline, "{key} never had {n} waiters");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_serves_and_followers_name_it() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let f = (l + 1) % 3;
    let mut follower = cluster.conn(f).await;
    // A follower learns who leads from the leader's first heartbeat.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = follower.try_lock(&["k"]).await;
        assert_eq!(status(&r), ResponseStatus::NotLeader, "{r:?}");
        if !r.leader_addr.is_empty() {
            assert_eq!(r.leader_addr, cluster.nodes.addr(l).to_string());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower never named the leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status(&follower.ping().await),
        ResponseStatus::Ok,
        "any node answers a ping"
    );

    // Locks, leases and a queue through the leader, in sessions.
    let (mut a, mut b) = (cluster.conn(l).await, cluster.conn(l).await);
    let (sa, sb) = (open(&mut a).await, open(&mut b).await);
    let f1 = must_lock(&mut a, "k", sa, Duration::ZERO).await;
    let f2 = must_lock(&mut a, "leased", sa, Duration::from_secs(60)).await;
    assert!(f2 > f1);
    let wait = lock_req(&mut b, "k", sb, Duration::ZERO, false);
    b.send(&wait).await;
    await_waiters(&mut a, "k", 1).await;
    let info = inspect(&mut a, "k", sa).await;
    assert!(info.held_by_caller && info.fence == f1, "{info:?}");
    let r = call(&mut a, RequestType::Unlock, &["k"], sa).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let granted = b.recv().await;
    assert_eq!(
        (granted.request_id, status(&granted)),
        (wait.id, ResponseStatus::Ok)
    );
    assert!(granted.fence > f2, "fences increase");
    let leased = inspect(&mut b, "leased", sb).await;
    assert!(leased.lease_remaining_micro > 50_000_000, "{leased:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_loses_no_acknowledged_lock_and_no_place_in_line() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let sa = open(&mut a).await;
    let bound = must_lock(&mut a, "bound", sa, Duration::ZERO).await;
    let leased = must_lock(&mut a, "leased", sa, Duration::from_secs(60)).await;
    // Two waiters in order, each in its own session.
    let (mut b, mut c) = (cluster.conn(l).await, cluster.conn(l).await);
    let (sb, sc) = (open(&mut b).await, open(&mut c).await);
    let wait_b = lock_req(&mut b, "bound", sb, Duration::ZERO, false);
    b.send(&wait_b).await;
    await_waiters(&mut a, "bound", 1).await;
    let wait_c = lock_req(&mut c, "bound", sc, Duration::ZERO, false);
    c.send(&wait_c).await;
    await_waiters(&mut a, "bound", 2).await;

    let killed = Instant::now();
    cluster.kill(l);
    let l2 = cluster.leader(Some(l)).await;
    println!(
        "new leader serving {:?} after the SIGKILL",
        killed.elapsed()
    );

    // Each client resumes its session on the new leader.
    let mut a = cluster.conn(l2).await;
    for (conn, s) in [(&mut a, sa)] {
        let r = session(conn, s, Duration::ZERO).await;
        assert_eq!((status(&r), r.session), (ResponseStatus::Ok, s), "{r:?}");
    }
    let info = inspect(&mut a, "bound", sa).await;
    assert!(info.held_by_caller && info.fence == bound, "{info:?}");
    assert_eq!(info.waiters, 2, "both waits kept their place");
    let info = inspect(&mut a, "leased", sa).await;
    assert!(info.held_by_caller && info.fence == leased, "{info:?}");

    let (mut b, mut c) = (cluster.conn(l2).await, cluster.conn(l2).await);
    assert_eq!(
        status(&session(&mut b, sb, Duration::ZERO).await),
        ResponseStatus::Ok
    );
    assert_eq!(
        status(&session(&mut c, sc, Duration::ZERO).await),
        ResponseStatus::Ok
    );
    // The answers to the waits were lost with the old connections: each
    // client asks again; a session that holds a key is granted it again.
    let again_c = lock_req(&mut c, "bound", sc, Duration::ZERO, false);
    c.send(&again_c).await;
    let again_b = lock_req(&mut b, "bound", sb, Duration::ZERO, false);
    b.send(&again_b).await;
    await_waiters(&mut a, "bound", 4).await;

    let r = call(&mut a, RequestType::Unlock, &["bound"], sa).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got_b = b.recv().await;
    assert_eq!(
        (got_b.request_id, status(&got_b)),
        (again_b.id, ResponseStatus::Ok)
    );
    assert!(
        got_b.fence > leased,
        "fences keep increasing across the failover"
    );
    let info = inspect(&mut a, "bound", sa).await;
    assert_eq!(info.fence, got_b.fence, "c still waits behind b: {info:?}");
    let r = call(&mut b, RequestType::Unlock, &["bound"], sb).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got_c = c.recv().await;
    assert_eq!(
        (got_c.request_id, status(&got_c)),
        (again_c.id, ResponseStatus::Ok)
    );
    assert!(got_c.fence > got_b.fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_grants_nothing_once_replaced() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut stale = cluster.conn(l).await;
    let s = open(&mut stale).await;
    cluster.nodes.pause(l);
    let l2 = cluster.leader(Some(l)).await;
    let mut fresh = cluster.conn(l2).await;
    let sf = open(&mut fresh).await;
    let fence = must_lock(&mut fresh, "k", sf, Duration::ZERO).await;

    // Awake, the old leader still believes it leads until it hears the
    // new term: whatever it answers, it must not be a grant. (Once it has
    // heard, it resets the connection instead of answering at all.)
    cluster.nodes.resume(l);
    let req = lock_req(&mut stale, "k", s, Duration::ZERO, true);
    if stale.try_send(&req).await {
        if let Some(r) = stale.try_recv().await {
            assert_ne!(status(&r), ResponseStatus::Ok, "two holders: {r:?}");
            // Nor does it tell the stale client that its session lives.
            let ping = stale.request(RequestType::Ping, &[]);
            if stale.try_send(&ping).await {
                if let Some(r) = stale.try_recv().await {
                    assert_ne!(status(&r), ResponseStatus::Ok, "{r:?}");
                }
            }
        }
    }
    let info = inspect(&mut fresh, "k", sf).await;
    assert!(info.held_by_caller && info.fence == fence, "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_resets_the_connections_whose_sessions_it_kept() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut held = cluster.conn(l).await;
    // A TTL longer than the pause and election below, so the session is
    // there to resume.
    let s = session(&mut held, 0, Duration::from_secs(120))
        .await
        .session;
    let fence = must_lock(&mut held, "k", s, Duration::ZERO).await;
    let mut bystander = cluster.conn(l).await;
    let r = bystander.ping().await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");

    cluster.nodes.pause(l);
    let l2 = cluster.leader(Some(l)).await;
    cluster.nodes.resume(l);
    // Awake, the old leader hears the new term and steps down. The client
    // sent nothing, yet learns at once: its connection is reset, with no
    // answer that could be taken for proof that the session lives.
    held.expect_closed().await;

    // The reset did not end the session: it resumes on the new leader,
    // its lock kept.
    let mut again = cluster.conn(l2).await;
    let r = session(&mut again, s, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, s), "{r:?}");
    let info = inspect(&mut again, "k", s).await;
    assert!(info.held_by_caller && info.fence == fence, "{info:?}");
    // A connection with no session is not the old leader's to reset: it
    // stays, and is told where the leader is.
    let r = bystander.call_in(RequestType::Inspect, &["k"], 0).await;
    assert_eq!(status(&r), ResponseStatus::NotLeader, "{r:?}");
}

/// A cluster of `n` whose every peer link goes through a proxy the test
/// controls.
async fn with_peer_proxies(n: u64) -> (Cluster, PeerLinks) {
    let mut nodes = NodeProcesses::prepare(
        env!("CARGO_BIN_EXE_dlock-server"),
        n,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let links = PeerLinks::install(&mut nodes).await;
    nodes.start_all();
    (Cluster { nodes }, links)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_others_grants_nothing() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (cluster, links) = with_peer_proxies(3).await;
    let l = cluster.leader(None).await;
    let mut stale = cluster.conn(l).await;
    let s = open(&mut stale).await;
    let held = must_lock(&mut stale, "held", s, Duration::from_secs(120)).await;

    // Cut off, the old leader still believes it leads: it takes the Lock
    // into its log but can never commit it.
    links.isolate(l, true);
    let cut_off = lock_req(&mut stale, "k", s, Duration::ZERO, true);
    stale.send(&cut_off).await;

    // The others elect a leader, which grants the key to someone else.
    let l2 = cluster.leader(Some(l)).await;
    assert_ne!(l2, l);
    let mut fresh = cluster.conn(l2).await;
    let sf = open(&mut fresh).await;
    let fence = must_lock(&mut fresh, "k", sf, Duration::ZERO).await;

    // The stale client is told (within the commit timeout, while the cut
    // lasts), or its connection is reset as the old leader steps aside
    // (its session goes on elsewhere): never granted.
    if let Some(r) = stale.try_recv().await {
        assert!(
            matches!(
                status(&r),
                ResponseStatus::Unavailable | ResponseStatus::NotLeader
            ),
            "a cut-off leader must not grant: {r:?}"
        );
    }

    // Its own status says what its answers do: openraft still counts it
    // leader, but it stepped aside and names no leader (it called itself
    // leader, naming itself, while /readyz said there was none).
    let mut view = cluster.conn(l).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = call(&mut view, RequestType::ClusterStatus, &[], 0).await;
        let info = r.cluster.expect("a status");
        if info.role == "SteppedAside" {
            assert_eq!(info.leader_id, 0, "{info:?}");
            break;
        }
        assert_eq!(info.role, "Leader", "until it steps aside: {info:?}");
        assert!(Instant::now() < deadline, "never stepped aside: {info:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Healed, the old leader learns the new term and steps down: the log
    // entry it could not commit is gone, the new holder keeps the key, the
    // lease taken before the cut is still held under its fence.
    links.isolate(l, false);
    assert_eq!(cluster.leader(None).await, l2, "the new leader stays");
    let info = inspect(&mut fresh, "k", sf).await;
    assert!(info.held_by_caller && info.fence == fence, "{info:?}");
    let info = inspect(&mut fresh, "held", sf).await;
    assert_eq!(info.fence, held, "the lease outlives the cut: {info:?}");
    let mut again = cluster.conn(l).await;
    let req = lock_req(&mut again, "k", 0, Duration::ZERO, true);
    let r = again.call(req).await;
    assert_eq!(status(&r), ResponseStatus::NotLeader, "{r:?}");
    assert_eq!(r.leader_addr, cluster.nodes.addr(l2).to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lives_while_its_lock_waits_longer_than_its_ttl() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut holder = cluster.conn(l).await;
    let sh = open(&mut holder).await;
    must_lock(&mut holder, "b", sh, Duration::ZERO).await;

    let mut a = cluster.conn(l).await;
    let r = session(&mut a, 0, Duration::from_secs(1)).await;
    let s = r.session;
    let held = must_lock(&mut a, "a", s, Duration::ZERO).await;
    let wait = lock_req(&mut a, "b", s, Duration::ZERO, false);
    a.send(&wait).await;
    await_waiters(&mut holder, "b", 1).await;
    // Three TTLs pass while the Lock waits and a's own requests are parked
    // behind it: the open connection keeps the session alive.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let info = inspect(&mut holder, "a", sh).await;
        assert_eq!(
            info.fence, held,
            "a's lock is kept while it waits: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = call(&mut holder, RequestType::Unlock, &["b"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got = a.recv().await;
    assert_eq!(
        (got.request_id, status(&got)),
        (wait.id, ResponseStatus::Ok),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restarts_with_its_leases_and_fences() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let s = open(&mut a).await;
    let leased = must_lock(&mut a, "leased", s, Duration::from_secs(60)).await;
    drop(a);
    for i in 0..3 {
        cluster.kill(i);
    }
    for i in 0..3 {
        cluster.start(i);
    }
    let l = cluster.leader(None).await;
    let mut b = cluster.conn(l).await;
    let sb = open(&mut b).await;
    let info = inspect(&mut b, "leased", sb).await;
    assert_eq!(info.fence, leased, "{info:?}");
    assert!(
        info.lease_remaining_micro > 0 && info.lease_remaining_micro <= 60_000_000,
        "{info:?}"
    );
    let r = b.try_lock(&["leased"]).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout, "{r:?}");
    assert!(must_lock(&mut b, "other", sb, Duration::ZERO).await > leased);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_outlives_a_broken_connection_for_its_ttl_only() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let r = session(&mut a, 0, Duration::from_secs(1)).await;
    assert_eq!(r.session_ttl_micro, 1_000_000);
    let s = r.session;
    must_lock(&mut a, "k", s, Duration::ZERO).await;
    // An RST, not a FIN: the path broke, the client did not leave.
    socket2::SockRef::from(&*a.stream())
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(a);
    let mut b = cluster.conn(l).await;
    let sb = open(&mut b).await;
    let info = inspect(&mut b, "k", sb).await;
    assert_ne!(info.fence, 0, "still held within the TTL");
    let deadline = Instant::now() + PATIENCE;
    while inspect(&mut b, "k", sb).await.fence != 0 {
        assert!(Instant::now() < deadline, "the session never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = session(&mut b, s, Duration::ZERO).await;
    assert_eq!(status(&r), ResponseStatus::UnknownSession, "{r:?}");

    // A clean close ends a session at once.
    let mut c = cluster.conn(l).await;
    let sc = open(&mut c).await;
    must_lock(&mut c, "clean", sc, Duration::ZERO).await;
    drop(c);
    let r = b.lock(&["clean"], 20_000_000, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");

    // A session resumed on a new connection is that connection's: the old
    // one closing cleanly must not end it.
    let mut old = cluster.conn(l).await;
    let so = open(&mut old).await;
    let fence = must_lock(&mut old, "moved", so, Duration::ZERO).await;
    let mut new = cluster.conn(l).await;
    let r = session(&mut new, so, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, so), "{r:?}");
    let before = b.stats().await.connections;
    drop(old);
    // Wait until the node has handled the old connection's end (the count
    // drops right before it decides whether to end the session); a later
    // proposal is then queued behind any Disconnect it would have made.
    let deadline = Instant::now() + PATIENCE;
    while b.stats().await.connections != before - 1 {
        assert!(Instant::now() < deadline, "the old connection never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = b.try_lock(&["moved"]).await;
    assert_eq!(
        status(&r),
        ResponseStatus::AcquireTimeout,
        "still held: {r:?}"
    );
    let info = inspect(&mut new, "moved", so).await;
    assert!(info.held_by_caller && info.fence == fence, "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_opened_a_session_loses_its_locks_when_its_connection_is_reset() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // A TTL far beyond the waits below: a grant within them can only come
    // from the reset ending the implicit session, not from its TTL.
    let cluster = Cluster::with_flags(3, &["--session-ttl", "5min"]);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let r = a.lock(&["k"], 0, 0).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let mut b = cluster.conn(l).await;
    let waiting = b.lock_request(&["k"], 30_000_000, 0);
    b.send(&waiting).await;
    let mut look = cluster.conn(l).await;
    look.await_waiters("k", 1).await;
    // An RST, as a crashed client's kernel sends: not a clean close.
    socket2::SockRef::from(&*a.stream())
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(a);
    let r = b.recv().await;
    assert_eq!(
        status(&r),
        ResponseStatus::Ok,
        "the waiter is granted when the holder's connection is reset: {r:?}"
    );

    // A session opened by name still outlives a reset (it can be resumed).
    let mut c = cluster.conn(l).await;
    let sc = session(&mut c, 0, Duration::from_secs(60)).await.session;
    must_lock(&mut c, "named", sc, Duration::ZERO).await;
    let before = look.stats().await.connections;
    socket2::SockRef::from(&*c.stream())
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(c);
    // The count drops right before the node decides whether to end the
    // connection's sessions; a later proposal queues behind any it made.
    let deadline = Instant::now() + PATIENCE;
    while look.stats().await.connections != before - 1 {
        assert!(
            Instant::now() < deadline,
            "the reset connection never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = b.try_lock(&["named"]).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout, "{r:?}");
}

/// ClusterAdd or ClusterRemove of the node with these id and addresses.
async fn cluster_request(
    c: &mut TestClient,
    kind: RequestType,
    node_id: u64,
    client: SocketAddr,
    peer: SocketAddr,
) -> dlock::proto::Response {
    let mut req = c.request(kind, &[]);
    req.cluster = Some(dlock::proto::RequestCluster {
        node_id,
        client_addr: client.to_string(),
        peer_addr: peer.to_string(),
    });
    c.call(req).await
}

/// [`cluster_request`] naming node `i` of `cluster`.
async fn about_node(
    c: &mut TestClient,
    kind: RequestType,
    cluster: &Cluster,
    i: usize,
) -> dlock::proto::Response {
    let n = &cluster.nodes;
    cluster_request(c, kind, n.id(i), n.addr(i), n.peer_addr(i)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_added_and_another_removed_while_locks_are_served() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let s = open(&mut a).await;
    let first = must_lock(&mut a, "before", s, Duration::ZERO).await;

    // A fourth node, started with the current members, waits to be added.
    let fourth = cluster.nodes.add_joiner();
    cluster.start(fourth);
    let r = about_node(&mut a, RequestType::ClusterAdd, &cluster, fourth).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let info = r.cluster.expect("the new view");
    assert_eq!(info.members.len(), 4);
    assert!(info.members.iter().all(|m| m.voter), "{info:?}");
    let second = must_lock(&mut a, "during", s, Duration::ZERO).await;
    assert!(second > first);

    // Remove a follower, then check the status every node gives.
    let gone = (0..3).find(|&i| i != l).expect("a follower");
    let r = about_node(&mut a, RequestType::ClusterRemove, &cluster, gone).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let third = must_lock(&mut a, "after", s, Duration::ZERO).await;
    assert!(third > second);
    // The removed node, which hears from no leader now, stops by itself,
    // saying why, and exits zero: a supervisor must not start it again.
    let exit = cluster.nodes.wait_for_exit(gone, PATIENCE);
    let log = cluster.nodes.recent_log(gone);
    assert_eq!(exit.and_then(|e| e.code()), Some(0), "{log:#?}");
    assert!(
        log.iter().any(|l| l.contains("is no member of the cluster")
            && l.contains("add it as a new node with a new id")),
        "{log:#?}"
    );
    // Started again with its data, as after a reboot, it asks and stops
    // the same way (its log still names it in the joint membership).
    cluster.start(gone);
    let exit = cluster.nodes.wait_for_exit(gone, PATIENCE);
    assert_eq!(
        exit.and_then(|e| e.code()),
        Some(0),
        "{:#?}",
        cluster.nodes.recent_log(gone)
    );
    // Its id is not given to a node again: started with its data, the old
    // one would answer for the new one.
    let r = about_node(&mut a, RequestType::ClusterAdd, &cluster, gone).await;
    assert_ne!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert!(
        r.error_text.contains("add this node with a new id"),
        "{r:?}"
    );
    let mut new_node = cluster.conn(fourth).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = call(&mut new_node, RequestType::ClusterStatus, &[], 0).await;
        assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
        let info = r.cluster.expect("a status");
        let ids: Vec<u64> = info.members.iter().map(|m| m.node_id).collect();
        if ids.len() == 3 && !ids.contains(&cluster.nodes.id(gone)) {
            assert_eq!(info.node_id, 4);
            assert!(info.last_applied_index > 0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 never saw the removal: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Bad admin requests are refused without effect: node id 0.
    let (client, _c) = dlock_server::testing::ports::reserve();
    let (peer, _p) = dlock_server::testing::ports::reserve();
    let r = cluster_request(&mut a, RequestType::ClusterAdd, 0, client, peer).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
}

/// ClusterAdd of node `node_id` at these addresses, as typed.
async fn add_at(c: &mut TestClient, node_id: u64, client: &str, peer: &str) -> Response {
    let mut req = c.request(RequestType::ClusterAdd, &[]);
    req.cluster = Some(dlock::proto::RequestCluster {
        node_id,
        client_addr: client.to_owned(),
        peer_addr: peer.to_owned(),
    });
    c.call(req).await
}

/// A node added where nothing answers (a typo, a node not started) is not
/// made a voter: counted in every majority, a fourth voter that does not
/// exist left a cluster of three with one node down without a majority.
/// Addresses that are no addresses, or a member's, are refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_where_nothing_answers_is_not_made_a_voter() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut a = cluster.conn(l).await;
    let s = open(&mut a).await;
    let (client, peer) = (cluster.nodes.addr(l), cluster.nodes.peer_addr(l));
    for (c, p) in [
        ("foo".to_owned(), "bar".to_owned()),
        ("127.0.0.1:0".to_owned(), peer.to_string()),
        (client.to_string(), "127.0.0.1:1".to_owned()),
        ("127.0.0.1:1".to_owned(), peer.to_string()),
    ] {
        let r = add_at(&mut a, 4, &c, &p).await;
        assert_eq!(
            status(&r),
            ResponseStatus::InvalidArgument,
            "{c} {p}: {r:?}"
        );
    }

    // Nobody listens at these: released at once, below the ephemeral range.
    let nobody = || dlock_server::testing::ports::reserve().0.to_string();
    let r = add_at(&mut a, 4, &nobody(), &nobody()).await;
    assert_eq!(status(&r), ResponseStatus::Unavailable, "{r:?}");
    assert!(r.error_text.contains("has not answered"), "{r:?}");
    assert!(r.error_text.contains("dlock cluster remove 4"), "{r:?}");
    let r = call(&mut a, RequestType::ClusterStatus, &[], 0).await;
    let info = r.cluster.expect("a status");
    let four = info
        .members
        .iter()
        .find(|m| m.node_id == 4)
        .expect("node 4");
    assert!(!four.voter, "made a voter: {info:?}");

    // Still three voters: with a follower down, two of them are a majority.
    let follower = (0..3).find(|&i| i != l).expect("a follower");
    cluster.kill(follower);
    must_lock(&mut a, "served", s, Duration::ZERO).await;
}

/// Node `id`'s peer address in `c`'s node's ClusterStatus.
async fn recorded_peer(c: &mut TestClient, id: u64) -> Option<String> {
    let r = call(c, RequestType::ClusterStatus, &[], 0).await;
    let info = r.cluster.expect("a status");
    info.members
        .into_iter()
        .find(|m| m.node_id == id)
        .map(|m| m.peer_addr)
}

/// A durable single server started without --peer-listen listens for
/// peers on a port the kernel chose, another at every start: a node added
/// to it dialled the old port after its restart, and the restarted node
/// stood for election for ever, unheard. The add is refused, saying to
/// restart it with --peer-listen; restarted so, it records that address,
/// the add goes through, and the cluster survives the first node's
/// restart. Started without --peer-listen again, it refuses to start and
/// names the port to give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_on_a_kernel_chosen_peer_port_is_grown_only_once_it_has_a_fixed_one() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let flags = ["--heartbeat", "100ms", "--election-timeout", "1s"];
    let mut nodes = NodeProcesses::prepare(env!("CARGO_BIN_EXE_dlock-server"), 1, &flags);
    nodes.single_server(0, false);
    nodes.start_all();
    let second = nodes.add_joiner();
    nodes.restart(second);
    let mut cluster = Cluster { nodes };
    let first_id = cluster.nodes.id(0);
    assert_eq!(cluster.leader(Some(second)).await, 0);
    let mut a = cluster.conn(0).await;
    let kernels = recorded_peer(&mut a, first_id).await.expect("node 1");
    let r = about_node(&mut a, RequestType::ClusterAdd, &cluster, second).await;
    assert_eq!(status(&r), ResponseStatus::Unavailable, "{r:?}");
    assert!(
        r.error_text.contains("started without --peer-listen")
            && r.error_text.contains(&kernels)
            && r.error_text.contains("Restart node 1 with --peer-listen"),
        "{r:?}"
    );
    let r = call(&mut a, RequestType::ClusterStatus, &[], 0).await;
    assert_eq!(r.cluster.expect("a status").members.len(), 1, "added");

    cluster.kill(0);
    cluster.nodes.single_server(0, true);
    cluster.start(0);
    let fixed = cluster.nodes.peer_addr(0).to_string();
    let mut a = cluster.conn(0).await;
    let deadline = Instant::now() + PATIENCE;
    while recorded_peer(&mut a, first_id).await.as_deref() != Some(fixed.as_str()) {
        assert!(
            Instant::now() < deadline,
            "node 1 never recorded its peer address {fixed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = about_node(&mut a, RequestType::ClusterAdd, &cluster, second).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");

    // Reached at its recorded port after a restart: the two elect a leader
    // that serves.
    cluster.kill(0);
    cluster.start(0);
    let l = cluster.leader(None).await;
    let mut c = cluster.conn(l).await;
    let s = open(&mut c).await;
    must_lock(&mut c, "k", s, Duration::ZERO).await;

    cluster.kill(0);
    cluster.nodes.single_server(0, false);
    let why = cluster.nodes.try_restart(0).expect_err("refused to start");
    assert!(why.contains(&format!("--peer-listen {fixed}")), "{why}");
}

/// `req` numbered `seq` in its session, the client holding every answer
/// numbered up to `done`.
fn numbered(mut req: Request, seq: u64, done: u64) -> Request {
    req.seq = seq;
    req.seq_done = done;
    req
}

/// The same request under a new id, as a client sends it again on a new
/// connection.
fn again(c: &mut TestClient, req: &Request) -> Request {
    Request {
        id: c.next_id(),
        ..req.clone()
    }
}

/// Sends `req` again and returns the answer.
async fn resend(c: &mut TestClient, req: &Request) -> Response {
    let req = again(c, req);
    c.call(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_again_after_a_leader_kill_are_answered_as_the_first_time() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    // h holds the keys a and b will wait for.
    let mut h = cluster.conn(l).await;
    let sh = open(&mut h).await;
    let mut fences = vec![
        must_lock(&mut h, "wa", sh, Duration::ZERO).await,
        must_lock(&mut h, "wb", sh, Duration::ZERO).await,
    ];

    // a: lock, unlock, lock again, then a Lock that waits.
    let mut a = cluster.conn(l).await;
    let sa = open(&mut a).await;
    let lock_k = numbered(lock_req(&mut a, "k", sa, Duration::ZERO, true), 1, 0);
    let unlock_k = numbered(in_session(a.request(RequestType::Unlock, &["k"]), sa), 2, 0);
    let relock_k = numbered(lock_req(&mut a, "k", sa, Duration::ZERO, true), 3, 0);
    let mut first = Vec::new();
    for req in [&lock_k, &unlock_k, &relock_k] {
        let r = a.call(req.clone()).await;
        assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
        first.push(r);
    }
    fences.extend([first[0].fence, first[2].fence]);
    // Numbered 4; the client sends it again below with the answers it has
    // sent before, so it says it has none yet.
    let wait_a = numbered(lock_req(&mut a, "wa", sa, Duration::ZERO, false), 4, 0);
    a.send(&wait_a).await;
    // b: a Lock that waits, as its first numbered request.
    let mut b = cluster.conn(l).await;
    let sb = open(&mut b).await;
    let wait_b = numbered(lock_req(&mut b, "wb", sb, Duration::ZERO, false), 1, 0);
    b.send(&wait_b).await;
    await_waiters(&mut h, "wa", 1).await;
    await_waiters(&mut h, "wb", 1).await;

    // None of them learns anything more from this leader.
    cluster.kill(l);
    let l2 = cluster.leader(Some(l)).await;
    let mut h = cluster.conn(l2).await;
    let r = session(&mut h, sh, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, sh), "{r:?}");
    // a's wait ends while a is away.
    let r = call(&mut h, RequestType::Unlock, &["wa"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let info = inspect(&mut h, "wa", sh).await;
    assert!(info.fence != 0 && info.waiters == 0, "a got wa: {info:?}");
    let granted_a = info.fence;

    // a resumes and sends everything again: the same answers, no effect.
    let mut a = cluster.conn(l2).await;
    let r = session(&mut a, sa, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, sa), "{r:?}");
    for (req, was) in [&lock_k, &unlock_k, &relock_k].into_iter().zip(&first) {
        let req = again(&mut a, req);
        let r = a.call(req.clone()).await;
        assert_eq!(
            (status(&r), r.fence, &r.keys),
            (ResponseStatus::Ok, was.fence, &was.keys),
            "seq {} answered as the first time: {r:?}",
            req.seq
        );
    }
    let info = inspect(&mut a, "k", sa).await;
    assert!(
        info.held_by_caller && info.fence == first[2].fence,
        "the Unlock sent again did not release the new lock: {info:?}"
    );
    let r = resend(&mut a, &wait_a).await;
    assert_eq!(
        (status(&r), r.fence),
        (ResponseStatus::Ok, granted_a),
        "the wait's outcome: {r:?}"
    );
    fences.push(granted_a);

    // b resumes while its Lock still waits: sent again, it waits for the
    // same outcome, which arrives on the new connection.
    let mut b = cluster.conn(l2).await;
    let r = session(&mut b, sb, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, sb), "{r:?}");
    let resent_b = again(&mut b, &wait_b);
    b.send(&resent_b).await;
    let r = call(&mut h, RequestType::Unlock, &["wb"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got_b = b.recv().await;
    assert_eq!(
        (got_b.request_id, status(&got_b)),
        (resent_b.id, ResponseStatus::Ok),
        "{got_b:?}"
    );
    let info = inspect(&mut h, "wb", sh).await;
    assert_eq!((info.fence, info.waiters), (got_b.fence, 0), "{info:?}");
    let r = resend(&mut b, &wait_b).await;
    assert_eq!((status(&r), r.fence), (ResponseStatus::Ok, got_b.fence));
    fences.push(got_b.fence);

    // Every token so far was answered once: nothing was granted twice.
    let fresh = must_lock(&mut h, "fresh", sh, Duration::ZERO).await;
    assert_eq!(
        fresh,
        fences.iter().max().expect("fences") + 1,
        "{fences:?}"
    );

    // Answers the client says it has are forgotten, and a forgotten number
    // acts no more.
    let unlock = numbered(in_session(a.request(RequestType::Unlock, &["k"]), sa), 5, 4);
    let r = a.call(unlock).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let r = resend(&mut a, &lock_k).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
    assert!(r.error_text.contains("seq 1"), "{r:?}");
    assert_eq!(inspect(&mut a, "k", sa).await.fence, 0, "not locked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_sent_again_after_a_broken_connection_gets_its_grant_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut h = cluster.conn(l).await;
    let sh = open(&mut h).await;
    let held = must_lock(&mut h, "w", sh, Duration::ZERO).await;
    let mut a = cluster.conn(l).await;
    let sa = open(&mut a).await;
    let wait = numbered(lock_req(&mut a, "w", sa, Duration::ZERO, false), 1, 0);
    a.send(&wait).await;
    await_waiters(&mut h, "w", 1).await;
    // An RST, not a FIN: the path broke, the client did not leave.
    socket2::SockRef::from(&*a.stream())
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(a);

    // Same node, new connection: whether or not the node has seen the old
    // one end yet, the outcome comes here, once.
    let mut a = cluster.conn(l).await;
    let r = session(&mut a, sa, Duration::ZERO).await;
    assert_eq!((status(&r), r.session), (ResponseStatus::Ok, sa), "{r:?}");
    let resent = again(&mut a, &wait);
    a.send(&resent).await;
    let r = call(&mut h, RequestType::Unlock, &["w"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got = a.recv().await;
    assert_eq!(
        (got.request_id, status(&got)),
        (resent.id, ResponseStatus::Ok),
        "{got:?}"
    );
    assert_eq!(got.fence, held + 1, "the one grant after h's");
    let info = inspect(&mut a, "w", sa).await;
    assert!(
        info.held_by_caller && info.fence == got.fence && info.waiters == 0,
        "{info:?}"
    );
    let r = resend(&mut a, &wait).await;
    assert_eq!((status(&r), r.fence), (ResponseStatus::Ok, got.fence));
    // A request sent again must be the same request.
    let mut unlock = in_session(a.request(RequestType::Unlock, &["w"]), sa);
    unlock.seq = 1;
    let r = a.call(unlock).await;
    assert_eq!(status(&r), ResponseStatus::InvalidArgument, "{r:?}");
    assert!(r.error_text.contains("seq 1"), "{r:?}");
    assert!(inspect(&mut a, "w", sa).await.held_by_caller);
}

/// An Enqueue of `key` in `session`, numbered `seq`, waiting without limit.
fn enqueue_req(c: &mut TestClient, key: &str, session: u64, seq: u64) -> Request {
    let mut req = numbered(lock_req(c, key, session, Duration::ZERO, false), seq, 0);
    req.r#type = RequestType::Enqueue as i32;
    req
}

fn wait_req(c: &mut TestClient, ticket: u64, session: u64) -> Request {
    let mut req = in_session(c.request(RequestType::Wait, &[]), session);
    req.lock.get_or_insert_with(Default::default).ticket = ticket;
    req
}

async fn must_queue(c: &mut TestClient, key: &str, session: u64, seq: u64) -> u64 {
    let req = enqueue_req(c, key, session, seq);
    let r = c.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Queued, "{r:?}");
    assert_eq!(r.place, 0, "{r:?}");
    r.ticket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_wait_go_through_the_leader_and_tickets_survive_a_failover() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut h = cluster.conn(l).await;
    let sh = open(&mut h).await;
    for key in ["x", "y", "w"] {
        must_lock(&mut h, key, sh, Duration::ZERO).await;
    }
    let mut a = cluster.conn(l).await;
    let sa = open(&mut a).await;
    let req = enqueue_req(&mut a, "free", sa, 1);
    let r = a.call(req).await;
    assert!(status(&r) == ResponseStatus::Ok && r.fence > 0, "{r:?}");

    // x: queued, then waited for on the leader as a Lock would.
    let tx = must_queue(&mut a, "x", sa, 2).await;
    let wait = wait_req(&mut a, tx, sa);
    a.send(&wait).await;
    await_waiters(&mut h, "x", 1).await;
    let r = call(&mut h, RequestType::Unlock, &["x"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got = a.recv().await;
    assert_eq!(
        (got.request_id, status(&got)),
        (wait.id, ResponseStatus::Ok)
    );
    assert_eq!(inspect(&mut h, "x", sh).await.fence, got.fence);
    let again = wait_req(&mut a, tx, sa);
    let r = a.call(again).await;
    assert_eq!(status(&r), ResponseStatus::UnknownTicket, "{r:?}");

    // y: granted before the failover and not yet waited for; w: still in
    // line when the leader dies.
    let ty = must_queue(&mut a, "y", sa, 3).await;
    let tw = must_queue(&mut a, "w", sa, 4).await;
    let r = call(&mut h, RequestType::Unlock, &["y"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let fy = inspect(&mut a, "y", sa).await;
    assert!(fy.held_by_caller, "{fy:?}");

    cluster.kill(l);
    let l2 = cluster.leader(Some(l)).await;
    let (mut a, mut h) = (cluster.conn(l2).await, cluster.conn(l2).await);
    for (conn, s) in [(&mut a, sa), (&mut h, sh)] {
        let r = session(conn, s, Duration::ZERO).await;
        assert_eq!((status(&r), r.session), (ResponseStatus::Ok, s), "{r:?}");
    }
    // The new leader answers y's Wait from the session's memory: the one
    // grant, not a second.
    let req = wait_req(&mut a, ty, sa);
    let r = a.call(req).await;
    assert_eq!(
        (status(&r), r.fence),
        (ResponseStatus::Ok, fy.fence),
        "{r:?}"
    );
    // w kept its place and is granted to the Wait sent to the new leader.
    let wait = wait_req(&mut a, tw, sa);
    a.send(&wait).await;
    let r = call(&mut h, RequestType::Unlock, &["w"], sh).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let got = a.recv().await;
    assert_eq!(
        (got.request_id, status(&got)),
        (wait.id, ResponseStatus::Ok)
    );
    let info = inspect(&mut a, "w", sa).await;
    assert!(info.held_by_caller && info.fence == got.fence, "{info:?}");
    // Unknown tickets, and another session's, are refused.
    for (ticket, s) in [(tw + 1000, sa), (tw, sh)] {
        let req = wait_req(if s == sa { &mut a } else { &mut h }, ticket, s);
        let r = if s == sa {
            a.call(req).await
        } else {
            h.call(req).await
        };
        assert_eq!(status(&r), ResponseStatus::UnknownTicket, "{r:?}");
    }
}

/// A Watch of `key` by a caller that knows `fence` and `value`.
fn watch_req(c: &mut TestClient, key: &str, fence: u64, value: &[u8]) -> Request {
    let mut req = c.request(RequestType::Watch, &[key]);
    if let Some(l) = req.lock.as_mut() {
        l.fence = fence;
        l.value = value.to_vec();
        l.wait_micro = 600_000_000;
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_proclaim_and_watch_go_through_the_leader_and_survive_its_kill() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut cluster = Cluster::new(3);
    let l = cluster.leader(None).await;
    let mut follower = cluster.conn((l + 1) % 3).await;
    let req = watch_req(&mut follower, "svc", 0, b"");
    assert_eq!(status(&follower.call(req).await), ResponseStatus::NotLeader);

    let (mut a, mut w) = (cluster.conn(l).await, cluster.conn(l).await);
    let sa = open(&mut a).await;
    let mut req = lock_req(&mut a, "svc", sa, Duration::from_secs(60), true);
    req.lock.as_mut().expect("body").value = b"a".to_vec();
    let r = a.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    let fence = r.fence;
    // Parked: the caller knows the holder. A Proclaim, once committed,
    // answers it with the new value.
    let watch = watch_req(&mut w, "svc", fence, b"a");
    w.send(&watch).await;
    let mut proclaim = c_proclaim(&mut a, "svc", fence, b"a2");
    proclaim = in_session(proclaim, sa);
    assert_eq!(status(&a.call(proclaim).await), ResponseStatus::Ok);
    let r = w.recv().await;
    assert_eq!(r.request_id, watch.id);
    assert_eq!(
        (r.key_info[0].fence, r.key_info[0].value.as_slice()),
        (fence, &b"a2"[..])
    );

    // The leader dies; the value, as committed, is on the new leader, and
    // a Watch sent there again is answered from it.
    cluster.kill(l);
    let l2 = cluster.leader(Some(l)).await;
    let mut w2 = cluster.conn(l2).await;
    let req = watch_req(&mut w2, "svc", 0, b"");
    let r = w2.call(req).await;
    assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    assert_eq!(
        (r.key_info[0].fence, r.key_info[0].value.as_slice()),
        (fence, &b"a2"[..])
    );
}

fn c_proclaim(c: &mut TestClient, key: &str, fence: u64, value: &[u8]) -> Request {
    let mut req = c.request(RequestType::Proclaim, &[key]);
    if let Some(l) = req.lock.as_mut() {
        l.fence = fence;
        l.value = value.to_vec();
    }
    req
}
