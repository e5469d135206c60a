//! How a cluster node answers clients: every request that reads or changes
//! the lock table goes through the replicated log ([`Cluster`]), and owners
//! are sessions that outlive a connection for their TTL.
//!
//! The single server answers from its table at once; a cluster node must
//! wait for a command to be committed, so each request that needs the
//! table is answered by a task, and the connection's pipeline waits for
//! that answer as it waits for a Lock (answers stay in request order).
//!
//! Sessions. A client that opens one (OpenSession) names it in later
//! requests; an older client that never does gets one opened for it on its
//! first request that needs one, the connection's *implicit* session. A
//! clean end of the connection (the client closes it) ends its sessions at
//! once, as a disconnect does on a single server; any other end (a broken
//! path, this node stopping) leaves the named ones to their TTL, so the
//! client can resume them through the new leader (OpenSession naming the
//! session) and find its locks and its place in every queue. The implicit
//! session ends with its connection however it ends: nobody can resume it.
//!
//! Waiting Locks. The table decides a waiting request's outcome in a later
//! command (a release, a lease or wait limit running out). Every node sees
//! every outcome through the apply sink; only the node where the session is
//! attached (the leader its client talks to) delivers it. An outcome can
//! be applied before the task that proposed the Lock has registered for
//! it, so [`Attached`] keeps it until then. An outcome for a session whose
//! connection has gone is dropped here: the table keeps the grant for the
//! session, and remembers the outcome as the answer to the Lock's number.
//!
//! Two-phase acquire. An Enqueue is proposed as the Lock it is; one that
//! waits is answered Queued with the table's request id as its ticket, and
//! its outcome waits in an [`Attached`] slot until the Wait. A Wait on a
//! node the session moved to (a failover) finds the request in the table's
//! queues, or its outcome in the session's memory of numbered requests
//! (`table::tickets`).
//!
//! Requests sent again. A Lock, Unlock or Renew of a named session that
//! carries a `seq` is proposed as [`Command::Sequenced`]: the table answers
//! a number it applied already from the session's memory, without acting
//! again. So a client that lost its connection resumes the session (here or
//! on the new leader) and sends every unanswered request again with the
//! same number: one that was applied gets its first answer (a waiting Lock
//! registers again for its outcome, or gets the outcome it came to), one
//! that was not is applied now.

use crate::acl::Identity;
use crate::cluster::{ApplySink, Cluster, ClusterConfig, ClusterError, ClusterStatus, Member};
use crate::config::{Config, InitialClusterState};
use crate::db::Db;
use crate::handler::{self, Refusal};
use crate::pending::Pending;
use crate::shared::Shared;
use crate::table::{
    Command, FirstHolder, Key, LockResult, Output, OwnerId, Reply, ReqId, TicketState, WaitOutcome,
    Woken, MAX_REMEMBERED,
};
use crate::watch::{ChangeHub, WatchPermits};
use anyhow::{bail, Context};
use dlock::proto::{
    ClusterInfo, ClusterMember, Request, RequestType, Response, ResponseStatus, ServerStats,
};
use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// A cluster node's client-facing side: the cluster, the sessions attached
/// here, and the options that shape sessions.
pub struct Replicated {
    cluster: Cluster,
    attached: Arc<Attached>,
    config: Config,
    /// The bound on Watches parked on this node (`--max-watchers`).
    watches: WatchPermits,
}

impl std::fmt::Debug for Replicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicated")
            .field("node", &self.cluster.node_id())
            .finish_non_exhaustive()
    }
}

/// The sessions whose clients talk to this node, and the outcomes of their
/// waiting Locks on the way to them.
#[derive(Debug, Default)]
pub struct Attached {
    sessions: Mutex<HashMap<OwnerId, Waits>>,
    /// Rung after every applied entry, for Watches parked here.
    hub: ChangeHub,
}

/// One attached session: the connection it is attached through (a resume
/// on another connection moves it), and its waiting Locks by request.
#[derive(Debug, Default)]
struct Waits {
    conn: u64,
    slots: HashMap<ReqId, Slot>,
}

#[derive(Debug)]
enum Slot {
    /// The proposing task waits for the outcome here.
    Registered(oneshot::Sender<Woken>),
    /// The outcome was applied before the task registered.
    Early(Woken),
}

impl Attached {
    fn lock(&self) -> MutexGuard<'_, HashMap<OwnerId, Waits>> {
        // The map is consistent after every statement; a panic elsewhere
        // must not stop delivery.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The apply sink: called on every node for every applied command, in
    /// log order. Delivers outcomes to sessions attached here.
    pub fn applied(&self, cmd: &Command, out: &Output) {
        tracing::trace!(?cmd, reply = ?out.reply, woken = out.woken.len(), "applied");
        // The entry is committed and applied: what a Watch reads now is
        // committed state.
        self.hub.changed();
        if out.woken.is_empty()
            && out.ended_sessions.is_empty()
            && !matches!(cmd, Command::Disconnect { .. })
        {
            return;
        }
        let mut sessions = self.lock();
        if sessions.is_empty() {
            return;
        }
        for w in &out.woken {
            if let Some(waits) = sessions.get_mut(&w.owner) {
                match waits.slots.remove(&w.req) {
                    Some(Slot::Registered(tx)) => {
                        // The task may be gone with its connection; the
                        // grant stays the session's either way.
                        let _ = tx.send(w.clone());
                    }
                    Some(Slot::Early(_)) | None => {
                        waits.slots.insert(w.req, Slot::Early(w.clone()));
                    }
                }
            }
        }
        // A replicated table withdraws waits only when their session ends
        // (Disconnect, or expiry in Advance; Close is never proposed), and
        // an ended session goes whole, its waits' slots with it.
        for s in &out.ended_sessions {
            sessions.remove(s);
        }
        if let Command::Disconnect { owner } = cmd {
            sessions.remove(owner);
        }
    }

