//! The table's time: microseconds on a monotonic timeline that the caller
//! owns.
//!
//! `std::time::Instant` cannot be written down or compared across machines,
//! so the table never sees one. The caller picks an origin (the server uses
//! the moment its local engine was made), reads its clock once per command and
//! passes the result in; a replicated log would carry the same number to
//! every node.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A point on the caller's monotonic timeline, in microseconds from its
/// origin.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Time(u64);

impl Time {
    /// The origin of the timeline.
    pub const ZERO: Time = Time(0);

    /// The end of the timeline: what a deadline saturates to, never reached.
    pub const END: Time = Time(u64::MAX);

    /// The point `micros` microseconds after the origin.
    pub const fn from_micros(micros: u64) -> Time {
        Time(micros)
    }

    /// Microseconds since the origin.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// `self + d`, or `None` past the end of the timeline (half a million
    /// years). `d` is rounded up to whole microseconds, so a limit never
    /// ends before it was asked to.
    pub fn checked_add(self, d: Duration) -> Option<Time> {
        let micros = u64::try_from(d.as_nanos().div_ceil(1_000)).ok()?;
        self.0.checked_add(micros).map(Time)
    }

    /// `self + d`, held at the end of the timeline rather than wrapping: a
    /// deadline that far away is never reached either way.
    pub fn saturating_add(self, d: Duration) -> Time {
        self.checked_add(d).unwrap_or(Time::END)
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_microseconds() {
        let t = Time::from_micros(10);
        assert_eq!(t.checked_add(Duration::from_nanos(1)), Some(Time(11)));
        assert_eq!(t.checked_add(Duration::from_micros(5)), Some(Time(15)));
        assert_eq!(
            Time(u64::MAX - 1).checked_add(Duration::from_micros(2)),
            None
        );
        assert_eq!(
            Time(1).saturating_add(Duration::MAX),
            Time(u64::MAX),
            "held at the end"
        );
        assert_eq!(
            Time(5).saturating_duration_since(Time(7)),
            Duration::ZERO,
            "never negative"
        );
    }
}
