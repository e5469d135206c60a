//! The consensus engine of a dlock cluster: the lock table replicated on
//! openraft, its log and vote durable in segment files, and a TCP transport between
//! nodes.
//!
//! The client-facing server sees one handle, [`Cluster`]: on the leader it
//! [proposes](Cluster::propose) table commands and gets each one's
//! [`Output`] once it is committed and applied; on every node an
//! [`ApplySink`] sees every applied command with its output, in log order;
//! [`Cluster::read`] reads the applied table. It never learns how
//! replication works, and the table never learns that it is replicated.
//!
//! # Design
//!
//! | file | owns |
//! |---|---|
//! | this file | the handle [`Cluster`]: proposing, reads, status, shutdown |
//! | `start` | starting a node: data directory, openraft, first-start init |
//! | `identity` | which node of which cluster a data directory belongs to; a mismatch refused at start |
//! | `initial_list` | the `--initial-cluster` list a node bootstrapped with; peers bootstrapped with another refused at the hello |
//! | `own_thread` | openraft, the peer port and the batcher on one thread of their own |
//! | `membership` | adding and removing nodes |
//! | `quorum` | whether a leader stands: a majority heard lately (CheckQuorum) |
//! | `reachability` | which peers this node's RPCs reach, and its paced log lines about them |
//! | `types` | openraft's type configuration: the stamped commands, the entry |
//! | `ids` | [`Member`], node ids, log ids, votes, snapshot metadata |
//! | `batcher` | proposals queued behind each other written as one entry |
//! | `log_store` | the Raft log and vote: openraft's log storage |
//! | `log_writer` | the one thread writing the log, appends grouped per sync |
//! | `wal` | the log's segment files: records, checkpoints, crash recovery |
//! | `storage` | the one door from the log's and the snapshot's files to the disk (real, or simulated in tests) |
//! | `storage_sim` | tests only: a disk in memory that power cuts tear, and that fails on command |
//! | `storage_volatile` | the torture only: writes held in memory until synced, so a SIGKILL is a power cut |
//! | `redb_import` | data directories of versions that kept the log in redb |
//! | `machine` | the state machine: the table, applied entries, snapshots |
//! | `snapshot_file` | the latest snapshot on disk, replaced atomically |
//! | `leader_clock` | cluster time: how a leader stamps commands |
//! | `timer` | when a lease falls due on the leader, for the expiry task |
//! | `wire` | peer frames and messages, limits |
//! | `peer_client` | dialling peers: openraft's network traits, a pool |
//! | `peer_server` | the peer port: hello check, RPCs into openraft |
//! | `status` | [`ClusterStatus`] |
//! | `error` | [`ClusterError`] |
//! | `store_suite` | openraft's storage test suite against our stores |
//!
//! openraft does elections, log replication, commitment, membership
//! changes (joint consensus), snapshots and log compaction; this module
//! only implements its storage, state machine and network traits.
//!
//! # Durability
//!
//! A command is answered only after openraft commits it: its entry is on a
//! majority of nodes, and each of them reported the entry flushed only after
//! its write to the log's segment file and an `fdatasync`. Votes are saved the
//! same way before they are sent. The table itself lives in memory; a
//! snapshot of it is written (and fsynced, then renamed into place) every
//! `--snapshot-every` entries ([`SNAPSHOT_EVERY`] by default), after which
//! openraft purges the log it covers but the last
//! [`LOG_KEPT_AFTER_SNAPSHOT`], so the disk holds at most one
//! snapshot and a bounded log. On start the table is restored from the
//! snapshot and the log after it is applied again up to the last committed
//! entry; the [`ApplySink`] sees those entries again.
//!
//! # Time
//!
//! Each command carries the cluster time it was stamped with by the leader
//! that proposed it, and every node applies it at that time, so leases and
//! wait limits expire at the same point of the log everywhere. A new leader
//! starts its clock at the latest time its state machine has applied (never
//! earlier than anything applied) and advances it by its own monotonic
//! clock; stamps never go backwards. Cluster time stands still between two
//! leaders, so a leader change extends every lease and wait by at least the
//! gap since the old leader's last command, which is at least the election
//! timeout. That is the safe direction: a lease never ends earlier than the
//! client that holds it can compute. Clocks need not be synchronised; their
//! rates are assumed to differ by a bounded amount, which clients' safety
//! margins cover. While this node leads, the expiry task (`Service::run_expiry`)
//! proposes `Command::Advance` whenever the table's next deadline is due by
//! cluster time (see `timer`).
//!
//! # Transport
//!
//! Each node listens on its own peer port. Frames are a 4-byte big-endian
//! length and a message, in MessagePack once both ends have said in the
//! hello that they read it, else JSON (`encoding`; snapshot chunk bytes
//! travel raw); a connection opens with a hello that carries the cluster id and both node
//! ids, and anything else (garbage, an oversized frame, the client protocol,
//! another cluster) is closed with a log line. One connection per peer is
//! reused for replication, with TCP keepalive and openraft's per-RPC
//! timeouts; a failed connection is dialled again on the next RPC.
//!
//! # Membership
//!
//! A node whose data directory is fresh initialises the cluster with
//! [`ClusterConfig::initial_members`] when that list contains it (every
//! initial node must be given the same list), or alone when the list is
//! empty. A fresh node not in a non-empty list waits, as a learner, to be
//! added by the leader with [`Cluster::add_node`]. Later starts read the
//! membership from the data directory and ignore the list.