    /// Delivers `session`'s outcomes through connection `conn` from now on;
    /// a session resumed on another connection leaves the old one, whose
    /// waiting tasks end.
    fn attach(&self, session: OwnerId, conn: u64) {
        let mut sessions = self.lock();
        let w = sessions.entry(session).or_default();
        if w.conn != conn {
            *w = Waits {
                conn,
                slots: HashMap::new(),
            };
        }
    }

    /// Whether `session` is attached through connection `conn`.
    fn attached_through(&self, session: OwnerId, conn: u64) -> bool {
        self.lock().get(&session).is_some_and(|w| w.conn == conn)
    }

    /// Stops delivering to `session` here, if it is attached through
    /// `conn`; its waiting tasks end.
    fn detach(&self, session: OwnerId, conn: u64) {
        let mut sessions = self.lock();
        if sessions.get(&session).is_some_and(|w| w.conn == conn) {
            sessions.remove(&session);
        }
    }

    /// Drops what is kept for `req` of `session`: its outcome was answered
    /// another way.
    fn discard(&self, session: OwnerId, req: ReqId) {
        if let Some(waits) = self.lock().get_mut(&session) {
            waits.slots.remove(&req);
        }
    }

    /// The outcome of `req` of `session` if it was applied here and nobody
    /// registered for it yet (a queued Enqueue before its Wait).
    fn take_early(&self, session: OwnerId, req: ReqId) -> Option<Woken> {
        let mut sessions = self.lock();
        let waits = sessions.get_mut(&session)?;
        match waits.slots.remove(&req)? {
            Slot::Early(w) => Some(w),
            registered => {
                waits.slots.insert(req, registered);
                None
            }
        }
    }

    /// Where the outcome of `req`, a waiting Lock of `session`, arrives;
    /// `None` when the session is no longer attached here (it ended).
    fn register(&self, session: OwnerId, req: ReqId) -> Option<oneshot::Receiver<Woken>> {
        let mut sessions = self.lock();
        let waits = sessions.get_mut(&session)?;
        let (tx, rx) = oneshot::channel();
        match waits.slots.remove(&req) {
            Some(Slot::Early(w)) => {
                let _ = tx.send(w);
            }
            Some(Slot::Registered(_)) | None => {
                waits.slots.insert(req, Slot::Registered(tx));
            }
        }
        Some(rx)
    }
}

/// The sessions one client connection opened on this node.
#[derive(Debug)]
pub struct ConnSessions {
    /// This connection, for [`Attached`]: unique per node.
    id: u64,
    inner: Mutex<ConnState>,
    /// Wakes the keeper when a session with a shorter TTL appears.
    ttl_changed: tokio::sync::Notify,
    /// Cancelled when this node stops leading while keeping the
    /// connection's sessions: the connection is then reset (see
    /// [`Replicated::keep_connection_alive`]).
    pub deposed: CancellationToken,
}

#[derive(Debug, Default)]
struct ConnState {
    /// Opened for a client that names no session.
    implicit: Option<OwnerId>,
    /// Opened or resumed with OpenSession.
    named: Vec<OwnerId>,
    /// The connection has ended (see [`ConnSessions::close`]).
    closed: bool,
    /// The shortest TTL of its sessions, for the keeper's pace.
    shortest_ttl: Option<Duration>,
    /// The access-control identity of the latest request (empty without
    /// access control): the owner of the sessions it opens.
    identity: String,
    /// The first session of this connection found ended (a keep-alive or
    /// a request answered UnknownSession).
    ended: Option<OwnerId>,
    /// Tickets of queued Enqueues answered on this connection and not yet
    /// waited for: at most `--max-pipeline`.
    tickets: BTreeSet<(OwnerId, ReqId)>,
    /// The latest tickets waited for on this connection, so a second Wait
    /// is refused: at most [`ANSWERED_TICKETS`].
    waited: VecDeque<(OwnerId, ReqId)>,
}

/// Tickets a connection remembers as waited for. A second Wait for an
/// older one is answered from the session's memory, as a Wait sent again
/// after a failover is: the same outcome, never a second grant.
const ANSWERED_TICKETS: usize = 64;

impl Default for ConnSessions {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ConnSessions {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            inner: Mutex::default(),
            ttl_changed: tokio::sync::Notify::new(),
            deposed: CancellationToken::new(),
        }
    }
}

impl ConnSessions {
    fn state(&self) -> MutexGuard<'_, ConnState> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn all(&self) -> Vec<OwnerId> {
        let st = self.state();
        let mut all: Vec<OwnerId> = st.implicit.iter().chain(&st.named).copied().collect();
        // A resume may name the implicit session too.
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Marks the connection ended; sessions opened for it afterwards (by a
    /// request still in flight) must be ended at once.
    fn close(&self) {
        self.state().closed = true;
    }

    fn is_closed(&self) -> bool {
        self.state().closed
    }

    fn note_ttl(&self, ttl: Duration) {
        let mut st = self.state();
        if st.shortest_ttl.is_none_or(|t| ttl < t) {
            st.shortest_ttl = Some(ttl);
            drop(st);
            self.ttl_changed.notify_one();
        }
    }
}

/// A response refusing the request: the status, its text, and for
/// NotLeader the leader's address.
type Refused = Box<Response>;

fn refused(id: u64, r: Refusal) -> Refused {
    Box::new(handler::refused(id, r))
}

fn cluster_error(id: u64, e: ClusterError) -> Refused {
    let mut r = match &e {
        ClusterError::NotLeader { leader } => {
            let mut r = handler::error(id, ResponseStatus::NotLeader, e.to_string());
            if let Some((_, m)) = leader {
                r.leader_addr = m.client_addr.clone();
            }
            r
        }
        ClusterError::Unavailable(_) | ClusterError::Refused(_) => {
            handler::error(id, ResponseStatus::Unavailable, e.to_string())
        }
        ClusterError::Fatal(_) => handler::error(id, ResponseStatus::ShuttingDown, e.to_string()),
    };
    r.request_id = id;
    Box::new(r)
}

impl Replicated {
    /// The client side of `cluster`, whose apply sink is `attached`'s.
    pub fn new(cluster: Cluster, attached: Arc<Attached>, config: Config) -> Replicated {
        Replicated {
            cluster,
            attached,
            watches: WatchPermits::new(config.max_watchers),
            config,
        }
    }

