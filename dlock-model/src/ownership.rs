//! Tasks sharing one client: which local lock a grant belongs to (the
//! ownership rule of docs/CLIENTS.md, point 4), a third, small model.
//!
//! The server counts a connection (on a cluster, its session) as one owner
//! and grants a key that owner holds again, at once, under a new fence. So
//! two tasks (goroutines, threads) of one client that lock the same key
//! through the client's one shared connection would both be granted it.
//! The rule the Go and Python clients follow: a Lock goes on the shared
//! connection only while no other lock of the client claims its key there
//! (holds it, or asks for it); otherwise on a connection of its own (here:
//! an owner of the task's own). A claim lasts from before the Lock is
//! queued until the Unlock of its grant is queued (requests on one
//! connection are applied in order), or its refusal is read.
//!
//! The model: one client, two tasks, one key, the real lock table
//! (`dlock_server::table`) with three owners (the shared connection and a
//! connection of each task's own). A task asks (Lock, never waiting: a
//! busy key ends its turn), its request is applied and its answer read in
//! order on its connection; the task then returns from its Lock as a
//! separate step (the goroutine is scheduled when it is), holds the key,
//! and unlocks. [`Bug::LostByRecordOrder`] puts back the Go client as it
//! was before 796fce3: every Lock on the shared connection, and a grant of
//! a key another lock of the client holds marked that older lock lost
//! (`LostRegranted`), the older by the order the tasks returned in, not by
//! the server's order of grants.

use dlock_server::table::{Command, LockResult, OwnerId, Reply, Sharing, Time, WaitLimit};
use stateright::{Model, Property};
use std::time::Duration;

use crate::config::Bug;
use crate::table::{Table, KEY};

/// The name of the property bug (e) breaks: a lock reported lost really
/// lost the key.
pub const RIGHT_LOSER: &str = "a lock reported lost is not the key's current grant";
/// The name of the property that a task believes only in a current grant.
pub const CURRENT_GRANT: &str = "a task that holds the key holds the server's latest grant";
/// The name of the mutual-exclusion property between tasks.
pub const ONE_TASK: &str = "at most one task of the client holds the key";
/// The name of the property that shows the tasks take turns.
pub const TURNS_TAKEN: &str = "both tasks hold the key, one after the other";

/// What one run of the ownership model explores.
#[derive(Debug, Clone)]
pub struct Ownership {
    /// How many times each task asks for the key.
    pub turns: u8,
    /// The bug the client carries, if any.
    pub bug: Option<Bug>,
}

impl Ownership {
    /// The configuration CI checks: each task asks twice.
    pub fn ci() -> Ownership {
        Ownership {
            turns: 2,
            bug: None,
        }
    }

    /// The same with `bug` swapped in.
    pub fn with_bug(self, bug: Bug) -> Ownership {
        Ownership {
            bug: Some(bug),
            ..self
        }
    }

    fn old_client(&self) -> bool {
        self.bug == Some(Bug::LostByRecordOrder)
    }
}

/// Where a task is in its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not asking; `turns` left.
    Idle,
    /// Its Lock is queued or applied, its answer not read.
    Asking,
    /// Its Lock's grant is read; the task has not returned from Lock yet.
    Granted,
    /// It returned from Lock: it holds the key, by its own account.
    Holding,
}

/// One task of the client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Task {
    /// Where it is.
    pub phase: Phase,
    /// Whether its current request or lock is on the shared connection.
    pub shared: bool,
    /// The fence of its grant.
    pub fence: u64,
    /// Turns left.
    pub turns: u8,
    /// Whether the client told it its lock was lost.
    pub lost: bool,
}

/// A request queued on a connection: whose, and whether it is a Lock (or
/// an Unlock).
type Queued = (u8, bool);

/// Everything the checker explores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The server's table.
    pub table: Table,
    /// Who holds the key at the server, under which fence.
    pub holder: Option<(OwnerId, u64)>,
    /// The tasks.
    pub tasks: Vec<Task>,
    /// Per connection (0: shared; 1 + task: that task's own), requests
    /// queued, oldest first.
    pub queues: Vec<Vec<Queued>>,
    /// The task that claims the key on the shared connection.
    pub claim: Option<u8>,
    /// The old Go client's record of which lock holds the key.
    pub record: Option<u8>,
    /// Which tasks held the key, a bit each.
    pub have_held: u8,
}

/// One step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `task` calls Lock.
    Lock(u8),
    /// The server applies the oldest request on connection `conn`, and
    /// its answer is read.
    Apply(u8),
    /// `task`, granted, returns from Lock.
    Return(u8),
    /// `task` calls Unlock.
    Unlock(u8),
}

/// The ownership model under one [`Ownership`] configuration.
#[derive(Debug, Clone)]
pub struct OwnershipModel {
    /// What it explores.
    pub cfg: Ownership,
    table: Table,
    /// The owners: the shared connection's, then each task's own.
    owners: Vec<OwnerId>,
}

/// The tasks.
const TASKS: u8 = 2;