mod batcher;
mod encoding;
mod error;
mod from_config;
mod identity;
mod ids;
mod initial_list;
mod leader_clock;
mod log;
mod machine;
mod membership;
mod own_thread;
mod paced;
mod peer_client;
mod peer_server;
mod peer_tls;
mod quorum;
mod reachability;
mod removal;
mod restore;
mod snapshot_file;
mod standing;
mod start;
mod status;
mod storage;
#[cfg(test)]
mod storage_sim;
#[cfg(feature = "testing")]
mod storage_volatile;
#[cfg(test)]
mod store_suite;
mod timer;
mod types;
mod wire;

pub use error::ClusterError;
pub use from_config::{start as start_from_config, CLUSTER_FIRST_FENCE};
pub use peer_tls::PeerTls;
pub use restore::{restore_backup, Restored};
pub use status::{ClusterStatus, MemberStatus, Role};
pub use types::{Member, NodeId};

use crate::table::{Command, LockTable, Output, TableLimits, Time};
use leader_clock::LeaderClock;
use openraft::error::{CheckIsLeaderError, ClientWriteError, Fatal, RaftError};
use openraft::ServerState;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use types::Raft;

/// A good [`ClusterConfig::heartbeat`] for nodes on one network.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(100);
/// A good [`ClusterConfig::election_timeout`] with [`DEFAULT_HEARTBEAT`]:
/// several missed heartbeats before a follower campaigns.
pub const DEFAULT_ELECTION_TIMEOUT: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_millis(1000));
/// How long [`Cluster::propose`] and [`Cluster::read_index`] wait for a
/// quorum before answering [`ClusterError::Unavailable`].
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`Cluster::add_node`] waits for the new node to catch up, and
/// each membership change to commit.
pub const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(60);
/// A snapshot is taken after this many log entries since the last one,
/// unless [`ClusterConfig::snapshot_every`] says otherwise.
pub const SNAPSHOT_EVERY: u64 = crate::ops::config::DEFAULT_SNAPSHOT_EVERY;

/// A node writes its own snapshots at most this many bytes a second,
/// unless [`ClusterConfig::snapshot_write_rate`] says otherwise.
pub const SNAPSHOT_WRITE_RATE: u64 = crate::ops::config::DEFAULT_SNAPSHOT_WRITE_RATE_MIB << 20;

