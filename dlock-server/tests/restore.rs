//! A whole cluster restored from a backup (docs/CLUSTER.md, "Backup and
//! restore") never hands out a fencing token twice, and a client whose
//! session is in the backup learns that it ended instead of resuming into a
//! table that forgot what happened after the backup.

mod common;

use common::nodes::{await_caught_up, copy_dir};
use common::PATIENCE;
use dlock::{Client, ClientOptions, Disconnect, LockOptions, Lost};
use dlock_server::testing::nodes::NodeProcesses;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_dlock-server");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_never_repeats_a_fence_and_ends_the_backups_sessions() {
    let mut nodes = NodeProcesses::start(
        BIN,
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    // A session long enough to outlast the restore: its client keeps trying
    // to resume it, and must be told it ended, not give up on its own.
    let options = ClientOptions {
        session_ttl: Some(Duration::from_secs(120)),
        ..ClientOptions::default()
    };
    let old = Client::connect_with(nodes.servers(), options)
        .await
        .expect("a leader");
    let held = old.lock("held", LockOptions::new()).await.expect("lock");
    let leader = nodes.index_of(&old.addr()).expect("a node");

    // The backup: a follower stopped, its directory copied, started again.
    let follower = (leader + 1) % 3;
    await_caught_up(&nodes, follower).await;
    nodes
        .terminate(follower, PATIENCE)
        .expect("the follower stops");
    let backups = tempfile::tempdir().expect("temp dir");
    let backup = backups.path().join("backup");
    copy_dir(nodes.data_dir(follower), &backup);
    nodes.restart(follower);

    // The cluster goes on: grants the backup never sees.
    let other = Client::connect(nodes.servers()).await.expect("connect");
    let mut issued = held.fence();
    for i in 0..5 {
        let g = other
            .lock(format!("after/{i}"), LockOptions::new())
            .await
            .expect("lock");
        issued = issued.max(g.fence());
        g.unlock().await.expect("unlock");
    }
    drop(other);

    // The cluster is lost and restored from the backup.
    for i in 0..3 {
        nodes.kill(i);
    }
    let out = std::process::Command::new(BIN)
        .arg("--data-dir")
        .arg(&backup)
        .arg("--restore-backup")
        .output()
        .expect("dlock-server runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("every session in the backup ends"), "{said}");
    for i in 0..3 {
        std::fs::remove_dir_all(nodes.data_dir(i)).expect("clear the node");
        copy_dir(&backup, nodes.data_dir(i));
        nodes.restart(i);
    }

    // Every fence from now on is above every fence issued before.
    let deadline = Instant::now() + PATIENCE;
    let fresh = loop {
        match Client::connect(nodes.servers()).await {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no leader: {e}"),
        }
    };
    let g = fresh
        .lock("held", LockOptions::new().wait(PATIENCE))
        .await
        .expect("the backup's session ended, and its lock with it");
    assert!(
        g.fence() > issued,
        "fence {} issued again (the old cluster reached {issued})",
        g.fence()
    );

    // The old client tried to resume its session and was told it ended.
    let reason = tokio::time::timeout(PATIENCE, old.closed())
        .await
        .expect("the old client learns in time");
    assert!(matches!(reason, Disconnect::SessionEnded), "{reason:?}");
    let lost = tokio::time::timeout(PATIENCE, held.lost())
        .await
        .expect("the guard reports it");
    assert!(
        matches!(lost, Lost::ConnectionLost(Disconnect::SessionEnded)),
        "{lost:?}"
    );
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

#[test]
fn a_directory_that_is_no_backup_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--restore-backup")
        .output()
        .expect("dlock-server runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no raft log"), "{err}");
}
