//! One place where outcomes become responses: every status a request can
//! be answered with, and the text that explains it, for both engines. Each
//! refusal has a named function here, grouped by family (requests as a
//! whole, sessions, Watch, cluster admin); the checks of a request's
//! arguments, and their texts, are `validate.rs`'s.

use crate::engine::fence::unix_nanos;
use crate::engine::EngineError;
use crate::ops::config::Config;
use crate::ops::limit_log;
use crate::ops::metrics;
use crate::table::{
    Key, KeyView, LockResult, Mode, OwnerId, Reply, ReqId, WaitOutcome, Woken, MAX_REMEMBERED,
};
use dlock_proto::proto::{KeyHolder, KeyInfo, Response, ResponseStatus};
use prost::Message;
use std::time::{Duration, Instant, SystemTime};

/// Why a request is answered with an error: the status, the text that
/// explains it, and for NotLeader the leader's address. Named apart from
/// dlock-client's `exit::Failure`, which ends the CLI.
#[derive(Debug)]
pub struct Refusal {
    /// The response's status.
    pub status: ResponseStatus,
    /// The response's error_text.
    pub text: String,
    /// NotLeader: where the leader takes clients, when known.
    pub leader_addr: String,
}

impl Refusal {
    /// A refusal with `status`, explained by `text`.
    pub fn new(status: ResponseStatus, text: impl Into<String>) -> Refusal {
        Refusal {
            status,
            text: text.into(),
            leader_addr: String::new(),
        }
    }
}

impl From<EngineError> for Refusal {
    fn from(e: EngineError) -> Refusal {
        let status = match &e {
            EngineError::NotLeader { .. } => ResponseStatus::NotLeader,
            EngineError::Unavailable(_) | EngineError::Refused(_) => ResponseStatus::Unavailable,
            EngineError::Fatal(_) => ResponseStatus::ShuttingDown,
        };
        let mut r = Refusal::new(status, e.to_string());
        if let EngineError::NotLeader {
            leader: Some((_, m)),
        } = e
        {
            r.leader_addr = m.client_addr;
        }
        r
    }
}

