//! The model as stateright sees it: the state (the clock, the cluster, the
//! clients and their connections), the actions that move it, and the
//! properties every reachable state must keep.

use dlock::rules;
use dlock_server::table::Time as TableTime;
use stateright::{Model, Property};

use crate::client::Client;
use crate::cluster::{Cluster, Role};
use crate::config::Config;
use crate::network::{Close, Conn, Kind, Phase};
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

    fn client_actions(&self, id: u8, state: &State, c: &Client, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        let now = self.clock(state.now);
        let cluster = &state.cluster;
        let elections_left = cluster.elections < cfg.elections;
        let client = id;
        if let Some(end) = c.closing.first() {
            actions.push(Action::End { client });
            if !end.out.is_empty() {
                actions.push(Action::DeliverLate { client });
            }
        }
        if c.ended {
            return;
        }
        let Some(conn) = &c.conn else {
            if c.conns <= cfg.reconnects {
                for node in 0..cfg.nodes {
                    actions.push(Action::Connect { client, node });
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
                if c.held.is_none() && !conn.awaits(|k| matches!(k, Kind::Lock(_))) {
                    send(Kind::Lock(None));
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
        if !conn.out.is_empty() && conn.back.len() < cfg.in_flight {
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
        if conn.phase == Phase::Resuming {
            actions.push(Action::Abandon { client });
        }
        // A reset matters for what it cuts off, and for a lock held by the
        // connection's implicit session; one with nothing in flight is
        // otherwise a reconnect, which the next request's answer shows as
        // well.
        if conn.busy() || (c.session.is_none() && c.held.is_some()) {
            actions.push(Action::Reset { client });
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
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now + self.cfg.step <= Tick(0) + self.cfg.horizon {
            actions.push(Action::Tick);
        }
        for node in 0..self.cfg.nodes {
            match state.cluster.role(node) {
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
            Action::Learn { node } => s.cluster.learn(node),
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
                conn.back.push(answer);
            }
            Action::Receive { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let answer = *c.conn.as_ref()?.back.first()?;
                c.conn.as_mut()?.back.remove(0);
                c.receive(answer, self.clock(now), cfg);
                if let (Kind::Lock(_), Some(fence)) = (answer.to.kind, answer.fence) {
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
            }
            Action::Abandon { client } => {
                s.clients.get_mut(usize::from(client))?.abandon(cfg);
            }
            Action::Connect { client, node } => {
                let clock = self.clock(now);
                s.clients.get_mut(usize::from(client))?.connect(node, clock);
            }
            Action::End { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                c.closing.first()?;
                let end = c.closing.remove(0);
                s.cluster
                    .connection_ended(client, &end, table_time(now), cfg);
            }
        }
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