/// How long [`Cluster::snapshot`] waits for a snapshot covering what was
/// applied: a million held leases take about 3.3 s to write at
/// [`SNAPSHOT_WRITE_RATE`] (the most a node holds, 4,000,000 by default,
/// about 14 s), and one already being written may come first.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

/// How often [`Cluster::snapshot`] asks again while it waits.
const SNAPSHOT_WAIT_SLICE: Duration = Duration::from_millis(500);
/// Entries kept in the log after a snapshot, so that a follower a little
/// behind catches up from the log rather than by a whole snapshot.
pub const LOG_KEPT_AFTER_SNAPSHOT: u64 = 1_000;
/// A snapshot may take this long to send and install (a large table).
const SNAPSHOT_INSTALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Called on every node for every applied command with its output, in log
/// order, synchronously inside apply: the next entry is applied only after
/// it returns, so it must not block. It runs without any lock of the
/// cluster held and may call [`Cluster::read`]. It also sees the entries
/// re-applied when a node starts; it does not see what a snapshot installed
/// from the leader covers.
pub type ApplySink = Arc<dyn Fn(&Command, &Output) + Send + Sync>;

/// How to start one node.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id, unique in the cluster and never reused.
    pub node_id: u64,
    /// Every peer hello carries it; a node with another is refused.
    pub cluster_id: String,
    /// Where the log, vote and snapshot live; created if missing.
    pub data_dir: PathBuf,
    /// Advertised to clients in NotLeader answers.
    pub client_addr: String,
    /// Advertised to peers.
    pub peer_addr: String,
    /// The peer port is one the kernel chose at this start (no
    /// `--peer-listen`: a cluster of one): it changes at every restart, so
    /// no other node could reach this one for long, and no node is added
    /// while it leads (see `membership.rs`).
    pub ephemeral_peer_port: bool,
    /// Used only when `data_dir` is fresh: see the module documentation.
    /// Empty, or only this node, makes a cluster of one.
    pub initial_members: BTreeMap<u64, Member>,
    /// A fresh `data_dir` joins a cluster that already runs (it waits to be
    /// added, or to hear from the leader) instead of bootstrapping the
    /// initial members; see `standing.rs`.
    pub join_existing: bool,
    /// How often the leader sends heartbeats (about 100 ms).
    pub heartbeat: Duration,
    /// A follower that hears no leader for a random time in this range
    /// starts an election (about 500..1000 ms).
    pub election_timeout: (Duration, Duration),
    /// The table's limits, for a fresh table.
    pub limits: TableLimits,
    /// The table's first fencing token, for a fresh table.
    pub first_fence: u64,
    /// Whether the table's owners must be open sessions
    /// ([`LockTable::with_sessions`]), as the server's clients are. A test of
    /// the engine alone may drive it with bare owner ids instead.
    pub sessions: bool,
    /// Mutual TLS on the peer port; `None`: plain TCP.
    pub peer_tls: Option<PeerTls>,
    /// Addresses to dial instead of the members' peer addresses, by node id:
    /// for tests that put a proxy they control on each link.
    pub peer_routes: BTreeMap<u64, String>,
    /// How fast this node's clock runs against real time while it leads:
    /// 1, but in tests of the clients' allowance for clock rates.
    pub clock_rate: f64,
    /// Log entries between snapshots (usually [`SNAPSHOT_EVERY`]).
    pub snapshot_every: u64,
    /// Bytes a second this node writes its own snapshots at, at most; 0:
    /// as fast as the disk takes them (usually [`SNAPSHOT_WRITE_RATE`]).
    pub snapshot_write_rate: u64,
}

/// A cheap handle to a running node.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cluster {
    /// The node id only: the rest is openraft's and the table's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

