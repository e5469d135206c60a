//! A node whose data directory was damaged while it was down (its log file
//! cut short, as by a full disk or a bad copy) refuses to start with a
//! message that names the directory, or starts and catches up: it never
//! crashes with a backtrace, and never serves a state the cluster did not
//! commit. With its file back, it rejoins and the cluster's state is whole.

mod common;

use dlock::proto::{ClusterInfo, RequestType, ResponseStatus};
use dlock::raw::RawClient;
use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::NodeProcesses;
use std::time::{Duration, Instant};

/// Node `i`'s own view, or `None` if it does not answer.
async fn status(nodes: &NodeProcesses, i: usize) -> Option<ClusterInfo> {
    let ask = async {
        let mut c = RawClient::connect(nodes.addr(i).to_string().as_str())
            .await
            .ok()?;
        let req = c.request(RequestType::ClusterStatus, &[]);
        let r = c.call(&req).await.ok()?;
        (ResponseStatus::try_from(r.status) == Ok(ResponseStatus::Ok))
            .then_some(r.cluster)
            .flatten()
            .map(|b| *b)
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
}

/// Waits until node `i` follows the current leader (whichever node that
/// is: a restarted node may cause an election) and has applied what it has.
async fn await_caught_up(nodes: &NodeProcesses, i: usize) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let mine = status(nodes, i).await;
        if let Some(m) = &mine {
            let leader = nodes.index_of_id(m.leader_id);
            if let Some(l) = leader.filter(|&l| l != i) {
                if let Some(l) = status(nodes, l).await {
                    if l.role == "Leader"
                        && l.term == m.term
                        && m.last_applied_index >= l.last_applied_index
                    {
                        return;
                    }
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "node {i} did not catch up with a leader: {mine:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_cut_log_file_refuses_to_start_or_catches_up_never_crashes() {
    let mut nodes = NodeProcesses::start(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let c = Client::connect(nodes.servers()).await.expect("a leader");
    for i in 0..40 {
        let g = c
            .lock(format!("churn/{i}"), LockOptions::new())
            .await
            .expect("lock");
        g.unlock().await.expect("unlock");
    }
    let lease = c
        .lock("kept", LockOptions::new().lease(Duration::from_secs(600)))
        .await
        .expect("a lease");
    let kept = lease.into_parts();
    let kept_fence = kept.fence;
    assert_eq!(kept.keys, ["kept"]);
    let leader = nodes.index_of(&c.addr()).expect("the client's node");
    let victim = (leader + 1) % 3;
    await_caught_up(&nodes, victim).await;
    nodes.kill(victim);

    let file = nodes.data_dir(victim).join("raft.redb");
    let whole = std::fs::read(&file).expect("the node's log file");
    assert!(whole.len() > 8192, "a log file of {} bytes", whole.len());
    for cut in [whole.len() / 2, whole.len() - 4096, 512, 0] {
        std::fs::write(&file, &whole[..cut]).expect("cut the file");
        match nodes.try_restart(victim) {
            Err(why) => {
                assert!(
                    why.contains("is damaged") || why.contains("cannot open"),
                    "cut to {cut} bytes: the refusal does not say why: {why}"
                );
                assert!(
                    why.contains(&nodes.data_dir(victim).display().to_string()),
                    "cut to {cut} bytes: the refusal does not name the directory: {why}"
                );
            }
            Ok(()) => {
                // Started: it must take the leader's state, not serve its own.
                await_caught_up(&nodes, victim).await;
                nodes.kill(victim);
            }
        }
        assert!(
            !nodes.any_panicked(),
            "cut to {cut} bytes: a node's log says it panicked"
        );
    }

    // The file restored: the node rejoins and the lease is still there.
    std::fs::write(&file, &whole).expect("restore the file");
    nodes.restart(victim);
    await_caught_up(&nodes, victim).await;
    let infos = c.inspect("kept").await.expect("inspect");
    assert_eq!(
        infos[0].fence(),
        Some(kept_fence),
        "the lease outlived the damage"
    );
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}