    /// The cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Answers `req` (already checked for version, token and type) in a
    /// task; `db` counts this node's connections, for Inspect's stats.
    /// `who` is the sender's access-control identity (`None` without
    /// access control): sessions it opens are its own to resume, and its
    /// Unlock, Renew and Proclaim by fence act only on its own locks
    /// unless it is an admin.
    pub fn execute(
        self: &Arc<Self>,
        conn: &Arc<ConnSessions>,
        req: Request,
        kind: RequestType,
        db: Db,
        who: Option<&Arc<Identity>>,
    ) -> Pending {
        let identity = who.map_or("", |w| w.name.as_str());
        let who = who.cloned();
        {
            let mut st = conn.state();
            if st.identity != identity {
                st.identity = identity.to_owned();
            }
        }
        let (tx, rx) = oneshot::channel();
        let node = self.clone();
        let conn = conn.clone();
        // One task per connection at a time: the pipeline runs nothing else
        // until this one is answered.
        let mut tx = tx;
        tokio::spawn(async move {
            let id = req.id;
            let answered = node.answer(&conn, req, kind, &db, who.as_deref());
            let r = if kind == RequestType::Watch {
                // A Watch changes nothing: withdrawn when its connection
                // ends (the receiver is dropped).
                tokio::select! {
                    r = answered => r,
                    _ = tx.closed() => return,
                }
            } else {
                answered.await
            };
            let r = match r {
                Ok(r) => r,
                Err(r) => *r,
            };
            debug_assert_eq!(r.request_id, id);
            let _ = tx.send(r);
        });
        Pending::Answer(rx)
    }

    /// The end of a client connection: a clean one (`clean`: the client
    /// closed it) ends its sessions now; any other leaves the sessions the
    /// client opened by name to their TTL, so it can resume them. The
    /// implicit session ends now either way: its client never learnt its id,
    /// so no resume can come for it, and keeping its locks for a TTL would
    /// only keep them from others (a single server frees them at once).
    pub fn connection_ended(self: &Arc<Self>, conn: &ConnSessions, clean: bool) {
        conn.close();
        let implicit = conn.state().implicit;
        // A session resumed on another connection is that one's now: a
        // clean close here must not end it.
        let sessions: Vec<OwnerId> = conn
            .all()
            .into_iter()
            .filter(|&s| self.attached.attached_through(s, conn.id))
            .collect();
        for &s in &sessions {
            self.attached.detach(s, conn.id);
        }
        let sessions: Vec<OwnerId> = sessions
            .into_iter()
            .filter(|&s| clean || Some(s) == implicit)
            .collect();
        if sessions.is_empty() {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            for owner in sessions {
                if let Err(e) = node.cluster.propose(Command::Disconnect { owner }).await {
                    // Its TTL ends it instead.
                    tracing::debug!(session = owner, error = %e, "session not ended at once");
                }
            }
        });
    }

    async fn propose(&self, id: u64, cmd: Command) -> Result<Output, Refused> {
        self.cluster
            .propose(cmd)
            .await
            .map_err(|e| cluster_error(id, e))
    }

