//! Turns one decoded request into an encoded response, or into a wait for one.
//!
//! Validation happens here, before anything reaches the lock table, so every
//! bad input gets a status that names what is wrong and has no effect.

use crate::acl::{self, Identity};
use crate::config::Config;
use crate::db::LockReply;
use crate::fence::unix_nanos;
use crate::limit_log;
use crate::metrics;
use crate::owners::{Owners, TooManySessions};
use crate::pending::{Arrived, Pending};
use crate::replicated::ConnSessions;
use crate::shared::Shared;
use crate::table::{
    Command, Key, KeyView, LockResult, Mode, OwnerId, ReqId, Sharing, WaitLimit, WaitOutcome, Woken,
};
use crate::tickets::{Collected, Tickets};
use bytes::BytesMut;
use dlock::codec::encode_frame;
use dlock::proto::{
    KeyHolder, KeyInfo, Request, RequestLock, RequestType, Response, ResponseStatus,
};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// What becomes of a request.
#[derive(Debug)]
// Built once per request and encoded where it lies (see `execute`): boxing
// the large variant would add an allocation to every answer.
#[allow(clippy::large_enum_variant)]
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
        grant_note: Option<acl::Pending>,
    },
    /// Answer with what arrives (a cluster node's replicated requests).
    Later(Pending),
}

/// Everything a request needs besides itself: the server's shared state
/// and the owners of the connection it came on.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The server's shared state.
    pub shared: &'a Shared,
    /// The connection's owners: its own and its sessions.
    pub owners: &'a mut Owners,
    /// On a cluster node: the sessions this connection opened.
    pub remote: Option<&'a Arc<ConnSessions>>,
    /// The names of the connection's TLS client certificate, if any.
    pub peer_names: &'a [String],
    /// The connection's queued Enqueues, until their Wait (single server).
    pub tickets: &'a mut Tickets,
}

/// Why a request is answered with an error: the status and the text that
/// explains it. Named apart from dlock-client's `exit::Failure`, which ends
/// the CLI.
#[derive(Debug)]
pub struct Refusal {
    /// The response's status.
    pub status: ResponseStatus,
    /// The response's error_text.
    pub text: String,
}