struct Inner {
    id: NodeId,
    raft: Raft,
    machine: Arc<machine::MachineHandle>,
    clock: LeaderClock,
    /// Proposals for the batcher, which writes them as entries.
    proposals: tokio::sync::mpsc::Sender<batcher::Proposal>,
    /// The peer port's TLS, shared with the peer server and the dialler,
    /// so that a reload reaches both.
    peer_tls: Option<PeerTls>,
    /// The last committed index plus one (0: none), from the log store.
    committed: Arc<AtomicU64>,
    /// Cancelled when the node starts stopping, for any reason.
    stop: CancellationToken,
    /// Cancelled when the node has stopped.
    stopped: CancellationToken,
    /// Why the node stopped on its own (a storage error, a task of the node
    /// that died): set once, before `stop` is cancelled for it.
    failure: std::sync::OnceLock<String>,
    /// Cancelled by [`Cluster::fail`]: tells the supervisor to stop the node.
    failed: CancellationToken,
    /// Why the node stopped because it was removed from the cluster: set
    /// once, before `failed` is cancelled for it.
    removed: std::sync::OnceLock<String>,
    /// Whether this node stands as the leader: openraft says it leads and a
    /// majority acknowledged it lately (`quorum`).
    standing: quorum::Standing,
    /// Cancelled by [`Cluster::step_aside`].
    stepped_aside: CancellationToken,
    /// Which peers this node's RPCs reach.
    reach: reachability::Reachability,
    /// Serialises [`Cluster::shutdown`] calls.
    shutting_down: tokio::sync::Mutex<()>,
    tasks: TaskTracker,
    /// [`ClusterConfig::ephemeral_peer_port`].
    ephemeral_peer_port: bool,
}

impl Cluster {
    /// Re-reads the peer port's certificates (SIGHUP); `None` without
    /// peer TLS.
    pub fn reload_peer_tls(&self) -> Option<anyhow::Result<()>> {
        self.inner.peer_tls.as_ref().map(PeerTls::reload)
    }
}

