//! Clients that ride through a failover (issue 13): `dlock` and the library
//! against a cluster of three real node processes on loopback, whose leader
//! the test kills with SIGKILL; a session cut off longer than its TTL; and
//! address lists with dead entries.

mod common;

use common::{code, dlock_at, lines, run_at, stderr, wait_output, PATIENCE};
use dlock::{Client, ClientOptions, Disconnect, Error, LockOptions, Lost};
use dlock_server::testing::nodes::{server_binary, NodeProcesses};
use dlock_server::testing::proxy::FreezableProxy;
use dlock_server::testing::TestServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One cluster at a time: three node processes are load enough for two
/// cores, and a starved heartbeat would move leadership under a test.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Generous for a loaded 2-core machine: a leader must not lose office to
/// a slow heartbeat, only to the test's SIGKILL; and a failover slowed by
/// the load (an election or two, 1-4 s) must stay well inside the session
/// TTL minus the client's safety margin and ping interval, or the client
/// would rightly give the lock up.
const NODE_FLAGS: &[&str] = &[
    "--heartbeat",
    "100ms",
    "--election-timeout",
    "1s",
    "--session-ttl",
    "20s",
];

/// A loopback address nobody listens on.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").to_string()
}

/// The node a fresh client of `nodes` finds leading.
async fn leader(nodes: &NodeProcesses) -> usize {
    let c = Client::connect(nodes.servers()).await.expect("connect");
    nodes
        .index_of(&c.addr())
        .unwrap_or_else(|| panic!("{} is not a node", c.addr()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlock_run_keeps_its_lock_through_a_leader_kill() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let servers = nodes.servers();
    let dir = tempfile::tempdir().expect("temp dir");
    let done = dir.path().join("done");
    // The command prints its fencing token, then runs until the test says.
    let script =
        r#"echo "$DLOCK_FENCE"; while [ ! -e "$DONE" ]; do sleep 0.05; done; echo finished"#;
    let mut run = dlock_at(&servers, &["-v", "-k", "job", "--", "sh", "-c", script])
        .env("DONE", &done)
        .spawn()
        .expect("dlock starts");
    let fence: u64 = lines(&mut run, 1).await[0].parse().expect("a fence");

    let old = leader(&nodes).await;
    nodes.kill(old);
    let killed = Instant::now();
    // Once a new leader serves, the key is still held: dlock -n is busy.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let o = run_at(&servers, &["-n", "-k", "job", "--", "true"]).await;
        match code(&o) {
            1 => break,
            // No leader yet: every node said so, or the dead one was tried.
            69 => assert!(Instant::now() < deadline, "no leader: {}", stderr(&o)),
            other => panic!("dlock -n exited {other}: {}", stderr(&o)),
        }
    }
    let served_again = killed.elapsed();
    if let Some(status) = run.try_wait().expect("dlock's state") {
        let out = wait_output(run).await;
        panic!(
            "dlock ended during the failover ({status}): {}",
            stderr(&out)
        );
    }
    let c = Client::connect(&servers).await.expect("connect");
    let info = c.inspect(["job"]).await.expect("inspect");
    assert_eq!(
        info[0].fence().unwrap_or(0),
        fence,
        "the same grant still holds the key"
    );
    assert_ne!(nodes.index_of(&c.addr()), Some(old));

    std::fs::write(&done, b"").expect("tell the command to end");
    let out = wait_output(run).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("finished"),
        "the command ran to its end"
    );
    assert!(err.contains("reconnecting"), "{err}");
    let resumed = err
        .lines()
        .find(|l| l.contains("resumed on"))
        .unwrap_or_else(|| panic!("-v says where the session was resumed: {err}"));
    // The pause, for the reader of the test log (not a timed assertion).
    eprintln!(
        "failover: {resumed}; the key was served again {:.2} s after the kill",
        served_again.as_secs_f64()
    );
    let o = run_at(&servers, &["-n", "-k", "job", "--", "true"]).await;
    assert_eq!(code(&o), 0, "released at the end: {}", stderr(&o));
    assert!(!nodes.any_panicked());
}

