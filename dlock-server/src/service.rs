//! The service: every client request, answered once for both engines.
//!
//! [`Service::execute`] checks what every request needs (version, access
//! token, type, access rules), then hands it to the function of its family:
//!
//! | file | requests |
//! |---|---|
//! | `lock` | Lock, Enqueue, Wait |
//! | `release` | Unlock, Renew, Proclaim |
//! | `session` | Ping, Hello, OpenSession, CloseSession; a connection's start and end |
//! | `inspect` | Inspect, Watch |
//! | `admin` | ClusterStatus, ClusterAdd, ClusterRemove |
//! | `reply` | one outcome, one Response: every status and error text |
//! | `validate` | a request's arguments checked against the limits |
//! | `outcomes` | the registry of requests answered later |
//!
//! Those functions are `async` and talk to the table only through the
//! [`Engine`]. On the local engine nothing they await ever waits, so
//! `execute` polls them once, in place, and answers at once (see `drive`):
//! no task, no allocation. On the raft engine a request is answered by a
//! task of its own, which the connection's pipeline waits for as it waits
//! for a Lock, so answers stay in request order.

mod admin;
mod conn;
mod hub;
mod inspect;
mod keep_alive;
mod lock;
mod outcomes;
pub mod pending;
mod release;
pub mod reply;
mod session;
mod validate;

use crate::engine::clock::Clock;
use crate::engine::{local, Engine, Local};
use crate::ops::acl::{Access, Identity};
use crate::ops::config::Config;
use crate::ops::metrics;
use crate::service::pending::{Arrived, Pending};
use crate::table::{LockTable, OwnerId, ReqId};
use bytes::BytesMut;
pub use conn::Conn;
use dlock_proto::codec::encode_frame;
use dlock_proto::proto::{Request, RequestLock, RequestType, Response, ResponseStatus};
pub use outcomes::Outcomes;
pub use reply::Refusal;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use validate::WatchPermits;

/// The service of one server: its engine, the registry of outcomes, and
/// what shapes answers (limits, access rules).
pub struct Service {
    engine: Engine,
    outcomes: Arc<Outcomes>,
    config: Config,
    access: Access,
    /// The bound on parked Watches (`--max-watchers`).
    watches: WatchPermits,
    /// Client connections open on this server, for Inspect and metrics.
    connections: AtomicUsize,
    /// Where connections' keep-alives share commits (raft engine).
    keep_alives: keep_alive::KeepAlives,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

/// A connection registered with the service. Dropping it ends the
/// connection's sessions (see `session::connection_ended`) however its task
/// ends, a panic included: on a single server nothing else would ever end
/// them.
pub struct Connected {
    service: Arc<Service>,
    conn: Arc<Conn>,
    clean: bool,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected")
            .field("conn", &self.conn)
            .finish()
    }
}

impl Connected {
    /// The connection, as requests name it.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The client closed the connection: on a cluster its sessions end at
    /// once rather than after their TTL.
    pub fn closed_by_client(&mut self) {
        self.clean = true;
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.service.connections.fetch_sub(1, Ordering::Relaxed);
        self.service.connection_ended(&self.conn, self.clean);
    }
}

/// What a request function answers.
// Built once per request and encoded where it lies: boxing the response
// would add an allocation to every answer.
#[allow(clippy::large_enum_variant)]
enum Answer {
    /// This response, now.
    Now(Response),
    /// The outcome of waiting request `req` of `owner`, when it comes.
    Outcome { owner: OwnerId, req: ReqId },
    /// What this future yields (a Watch): it waits, so it runs as a task.
    Task(Pin<Box<dyn Future<Output = Response> + Send>>),
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
}

impl Waiting {
    /// The response, now that `arrived` has.
    pub fn respond(self, arrived: Arrived) -> Response {
        let r = match arrived {
            Arrived::Woken(w) => reply::woken(self.request_id, w, self.since),
            Arrived::Response(r) => r,
        };
        metrics::request(self.kind, r.status(), self.since.elapsed());
        r
    }
}

impl Service {
    /// A single server's service over a new in-memory table.
    pub fn local(config: Config, access: Access, first_fence: u64) -> Arc<Service> {
        let table = local::table(config.table_limits(), first_fence);
        Service::local_with(config, access, table, Clock::tokio())
    }

