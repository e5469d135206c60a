//! The model as stateright sees it: the state (the clock, the cluster, the
//! clients and their connections), the actions that move it, and the
//! properties every reachable state must keep.

use dlock_server::table::Time as TableTime;
use stateright::{Model, Property};

use crate::client::Client;
use crate::cluster::{Cluster, Role};
use crate::config::Config;
use crate::network::Kind;
use crate::table::Table;
use crate::tick::Tick;

/// The name of the safety property the bugs break.
pub const ONE_BELIEVER: &str = "at most one client believes it holds the key";
/// The name of the fence property.
pub const FENCES_RISE: &str = "fences granted for the key strictly rise";
/// The name of the property that makes a model without grants fail.
pub const GRANTED: &str = "a client is granted the key";
/// The name of the property that shows a handover happens.
pub const HANDED_ON: &str = "the key is granted a second time";

/// Everything the checker explores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The time. Every clock reads it: the model's clocks run at one rate
    /// (see docs/RELIABILITY.md for what that leaves out).
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
    /// `client`'s oldest request in flight is lost.
    DropRequest {
        /// Whose.
        client: u8,
    },
    /// `client`'s oldest answer in flight is lost.
    DropAnswer {
        /// Whose.
        client: u8,
    },
    /// `client`'s connection is reset; it connects to the next node.
    Reset {
        /// Whose.
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
        state
            .clients
            .iter()
            .filter(|c| c.believes(state.now, &self.cfg))
            .count()
    }

    fn client_actions(&self, id: u8, c: &Client, now: Tick, actions: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if c.ended {
            return;
        }
        let mut send = |kind| actions.push(Action::Send { client: id, kind });
        let budget = cfg.sends.get(usize::from(id)).copied().unwrap_or(0);
        if c.sent < budget && c.conn.out.len() < cfg.in_flight {
            if id > 0 {
                // A contender only asks for the key: what it does once it
                // holds it is what the first client explores.
                if c.held.is_none() && !c.conn.awaits(|k| matches!(k, Kind::Lock(_))) {
                    send(Kind::Lock(None));
                }
            } else if c.held.is_some() {
                let same_instant = c
                    .conn
                    .out
                    .iter()
                    .chain(c.conn.back.iter().map(|a| &a.to))
                    .any(|r| matches!(r.kind, Kind::Renew(_)) && r.sent == now);
                if cfg.same_instant_renewals || !same_instant {
                    send(Kind::Renew(cfg.short_lease));
                    send(Kind::Renew(cfg.lease));
                }
                send(Kind::Unlock);
                // A Ping matters only to a lock bound to the session.
                if !c.conn.awaits(|k| k == Kind::Ping) {
                    send(Kind::Ping);
                }
            } else if !c.conn.awaits(|k| matches!(k, Kind::Lock(_))) {
                send(Kind::Lock(None));
                send(Kind::Lock(Some(cfg.lease)));
            }
        }
        let client = id;
        if !c.conn.out.is_empty() {
            if c.conn.back.len() < cfg.in_flight {
                actions.push(Action::Deliver { client });
            }
            actions.push(Action::DropRequest { client });
        }
        if !c.conn.back.is_empty() {
            actions.push(Action::Receive { client });
            actions.push(Action::DropAnswer { client });
        }
        // A reset matters for what it cuts off; one with nothing in flight
        // is a reconnect, which the next request's answer shows as well.
        if !c.conn.out.is_empty() || !c.conn.back.is_empty() {
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
        let (table, sessions) = Table::with_sessions(self.cfg.sends.len(), self.cfg.ttl);
        // Every client starts at the leader; the others are reached by a
        // reset or a NotLeader.
        let clients = sessions.into_iter().map(|s| Client::new(s, 0)).collect();
        vec![State {
            now: Tick(0),
            cluster: Cluster::new(self.cfg.nodes, table),
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
            self.client_actions(id, c, state.now, actions);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let cfg = &self.cfg;
        let now = s.now;
        match action {
            Action::Tick => {
                s.now = now + cfg.step;
                for c in &mut s.clients {
                    c.tick(s.now, cfg);
                }
            }
            Action::Elect { node } => s.cluster.elect(node),
            Action::Learn { node } => s.cluster.learn(node),
            Action::Send { client, kind } => {
                s.clients.get_mut(usize::from(client))?.send(kind, now, cfg);
            }
            Action::Deliver { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let req = c.conn.out.remove(0);
                let answer = s
                    .cluster
                    .answer(c.conn.node, c.session, req, table_time(now));
                c.conn.back.push(answer);
            }
            Action::Receive { client } => {
                let c = s.clients.get_mut(usize::from(client))?;
                let answer = c.conn.back.remove(0);
                c.receive(answer, cfg, cfg.nodes);
            }
            Action::DropRequest { client } => {
                s.clients.get_mut(usize::from(client))?.conn.out.remove(0);
            }
            Action::DropAnswer { client } => {
                s.clients.get_mut(usize::from(client))?.conn.back.remove(0);
            }
            Action::Reset { client } => {
                s.clients
                    .get_mut(usize::from(client))?
                    .conn
                    .reset(cfg.nodes);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_BELIEVER, |m: &SessionModel, s: &State| {
                m.believers(s) <= 1
            }),
            Property::always(FENCES_RISE, |_, s: &State| !s.cluster.fence_fell),
            Property::sometimes(GRANTED, |_, s: &State| {
                s.clients.iter().any(|c| c.held.is_some())
            }),
            Property::sometimes(HANDED_ON, |_, s: &State| s.cluster.last_fence >= 2),
        ]
    }
}