/// A response with the fields every response carries.
pub fn response(request_id: u64, status: ResponseStatus) -> Response {
    Response {
        version: dlock_proto::PROTOCOL_VERSION,
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

/// The response that refuses request `id`.
pub fn refused(id: u64, r: Refusal) -> Response {
    let mut resp = error(id, r.status, r.text);
    resp.leader_addr = r.leader_addr;
    resp
}

/// The answer to a frame whose body is not a `Request`.
pub fn undecodable(e: &prost::DecodeError) -> Response {
    error(
        0,
        ResponseStatus::General,
        format!("request is not a valid protobuf Request: {e}"),
    )
}

/// The response to request `id`, a Lock (or queued Enqueue) that waited
/// since `since` and came to `woken`.
pub fn woken(request_id: u64, woken: Woken, since: Instant) -> Response {
    match woken.wake {
        WaitOutcome::Granted { fence } => {
            metrics::granted_after(since.elapsed());
            granted(request_id, fence)
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

/// A Lock that did not wait: its keys were busy.
pub fn busy(request_id: u64, keys: Vec<Key>, text: &str) -> Response {
    with_keys(
        error(request_id, ResponseStatus::AcquireTimeout, text),
        keys,
    )
}

/// A grant under `fence`.
pub fn granted(id: u64, fence: u64) -> Response {
    let mut r = response(id, ResponseStatus::Ok);
    r.fence = fence;
    r
}

/// A Wait whose ticket the session does not hold.
pub fn unknown_ticket(ticket: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownTicket,
        format!(
            "ticket {ticket} is not a queued Enqueue of this session: never issued to it, \
             already waited for, or withdrawn"
        ),
    )
}

/// An Enqueue over the per-connection limit of tickets.
pub fn too_many_tickets(max: usize) -> Refusal {
    Refusal::new(
        ResponseStatus::LimitReached,
        format!(
            "this connection holds {max} tickets not yet waited for (--max-pipeline); \
             Wait for one first"
        ),
    )
}

const NOT_HELD: &str = "not held by this session or fence";

/// The answer to an Enqueue that waits in line.
pub fn queued(id: u64, ticket: ReqId, place: usize) -> Response {
    let mut r = response(id, ResponseStatus::Queued);
    r.ticket = ticket;
    r.place = u32::try_from(place).unwrap_or(u32::MAX);
    r
}

/// The answer to a Lock the table decided at once; the request to wait
/// for when it waits.
pub fn lock_result(config: &Config, id: u64, result: LockResult) -> Result<Response, ReqId> {
    Ok(match result {
        LockResult::Granted { fence } => {
            metrics::granted_at_once();
            granted(id, fence)
        }
        LockResult::Waiting(req) => return Err(req),
        LockResult::Busy(keys) => busy(id, keys, "keys busy"),
        LockResult::LimitReached(what) => refused(id, limit_reached(config, what)),
        LockResult::ShuttingDown => refused(id, shutting_down()),
        LockResult::ModeConflict(keys) => mode_conflict(id, keys),
        LockResult::LimitMismatch(keys) => limit_mismatch(id, keys),
    })
}

/// Keys the session has in the other mode.
pub fn mode_conflict(id: u64, keys: Vec<Key>) -> Response {
    let text = format!(
        "keys {} already held or waited for by this session in the other mode \
         (shared against exclusive); unlock them first",
        key_list(&keys)
    );
    with_keys(error(id, ResponseStatus::ModeConflict, text), keys)
}

/// Keys shared under another limit.
pub fn limit_mismatch(id: u64, keys: Vec<Key>) -> Response {
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
pub fn key_info(
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
        waited_micro: micros(Some(view.waited_for)),
        value: view.value,
        ..KeyInfo::default()
    };
    if let Some(Mode::Shared { limit }) = view.mode {
        info.shared = true;
        info.limit = limit;
        info.holders_omitted = u32::try_from(view.holders_omitted).unwrap_or(u32::MAX);
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

/// `r` within the largest response frame a client must accept
/// ([`dlock_proto::MAX_RESPONSE_FRAME`]). Only lists of shared holders grow
/// without a bound the request sets, so the longest list is cut first:
/// its oldest grants, the caller's own and its latest one stay (what a
/// client reads as the key's first holder, whether it holds, and the
/// fence), the others are counted in `holders_omitted`. Refused if even
/// that is not enough (many long keys with long values under limits raised
/// far past their defaults). The table lists holders within the same
/// budget already (`LockTable::inspect_within`); this is the exact check.
pub fn within_frame(mut r: Response) -> Result<Response, Refusal> {
    const LIMIT: usize = dlock_proto::MAX_RESPONSE_FRAME;
    // The caller's hold between the first and the last, which stays.
    let mine = |i: &KeyInfo| {
        let n = i.holders.len();
        (n > 2)
            .then(|| i.holders[1..n - 1].iter().position(|h| h.held_by_caller))
            .flatten()
            .map(|p| p + 1)
    };
    let kept = |i: &KeyInfo| 2 + usize::from(mine(i).is_some());
    loop {
        let len = r.encoded_len();
        let Some(over) = len.checked_sub(LIMIT).filter(|&o| o > 0) else {
            return Ok(r);
        };
        let busiest = r.server_stats.iter_mut().flat_map(|s| s.busiest.iter_mut());
        let Some(info) = r
            .key_info
            .iter_mut()
            .chain(busiest)
            .filter(|i| i.holders.len() > kept(i))
            .max_by_key(|i| i.holders.len())
        else {
            return Err(Refusal::new(
                ResponseStatus::LimitReached,
                format!(
                    "the answer would be {len} bytes, over the {LIMIT}-byte limit of a response; \
                     ask for fewer keys"
                ),
            ));
        };
        let n = info.holders.len();
        // A listed holder costs its body, a tag and a length of up to 3 bytes.
        let each = info
            .holders
            .iter()
            .map(|h| h.encoded_len() + 4)
            .sum::<usize>()
            / n;
        let cut = (over / each.max(1) + 1).min(n - kept(info));
        // Drop the `cut` holders just before the latest, stepping over the
        // caller's own.
        let mine = mine(info);
        let latest = n - 1;
        let mut from = latest - cut;
        if mine.is_some_and(|p| p >= from) {
            from -= 1;
        }
        let mut i = 0;
        info.holders.retain(|_| {
            let keep = i < from || i == latest || Some(i) == mine;
            i += 1;
            keep
        });
        info.holders_omitted = info
            .holders_omitted
            .saturating_add(u32::try_from(cut).unwrap_or(u32::MAX));
    }
}

/// A server-wide limit of the table, logged at a pace.
pub fn limit_reached(config: &Config, what: &str) -> Refusal {
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

/// The server is stopping.
pub fn shutting_down() -> Refusal {
    Refusal::new(ResponseStatus::ShuttingDown, "server is shutting down")
}

/// An Unlock, Renew or Proclaim: Ok, or the keys that were not held.
pub fn held_result(id: u64, not_held: Vec<Key>) -> Response {
    if not_held.is_empty() {
        return response(id, ResponseStatus::Ok);
    }
    let mut r = error(id, ResponseStatus::NotHeld, NOT_HELD);
    r.keys = not_held.iter().map(|k| k.to_string()).collect();
    r
}

// ---- Requests as a whole: the checks every request passes first, and
// the answer that never came (service.rs).

/// A request of a protocol version this server does not speak.
pub fn unsupported_version(version: u32) -> Refusal {
    Refusal::new(
        ResponseStatus::Version,
        format!("protocol version {version} not supported; use 2"),
    )
}

/// A request whose type this server does not know.
pub fn unknown_type(kind: i32) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidType,
        format!("unknown request type {kind}"),
    )
}

/// A request whose type is not set (`RequestType::Invalid`).
pub fn type_not_set() -> Refusal {
    Refusal::new(ResponseStatus::InvalidType, "request type not set")
}

/// A request on the local engine that did not finish at once (it never
/// waits there: a bug).
pub fn unfinished() -> Refusal {
    Refusal::new(
        ResponseStatus::General,
        "internal error: the request did not finish",
    )
}

// ---- Sessions: opening, resuming, closing, keeping alive, and the
// requests that name one (session.rs, lock.rs, service.rs).

/// An OpenSession asking a TTL (`asked` micros, 0 for the default) under
/// the shortest, `min`.
pub fn session_ttl_too_short(asked: u64, min: Duration) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!(
            "session_ttl_micro {asked} is under the shortest session TTL, {}",
            humantime::format_duration(min)
        ),
    )
}

/// An OpenSession asking a TTL (`asked` micros, 0 for the default) over the
/// server's `--max-session-ttl`, `max`.
pub fn session_ttl_too_long(asked: u64, max: Duration) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!(
            "session_ttl_micro {asked} exceeds the server's --max-session-ttl of {}",
            humantime::format_duration(max)
        ),
    )
}

/// A client's liveness probe (a Ping with no session) to a node that counts
/// itself leader but leads no majority, or steps aside to stop.
pub fn node_without_majority() -> Refusal {
    Refusal::new(
        ResponseStatus::Unavailable,
        "this node cannot serve: it leads no majority (cut off from the other nodes, \
         or stopping); use another node",
    )
}

/// A Ping of a connection one of whose sessions, `session`, has ended.
pub fn session_ended(session: OwnerId) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        format!("session {session} of this connection has ended"),
    )
}

