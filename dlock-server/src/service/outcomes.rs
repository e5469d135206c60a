//! The one registry of requests answered later: waiting Locks and queued
//! Enqueues, by request id, for the sessions whose clients talk to this
//! server.
//!
//! The table decides a waiting request's outcome in a later command (a
//! release, a lease or wait limit running out), often another connection's.
//! Every engine shows every applied command to [`Outcomes::applied`], in
//! apply order (on a cluster: on every node, for every committed entry);
//! only the node where the session is attached (the one its client talks
//! to) delivers the outcome. An outcome can be applied before the request's
//! answer registers for it (another thread, a queued Enqueue before its
//! Wait), so it is kept until then in an early slot.
//!
//! It also rings the [`ChangeHub`] that parked Watches listen to, and keeps
//! which connection address each attached session came from, for Inspect.

use super::hub::ChangeHub;
use crate::engine::Deliveries;
use crate::table::{Command, Output, OwnerId, ReqId, Woken};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The sessions attached here and the outcomes on their way to them.
#[derive(Debug, Default)]
pub struct Outcomes {
    sessions: Mutex<HashMap<OwnerId, Attached>>,
    /// Rung after every applied command, for parked Watches.
    hub: ChangeHub,
    /// Outcomes handed to waiting requests so far.
    deliveries: AtomicU64,
}

/// One attached session: the connection it is attached through (a resume
/// on another connection moves it), and its requests awaiting outcomes.
#[derive(Debug)]
struct Attached {
    conn: u64,
    peer: SocketAddr,
    slots: HashMap<ReqId, Slot>,
}

#[derive(Debug)]
enum Slot {
    /// The request waits for the outcome here.
    Registered(oneshot::Sender<Woken>),
    /// The outcome was applied before the request registered.
    Early(Woken),
}

impl Outcomes {
    fn lock(&self) -> MutexGuard<'_, HashMap<OwnerId, Attached>> {
        // The map is consistent after every statement; a panic elsewhere
        // must not stop delivery.
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What tells parked Watches that the table changed.
    pub fn hub(&self) -> &ChangeHub {
        &self.hub
    }

