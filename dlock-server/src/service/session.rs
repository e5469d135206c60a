//! Sessions, Ping and Hello, and a connection's start and end.
//!
//! Every owner is a session of the table. A client that opens one
//! (OpenSession) names it in later requests; an older client that never
//! does gets one opened for it on its first request that needs one, the
//! connection's *implicit* session.
//!
//! How long a session lives is the engine's: on the local engine every
//! session ends with its connection, however it ends, and never expires on
//! its own, so a single server behaves as if the connection were the owner.
//! On the raft engine a session outlives its connection for its TTL, kept
//! alive by every command that names it (Pings included, see
//! [`Service::keep_connection_alive`]): a clean end of the connection (the
//! client closes it) ends its sessions at once; any other end (a broken
//! path, this node stopping) leaves the named ones to their TTL, so the
//! client can resume them through the new leader (OpenSession naming the
//! session) and find its locks and its place in every queue. The implicit
//! session ends with its connection however it ends: nobody can resume it.

use super::reply::{self, Refusal};
use super::{Answer, Conn, Service};
use crate::ops::config::MIN_SESSION_TTL;
use crate::table::{Command, OwnerId, Reply};
use dlock_proto::proto::{Request, ResponseStatus};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The TTL of a session on an engine whose sessions end with their
/// connection: one that never runs out (see `table::Time::END`).
const UNTIL_DISCONNECT: Duration = Duration::MAX;

impl Service {
    /// The TTL a new session gets, `asked` 0 meaning the default.
    fn session_ttl(&self, asked: u64) -> Result<Duration, Refusal> {
        if !self.engine.sessions_outlive_connections() {
            return Ok(UNTIL_DISCONNECT);
        }
        let ttl = match asked {
            0 => self.config.session_ttl,
            m => Duration::from_micros(m),
        };
        if ttl < MIN_SESSION_TTL {
            return Err(reply::session_ttl_too_short(asked, MIN_SESSION_TTL));
        }
        if ttl > self.config.max_session_ttl {
            return Err(reply::session_ttl_too_long(
                asked,
                self.config.max_session_ttl,
            ));
        }
        Ok(ttl)
    }

    /// Ping. On the raft engine a client counts a Ping's answer as proof
    /// that its sessions live (client-side safety): it is answered Ok only
    /// once every session of the connection was kept alive by a commit. A
    /// session that ended meanwhile is said so: its locks may have gone to
    /// others. On the local engine sessions live as long as the connection
    /// that answers.
    ///
    /// A Ping with no session on a cluster node is a client's liveness
    /// probe (docs/PROTOCOL.md, "Noticing a node that cannot serve"): a
    /// node that counts itself leader but stands no more (cut off from the
    /// majority, or stepping aside to stop) answers it `Unavailable` at
    /// once, so the client moves its sessions elsewhere now rather than
    /// when their keep-alives fail to commit.
    pub(super) async fn ping(&self, conn: &Conn, req: &Request) -> Result<Answer, Refusal> {
        let id = req.id;
        self.named_if_any(conn, req.session)?;
        let probe = req.session == 0 && conn.all().is_empty();
        if probe
            && self
                .engine
                .cluster()
                .is_some_and(|c| c.leads_without_standing())
        {
            return Err(reply::node_without_majority());
        }
        if self.engine.sessions_outlive_connections() {
            if let Some(gone) = self.keep_alive(conn).await? {
                return Err(reply::session_ended(gone));
            }
        }
        Ok(Answer::Now(reply::response(id, ResponseStatus::Ok)))
    }

    /// Hello: the server's limits.
    pub(super) fn hello(&self, id: u64) -> dlock_proto::proto::Response {
        let mut r = reply::response(id, ResponseStatus::Ok);
        let mut limits = self.config.limits();
        if self.engine.sessions_outlive_connections() {
            // A lock bound to a session lives a TTL after the last request
            // that named it, however the connection ends.
            limits.session_timeout_micro = micros(self.config.session_ttl);
            limits.resumable_sessions = true;
            // So a client can tell a silent node from a busy one.
            limits.election_timeout_micro = micros(self.config.election_timeout);
        }
        r.limits = Some(limits);
        r
    }

