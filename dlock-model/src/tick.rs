//! The model's time: whole milliseconds on one timeline.
//!
//! The client rules are generic over their time (`dlock::rules::Time`), so
//! the model's clients ask them with a [`Tick`] rather than an `Instant`,
//! which a checker could neither hash nor replay.

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// A point in time, in milliseconds from the model's start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(pub u64);

impl Tick {
    /// Milliseconds from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Tick) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// `self - d`, held at zero: for printing when a belief ends.
    pub fn before(self, d: Duration) -> Tick {
        Tick(self.0.saturating_sub(millis(d)))
    }
}

/// A duration in whole milliseconds. Every duration the model uses is a
/// whole number of them (the clock-rate bound of a 4 s window is 4 ms), so
/// nothing is rounded; past the end of the timeline it saturates.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Tick {
    type Output = Tick;

    fn add(self, d: Duration) -> Tick {
        Tick(self.0.saturating_add(millis(d)))
    }
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_add_in_whole_milliseconds() {
        assert_eq!(Tick(1_000) + Duration::from_micros(3_996_999), Tick(4_996));
        assert_eq!(Tick(u64::MAX) + Duration::from_secs(1), Tick(u64::MAX));
        assert_eq!(Tick(2_998).to_string(), "2.998s");
    }
}