impl Cluster {
    /// The term this node leads, or why it cannot take a write.
    fn leading_term(&self) -> Result<u64, ClusterError> {
        if self.inner.stop.is_cancelled() {
            return Err(ClusterError::Unavailable(
                "this node is shutting down".into(),
            ));
        }
        let server = self.inner.raft.server_metrics();
        let m = server.borrow();
        if m.state == ServerState::Leader {
            if *self.inner.standing.borrow() {
                return Ok(m.vote.leader_id.term);
            }
            // Cut off from the majority (or stepping aside): another node
            // may lead by now, and this one could commit nothing.
            return Err(ClusterError::NotLeader { leader: None });
        }
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|node| (id, node.clone()))
        });
        Err(ClusterError::NotLeader { leader })
    }

    /// Replicates `cmd`, stamped with the leader's cluster time, in the
    /// next log entry (with whatever else was proposed meanwhile: see
    /// `batcher`), and waits until it is committed and applied on this
    /// node; returns the command's own output (which the [`ApplySink`] saw
    /// too).
    ///
    /// # Errors
    /// [`ClusterError::NotLeader`] when this node is not the leader, or its
    /// entry was overwritten by a new leader's log (the command was not
    /// applied); [`ClusterError::Unavailable`] when it was not committed
    /// within [`COMMIT_TIMEOUT`] (it may still be committed later) or the
    /// node is stopping; [`ClusterError::Fatal`] when the engine stopped.
    pub async fn propose(&self, cmd: Command) -> Result<Output, ClusterError> {
        self.propose_indexed(cmd).await.map(|(_, out)| out)
    }

    /// As [`Cluster::propose`], and also returns the log index the command
    /// was committed at: once another node's status shows that index
    /// applied, its table and sink have seen the command. (openraft's
    /// metrics, and so [`Cluster::status`], may show it applied on this node
    /// a moment after this returns.)
    ///
    /// # Errors
    /// As [`Cluster::propose`].
    pub async fn propose_indexed(&self, cmd: Command) -> Result<(u64, Output), ClusterError> {
        let (index, mut outs) = self.propose_together(vec![cmd]).await?;
        match outs.pop() {
            Some(out) => Ok((index, out)),
            None => Err(ClusterError::Unavailable(
                "no output for the command".into(),
            )),
        }
    }

    /// As [`Cluster::propose_indexed`] for several commands that go into
    /// one log entry together (one commit for all), applied in order;
    /// their outputs in the same order.
    ///
    /// # Errors
    /// As [`Cluster::propose`].
    pub async fn propose_together(
        &self,
        cmds: Vec<Command>,
    ) -> Result<(u64, Vec<Output>), ClusterError> {
        // Refused here already, so a follower never queues anything.
        self.leading_term()?;
        let started = std::time::Instant::now();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let stopping = || ClusterError::Unavailable("this node is shutting down".into());
        let proposed = async {
            self.inner
                .proposals
                .send(batcher::Proposal { cmds, answer })
                .await
                .map_err(|_| stopping())?;
            answered.await.map_err(|_| stopping())?
        };
        let answer = self.bounded(COMMIT_TIMEOUT, proposed).await?;
        if answer.is_ok() {
            crate::ops::metrics::committed(started.elapsed());
        }
        answer
    }

    /// A linearizable read barrier (openraft's read index): confirms with a
    /// quorum that this node is still the leader and waits until its table
    /// has applied everything committed before the call. After `Ok`,
    /// [`Cluster::read`] sees every write committed before this call.
    ///
    /// # Errors
    /// As [`Cluster::propose`].
    pub async fn read_index(&self) -> Result<(), ClusterError> {
        self.leading_term()?;
        let check = self.inner.raft.ensure_linearizable();
        match self.bounded(COMMIT_TIMEOUT, check).await? {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ClusterError::NotLeader {
                    leader: f.leader_id.zip(f.leader_node),
                })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q))) => {
                Err(ClusterError::Unavailable(q.to_string()))
            }
            Err(RaftError::Fatal(f)) => Err(self.fatal(f)),
        }
    }

    /// Runs `f` on the applied table and the current cluster time (the
    /// leader's clock on the leader; elsewhere the latest applied time).
    /// Applying waits while `f` runs: keep it short.
    pub fn read<R>(&self, f: impl FnOnce(&LockTable, Time) -> R) -> R {
        let term = self.leading_term().ok();
        let st = self.inner.machine.lock();
        let now = match term {
            Some(term) => self.inner.clock.now(term, st.at),
            None => st.at,
        };
        f(&st.table, now)
    }

    /// The leader this node knows of, with its addresses.
    /// This node itself only while it stands as the leader (see `quorum`).
    pub fn leader(&self) -> Option<(u64, Member)> {
        let server = self.inner.raft.server_metrics();
        let m = server.borrow();
        let id = m.current_leader?;
        if id == self.inner.id && !*self.inner.standing.borrow() {
            return None;
        }
        let node = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, node))
    }

    /// Resolves once this node does not lead: at once if it does not lead
    /// now, else when it steps down (deposed, cut off from the majority,
    /// stepping aside to stop).
    pub async fn stops_leading(&self) {
        let mut server = self.inner.raft.server_metrics();
        let mut standing = self.inner.standing.clone();
        loop {
            if server.borrow_and_update().state != ServerState::Leader
                || !*standing.borrow_and_update()
            {
                return;
            }
            tokio::select! {
                r = server.changed() => if r.is_err() { return },
                r = standing.changed() => if r.is_err() { return },
            }
        }
    }

    /// Whether this node is the leader and stands as one: a majority
    /// acknowledged it within twice the election timeout (see `quorum`).
    pub fn is_leader(&self) -> bool {
        self.inner.raft.server_metrics().borrow().state == ServerState::Leader
            && *self.inner.standing.borrow()
    }

    /// Whether this node counts itself leader but stands no more: cut off
    /// from the majority, or stepping aside. It can serve nobody; it says
    /// so to the clients' liveness probe.
    pub fn leads_without_standing(&self) -> bool {
        self.inner.raft.server_metrics().borrow().state == ServerState::Leader
            && !*self.inner.standing.borrow()
    }

    /// Gives up leading before this node stops: it stands no more (so the
    /// connections whose sessions it kept are reset and their clients move
    /// on) and sends no more heartbeats, so the others elect a successor
    /// after their leader lease instead of after this node is gone.
    /// openraft 0.9 has no leadership transfer. Idempotent.
    pub fn step_aside(&self) {
        if self.inner.stepped_aside.is_cancelled() {
            return;
        }
        self.inner.stepped_aside.cancel();
        // Never to lead again before it stops: a draining node that won an
        // election would lead without standing and, with its heartbeats,
        // keep the others from electing one that can serve.
        self.inner.raft.runtime_config().elect(false);
        self.inner.raft.runtime_config().heartbeat(false);
        if self.inner.raft.server_metrics().borrow().state == ServerState::Leader {
            tracing::info!(
                node = self.inner.id,
                "stepping aside as the leader before stopping"
            );
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.id
    }

    /// Every member and this node's view of the cluster.
    pub fn status(&self) -> ClusterStatus {
        let committed = self.inner.committed.load(Ordering::Relaxed).checked_sub(1);
        let mut status =
            ClusterStatus::from_metrics(&self.inner.raft.metrics().borrow(), committed);
        // It refuses requests as a node without a leader, and names none:
        // say the same here, or status and /metrics call a leader the node
        // whose /readyz and answers say there is none.
        if status.role == Role::Leader && !*self.inner.standing.borrow() {
            status.role = Role::SteppedAside;
            status.leader = None;
        }
        // Only a leader talks to every member all the time; a follower's
        // last word with a peer may be hours old.
        if matches!(status.role, Role::Leader | Role::SteppedAside) {
            for m in &mut status.members {
                if m.id != self.inner.id {
                    m.unreachable_for = self.inner.reach.down_for(m.id);
                }
            }
        }
        status
    }

    /// Waits until `cond` holds for this node's [`ClusterStatus`], checking
    /// it whenever openraft's metrics change; returns the status that
    /// passed. For start-up (waiting for a leader) and tests.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] naming `what` when `timeout` passes
    /// first or the node stops.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        cond: impl Fn(&ClusterStatus) -> bool + Send + Sync,
    ) -> Result<ClusterStatus, ClusterError> {
        let committed = self.inner.committed.clone();
        let status = |m: &openraft::RaftMetrics<NodeId, Member>| {
            let c = committed.load(Ordering::Relaxed).checked_sub(1);
            ClusterStatus::from_metrics(m, c)
        };
        let m = self
            .inner
            .raft
            .wait(Some(timeout))
            .metrics(|m| cond(&status(m)), what)
            .await
            .map_err(|e| ClusterError::Unavailable(format!("waiting for {what}: {e}")))?;
        Ok(status(&m))
    }

    /// Takes a snapshot now and purges the log it covers (beyond what the
    /// snapshot policy would keep); returns the last index it covers. For
    /// backups, SIGUSR1 and tests; snapshots are otherwise taken every
    /// `--snapshot-every` entries ([`SNAPSHOT_EVERY`] by default). A
    /// snapshot already being written is waited for, then another taken if
    /// it does not cover what was applied when this was called. The purge
    /// itself may finish later, when no replication still reads the
    /// entries.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] if no such snapshot was written within
    /// [`SNAPSHOT_WAIT`] or the node is stopping; [`ClusterError::Fatal`].
    pub async fn snapshot(&self) -> Result<Option<u64>, ClusterError> {
        let applied = self
            .inner
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index);
        let Some(applied) = applied else {
            return Ok(None);
        };
        // openraft ignores the trigger while a snapshot is being written,
        // and that one may cover less than `applied`: ask again each slice
        // until one covering it is taken.
        let until = tokio::time::Instant::now() + SNAPSHOT_WAIT;
        let m = loop {
            self.inner
                .raft
                .trigger()
                .snapshot()
                .await
                .map_err(|f| self.fatal(f))?;
            let slice = SNAPSHOT_WAIT_SLICE
                .min(until.saturating_duration_since(tokio::time::Instant::now()));
            let waited = self
                .inner
                .raft
                .wait(Some(slice))
                .metrics(
                    |m| m.snapshot.is_some_and(|s| s.index >= applied),
                    "snapshot taken",
                )
                .await;
            match waited {
                Ok(m) => break m,
                Err(_) if tokio::time::Instant::now() < until => continue,
                Err(e) => return Err(ClusterError::Unavailable(e.to_string())),
            }
        };
        let covered = m.snapshot.map(|s| s.index);
        if let Some(upto) = covered {
            self.inner
                .raft
                .trigger()
                .purge_log(upto)
                .await
                .map_err(|f| self.fatal(f))?;
        }
        Ok(covered)
    }

    /// Stops this node: the peer port, the batcher and openraft, waiting for
    /// them. Pending proposals fail with [`ClusterError::Unavailable`]. The
    /// data directory can be opened again once this returns. Calling it
    /// again does nothing.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let _one_at_a_time = self.inner.shutting_down.lock().await;
        if self.inner.stopped.is_cancelled() {
            return;
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "consensus engine did not stop cleanly");
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.stopped.cancel();
        tracing::info!(node = self.inner.id, "cluster node stopped");
    }

    /// Resolves once the node has stopped, after [`Cluster::shutdown`] or a
    /// fatal storage error. The server should stop serving then.
    pub async fn stopped(&self) {
        self.inner.stopped.cancelled().await
    }

    /// Why the node stopped on its own: openraft stopped (a storage error,
    /// a fatal invariant) or a task the node cannot serve without ended.
    /// `None` while it runs, and after a [`Cluster::shutdown`] it was asked
    /// for.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.get().cloned()
    }

    /// Why the node stopped because it was removed from the cluster
    /// (`removal.rs`): the server then exits zero, as asked, not as failed.
    pub fn removed(&self) -> Option<String> {
        self.inner.removed.get().cloned()
    }

    /// Stops the node because it was removed from the cluster (`why`).
    fn leave(&self, why: String) {
        if self.inner.stop.is_cancelled() {
            return;
        }
        tracing::warn!(node = self.inner.id, "{why}");
        let _ = self.inner.removed.set(why);
        self.inner.failed.cancel();
    }

    /// Stops the node because `why` leaves it unable to serve; the first
    /// reason given is the one kept.
    pub(crate) fn fail(&self, why: String) {
        if self.inner.stop.is_cancelled() && self.inner.failure.get().is_none() {
            // Already stopping as asked: a task ending now is part of that.
            return;
        }
        let _ = self.inner.failure.set(why);
        self.inner.failed.cancel();
    }

    /// Runs `fut` for at most `limit`, or until the node starts stopping.
    async fn bounded<T>(
        &self,
        limit: Duration,
        fut: impl Future<Output = T>,
    ) -> Result<T, ClusterError> {
        tokio::select! {
            r = tokio::time::timeout(limit, fut) => r.map_err(|_| ClusterError::Unavailable(format!(
                "no quorum within {limit:?}; the outcome is unknown"
            ))),
            _ = self.inner.stop.cancelled() => Err(ClusterError::Unavailable("this node is shutting down".into())),
        }
    }

    fn write_error(&self, e: RaftError<NodeId, ClientWriteError<NodeId, Member>>) -> ClusterError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ClusterError::NotLeader {
                leader: f.leader_id.zip(f.leader_node),
            },
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ClusterError::Refused(e.to_string())
            }
            RaftError::Fatal(f) => self.fatal(f),
        }
    }

    fn fatal(&self, f: Fatal<NodeId>) -> ClusterError {
        if self.inner.stop.is_cancelled() && f == Fatal::Stopped {
            ClusterError::Unavailable("this node is shutting down".into())
        } else {
            ClusterError::Fatal(Box::new(f))
        }
    }
}
