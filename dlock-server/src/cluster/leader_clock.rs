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
#[derive(Debug, Default)]
pub(crate) struct LeaderClock {
    office: Mutex<Option<Office>>,
}

impl LeaderClock {
    fn lock(&self) -> MutexGuard<'_, Option<Office>> {
        // Plain data, valid whatever a panicking holder did.
        self.office.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster time now, for a node leading `term` whose state machine
    /// has applied up to time `applied`. The first call in a term takes
    /// office.
    pub(crate) fn now(&self, term: u64, applied: Time) -> Time {
        let office = self.office(term, applied);
        let elapsed = office.since.elapsed();
        office.base.saturating_add(elapsed).max(applied)
    }

    /// When (on this node's monotonic clock) cluster time reaches `t` in
    /// `term`; `None` if it never will in the foreseeable future.
    pub(crate) fn instant_of(&self, term: u64, applied: Time, t: Time) -> Option<Instant> {
        let office = self.office(term, applied);
        let ahead = t.saturating_duration_since(office.base);
        // Half a million years of u64 microseconds do not fit an Instant;
        // a deadline that far is never due.
        office
            .since
            .checked_add(ahead.min(Duration::from_secs(100 * 365 * 24 * 3600)))
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
}
