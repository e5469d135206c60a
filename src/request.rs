//! How a call becomes a request and an answer a result, without I/O: a
//! Lock's body from its options, a status mapped to an [`Error`], and the
//! small conversions every floor above uses.

use crate::error::{Error, Result};
use crate::options::{LockOptions, LockWait};
use crate::proto::{RequestLock, Response, ResponseStatus};
use std::time::Duration;

/// The Lock (or Enqueue) body for `keys` under `options`.
pub(crate) fn lock_body(keys: &[String], options: &LockOptions) -> RequestLock {
    let mut body = RequestLock {
        keys: keys.to_vec(),
        release_micro: lease_of(options).map_or(0, micros),
        ..RequestLock::default()
    };
    if options.shares() {
        // Only set when asked, so an exclusive Lock is encoded exactly
        // as by every older client.
        body.shared_keys = keys.to_vec();
        body.limit = options.limit;
    }
    match options.wait {
        LockWait::Forever => {}
        // A positive limit below a microsecond still means "wait a little".
        LockWait::AtMost(d) => body.wait_micro = micros(d).max(1),
        LockWait::No => body.try_lock = true,
    }
    body
}

/// The lease `options` ask for: on the wire a zero lease means none; so it
/// does here.
pub(crate) fn lease_of(options: &LockOptions) -> Option<Duration> {
    // As the server takes it, in whole microseconds: the guard must not
    // count on the nanoseconds the wire drops.
    options
        .lease
        .map(micros)
        .filter(|&m| m > 0)
        .map(Duration::from_micros)
}

/// A try-lock's "timed out" is "busy".
pub(crate) fn busy_if_no_wait(e: Error, options: &LockOptions) -> Error {
    match e {
        Error::Timeout { busy } if options.wait == LockWait::No => Error::Busy { busy },
        e => e,
    }
}

/// Microseconds of `d`, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Maps a response's status to a result.
pub(crate) fn check(resp: Response) -> Result<Response> {
    let status = ResponseStatus::try_from(resp.status)
        .map_err(|_| Error::Protocol(format!("unknown response status {}", resp.status)))?;
    match status {
        // Queued answers only an Enqueue, which reads its ticket.
        ResponseStatus::Ok | ResponseStatus::Queued => Ok(resp),
        ResponseStatus::AcquireTimeout => Err(Error::Timeout { busy: resp.keys }),
        ResponseStatus::AccessDenied => Err(Error::AccessDenied(resp.error_text)),
        ResponseStatus::NotHeld => Err(Error::NotHeld { keys: resp.keys }),
        status => Err(Error::Server {
            status,
            text: resp.error_text,
        }),
    }
}
