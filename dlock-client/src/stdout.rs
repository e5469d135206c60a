//! Standard output of the commands that report (`cluster`, `inspect`,
//! `leader`, `--ping`, the generated completions and man page).
//!
//! `print!` panics when the reader has gone (`dlock cluster status | head
//! -1`). Here a reader that stopped early ends the output quietly, as it
//! does for cat, and any other failure to write (a full disk) is an error
//! that says so.

use crate::exit::{self, Failure};
use std::io::Write;

/// Writes `text` and flushes it.
///
/// # Errors
/// A quiet [`Failure`] with exit code 0 when the reader has gone: there is
/// nobody left to report to, so the command ends. A failure with
/// [`exit::SOFTWARE`] when the write failed otherwise.
pub fn print(text: impl AsRef<[u8]>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_ref()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::new(0, "")),
        Err(e) => Err(Failure::new(
            exit::SOFTWARE,
            format!("cannot write to standard output: {e}"),
        )),
    }
}
