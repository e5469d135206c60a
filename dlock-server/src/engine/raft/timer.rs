//! When a lease or wait limit falls due on cluster time, for the expiry
//! task (`Service::run_expiry`), which proposes [`Command::Advance`].
//!
//! Only the leader proposes it, so only a leader finds anything due. It
//! sleeps until the table's next deadline (converted to this node's clock
//! by `leader_clock`), and wakes early when an applied entry creates an
//! earlier deadline, when the table is replaced by a snapshot, or when
//! leadership changes.
//!
//! [`Command::Advance`]: crate::table::Command::Advance

use super::Cluster;
use openraft::ServerState;

impl Cluster {
    /// Resolves when this node leads and the table has a deadline due by
    /// cluster time.
    pub async fn due(&self) {
        let inner = &self.inner;
        let mut server = inner.raft.server_metrics();
        loop {
            let term = {
                let m = server.borrow_and_update();
                (m.state == ServerState::Leader).then_some(m.vote.leader_id.term)
            };
            let Some(term) = term else {
                if server.changed().await.is_err() {
                    // The engine stopped: nothing falls due any more.
                    std::future::pending::<()>().await;
                }
                continue;
            };
            let (next, applied) = {
                let mut st = inner.machine.lock();
                let next = st.table.next_deadline();
                st.timer_at.set(next);
                (next, st.at)
            };
            if next.is_some_and(|d| d <= inner.clock.now(term, applied)) {
                return;
            }
            let wake = next.and_then(|d| inner.clock.instant_of(term, applied, d));
            tokio::select! {
                r = server.changed() => if r.is_err() {
                    std::future::pending::<()>().await;
                },
                _ = inner.machine.deadline_moved.notified() => {}
                _ = async {
                    if let Some(t) = wake {
                        tokio::time::sleep_until(t).await;
                    }
                }, if wake.is_some() => {}
            }
        }
    }
}
