//! `dlock-server local-cluster`, as a newcomer runs it: the line it prints
//! is enough to take a lock, the cluster goes on when its leader is
//! killed, and Ctrl-C (SIGINT) stops every node.

use dlock::{Client, ClientOptions, LockOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A node as the command lists it: client address and pid.
struct Listed {
    addr: String,
    pid: i32,
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_serves_through_a_leader_kill_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["local-cluster", "--port", "0", "--dir"])
        .arg(dir.path().join("cluster"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = cmd.stdout.take().unwrap();
    let (listed, servers, mut rest) = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut listed = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(list) = line.strip_prefix("export DLOCK_SERVER=") {
                return (listed, list.to_owned(), lines);
            }
            // "  node 1  127.0.0.1:7436  pid 4242  log DIR/node1.log"
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"node") {
                listed.push(Listed {
                    addr: w[2].to_owned(),
                    pid: w[4].parse().unwrap(),
                });
            }
        }
        panic!("the command ended without an export line");
    })
    .await
    .unwrap();
    assert_eq!(listed.len(), 3);
    let addrs: Vec<&str> = listed.iter().map(|n| n.addr.as_str()).collect();
    assert_eq!(servers, addrs.join(","));

    let options = ClientOptions {
        connect_timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    // Ready when the line is printed: the first connect finds a leader.
    let c = Client::connect_with(&servers, options.clone())
        .await
        .unwrap();
    let g = c.lock(["local/job"], LockOptions::new()).await.unwrap();
    let leader = g.client().addr();
    g.unlock().await.unwrap();
    drop(c);

    let killed = listed.iter().find(|n| n.addr == leader).unwrap();
    assert!(signal(killed.pid, libc::SIGKILL));
    let c = Client::connect_with(&servers, options).await.unwrap();
    let g = c
        .lock(
            ["local/job"],
            LockOptions::new().wait(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_ne!(g.client().addr(), leader, "a new leader granted it");
    g.unlock().await.unwrap();
    drop(c);

    assert!(signal(cmd.id() as i32, libc::SIGINT));
    let status = tokio::task::spawn_blocking(move || cmd.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    let said: Vec<String> = rest.by_ref().map_while(Result::ok).collect();
    assert!(
        said.iter().any(|l| l.contains("every node stopped")),
        "{said:?}"
    );
    // Every node was reaped by the command: none is left running.
    for n in &listed {
        assert!(!signal(n.pid, 0), "node at {} still runs", n.addr);
    }
}
