//! Exit codes of `dlock`, and the error type that carries them.
//!
//! | code | meaning |
//! |---|---|
//! | child's code | the command ran and exited |
//! | 128+N | the command died of signal N, or dlock was interrupted by signal N while waiting |
//! | 1 (`-E`) | the lock was busy (`-n`) or the wait timed out (`-w`) |
//! | 64 | usage error |
//! | 69 | cannot reach the server, or the connection was lost before the lock was taken |
//! | 70 | the server refused the request (invalid key, a limit, shutting down) or broke the protocol |
//! | 75 | the lock was lost while the command ran; the command was stopped |
//! | 77 | access denied: token missing or not accepted |
//! | 124 | `--max-time` exceeded; the command was stopped |
//! | 126 | the command could not be executed |
//! | 127 | the command was not found |

/// Bad command line.
pub const USAGE: u8 = 64;
/// Server unreachable.
pub const UNAVAILABLE: u8 = 69;
/// Server refused or protocol broken.
pub const SOFTWARE: u8 = 70;
/// Lock lost while the command ran.
pub const LOCK_LOST: u8 = 75;
/// Access denied.
pub const NO_PERMISSION: u8 = 77;
/// `--max-time` exceeded.
pub const MAX_TIME: u8 = 124;
/// Command found but not executable.
pub const CANNOT_EXECUTE: u8 = 126;
/// Command not found.
pub const NOT_FOUND: u8 = 127;

/// An error that ends dlock: a message for stderr and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// One line naming the problem and, where there is one, the fix. Empty
    /// when nothing should be printed (a busy lock without `-v`).
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// Maps a library error to an exit code and a one-line explanation.
pub fn from_client_error(e: dlock::Error, server: &str) -> Failure {
    use dlock::Error;
    match e {
        Error::Connect { source, .. } => Failure::new(
            UNAVAILABLE,
            format!("cannot connect to {server}: {source} (is dlock-server running? set DLOCK_SERVER or --server)"),
        ),
        Error::ConnectTimeout { timeout, .. } => Failure::new(
            UNAVAILABLE,
            format!("cannot connect to {server}: no answer within {timeout:?} (check the address and the network)"),
        ),
        Error::ConnectionLost(reason) => Failure::new(UNAVAILABLE, format!("connection to {server} lost: {reason}")),
        Error::Io(e) => Failure::new(UNAVAILABLE, format!("connection to {server} failed: {e}")),
        Error::AccessDenied(_) => Failure::new(
            NO_PERMISSION,
            format!("access denied by {server} (set DLOCK_TOKEN or --token-file to a token the server accepts)"),
        ),
        other => Failure::new(SOFTWARE, other.to_string()),
    }
}
