//! Helpers for tests of cluster node processes.

use dlock::proto::ClusterInfo;
use dlock_server::testing::nodes::{cluster_status, NodeProcesses};
use std::path::Path;
use std::time::{Duration, Instant};

/// Node `i`'s own view, or `None` if it does not answer.
pub async fn status(nodes: &NodeProcesses, i: usize) -> Option<ClusterInfo> {
    cluster_status(&nodes.addr(i).to_string(), Duration::from_secs(2)).await
}

/// Waits until node `i` follows the current leader (whichever node that
/// is: a restarted node may cause an election) and has applied what it has.
pub async fn await_caught_up(nodes: &NodeProcesses, i: usize) {
    let deadline = Instant::now() + super::PATIENCE;
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

/// Copies the directory `from` (a node's data directory) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the directory") {
        let entry = entry.expect("an entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("its type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}
