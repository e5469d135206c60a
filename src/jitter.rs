//! Spreading retries out: after a failover every client of a cluster
//! notices at about the same moment, and retries paced by the same doubling
//! pause would arrive in waves at the new leader.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A pause drawn evenly between half of `pause` and `pause` ("equal
/// jitter"): at least half the back-off is kept, the rest spread out.
pub(crate) fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    let spread = u64::try_from((pause - half).as_nanos()).unwrap_or(u64::MAX);
    if spread == 0 {
        return pause;
    }
    half + Duration::from_nanos(random() % (spread + 1))
}

/// 64 random bits without a dependency: std's per-process random hash keys
/// over a counter. Good enough to spread retries; not for anything secret.
fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::jittered;
    use std::time::Duration;

    #[test]
    fn a_jittered_pause_lies_between_half_and_all_of_it_and_varies() {
        let pause = Duration::from_millis(200);
        let drawn: Vec<Duration> = (0..200).map(|_| jittered(pause)).collect();
        assert!(drawn.iter().all(|d| *d >= pause / 2 && *d <= pause));
        let distinct: std::collections::BTreeSet<_> = drawn.iter().collect();
        assert!(
            distinct.len() > 100,
            "only {} distinct pauses",
            distinct.len()
        );
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }
}
