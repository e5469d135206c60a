//! The leader's timer: proposes [`Command::Advance`] when a lease or wait
//! limit falls due on cluster time.
//!
//! Expiry is a command like any other, so every node expires the same
//! leases at the same point of the log. Only the leader proposes it; the
//! task sleeps until the table's next deadline (converted to this node's
//! clock by `leader_clock`), and wakes early when an applied entry creates
//! an earlier deadline, when the table is replaced by a snapshot, or when
//! leadership changes. There is no periodic sweep.

use super::Cluster;
use crate::table::Command;
use openraft::ServerState;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Wait before proposing again after a failed Advance (no quorum, or a
/// leadership change not yet in the metrics), so a failing cluster is not
/// flooded with proposals.
const RETRY: Duration = Duration::from_millis(100);

/// Runs the timer until `stop` is cancelled.
pub(super) async fn run(cluster: Cluster, stop: CancellationToken) {
    let inner = &cluster.inner;
    let mut server = inner.raft.server_metrics();
    loop {
        let term = {
            let m = server.borrow_and_update();
            (m.state == ServerState::Leader).then_some(m.vote.leader_id.term)
        };
        let Some(term) = term else {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = server.changed() => if r.is_err() { return },
            }
            continue;
        };
        let (next, applied) = {
            let mut st = inner.machine.lock();
            let next = st.table.next_deadline();
            st.timer_at = next;
            (next, st.at)
        };
        if next.is_some_and(|d| d <= inner.clock.now(term, applied)) {
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                r = cluster.propose(Command::Advance) => r,
            };
            match result {
                Ok(out) if out.expired_leases > 0 => {
                    tracing::debug!(keys = out.expired_leases, "leases expired");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot advance the table's time");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = server.changed() => {}
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
            continue;
        }
        let wake = next.and_then(|d| inner.clock.instant_of(term, applied, d));
        tokio::select! {
            _ = stop.cancelled() => return,
            r = server.changed() => if r.is_err() { return },
            _ = inner.machine.deadline_moved.notified() => {}
            _ = async {
                if let Some(t) = wake {
                    tokio::time::sleep_until(t).await;
                }
            }, if wake.is_some() => {}
        }
    }
}
