//! Pacing of the log lines about a peer that refuses this node, or that
//! this node refuses, at the peer hello.
//!
//! A refusal is a configuration error (another `--cluster-id`, another
//! `--initial-cluster` list, a peer address that reaches the wrong node),
//! and it does not pass by itself: openraft dials again every few hundred
//! milliseconds for as long as the nodes run. Logged at each dial, one
//! wrong flag would write a dozen lines a second on each side and bury
//! everything else. So each side logs a peer's refusal once, then at most
//! once a minute per peer, saying so in the line. The same holds for what
//! fails before a hello names a peer (a TLS handshake, a stranger's first
//! frame), paced by the address it came from.

use super::types::NodeId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How often a refusal of one peer is logged again.
const REPEAT: Duration = Duration::from_secs(60);

/// Most peers remembered at once. A hello names its sender, so anything
/// that reaches the peer port can claim a new id at every dial: past this
/// many within a [`REPEAT`], refusals are counted (metrics) but not logged.
const MOST_PEERS: usize = 1024;

/// When each peer's refusal was last logged: peers by node id, or (before
/// a hello names one: a failed TLS handshake, a stranger) by address.
#[derive(Clone)]
pub(crate) struct Paced<K = NodeId>(Arc<Mutex<BTreeMap<K, Instant>>>);

impl<K> Default for Paced<K> {
    fn default() -> Self {
        Paced(Arc::default())
    }
}

impl<K: Ord> Paced<K> {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<K, Instant>> {
        // Plain instants, valid whatever a panicking holder did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a refusal of `peer` is to be logged now: the first, and then
    /// one a [`REPEAT`].
    pub(crate) fn due(&self, peer: K) -> bool {
        let now = Instant::now();
        let mut last = self.lock();
        match last.get(&peer) {
            Some(&at) if now.duration_since(at) < REPEAT => false,
            Some(_) => {
                last.insert(peer, now);
                true
            }
            None => {
                if last.len() >= MOST_PEERS {
                    last.retain(|_, at| now.duration_since(*at) < REPEAT);
                    if last.len() >= MOST_PEERS {
                        return false;
                    }
                }
                last.insert(peer, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_logged_once_then_once_a_minute_per_peer() {
        let paced = Paced::default();
        assert!(paced.due(3));
        assert!(!paced.due(3));
        assert!(paced.due(4), "another peer is its own");
        tokio::time::advance(REPEAT / 2).await;
        assert!(!paced.due(3));
        tokio::time::advance(REPEAT / 2).await;
        assert!(paced.due(3));
    }

    #[tokio::test(start_paused = true)]
    async fn hellos_claiming_ever_new_ids_cannot_grow_it_past_its_bound() {
        let paced = Paced::default();
        let most = MOST_PEERS as u64;
        assert!((0..most).all(|id| paced.due(id)));
        assert!(!paced.due(most), "full: not logged");
        assert_eq!(paced.lock().len(), MOST_PEERS);
        tokio::time::advance(REPEAT).await;
        assert!(paced.due(most), "the expired ones make room");
        assert_eq!(paced.lock().len(), 1);
    }
}