    async fn answer(
        &self,
        conn: &ConnSessions,
        req: Request,
        kind: RequestType,
        db: &Db,
        who: Option<&Identity>,
    ) -> Result<Response, Refused> {
        let id = req.id;
        let config = &self.config;
        let body = req.lock.clone().unwrap_or_default();
        match kind {
            RequestType::Ping => {
                // A client counts a Ping's answer as proof that its session
                // lives (client-side safety): answer Ok only once every
                // session of the connection was kept alive by a commit. A
                // session that ended meanwhile is said so: its locks may
                // have gone to others.
                let ended = self
                    .keep_alive(conn)
                    .await
                    .map_err(|e| cluster_error(id, e))?;
                if let Some(gone) = ended {
                    return Err(refused(
                        id,
                        Refusal::new(
                            ResponseStatus::UnknownSession,
                            format!("session {gone} of this connection has ended"),
                        ),
                    ));
                }
                Ok(handler::response(id, ResponseStatus::Ok))
            }
            RequestType::Hello => {
                let mut r = handler::response(id, ResponseStatus::Ok);
                let mut limits = config.limits();
                // A lock bound to a session lives a TTL after the last
                // request that named it, however the connection ends.
                limits.session_timeout_micro = micros(config.session_ttl);
                limits.resumable_sessions = true;
                // So a client can tell a silent node from a busy one.
                limits.election_timeout_micro = micros(config.election_timeout);
                r.limits = Some(limits);
                Ok(r)
            }
            RequestType::OpenSession => self.open_session(conn, id, &req).await,
            RequestType::CloseSession => {
                if req.session == 0 {
                    return Err(refused(
                        id,
                        Refusal::new(
                            ResponseStatus::InvalidArgument,
                            "CloseSession needs a session; the connection's own ends with the connection",
                        ),
                    ));
                }
                let owner = self.named(conn, id, req.session)?;
                self.propose(id, Command::Disconnect { owner }).await?;
                let mut st = conn.state();
                st.named.retain(|&s| s != owner);
                // Its queued requests went with it: they no longer count.
                st.tickets.retain(|&(s, _)| s != owner);
                drop(st);
                self.attached.detach(owner, conn.id);
                Ok(handler::response(id, ResponseStatus::Ok))
            }
            RequestType::Lock => {
                let args = handler::lock_args(config, body).map_err(|r| refused(id, r))?;
                let owner = self.owner(conn, id, req.session).await?;
                let cmd = numbered(&req, args.into_command(owner));
                let out = self.propose(id, cmd).await?;
                self.lock_reply(conn, id, owner, req.seq, out.reply).await
            }
            RequestType::Enqueue => {
                let args = handler::lock_args(config, body).map_err(|r| refused(id, r))?;
                let owner = self.owner(conn, id, req.session).await?;
                if conn.state().tickets.len() >= config.max_pipeline {
                    return Err(refused(id, handler::too_many_tickets(config.max_pipeline)));
                }
                let cmd = numbered(&req, args.into_command(owner));
                let out = self.propose(id, cmd).await?;
                self.enqueue_reply(conn, id, owner, req.seq, out.reply)
            }
            RequestType::Wait => self.wait(conn, id, req.session, body.ticket).await,
            RequestType::Unlock | RequestType::Renew => {
                let fence = (body.fence != 0).then_some(body.fence);
                let lease = if kind == RequestType::Renew {
                    Some(
                        handler::renew_lease(config, body.release_micro)
                            .map_err(|r| refused(id, r))?,
                    )
                } else {
                    None
                };
                let keys = handler::checked_keys(config, body.keys).map_err(|r| refused(id, r))?;
                let owner = self.owner(conn, id, req.session).await?;
                if let Some(fence) = fence {
                    self.check_fence(id, who, owner, &keys, fence).await?;
                }
                let cmd = match lease {
                    Some(lease) => Command::Renew {
                        owner,
                        keys,
                        fence,
                        lease,
                    },
                    None => Command::Unlock { owner, keys, fence },
                };
                let out = self.propose(id, numbered(&req, cmd)).await?;
                match out.reply {
                    Reply::NotHeld(not_held) => Ok(handler::held_result(id, not_held)),
                    Reply::Lock(_) | Reply::Waited { .. } => {
                        Err(refused(id, not_the_same(req.seq)))
                    }
                    Reply::Forgotten => Err(refused(id, forgotten(req.seq))),
                    other => Err(self.unexpected(conn, id, owner, other)),
                }
            }
            RequestType::Proclaim => {
                let fence = (body.fence != 0).then_some(body.fence);
                crate::watch::check_value(&body.value).map_err(|r| refused(id, r))?;
                let keys = handler::checked_keys(config, body.keys).map_err(|r| refused(id, r))?;
                // By fence, any node's client may proclaim: no session.
                let owner = match fence {
                    Some(fence) => {
                        self.check_fence(id, who, 0, &keys, fence).await?;
                        0
                    }
                    None => self.owner(conn, id, req.session).await?,
                };
                let cmd = Command::Proclaim {
                    owner,
                    keys,
                    fence,
                    value: body.value,
                };
                match self.propose(id, cmd).await?.reply {
                    Reply::NotHeld(not_held) => Ok(handler::held_result(id, not_held)),
                    other => Err(self.unexpected(conn, id, owner, other)),
                }
            }
            RequestType::Watch => {
                let owner = match req.session {
                    0 => conn.state().implicit,
                    s => Some(self.named(conn, id, s)?),
                };
                self.watch(id, owner, body).await
            }
            RequestType::Inspect => {
                let owner = match req.session {
                    0 => conn.state().implicit,
                    s => Some(self.named(conn, id, s)?),
                };
                if !body.keys.is_empty() {
                    handler::validate_keys(config, &body.keys).map_err(|r| refused(id, r))?;
                }
                self.cluster
                    .read_index()
                    .await
                    .map_err(|e| cluster_error(id, e))?;
                let mut r = handler::response(id, ResponseStatus::Ok);
                self.cluster.read(|table, now| {
                    if body.keys.is_empty() {
                        r.server_stats = Some(ServerStats {
                            connections: db.stats().connections,
                            held_keys: table.held_keys() as u64,
                            waiting_requests: table.waiting() as u64,
                        });
                    } else {
                        r.key_info = body
                            .keys
                            .iter()
                            .map(|k| {
                                // Which connection a session came from is
                                // this node's knowledge only.
                                let view = table.inspect(k, now);
                                handler::key_info(k, view, owner, |_| String::new())
                            })
                            .collect();
                    }
                });
                Ok(r)
            }
            RequestType::ClusterStatus => {
                let mut r = handler::response(id, ResponseStatus::Ok);
                r.cluster = Some(Box::new(cluster_info(&self.cluster.status())));
                Ok(r)
            }
            RequestType::ClusterAdd | RequestType::ClusterRemove => {
                let args = req.cluster.unwrap_or_default();
                if args.node_id == 0 {
                    return Err(refused(
                        id,
                        Refusal::new(
                            ResponseStatus::InvalidArgument,
                            "cluster.node_id must be set",
                        ),
                    ));
                }
                let done = if kind == RequestType::ClusterAdd {
                    if args.client_addr.is_empty() || args.peer_addr.is_empty() {
                        return Err(refused(
                            id,
                            Refusal::new(
                                ResponseStatus::InvalidArgument,
                                "ClusterAdd needs cluster.client_addr and cluster.peer_addr",
                            ),
                        ));
                    }
                    let member = Member {
                        client_addr: args.client_addr,
                        peer_addr: args.peer_addr,
                    };
                    self.cluster.add_node(args.node_id, member).await
                } else {
                    let members = self.cluster.status().members;
                    if !members.iter().any(|m| m.id == args.node_id) {
                        return Err(refused(
                            id,
                            Refusal::new(
                                ResponseStatus::InvalidArgument,
                                format!("node {} is not a member of the cluster", args.node_id),
                            ),
                        ));
                    }
                    self.cluster.remove_node(args.node_id).await
                };
                done.map_err(|e| cluster_error(id, e))?;
                let mut r = handler::response(id, ResponseStatus::Ok);
                r.cluster = Some(Box::new(cluster_info(&self.cluster.status())));
                Ok(r)
            }
            RequestType::Invalid => Err(refused(
                id,
                Refusal::new(ResponseStatus::InvalidType, "request type not set"),
            )),
        }
    }

