//! Turns one decoded request into an encoded response, or into a wait for one.
//!
//! Validation happens here, before anything reaches the lock table, so every
//! bad input gets a status that names what is wrong and has no effect.

use crate::acl::{self, Access, Identity};
use crate::config::Config;
use crate::db::{Db, LockReply};
use crate::fence::unix_nanos;
use crate::limit_log;
use crate::metrics;
use crate::table::{Key, OwnerId, WaitLimit, WaitOutcome, Woken};
use bytes::BytesMut;
use dlock::codec::encode_frame;
use dlock::proto::{Request, RequestLock, RequestType, Response, ResponseStatus};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// What becomes of a request.
#[derive(Debug)]
enum Step {
    /// Answer now.
    Reply(Response),
    /// A Lock waits; answer when the receiver yields.
    Wait {
        /// The request's id, echoed in the eventual response.
        request_id: u64,
        /// Delivers the outcome.
        rx: oneshot::Receiver<Woken>,
        /// What access control notes if it is granted.
        pending: Option<acl::Pending>,
    },
}

/// Everything a request needs besides itself.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    /// The lock state.
    pub db: &'a Db,
    /// Limits and options.
    pub config: &'a Config,
    /// Who may do what.
    pub access: &'a Access,
    /// The names of the connection's TLS client certificate, if any.
    pub peer_names: &'a [String],
    /// The connection the request came on.
    pub owner: OwnerId,
}

/// A response with the fields every response carries.
pub fn response(request_id: u64, status: ResponseStatus) -> Response {
    Response {
        version: dlock::PROTOCOL_VERSION,
        request_id,
        status: status as i32,
        server_unix_time: i64::try_from(unix_nanos(SystemTime::now())).unwrap_or(i64::MAX),
        ..Response::default()
    }
}

/// A response with a status and an explanation.
pub fn error(request_id: u64, status: ResponseStatus, text: impl Into<String>) -> Response {
    let mut r = response(request_id, status);
    r.error_text = text.into();
    r
}

/// The answer to a frame whose body is not a `Request`.
pub fn undecodable(e: &prost::DecodeError) -> Response {
    error(
        0,
        ResponseStatus::General,
        format!("request is not a valid protobuf Request: {e}"),
    )
}

/// The response to a Lock that waited.
pub fn woken(waiting: Waiting, woken: Woken) -> Response {
    let request_id = waiting.request_id;
    let waited = waiting.since.elapsed();
    let r = match woken.wake {
        WaitOutcome::Granted { fence } => {
            metrics::granted_after(waited);
            if let Some(p) = waiting.pending {
                p.granted(fence);
            }
            let mut r = response(request_id, ResponseStatus::Ok);
            r.fence = fence;
            r
        }
        WaitOutcome::TimedOut(keys) => {
            busy(request_id, keys, "wait limit reached; keys still busy")
        }
        WaitOutcome::LimitReached => error(
            request_id,
            ResponseStatus::LimitReached,
            "server limit on held keys reached while waiting; try again later",
        ),
    };
    metrics::request(RequestType::Lock as i32, r.status(), waited);
    r
}

fn busy(request_id: u64, keys: Vec<Key>, text: &str) -> Response {
    let mut r = error(request_id, ResponseStatus::AcquireTimeout, text);
    r.keys = keys.iter().map(|k| k.to_string()).collect();
    r
}

/// A Lock that has to wait.
#[derive(Debug)]
pub struct Waiting {
    /// The request's id, echoed in the eventual response.
    pub request_id: u64,
    /// Where its outcome arrives.
    pub rx: oneshot::Receiver<Woken>,
    /// When it started, for metrics.
    since: Instant,
    /// What access control notes if it is granted.
    pending: Option<acl::Pending>,
}

