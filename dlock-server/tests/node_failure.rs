//! A node that cannot serve exits (issue 39): a storage error in a running
//! cluster node makes the process report not-ready, drain and exit
//! non-zero with a log line that says why, so that a supervisor
//! (`Restart=on-failure` in packaging/dlock-server.service) starts it
//! again; the other nodes elect a leader without it, and it rejoins once
//! restarted.
//!
//! The storage error is injected through the `testing` feature's fault
//! file (`raft-log/FAIL-SYNC`): every fsync of the log then fails with EIO.

use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::{cluster_status, NodeProcesses};
use dlock_server::testing::ports;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(60);

/// `/readyz` of the operator's port at `addr`: the status code, or `None`
/// if nothing answers there (the node has gone).
async fn readyz(addr: SocketAddr) -> Option<u16> {
    let ask = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.1\r\nHost: dlock\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw);
        text.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

/// The index of the node the cluster names as leader, asking node `ask`.
async fn leader(nodes: &NodeProcesses, ask: &[usize]) -> usize {
    let deadline = Instant::now() + PATIENCE;
    loop {
        for &i in ask {
            let addr = nodes.addr(i).to_string();
            if let Some(info) = cluster_status(&addr, Duration::from_secs(2)).await {
                if let Some(l) = nodes.index_of_id(info.leader_id) {
                    if info.leader_id != 0 && ask.contains(&l) {
                        return l;
                    }
                }
            }
        }
        assert!(Instant::now() < deadline, "no leader among nodes {ask:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_storage_fails_reports_not_ready_exits_non_zero_and_the_cluster_goes_on() {
    let mut nodes = NodeProcesses::prepare(
        dlock_server::testing::nodes::server_binary(),
        3,
        &[
            "--heartbeat",
            "100ms",
            "--election-timeout",
            "1s",
            "--shutdown-timeout",
            "3s",
        ],
    );
    let mut metrics = Vec::new();
    let mut held = Vec::new();
    for i in 0..3 {
        let (addr, hold) = ports::reserve();
        nodes.node_flags(i, &["--metrics-listen", &addr.to_string()]);
        metrics.push(addr);
        held.push(hold);
    }
    drop(held);
    nodes.start_all();
    let failing = leader(&nodes, &[0, 1, 2]).await;
    let client = Client::connect(nodes.servers().as_str())
        .await
        .expect("connect");
    client
        .lock(["before"], LockOptions::new())
        .await
        .expect("a lock before the fault")
        .unlock()
        .await
        .expect("unlock before the fault");
    assert_eq!(readyz(metrics[failing]).await, Some(200));

    std::fs::write(nodes.data_dir(failing).join("raft-log/FAIL-SYNC"), b"")
        .expect("inject the fault");
    // A write the failing leader must sync: the client retries it on the
    // next leader, so it succeeds once the cluster has moved on.
    let after = tokio::spawn({
        let client = client.clone();
        async move { client.lock(["after"], LockOptions::new()).await }
    });

    // Not ready from the moment it knows it cannot serve (its log says so
    // just after): a probe never finds a node that is about to exit ready.
    let deadline = Instant::now() + PATIENCE;
    while !nodes
        .recent_log(failing)
        .iter()
        .any(|l| l.contains("cannot serve"))
    {
        assert!(
            Instant::now() < deadline,
            "the failing node never said it cannot serve: {}",
            nodes.recent_log(failing).join("\n")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probe = readyz(metrics[failing]).await;
    assert!(
        matches!(probe, Some(503) | None),
        "a node that cannot serve answers /readyz with 503 until it is gone, not {probe:?}"
    );
    let status = tokio::task::spawn_blocking({
        let mut nodes = nodes;
        move || {
            let status = nodes.wait_for_exit(failing, PATIENCE);
            (nodes, status)
        }
    })
    .await
    .expect("wait");
    let (mut nodes, status) = status;
    let status = status.expect("the node whose storage failed exited by itself");
    assert!(!status.success(), "it exits non-zero: {status:?}");
    let log = nodes.recent_log(failing).join("\n");
    assert!(
        log.contains("cannot serve") && log.contains("os error 5"),
        "its log says why it stops: {log}"
    );

    // The others elect a leader without it, and the retried lock lands.
    let others: Vec<usize> = (0..3).filter(|&i| i != failing).collect();
    leader(&nodes, &others).await;
    let g = tokio::time::timeout(PATIENCE, after)
        .await
        .expect("the lock went through on the new leader")
        .expect("task")
        .expect("lock after the failover");
    g.unlock().await.expect("unlock");

    // As a supervisor would: the disk is replaced, the node starts again
    // and follows the new leader.
    std::fs::remove_file(nodes.data_dir(failing).join("raft-log/FAIL-SYNC")).expect("heal");
    nodes.restart(failing);
    // Right after its start it may still see itself as the leader of its
    // old term, until it hears the new one.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = cluster_status(&nodes.addr(failing).to_string(), Duration::from_secs(2)).await;
        let follows = seen
            .as_ref()
            .and_then(|s| nodes.index_of_id(s.leader_id))
            .is_some_and(|l| others.contains(&l));
        if follows {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node never followed the leader elected without it: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_is_down_is_logged_once_not_every_retry_and_once_when_back() {
    let mut nodes = NodeProcesses::start(
        dlock_server::testing::nodes::server_binary(),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let leader = leader(&nodes, &[0, 1, 2]).await;
    let down = (0..3).find(|&i| i != leader).expect("a follower");
    // Lines about that peer (a node starting before the others may have
    // logged some already).
    let about = format!("peer={}", nodes.id(down));
    let said = |nodes: &NodeProcesses, what: &str| {
        nodes
            .recent_log(leader)
            .iter()
            .filter(|l| l.contains(what) && l.contains(&about))
            .count()
    };
    let before = said(&nodes, "peer does not answer");
    nodes.kill(down);
    let deadline = Instant::now() + PATIENCE;
    while said(&nodes, "peer does not answer") == before {
        assert!(
            Instant::now() < deadline,
            "the leader never said the peer is down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // openraft retries every half second or so: over three seconds, at the
    // default level, the leader says nothing more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = nodes.recent_log(leader).join("\n");
    assert_eq!(said(&nodes, "peer does not answer"), before + 1, "{log}");
    assert!(
        !log.contains("RPCError") && !log.contains("error replication"),
        "openraft's line per retry is out of the default log: {log}"
    );
    let back = said(&nodes, "peer answers again");
    nodes.restart(down);
    let deadline = Instant::now() + PATIENCE;
    while said(&nodes, "peer answers again") == back {
        assert!(
            Instant::now() < deadline,
            "the leader never said the peer is back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_the_peer_port_is_logged_as_such_not_as_a_newer_dlock() {
    let nodes = NodeProcesses::start(
        dlock_server::testing::nodes::server_binary(),
        1,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    // A dlock client's first frame (a Hello in protobuf) sent to the peer
    // port by mistake.
    let mut c = dlock::raw::RawClient::connect(&nodes.peer_addr(0).to_string())
        .await
        .expect("connect to the peer port");
    let hello = c.request(dlock::proto::RequestType::Hello, &[]);
    let _ = tokio::time::timeout(Duration::from_secs(5), c.call(&hello)).await;
    let deadline = Instant::now() + PATIENCE;
    let line = loop {
        if let Some(l) = nodes
            .recent_log(0)
            .into_iter()
            .find(|l| l.contains("peer connection refused"))
        {
            break l;
        }
        assert!(Instant::now() < deadline, "the refusal was never logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        line.contains("peer port") && !line.contains("newer dlock"),
        "{line}"
    );
}