    /// Pings keep this connection's sessions alive, on the leader; a
    /// follower just answers (the client will find the leader on its next
    /// request).
    /// Returns a session of the connection that turned out to have ended
    /// (its TTL ran out while this node could not keep it, e.g. cut off
    /// from the majority), now or earlier; it is forgotten here.
    async fn keep_alive(&self, conn: &ConnSessions) -> Result<Option<OwnerId>, ClusterError> {
        for owner in conn.all() {
            let out = self.cluster.propose(Command::KeepAlive { owner }).await?;
            if out.reply == Reply::UnknownSession {
                self.forget(conn, owner);
            }
        }
        Ok(conn.state().ended)
    }

    /// Keeps the sessions of a live connection alive while it lives, even
    /// while its requests (Pings included) are parked behind a waiting
    /// Lock: a session must not run out while its client waits on an open
    /// connection. Ends with the connection (`ended`).
    ///
    /// When this node stops leading while the connection has sessions, it
    /// can keep them no longer: it cancels `conn.deposed`, and the
    /// connection is reset, so the client looks for the new leader at once
    /// rather than after a silence (a leader paused and deposed may wake to
    /// a client still waiting on it). A reset, unlike the client's own
    /// clean close, leaves the sessions to be resumed.
    pub async fn keep_connection_alive(
        self: Arc<Self>,
        conn: Arc<ConnSessions>,
        ended: CancellationToken,
    ) {
        loop {
            let ttl = conn.state().shortest_ttl.unwrap_or(self.config.session_ttl);
            let has_sessions = !conn.all().is_empty();
            tokio::select! {
                _ = ended.cancelled() => return,
                // A new session (its TTL is noted) or a shorter TTL: look
                // again, and sleep again for a third of it.
                _ = conn.ttl_changed.notified() => continue,
                _ = self.cluster.stops_leading(), if has_sessions => {
                    tracing::debug!(sessions = ?conn.all(), "not leading: resetting the connection");
                    conn.deposed.cancel();
                    return;
                }
                _ = tokio::time::sleep(ttl / 3) => {}
            }
            if conn.all().is_empty() || !self.cluster.is_leader() {
                continue;
            }
            if let Err(e) = self.keep_alive(&conn).await.map(drop) {
                tracing::debug!(error = %e, "sessions not kept alive");
            }
        }
    }

    async fn open_session(
        &self,
        conn: &ConnSessions,
        id: u64,
        req: &Request,
    ) -> Result<Response, Refused> {
        let resuming_own = req.session != 0 && conn.state().named.contains(&req.session);
        if !resuming_own && conn.state().named.len() >= self.config.max_sessions {
            return Err(refused(
                id,
                Refusal::new(
                    ResponseStatus::LimitReached,
                    format!(
                        "this connection has --max-sessions {} sessions open; close one first",
                        self.config.max_sessions
                    ),
                ),
            ));
        }
        let cmd = if req.session != 0 {
            Command::Resume {
                owner: req.session,
                identity: conn.state().identity.clone(),
            }
        } else {
            let ttl = match req.session_ttl_micro {
                0 => self.config.session_ttl,
                m => Duration::from_micros(m),
            };
            if ttl > self.config.max_session_ttl {
                return Err(refused(
                    id,
                    Refusal::new(
                        ResponseStatus::InvalidArgument,
                        format!(
                            "session_ttl_micro {} exceeds the server's --max-session-ttl of {}",
                            req.session_ttl_micro,
                            humantime::format_duration(self.config.max_session_ttl)
                        ),
                    ),
                ));
            }
            self.room_for_a_session(id)?;
            Command::OpenSession {
                ttl,
                identity: conn.state().identity.clone(),
            }
        };
        match self.propose(id, cmd).await?.reply {
            Reply::Session { id: session, ttl } => {
                if conn.is_closed() && req.session == 0 {
                    let _ = self
                        .cluster
                        .propose(Command::Disconnect { owner: session })
                        .await;
                    return Err(refused(
                        id,
                        Refusal::new(ResponseStatus::ShuttingDown, "the connection has ended"),
                    ));
                }
                self.attached.attach(session, conn.id);
                conn.note_ttl(ttl);
                let mut st = conn.state();
                if !st.named.contains(&session) {
                    st.named.push(session);
                }
                let mut r = handler::response(id, ResponseStatus::Ok);
                r.session = session;
                r.session_ttl_micro = micros(ttl);
                Ok(r)
            }
            Reply::UnknownSession => Err(refused(id, unknown_session(req.session))),
            other => Err(Box::new(handler::error(
                id,
                ResponseStatus::General,
                format!("internal error: OpenSession answered {other:?}"),
            ))),
        }
    }