impl Refusal {
    pub(crate) fn new(status: ResponseStatus, text: impl Into<String>) -> Refusal {
        Refusal {
            status,
            text: text.into(),
        }
    }
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
pub fn woken(request_id: u64, woken: Woken) -> Response {
    woken_noted(request_id, woken, None)
}

fn woken_noted(request_id: u64, woken: Woken, note: Option<acl::Pending>) -> Response {
    match woken.wake {
        WaitOutcome::Granted { fence } => {
            if let Some(p) = note {
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
    }
}

fn busy(request_id: u64, keys: Vec<Key>, text: &str) -> Response {
    let mut r = error(request_id, ResponseStatus::AcquireTimeout, text);
    r.keys = keys.iter().map(|k| k.to_string()).collect();
    r
}

/// A request answered later.
#[derive(Debug)]
pub struct Waiting {
    /// The request's id, echoed in the eventual response.
    pub request_id: u64,
    /// Where its answer arrives.
    pub answer: Pending,
    /// Its type and when it started, for metrics.
    kind: i32,
    since: Instant,
    /// What access control notes if it is granted.
    grant_note: Option<acl::Pending>,
}

impl Waiting {
    /// The response, now that `arrived` has.
    pub fn respond(self, arrived: Arrived) -> Response {
        let waited = self.since.elapsed();
        let r = match arrived {
            Arrived::Woken(w) => {
                if matches!(w.wake, WaitOutcome::Granted { .. }) {
                    metrics::granted_after(waited);
                }
                woken_noted(self.request_id, w, self.grant_note)
            }
            Arrived::Response(r) => r,
        };
        metrics::request(self.kind, r.status(), waited);
        r
    }
}

/// Executes `req` for the connection in `ctx`: the answer is appended to
/// `out` as a frame, unless the request is a Lock that has to wait.
pub fn execute(ctx: &mut Ctx<'_>, req: Request, out: &mut BytesMut) -> Option<Waiting> {
    let (id, kind) = (req.id, req.r#type);
    let start = Instant::now();
    // Encoded from where it was built: moving a Response out of the Result
    // was a memcpy call per request.
    let status = match execute_inner(ctx, req) {
        Ok(Step::Reply(ref r)) => {
            encode_frame(r, out);
            r.status()
        }
        Ok(Step::Wait {
            request_id,
            rx,
            grant_note,
        }) => {
            return Some(Waiting {
                request_id,
                answer: Pending::Table(rx),
                kind,
                since: start,
                grant_note,
            })
        }
        Ok(Step::Later(answer)) => {
            return Some(Waiting {
                request_id: id,
                answer,
                kind,
                since: start,
                grant_note: None,
            })
        }
        Err(refusal) => {
            let status = refusal.status;
            encode_frame(&refused(id, refusal), out);
            status
        }
    };
    metrics::request(kind, status, start.elapsed());
    None
}

fn execute_inner(ctx: &mut Ctx<'_>, req: Request) -> Result<Step, Refusal> {
    let id = req.id;
    let config = &ctx.shared.config;
    if req.version != 0 && req.version != dlock::PROTOCOL_VERSION {
        return Err(Refusal::new(
            ResponseStatus::Version,
            format!("protocol version {} not supported; use 2", req.version),
        ));
    }
    let access = &ctx.shared.access;
    let who = access
        .identify(&req.access_token, ctx.peer_names)
        .map_err(|text| Refusal::new(ResponseStatus::AccessDenied, text))?;
    let Ok(kind) = RequestType::try_from(req.r#type) else {
        return Err(Refusal::new(
            ResponseStatus::InvalidType,
            format!("unknown request type {}", req.r#type),
        ));
    };
    if let Some(who) = &who {
        let none = RequestLock::default();
        let body = req.lock.as_ref().unwrap_or(&none);
        let deny = |text| Refusal::new(ResponseStatus::AccessDenied, text);
        who.permits(kind, body).map_err(deny)?;
        // A cluster node checks Unlock/Renew/Proclaim by another
        // identity's fence against the replicated record instead.
        if matches!(
            kind,
            RequestType::Unlock | RequestType::Renew | RequestType::Proclaim
        ) && ctx.shared.cluster.is_none()
        {
            let owner = ctx.owners.resolve(req.session).unwrap_or(ctx.owners.own());
            access
                .check_fence(&ctx.shared.db, owner, who, body)
                .map_err(deny)?;
        }
    }
    if let (Some(node), Some(conn)) = (&ctx.shared.cluster, ctx.remote) {
        let db = ctx.shared.db.clone();
        return Ok(Step::Later(node.execute(conn, req, kind, db, who.as_ref())));
    }
    if kind == RequestType::OpenSession {
        return open_session(ctx, id, req.session);
    }
    let Some(owner) = ctx.owners.resolve(req.session) else {
        return Err(unknown_session(req.session));
    };
    let db = &ctx.shared.db;
    let body = req.lock.unwrap_or_default();
    match kind {
        RequestType::ClusterStatus | RequestType::ClusterAdd | RequestType::ClusterRemove => {
            Err(Refusal::new(
                ResponseStatus::InvalidType,
                "this server is not a cluster node (it was started without --data-dir)",
            ))
        }
        RequestType::Invalid => Err(Refusal::new(
            ResponseStatus::InvalidType,
            "request type not set",
        )),
        RequestType::Ping => Ok(Step::Reply(response(id, ResponseStatus::Ok))),
        RequestType::Hello => {
            let mut r = response(id, ResponseStatus::Ok);
            r.limits = Some(config.limits());
            Ok(Step::Reply(r))
        }
        RequestType::Lock => lock(ctx.shared, owner, id, body, who.as_ref()),
        RequestType::Enqueue => enqueue(ctx, owner, id, body, who.as_ref()),
        RequestType::Wait => match ctx.tickets.collect(body.ticket, owner) {
            Collected::Ticket(t) => Ok(Step::Wait {
                request_id: id,
                rx: t.rx,
                grant_note: t.grant_note,
            }),
            Collected::Unknown => Err(unknown_ticket(body.ticket)),
        },
        RequestType::Unlock => {
            let fence = fence_of(&body);
            let keys = checked_keys(config, body.keys)?;
            let not_held = db.unlock(owner, keys, fence);
            Ok(Step::Reply(held_result(id, not_held)))
        }
        RequestType::Renew => {
            let lease = renew_lease(config, body.release_micro)?;
            let fence = fence_of(&body);
            let keys = checked_keys(config, body.keys)?;
            let not_held = db.renew(owner, keys, fence, lease);
            Ok(Step::Reply(held_result(id, not_held)))
        }
        RequestType::Proclaim => {
            let fence = fence_of(&body);
            crate::watch::check_value(&body.value)?;
            let keys = checked_keys(config, body.keys)?;
            let not_held = db.proclaim(owner, keys, fence, body.value);
            Ok(Step::Reply(held_result(id, not_held)))
        }
        RequestType::Watch => watch(ctx.shared, owner, id, body),
        RequestType::Inspect => {
            let mut r = response(id, ResponseStatus::Ok);
            if body.keys.is_empty() {
                r.server_stats = Some(db.stats());
            } else {
                validate_keys(config, &body.keys)?;
                r.key_info = db.inspect(owner, &body.keys);
            }
            Ok(Step::Reply(r))
        }
        RequestType::OpenSession => unreachable!("answered above"),
        RequestType::CloseSession => {
            if req.session == 0 {
                return Err(Refusal::new(
                    ResponseStatus::InvalidArgument,
                    "CloseSession needs a session; the connection's own ends with the connection",
                ));
            }
            ctx.tickets.close_owner(owner);
            ctx.owners.close(owner);
            Ok(Step::Reply(response(id, ResponseStatus::Ok)))
        }
    }
}

const NOT_HELD: &str = "not held by this session or fence";

fn unknown_session(session: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        format!("session {session} is not open on this connection"),
    )
}

/// OpenSession: a new owner on this connection. On a single server a
/// session ends with its connection, so there is none to resume.
fn open_session(ctx: &mut Ctx<'_>, id: u64, resume: u64) -> Result<Step, Refusal> {
    if resume != 0 {
        return Err(Refusal::new(
            ResponseStatus::UnknownSession,
            format!(
                "session {resume} cannot be resumed: on a single server a session ends with its connection"
            ),
        ));
    }
    match ctx.owners.open() {
        Ok(session) => {
            let mut r = response(id, ResponseStatus::Ok);
            r.session = session;
            Ok(Step::Reply(r))
        }
        Err(TooManySessions) => Err(Refusal::new(
            ResponseStatus::LimitReached,
            format!(
                "this connection has --max-sessions {} sessions open; close one first",
                ctx.shared.config.max_sessions
            ),
        )),
    }
}

fn lock(
    shared: &Shared,
    owner: OwnerId,
    id: u64,
    body: RequestLock,
    who: Option<&Arc<Identity>>,
) -> Result<Step, Refusal> {
    let config = &shared.config;
    // Only a non-admin identity's grants are noted, so only they pay for it.
    let grant_note = who.and_then(|w| shared.access.pending(&shared.db, w, &body.keys));
    let args = lock_args(config, body)?;
    let db = &shared.db;
    match db.lock_valued(
        owner,
        args.keys,
        args.sharing,
        args.wait,
        args.lease,
        args.value,
    ) {
        LockReply::Granted(fence) => {
            metrics::granted_at_once();
            if let Some(p) = grant_note {
                p.granted(fence);
            }
            Ok(Step::Reply(granted(id, fence)))
        }
        LockReply::Wait(rx) => Ok(Step::Wait {
            request_id: id,
            rx,
            grant_note,
        }),
        LockReply::Busy(keys) => Ok(Step::Reply(busy(id, keys, "keys busy"))),
        LockReply::LimitReached(what) => Err(limit_reached(config, what)),
        LockReply::ShuttingDown => Err(shutting_down()),
        LockReply::ModeConflict(keys) => Ok(Step::Reply(mode_conflict(id, keys))),
        LockReply::LimitMismatch(keys) => Ok(Step::Reply(limit_mismatch(id, keys))),
    }
}

/// Enqueue: a Lock that answers at once. Granted at once, it is answered
/// as a Lock; queued, its delivery is parked in the connection's tickets
/// and the answer is Queued with the ticket and the place in line.
fn enqueue(
    ctx: &mut Ctx<'_>,
    owner: OwnerId,
    id: u64,
    body: RequestLock,
    who: Option<&Arc<Identity>>,
) -> Result<Step, Refusal> {
    let shared = ctx.shared;
    let config = &shared.config;
    let args = lock_args(config, body)?;
    if ctx.tickets.is_full() {
        return Err(too_many_tickets(ctx.tickets.max()));
    }
    let grant_note = who.and_then(|w| {
        let keys: Vec<String> = args.keys.iter().map(|k| k.to_string()).collect();
        shared.access.pending(&shared.db, w, &keys)
    });
    let (reply, place) = shared.db.lock_placed(
        owner,
        args.keys,
        args.sharing,
        args.wait,
        args.lease,
        args.value,
    );
    match reply {
        LockReply::Granted(fence) => {
            metrics::granted_at_once();
            if let Some(p) = grant_note {
                p.granted(fence);
            }
            Ok(Step::Reply(granted(id, fence)))
        }
        LockReply::Wait(rx) => {
            let (ticket, place) = place.unwrap_or_default();
            ctx.tickets.insert(ticket, owner, rx, grant_note);
            Ok(Step::Reply(queued(id, ticket, place)))
        }
        LockReply::Busy(keys) => Ok(Step::Reply(busy(id, keys, "keys busy"))),
        LockReply::LimitReached(what) => Err(limit_reached(config, what)),
        LockReply::ShuttingDown => Err(shutting_down()),
        LockReply::ModeConflict(keys) => Ok(Step::Reply(mode_conflict(id, keys))),
        LockReply::LimitMismatch(keys) => Ok(Step::Reply(limit_mismatch(id, keys))),
    }
}

/// The answer to an Enqueue that waits in line.
pub(crate) fn queued(id: u64, ticket: ReqId, place: usize) -> Response {
    let mut r = response(id, ResponseStatus::Queued);
    r.ticket = ticket;
    r.place = u32::try_from(place).unwrap_or(u32::MAX);
    r
}

/// A Wait whose ticket the session does not hold.
pub(crate) fn unknown_ticket(ticket: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownTicket,
        format!(
            "ticket {ticket} is not a queued Enqueue of this session: never issued to it, \
             already waited for, or withdrawn"
        ),
    )
}

/// An Enqueue over the per-connection limit of tickets.
pub(crate) fn too_many_tickets(max: usize) -> Refusal {
    Refusal::new(
        ResponseStatus::LimitReached,
        format!(
            "this connection holds {max} tickets not yet waited for (--max-pipeline); \
             Wait for one first"
        ),
    )
}

/// A Lock's arguments, checked.
#[derive(Debug)]
pub(crate) struct LockArgs {
    pub(crate) keys: Vec<Key>,
    pub(crate) sharing: Sharing,
    pub(crate) wait: WaitLimit,
    pub(crate) lease: Option<Duration>,
    pub(crate) value: Vec<u8>,
}

impl LockArgs {
    /// The table command that asks for these keys for `owner`: a Lock's,
    /// and an Enqueue's, which the table treats as a Lock.
    pub(crate) fn into_command(self, owner: OwnerId) -> Command {
        Command::Lock {
            owner,
            keys: self.keys,
            sharing: self.sharing,
            wait: self.wait,
            lease: self.lease,
            value: self.value,
        }
    }
}

/// A Lock's arguments, checked: its keys, which of them are shared, how long
/// it may wait, its lease.
pub(crate) fn lock_args(config: &Config, body: RequestLock) -> Result<LockArgs, Refusal> {
    if body.fence != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "fence names an existing lock; it applies to Unlock and Renew only",
        ));
    }
    if body.ticket != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "ticket names a queued Enqueue; it applies to Wait only",
        ));
    }
    if body.try_lock && body.wait_micro != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "try_lock and wait_micro exclude each other",
        ));
    }
    let lease = match body.release_micro {
        0 => None,
        micros => Some(lease_of(config, micros)?),
    };
    let wait = if body.try_lock {
        WaitLimit::No
    } else if body.wait_micro == 0 {
        WaitLimit::Forever
    } else {
        // Relative to the command's time, which the lock state reads once.
        WaitLimit::For(Duration::from_micros(body.wait_micro))
    };
    if body.limit != 0 && body.shared_keys.is_empty() {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "limit applies to shared keys; name them in shared_keys",
        ));
    }
    if let Some(k) = body.shared_keys.iter().find(|k| !body.keys.contains(k)) {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            format!("shared key {k:?} is not among the request's keys"),
        ));
    }
    let sharing = Sharing {
        keys: body.shared_keys.into_iter().map(Key::from).collect(),
        limit: body.limit,
    };
    crate::watch::check_value(&body.value)?;
    Ok(LockArgs {
        keys: checked_keys(config, body.keys)?,
        sharing,
        wait,
        lease,
        value: body.value,
    })
}

