//! Which peers this node reaches, as its own RPCs to them found: what
//! `dlock cluster status` shows (a member down for how long), and the
//! node's log lines about it, paced.
//!
//! openraft logs every failed RPC to a peer that is down (an error line each
//! half second for as long as it is down); the server's default log filter
//! leaves those out, and this module says instead, at the default level:
//! once when a peer has not answered for [`QUIET`], then at most once a
//! minute while it stays down (with how many attempts failed), and once
//! when it answers again. A peer that answers again within [`QUIET`] is not
//! mentioned: nodes started together refuse each other's first dials for a
//! moment, which said "does not answer" and "answers again (down for 0s)"
//! at every start. Only the leader talks to every peer all the time, so its view is
//! the one that says how long a member has been unreachable.

use super::types::NodeId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How often a peer that stays down is reported again.
const REPEAT: Duration = Duration::from_secs(60);

/// How long a peer must fail before it is reported down.
const QUIET: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Peer {
    /// When RPCs to it started failing; `None` while it answers.
    down_since: Option<Instant>,
    /// Failed attempts since it went down, and since the last report.
    failed: u64,
    failed_since_report: u64,
    /// When it was last reported down; `None` until it is.
    last_report: Option<Instant>,
}

/// Per peer, whether this node's latest RPC to it got through.
#[derive(Clone, Default)]
pub(crate) struct Reachability(Arc<Mutex<BTreeMap<NodeId, Peer>>>);

/// What to log, decided under the lock and logged after it.
enum Say {
    Nothing,
    Down {
        for_: Duration,
        failed: u64,
        error: String,
    },
    StillDown {
        for_: Duration,
        failed: u64,
        error: String,
    },
    Back {
        after: Duration,
        failed: u64,
    },
}

impl Reachability {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, Peer>> {
        // Plain counters, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An RPC to `peer` got its answer.
    pub(crate) fn answered(&self, peer: NodeId, addr: &str) {
        let say = {
            let mut peers = self.lock();
            let Some(p) = peers.get_mut(&peer) else {
                return;
            };
            match p.down_since.take() {
                // Never reported down: a moment's refusal, said nowhere.
                Some(_) if p.last_report.is_none() => {
                    p.failed = 0;
                    p.failed_since_report = 0;
                    Say::Nothing
                }
                Some(since) => {
                    let failed = std::mem::take(&mut p.failed);
                    p.failed_since_report = 0;
                    p.last_report = None;
                    Say::Back {
                        after: since.elapsed(),
                        failed,
                    }
                }
                None => Say::Nothing,
            }
        };
        if let Say::Back { after, failed } = say {
            tracing::info!(peer, addr, down_for = %humantime::format_duration(round(after)), failed, "peer answers again");
        }
    }

    /// An RPC to `peer` failed with `error` (unreachable, reset, timed out).
    pub(crate) fn failed(&self, peer: NodeId, addr: &str, error: &dyn std::fmt::Display) {
        self.note_failure(peer, addr, error, true);
    }

    /// `peer` refused this node's hello (another cluster, another version):
    /// counted as down for `dlock cluster status`, but not said here, since
    /// the refusal is logged on its own with what to correct (`paced.rs`),
    /// and "does not answer" would be wrong.
    pub(crate) fn refused(&self, peer: NodeId, addr: &str, error: &dyn std::fmt::Display) {
        self.note_failure(peer, addr, error, false);
    }

    fn note_failure(&self, peer: NodeId, addr: &str, error: &dyn std::fmt::Display, say: bool) {
        let now = Instant::now();
        let say = {
            let mut peers = self.lock();
            let p = peers.entry(peer).or_default();
            p.failed += 1;
            p.failed_since_report += 1;
            match (p.down_since, p.last_report) {
                (None, _) if !say => {
                    p.down_since = Some(now);
                    Say::Nothing
                }
                _ if !say => Say::Nothing,
                (None, _) => {
                    p.down_since = Some(now);
                    Say::Nothing
                }
                (Some(since), None) if now.duration_since(since) >= QUIET => {
                    p.last_report = Some(now);
                    p.failed_since_report = 0;
                    Say::Down {
                        for_: now.duration_since(since),
                        failed: p.failed,
                        error: error.to_string(),
                    }
                }
                (Some(since), Some(last)) if now.duration_since(last) >= REPEAT => {
                    p.last_report = Some(now);
                    Say::StillDown {
                        for_: now.duration_since(since),
                        failed: std::mem::take(&mut p.failed_since_report),
                        error: error.to_string(),
                    }
                }
                _ => Say::Nothing,
            }
        };
        match say {
            Say::Down {
                for_,
                failed,
                error,
            } => {
                tracing::warn!(peer, addr, down_for = %humantime::format_duration(round(for_)), failed, %error, "peer does not answer; reported again once a minute while it stays so");
            }
            Say::StillDown {
                for_,
                failed,
                error,
            } => {
                tracing::warn!(peer, addr, down_for = %humantime::format_duration(round(for_)), failed_in_last_minute = failed, %error, "peer still does not answer");
            }
            Say::Nothing | Say::Back { .. } => {}
        }
    }

    /// How long `peer` has not answered this node's RPCs; `None` while it
    /// answers (or this node has not tried it).
    pub(crate) fn down_for(&self, peer: NodeId) -> Option<Duration> {
        self.lock()
            .get(&peer)
            .and_then(|p| p.down_since)
            .map(|since| since.elapsed())
    }
}

/// To the second: what a log line or a table needs.
fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(reach: &Reachability, peer: NodeId) -> (Option<Instant>, u64) {
        let peers = reach.lock();
        let p = peers.get(&peer).expect("tracked");
        (p.last_report, p.failed)
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stays_down_is_reported_once_then_once_a_minute_then_when_back() {
        let reach = Reachability::default();
        let err = "connection refused";
        // `n` more failures, half a second apart, as openraft retries.
        let retries = |n: u32| {
            let reach = reach.clone();
            async move {
                for _ in 0..n {
                    tokio::time::advance(Duration::from_millis(500)).await;
                    reach.failed(2, "a", &err);
                }
            }
        };
        reach.failed(2, "a", &err);
        assert_eq!(lines_of(&reach, 2).0, None, "not at the first failure");
        retries(3).await;
        assert_eq!(lines_of(&reach, 2).0, None, "nor within QUIET");
        retries(1).await;
        let (first, _) = lines_of(&reach, 2);
        assert!(first.is_some(), "reported once down for QUIET");
        // The retries say nothing more for a minute.
        retries(119).await;
        assert_eq!(lines_of(&reach, 2).0, first, "quiet within the minute");
        retries(1).await;
        let (again, failed) = lines_of(&reach, 2);
        assert!(again > first, "reported again after a minute");
        assert_eq!(failed, 125);
        assert_eq!(
            reach.down_for(2).map(|d| d.as_secs()),
            Some(62),
            "down since the first failure"
        );
        reach.answered(2, "a");
        assert_eq!(reach.down_for(2), None);
        let (cleared, failed) = lines_of(&reach, 2);
        assert_eq!(
            (cleared, failed),
            (None, 0),
            "back: the next outage starts afresh"
        );
        // Refused for a moment, as at a start: nothing said either way.
        reach.failed(2, "a", &err);
        tokio::time::advance(Duration::from_millis(500)).await;
        reach.failed(2, "a", &err);
        reach.answered(2, "a");
        assert_eq!(lines_of(&reach, 2), (None, 0));
        // A peer that never failed is never tracked.
        reach.answered(3, "b");
        assert_eq!(reach.down_for(3), None);
    }
}
