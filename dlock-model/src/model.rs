//! The model as stateright sees it: the state (the clock, the cluster, the
//! clients and their connections), the actions that move it, and the
//! properties every reachable state must keep.

use dlock::proto::ResponseStatus;
use dlock::rules;
use dlock_server::table::{TicketState, Time as TableTime};
use stateright::{Model, Property};

use crate::client::{Client, Wait, WaitEnd};
use crate::cluster::{Cluster, Role};
use crate::config::{Bug, Config};
use crate::network::{Answer, Close, Conn, Kind, Phase};
use crate::table::Table;
use crate::tick::Tick;

/// The name of the safety property the bugs break.
pub const ONE_BELIEVER: &str = "at most one client believes it holds the key";
/// The name of the fence property.
pub const FENCES_RISE: &str = "fences granted for the key strictly rise";
/// The name of the property an implicit session outliving its
/// connection breaks.
pub const IMPLICIT_ENDS: &str =
    "an implicit session's lock is free once a leader saw its connection end";
/// The name of the node abstraction's property.
pub const NEVER_FORGOTTEN: &str = "an acknowledged grant is in the log of a majority";
/// The name of the property that makes a model without grants fail.
pub const GRANTED: &str = "a client is granted the key";
/// The name of the property that shows a handover happens.
pub const HANDED_ON: &str = "the key is granted a second time";
/// The name of the liveness property (configurations whose Locks wait):
/// see [`SessionModel::waiters_served`].
pub const WAITER_SERVED: &str =
    "once nothing is left to do, no client waits for the key unless it still waits in line";
/// The name of its companion: see [`SessionModel::waiters_at_leader`].
pub const WAITER_AT_LEADER: &str =
    "once nothing is left to do, a client waiting in line waits at the leader";
/// The name of the property that a wait ends in a timeout only past its
/// limit.
pub const TIMEOUT_AFTER_LIMIT: &str = "a wait is told AcquireTimeout only once its limit passed";
/// The name of the property that shows a wait ends in a grant.
pub const GRANTED_AFTER_WAITING: &str = "a client holds the key it waited in line for";
/// The name of the property that shows a wait survives a resume.
pub const GRANTED_AFTER_RESUME: &str =
    "a client holds the key it waited in line for, on a session it resumed";
/// The name of the probe's property (`Config::probe`): see
/// [`SessionModel::probe_in_time`].
pub const PROBE_IN_TIME: &str =
    "a client on a silent node breaks off while its session can still be resumed";
/// The name of the property that shows the probe leads somewhere.
pub const RESUMED_AFTER_SILENCE: &str =
    "a client that broke off from a silent node resumed its session elsewhere";

/// Everything the checker explores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The servers' time (one cluster clock); the clients read theirs
    /// from it through [`SessionModel::clock`].
    pub now: Tick,
    /// The servers.
    pub cluster: Cluster,
    /// The clients.
    pub clients: Vec<Client>,
    /// Connections the network broke so far (counted for `persistent`,
    /// whose faults are bounded by `Config::breaks`).
    pub broken: u8,
    /// With the probe: the node that paused, and when (the servers'
    /// time). A paused node reads, answers, learns and times nothing out
    /// again within the bound.
    pub paused: Option<(u8, Tick)>,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `client` sends a request.
    Send {
        /// Who.
        client: u8,
        /// What.
        kind: Kind,
    },
    /// The node `client` is connected to reads its oldest request and
    /// answers it.
    Deliver {
        /// Whose request.
        client: u8,
    },
    /// `client` reads its oldest answer.
    Receive {
        /// Who.
        client: u8,
    },
    /// The node `client` is connected to, leading, reads its oldest
    /// request and applies it, but loses its leadership before a majority
    /// has it; the next node wins the election.
    DeliverUncommitted {
        /// Whose request.
        client: u8,
        /// Whether the new leader's log has it.
        kept: bool,
    },
    /// The node of `client`'s oldest ended connection reads a request
    /// still on its way on it; the answer goes nowhere.
    DeliverLate {
        /// Whose connection.
        client: u8,
    },
    /// `client`'s connection is reset (the path broke).
    Reset {
        /// Whose.
        client: u8,
    },
    /// `client` gives up its attempt to resume (no answer in time).
    Abandon {
        /// Whose.
        client: u8,
    },
    /// `client`, without a connection, opens one to `node`.
    Connect {
        /// Who.
        client: u8,
        /// To where.
        node: u8,
    },
    /// The node of `client`'s oldest ended connection reads its end.
    End {
        /// Whose connection.
        client: u8,
    },
    /// Time moves one step.
    Tick,
    /// `node` wins an election.
    Elect {
        /// Who.
        node: u8,
    },
    /// Deposed `node` learns of the newer term.
    Learn {
        /// Who.
        node: u8,
    },
    /// The leader's timer: it advances the table to the time now, and the
    /// leases, wait limits and TTLs due by then expire (configurations
    /// whose Locks wait; otherwise the table advances only before each
    /// command).
    Advance,
    /// The leader `node` pauses (with the probe).
    Pause {
        /// Who.
        node: u8,
    },
    /// `client`'s probe found its node silent, and its connection, which
    /// has heard nothing from it within the limit either, breaks off
    /// (a reset) to resume the session elsewhere.
    BreakOff {
        /// Who.
        client: u8,
    },
}