/// The answer to a Lock the table decided at once; the request to wait
/// for when it waits.
pub(crate) fn lock_result(config: &Config, id: u64, result: LockResult) -> Result<Response, ReqId> {
    Ok(match result {
        LockResult::Granted { fence } => granted(id, fence),
        LockResult::Waiting(req) => return Err(req),
        LockResult::Busy(keys) => busy(id, keys, "keys busy"),
        LockResult::LimitReached(what) => refused(id, limit_reached(config, what)),
        LockResult::ShuttingDown => refused(id, shutting_down()),
        LockResult::ModeConflict(keys) => mode_conflict(id, keys),
        LockResult::LimitMismatch(keys) => limit_mismatch(id, keys),
    })
}

fn mode_conflict(id: u64, keys: Vec<Key>) -> Response {
    let text = format!(
        "keys {} already held or waited for by this session in the other mode \
         (shared against exclusive); unlock them first",
        key_list(&keys)
    );
    with_keys(error(id, ResponseStatus::ModeConflict, text), keys)
}

fn limit_mismatch(id: u64, keys: Vec<Key>) -> Response {
    let text = format!(
        "keys {} are shared under another limit by their holders and waiters",
        key_list(&keys)
    );
    with_keys(error(id, ResponseStatus::LimitMismatch, text), keys)
}