/// Executes `req` for the connection in `ctx`: the answer is appended to
/// `out` as a frame, unless the request is a Lock that has to wait.
pub fn execute(ctx: Ctx<'_>, req: Request, out: &mut BytesMut) -> Option<Waiting> {
    let (id, kind) = (req.id, req.r#type);
    let start = Instant::now();
    // Encoded from where it was built: a Response is 136 bytes, and moving
    // it out of the Result was a memcpy call per request.
    let status = match execute_inner(ctx, req) {
        Ok(Step::Reply(ref r)) => {
            encode_frame(r, out);
            r.status()
        }
        Ok(Step::Wait {
            request_id,
            rx,
            pending,
        }) => {
            return Some(Waiting {
                request_id,
                rx,
                since: start,
                pending,
            })
        }
        Err((status, text)) => {
            encode_frame(&error(id, status, text), out);
            status
        }
    };
    metrics::request(kind, status, start.elapsed());
    None
}

/// Why a request is answered with an error: the status and its error_text.
/// Named apart from dlock-client's `exit::Failure`, which ends the CLI.
type Refusal = (ResponseStatus, String);

fn execute_inner(ctx: Ctx<'_>, req: Request) -> Result<Step, Refusal> {
    let id = req.id;
    if req.version != 0 && req.version != dlock::PROTOCOL_VERSION {
        return Err((
            ResponseStatus::Version,
            format!("protocol version {} not supported; use 2", req.version),
        ));
    }
    let who = ctx
        .access
        .identify(&req.access_token, ctx.peer_names)
        .map_err(|text| (ResponseStatus::AccessDenied, text.to_owned()))?;
    let Ok(kind) = RequestType::try_from(req.r#type) else {
        return Err((
            ResponseStatus::InvalidType,
            format!("unknown request type {}", req.r#type),
        ));
    };
    let body = req.lock.unwrap_or_default();
    if let Some(who) = &who {
        let deny = |text| (ResponseStatus::AccessDenied, text);
        who.permits(kind, &body).map_err(deny)?;
        if matches!(kind, RequestType::Unlock | RequestType::Renew) {
            ctx.access
                .check_fence(ctx.db, ctx.owner, who, &body)
                .map_err(deny)?;
        }
    }
    match kind {
        RequestType::Invalid => Err((ResponseStatus::InvalidType, "request type not set".into())),
        RequestType::Ping => Ok(Step::Reply(response(id, ResponseStatus::Ok))),
        RequestType::Hello => {
            let mut r = response(id, ResponseStatus::Ok);
            r.limits = Some(ctx.config.limits());
            Ok(Step::Reply(r))
        }
        RequestType::Lock => lock(ctx, id, body, who.as_ref()),
        RequestType::Unlock => {
            let fence = fence_of(&body);
            let keys = checked_keys(ctx.config, body.keys)?;
            let not_held = ctx.db.unlock(ctx.owner, keys, fence);
            Ok(Step::Reply(held_result(
                id,
                not_held,
                "not held by this connection or fence",
            )))
        }
        RequestType::Renew => {
            if body.release_micro == 0 {
                return Err((
                    ResponseStatus::InvalidArgument,
                    "Renew needs release_micro > 0".into(),
                ));
            }
            let lease = lease_of(ctx.config, body.release_micro)?;
            let fence = fence_of(&body);
            let keys = checked_keys(ctx.config, body.keys)?;
            let not_held = ctx.db.renew(ctx.owner, keys, fence, lease);
            Ok(Step::Reply(held_result(
                id,
                not_held,
                "not held by this connection or fence",
            )))
        }
        RequestType::Inspect => {
            let mut r = response(id, ResponseStatus::Ok);
            if body.keys.is_empty() {
                r.server_stats = Some(ctx.db.stats());
            } else {
                validate_keys(ctx.config, &body.keys)?;
                r.key_info = ctx.db.inspect(ctx.owner, &body.keys);
            }
            Ok(Step::Reply(r))
        }
    }
}

fn lock(
    ctx: Ctx<'_>,
    id: u64,
    body: RequestLock,
    who: Option<&Arc<Identity>>,
) -> Result<Step, Refusal> {
    if body.fence != 0 {
        return Err((
            ResponseStatus::InvalidArgument,
            "fence names an existing lock; it applies to Unlock and Renew only".into(),
        ));
    }
    if body.try_lock && body.wait_micro != 0 {
        return Err((
            ResponseStatus::InvalidArgument,
            "try_lock and wait_micro exclude each other".into(),
        ));
    }
    let lease = match body.release_micro {
        0 => None,
        micros => Some(lease_of(ctx.config, micros)?),
    };
    let wait = if body.try_lock {
        WaitLimit::No
    } else if body.wait_micro == 0 {
        WaitLimit::Forever
    } else {
        // Relative to the command's time, which the lock state reads once.
        WaitLimit::For(Duration::from_micros(body.wait_micro))
    };
    // Only a non-admin identity's grants are noted, so only they pay for it.
    let pending = who.and_then(|w| ctx.access.pending(ctx.db, w, &body.keys));
    let keys = checked_keys(ctx.config, body.keys)?;
    match ctx.db.lock(ctx.owner, keys, wait, lease) {
        LockReply::Granted(fence) => {
            metrics::granted_at_once();
            if let Some(p) = pending {
                p.granted(fence);
            }
            let mut r = response(id, ResponseStatus::Ok);
            r.fence = fence;
            Ok(Step::Reply(r))
        }
        LockReply::Wait(rx) => Ok(Step::Wait {
            request_id: id,
            rx,
            pending,
        }),
        LockReply::Busy(keys) => Ok(Step::Reply(busy(id, keys, "keys busy"))),
        LockReply::LimitReached(what) => {
            match what {
                "waiters" => limit_log::WAITERS.hit(ctx.config.max_waiters),
                "held keys" => limit_log::HELD_KEYS.hit(ctx.config.max_held_keys),
                // A limit added to the table without a throttle here is
                // still logged, just not paced.
                other => tracing::warn!(limit = other, "limit reached"),
            }
            Err((
                ResponseStatus::LimitReached,
                format!("server limit on {what} reached; try again later"),
            ))
        }
        LockReply::ShuttingDown => Err((
            ResponseStatus::ShuttingDown,
            "server is shutting down".into(),
        )),
    }
}

fn fence_of(body: &RequestLock) -> Option<u64> {
    (body.fence != 0).then_some(body.fence)
}

fn lease_of(config: &Config, micros: u64) -> Result<Duration, Refusal> {
    let lease = Duration::from_micros(micros);
    if lease > config.max_lease {
        return Err((
            ResponseStatus::InvalidArgument,
            format!(
                "release_micro {micros} exceeds the server's --max-lease of {}",
                humantime::format_duration(config.max_lease)
            ),
        ));
    }
    Ok(lease)
}

fn held_result(id: u64, not_held: Vec<Key>, text: &str) -> Response {
    if not_held.is_empty() {
        return response(id, ResponseStatus::Ok);
    }
    let mut r = error(id, ResponseStatus::NotHeld, text);
    r.keys = not_held.iter().map(|k| k.to_string()).collect();
    r
}

/// Checks the key list against the limits and converts it for the table.
fn checked_keys(config: &Config, keys: Vec<String>) -> Result<Vec<Key>, Refusal> {
    validate_keys(config, &keys)?;
    Ok(keys.into_iter().map(Key::from).collect())
}

/// Checks the key list against the limits.
fn validate_keys(config: &Config, keys: &[String]) -> Result<(), Refusal> {
    if keys.is_empty() {
        return Err((ResponseStatus::NoKeys, "request names no keys".into()));
    }
    if keys.len() > config.max_keys {
        return Err((
            ResponseStatus::TooManyKeys,
            format!(
                "{} keys in one request; the limit is {}",
                keys.len(),
                config.max_keys
            ),
        ));
    }
    if let Some(i) = keys.iter().position(|k| k.is_empty()) {
        return Err((ResponseStatus::InvalidKey, format!("key #{i} is empty")));
    }
    if let Some(i) = keys.iter().position(|k| k.len() > config.max_key_len) {
        return Err((
            ResponseStatus::InvalidKey,
            format!(
                "key #{i} is {} bytes long; the limit is {}",
                keys[i].len(),
                config.max_key_len
            ),
        ));
    }
    Ok(())
}