/// The client–session model under one [`Config`].
#[derive(Debug, Clone)]
pub struct SessionModel {
    /// What it explores.
    pub cfg: Config,
}

impl SessionModel {
    /// The model of `cfg`.
    pub fn new(cfg: Config) -> SessionModel {
        SessionModel { cfg }
    }

    /// How many clients believe at `state`'s time that they hold the key.
    pub fn believers(&self, state: &State) -> usize {
        let now = self.clock(state.now);
        state
            .clients
            .iter()
            .filter(|c| c.believes(now, &self.cfg))
            .count()
    }

    /// What a client's clock reads at `now` (the servers' time): with
    /// drift, slow by the rate bound, rounded towards the servers' time
    /// (in whole milliseconds the bound is exact at whole seconds).
    pub fn clock(&self, now: Tick) -> Tick {
        if !self.cfg.drift {
            return now;
        }
        // Exact for the model's times (whole milliseconds, far below 2^52).
        let lag = (now.0 as f64 * rules::CLOCK_RATE_BOUND).floor() as u64;
        Tick(now.0.saturating_sub(lag))
    }

    /// Whether `node` is paused at `state`.
    fn paused(state: &State, node: u8) -> bool {
        state.paused.is_some_and(|(n, _)| n == node)
    }

    /// Whether the probe breaks `c`'s connection off at `state`: its node
    /// paused, the probe has had no answer from it for the limit, nor has
    /// the connection, by the client's clock (`rules::gone_silent`).
    pub fn breaks_off(&self, state: &State, c: &Client) -> bool {
        let (Some((node, since)), Some(conn)) = (state.paused, &c.conn) else {
            return false;
        };
        let (now, limit) = (self.clock(state.now), self.cfg.silence_limit());
        conn.node == node
            && rules::gone_silent(self.clock(since), now, limit)
            && rules::gone_silent(c.heard, now, limit)
    }

    /// The probe's property: a client still on the paused node, on a
    /// connection that was there when it paused, is there while its
    /// session can still be resumed elsewhere, by its own rule
    /// (`rules::session_lives_until`: a TTL past the latest answer that
    /// kept it alive, or the node's last keep-alive, no later than its
    /// pause). Time does not pass a break-off that is due, so this says
    /// the probe's limit leaves room for the resume. (A connection opened
    /// to the node after it paused is left out: its probe counts from its
    /// connect, and the time lost before that is spent elsewhere.)
    pub fn probe_in_time(&self, state: &State) -> bool {
        let Some((node, since)) = state.paused else {
            return true;
        };
        let now = self.clock(state.now);
        state.clients.iter().all(|c| {
            c.ended
                || c.conn.as_ref().is_none_or(|conn| conn.node != node)
                || c.heard > self.clock(since)
                || now < rules::session_lives_until(c.acked, self.clock(since), self.cfg.ttl)
        })
    }