fn key_list(keys: &[Key]) -> String {
    let quoted: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    quoted.join(", ")
}

fn with_keys(mut r: Response, keys: Vec<Key>) -> Response {
    r.keys = keys.iter().map(|k| k.to_string()).collect();
    r
}

/// Inspect's description of `key` from the table's `view`: `caller` is the
/// owner that asked, `addr` the connection address of an owner, if known.
/// A key held exclusively is described exactly as before shared holds
/// existed, so older clients see the same answer.
pub(crate) fn key_info(
    key: &str,
    view: KeyView,
    caller: Option<OwnerId>,
    addr: impl Fn(OwnerId) -> String,
) -> KeyInfo {
    let (holder, fence) = view.holder.unwrap_or((0, 0));
    let held = view.holder.is_some();
    let micros =
        |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut info = KeyInfo {
        key: key.to_owned(),
        fence,
        lease_remaining_micro: micros(view.lease_remaining),
        waiters: u32::try_from(view.waiters).unwrap_or(u32::MAX),
        held_by_caller: held && Some(holder) == caller,
        holder_addr: if held { addr(holder) } else { String::new() },
        held_micro: if held { micros(Some(view.held_for)) } else { 0 },
        value: view.value,
        ..KeyInfo::default()
    };
    if let Some(Mode::Shared { limit }) = view.mode {
        info.shared = true;
        info.limit = limit;
        info.holders = view
            .holders
            .iter()
            .map(|h| KeyHolder {
                fence: h.fence,
                lease_remaining_micro: micros(h.lease_remaining),
                held_by_caller: Some(h.owner) == caller,
                holder_addr: addr(h.owner),
                value: h.value.clone(),
                held_micro: micros(Some(h.held_for)),
            })
            .collect();
    }
    info
}

