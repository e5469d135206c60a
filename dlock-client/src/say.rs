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

/// `keys` as dlock's lines show them: joined with commas, each control
/// character escaped (`\n`, `\u{1b}`), since a key may hold any character
/// and one with a newline would otherwise break the line in two, or forge
/// a line of its own in a shared log.
pub fn keys<S: AsRef<str>>(keys: &[S]) -> String {
    let mut out = String::new();
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for c in key.as_ref().chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
    }
    out
}

/// `say!("…", args)`: one line on stderr, prefixed `dlock: `.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_keep_to_one_line() {
        assert_eq!(super::keys(&["a", "b/c"]), "a,b/c");
        assert_eq!(
            super::keys(&["x\ndlock: forged", "\u{1b}[2J"]),
            "x\\ndlock: forged,\\u{1b}[2J"
        );
    }
}
