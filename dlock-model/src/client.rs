//! A client as the model runs it: its session, its connection, and what it
//! believes of the key, all decided by the library's own rules
//! (`dlock::rules`): the deadline and its margin, which answers move the
//! deadline, which statuses send the session elsewhere, and the renewal
//! bookkeeping of [`Hold`]. On a broken connection a client of a named
//! session resumes it on a new one and sends again, under their numbers,
//! the requests not answered, as the library's link does; a client that
//! names no session (a dlock v2 client, on the connection's implicit
//! session) gives its lock up with its connection. A [`Bug`] swaps one of
//! those calls for the buggy version it replaced.

use dlock::proto::ResponseStatus;
use dlock::rules::{self, Hold};
use dlock_server::table::{OwnerId, ReqId};
use std::time::Duration;

use crate::config::{Bug, Config};
use crate::network::{Answer, Close, Conn, Ended, Kind, Phase, Request};
use crate::tick::Tick;

/// What a client believes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// What it knows of how long the lock lasts.
    pub hold: Hold<Tick>,
    /// The grant's fence.
    pub fence: u64,
}

/// A client's request for the key that may wait in line, until answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wait {
    /// When it was first sent, by the client's clock: the wait limit (and
    /// a grant's hold) counts from no earlier than this.
    pub first: Tick,
    /// Its wait limit.
    pub limit: Duration,
    /// The ticket of a queued Enqueue, once told.
    pub ticket: Option<ReqId>,
}

/// How a client's last wait for the key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitEnd {
    /// It was granted the key.
    Granted,
    /// It was told `AcquireTimeout`; `early` if before its limit had passed
    /// by the servers' time.
    TimedOut {
        /// Whether the limit had not yet passed.
        early: bool,
    },
    /// It was told something else (`UnknownTicket`, its session ended…):
    /// it will never be granted by this request.
    Refused(ResponseStatus),
}

/// One client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its named session (the table's owner id); `None` for a client that
    /// names none and acts through its connection's implicit session.
    pub session: Option<OwnerId>,
    /// The send time of the latest answer that proved the session alive.
    pub acked: Tick,
    /// The lock it holds, until its own rules say otherwise.
    pub held: Option<Held>,
    /// Its connection, if it has one.
    pub conn: Option<Conn>,
    /// Requests written and not yet answered, oldest first (the link's
    /// pending queue): on a named session they are sent again after a
    /// resume.
    pub pending: Vec<Request>,
    /// The number the next numbered request gets.
    pub next_seq: u8,
    /// Connections opened so far (the first included).
    pub conns: u8,
    /// Ends of its connections on their way to their nodes, oldest first.
    pub closing: Vec<Ended>,
    /// Requests sent so far, not counting resumes and re-sends (bounded by
    /// the configuration).
    pub sent: u8,
    /// The cluster told it the session ended: it stops.
    pub ended: bool,
    /// Its request for the key that may wait, until answered.
    pub wait: Option<Wait>,
    /// How its last such request ended.
    pub wait_end: Option<WaitEnd>,
    /// With the probe (`Config::probe`): when, by its clock, its
    /// connection last heard from its node (opened, or an answer read),
    /// as the link's `heard`.
    pub heard: Tick,
    /// With the probe: it broke off from a node found silent.
    pub silenced: bool,
}

impl Client {
    /// A client whose named `session` (or, with `None`, none) was opened
    /// at time zero, connected to `node`.
    pub fn new(session: Option<OwnerId>, node: u8) -> Client {
        Client {
            session,
            acked: Tick(0),
            held: None,
            conn: Some(Conn::new(node, 1, Phase::Open)),
            pending: Vec::new(),
            next_seq: 1,
            conns: 1,
            closing: Vec::new(),
            sent: 0,
            ended: false,
            wait: None,
            wait_end: None,
            heard: Tick(0),
            silenced: false,
        }
    }

    /// When the lock the client holds falls into jeopardy, by its clock:
    /// one margin before its safety deadline, both as the rules compute
    /// them. It believes it holds the key until then. `None` when it holds
    /// nothing.
    pub fn jeopardy_at(&self, cfg: &Config) -> Option<Tick> {
        let held = self.held?;
        let margin = rules::margin(cfg.margin, held.hold.window(cfg.ttl));
        Some(self.deadline(&held, cfg).before(margin))
    }

    /// Whether the client believes at `now` (its clock) that it holds the
    /// key.
    pub fn believes(&self, now: Tick, cfg: &Config) -> bool {
        self.held.is_some_and(|held| {
            let margin = rules::margin(cfg.margin, held.hold.window(cfg.ttl));
            !rules::in_jeopardy(now, self.deadline(&held, cfg), margin)
        })
    }