/// An OpenSession naming `session` to resume on a single server, where
/// sessions end with their connection.
pub fn not_resumable(session: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        format!(
            "session {session} cannot be resumed: on a single server a session ends with its connection"
        ),
    )
}

/// An OpenSession on a connection that has `--max-sessions`, `max`,
/// sessions open.
pub fn too_many_sessions(max: usize) -> Refusal {
    Refusal::new(
        ResponseStatus::LimitReached,
        format!("this connection has --max-sessions {max} sessions open; close one first"),
    )
}

/// A new session while the cluster has `--max-cluster-sessions`, `max`,
/// sessions open.
pub fn too_many_cluster_sessions(max: usize) -> Refusal {
    Refusal::new(
        ResponseStatus::LimitReached,
        format!("the cluster has --max-cluster-sessions {max} sessions open; retry later"),
    )
}

/// An OpenSession (or an implicit session's opening) the table answered
/// with something else than a session (a bug).
pub fn open_session_answered(other: &Reply) -> Refusal {
    Refusal::new(
        ResponseStatus::General,
        format!("internal error: OpenSession answered {other:?}"),
    )
}

/// A CloseSession that names no session.
pub fn close_needs_session() -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        "CloseSession needs a session; the connection's own ends with the connection",
    )
}

/// A session opened for a connection that ended while the request was in
/// flight: it is ended again at once.
pub fn connection_ended() -> Refusal {
    Refusal::new(ResponseStatus::ShuttingDown, "the connection has ended")
}

/// A request naming a session this connection may not name: never opened
/// on it, resumed elsewhere, or ended.
pub fn unknown_session(session: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        format!("session {session} is not open on this connection or has ended"),
    )
}

/// A waiting Lock whose session ended (or whose connection went) before its
/// outcome came.
pub fn ended_while_waiting() -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        "the session ended while the Lock waited",
    )
}

/// A numbered request (`seq`) whose answer the session no longer remembers.
pub fn forgotten(seq: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!(
            "seq {seq} was applied in this session but its answer is forgotten \
             (seq_done passed it, or the session kept its {MAX_REMEMBERED} latest answers)"
        ),
    )
}

/// A numbered request (`seq`) sent again as another type of request.
pub fn not_the_same(seq: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!("seq {seq} was another type of request in this session; a resend must be the same request"),
    )
}

