//! Cluster time: the one timeline every command is stamped on.
//!
//! Only a leader stamps. When a node is first seen leading a term it takes
//! office: it notes the latest time its state machine has applied (`base`)
//! and the moment on its own monotonic clock (`since`); from then on cluster
//! time is `base + (now - since)`, and never less than the latest applied
//! time. Between leaders cluster time stands still: a new leader resumes at
//! (or before) the last time the old one's commands reached, however long
//! the election took. So cluster time never runs faster than the real time
//! of any leader's clock, and a lease or wait limit measured on it ends
//! late rather than early after a leader change, by at least the time the
//! change took (which is at least the election timeout). Clocks need not
//! agree in value; only their rates matter, and the client's own safety
//! margin covers a bounded rate difference.

use crate::table::Time;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Office {
    term: u64,
    base: Time,
    since: Instant,
}

/// This node's clock for the terms it leads.
#[derive(Debug)]
pub(crate) struct LeaderClock {
    office: Mutex<Option<Office>>,
    /// How fast this node's time runs against real time: 1 but in the
    /// fault-injection tests that make one node's clock run fast or slow.
    rate: f64,
}

impl Default for LeaderClock {
    fn default() -> Self {
        Self::with_rate(1.0)
    }
}

impl LeaderClock {
    /// A clock whose time runs at `rate` times real time (for tests of the
    /// client's allowance for clock rates; see `--test-clock-rate`).
    pub(crate) fn with_rate(rate: f64) -> Self {
        LeaderClock {
            office: Mutex::new(None),
            rate,
        }
    }

    /// `real` as this clock measures it; saturating, so that no rate can
    /// panic the conversion.
    fn scaled(&self, real: Duration) -> Duration {
        if self.rate == 1.0 {
            return real;
        }
        Duration::try_from_secs_f64(real.as_secs_f64() * self.rate).unwrap_or(Duration::MAX)
    }

    /// The real time this clock takes to measure `d`.
    fn unscaled(&self, d: Duration) -> Duration {
        if self.rate == 1.0 {
            return d;
        }
        Duration::try_from_secs_f64(d.as_secs_f64() / self.rate).unwrap_or(Duration::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Office>> {
        // Plain data, valid whatever a panicking holder did.
        self.office.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster time now, for a node leading `term` whose state machine
    /// has applied up to time `applied`. The first call in a term takes
    /// office.
    pub(crate) fn now(&self, term: u64, applied: Time) -> Time {
        let office = self.office(term, applied);
        let elapsed = self.scaled(office.since.elapsed());
        office.base.saturating_add(elapsed).max(applied)
    }

    /// When (on this node's monotonic clock) cluster time reaches `t` in
    /// `term`; `None` if it never will in the foreseeable future.
    pub(crate) fn instant_of(&self, term: u64, applied: Time, t: Time) -> Option<Instant> {
        let office = self.office(term, applied);
        let ahead = t.saturating_duration_since(office.base);
        // Half a million years of u64 microseconds do not fit an Instant;
        // a deadline that far is never due.
        let ahead = self.unscaled(ahead.min(Duration::from_secs(100 * 365 * 24 * 3600)));
        office.since.checked_add(ahead)
    }

    fn office(&self, term: u64, applied: Time) -> Office {
        let mut office = self.lock();
        match *office {
            Some(o) if o.term == term => o,
            _ => {
                let o = Office {
                    term,
                    base: applied,
                    since: Instant::now(),
                };
                *office = Some(o);
                tracing::info!(term, at = applied.as_micros(), "cluster clock taken over");
                o
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_new_term_resumes_from_the_applied_time_and_never_goes_back() {
        let clock = LeaderClock::default();
        let t0 = Time::from_micros(5_000_000);
        assert_eq!(clock.now(3, t0), t0);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(clock.now(3, t0), Time::from_micros(7_000_000));
        // Something later was applied meanwhile: never behind it.
        assert_eq!(
            clock.now(3, Time::from_micros(9_000_000)),
            Time::from_micros(9_000_000)
        );
        // A new term starts again from what was applied, ignoring the time
        // that passed before taking office.
        tokio::time::advance(Duration::from_secs(10)).await;
        let applied = Time::from_micros(9_000_000);
        assert_eq!(clock.now(4, applied), applied);
        let due = Time::from_micros(9_500_000);
        let at = clock.instant_of(4, applied, due).expect("soon");
        tokio::time::advance(at - Instant::now()).await;
        assert_eq!(clock.now(4, applied), due);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_clock_runs_ahead_by_its_rate_and_its_deadlines_come_early() {
        let clock = LeaderClock::with_rate(1.5);
        let t0 = Time::from_micros(1_000_000);
        assert_eq!(clock.now(1, t0), t0);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(clock.now(1, t0), Time::from_micros(4_000_000));
        let due = Time::from_micros(7_000_000);
        let at = clock.instant_of(1, t0, due).expect("soon");
        assert_eq!(at - Instant::now(), Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(clock.now(1, t0), due);
    }
}
