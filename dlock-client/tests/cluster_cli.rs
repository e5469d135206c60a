//! `dlock cluster status|add|remove` against a cluster of one (an
//! in-process node with a data dir) and against a plain server.

mod common;

use common::{code, run_at, stderr, stdout, PATIENCE};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::time::{Duration, Instant};

#[tokio::test]
async fn status_shows_the_members_and_bad_requests_say_why() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = TestServer::start(Config {
        data_dir: Some(dir.path().join("node1")),
        ..Config::default()
    })
    .await;
    let addr = server.addr_string();
    // A cluster of one elects itself after an election timeout.
    let deadline = Instant::now() + PATIENCE;
    let out = loop {
        let o = run_at(&addr, &["cluster", "status"]).await;
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = stdout(&o);
        if out.contains("node 1 is leader") {
            break out;
        }
        assert!(Instant::now() < deadline, "never a leader: {out}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let row = out
        .lines()
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("a row for node 1: {out}"));
    assert!(row.contains("leader") && row.contains(&addr), "{out}");
    // The same, for a script, with the server named before the command
    // (DLOCK_SERVER names a dead port here, so only -s can reach it).
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let o = run_at(
        &dead_port,
        &["-s", &addr, "cluster", "status", "-o", "json"],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["role"], "leader", "{v}");
    assert_eq!(v["leader_id"], 1, "{v}");
    assert_eq!(v["members"][0]["client_addr"], addr.as_str(), "{v}");
    assert_eq!(v["members"][0]["lag"], 0, "{v}");
    assert_eq!(v["version"], dlock_server::VERSION, "{v}");
    // Every member was asked for its own view too.
    assert_eq!(v["nodes"][0]["role"], "leader", "{v}");
    assert_eq!(v["nodes"][0]["version"], dlock_server::VERSION, "{v}");
    // The node's peer port, given by mistake, says what it is and where
    // the client port is, to the lock form and to `dlock cluster` alike.
    let peer = v["members"][0]["peer_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("a peer address: {v}"))
        .to_owned();
    for args in [&["--ping"][..], &["cluster", "status"][..]] {
        let o = run_at(&peer, args).await;
        let err = stderr(&o);
        assert_eq!(code(&o), 70, "{args:?}: {err}");
        assert!(
            err.contains(&peer) && err.contains("peer port of dlock cluster node 1"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("--listen") && err.contains(&format!("this node's is {addr}")),
            "{args:?}: {err}"
        );
    }
    let own = out
        .lines()
        .skip_while(|l| !l.starts_with("NODE "))
        .nth(1)
        .unwrap_or_else(|| panic!("a row of each node's own view: {out}"));
    assert!(own.starts_with("1 ") && own.contains(" leader "), "{out}");
    // The node's build, as its --version and dlock_build_info say it.
    assert!(
        out.lines()
            .any(|l| l == format!("version {}", dlock_server::VERSION)),
        "{out}"
    );
    // A list whose first node is down: the next one answers; -v (given
    // before the subcommand, as for the lock form) says which did.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let o = run_at(&format!("{dead},{addr}"), &["-v", "cluster", "status"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("node 1 is leader"), "{}", stdout(&o));
    let said = stderr(&o);
    assert!(
        said.contains(&format!("asking {dead}"))
            && said.contains(&format!("asking {addr}"))
            && said.contains(&format!("{addr} answered")),
        "{said}"
    );
    let o = run_at(&dead, &["cluster", "status"]).await;
    assert_eq!(code(&o), 69);
    assert!(stderr(&o).contains(&dead), "{}", stderr(&o));

    let o = run_at(&addr, &["cluster", "remove", "7"]).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("node 7 is not a member"),
        "{}",
        stderr(&o)
    );
    let o = run_at(&addr, &["cluster", "add", "2"]).await;
    assert_eq!(code(&o), 64, "missing addresses are a usage error");
    // Started without --peer-listen, its peer port is the kernel's choice,
    // another at every restart: no node is added to it until it has one.
    let o = run_at(
        &addr,
        &["cluster", "add", "2", "127.0.0.1:1", "127.0.0.1:2"],
    )
    .await;
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("started without --peer-listen")
            && stderr(&o).contains("Restart node 1 with --peer-listen ADDR"),
        "{}",
        stderr(&o)
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_plain_server_is_not_a_cluster() {
    let server = TestServer::start(Config::default()).await;
    let o = run_at(&server.addr_string(), &["cluster", "status"]).await;
    // The server answered: a usage error, not one that cannot be reached.
    assert_eq!(code(&o), 64);
    let err = stderr(&o);
    // Said once, with what makes a node one.
    assert_eq!(err.matches("not a cluster node").count(), 1, "{err}");
    assert!(err.contains("--data-dir"), "{err}");
}

/// `dlock cluster status -o json` asked of `servers`: the JSON object.
async fn status_json(servers: &str) -> serde_json::Value {
    let o = run_at(servers, &["cluster", "status", "-o", "json"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("one JSON object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_the_leaders_view_names_a_dead_member_unreachable_and_is_exact_after_an_add() {
    use dlock_server::testing::nodes::{server_binary, NodeProcesses};
    let mut nodes = NodeProcesses::start(
        server_binary(),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "500ms"],
    );
    // Find the leader, then ask a follower first: the answer is the
    // leader's view all the same, with every member's replication.
    let deadline = Instant::now() + PATIENCE;
    let leader = loop {
        let v = status_json(&nodes.servers()).await;
        if let Some(id) = v["leader_id"].as_u64() {
            if let Some(i) = nodes.index_of_id(id) {
                break i;
            }
        }
        assert!(Instant::now() < deadline, "no leader: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    // (Once the follower knows the leader: an election on a loaded machine
    // may have it between two.)
    let deadline = Instant::now() + PATIENCE;
    let v = loop {
        let v = status_json(&nodes.addr(follower).to_string()).await;
        if v["leader_id"].is_u64() {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the follower never knew a leader: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(v["role"], "leader", "the leader's view: {v}");
    assert!(
        v["members"]
            .as_array()
            .expect("members")
            .iter()
            .all(|m| m["lag"].is_u64()),
        "{v}"
    );

    // A member killed: the leader names it unreachable, for how long.
    let dead = (0..3)
        .find(|&i| i != leader && i != follower)
        .expect("another follower");
    nodes.kill(dead);
    let dead_id = nodes.id(dead);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = status_json(&nodes.addr(follower).to_string()).await;
        let m = v["members"]
            .as_array()
            .expect("members")
            .iter()
            .find(|m| m["node_id"] == dead_id)
            .cloned()
            .expect("the dead member is listed");
        if m["unreachable_for_secs"].as_f64().is_some_and(|s| s >= 1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "never unreachable: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let o = run_at(&nodes.addr(follower).to_string(), &["cluster", "status"]).await;
    let table = stdout(&o);
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("{dead_id} ")))
        .unwrap_or_else(|| panic!("a row for node {dead_id}: {table}"));
    assert!(row.contains("unreachable for"), "{table}");

    // A node added: right after the add, its lag is what it is, 0.
    nodes.restart(dead);
    // Once the restarted node follows again: until the leader's messages
    // reach it (the leader dials a peer that was down less often), it may
    // stand for election, and an add under way when the leader changes
    // fails.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = status_json(&nodes.servers()).await;
        let back = v["members"].as_array().is_some_and(|ms| {
            ms.iter().any(|m| {
                m["node_id"] == dead_id && m["unreachable_for_secs"].is_null() && m["lag"] == 0
            })
        });
        if back {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {dead_id} never followed again: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let joiner = nodes.add_joiner();
    nodes.restart(joiner);
    let (client, peer) = (
        nodes.addr(joiner).to_string(),
        nodes.peer_addr(joiner).to_string(),
    );
    let id = nodes.id(joiner).to_string();
    let o = run_at(&nodes.servers(), &["cluster", "add", &id, &client, &peer]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = status_json(&nodes.servers()).await;
    let m = v["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["node_id"].as_u64() == Some(nodes.id(joiner)))
        .cloned()
        .expect("the new member is listed");
    assert_eq!(m["lag"], 0, "right after the add: {v}");
    assert!(m["matched_index"].as_u64().is_some_and(|i| i > 0), "{v}");
}