    fn client_actions(&self, id: u8, state: &State, c: &Client, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        let now = self.clock(state.now);
        let cluster = &state.cluster;
        let elections_left = cluster.elections < cfg.elections;
        let client = id;
        if let Some(end) = c.closing.first().filter(|e| !Self::paused(state, e.node)) {
            actions.push(Action::End { client });
            if !end.out.is_empty() {
                actions.push(Action::DeliverLate { client });
            }
        }
        if c.ended {
            return;
        }
        // With `persistent`, faults that break a connection come only while
        // the client has a reconnect left.
        let may_break = !cfg.persistent || (c.conns <= cfg.reconnects && state.broken < cfg.breaks);
        let Some(conn) = &c.conn else {
            if c.conns <= cfg.reconnects {
                for node in 0..cfg.nodes {
                    // A node found silent is tried last (`dial.suspect`):
                    // with another to try, not at all.
                    if c.silenced && Self::paused(state, node) {
                        continue;
                    }
                    actions.push(Action::Connect { client, node });
                }
            } else if cfg.persistent {
                for node in 0..cfg.nodes {
                    if cluster.role(node) == Role::Leader {
                        actions.push(Action::Connect { client, node });
                    }
                }
            }
            return;
        };
        let mut send = |kind| actions.push(Action::Send { client: id, kind });
        let budget = cfg.sends.get(usize::from(id)).copied().unwrap_or(0);
        if conn.phase == Phase::Open && c.sent < budget && conn.out.len() < cfg.in_flight {
            if id > 0 {
                // A contender only asks for the key: what it does once it
                // holds it is what the first client explores.
                let asking = c.pending.iter().any(|r| r.kind.locks());
                match (cfg.wait, c.wait) {
                    (None, _) => {
                        if c.held.is_none() && !conn.awaits(|k| matches!(k, Kind::Lock(_))) {
                            send(Kind::Lock(None));
                        }
                    }
                    (Some(limit), None) if c.held.is_none() && !asking => {
                        send(if cfg.two_phase {
                            Kind::Enqueue(limit)
                        } else {
                            Kind::LockWaiting(limit)
                        });
                    }
                    // The Wait is sent below, whatever the budget: it
                    // completes the Enqueue.
                    (Some(_), _) => {}
                }
            } else if c.held.is_some() && !cfg.leases {
                send(Kind::Unlock);
                if !conn.awaits(|k| k == Kind::Ping) {
                    send(Kind::Ping);
                }
            } else if c.held.is_some() {
                let same_instant = conn
                    .out
                    .iter()
                    .chain(conn.back.iter().map(|a| &a.to))
                    .any(|r| matches!(r.kind, Kind::Renew(_)) && r.sent == now);
                if cfg.same_instant_renewals || !same_instant {
                    send(Kind::Renew(cfg.short_lease));
                    send(Kind::Renew(cfg.lease));
                }
                send(Kind::Unlock);
                // A Ping matters only to a lock bound to the session.
                if !conn.awaits(|k| k == Kind::Ping) {
                    send(Kind::Ping);
                }
            } else if !c.pending.iter().any(|r| matches!(r.kind, Kind::Lock(_))) {
                send(Kind::Lock(None));
                if cfg.leases {
                    send(Kind::Lock(Some(cfg.lease)));
                }
            }
        }
        // A queued Enqueue's Wait, once per ticket.
        if let (
            Phase::Open,
            Some(Wait {
                ticket: Some(t), ..
            }),
        ) = (conn.phase, c.wait)
        {
            let waiting = c.pending.iter().any(|r| matches!(r.kind, Kind::Wait(_)));
            if !waiting && conn.out.len() < cfg.in_flight {
                actions.push(Action::Send {
                    client,
                    kind: Kind::Wait(t),
                });
            }
        }
        let paused = Self::paused(state, conn.node);
        if !conn.out.is_empty()
            && conn.back.len() < cfg.in_flight
            && conn.parked.is_none()
            && !paused
        {
            actions.push(Action::Deliver { client });
            if cfg.uncommitted
                && elections_left
                && cluster.role(conn.node) == crate::cluster::Role::Leader
            {
                for kept in [false, true] {
                    actions.push(Action::DeliverUncommitted { client, kept });
                }
            }
        }
        if !conn.back.is_empty() {
            actions.push(Action::Receive { client });
        }
        if conn.phase == Phase::Resuming && may_break {
            actions.push(Action::Abandon { client });
        }
        if cfg.probe && self.breaks_off(state, c) {
            actions.push(Action::BreakOff { client });
        }
        // A reset matters for what it cuts off, and for a lock held by the
        // connection's implicit session; one with nothing in flight is
        // otherwise a reconnect, which the next request's answer shows as
        // well.
        if (conn.busy() || (c.session.is_none() && c.held.is_some())) && may_break {
            actions.push(Action::Reset { client });
        }
    }