    /// OpenSession: a new session, or (on the raft engine) the resume of
    /// one that outlived its connection.
    pub(super) async fn open_session(&self, conn: &Conn, req: &Request) -> Result<Answer, Refusal> {
        let id = req.id;
        let resumable = self.engine.sessions_outlive_connections();
        if req.session != 0 && !resumable {
            return Err(reply::not_resumable(req.session));
        }
        let resuming_own = req.session != 0 && conn.state().named.contains(&req.session);
        if !resuming_own && conn.state().named.len() >= self.config.max_sessions {
            return Err(reply::too_many_sessions(self.config.max_sessions));
        }
        let identity = conn.state().identity.clone();
        let cmd = if req.session != 0 {
            Command::Resume {
                owner: req.session,
                identity,
            }
        } else {
            let ttl = self.session_ttl(req.session_ttl_micro)?;
            self.room_for_a_session()?;
            Command::OpenSession { ttl, identity }
        };
        match self.engine.submit(cmd).await?.reply {
            Reply::Session { id: session, ttl } => {
                if req.session == 0 {
                    self.gone_meanwhile(conn, session).await?;
                }
                self.outcomes.attach(session, conn.id, conn.peer);
                let mut st = conn.state();
                if !st.named.contains(&session) {
                    st.named.push(session);
                }
                drop(st);
                let mut r = reply::response(id, ResponseStatus::Ok);
                r.session = session;
                if resumable {
                    conn.note_ttl(ttl);
                    r.session_ttl_micro = micros(ttl);
                }
                Ok(Answer::Now(r))
            }
            Reply::UnknownSession => Err(reply::unknown_session(req.session)),
            other => Err(reply::open_session_answered(&other)),
        }
    }

    /// CloseSession: ends a named session of this connection at once; its
    /// waiting requests are withdrawn and its tickets go with it.
    pub(super) async fn close_session(
        &self,
        conn: &Conn,
        req: &Request,
    ) -> Result<Answer, Refusal> {
        if req.session == 0 {
            return Err(reply::close_needs_session());
        }
        let owner = self.named(conn, req.session)?;
        if self.engine.sessions_outlive_connections() {
            // Detached only once it has ended: a Disconnect that fails (no
            // quorum) leaves the session open, and its outcomes must still
            // reach it.
            self.engine.submit(Command::Disconnect { owner }).await?;
            self.outcomes.detach(owner, conn.id);
        } else {
            // Detached first, so a grant decided before the session's end
            // that nobody collected is released (the local engine never
            // fails a command).
            let uncollected = self.outcomes.detach(owner, conn.id);
            self.engine.release_undelivered(uncollected);
            self.engine.submit(Command::Disconnect { owner }).await?;
        }
        let mut st = conn.state();
        st.named.retain(|&s| s != owner);
        // Its queued requests went with it: they no longer count.
        st.tickets.retain(|&(s, _)| s != owner);
        Ok(Answer::Now(reply::response(req.id, ResponseStatus::Ok)))
    }

    /// The session a request acts for: a named one of this connection, or
    /// the connection's implicit session, opened now if need be.
    pub(super) async fn owner(&self, conn: &Conn, session: u64) -> Result<OwnerId, Refusal> {
        if session != 0 {
            return self.named(conn, session);
        }
        if let Some(s) = conn.state().implicit {
            return Ok(s);
        }
        self.room_for_a_session()?;
        let ttl = self.session_ttl(0)?;
        let identity = conn.state().identity.clone();
        match self
            .engine
            .submit(Command::OpenSession { ttl, identity })
            .await?
            .reply
        {
            Reply::Session { id: s, ttl } => {
                self.gone_meanwhile(conn, s).await?;
                self.outcomes.attach(s, conn.id, conn.peer);
                conn.state().implicit = Some(s);
                if self.engine.sessions_outlive_connections() {
                    conn.note_ttl(ttl);
                }
                Ok(s)
            }
            other => Err(reply::open_session_answered(&other)),
        }
    }

    /// A session just opened for a connection that ended meanwhile (the
    /// request was in flight on the raft engine): nobody will use or end
    /// it, so it ends now.
    async fn gone_meanwhile(&self, conn: &Conn, session: OwnerId) -> Result<(), Refusal> {
        if !conn.is_closed() {
            return Ok(());
        }
        let _ = self
            .engine
            .submit(Command::Disconnect { owner: session })
            .await;
        Err(reply::connection_ended())
    }

    /// Refuses a new session when `--max-cluster-sessions` are open, as
    /// this node's table last applied (a bound on memory, not a rule the
    /// log must agree on). On the local engine sessions end with their
    /// connections, which `--max-connections` bounds.
    fn room_for_a_session(&self) -> Result<(), Refusal> {
        if !self.engine.sessions_outlive_connections() {
            return Ok(());
        }
        let open = self.engine.read(|table, _| table.sessions());
        if open >= self.config.max_cluster_sessions {
            return Err(reply::too_many_cluster_sessions(
                self.config.max_cluster_sessions,
            ));
        }
        Ok(())
    }

    /// `session`, if it is a named session of this connection.
    pub(super) fn named(&self, conn: &Conn, session: u64) -> Result<OwnerId, Refusal> {
        if conn.state().named.contains(&session) {
            Ok(session)
        } else {
            Err(reply::unknown_session(session))
        }
    }

    /// Refuses a request naming a session this connection may not name,
    /// before its arguments are looked at: who acts comes first.
    pub(super) fn named_if_any(&self, conn: &Conn, session: u64) -> Result<(), Refusal> {
        match session {
            0 => Ok(()),
            s => self.named(conn, s).map(drop),
        }
    }