    /// The session a request acts for: a named one of this connection, or
    /// the connection's implicit session, opened now if need be.
    async fn owner(&self, conn: &ConnSessions, id: u64, session: u64) -> Result<OwnerId, Refused> {
        if session != 0 {
            return self.named(conn, id, session);
        }
        if let Some(s) = conn.state().implicit {
            return Ok(s);
        }
        self.room_for_a_session(id)?;
        let cmd = Command::OpenSession {
            ttl: self.config.session_ttl,
            identity: conn.state().identity.clone(),
        };
        match self.propose(id, cmd).await?.reply {
            Reply::Session { id: s, .. } => {
                if conn.is_closed() {
                    // The client left while this was in flight: nobody
                    // will use or end the session, so end it now.
                    let _ = self.cluster.propose(Command::Disconnect { owner: s }).await;
                    return Err(refused(
                        id,
                        Refusal::new(ResponseStatus::ShuttingDown, "the connection has ended"),
                    ));
                }
                self.attached.attach(s, conn.id);
                conn.state().implicit = Some(s);
                conn.note_ttl(self.config.session_ttl);
                Ok(s)
            }
            other => Err(Box::new(handler::error(
                id,
                ResponseStatus::General,
                format!("internal error: OpenSession answered {other:?}"),
            ))),
        }
    }

    /// Refuses a new session when the cluster has `--max-cluster-sessions`
    /// open, as this node's table last applied (a bound on memory, not a
    /// rule the log must agree on).
    fn room_for_a_session(&self, id: u64) -> Result<(), Refused> {
        let open = self.cluster.read(|table, _| table.sessions());
        if open >= self.config.max_cluster_sessions {
            return Err(refused(
                id,
                Refusal::new(
                    ResponseStatus::LimitReached,
                    format!(
                        "the cluster has --max-cluster-sessions {} sessions open; retry later",
                        self.config.max_cluster_sessions
                    ),
                ),
            ));
        }
        Ok(())
    }

    fn named(&self, conn: &ConnSessions, id: u64, session: u64) -> Result<OwnerId, Refused> {
        if conn.state().named.contains(&session) {
            Ok(session)
        } else {
            Err(refused(id, unknown_session(session)))
        }
    }

    /// A session the table no longer knows: it ended (TTL, another
    /// connection closed it).
    fn forget(&self, conn: &ConnSessions, owner: OwnerId) {
        let mut st = conn.state();
        st.named.retain(|&s| s != owner);
        st.tickets.retain(|&(s, _)| s != owner);
        if st.implicit == Some(owner) {
            st.implicit = None;
        }
        // Remembered for the connection's life, whoever found out (a
        // request, a Ping, or the keeper between Pings): no later Ping may
        // answer Ok as if every session lived. One is enough to say so.
        st.ended.get_or_insert(owner);
        drop(st);
        self.attached.detach(owner, conn.id);
    }

    /// With access control, Unlock, Renew and Proclaim by `fence` act on
    /// another owner's lock only for the identity that took it, or for an
    /// admin. Read from the replicated record after a read index, so a
    /// grant committed under an earlier leader is known; a fence's taker
    /// never changes once noted, so no command in between can make the
    /// answer wrong. A fence not issued yet is refused as well: whoever
    /// names it guessed.
    async fn check_fence(
        &self,
        id: u64,
        who: Option<&Identity>,
        owner: OwnerId,
        keys: &[Key],
        fence: u64,
    ) -> Result<(), Refused> {
        let Some(who) = who.filter(|w| !w.is_admin()) else {
            return Ok(());
        };
        self.cluster
            .read_index()
            .await
            .map_err(|e| cluster_error(id, e))?;
        let denied = self.cluster.read(|table, _| {
            fence >= table.next_fence()
                || (table.fence_held_by_another(keys, fence, owner)
                    && table.taker(fence) != Some(who.name.as_str()))
        });
        if denied {
            return Err(refused(
                id,
                Refusal::new(ResponseStatus::AccessDenied, who.not_your_fence()),
            ));
        }
        Ok(())
    }

    fn unexpected(&self, conn: &ConnSessions, id: u64, owner: OwnerId, reply: Reply) -> Refused {
        if reply == Reply::UnknownSession {
            self.forget(conn, owner);
            return refused(id, unknown_session(owner));
        }
        Box::new(handler::error(
            id,
            ResponseStatus::General,
            format!("internal error: unexpected table reply {reply:?}"),
        ))
    }

    /// Watch on a cluster node: answered from the applied table, which
    /// holds committed state only. A read barrier first, so a deposed
    /// leader does not answer from a state it no longer follows; then the
    /// task waits for applied entries (see `Attached::applied`) and
    /// checks leadership as a waiting Lock does. The watcher is this
    /// node's alone: after a failover the client sends it again.
    async fn watch(
        &self,
        id: u64,
        owner: Option<OwnerId>,
        body: dlock::proto::RequestLock,
    ) -> Result<Response, Refused> {
        let args = crate::watch::watch_args(&self.config, body).map_err(|r| refused(id, r))?;
        let _permit = self.watches.take().map_err(|r| refused(id, r))?;
        self.cluster
            .read_index()
            .await
            .map_err(|e| cluster_error(id, e))?;
        let key = &args.key;
        let info = |table: &crate::table::LockTable, now| {
            // Which connection a session came from is this node's
            // knowledge only, as for Inspect.
            handler::key_info(key, table.inspect(key, now), owner, |_| String::new())
        };
        let look = || {
            self.cluster.read(|table, now| {
                let first = table.first_holder(key);
                (!FirstHolder::is_known(first.as_ref(), args.fence, &args.value))
                    .then(|| info(table, now))
            })
        };
        let found = async {
            let waited = self.attached.hub.wait_for(args.deadline, look);
            tokio::pin!(waited);
            loop {
                tokio::select! {
                    found = &mut waited => return Ok(found),
                    _ = tokio::time::sleep(LEADERSHIP_CHECK) => {
                        if !self.cluster.is_leader() {
                            let e = ClusterError::NotLeader { leader: self.cluster.leader() };
                            return Err(cluster_error(id, e));
                        }
                    }
                }
            }
        };
        let info = match found.await? {
            Some(info) => info,
            None => {
                // The limit ran out: the key as it is now, confirmed by a
                // quorum.
                self.cluster
                    .read_index()
                    .await
                    .map_err(|e| cluster_error(id, e))?;
                self.cluster.read(info)
            }
        };
        let mut r = handler::response(id, ResponseStatus::Ok);
        r.key_info = vec![info];
        Ok(r)
    }