impl OwnershipModel {
    /// The model of `cfg`.
    pub fn new(cfg: Ownership) -> OwnershipModel {
        let (table, owners) = Table::with_sessions(usize::from(TASKS) + 1, Duration::from_secs(60));
        OwnershipModel { cfg, table, owners }
    }

    /// Whether `task` believes it holds the key.
    pub fn holds(task: &Task) -> bool {
        task.phase == Phase::Holding && !task.lost
    }

    fn apply(&self, s: &mut State, conn: u8) -> Option<()> {
        let queue = s.queues.get_mut(usize::from(conn))?;
        if queue.is_empty() {
            return None;
        }
        let (id, lock) = queue.remove(0);
        let owner = *self.owners.get(usize::from(conn))?;
        let keys = vec![KEY.into()];
        let cmd = if lock {
            Command::Lock {
                owner,
                keys,
                sharing: Sharing::exclusive(),
                wait: WaitLimit::No,
                lease: None,
                value: Vec::new(),
            }
        } else {
            Command::Unlock {
                owner,
                keys,
                fence: None,
            }
        };
        let mut table = s.table.read();
        let reply = table.apply(cmd, Time::ZERO).reply;
        s.holder = table.inspect(KEY, Time::ZERO).holder;
        s.table = Table::write(&table);
        if !lock {
            return Some(());
        }
        let task = s.tasks.get_mut(usize::from(id))?;
        match reply {
            Reply::Lock(LockResult::Granted { fence }) => {
                task.phase = Phase::Granted;
                task.fence = fence;
            }
            _ => {
                // Busy: the turn ends, and its claim with it.
                task.phase = Phase::Idle;
                if s.claim == Some(id) {
                    s.claim = None;
                }
            }
        }
        Some(())
    }
}

impl Model for OwnershipModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let task = Task {
            phase: Phase::Idle,
            shared: false,
            fence: 0,
            turns: self.cfg.turns,
            lost: false,
        };
        vec![State {
            table: self.table.clone(),
            holder: None,
            tasks: vec![task; usize::from(TASKS)],
            queues: vec![Vec::new(); usize::from(TASKS) + 1],
            claim: None,
            record: None,
            have_held: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (id, t) in (0u8..).zip(&s.tasks) {
            match t.phase {
                Phase::Idle if t.turns > 0 => actions.push(Action::Lock(id)),
                Phase::Granted => actions.push(Action::Return(id)),
                Phase::Holding => actions.push(Action::Unlock(id)),
                _ => {}
            }
        }
        for (conn, q) in (0u8..).zip(&s.queues) {
            if !q.is_empty() {
                actions.push(Action::Apply(conn));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Lock(id) => {
                // The claim rule: the shared connection only while no other
                // lock of the client claims the key there.
                let shared = self.cfg.old_client() || s.claim.is_none();
                if shared && !self.cfg.old_client() {
                    s.claim = Some(id);
                }
                let conn = if shared { 0 } else { 1 + id };
                s.queues.get_mut(usize::from(conn))?.push((id, true));
                let t = s.tasks.get_mut(usize::from(id))?;
                t.phase = Phase::Asking;
                t.shared = shared;
                t.turns -= 1;
                t.lost = false;
            }
            Action::Apply(conn) => self.apply(&mut s, conn)?,
            Action::Return(id) => {
                let t = s.tasks.get_mut(usize::from(id))?;
                t.phase = Phase::Holding;
                let shared = t.shared;
                s.have_held |= 1 << id;
                if self.cfg.old_client() && shared {
                    // The old registry: the lock returning now is the
                    // key's holder; the one recorded before it is "older"
                    // and reported lost, whichever the server granted last.
                    if let Some(older) = s.record.filter(|&o| o != id) {
                        let o = s.tasks.get_mut(usize::from(older))?;
                        if o.phase == Phase::Holding && !o.lost {
                            o.lost = true;
                        }
                    }
                    s.record = Some(id);
                }
            }
            Action::Unlock(id) => {
                let t = s.tasks.get_mut(usize::from(id))?;
                t.phase = Phase::Idle;
                let shared = t.shared;
                // A lock reported lost is given up without an Unlock.
                if !t.lost {
                    let conn = if shared { 0 } else { 1 + id };
                    s.queues.get_mut(usize::from(conn))?.push((id, false));
                }
                // Queued behind everything sent before it: the claim ends.
                if s.claim == Some(id) {
                    s.claim = None;
                }
                if s.record == Some(id) {
                    s.record = None;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(RIGHT_LOSER, |_, s: &State| {
                s.tasks
                    .iter()
                    .all(|t| !t.lost || s.holder.is_none_or(|(_, f)| f != t.fence))
            }),
            Property::always(CURRENT_GRANT, |_, s: &State| {
                s.tasks.iter().all(|t| {
                    !OwnershipModel::holds(t) || s.holder.is_some_and(|(_, f)| f == t.fence)
                })
            }),
            Property::always(ONE_TASK, |_, s: &State| {
                s.tasks.iter().filter(|t| OwnershipModel::holds(t)).count() <= 1
            }),
            Property::sometimes(TURNS_TAKEN, |_, s: &State| s.have_held == 0b11),
        ]
    }
}