/// A command of a session the table answered with a reply no request of
/// that kind gets (a bug).
pub fn unexpected_reply(other: &Reply) -> Refusal {
    Refusal::new(
        ResponseStatus::General,
        format!("internal error: unexpected table reply {other:?}"),
    )
}

// ---- Watch (inspect.rs).

/// A Watch where no runtime can park it (the fuzz harness).
pub fn watch_without_runtime() -> Refusal {
    Refusal::new(
        ResponseStatus::WatchLimit,
        "Watch needs the server's runtime, which this harness has not",
    )
}

// ---- Cluster admin: ClusterStatus, ClusterAdd, ClusterRemove (admin.rs).

/// A cluster request to a single server.
pub fn not_a_cluster_node() -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidType,
        "this server is not a cluster node (it was started without --data-dir)",
    )
}

/// A ClusterAdd or ClusterRemove without `cluster.node_id`.
pub fn node_id_missing() -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        "cluster.node_id must be set",
    )
}

/// A ClusterAdd without the new node's client or peer address.
pub fn add_needs_addresses() -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        "ClusterAdd needs cluster.client_addr and cluster.peer_addr",
    )
}

/// A ClusterAdd naming `addr`, which is not `HOST:PORT`.
pub fn not_an_address(addr: &str) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!("{addr:?} is not an address a node can be dialled at: give HOST:PORT"),
    )
}

/// A ClusterAdd naming an address member `node_id` has.
pub fn address_taken(node_id: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!(
            "node {node_id} is at that address already: give the new node's own client and peer \
             addresses (dlock cluster status lists the members')"
        ),
    )
}

/// A ClusterRemove of `node_id`, which is not a member.
pub fn not_a_member(node_id: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!("node {node_id} is not a member of the cluster"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize, holders: usize) -> KeyInfo {
        KeyInfo {
            key: format!("k{n}"),
            value: vec![b'v'; dlock_proto::MAX_VALUE_LEN],
            holders: (0..holders as u64)
                .map(|fence| KeyHolder {
                    fence,
                    value: vec![b'v'; dlock_proto::MAX_VALUE_LEN],
                    ..KeyHolder::default()
                })
                .collect(),
            ..KeyInfo::default()
        }
    }

    #[test]
    fn the_longest_list_is_cut_first_and_just_enough() {
        let mut r = response(1, ResponseStatus::Ok);
        r.key_info = vec![key(0, 10), key(1, 5_000)];
        let r = within_frame(r).expect("fits once cut");
        let len = r.encoded_len();
        assert!(len <= dlock_proto::MAX_RESPONSE_FRAME);
        assert!(
            len > dlock_proto::MAX_RESPONSE_FRAME - 4 * 1100,
            "cut {len}"
        );
        assert_eq!(r.key_info[0].holders.len(), 10, "the short list stays");
        assert_eq!(r.key_info[0].holders_omitted, 0);
        let long = &r.key_info[1];
        assert_eq!(long.holders.len() + long.holders_omitted as usize, 5_000);
        assert_eq!(long.holders.last().map(|h| h.fence), Some(4_999));
    }

    #[test]
    fn the_callers_own_holder_is_never_cut() {
        let mut r = response(1, ResponseStatus::Ok);
        let mut big = key(1, 5_000);
        big.holders[1_234].held_by_caller = true;
        r.key_info = vec![big];
        let r = within_frame(r).expect("fits once cut");
        let k = &r.key_info[0];
        assert!(k
            .holders
            .iter()
            .any(|h| h.held_by_caller && h.fence == 1_234));
        assert_eq!(k.holders.len() + k.holders_omitted as usize, 5_000);
        assert!(k.holders.windows(2).all(|w| w[0].fence < w[1].fence));
        // Even when only three can stay: the first, the caller's, the last.
        let mut r = response(1, ResponseStatus::Ok);
        let mut three = key(1, 4);
        three.holders[2].held_by_caller = true;
        r.key_info = vec![three; 4_000];
        let refused = within_frame(r).expect_err("cannot fit");
        assert_eq!(refused.status, ResponseStatus::LimitReached);
    }

    #[test]
    fn an_answer_that_cannot_be_cut_enough_is_refused() {
        // Four thousand keys with long values, each with two holders: none
        // can be cut, and the whole is over 4 MiB.
        let mut r = response(1, ResponseStatus::Ok);
        r.key_info = (0..4_000).map(|n| key(n, 2)).collect();
        let refusal = within_frame(r).expect_err("too long");
        assert_eq!(refusal.status, ResponseStatus::LimitReached);
        assert!(
            refusal.text.contains("ask for fewer keys"),
            "{}",
            refusal.text
        );
    }
}