    /// A single server's service over `table`, stamped by `clock` (the
    /// fuzz harness's is manual).
    pub fn local_with(
        config: Config,
        access: Access,
        table: LockTable,
        clock: Clock,
    ) -> Arc<Service> {
        let outcomes = Arc::new(Outcomes::default());
        let sink_to = outcomes.clone();
        let engine = Local::new(
            table,
            clock,
            Arc::new(move |disconnected, out| sink_to.applied(disconnected, out)),
        );
        Service::new(Engine::Local(engine), outcomes, config, access)
    }

    /// A cluster node's service: starts the node from `config`
    /// (`--data-dir` and the cluster flags); clients reach it at
    /// `client_addr`.
    ///
    /// # Errors
    /// See [`crate::engine::raft::start_from_config`].
    pub async fn raft(
        config: Config,
        access: Access,
        client_addr: SocketAddr,
        stop: CancellationToken,
    ) -> anyhow::Result<Arc<Service>> {
        let outcomes = Arc::new(Outcomes::default());
        let sink_to = outcomes.clone();
        // Every node applies every entry; only where the session is
        // attached is an outcome delivered, and a grant nobody receives
        // stays its session's (the client may resume it elsewhere).
        let sink = Arc::new(move |cmd: &_, out: &_| drop(sink_to.applied_ref(cmd, out).send()));
        let cluster =
            crate::engine::raft::start_from_config(&config, client_addr, stop, sink).await?;
        Ok(Service::new(
            Engine::Raft(cluster),
            outcomes,
            config,
            access,
        ))
    }

