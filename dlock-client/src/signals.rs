//! The signals dlock handles: while waiting they end dlock cleanly, while
//! the command runs they are passed on to it.

use crate::exit::{self, Failure};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Listeners for SIGINT, SIGTERM, SIGHUP and SIGQUIT. Installed before the
/// lock is requested, so none of them can kill dlock without cleanup.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    /// Installs the listeners.
    ///
    /// # Errors
    /// If the operating system refuses a handler (exit code 70).
    pub fn install() -> Result<Signals, Failure> {
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install signal handler: {e}"),
                )
            })
        };
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
            quit: listen(SignalKind::quit())?,
        })
    }

    /// The next signal received, as its number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }
}
