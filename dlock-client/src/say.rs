//! dlock's lines on stderr.
//!
//! Each line is written with a single `write`, so the lines of several
//! dlocks sharing one log (cron mails, a CI job's output) never interleave
//! mid-line, as `eprintln!`'s piecewise writes can.

use std::io::Write;

/// Writes `dlock: ` + `message` + newline to stderr in one write.
pub fn line(message: std::fmt::Arguments<'_>) {
    let text = format!("dlock: {message}\n");
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `say!("…", args)`: one line on stderr, prefixed `dlock: `.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}
