//! Log lines for server limits being reached, at most one per limit per
//! second. A client that retries against a full server would otherwise turn
//! the log into a per-request one. The first hit is said at once; the hits
//! held back after it are counted in a line a second later, whether or not
//! more come (before, they waited for the next hit, which could be the next
//! burst hours later).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Whether a line for held-back hits is due (a task will write it).
    due: AtomicBool,
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
            due: AtomicBool::new(false),
        }
    }

    /// Records a hit of the limit, whose configured value is `max`, and logs
    /// it unless a line for this limit was written within the current second.
    pub fn hit(&'static self, max: usize) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        // A line for held-back hits is due within the second: it will count
        // this one too (a line of its own now would make two that second).
        if self.due.load(Ordering::Relaxed) {
            return;
        }
        let now = unix_second();
        let last = self.last.load(Ordering::Relaxed);
        if now != last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let hits = self.hits.swap(0, Ordering::Relaxed);
            tracing::warn!(limit = self.limit, max, hits, "limit reached");
            return;
        }
        // Held back: said a second from now, once, by a task.
        if self.due.swap(true, Ordering::Relaxed) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    self.say_held_back(max);
                });
            }
            // No runtime (a unit test): the next hit says them.
            Err(_) => self.due.store(false, Ordering::Relaxed),
        }
    }

    /// Writes the line for the hits held back since the last one, if any.
    fn say_held_back(&self, max: usize) {
        self.due.store(false, Ordering::Relaxed);
        let hits = self.hits.swap(0, Ordering::Relaxed);
        if hits > 0 {
            self.last.store(unix_second(), Ordering::Relaxed);
            tracing::warn!(limit = self.limit, max, hits, "limit reached");
        }
    }
}

/// Wall-clock seconds are enough to pace a log; a clock step only lets one
/// extra line through or holds one back.
fn unix_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_hits_makes_one_line_that_counts_them_later() {
        static L: LimitLog = LimitLog::new("test");
        for _ in 0..1000 {
            L.hit(5);
        }
        // The first hit wrote a line (hits reset to 0); the rest wait for
        // the next second's line, unless a second boundary fell in between.
        assert!(L.hits.load(Ordering::Relaxed) <= 999);
        assert_ne!(L.last.load(Ordering::Relaxed), 0);
    }

    /// The hits after the first of a burst were said only with the next
    /// hit, which could be the next burst.
    #[tokio::test(start_paused = true)]
    async fn the_hits_held_back_are_said_a_second_later_without_another_hit() {
        static L: LimitLog = LimitLog::new("test");
        L.last.store(unix_second(), Ordering::Relaxed);
        for _ in 0..99 {
            L.hit(5);
        }
        // All held back, or all but one if the wall clock's second turned
        // after `last` was set (that one was said at once).
        assert!(L.hits.load(Ordering::Relaxed) >= 98, "held back");
        assert!(L.due.load(Ordering::Relaxed));
        tokio::time::sleep(std::time::Duration::from_millis(1_001)).await;
        tokio::task::yield_now().await;
        assert_eq!(L.hits.load(Ordering::Relaxed), 0, "said");
        assert!(!L.due.load(Ordering::Relaxed));
    }
}
