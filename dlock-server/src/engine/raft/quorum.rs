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

/// How often the acknowledgements are read while this node leads, per
/// limit: a standing may end up to this share of the limit early (never
/// late), and one regained once they return comes as late.
const READS_PER_LIMIT: u32 = 8;

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
        // Woken by the role (server metrics, published only when they
        // change), not by openraft's full metrics: those are published at
        // every turn of its core, several times per commit, and a watcher
        // woken at each was a task wake-up (often a thread's) per turn.
        // The acknowledgements are read from them instead at most a
        // [`READS_PER_LIMIT`]th of the limit apart while this node leads.
        let mut server = raft.server_metrics();
        let mut metrics = raft.metrics();
        // When openraft made this node leader (of which term): until a
        // first acknowledgement the election itself is the last word a
        // majority gave.
        let mut since: Option<(u64, Instant)> = None;
        // The latest majority acknowledgement known in this term.
        let mut acked: Option<Instant> = None;
        // When the full metrics were last read. `millis_since_quorum_ack`
        // is counted when openraft publishes, which for metrics not read
        // yet was after this: counting from here places the
        // acknowledgement no later than it was. Only new metrics move it,
        // so a core that stops publishing (stuck on its storage) loses its
        // standing rather than keeps it.
        let mut read_at = Instant::now();
        loop {
            let now = Instant::now();
            let (state, term) = {
                let s = server.borrow_and_update();
                (s.state, s.vote.leader_id().get_term())
            };
            let heard = if state == ServerState::Leader {
                let elected = match since {
                    Some((t, at)) if t == term => at,
                    _ => {
                        since = Some((term, now));
                        acked = None;
                        now
                    }
                };
                if metrics.has_changed().unwrap_or(false) {
                    let m = metrics.borrow_and_update();
                    if m.state == ServerState::Leader && m.current_term == term {
                        let ack = m
                            .millis_since_quorum_ack
                            .and_then(|ms| read_at.checked_sub(Duration::from_millis(ms)));
                        acked = acked.max(ack);
                    }
                }
                Some(acked.map_or(elected, |a| a.max(elected)))
            } else {
                since = None;
                acked = None;
                None
            };
            read_at = now;
            let until = heard.map(|h| h + limit);
            let stands = until.is_some_and(|u| now < u) && !stepped_aside.is_cancelled();
            tx.send_if_modified(|s| std::mem::replace(s, stands) != stands);
            // Woken when the role changes and, while leading, to read the
            // acknowledgements (a standing lost comes back with them) or
            // when the standing would run out unless newer ones came.
            let wake = until.map(|u| {
                let read = now + limit / READS_PER_LIMIT;
                if u > now {
                    u.min(read)
                } else {
                    read
                }
            });
            tokio::select! {
                r = server.changed() => {
                    if r.is_err() {
                        // openraft stopped: the supervisor stops the node
                        // and says why; this node stands no more.
                        tx.send_replace(false);
                        stop.cancelled().await;
                        break;
                    }
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
