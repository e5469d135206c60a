//! Whether this node leads *with a majority behind it* (etcd's CheckQuorum).
//!
//! openraft 0.9 keeps a leader that stops hearing from the other nodes in
//! office until it learns of a newer term: cut off from its peers while its
//! clients still reach it (a failed link between racks, a firewall rule on
//! the peer port), it goes on answering as the leader while the others have
//! elected a new one, and it can commit nothing. Its clients wait on it, and
//! their sessions on the majority side run out unrefreshed.
//!
//! So this node tells apart openraft's role and *standing*: it stands as the
//! leader only while openraft says it leads and a majority acknowledged it
//! (`millis_since_quorum_ack` in openraft's metrics) within the limit
//! (twice the election timeout: followers honour a leader for that long
//! after its last heartbeat, so by then they may be electing another). A
//! leader that loses its standing refuses requests with `NotLeader` (naming
//! no leader), resets the connections whose sessions it kept, answers the
//! clients' liveness probe `Unavailable` and reports not ready, so its
//! clients move at once. openraft itself is untouched: the node still
//! counts itself leader there and steps down when it hears the newer term
//! (or takes up again if the acknowledgements return first). It never
//! granted anything on stale state to begin with: every grant, renewal and
//! release is a commit, which needs the majority.
//!
//! A node that stops on SIGTERM gives up its standing first ([`step_aside`])
//! and stops its heartbeats, so the others elect a successor while it
//! drains.

use super::types::Raft;
use openraft::ServerState;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Whether this node stands as the leader now; updated by [`watch_quorum`].
pub(crate) type Standing = watch::Receiver<bool>;

/// Keeps a [`Standing`] for `raft`, with `limit` the longest a leader may
/// go without a majority's acknowledgement, until `stop` or until
/// `stepped_aside` is cancelled (then it stands no more).
pub(crate) fn watch_quorum(
    raft: Raft,
    limit: Duration,
    stop: CancellationToken,
    stepped_aside: CancellationToken,
) -> (
    Standing,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(false);
    let task = async move {
        let mut metrics = raft.metrics();
        // When openraft made this node leader (of which term): until a
        // first acknowledgement the election itself is the last word a
        // majority gave.
        let mut since: Option<(u64, Instant)> = None;
        // The latest majority acknowledgement, as of the metrics last seen.
        // Read only when openraft publishes (`millis_since_quorum_ack` is
        // counted at publishing): a core that stops publishing (stuck on
        // its storage) must lose its standing, not keep it.
        let mut heard: Option<Instant> = None;
        let mut published = true;
        loop {
            let now = Instant::now();
            if published {
                let m = metrics.borrow_and_update();
                heard = if m.state == ServerState::Leader {
                    let elected = match since {
                        Some((term, at)) if term == m.current_term => at,
                        _ => {
                            since = Some((m.current_term, now));
                            now
                        }
                    };
                    Some(
                        m.millis_since_quorum_ack
                            .and_then(|ms| now.checked_sub(Duration::from_millis(ms)))
                            .map_or(elected, |acked| acked.max(elected)),
                    )
                } else {
                    since = None;
                    None
                };
            }
            let until = heard.map(|h| h + limit);
            let stands = until.is_some_and(|u| now < u) && !stepped_aside.is_cancelled();
            tx.send_if_modified(|s| std::mem::replace(s, stands) != stands);
            // Woken by the next metrics (an acknowledgement moves `until`),
            // or when the standing would run out without one.
            let wake = until.filter(|u| *u > now);
            published = false;
            tokio::select! {
                r = metrics.changed() => {
                    if r.is_err() {
                        // openraft stopped: the supervisor stops the node
                        // and says why; this node stands no more.
                        tx.send_replace(false);
                        stop.cancelled().await;
                        break;
                    }
                    published = true;
                }
                _ = sleep_until(wake) => {}
                _ = stepped_aside.cancelled(), if !stepped_aside.is_cancelled() => {}
                _ = stop.cancelled() => break,
            }
        }
        tx.send_replace(false);
    };
    (rx, task)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