    /// How many outcomes have been handed to waiting requests so far. A
    /// connection compares it before and after running requests to learn
    /// whether they woke another connection.
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::Relaxed)
    }

    /// The sink: called for every applied command, in apply order, with
    /// its output and, for a Disconnect, the session it ended. Sorts the
    /// outcomes it decided (taken out of `out`) into sends to registered
    /// requests and early slots; the caller sends them (see
    /// [`Deliveries::send`]).
    pub fn applied(&self, disconnected: Option<OwnerId>, out: &mut Output) -> Deliveries {
        // Watches look after the caller releases the table; one that looks
        // before that waits for the table and sees this command.
        self.hub.changed();
        let mut deliveries = Deliveries::default();
        if out.woken.is_empty()
            && out.withdrawn.is_empty()
            && out.ended_sessions.is_empty()
            && disconnected.is_none()
        {
            return deliveries;
        }
        let mut sessions = self.lock();
        for w in out.woken.drain(..) {
            match sessions.get_mut(&w.owner) {
                Some(a) => match a.slots.remove(&w.req) {
                    Some(Slot::Registered(tx)) => deliveries.sends.push((tx, w)),
                    Some(Slot::Early(_)) | None => {
                        a.slots.insert(w.req, Slot::Early(w));
                    }
                },
                None => deliveries.unattached.push(w),
            }
        }
        // An ended session goes whole, its slots with it: its withdrawn
        // requests are among them.
        for s in out.ended_sessions.iter().chain(&disconnected) {
            sessions.remove(s);
        }
        if !out.withdrawn.is_empty() && disconnected.is_none() && out.ended_sessions.is_empty() {
            // Withdrawn without an outcome and without their session's end:
            // the server stopping (Close). A registered request learns it
            // by its sender being dropped. Once per server, so a scan; the
            // withdrawn ids come in request order, so a binary search.
            for a in sessions.values_mut() {
                a.slots
                    .retain(|req, _| out.withdrawn.binary_search(req).is_err());
            }
        }
        drop(sessions);
        self.deliveries
            .fetch_add(deliveries.sends.len() as u64, Ordering::Relaxed);
        deliveries
    }

    /// [`Outcomes::applied`] for an engine that keeps `out` (the raft
    /// engine's state machine hands it to the proposer too).
    pub fn applied_ref(&self, cmd: &Command, out: &Output) -> Deliveries {
        let disconnected = match cmd {
            Command::Disconnect { owner } => Some(*owner),
            _ => None,
        };
        let mut decided = Output {
            woken: out.woken.clone(),
            withdrawn: out.withdrawn.clone(),
            expired_leases: out.expired_leases,
            ended_sessions: out.ended_sessions.clone(),
            ..Output::default()
        };
        self.applied(disconnected, &mut decided)
    }

    /// Delivers `session`'s outcomes through connection `conn` (from
    /// `peer`) from now on; a session resumed on another connection leaves
    /// the old one, whose waiting requests end.
    pub fn attach(&self, session: OwnerId, conn: u64, peer: SocketAddr) {
        let mut sessions = self.lock();
        match sessions.get_mut(&session) {
            Some(a) if a.conn == conn => {}
            _ => {
                sessions.insert(
                    session,
                    Attached {
                        conn,
                        peer,
                        slots: HashMap::new(),
                    },
                );
            }
        }
    }

    /// Whether `session` is attached through connection `conn`.
    pub fn attached_through(&self, session: OwnerId, conn: u64) -> bool {
        self.lock().get(&session).is_some_and(|a| a.conn == conn)
    }

    /// The address of the connection `session` is attached through.
    pub fn peer_of(&self, session: OwnerId) -> Option<SocketAddr> {
        self.lock().get(&session).map(|a| a.peer)
    }

    /// Stops delivering to `session` here, if it is attached through
    /// `conn`; its registered requests end. Returns the outcomes that
    /// arrived and were never collected (queued Enqueues never waited for).
    pub fn detach(&self, session: OwnerId, conn: u64) -> Vec<Woken> {
        let mut sessions = self.lock();
        if sessions.get(&session).is_none_or(|a| a.conn != conn) {
            return Vec::new();
        }
        let Some(a) = sessions.remove(&session) else {
            return Vec::new();
        };
        a.slots
            .into_values()
            .filter_map(|s| match s {
                Slot::Early(w) => Some(w),
                Slot::Registered(_) => None,
            })
            .collect()
    }

    /// Drops what is kept for `req` of `session`: its outcome was answered
    /// another way.
    pub fn discard(&self, session: OwnerId, req: ReqId) {
        if let Some(a) = self.lock().get_mut(&session) {
            a.slots.remove(&req);
        }
    }

    /// The outcome of `req` of `session` if it was applied here and nobody
    /// registered for it yet (a queued Enqueue before its Wait).
    pub fn take_early(&self, session: OwnerId, req: ReqId) -> Option<Woken> {
        let mut sessions = self.lock();
        let a = sessions.get_mut(&session)?;
        match a.slots.remove(&req)? {
            Slot::Early(w) => Some(w),
            registered => {
                a.slots.insert(req, registered);
                None
            }
        }
    }

    /// Where the outcome of `req`, a waiting request of `session`, arrives;
    /// `None` when the session is not attached here (it ended).
    pub fn register(&self, session: OwnerId, req: ReqId) -> Option<oneshot::Receiver<Woken>> {
        let mut sessions = self.lock();
        let a = sessions.get_mut(&session)?;
        let (tx, rx) = oneshot::channel();
        match a.slots.remove(&req) {
            Some(Slot::Early(w)) => {
                let _ = tx.send(w);
            }
            Some(Slot::Registered(_)) | None => {
                a.slots.insert(req, Slot::Registered(tx));
            }
        }
        Some(rx)
    }

    /// Checks that every request registered for an outcome still waits
    /// (`waits` asks the table): an outcome decided or a request withdrawn
    /// removes its slot. For the fuzz harness, between steps.
    ///
    /// # Errors
    /// The first registered request the table no longer has waiting.
    pub fn check(&self, waits: impl Fn(OwnerId, ReqId) -> bool) -> Result<(), String> {
        for (&owner, a) in self.lock().iter() {
            for (&req, slot) in &a.slots {
                if matches!(slot, Slot::Registered(_)) && !waits(owner, req) {
                    return Err(format!(
                        "request {req} of session {owner} is registered for an outcome \
                         but no longer waits"
                    ));
                }
            }
        }
        Ok(())
    }
}