    /// Whether nothing is left to do at `state`: no step is enabled. Every
    /// fault is bounded, so with `persistent` every behaviour ends in such
    /// a state; there every delivery, read, end, election result and
    /// expiry that was possible has happened (weak fairness).
    pub fn quiescent(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        actions.is_empty()
    }

    /// Issue 41's liveness property, on a state where nothing is left to
    /// do: every client still waiting for the key (an unanswered waiting
    /// Lock, or an Enqueue whose Wait is unanswered) has its request parked
    /// at a node, and the table still has that request waiting in line;
    /// and no wait ended but with a grant or a timeout (a refusal such as
    /// `UnknownTicket`, or its session's end: no session's TTL runs out
    /// within the liveness configuration). The table grants the first
    /// waiter when the key is released, its lease or the holder's session
    /// expires, and times it out when its limit passes, and the leader's
    /// Advance has run (nothing is due): so a wait the table decided, a
    /// grant after the holder released or a timeout after the limit, must
    /// have reached its client.
    pub fn waiters_served(&self, state: &State) -> bool {
        state.clients.iter().all(|c| {
            if matches!(c.wait_end, Some(WaitEnd::Refused(_))) {
                return false;
            }
            if c.wait.is_none() {
                return true;
            }
            c.conn
                .as_ref()
                .and_then(|conn| conn.parked)
                .is_some_and(|p| {
                    state.cluster.table.ticket(p.owner, p.ticket) == TicketState::Waiting
                })
        })
    }

    /// The companion of [`SessionModel::waiters_served`], on a state where
    /// nothing is left to do: a request waiting in line is parked at the
    /// leader, which will answer it when the table decides it (a node that
    /// no longer leads learns no more outcomes).
    pub fn waiters_at_leader(&self, state: &State) -> bool {
        state.clients.iter().all(|c| {
            c.conn.as_ref().is_none_or(|conn| {
                conn.parked.is_none() || state.cluster.role(conn.node) == Role::Leader
            })
        })
    }

    /// Answers the requests parked at nodes that the last step decided: a
    /// decision reaches the client only through the leader that applied
    /// it, on the connection its session is attached to (the server's
    /// outcome registry); one that does not reach it stays in the
    /// session's memory, where the request sent again after a resume finds
    /// it. A request whose session ended is answered `UnknownSession`.
    fn deliver_decided(&self, s: &mut State) {
        let woken = std::mem::take(&mut s.cluster.woken);
        let ended = std::mem::take(&mut s.cluster.ended);
        let cluster = &s.cluster;
        for c in &mut s.clients {
            let Some(conn) = &mut c.conn else { continue };
            let Some(p) = conn.parked else { continue };
            if cluster.role(conn.node) != Role::Leader {
                continue;
            }
            let answer = if ended.contains(&p.owner) {
                Answer::bare(p.req, ResponseStatus::UnknownSession)
            } else if let Some(w) = woken
                .iter()
                .find(|w| (w.owner, w.ticket) == (p.owner, p.ticket))
            {
                Answer {
                    fence: w.fence,
                    ..Answer::bare(p.req, w.status)
                }
            } else {
                continue;
            };
            conn.parked = None;
            conn.back.push(answer);
        }
    }
}

/// The table's time for the model's: microseconds.
fn table_time(t: Tick) -> TableTime {
    TableTime::from_micros(t.0.saturating_mul(1_000))
}