    /// The answer to a Lock or Enqueue sent again whose wait had ended: as
    /// its outcome was (only the outcome shapes the answer). An outcome
    /// applied here after the resume, before this answer, waits in an
    /// Early slot nobody will take: it is dropped.
    fn ended_wait(&self, id: u64, owner: OwnerId, req: ReqId, outcome: WaitOutcome) -> Response {
        self.attached.discard(owner, req);
        let w = Woken {
            req,
            owner,
            keys: Vec::new(),
            wake: outcome,
        };
        handler::woken(id, w)
    }

    async fn lock_reply(
        &self,
        conn: &ConnSessions,
        id: u64,
        owner: OwnerId,
        seq: u64,
        reply: Reply,
    ) -> Result<Response, Refused> {
        let result = match reply {
            Reply::Lock(result) => result,
            Reply::Waited { req, outcome } => return Ok(self.ended_wait(id, owner, req, outcome)),
            Reply::NotHeld(_) => return Err(refused(id, not_the_same(seq))),
            Reply::Forgotten => return Err(refused(id, forgotten(seq))),
            other => return Err(self.unexpected(conn, id, owner, other)),
        };
        let waiting = match handler::lock_result(&self.config, id, result) {
            Ok(r) => return Ok(r),
            Err(req) => req,
        };
        self.await_outcome(id, owner, waiting).await
    }

    /// Waits for the outcome of `req`, a waiting Lock (or queued Enqueue)
    /// of `owner`, and answers with it.
    async fn await_outcome(
        &self,
        id: u64,
        owner: OwnerId,
        req: ReqId,
    ) -> Result<Response, Refused> {
        let Some(rx) = self.attached.register(owner, req) else {
            return Err(refused(id, unknown_session(owner)));
        };
        let mut rx = rx;
        let outcome = loop {
            // A node that stopped leading learns no more outcomes (a
            // snapshot from the new leader skips the sink): answer rather
            // than wait forever; the wait stays the session's.
            tokio::select! {
                r = &mut rx => break r,
                _ = tokio::time::sleep(LEADERSHIP_CHECK) => {
                    if !self.cluster.is_leader() {
                        let e = ClusterError::NotLeader { leader: self.cluster.leader() };
                        return Err(cluster_error(id, e));
                    }
                }
            }
        };
        match outcome {
            Ok(w) => Ok(handler::woken(id, w)),
            // Detached: the session ended, or its connection went (then
            // nobody reads this answer).
            Err(_) => Err(refused(
                id,
                Refusal::new(
                    ResponseStatus::UnknownSession,
                    "the session ended while the Lock waited",
                ),
            )),
        }
    }

    /// The answer to an Enqueue from the table's `reply`: as a Lock's,
    /// except that a request that waits is answered Queued with its ticket
    /// and place in line, and noted as this connection's ticket.
    fn enqueue_reply(
        &self,
        conn: &ConnSessions,
        id: u64,
        owner: OwnerId,
        seq: u64,
        reply: Reply,
    ) -> Result<Response, Refused> {
        let result = match reply {
            Reply::Lock(LockResult::Waiting(req)) => {
                conn.state().tickets.insert((owner, req));
                // Read after the commit: the place now, which the requests
                // decided meanwhile may have moved up.
                let place = self
                    .cluster
                    .read(|table, _| table.place_in_line(req))
                    .unwrap_or(0);
                return Ok(handler::queued(id, req, place));
            }
            Reply::Lock(result) => result,
            Reply::Waited { req, outcome } => return Ok(self.ended_wait(id, owner, req, outcome)),
            Reply::NotHeld(_) => return Err(refused(id, not_the_same(seq))),
            Reply::Forgotten => return Err(refused(id, forgotten(seq))),
            other => return Err(self.unexpected(conn, id, owner, other)),
        };
        match handler::lock_result(&self.config, id, result) {
            Ok(r) => Ok(r),
            // Handled above; the table answers a Lock that waits only so.
            Err(req) => Ok(handler::queued(id, req, 0)),
        }
    }

    /// Wait: the outcome of queued Enqueue `ticket` of the session. Found,
    /// in this order, where it may be: an outcome this node applied and
    /// kept for the session; the table's queues (still waiting: wait for
    /// it here); the session's memory of numbered requests (decided
    /// before a failover moved the session here).
    async fn wait(
        &self,
        conn: &ConnSessions,
        id: u64,
        session: u64,
        ticket: ReqId,
    ) -> Result<Response, Refused> {
        let owner = match session {
            0 => conn.state().implicit,
            s => Some(self.named(conn, id, s)?),
        };
        let Some(owner) = owner else {
            return Err(refused(id, handler::unknown_ticket(ticket)));
        };
        {
            let mut st = conn.state();
            if ticket == 0 || st.waited.contains(&(owner, ticket)) {
                return Err(refused(id, handler::unknown_ticket(ticket)));
            }
            st.tickets.remove(&(owner, ticket));
            if st.waited.len() >= ANSWERED_TICKETS {
                st.waited.pop_front();
            }
            st.waited.push_back((owner, ticket));
        }
        if let Some(w) = self.attached.take_early(owner, ticket) {
            return Ok(handler::woken(id, w));
        }
        self.cluster
            .read_index()
            .await
            .map_err(|e| cluster_error(id, e))?;
        match self.cluster.read(|table, _| table.ticket(owner, ticket)) {
            TicketState::Waiting => self.await_outcome(id, owner, ticket).await,
            TicketState::Decided(outcome) => {
                self.attached.discard(owner, ticket);
                let w = Woken {
                    req: ticket,
                    owner,
                    keys: Vec::new(),
                    wake: outcome,
                };
                Ok(handler::woken(id, w))
            }
            // Applied here between the first look and the read?
            TicketState::Unknown => match self.attached.take_early(owner, ticket) {
                Some(w) => Ok(handler::woken(id, w)),
                None => Err(refused(id, handler::unknown_ticket(ticket))),
            },
        }
    }
}

