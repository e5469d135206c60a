//! Log lines for server limits being reached, at most one per limit per
//! second. A client that retries against a full server would otherwise turn
//! the log into a per-request one; the line after a quiet second says how
//! many hits it stood for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// One limit's throttle. A `static`, so the request path needs no extra
/// argument to reach it; only a request that hits the limit touches it.
#[derive(Debug)]
pub struct LimitLog {
    /// The limit's name in the log (`connections`, `waiters`, `held keys`).
    limit: &'static str,
    /// Unix second of the last line written.
    last: AtomicU64,
    /// Hits since the last line written, that line's own included.
    hits: AtomicU64,
}

/// `--max-connections`: a client turned away at accept.
pub static CONNECTIONS: LimitLog = LimitLog::new("connections");
/// `--max-waiters`: a Lock refused because too many are waiting.
pub static WAITERS: LimitLog = LimitLog::new("waiters");
/// `--max-held-keys`: a Lock refused because too many keys are held.
pub static HELD_KEYS: LimitLog = LimitLog::new("held keys");

impl LimitLog {
    const fn new(limit: &'static str) -> LimitLog {
        LimitLog {
            limit,
            last: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Records a hit of the limit, whose configured value is `max`, and logs
    /// it unless a line for this limit was written within the current second.
    pub fn hit(&self, max: usize) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        // Wall-clock seconds are enough to pace a log; a clock step only
        // lets one extra line through or holds one back.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last.load(Ordering::Relaxed);
        if now != last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let hits = self.hits.swap(0, Ordering::Relaxed);
            tracing::warn!(limit = self.limit, max, hits, "limit reached");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_hits_makes_one_line_that_counts_them_later() {
        let l = LimitLog::new("test");
        for _ in 0..1000 {
            l.hit(5);
        }
        // The first hit wrote a line (hits reset to 0); the rest wait for
        // the next second's line, unless a second boundary fell in between.
        assert!(l.hits.load(Ordering::Relaxed) <= 999);
        assert_ne!(l.last.load(Ordering::Relaxed), 0);
    }
}