impl Model for SessionModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        // The first client names its session; the contenders do too unless
        // they act through implicit sessions.
        let named = if cfg.implicit_contenders {
            1
        } else {
            cfg.sends.len()
        };
        let (table, sessions) = Table::with_sessions(named, cfg.ttl);
        let mut cluster = Cluster::new(cfg.nodes, table, cfg.ttl);
        cluster.bug = cfg.bug;
        // Every client starts at the leader, the named sessions opened on
        // that connection; the others are reached by a reconnect.
        let clients = (0u8..)
            .zip(&cfg.sends)
            .map(|(id, _)| {
                let session = sessions.get(usize::from(id)).copied();
                if let Some(s) = session {
                    cluster.attached.attach(0, s, (id, 1));
                }
                Client::new(session, 0)
            })
            .collect();
        vec![State {
            now: Tick(0),
            cluster,
            clients,
            broken: 0,
            paused: None,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        // The probe is a timer: time does not pass a break-off that is due.
        // Nor an answer the paused node wrote before it paused: its kernel
        // sends it within far less than a tick.
        let due = self.cfg.probe
            && state.clients.iter().any(|c| {
                self.breaks_off(state, c)
                    || c.conn
                        .as_ref()
                        .is_some_and(|k| Self::paused(state, k.node) && !k.back.is_empty())
            });
        if state.now + self.cfg.step <= Tick(0) + self.cfg.horizon && !due {
            actions.push(Action::Tick);
        }
        let leader_paused = state
            .paused
            .is_some_and(|(n, _)| state.cluster.role(n) == Role::Leader);
        if self.cfg.wait.is_some()
            && !leader_paused
            && state.cluster.table.due(table_time(state.now))
        {
            actions.push(Action::Advance);
        }
        for node in 0..self.cfg.nodes {
            if Self::paused(state, node) {
                continue;
            }
            match state.cluster.role(node) {
                Role::Leader if self.cfg.probe && state.paused.is_none() => {
                    actions.push(Action::Pause { node })
                }
                Role::Deposed => actions.push(Action::Learn { node }),
                Role::Follower if state.cluster.elections < self.cfg.elections => {
                    actions.push(Action::Elect { node })
                }
                _ => {}
            }
        }
        for (id, c) in (0u8..).zip(&state.clients) {
            self.client_actions(id, state, c, actions);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let cfg = &self.cfg;
        let now = s.now;
        match action {
            Action::Tick => {
                s.now = now + cfg.step;
                let clock = self.clock(s.now);
                for c in &mut s.clients {
                    c.tick(clock, cfg);
                }
            }
            Action::Elect { node } => s.cluster.elect(node),
            Action::Learn { node } => {
                s.cluster.learn(node);
                // A node that stopped leading learns no more outcomes: it
                // answers what waits on it rather than wait forever
                // (`await_outcome`'s `deposed()`), and the client resumes
                // at the leader and asks again.
                if !cfg.has(Bug::DeposedKeepsWaiting) {
                    for c in &mut s.clients {
                        let Some(conn) = &mut c.conn else { continue };
                        if conn.node != node {
                            continue;
                        }
                        if let Some(p) = conn.parked.take() {
                            conn.back
                                .push(Answer::bare(p.req, ResponseStatus::NotLeader));
                        }
                    }
                }
            }
            Action::Advance => s.cluster.advance(table_time(now)),
            Action::Pause { node } => s.paused = Some((node, now)),
            Action::BreakOff { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                c.close(Close::Rst);
                c.silenced = true;
            }
            Action::Send { client, kind } => {
                let clock = self.clock(now);
                s.clients
                    .get_mut(usize::from(client))?
                    .send(kind, clock, cfg);
            }
            Action::Deliver { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let session = c.session;
                let conn = c.conn.as_mut()?;
                let req = *conn.out.first()?;
                conn.out.remove(0);
                let (node, at) = (conn.node, table_time(now));
                let answer = s.cluster.answer(node, client, session, conn, req, at);
                conn.back.extend(answer);
            }
            Action::Receive { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let answer = *c.conn.as_ref()?.back.first()?;
                c.conn.as_mut()?.back.remove(0);
                c.receive(answer, self.clock(now), now, cfg);
                if cfg.probe {
                    c.heard = self.clock(now);
                }
                if let Some(fence) = answer.fence {
                    s.cluster.acknowledged(fence);
                }
            }
            Action::DeliverUncommitted { client, kept } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let session = c.session;
                let conn = c.conn.as_mut()?;
                let req = *conn.out.first()?;
                conn.out.remove(0);
                let at = table_time(now);
                let answer = s
                    .cluster
                    .answer_uncommitted(client, session, conn, req, at, kept);
                conn.back.push(answer);
            }
            Action::DeliverLate { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let session = c.session;
                let end = c.closing.first_mut()?;
                let req = *end.out.first()?;
                end.out.remove(0);
                // The node's side of the connection, as it was when it ended.
                let mut conn = Conn::new(end.node, end.conn, Phase::Open);
                conn.implicit = end.implicit;
                s.cluster
                    .answer(end.node, client, session, &mut conn, req, table_time(now));
                end.implicit = conn.implicit;
            }
            Action::Reset { client } => {
                s.clients.get_mut(usize::from(client))?.close(Close::Rst);
                s.broken = s.broken.saturating_add(1);
            }
            Action::Abandon { client } => {
                s.clients.get_mut(usize::from(client))?.abandon(cfg);
                s.broken = s.broken.saturating_add(1);
            }
            Action::Connect { client, node } => {
                let clock = self.clock(now);
                let c = s.clients.get_mut(usize::from(client))?;
                c.connect(node, clock);
                if cfg.probe {
                    c.heard = clock;
                }
            }
            Action::End { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                c.closing.first()?;
                let end = c.closing.remove(0);
                s.cluster
                    .connection_ended(client, &end, table_time(now), cfg);
            }
        }
        self.deliver_decided(&mut s);
        let clients = &s.clients;
        s.cluster.attached.forget_unless(|(id, conn)| {
            clients.get(usize::from(id)).is_some_and(|c| {
                c.conn.as_ref().is_some_and(|k| k.id == conn)
                    || c.closing.iter().any(|e| e.conn == conn)
            })
        });
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = self.safety_properties();
        if self.cfg.probe {
            properties.extend([
                Property::always(PROBE_IN_TIME, |m: &SessionModel, s: &State| {
                    m.probe_in_time(s)
                }),
                Property::sometimes(RESUMED_AFTER_SILENCE, |_, s: &State| {
                    s.clients.iter().any(|c| {
                        c.silenced && c.conn.as_ref().is_some_and(|k| k.phase == Phase::Open)
                    })
                }),
            ]);
        }
        if self.cfg.wait.is_some() {
            properties.extend([
                Property::always(WAITER_SERVED, |m: &SessionModel, s: &State| {
                    !m.quiescent(s) || m.waiters_served(s)
                }),
                Property::always(WAITER_AT_LEADER, |m: &SessionModel, s: &State| {
                    !m.quiescent(s) || m.waiters_at_leader(s)
                }),
                Property::always(TIMEOUT_AFTER_LIMIT, |_, s: &State| {
                    !s.clients
                        .iter()
                        .any(|c| c.wait_end == Some(WaitEnd::TimedOut { early: true }))
                }),
                Property::sometimes(GRANTED_AFTER_WAITING, |_, s: &State| {
                    s.clients.iter().any(|c| s.cluster.holds_waited(c))
                }),
                Property::sometimes(GRANTED_AFTER_RESUME, |_, s: &State| {
                    s.clients
                        .iter()
                        .any(|c| s.cluster.holds_waited(c) && c.conns > 1)
                }),
            ]);
        }
        properties
    }
}

impl SessionModel {
    fn safety_properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_BELIEVER, |m: &SessionModel, s: &State| {
                m.believers(s) <= 1
            }),
            Property::always(FENCES_RISE, |_, s: &State| !s.cluster.fence_fell),
            Property::always(IMPLICIT_ENDS, |_, s: &State| !s.cluster.orphan_held),
            Property::always(NEVER_FORGOTTEN, |_, s: &State| !s.cluster.forgotten),
            Property::sometimes(GRANTED, |_, s: &State| {
                s.clients.iter().any(|c| c.held.is_some())
            }),
            Property::sometimes(HANDED_ON, |_, s: &State| s.cluster.last_fence >= 2),
        ]
    }
}
