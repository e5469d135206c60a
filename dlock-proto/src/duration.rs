//! Durations on the command lines of every dlock program: `2.5s`, `500ms`,
//! `1m30s`, `2h`, `30days`; a bare number means seconds, as with flock's `-w`.
//! Units are humantime's; the bare number is ours.

use std::time::Duration;

/// Parses a duration; see the module documentation for the forms accepted.
///
/// # Errors
/// A message naming what is wrong, for clap to show next to the flag.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration (examples: 30s, 2.5s, 500ms, 1m30s)".into());
    }
    // A bare number is seconds, as flock's -w has it; humantime wants a
    // unit.
    if let Ok(secs) = s.parse::<f64>() {
        return seconds(secs, s);
    }
    humantime::parse_duration(s).map_err(|e| format!("'{s}' is not a duration: {e}"))
}

/// Writes `d` in the largest unit that states it exactly, in a form
/// [`parse`] reads back: `30days`, `2h`, `90s`, `1500ms`, `2.5us`.
pub fn format(d: Duration) -> String {
    const UNITS: [(u128, &str); 5] = [
        (86_400_000_000_000, "days"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
    ];
    let nanos = d.as_nanos();
    for (unit, name) in UNITS {
        if nanos >= unit && nanos % unit == 0 {
            return format!("{}{name}", nanos / unit);
        }
    }
    if nanos >= 1_000_000_000 {
        return format!("{}s", d.as_secs_f64());
    }
    format!("{}us", nanos as f64 / 1e3)
}

/// `d` as people read it in a log line, to about three figures: `815 ms`,
/// `4.21 s`, `12.3 s`, `3 min 5 s`, `2 h 5 min`. Not for parsing back (see
/// [`format()`] for that).
pub fn human(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 0.000_999_5 {
        return format!("{} us", d.as_micros());
    }
    // Each step rounds first, so 999.6 ms is "1.00 s", not "1000 ms".
    let ms = (secs * 1e3).round();
    if ms < 1e3 {
        return format!("{ms} ms");
    }
    let centis = (secs * 1e2).round();
    if centis < 1e3 {
        return format!("{:.2} s", centis / 1e2);
    }
    let decis = (secs * 10.0).round();
    if decis < 600.0 {
        return format!("{:.1} s", decis / 10.0);
    }
    let whole = secs.round() as u64;
    match (whole / 3600, (whole % 3600) / 60, whole % 60) {
        (0, m, s) => format!("{m} min {s} s"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

fn seconds(secs: f64, original: &str) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("'{original}' is not a valid duration"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("'{original}' is too long"))
}

/// Parses a duration that must be greater than zero.
///
/// # Errors
/// As [`parse`], or when the duration is zero.
pub fn parse_positive(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_read_as_people_say_them() {
        let ms = Duration::from_millis;
        assert_eq!(human(Duration::from_micros(250)), "250 us");
        assert_eq!(human(ms(815)), "815 ms");
        assert_eq!(human(Duration::from_nanos(815_200_675)), "815 ms");
        assert_eq!(human(ms(4_210)), "4.21 s");
        assert_eq!(human(ms(12_340)), "12.3 s");
        assert_eq!(human(ms(185_000)), "3 min 5 s");
        assert_eq!(human(Duration::from_secs(7_500)), "2 h 5 min");
        // Rounded before the unit is chosen.
        assert_eq!(human(Duration::from_micros(999_600)), "1.00 s");
        assert_eq!(human(ms(9_996)), "10.0 s");
        assert_eq!(human(ms(59_960)), "1 min 0 s");
    }

    #[test]
    fn format_reads_back() {
        for (d, text) in [
            (Duration::from_secs(30 * 86_400), "30days"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_nanos(2500), "2.5us"),
            (Duration::from_nanos(1_000_000_001), "1.000000001s"),
        ] {
            assert_eq!(format(d), text);
            assert_eq!(parse(text), Ok(d), "{text}");
        }
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(parse("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("30days"), Ok(Duration::from_secs(30 * 86400)));
    }

    #[test]
    fn rejected_forms() {
        for bad in [
            "",
            "s",
            "5x",
            "-1",
            "1.2.3s",
            "10 parsecs",
            "nan",
            "inf",
            "1e400",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_positive("0s").is_err());
    }
}
