//! A client as the model runs it: its session, its connection, and what it
//! believes of the key, all decided by the library's own rules
//! (`dlock::rules`): the deadline and its margin, which answers move the
//! deadline, which statuses send the session elsewhere, and the renewal
//! bookkeeping of [`Hold`]. A [`Bug`] swaps one of those calls for the
//! buggy version it replaced.

use dlock::proto::{RequestType, ResponseStatus};
use dlock::rules::{self, Hold};
use dlock_server::table::OwnerId;

use crate::config::{Bug, Config};
use crate::network::{Answer, Conn, Kind, Request};
use crate::tick::Tick;

/// What a client believes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// What it knows of how long the lock lasts.
    pub hold: Hold<Tick>,
    /// The grant's fence.
    pub fence: u64,
}

/// One client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its session (the table's owner id).
    pub session: OwnerId,
    /// The send time of the latest answer that proved the session alive.
    pub acked: Tick,
    /// The lock it holds, until its own rules say otherwise.
    pub held: Option<Held>,
    /// Its connection.
    pub conn: Conn,
    /// Requests sent so far (bounded by the configuration).
    pub sent: u8,
    /// The cluster told it the session ended: it stops.
    pub ended: bool,
}

impl Client {
    /// A client whose `session` was opened at time zero, connected to
    /// `node`.
    pub fn new(session: OwnerId, node: u8) -> Client {
        Client {
            session,
            acked: Tick(0),
            held: None,
            conn: Conn {
                node,
                out: Vec::new(),
                back: Vec::new(),
            },
            sent: 0,
            ended: false,
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

    /// Sends `kind` at `now`.
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
            Kind::Lock(_) | Kind::Ping => {}
        }
        self.conn.out.push(Request { kind, sent: now });
    }

    /// Reads `answer`. `nodes` is the cluster's size, for going elsewhere.
    pub fn receive(&mut self, answer: Answer, cfg: &Config, nodes: u8) {
        let req = answer.to;
        let kind = match req.kind {
            Kind::Lock(_) => RequestType::Lock,
            Kind::Renew(_) => RequestType::Renew,
            Kind::Ping => RequestType::Ping,
            Kind::Unlock => RequestType::Unlock,
        };
        let proves_life = rules::moves_deadline(true, kind, answer.status)
            || (cfg.has(Bug::NotLeaderProvesLife) && answer.status == ResponseStatus::NotLeader);
        if proves_life {
            self.acked = self.acked.max(req.sent);
        }
        match (req.kind, answer.status, answer.fence) {
            (Kind::Lock(lease), ResponseStatus::Ok, Some(fence)) => {
                self.held = Some(Held {
                    hold: Hold::granted(req.sent, lease),
                    fence,
                });
            }
            (Kind::Renew(lease), ResponseStatus::Ok, _) => {
                if let Some(held) = &mut self.held {
                    held.hold.renew_answered(req.sent, lease);
                    if cfg.has(Bug::SameInstantSuperseded)
                        && held.hold.unconfirmed.is_some_and(|(s, _)| s == req.sent)
                    {
                        held.hold.unconfirmed = None;
                    }
                }
            }
            // The server says the lock is gone: the client knows it lost it.
            (Kind::Renew(_), ResponseStatus::NotHeld, _) => self.held = None,
            _ => {}
        }
        if let Some(why) = rules::elsewhere(answer.status, None) {
            if matches!(why, dlock::Disconnect::SessionEnded) {
                self.held = None;
                self.ended = true;
            }
            // The rest of the connection's traffic is abandoned: the
            // library would send it again under its number, which the model
            // abstracts as those answers being lost.
            self.conn.reset(nodes);
        }
    }
}