/// Watch on a single server: a task answers it from the table, now if the
/// key's first holder is not the one the caller knows, else after the
/// change that makes it so, or at its wait limit. It ends, and gives back
/// its place, when the connection drops the answer's receiver.
fn watch(shared: &Shared, owner: OwnerId, id: u64, body: RequestLock) -> Result<Step, Refusal> {
    let args = crate::watch::watch_args(&shared.config, body)?;
    // A parked Watch is a task; the fuzz harness drives requests without
    // a runtime, and there it is refused rather than answered wrongly.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Err(Refusal::new(
            ResponseStatus::WatchLimit,
            "Watch needs the server's runtime, which this harness has not",
        ));
    };
    let permit = shared.watches.take()?;
    let db = shared.db.clone();
    let (mut tx, rx) = oneshot::channel();
    runtime.spawn(async move {
        let _permit = permit;
        let key = &args.key;
        let look = || db.changed_from(owner, key, args.fence, &args.value);
        let info = tokio::select! {
            found = db.hub().wait_for(args.deadline, look) => match found {
                Some(info) => info,
                None => db.inspect_key(owner, key),
            },
            // The connection ended: the Watch is withdrawn.
            _ = tx.closed() => return,
        };
        let mut r = response(id, ResponseStatus::Ok);
        r.key_info = vec![info];
        let _ = tx.send(r);
    });
    Ok(Step::Later(Pending::Answer(rx)))
}