    fn new(engine: Engine, outcomes: Arc<Outcomes>, config: Config, access: Access) -> Arc<Self> {
        Arc::new(Service {
            engine,
            outcomes,
            watches: WatchPermits::new(config.max_watchers),
            config,
            access,
            connections: AtomicUsize::new(0),
            keep_alives: keep_alive::KeepAlives::default(),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The options the server runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The access rules.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The registry of outcomes.
    pub fn outcomes(&self) -> &Outcomes {
        &self.outcomes
    }

    /// Server-wide counts, for Inspect without keys and for metrics (this
    /// node's copy of the table on a cluster); no busiest keys.
    pub fn stats(&self) -> dlock_proto::proto::ServerStats {
        let (held, waiting, sessions) = self
            .engine
            .read(|t, _| (t.held_keys(), t.waiting(), t.sessions()));
        let (grants, handoffs) = metrics::grants();
        dlock_proto::proto::ServerStats {
            connections: self.connections.load(Ordering::Relaxed) as u64,
            held_keys: held as u64,
            waiting_requests: waiting as u64,
            sessions: sessions as u64,
            grants,
            handoffs,
            busiest: Vec::new(),
        }
    }

    /// Registers a new connection from `peer` (its TLS client certificate,
    /// if any, has `peer_names`); it ends when the value returned is
    /// dropped.
    pub fn connect(self: &Arc<Self>, peer: SocketAddr, peer_names: Vec<String>) -> Connected {
        self.connections.fetch_add(1, Ordering::Relaxed);
        Connected {
            service: self.clone(),
            conn: Arc::new(Conn::new(peer, peer_names)),
            clean: false,
        }
    }

    /// The one expiry task, for both engines: submits
    /// [`Command::Advance`](crate::table::Command::Advance) whenever
    /// [`Engine::due`] says something is due, until `stop`. Expiry is a
    /// command like any other, so on a cluster every node expires the same
    /// leases at the same point of the log; only the leader finds anything
    /// due. There is no periodic sweep.
    pub async fn run_expiry(self: Arc<Self>, stop: CancellationToken) {
        // After a failed Advance (no quorum, a leadership change not yet
        // seen), so a failing cluster is not flooded with proposals.
        const RETRY: std::time::Duration = std::time::Duration::from_millis(100);
        loop {
            let advanced = tokio::select! {
                _ = stop.cancelled() => return,
                r = async {
                    self.engine.due().await;
                    self.engine.submit(crate::table::Command::Advance).await
                } => r,
            };
            match advanced {
                Ok(out) if out.expired_leases > 0 => {
                    metrics::leases_expired(out.expired_leases);
                    // The expiry task's line, never a request's: one per
                    // batch due at once.
                    tracing::info!(keys = out.expired_leases, "leases expired");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot advance the table's time");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// Gives up a waiting request's answer at the connection's end: a grant
    /// that arrived unanswered, or arrives later, is released on the local
    /// engine (see [`Engine::release_undelivered`]).
    pub fn abandon(&self, pending: Pending) {
        if let Pending::Table(mut rx) = pending {
            rx.close();
            if let Ok(w) = rx.try_recv() {
                self.engine.release_undelivered(vec![w]);
            }
        }
    }

    /// Executes `req` for `conn`: the answer is appended to `out` as a
    /// frame, unless it comes later.
    pub fn execute(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        req: Request,
        out: &mut BytesMut,
    ) -> Option<Waiting> {
        let (id, kind) = (req.id, req.r#type);
        let since = Instant::now();
        let answered = match self.admit(conn, &req) {
            Err(refusal) => Err(refusal),
            Ok((typed, who)) => match &self.engine {
                Engine::Local(_) => drive(self.answer(conn, req, typed, who.as_deref()))
                    .unwrap_or_else(|| Err(reply::unfinished())),
                Engine::Raft(_) => {
                    let answer = self.spawn(conn, req, typed, who);
                    return Some(Waiting {
                        request_id: id,
                        answer,
                        kind,
                        since,
                    });
                }
            },
        };
        let r = match answered {
            Ok(Answer::Now(r)) => r,
            Ok(Answer::Outcome { owner, req }) => {
                let answer = match self.outcomes.register(owner, req) {
                    Some(rx) => {
                        // Registered after the engine's lock was released: a
                        // command applied in between (Close) may have
                        // withdrawn the request, and its outcome would then
                        // never come. Its outcome, had it come, is in `rx`.
                        if rx.is_empty() && !self.still_waits(owner, req) {
                            self.outcomes.discard(owner, req);
                        }
                        Pending::Table(rx)
                    }
                    None => {
                        let r = reply::refused(id, reply::unknown_session(owner));
                        return self.answered(r, kind, since, out);
                    }
                };
                return Some(Waiting {
                    request_id: id,
                    answer,
                    kind,
                    since,
                });
            }
            Ok(Answer::Task(task)) => {
                let (mut tx, rx) = oneshot::channel();
                // A Watch whose connection ends is withdrawn: its receiver
                // is dropped, and the task ends with it.
                tokio::spawn(async move {
                    tokio::select! {
                        r = task => { let _ = tx.send(r); }
                        _ = tx.closed() => {}
                    }
                });
                return Some(Waiting {
                    request_id: id,
                    answer: Pending::Answer(rx),
                    kind,
                    since,
                });
            }
            Err(refusal) => reply::refused(id, refusal),
        };
        self.answered(r, kind, since, out)
    }

    /// Resolves with NotLeader once this node no longer leads, checked
    /// every second: a node that stopped leading learns no more outcomes
    /// or changes (a snapshot from the new leader skips the sink), so what
    /// waits on it must answer rather than wait forever.
    async fn deposed(&self) -> Refusal {
        const LEADERSHIP_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
        loop {
            tokio::time::sleep(LEADERSHIP_CHECK).await;
            if !self.engine.is_leader() {
                return self.engine.not_leader().into();
            }
        }
    }

    /// Whether `req` of `owner` still waits in the table.
    fn still_waits(&self, owner: OwnerId, req: ReqId) -> bool {
        self.engine
            .read(|t, _| t.ticket(owner, req) == crate::table::TicketState::Waiting)
    }

    fn answered(
        &self,
        r: Response,
        kind: i32,
        since: Instant,
        out: &mut BytesMut,
    ) -> Option<Waiting> {
        encode_frame(&r, out);
        metrics::request(kind, r.status(), since.elapsed());
        None
    }

    /// On the raft engine: answers the request in a task, outcome included.
    fn spawn(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        req: Request,
        kind: RequestType,
        who: Option<Arc<Identity>>,
    ) -> Pending {
        let (mut tx, rx) = oneshot::channel();
        let (svc, conn) = (self.clone(), conn.clone());
        tokio::spawn(async move {
            let id = req.id;
            let since = Instant::now();
            let answered = async {
                match svc.answer(&conn, req, kind, who.as_deref()).await {
                    Ok(Answer::Now(r)) => r,
                    Ok(Answer::Outcome { owner, req }) => {
                        match svc.await_outcome(owner, req).await {
                            Ok(w) => reply::woken(id, w, since),
                            Err(refusal) => reply::refused(id, refusal),
                        }
                    }
                    Ok(Answer::Task(task)) => task.await,
                    Err(refusal) => reply::refused(id, refusal),
                }
            };
            // Only a Watch is given up when its connection ends: anything
            // else may change the table, and its end is seen through.
            let r = if kind == RequestType::Watch {
                tokio::select! {
                    r = answered => r,
                    _ = tx.closed() => return,
                }
            } else {
                answered.await
            };
            let _ = tx.send(r);
        });
        Pending::Answer(rx)
    }

    /// The checks every request passes before its family sees it: version,
    /// identity, type, the identity's rules. Returns the type and identity.
    fn admit(
        &self,
        conn: &Conn,
        req: &Request,
    ) -> Result<(RequestType, Option<Arc<Identity>>), Refusal> {
        if req.version != 0 && req.version != dlock_proto::PROTOCOL_VERSION {
            return Err(reply::unsupported_version(req.version));
        }
        let who = self
            .access
            .identify(&req.access_token, &conn.peer_names)
            .map_err(|text| Refusal::new(ResponseStatus::AccessDenied, text))?;
        let Ok(kind) = RequestType::try_from(req.r#type) else {
            return Err(reply::unknown_type(req.r#type));
        };
        if let Some(who) = &who {
            let none = RequestLock::default();
            let body = req.lock.as_ref().unwrap_or(&none);
            who.permits(kind, body)
                .map_err(|text| Refusal::new(ResponseStatus::AccessDenied, text))?;
            let mut st = conn.state();
            if st.identity != who.name {
                st.identity.clone_from(&who.name);
            }
        }
        Ok((kind, who))
    }

    /// The request, to its family.
    async fn answer(
        self: &Arc<Self>,
        conn: &Conn,
        req: Request,
        kind: RequestType,
        who: Option<&Identity>,
    ) -> Result<Answer, Refusal> {
        let id = req.id;
        match kind {
            RequestType::Ping => self.ping(conn, &req).await,
            RequestType::Hello => {
                self.named_if_any(conn, req.session)?;
                Ok(Answer::Now(self.hello(id)))
            }
            RequestType::OpenSession => self.open_session(conn, &req).await,
            RequestType::CloseSession => self.close_session(conn, &req).await,
            RequestType::Lock => self.lock(conn, req).await,
            RequestType::Enqueue => self.enqueue(conn, req).await,
            RequestType::Wait => self.wait(conn, req).await,
            RequestType::Unlock | RequestType::Renew => self.release(conn, req, kind, who).await,
            RequestType::Proclaim => self.proclaim(conn, req, who).await,
            RequestType::Inspect => self.inspect(conn, req).await,
            RequestType::Watch => self.watch(conn, req),
            RequestType::ClusterStatus | RequestType::ClusterAdd | RequestType::ClusterRemove => {
                self.admin(req, kind).await
            }
            RequestType::Invalid => Err(reply::type_not_set()),
        }
    }
}

/// Runs a future of the local engine to its end at once: nothing the local
/// engine awaits ever waits, so one poll finishes it; no waker is needed,
/// and none is registered. `None` should a future to come break that rule
/// (the caller then refuses the request rather than leave it unanswered).
fn drive<F: Future>(f: F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => {
            tracing::error!("work on the in-memory engine did not finish at once");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::pending::{Arrived, Dropped};
    use crate::table::WaitOutcome;
    use clap::Parser;
    use prost::Message;
    use std::net::Ipv4Addr;

    fn service() -> Arc<Service> {
        let config = Config::try_parse_from(["dlock-server"]).expect("flags parse");
        Service::local(config, Access::default(), 1)
    }

    fn connect(svc: &Arc<Service>) -> Connected {
        svc.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)), Vec::new())
    }

    fn request(kind: RequestType, key: &str, lease_micro: u64) -> Request {
        Request {
            version: dlock_proto::PROTOCOL_VERSION,
            id: 1,
            r#type: kind as i32,
            lock: Some(RequestLock {
                keys: vec![key.to_owned()],
                release_micro: lease_micro,
                ..RequestLock::default()
            }),
            ..Request::default()
        }
    }

    /// Runs `req`: its response, or the request answered later.
    fn run(svc: &Arc<Service>, conn: &Connected, req: Request) -> Result<Response, Waiting> {
        let mut out = BytesMut::new();
        match svc.execute(conn.conn(), req, &mut out) {
            Some(waiting) => Err(waiting),
            None => {
                Ok(Response::decode(&out[dlock_proto::codec::LEN_PREFIX..]).expect("a Response"))
            }
        }
    }

    fn status(r: &Result<Response, Waiting>) -> Option<ResponseStatus> {
        r.as_ref().ok().map(|r| r.status())
    }

    fn held_and_waiting(svc: &Service) -> (u64, u64) {
        let s = svc.stats();
        (s.held_keys, s.waiting_requests)
    }

    /// `a` holds `k` (as a lease of `lease_micro`, 0: none) and `b` waits
    /// for it.
    fn holder_and_waiter(svc: &Arc<Service>, lease_micro: u64) -> (Connected, Connected, Waiting) {
        let (a, b) = (connect(svc), connect(svc));
        let lock = request(RequestType::Lock, "k", lease_micro);
        assert_eq!(
            status(&run(svc, &a, lock.clone())),
            Some(ResponseStatus::Ok)
        );
        let Err(waiting) = run(svc, &b, lock) else {
            panic!("b should wait for k");
        };
        (a, b, waiting)
    }

    #[tokio::test]
    async fn a_closed_local_engine_hands_released_keys_to_nobody() {
        let svc = service();
        let (a, b, mut waiting) = holder_and_waiter(&svc, 0);
        svc.engine().close();
        // The holder's connection closes as part of the shutdown.
        drop(a);
        assert!(matches!(waiting.answer.try_take(), Err(Dropped)));
        let other = run(&svc, &b, request(RequestType::Lock, "other", 0));
        assert_eq!(status(&other), Some(ResponseStatus::ShuttingDown));
        assert_eq!(held_and_waiting(&svc), (0, 0));
    }

    #[tokio::test]
    async fn a_grant_nobody_receives_is_released() {
        let svc = service();
        let (a, _b, waiting) = holder_and_waiter(&svc, 5_000_000);
        // b stops listening (its connection is ending) before the grant.
        svc.abandon(waiting.answer);
        let unlock = run(&svc, &a, request(RequestType::Unlock, "k", 0));
        assert_eq!(status(&unlock), Some(ResponseStatus::Ok));
        assert_eq!(held_and_waiting(&svc), (0, 0), "the lease granted to b");
    }

    #[tokio::test]
    async fn an_outcome_decided_before_close_is_kept() {
        let svc = service();
        let (a, _b, mut waiting) = holder_and_waiter(&svc, 0);
        drop(a);
        svc.engine().close();
        assert!(matches!(
            waiting.answer.try_take(),
            Ok(Some(Arrived::Woken(w))) if matches!(w.wake, WaitOutcome::Granted { .. })
        ));
    }

    #[tokio::test]
    async fn a_connection_dropped_however_its_task_ends_ends_its_sessions() {
        // The connection task owns its `Connected`; a panic unwinding it
        // drops the value like any other end, and the keys are released.
        let svc = service();
        let a = connect(&svc);
        assert_eq!(
            status(&run(&svc, &a, request(RequestType::Lock, "k", 0))),
            Some(ResponseStatus::Ok)
        );
        assert_eq!(held_and_waiting(&svc), (1, 0));
        drop(a);
        assert_eq!(held_and_waiting(&svc), (0, 0));
        assert_eq!(svc.stats().connections, 0);
    }

    #[tokio::test]
    async fn a_ping_naming_a_session_of_another_connection_is_refused() {
        let svc = service();
        let a = connect(&svc);
        let mut ping = request(RequestType::Ping, "k", 0);
        ping.lock = None;
        ping.session = 7;
        let r = run(&svc, &a, ping);
        assert_eq!(status(&r), Some(ResponseStatus::UnknownSession));
    }
}