    /// A session the table no longer knows: it ended (TTL, another
    /// connection closed it).
    pub(super) fn forget(&self, conn: &Conn, owner: OwnerId) {
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
        self.outcomes.detach(owner, conn.id);
    }

    /// Keeps every session of the connection alive by a commit (shared
    /// with other connections': see `keep_alive.rs`); returns a session of
    /// the connection that turned out to have ended (its TTL ran out while
    /// this node could not keep it, e.g. cut off from the majority), now or
    /// earlier; it is forgotten here.
    async fn keep_alive(&self, conn: &Conn) -> Result<Option<OwnerId>, Refusal> {
        let owners = conn.all();
        if owners.is_empty() {
            return Ok(conn.state().ended);
        }
        let outs = self.keep_alives.keep(&self.engine, owners.clone()).await?;
        for (owner, out) in owners.into_iter().zip(outs) {
            if out.reply == Reply::UnknownSession {
                self.forget(conn, owner);
            }
        }
        Ok(conn.state().ended)
    }

    /// On the raft engine: keeps the sessions of a live connection alive
    /// while it lives, even while its requests (Pings included) are parked
    /// behind a waiting Lock: a session must not run out while its client
    /// waits on an open connection. Ends with the connection (`ended`).
    ///
    /// When this node stops leading while the connection has sessions, it
    /// can keep them no longer: it cancels `conn.deposed`, and the
    /// connection is reset, so the client looks for the new leader at once
    /// rather than after a silence (a leader paused and deposed may wake to
    /// a client still waiting on it). A reset, unlike the client's own
    /// clean close, leaves the sessions to be resumed.
    pub async fn keep_connection_alive(self: Arc<Self>, conn: Arc<Conn>, ended: CancellationToken) {
        if !self.engine.sessions_outlive_connections() {
            return;
        }
        loop {
            let ttl = conn.state().shortest_ttl.unwrap_or(self.config.session_ttl);
            let has_sessions = !conn.all().is_empty();
            tokio::select! {
                _ = ended.cancelled() => return,
                // A new session (its TTL is noted) or a shorter TTL: look
                // again, and sleep again for a third of it.
                _ = conn.ttl_changed.notified() => continue,
                _ = self.engine.stops_leading(), if has_sessions => {
                    tracing::debug!(sessions = ?conn.all(), "not leading: resetting the connection");
                    conn.deposed.cancel();
                    return;
                }
                _ = tokio::time::sleep(ttl / 3) => {}
            }
            if conn.all().is_empty() || !self.engine.is_leader() {
                continue;
            }
            if let Err(e) = self.keep_alive(&conn).await {
                tracing::debug!(error = %e.text, "sessions not kept alive");
            }
        }
    }

    /// The end of a client connection: its sessions end now, except, on
    /// the raft engine, the named ones of a connection that did not end
    /// cleanly (`clean`: the client closed it), which are left to their TTL
    /// so the client can resume them. A grant that arrived for a queued
    /// Enqueue nobody waited for is released on the local engine.
    pub(super) fn connection_ended(self: &Arc<Self>, conn: &Conn, clean: bool) {
        let implicit = {
            let mut st = conn.state();
            st.closed = true;
            st.implicit
        };
        let resumable = self.engine.sessions_outlive_connections();
        // A session resumed on another connection is that one's now: a
        // clean close here must not end it.
        let mut ending = Vec::new();
        let mut uncollected = Vec::new();
        for s in conn.all() {
            if !self.outcomes.attached_through(s, conn.id) {
                continue;
            }
            uncollected.extend(self.outcomes.detach(s, conn.id));
            if clean || !resumable || Some(s) == implicit {
                ending.push(s);
            }
        }
        self.engine.release_undelivered(uncollected);
        if ending.is_empty() {
            return;
        }
        let svc = self.clone();
        let end = async move {
            for owner in ending {
                if let Err(e) = svc.engine.submit(Command::Disconnect { owner }).await {
                    // Its TTL ends it instead.
                    tracing::debug!(session = owner, error = %e, "session not ended at once");
                }
            }
        };
        if resumable {
            tokio::spawn(end);
        } else {
            // Nothing the local engine does waits: the sessions end now.
            super::drive(end);
        }
    }
}

impl Service {
    /// `cmd` numbered as `req` says: a request of a named session with a
    /// `seq` is recognised when it is sent again (see `table::resend`). Only
    /// a session that outlives its connection is ever resumed and sent
    /// requests again: the connection's implicit session and every session
    /// of the local engine end with their connection, so their requests act
    /// whatever their number.
    pub(super) fn numbered(&self, req: &Request, cmd: Command) -> Command {
        if req.session == 0 || req.seq == 0 || !self.engine.sessions_outlive_connections() {
            return cmd;
        }
        Command::Sequenced {
            seq: req.seq,
            done: req.seq_done,
            cmd: Box::new(cmd),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