fn granted(id: u64, fence: u64) -> Response {
    let mut r = response(id, ResponseStatus::Ok);
    r.fence = fence;
    r
}

fn limit_reached(config: &Config, what: &str) -> Refusal {
    match what {
        "waiters" => limit_log::WAITERS.hit(config.max_waiters),
        "held keys" => limit_log::HELD_KEYS.hit(config.max_held_keys),
        // A limit added to the table without a throttle here is still
        // logged, just not paced.
        other => tracing::warn!(limit = other, "limit reached"),
    }
    Refusal::new(
        ResponseStatus::LimitReached,
        format!("server limit on {what} reached; try again later"),
    )
}

fn shutting_down() -> Refusal {
    Refusal::new(ResponseStatus::ShuttingDown, "server is shutting down")
}

/// The response that refuses request `id`.
pub fn refused(id: u64, r: Refusal) -> Response {
    error(id, r.status, r.text)
}

/// A Renew's lease, checked.
pub(crate) fn renew_lease(config: &Config, micros: u64) -> Result<Duration, Refusal> {
    if micros == 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "Renew needs release_micro > 0",
        ));
    }
    lease_of(config, micros)
}

fn fence_of(body: &RequestLock) -> Option<u64> {
    (body.fence != 0).then_some(body.fence)
}

fn lease_of(config: &Config, micros: u64) -> Result<Duration, Refusal> {
    let lease = Duration::from_micros(micros);
    if lease > config.max_lease {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            format!(
                "release_micro {micros} exceeds the server's --max-lease of {}",
                humantime::format_duration(config.max_lease)
            ),
        ));
    }
    Ok(lease)
}

pub(crate) fn held_result(id: u64, not_held: Vec<Key>) -> Response {
    if not_held.is_empty() {
        return response(id, ResponseStatus::Ok);
    }
    let mut r = error(id, ResponseStatus::NotHeld, NOT_HELD);
    r.keys = not_held.iter().map(|k| k.to_string()).collect();
    r
}

/// Checks the key list against the limits and converts it for the table.
pub(crate) fn checked_keys(config: &Config, keys: Vec<String>) -> Result<Vec<Key>, Refusal> {
    validate_keys(config, &keys)?;
    Ok(keys.into_iter().map(Key::from).collect())
}

/// Checks the key list against the limits.
pub(crate) fn validate_keys(config: &Config, keys: &[String]) -> Result<(), Refusal> {
    if keys.is_empty() {
        return Err(Refusal::new(
            ResponseStatus::NoKeys,
            "request names no keys",
        ));
    }
    if keys.len() > config.max_keys {
        return Err(Refusal::new(
            ResponseStatus::TooManyKeys,
            format!(
                "{} keys in one request; the limit is {}",
                keys.len(),
                config.max_keys
            ),
        ));
    }
    if let Some(i) = keys.iter().position(|k| k.is_empty()) {
        return Err(Refusal::new(
            ResponseStatus::InvalidKey,
            format!("key #{i} is empty"),
        ));
    }
    if let Some(i) = keys.iter().position(|k| k.len() > config.max_key_len) {
        return Err(Refusal::new(
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