    /// The safety deadline of `held`: `Hold::deadline`, or with
    /// [`Bug::NoRateBound`] the same without the clock-rate bound.
    fn deadline(&self, held: &Held, cfg: &Config) -> Tick {
        if !cfg.has(Bug::NoRateBound) {
            return held.hold.deadline(self.acked, cfg.ttl);
        }
        let whole = |(sent, window): (Tick, _)| sent + window;
        let bound = held.hold.lease.map_or(self.acked + cfg.ttl, whole);
        held.hold.unconfirmed.map_or(bound, |u| bound.min(whole(u)))
    }

    /// Time passed: a lock in jeopardy is given up (the guard reports it
    /// lost), as the library does.
    pub fn tick(&mut self, now: Tick, cfg: &Config) {
        if !self.believes(now, cfg) {
            self.held = None;
        }
    }

    /// Sends `kind` at `now` on the open connection.
    pub fn send(&mut self, kind: Kind, now: Tick, cfg: &Config) {
        self.sent += 1;
        match kind {
            Kind::Renew(lease) => {
                if let Some(held) = &mut self.held {
                    let skip = if held.hold.lease.is_some() {
                        cfg.has(Bug::ShorterRenewalUnbounded)
                    } else {
                        cfg.has(Bug::LeaselessRenewalUnbounded)
                    };
                    if !skip {
                        held.hold.renew_sent(now, lease);
                    }
                }
            }
            // Sending an Unlock gives the lock up: the guard is released
            // whatever the answer.
            Kind::Unlock => self.held = None,
            Kind::LockWaiting(limit) | Kind::Enqueue(limit) => {
                self.wait = Some(Wait {
                    first: now,
                    limit,
                    ticket: None,
                });
            }
            Kind::Lock(_) | Kind::Wait(_) | Kind::Ping | Kind::Resume => {}
        }
        // Numbered as the link numbers: what changes the table, on a named
        // session; `done` is below the oldest numbered request unanswered.
        let (seq, done) = if self.session.is_some() && kind.numbered() {
            let seq = self.next_seq;
            self.next_seq += 1;
            let oldest = self
                .pending
                .iter()
                .find(|r| r.seq != 0)
                .map_or(seq, |r| r.seq);
            (seq, oldest - 1)
        } else {
            (0, 0)
        };
        let req = Request {
            kind,
            sent: now,
            first: now,
            seq,
            done,
        };
        self.pending.push(req);
        if let Some(conn) = &mut self.conn {
            conn.out.push(req);
        }
    }

    /// Opens a connection to `node` at `now`; a named session is resumed
    /// on it before anything else goes.
    pub fn connect(&mut self, node: u8, now: Tick) {
        self.conns += 1;
        let phase = match self.session {
            Some(_) => Phase::Resuming,
            None => Phase::Open,
        };
        let mut conn = Conn::new(node, self.conns, phase);
        if phase == Phase::Resuming {
            conn.out.push(Request {
                kind: Kind::Resume,
                sent: now,
                first: now,
                seq: 0,
                done: 0,
            });
        }
        self.conn = Some(conn);
    }