/// The wire form of a node's view of the cluster.
fn cluster_info(s: &ClusterStatus) -> ClusterInfo {
    ClusterInfo {
        node_id: s.node_id,
        role: format!("{:?}", s.role),
        term: s.term,
        leader_id: s.leader.unwrap_or(0),
        last_log_index: s.last_log_index.unwrap_or(0),
        committed_index: s.committed_index.unwrap_or(0),
        last_applied_index: s.last_applied_index.unwrap_or(0),
        members: s
            .members
            .iter()
            .map(|m| ClusterMember {
                node_id: m.id,
                client_addr: m.client_addr.clone(),
                peer_addr: m.peer_addr.clone(),
                voter: m.voter,
                matched_index: m.matched_index.unwrap_or(0),
                lag: m.lag.unwrap_or(0),
                replication_known: m.lag.is_some(),
            })
            .collect(),
    }
}

/// `cmd` numbered as `req` says: a request of a named session with a
/// `seq` is recognised when it is sent again (see `table::resend`). The
/// connection's implicit session cannot be resumed, so its requests are
/// never numbered.
fn numbered(req: &Request, cmd: Command) -> Command {
    if req.session == 0 || req.seq == 0 {
        return cmd;
    }
    Command::Sequenced {
        seq: req.seq,
        done: req.seq_done,
        cmd: Box::new(cmd),
    }
}

fn forgotten(seq: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!(
            "seq {seq} was applied in this session but its answer is forgotten \
             (seq_done passed it, or the session kept its {MAX_REMEMBERED} latest answers)"
        ),
    )
}

fn not_the_same(seq: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::InvalidArgument,
        format!("seq {seq} was another type of request in this session; a resend must be the same request"),
    )
}

fn unknown_session(session: u64) -> Refusal {
    Refusal::new(
        ResponseStatus::UnknownSession,
        format!("session {session} is not open on this connection or has ended"),
    )
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// How often a waiting Lock's task checks that this node still leads.
const LEADERSHIP_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The first fencing token of every cluster's table.
pub const CLUSTER_FIRST_FENCE: u64 = 1;

/// Starts this server's cluster node from `config` (`--data-dir` and the
/// cluster flags); clients reach this server at `client_addr`.
///
/// # Errors
/// The flags do not describe a node (a cluster of several without
/// `--peer-listen`, this node missing from `--initial-cluster`), the peer
/// port cannot be bound, or the node cannot start (see [`Cluster::start`]).
pub async fn start(
    config: &Config,
    client_addr: SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<Arc<Replicated>> {
    let data_dir = config
        .data_dir
        .clone()
        .context("a cluster node needs --data-dir")?;
    let members: BTreeMap<u64, Member> = config
        .initial_cluster
        .iter()
        .flat_map(|m| &m.0)
        .map(|(id, client, peer)| {
            let member = Member {
                client_addr: client.clone(),
                peer_addr: peer.clone(),
            };
            (*id, member)
        })
        .collect();
    if !members.is_empty() && !members.contains_key(&config.node_id) {
        tracing::info!(
            node_id = config.node_id,
            "not in --initial-cluster: waiting to be added by the leader"
        );
    }
    let peer_listen = match config.peer_listen {
        Some(a) => a,
        None if members.len() <= 1 => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        None => bail!("a cluster of several nodes needs --peer-listen"),
    };
    let peers = TcpListener::bind(peer_listen)
        .await
        .with_context(|| format!("cannot listen for peers on {peer_listen}"))?;
    let peer_addr = match &config.advertise_peer {
        Some(a) => a.clone(),
        None => peers.local_addr()?.to_string(),
    };
    let client = config
        .advertise_client
        .clone()
        .unwrap_or_else(|| client_addr.to_string());
    let cfg = ClusterConfig {
        node_id: config.node_id,
        cluster_id: config.cluster_id.clone(),
        data_dir,
        client_addr: client,
        peer_addr,
        initial_members: members,
        join_existing: config.initial_cluster_state == InitialClusterState::Existing,
        heartbeat: config.heartbeat,
        election_timeout: (config.election_timeout, config.election_timeout * 2),
        limits: Shared::table_limits(config),
        // Part of the table's initial state, from which every node (and
        // every start, until the first snapshot) replays the log: it must
        // be the same everywhere, so not the clock-derived one a single
        // server starts from. Fences then increase through the log.
        first_fence: CLUSTER_FIRST_FENCE,
        sessions: true,
        peer_tls: match (
            &config.peer_tls_cert,
            &config.peer_tls_key,
            &config.peer_tls_ca,
        ) {
            (Some(cert), Some(key), Some(ca)) => {
                Some(crate::cluster::PeerTls::from_files(cert, key, ca)?)
            }
            _ => None,
        },
        peer_routes: config.peer_route.iter().cloned().collect(),
        clock_rate: config.test_clock_rate,
    };
    let attached = Arc::new(Attached::default());
    let sink_to = attached.clone();
    let sink: ApplySink = Arc::new(move |cmd, out| sink_to.applied(cmd, out));
    let cluster = Cluster::start(cfg, peers, sink, stop).await?;
    Ok(Arc::new(Replicated::new(cluster, attached, config.clone())))
}
