//! The one back-off of the library: dialling a cluster's nodes, the
//! silent-node probe and an election's observer all retry after a pause that
//! doubles up to a bound and is drawn with jitter, since after a failover
//! every client of a cluster notices at about the same moment, and retries
//! paced by the same doubling pause would arrive in waves at the new leader.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A doubling pause with a floor and a ceiling. [`Backoff::pause`] draws
/// the pause to sleep now; [`Backoff::grow`] doubles the next one and
/// [`Backoff::reset`] goes back to the first, so each caller keeps its own
/// order of sleeping and growing.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Starts at `first`; [`Backoff::grow`] never passes `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            current: first,
        }
    }

    /// The pause to sleep now: the current one, with jitter.
    pub(crate) fn pause(&self) -> Duration {
        jittered(self.current)
    }

    /// Doubles the pause, up to the ceiling.
    pub(crate) fn grow(&mut self) {
        self.current = (self.current * 2).min(self.max);
    }

    /// Back to the first pause, after a success.
    pub(crate) fn reset(&mut self) {
        self.current = self.first;
    }
}

/// A pause drawn evenly between half of `pause` and `pause` ("equal
/// jitter"): at least half the back-off is kept, the rest spread out.
fn jittered(pause: Duration) -> Duration {
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
    use super::{jittered, Backoff};
    use std::time::Duration;

    #[test]
    fn a_back_off_doubles_up_to_its_ceiling_and_resets_to_its_floor() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(70));
        let within = |b: &Backoff, d: u64| {
            let p = b.pause();
            p >= Duration::from_millis(d) / 2 && p <= Duration::from_millis(d)
        };
        assert!(within(&b, 20));
        b.grow();
        assert!(within(&b, 40));
        b.grow();
        b.grow();
        assert!(within(&b, 70));
        b.reset();
        assert!(within(&b, 20));
    }

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
