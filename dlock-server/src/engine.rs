//! The seam between the service and whatever keeps the lock table: submit a
//! table [`Command`] and get its [`Output`], read the applied table.
//!
//! Two engines implement it. [`Local`] keeps the table in memory behind one
//! mutex: a command is applied when `submit` is called, and its future is
//! ready at its first poll, so the service's request functions, which are
//! `async` for the sake of the other engine, cost a single server nothing
//! they did not cost before (see `service::drive`). The raft engine is a
//! [`Cluster`]: a command is answered once the log holding it is committed
//! and applied, and a read first confirms leadership (the read index).
//!
//! The service learns of every applied command through a sink it gives the
//! engine: outcomes of waiting requests come from later commands, often
//! another connection's, so they cannot be returned to the submitter. The
//! sink is called in apply order; [`Deliveries`] lets the local engine hand
//! the outcomes over after its mutex is released.

pub mod alarm;
pub mod clock;
pub mod fence;
pub mod local;
pub mod raft;

use crate::table::{Command, LockTable, Output, Time, Woken};
pub use local::Deliveries;
pub use local::Local;
use raft::{Cluster, ClusterError};

/// Why a submit or a read did not happen (only the raft engine fails:
/// not the leader, no quorum, stopping).
pub type EngineError = ClusterError;

/// The engine under a service.
#[derive(Debug, Clone)]
pub enum Engine {
    /// One server's table in memory.
    Local(Local),
    /// The table replicated on openraft.
    Raft(Cluster),
}

impl Engine {
    /// Applies `cmd`: at once on the local engine, after commit on raft.
    ///
    /// # Errors
    /// Raft only: see [`Cluster::propose`].
    pub async fn submit(&self, cmd: Command) -> Result<Output, EngineError> {
        match self {
            Engine::Local(l) => Ok(l.submit(cmd)),
            Engine::Raft(c) => c.propose(cmd).await,
        }
    }

    /// Applies `cmds` in order, together: on raft in one log entry (one
    /// commit for all of them). Their outputs, in the same order.
    ///
    /// # Errors
    /// Raft only: see [`Cluster::propose`]; then none of them is known
    /// applied.
    pub async fn submit_all(&self, cmds: Vec<Command>) -> Result<Vec<Output>, EngineError> {
        match self {
            _ if cmds.is_empty() => Ok(Vec::new()),
            Engine::Local(l) => Ok(cmds.into_iter().map(|c| l.submit(c)).collect()),
            Engine::Raft(c) => c.propose_together(cmds).await.map(|(_, outs)| outs),
        }
    }

    /// Waits until a read sees every command committed before it was called
    /// (raft: a read index; local: nothing to wait for).
    ///
    /// # Errors
    /// Raft only: see [`Cluster::read_index`].
    pub async fn read_index(&self) -> Result<(), EngineError> {
        match self {
            Engine::Local(_) => Ok(()),
            Engine::Raft(c) => c.read_index().await,
        }
    }

    /// Runs `f` on the applied table and the time to read leases at.
    pub fn read<R>(&self, f: impl FnOnce(&LockTable, Time) -> R) -> R {
        match self {
            Engine::Local(l) => l.read(f),
            Engine::Raft(c) => c.read(f),
        }
    }

    /// Whether this engine may answer now: always on the local engine; on
    /// raft, while this node leads.
    pub fn is_leader(&self) -> bool {
        match self {
            Engine::Local(_) => true,
            Engine::Raft(c) => c.is_leader(),
        }
    }

    /// The error for a request this node can no longer answer because it
    /// stopped leading.
    pub fn not_leader(&self) -> EngineError {
        let leader = match self {
            Engine::Local(_) => None,
            Engine::Raft(c) => c.leader(),
        };
        ClusterError::NotLeader { leader }
    }

    /// Resolves when this node stops leading; never on the local engine.
    pub async fn stops_leading(&self) {
        match self {
            Engine::Local(_) => std::future::pending().await,
            Engine::Raft(c) => c.stops_leading().await,
        }
    }

    /// The cluster, on the raft engine.
    pub fn cluster(&self) -> Option<&Cluster> {
        match self {
            Engine::Local(_) => None,
            Engine::Raft(c) => Some(c),
        }
    }

    /// Whether sessions outlive their connection (for their TTL, so a
    /// client can resume them elsewhere): raft. On the local engine every
    /// session ends with its connection and never expires on its own.
    pub fn sessions_outlive_connections(&self) -> bool {
        matches!(self, Engine::Raft(_))
    }

    /// Resolves when the table has a lease or wait limit due, as this
    /// engine's clock says: the local engine's own; on raft, cluster time
    /// and only while this node leads (only the leader proposes expiry).
    pub async fn due(&self) {
        match self {
            Engine::Local(l) => l.due().await,
            Engine::Raft(c) => c.due().await,
        }
    }

    /// Starts stopping the server. The local engine withdraws every
    /// waiting request and refuses later Locks (see [`Local::close`]); a
    /// cluster node keeps its sessions' waits, which their clients resume
    /// elsewhere.
    pub fn close(&self) {
        if let Engine::Local(l) = self {
            l.close();
        }
    }

    /// Grants decided for requests whose client will never learn of them
    /// (it left first). The local engine releases them (see
    /// [`Local::release_undelivered`]); on raft the grant stays its
    /// session's, which the client may resume.
    pub fn release_undelivered(&self, grants: Vec<Woken>) {
        if let Engine::Local(l) = self {
            l.release_undelivered(grants);
        }
    }
}
