//! The lock state's clock: where the time that stamps every table command
//! is read.
//!
//! The table takes time as a [`Time`] value; [`Clock`] turns the server's
//! monotonic clock into one, so there is one place to read it and one
//! timeline (microseconds from when the lock state was made). The fuzz
//! harness swaps in a [`ManualClock`] so its runs do not depend on how fast
//! they execute.

use crate::table::Time;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where the local engine ([`crate::engine::Local`]) reads the time it stamps commands with.
#[derive(Debug, Clone)]
pub enum Clock {
    /// tokio's monotonic clock, in microseconds from `origin`.
    Tokio {
        /// Time zero of the table's timeline.
        origin: tokio::time::Instant,
    },
    /// A clock that moves only when its owner sets it: the fuzz harness's,
    /// so that a run replays exactly from its input. The timer task does
    /// not run deadlines of a manual clock; its owner calls
    /// [`crate::engine::Local::advance`].
    Manual(ManualClock),
}

impl Clock {
    /// tokio's clock, with time zero now.
    pub fn tokio() -> Clock {
        Clock::Tokio {
            origin: tokio::time::Instant::now(),
        }
    }

    /// The current time on the table's timeline.
    pub fn now(&self) -> Time {
        match self {
            // Microseconds of u64 last half a million years from the origin.
            Clock::Tokio { origin } => {
                Time::from_micros(u64::try_from(origin.elapsed().as_micros()).unwrap_or(u64::MAX))
            }
            Clock::Manual(c) => c.now(),
        }
    }

    /// When the timer task should wake for table time `t`; `None` for a
    /// manual clock, whose owner advances the table itself.
    pub fn instant_of(&self, t: Time) -> Option<tokio::time::Instant> {
        match self {
            Clock::Tokio { origin } => origin.checked_add(Duration::from_micros(t.as_micros())),
            Clock::Manual(_) => None,
        }
    }
}

/// A clock set by hand; clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// Moves the clock to `t` (backwards too: the table then keeps its
    /// latest time, see [`crate::table::LockTable::apply`]).
    pub fn set(&self, t: Time) {
        self.0.store(t.as_micros(), Ordering::Relaxed);
    }

    /// The time it was last set to.
    pub fn now(&self) -> Time {
        Time::from_micros(self.0.load(Ordering::Relaxed))
    }
}