/// What one request in flight across the failover was answered.
#[derive(Debug)]
enum Answer {
    Ping,
    Renewed,
    Released,
    Locked(u64),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_across_a_leader_kill_are_answered_once_each() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let c = Client::connect(nodes.servers()).await.expect("connect");
    let lease = Duration::from_secs(120);
    // Leases to renew and release by fence on the client's own connection.
    let mut leases = Vec::new();
    for i in 0..30 {
        let key = format!("lease/{i}");
        let g = c
            .lock([key.as_str()], LockOptions::new().lease(lease))
            .await
            .expect("lease");
        let parts = g.into_parts();
        leases.push((parts.keys, parts.fence));
    }
    // Connections for later locks, kept in the client's pool.
    let warm: Vec<_> = {
        let mut gs = Vec::new();
        for i in 0..20 {
            let key = format!("warm/{i}");
            gs.push(
                c.lock([key.as_str()], LockOptions::new())
                    .await
                    .expect("lock"),
            );
        }
        gs
    };
    for g in warm {
        g.unlock().await.expect("unlock");
    }

    // The leader stops answering: everything sent from now on is in flight
    // when it dies.
    let old = nodes.index_of(&c.addr()).expect("a node");
    nodes.pause(old);
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for (keys, fence) in leases.clone() {
        let (c, started) = (c.clone(), started.clone());
        tasks.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            c.renew_fence(&keys, fence, lease).await?;
            c.unlock_fence(&keys, fence).await?;
            Ok::<_, Error>(vec![Answer::Renewed, Answer::Released])
        });
    }
    for _ in 0..20 {
        let (c, started) = (c.clone(), started.clone());
        tasks.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            c.ping().await?;
            Ok(vec![Answer::Ping])
        });
    }
    for i in 0..20 {
        let (c, started) = (c.clone(), started.clone());
        tasks.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            let key = format!("warm/{i}");
            let g = c.lock([key.as_str()], LockOptions::new()).await?;
            let fence = g.fence();
            g.unlock().await?;
            Ok(vec![Answer::Locked(fence), Answer::Released])
        });
    }
    let deadline = Instant::now() + PATIENCE;
    while started.load(Ordering::Relaxed) < 70 {
        assert!(Instant::now() < deadline, "tasks never started");
        tokio::task::yield_now().await;
    }
    nodes.kill(old);

    let mut answers = Vec::new();
    while let Some(done) = tokio::time::timeout(PATIENCE, tasks.join_next())
        .await
        .expect("every request is answered in time")
    {
        let got = done
            .expect("task ran")
            .expect("every request succeeds once");
        answers.extend(got);
    }
    // 30 × (Renew, Unlock), 20 Pings, 20 × (Lock, Unlock): an Unlock
    // applied twice would have answered NotHeld, a Lock lost would hang.
    assert_eq!(answers.len(), 60 + 20 + 40);
    let locks: Vec<u64> = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Locked(f) => Some(*f),
            _ => None,
        })
        .collect();
    assert_eq!(locks.len(), 20);
    // The server's state is what the answers say: every key free.
    let keys: Vec<String> = (0..30)
        .map(|i| format!("lease/{i}"))
        .chain((0..20).map(|i| format!("warm/{i}")))
        .collect();
    for info in c.inspect(keys).await.expect("inspect") {
        assert_eq!(info.fence(), None, "{} still held", info.key);
        assert_eq!(info.waiters, 0, "{} has waiters", info.key);
    }
    assert!(!c.is_closed(), "the session lived through the failover");
    assert_ne!(nodes.index_of(&c.addr()), Some(old));
    assert!(!nodes.any_panicked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_off_longer_than_its_ttl_loses_its_locks() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = NodeProcesses::start(server_binary(), 1, NODE_FLAGS);
    let proxy = FreezableProxy::start(nodes.addr(0)).await;
    let options = ClientOptions {
        session_ttl: Some(Duration::from_secs(2)),
        ..ClientOptions::default()
    };
    let c = Client::connect_with(proxy.addr_string(), options)
        .await
        .expect("connect through the proxy");
    assert!(c.session().is_some(), "a cluster node gives a session");
    let mut events = c.events();
    let guard = c.lock(["cut"], LockOptions::new()).await.expect("lock");

    proxy.sever();
    match tokio::time::timeout(PATIENCE, events.recv()).await {
        Ok(Ok(dlock::Event::Reconnecting { .. })) => {}
        other => panic!("expected a reconnect, got {other:?}"),
    }
    // The program is told before the cluster could give the key away...
    let lost = tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("lost in time");
    assert!(
        matches!(lost, Lost::Jeopardy { .. } | Lost::ConnectionLost(_)),
        "{lost:?}"
    );
    // ...and the cluster does give it away once the TTL has run out.
    let other = Client::connect(nodes.addr(0).to_string())
        .await
        .expect("connect directly");
    let taken = other
        .lock(["cut"], LockOptions::new().wait(PATIENCE))
        .await
        .expect("the key is released with the session");
    let reason = tokio::time::timeout(PATIENCE, c.closed())
        .await
        .expect("the client gives the session up");
    assert!(
        matches!(reason, Disconnect::NotResumed(_) | Disconnect::SessionEnded),
        "{reason:?}"
    );
    proxy.heal();
    assert!(matches!(c.ping().await, Err(Error::ConnectionLost(_))));
    taken.unlock().await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_address_first_is_skipped_and_all_dead_names_each() {
    let _one = ONE_AT_A_TIME.lock().await;
    // A list names a cluster's nodes (a single server in one is refused:
    // tests/client.rs); a cluster of one will do.
    let nodes = NodeProcesses::start(server_binary(), 1, NODE_FLAGS);
    let live = nodes.addr(0).to_string();
    let dead = dead_addr();
    let list = format!("{dead},{live}");
    // Until the node has elected itself.
    let deadline = Instant::now() + PATIENCE;
    let c = loop {
        match Client::connect(list.as_str()).await {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(c.addr(), live);
    let o = run_at(&list, &["-n", "-k", "k", "--", "true"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A single server at the end of the list is refused, as a usage error.
    let single = TestServer::start(dlock_server::Config::default()).await;
    let o = run_at(
        &format!("{dead},{}", single.addr_string()),
        &["-n", "-k", "k", "--", "true"],
    )
    .await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(stderr(&o).contains("is a single server"), "{}", stderr(&o));
    // A node that accepts connections but never answers (paused) does not
    // use up the connect timeout the next node needs.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_addr = hung.local_addr().expect("address").to_string();
    let c = Client::connect(format!("{hung_addr},{live}"))
        .await
        .expect("the live node answers");
    assert_eq!(c.addr(), live);

    let other = dead_addr();
    let o = run_at(&format!("{dead},{other}"), &["-n", "-k", "k", "--", "true"]).await;
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(&dead) && err.contains(&other), "{err}");
    match Client::connect(format!("{dead},{other}")).await {
        Err(Error::Unreachable { attempts }) => {
            let tried: Vec<&str> = attempts.iter().map(|(a, _)| a.as_str()).collect();
            assert_eq!(tried, [dead.as_str(), other.as_str()]);
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_a_paused_leader_moves_to_the_new_one() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let c = Client::connect(nodes.servers()).await.expect("connect");
    let guard = c.lock(["paused"], LockOptions::new()).await.expect("lock");
    let old = nodes.index_of(&guard.client().addr()).expect("a node");
    nodes.pause(old);
    // The others elect a new leader meanwhile.
    let deadline = Instant::now() + PATIENCE;
    let others: Vec<String> = (0..3)
        .filter(|&i| i != old)
        .map(|i| nodes.addr(i).to_string())
        .collect();
    let observer = loop {
        if let Ok(o) = Client::connect(others.clone()).await {
            break o;
        }
        assert!(Instant::now() < deadline, "no new leader");
    };
    let new = nodes.index_of(&observer.addr()).expect("a node");
    assert_ne!(new, old);
    nodes.resume(old);
    // The old leader answers NotLeader; the client moves its session and
    // sends the Ping again there.
    guard
        .client()
        .ping()
        .await
        .expect("ping answered by the new leader");
    assert_eq!(nodes.index_of(&guard.client().addr()), Some(new));
    let info = observer.inspect(["paused"]).await.expect("inspect");
    assert_eq!(
        info[0].fence().unwrap_or(0),
        guard.fence(),
        "the lock stayed held"
    );
    assert!(!guard.is_lost());
    guard.unlock().await.expect("unlock on the new leader");
    assert!(!nodes.any_panicked());
}

#[tokio::test]
async fn a_session_ended_under_an_open_connection_is_reported_not_pinged_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = TestServer::start(dlock_server::Config {
        data_dir: Some(dir.path().join("node1")),
        ..dlock_server::Config::default()
    })
    .await;
    let addr = server.addr_string();
    // A cluster of one takes sessions once it has elected itself.
    let deadline = Instant::now() + PATIENCE;
    let c = loop {
        match Client::connect(addr.as_str()).await {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "never a leader: {e}"),
        }
    };
    let guard = c.lock("ended", LockOptions::new()).await.expect("lock");
    let session = guard.client().session().expect("a cluster session");
    // Someone with the same identity resumes the session elsewhere and
    // closes it: its lock is released while the client's connection lives.
    let mut other = dlock::raw::RawClient::connect(&addr)
        .await
        .expect("connect");
    for kind in [
        dlock::proto::RequestType::OpenSession,
        dlock::proto::RequestType::CloseSession,
    ] {
        let req = dlock::proto::Request {
            session,
            ..other.request(kind, &[])
        };
        let r = other.call(&req).await.expect("answer");
        assert_eq!(r.status, 0, "{kind:?}: {}", r.error_text);
    }
    // The next ping on the guard's connection learns it, and the program
    // is told the lock is gone; no answer extends its deadline.
    match guard.client().ping().await {
        Err(Error::ConnectionLost(Disconnect::SessionEnded)) => {}
        other => panic!("expected the session's end, got {other:?}"),
    }
    let lost = tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("lost at once");
    assert!(
        matches!(lost, Lost::ConnectionLost(Disconnect::SessionEnded)),
        "{lost:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaves_a_leader_that_stays_paused() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let options = ClientOptions {
        session_ttl: Some(Duration::from_secs(8)),
        ..ClientOptions::default()
    };
    let c = Client::connect_with(nodes.servers(), options)
        .await
        .expect("connect");
    let old = nodes.index_of(&c.addr()).expect("a node");
    let mut events = c.events();
    // Paused for good: its sockets stay open and say nothing. The client
    // must not wait for TCP to give up (longer than the session lives).
    nodes.pause(old);
    let ping = tokio::spawn({
        let c = c.clone();
        async move { c.ping().await }
    });
    match tokio::time::timeout(PATIENCE, events.recv()).await {
        Ok(Ok(dlock::Event::Reconnecting { reason, .. })) => {
            assert!(matches!(reason, Disconnect::NoAnswer { .. }), "{reason:?}")
        }
        other => panic!("expected a reconnect, got {other:?}"),
    }
    tokio::time::timeout(PATIENCE, ping)
        .await
        .expect("answered in time")
        .expect("task")
        .expect("the ping is answered by the new leader");
    assert_ne!(nodes.index_of(&c.addr()), Some(old));
    assert!(!c.is_closed());
    nodes.resume(old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_enqueues_keep_their_place_and_their_grant_through_a_leader_kill() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let c = Client::connect(nodes.servers()).await.expect("connect");
    let hold_g = c.lock(["g"], LockOptions::new()).await.expect("g");
    let hold_q = c.lock(["q"], LockOptions::new()).await.expect("q");
    let queued = |e: dlock::Enqueued| match e {
        dlock::Enqueued::Queued(q) => q,
        dlock::Enqueued::Granted(g) => panic!("busy keys were granted: {g:?}"),
    };
    let early = queued(c.enqueue(["g"], LockOptions::new()).await.expect("g"));
    let late = queued(c.enqueue(["q"], LockOptions::new()).await.expect("q"));
    assert_eq!((early.place(), late.place()), (0, 0));
    // g is granted to `early` before the leader dies, and not yet
    // collected; q is still in line when it dies.
    let old_fence = hold_g.fence();
    hold_g.unlock().await.expect("unlock g");
    let granted_g = c.inspect(["g"]).await.expect("inspect")[0]
        .fence()
        .expect("g is held");
    assert!(granted_g > old_fence);

    let old = nodes.index_of(&c.addr()).expect("a node");
    nodes.kill(old);
    // The new leader answers the Wait from the session: the same grant.
    let g = early.wait().await.expect("g after the failover");
    assert_eq!(g.fence(), granted_g);
    let waiting = tokio::spawn(late.wait());
    hold_q.unlock().await.expect("unlock q on the new leader");
    let q = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("q granted in time")
        .expect("the task")
        .expect("q after the failover");
    let info = c.inspect(["g", "q"]).await.expect("inspect");
    assert_eq!(
        (info[0].fence(), info[1].fence()),
        (Some(g.fence()), Some(q.fence()))
    );
    assert_eq!(info[1].waiters, 0);
    g.unlock().await.expect("unlock g");
    q.unlock().await.expect("unlock q");
    assert!(!nodes.any_panicked());
}