    /// The connection ends, `how`: what was in flight on it is gone, and
    /// its end goes to its node. A client without a named session gives
    /// up what its connection held, as a single server's client does;
    /// one with a session keeps its unanswered requests to send again.
    pub fn close(&mut self, how: Close) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // A reset of a connection with no implicit session and nothing on
        // its way changes nothing at the node (a named session stays for
        // its TTL, and the connection can end no second time): its end is
        // not kept, which saves the checker its interleavings.
        if how == Close::Fin || conn.implicit.is_some() || !conn.out.is_empty() {
            self.closing.push(Ended {
                node: conn.node,
                conn: conn.id,
                how,
                implicit: conn.implicit,
                out: conn.out,
            });
        }
        if self.session.is_none() {
            // Its wait, if any, was withdrawn with the connection's
            // session: the client gave it up.
            self.held = None;
            self.pending.clear();
            self.wait = None;
        }
    }

    /// Gives up a resume whose answer has not come (its time ran out): the
    /// attempt ends with a reset, since the node may have resumed the
    /// session for it and a clean close would end the session
    /// (`dial.rs`'s `reset_on_close`), or with [`Bug::FinAbandonsResume`]
    /// a clean close.
    pub fn abandon(&mut self, cfg: &Config) {
        let how = if cfg.has(Bug::FinAbandonsResume) {
            Close::Fin
        } else {
            Close::Rst
        };
        self.close(how);
    }

    /// Reads `answer` at `now`, by its clock; the servers' time is
    /// `server_now` (only to note whether a wait timed out before its
    /// limit, which the client cannot tell).
    pub fn receive(&mut self, answer: Answer, now: Tick, server_now: Tick, cfg: &Config) {
        let req = answer.to;
        if req.kind == Kind::Resume {
            return self.resumed(answer, now, cfg);
        }
        // An answer that sends the session elsewhere leaves the request in
        // place, to be sent again after the resume (the link's read loop).
        if rules::elsewhere(answer.status, None).is_none() {
            if let Some(i) = self.pending.iter().position(|r| *r == req) {
                self.pending.remove(i);
            }
        }
        let kind = req.kind.request_type();
        let proves_life = rules::moves_deadline(true, kind, answer.status)
            || (cfg.has(Bug::NotLeaderProvesLife) && answer.status == ResponseStatus::NotLeader);
        if proves_life {
            self.acked = self.acked.max(req.sent);
        }
        let asked_at = self.wait.map_or(req.first, |w| w.first);
        let waits = req.kind.wait_limit().is_some() || matches!(req.kind, Kind::Wait(_));
        if waits && rules::elsewhere(answer.status, None).is_none() {
            self.waited(answer, server_now);
        }
        match (req.kind, answer.status, answer.fence) {
            (Kind::Lock(lease), ResponseStatus::Ok, Some(fence)) => {
                self.held = Some(Held {
                    hold: Hold::granted(req.first, lease),
                    fence,
                });
            }
            // A grant after waiting: the hold counts from the first send
            // of the request that asked (the Enqueue's, for a Wait), as
            // the library's `granted` does.
            (Kind::LockWaiting(_) | Kind::Enqueue(_), ResponseStatus::Ok, Some(fence)) => {
                self.held = Some(Held {
                    hold: Hold::granted(req.first, None),
                    fence,
                });
            }
            (Kind::Wait(_), ResponseStatus::Ok, Some(fence)) => {
                self.held = Some(Held {
                    hold: Hold::granted(asked_at, None),
                    fence,
                });
            }
            (Kind::Renew(lease), ResponseStatus::Ok, _) => {
                if let Some(held) = &mut self.held {
                    held.hold.renew_answered(req.first, lease);
                    if cfg.has(Bug::SameInstantSuperseded)
                        && held.hold.unconfirmed.is_some_and(|(s, _)| s == req.first)
                    {
                        held.hold.unconfirmed = None;
                    }
                }
            }
            // The server says the lock is gone: the client knows it lost it.
            (Kind::Renew(_), ResponseStatus::NotHeld, _) => self.held = None,
            _ => {}
        }
        self.elsewhere(answer.status);
    }

    /// The answer (not one that sends the session elsewhere) to a request
    /// that may wait: an Enqueue's `Queued` gives the ticket to wait on;
    /// anything else ends the wait.
    fn waited(&mut self, answer: Answer, server_now: Tick) {
        let Some(wait) = &mut self.wait else {
            return;
        };
        let end = match answer.status {
            ResponseStatus::Queued => {
                wait.ticket = answer.ticket;
                return;
            }
            ResponseStatus::Ok => WaitEnd::Granted,
            ResponseStatus::AcquireTimeout => WaitEnd::TimedOut {
                early: server_now < wait.first + wait.limit,
            },
            other => WaitEnd::Refused(other),
        };
        self.wait = None;
        self.wait_end = Some(end);
    }

    /// The answer to a resume: on `Ok` the session lives from the resume's
    /// send time (docs/PROTOCOL.md, "Client-side safety"), and every
    /// request not answered is sent again, in order, under its number
    /// (with [`Bug::ResendOnlyNumbered`], only the numbered ones).
    fn resumed(&mut self, answer: Answer, now: Tick, cfg: &Config) {
        if answer.status != ResponseStatus::Ok {
            return self.elsewhere(answer.status);
        }
        self.acked = self.acked.max(answer.to.sent);
        let Some(conn) = &mut self.conn else {
            return;
        };
        conn.phase = Phase::Open;
        for req in &mut self.pending {
            if cfg.has(Bug::ResendOnlyNumbered) && req.seq == 0 {
                continue;
            }
            req.sent = now;
            conn.out.push(*req);
        }
    }

    /// `rules::elsewhere` of a status: the session ended, or goes on at
    /// another node (the connection is reset, not closed: a clean close
    /// would end the session).
    fn elsewhere(&mut self, status: ResponseStatus) {
        let Some(why) = rules::elsewhere(status, None) else {
            return;
        };
        if matches!(why, dlock::Disconnect::SessionEnded) {
            self.held = None;
            self.ended = true;
            self.pending.clear();
            if self.wait.take().is_some() {
                self.wait_end = Some(WaitEnd::Refused(status));
            }
        }
        self.close(Close::Rst);
    }
}
