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
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_plain_server_is_not_a_cluster() {
    let server = TestServer::start(Config::default()).await;
    let o = run_at(&server.addr_string(), &["cluster", "status"]).await;
    assert_eq!(code(&o), 69);
    assert!(stderr(&o).contains("not a cluster node"), "{}", stderr(&o));
}
