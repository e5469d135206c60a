//! Starting a node: the data directory, openraft, the peer port, the batcher,
//! the first-start initialisation, and the supervisor that stops the node
//! on a fatal error.

use super::identity::{self, Claim, Identity};
use super::initial_list;
use super::leader_clock::LeaderClock;
use super::log::{LogStore, WrittenBy};
use super::machine::StateMachine;
use super::own_thread;
use super::peer_client::Network;
use super::peer_server::PeerServer;
use super::snapshot_file::SnapshotFile;
use super::standing;
use super::types::{Member, Raft};
use super::{
    batcher, quorum, wire, ApplySink, Cluster, ClusterConfig, Inner, LOG_KEPT_AFTER_SNAPSHOT,
    SNAPSHOT_INSTALL_TIMEOUT,
};
use crate::table::TableLimits;
use anyhow::Context;
use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// What [`open_data_dir`] found: the log store, the state machine restored
/// from the snapshot if there is one, whether the directory is fresh
/// (nothing ever written), and its identity file if it has one.
type Opened = (LogStore, StateMachine, bool, Option<Identity>);

/// Opens (or creates) the data directory, once its identity file (see
/// `identity`) agrees with `claim`: the log store, and the state machine
/// restored from the snapshot if there is one. Blocking.
fn open_data_dir(
    dir: &Path,
    log_by: WrittenBy,
    claim: &Claim,
    limits: TableLimits,
    first_fence: u64,
    sessions: bool,
    sink: ApplySink,
) -> anyhow::Result<Opened> {
    // Said plainly: creating it would fail with "File exists".
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!(
            "the data directory {} is a file, not a directory: give --data-dir a directory \
             (it is created if missing)",
            dir.display()
        );
    }
    // Durably: a new data directory lost to a power cut would take the
    // node's first vote and entries with it.
    super::storage::Storage::Real
        .create_dir_all(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    // Before the log is opened: a directory that is another node's is left
    // as it was found.
    let stamp = identity::read(dir)?;
    if let Some(found) = &stamp {
        identity::check(dir, found, claim)?;
    }
    let log = LogStore::open(dir, log_by)
        .with_context(|| format!("cannot open the raft log in {}", dir.display()))?;
    let (file, found) = SnapshotFile::open(dir)
        .with_context(|| format!("cannot read the snapshot in {}", dir.display()))?;
    if log.lost_its_writes().context("cannot read the raft log")? {
        anyhow::bail!(
            "the data directory {} is damaged: its raft log (raft-log/) holds no vote and no \
             entry although {} says it was written to (the files were cut short, replaced or \
             deleted). A node that forgot its vote could vote twice in one term, so it does not \
             start. Restore the data directory from a backup, or remove this node from the \
             cluster (dlock cluster remove), and add a node with an empty data directory and a \
             new id in its place (dlock cluster add)",
            dir.display(),
            super::log::WRITTEN_MARKER
        );
    }
    let fresh = found.is_none() && log.is_fresh().context("cannot read the raft log")?;
    let state_machine = StateMachine::open(file, found, limits, first_fence, sessions, sink)
        .with_context(|| format!("cannot restore the snapshot in {}", dir.display()))?;
    Ok((log, state_machine, fresh, stamp))
}

/// [`open_data_dir`], with a panic inside it turned into an error that
/// names the data directory and says what to do. redb 2.x (which reads the
/// `raft.redb` of older data directories, see `redb_import`) asserts,
/// rather than returning an error, on some damaged files (one cut short,
/// for example): a node must refuse to start from such a file with a clear
/// message, not crash with a backtrace. Blocking; call it at start, before
/// anything else could panic on this thread.
fn open_data_dir_guarded(
    dir: &Path,
    log_by: WrittenBy,
    claim: &Claim,
    limits: TableLimits,
    first_fence: u64,
    sessions: bool,
    sink: ApplySink,
) -> anyhow::Result<Opened> {
    type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send>;
    let opener = std::thread::current().id();
    let previous: Arc<Hook> = Arc::new(std::panic::take_hook());
    let caught = Arc::new(std::sync::Mutex::new(String::new()));
    {
        let (previous, caught) = (previous.clone(), caught.clone());
        // Only this thread's panic is kept quiet; any other goes on as
        // before.
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() == opener {
                // The message and where, not the hook's "panicked at"
                // wording: this is a refusal to start, not a crash.
                let p = info.payload();
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let place = info
                    .location()
                    .map(|l| format!(" ({l})"))
                    .unwrap_or_default();
                if let Ok(mut c) = caught.lock() {
                    *c = format!("{msg}{place}");
                }
            } else {
                previous(info);
            }
        }));
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open_data_dir(dir, log_by, claim, limits, first_fence, sessions, sink)
    }));
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
    outcome.unwrap_or_else(|_| {
        let what = caught.lock().map(|c| c.clone()).unwrap_or_default();
        Err(anyhow::anyhow!(
            "the data directory {} is damaged and this node cannot start from it \
             (the storage engine failed: {what}). Restore it from a backup, or remove this \
             node from the cluster (dlock cluster remove), and add a node with an empty data \
             directory and a new id in its place (dlock cluster add)",
            dir.display()
        ))
    })
}

/// Who `cfg` says this node is, for its data directory's identity file.
fn claim(cfg: &ClusterConfig) -> Claim {
    let others = cfg.initial_members.keys().any(|&m| m != cfg.node_id);
    Claim {
        node_id: cfg.node_id,
        cluster_id: cfg.cluster_id.clone(),
        role: (cfg.join_existing || others).then_some(identity::Role::ClusterNode),
        initial_cluster: initial_list::bootstrapped_with(&cfg.initial_members, cfg.join_existing),
    }
}

/// This node's addresses as the others reach it: `--listen` and
/// `--peer-listen`, or what `--advertise-*` says.
fn own_member(cfg: &ClusterConfig) -> Member {
    Member {
        client_addr: cfg.client_addr.clone(),
        peer_addr: cfg.peer_addr.clone(),
    }
}

/// Why node `id`, listed in `--initial-cluster` at `listed`, cannot be
/// reached there given where it listens (`me`: `--listen` and
/// `--peer-listen`, or what `--advertise-*` says): a port that differs. The
/// others would dial a port where it does not listen, and the cluster
/// would never form.
fn listed_elsewhere(id: u64, listed: &Member, me: &Member) -> Option<String> {
    let port = |addr: &str| addr.rsplit_once(':').map(|(_, p)| p.to_owned());
    let differs = |a: &str, b: &str| port(a) != port(b);
    let (what, flag, at, is) = if differs(&listed.peer_addr, &me.peer_addr) {
        (
            "peer",
            "--peer-listen (or --advertise-peer)",
            &listed.peer_addr,
            &me.peer_addr,
        )
    } else if differs(&listed.client_addr, &me.client_addr) {
        (
            "client",
            "--listen (or --advertise-client)",
            &listed.client_addr,
            &me.client_addr,
        )
    } else {
        return None;
    };
    Some(format!(
        "node {id} is listed in --initial-cluster with {what} address {at}, but its {flag} is \
         {is}: the other nodes and the clients would go to a port where it does not listen, and \
         the cluster would not form. Make this node's entry in --initial-cluster and its {flag} \
         name the same port"
    ))
}

/// Why this node, started without `--peer-listen` (on a peer port the
/// kernel chose), must not start from a data directory whose membership
/// `m` has other voters, or has it as a learner: the leader dials it at its
/// recorded peer address, where nothing listens now, and it would stand for
/// election for ever unheard (a cluster of one grown with `dlock cluster
/// add` by a version that allowed it). `None` when it may start.
fn unreachable_on_an_ephemeral_port(
    cfg: &ClusterConfig,
    m: &openraft::Membership<u64, Member>,
) -> Option<String> {
    let id = cfg.node_id;
    let recorded = m.get_node(&id)?;
    let voters: Vec<u64> = m.voter_ids().collect();
    if !cfg.ephemeral_peer_port || voters == [id] {
        return None;
    }
    let others: Vec<String> = m
        .nodes()
        .map(|(n, _)| *n)
        .filter(|&n| n != id)
        .map(|n| n.to_string())
        .collect();
    Some(format!(
        "node {id} is a member of a cluster with node(s) {}, which reach it at its recorded peer \
         address {}, but it was started without --peer-listen, on a peer port the kernel chose \
         ({}), where they cannot reach it: start it with --peer-listen {} (the port it is \
         recorded at)",
        others.join(", "),
        recorded.peer_addr,
        cfg.peer_addr,
        recorded.peer_addr
    ))
}

/// This node's addresses to record in the membership `m` in place of the
/// recorded ones, when it is the only voter there and listens on other
/// ports than recorded: a cluster of one restarted with another
/// `--peer-listen` (or first with one, after starting on a port the kernel
/// chose), or another `--listen`. Nobody dials the only voter, so its
/// record can change freely, and must, before a node added later dials
/// the old one. A field whose port is the same keeps its recorded host (a
/// name, where `me` may say 0.0.0.0).
fn own_addresses_to_record(
    id: u64,
    m: &openraft::Membership<u64, Member>,
    me: &Member,
) -> Option<Member> {
    let recorded = m.get_node(&id)?;
    if m.voter_ids().ne([id]) {
        return None;
    }
    let port = |addr: &str| addr.rsplit_once(':').map(|(_, p)| p.to_owned());
    let pick = |old: &String, new: &String| {
        if port(old) == port(new) {
            old.clone()
        } else {
            new.clone()
        }
    };
    let now = Member {
        client_addr: pick(&recorded.client_addr, &me.client_addr),
        peer_addr: pick(&recorded.peer_addr, &me.peer_addr),
    };
    (now != *recorded).then_some(now)
}

/// Stops a node with an empty data directory from starting where it
/// would harm a running cluster, or only sit apart from it (see
/// `standing.rs`): a member that lost its data, a bootstrap beside a cluster
/// that runs without this node, a node outside `--initial-cluster` not told
/// that it joins, one listed there at other ports than it listens on, or
/// one whose flags a running cluster's members refuse.
async fn refuse_a_start_that_would_harm(
    cfg: &ClusterConfig,
    network: &Network,
    dir: &Path,
) -> anyhow::Result<()> {
    let id = cfg.node_id;
    if let Some(listed) = cfg.initial_members.get(&id) {
        if let Some(why) = listed_elsewhere(id, listed, &own_member(cfg)) {
            anyhow::bail!("{why}. (Data directory {}: left empty.)", dir.display());
        }
    }
    let listed = cfg.initial_members.contains_key(&id);
    if !cfg.join_existing && !cfg.initial_members.is_empty() && !listed {
        anyhow::bail!(
            "node {id} is not in --initial-cluster and its data directory {} is empty: to add it \
             to a running cluster, start it with --initial-cluster-state existing and run \
             `dlock cluster add {id} CLIENT_ADDR PEER_ADDR` against the cluster",
            dir.display()
        );
    }
    if cfg.initial_members.keys().all(|&m| m == id) {
        return Ok(());
    }
    // Before openraft runs and the peer port serves, so the leader's record
    // of what this node acknowledged is still as it was.
    match standing::ask_the_cluster(network, id, &cfg.initial_members, cfg.join_existing).await {
        Some(found @ standing::Finding::LostItsLog { .. }) => anyhow::bail!(
            "{found}. Data directory: {}. Do not start a node under id {id} again: remove it \
             (dlock cluster remove {id}), then add a node with a new id and an empty data \
             directory (dlock cluster add) and start it with --initial-cluster-state existing",
            dir.display()
        ),
        Some(found @ standing::Finding::NotAMember { .. }) if !cfg.join_existing => {
            anyhow::bail!(
                "{found}, so node {id} must not start a cluster of its own. To add it, start it \
                 with --initial-cluster-state existing and run `dlock cluster add` against the \
                 cluster. (Data directory: {}.)",
                dir.display()
            )
        }
        Some(found @ standing::Finding::Refused { .. }) => anyhow::bail!(
            "{found}. Node {id} does not start: its flags disagree with a running cluster's, so it \
             would sit apart, refused at every dial. Its data directory {} is left empty: correct \
             the flag the refusal names (--cluster-id, --initial-cluster, or a peer address in it) \
             to the running cluster's and start it again",
            dir.display()
        ),
        Some(standing::Finding::NotAMember { .. }) => tracing::info!(
            node = id,
            "fresh node joining a running cluster: waiting to be added (dlock cluster add)"
        ),
        None => {}
    }
    Ok(())
}

impl Cluster {
    /// Starts this node: opens (or creates) its data directory, restores the
    /// table, starts openraft, the peer port on `peer_listener` and the
    /// batcher (on a thread of their own when the caller's runtime has
    /// several, see `own_thread`), and initialises the cluster if the
    /// directory is fresh (see the module documentation). The node stops
    /// when `shutdown` is cancelled, [`Cluster::shutdown`] is called, or on a
    /// fatal storage error.
    ///
    /// # Errors
    /// The data directory cannot be created or read (or is in use by
    /// another process), its contents do not decode, the timing is invalid
    /// (heartbeat not below the election timeout), or openraft fails to
    /// start, or its thread cannot be created.
    pub async fn start(
        cfg: ClusterConfig,
        peer_listener: TcpListener,
        sink: ApplySink,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Cluster> {
        let stopped = CancellationToken::new();
        let place = own_thread::Place::for_node(cfg.node_id, stopped.clone())
            .context("cannot start the consensus engine's thread")?;
        // Registered again with the runtime that serves it.
        let peers = peer_listener
            .into_std()
            .context("cannot move the peer port")?;
        let log_by = if place.is_own_thread() {
            WrittenBy::Caller
        } else {
            WrittenBy::WriterThread
        };
        place
            .run(Self::start_here(
                cfg, log_by, peers, sink, shutdown, stopped,
            ))
            .await
    }

    /// [`Cluster::start`] on the runtime the node's consensus tasks run
    /// on (see `own_thread`), its log written by `log_by`; `stopped`
    /// becomes [`Cluster::stopped`].
    async fn start_here(
        cfg: ClusterConfig,
        log_by: WrittenBy,
        peers: std::net::TcpListener,
        sink: ApplySink,
        shutdown: CancellationToken,
        stopped: CancellationToken,
    ) -> anyhow::Result<Cluster> {
        let peer_listener = TcpListener::from_std(peers).context("cannot serve the peer port")?;
        let dir = cfg.data_dir.clone();
        let claim = claim(&cfg);
        // Reading and decoding a large snapshot takes a while: off the
        // runtime's threads.
        let (mut log, mut state_machine, fresh, stamp) = {
            let (dir, claim) = (dir.clone(), claim.clone());
            let (limits, first_fence, sessions) = (cfg.limits, cfg.first_fence, cfg.sessions);
            tokio::task::spawn_blocking(move || {
                open_data_dir_guarded(&dir, log_by, &claim, limits, first_fence, sessions, sink)
            })
            .await
            .context("opening the data directory")??
        };
        // The membership as openraft reads it at start (a fresh directory
        // has none yet).
        let stored = if fresh {
            None
        } else {
            let state = openraft::StorageHelper::new(&mut log, &mut state_machine)
                .get_membership()
                .await
                .context("cannot read the membership from the data directory")?;
            Some(state.effective().membership().clone())
        };
        if let Some(why) = stored
            .as_ref()
            .and_then(|m| unreachable_on_an_ephemeral_port(&cfg, m))
        {
            anyhow::bail!("{why}");
        }
        let to_record = stored
            .as_ref()
            .and_then(|m| own_addresses_to_record(cfg.node_id, m, &own_member(&cfg)));
        state_machine.pace_snapshot_writes(cfg.snapshot_write_rate);
        let machine = state_machine.shared();
        let committed = log.committed_index();

        let config = openraft::Config {
            cluster_name: cfg.cluster_id.clone(),
            heartbeat_interval: millis(cfg.heartbeat),
            election_timeout_min: millis(cfg.election_timeout.0),
            election_timeout_max: millis(cfg.election_timeout.1),
            install_snapshot_timeout: millis(SNAPSHOT_INSTALL_TIMEOUT),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
            snapshot_max_chunk_size: wire::SNAPSHOT_CHUNK as u64,
            max_in_snapshot_log_to_keep: LOG_KEPT_AFTER_SNAPSHOT,
            ..Default::default()
        }
        .validate()
        .context("invalid cluster timing")?;
        let new_stamp = match &stamp {
            None if fresh => Some(claim.for_fresh()),
            None => {
                tracing::info!(node = cfg.node_id, cluster_id = %cfg.cluster_id, data_dir = %dir.display(), "data directory of an older version: its identity file is written from the flags (there is nothing to check them against)");
                Some(claim.for_unstamped())
            }
            Some(found) => {
                if !fresh {
                    let flag = claim.initial_cluster.as_deref();
                    if let Some(why) = initial_list::ignored_flag(found.initial_cluster(), flag) {
                        tracing::warn!(node = cfg.node_id, "{why}");
                    }
                }
                identity::completed(found, &claim, fresh)
            }
        };
        // The list this node bootstraps with now, or did at its first
        // start: said in every hello, from the standing asks on.
        let initial_cluster: Option<Arc<str>> = new_stamp
            .as_ref()
            .or(stamp.as_ref())
            .and_then(Identity::initial_cluster)
            .map(Arc::from);
        let network = Network::new(
            cfg.node_id,
            &cfg.cluster_id,
            initial_cluster.as_deref(),
            cfg.peer_tls.clone(),
            cfg.peer_routes.clone(),
        );
        let reach = network.reachability();
        let removal_network = network.clone();
        if fresh {
            refuse_a_start_that_would_harm(&cfg, &network, &dir).await?;
        }
        // Only once the start is allowed, and before openraft writes
        // anything: a refused start leaves a fresh directory unstamped, for
        // the corrected flags to stamp.
        if let Some(stamp) = new_stamp {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || identity::write(&dir, &stamp))
                .await
                .context("writing the data directory's identity")??;
        }
        let raft = Raft::new(cfg.node_id, Arc::new(config), network, log, state_machine)
            .await
            .context("cannot start the consensus engine")?;

        if fresh {
            let me = own_member(&cfg);
            let members = if cfg.join_existing {
                tracing::info!(
                    node = cfg.node_id,
                    "fresh node joining a running cluster (--initial-cluster-state existing): \
                     waiting to hear from its leader"
                );
                None
            } else if cfg.initial_members.is_empty() {
                Some(BTreeMap::from([(cfg.node_id, me)]))
            } else if let Some(listed) = cfg.initial_members.get(&cfg.node_id) {
                // As given, whatever this node's own addresses: every
                // initial node must write the same first entry. A host
                // may differ (a name, 0.0.0.0 bound); a port may not.
                if *listed != me {
                    tracing::info!(node = cfg.node_id, listed = %listed, configured = %me, "this node's hosts in --initial-cluster differ from its own (a name, or an address bound as 0.0.0.0): the others dial the listed ones");
                }
                Some(cfg.initial_members.clone())
            } else {
                // Refused above unless told to join: it waits to be added.
                None
            };
            if let Some(members) = members {
                match raft.initialize(members).await {
                    Ok(()) => tracing::info!(node = cfg.node_id, "cluster initialised"),
                    Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                    Err(e) => return Err(e).context("cannot initialise the cluster"),
                }
            }
        }

        let stop = CancellationToken::new();
        let stepped_aside = CancellationToken::new();
        let (standing, watch) = quorum::watch_quorum(
            raft.clone(),
            cfg.election_timeout.1,
            stop.clone(),
            stepped_aside.clone(),
        );
        let tasks = TaskTracker::new();
        let (proposals, queued) = tokio::sync::mpsc::channel(batcher::QUEUE);
        let cluster = Cluster {
            inner: Arc::new(Inner {
                id: cfg.node_id,
                raft: raft.clone(),
                machine,
                clock: LeaderClock::with_rate(cfg.clock_rate),
                proposals,
                peer_tls: cfg.peer_tls.clone(),
                committed,
                stop: stop.clone(),
                stopped,
                failure: std::sync::OnceLock::new(),
                failed: CancellationToken::new(),
                removed: std::sync::OnceLock::new(),
                standing,
                stepped_aside,
                reach,
                shutting_down: tokio::sync::Mutex::new(()),
                tasks: tasks.clone(),
                ephemeral_peer_port: cfg.ephemeral_peer_port,
            }),
        };
        let server = PeerServer {
            raft: raft.clone(),
            local: cfg.node_id,
            cluster_id: cfg.cluster_id.as_str().into(),
            tls: cfg.peer_tls.clone(),
            initial_cluster,
            refusals: super::paced::Paced::default(),
            strangers: super::paced::Paced::default(),
            standing: cluster.inner.standing.clone(),
        };
        cluster.critical(
            "the peer port",
            server.run(peer_listener, stop.clone(), tasks.clone()),
        );
        cluster.critical(
            "the batcher",
            batcher::run(cluster.clone(), queued, stop.clone()),
        );
        cluster.critical("the quorum watch", watch);
        {
            let cluster = cluster.clone();
            let watch = super::removal::watch(
                raft.clone(),
                removal_network,
                cfg.node_id,
                super::removal::grace(cfg.election_timeout.1),
                stop.clone(),
            );
            tasks.spawn(async move {
                if let Some(why) = watch.await {
                    cluster.leave(why);
                }
            });
        }
        if let Some(me) = to_record {
            let cluster = cluster.clone();
            tasks.spawn(async move { cluster.record_own_addresses(me).await });
        }
        // Not tracked: it calls shutdown, which waits for the tracked tasks.
        tokio::spawn(cluster.clone().supervise(shutdown));
        tracing::info!(node = cfg.node_id, data_dir = %dir.display(), fresh, "cluster node started");
        Ok(cluster)
    }

    /// Runs `task`, which the node cannot serve without: if it ends (or
    /// panics) before the node stops, the node fails with `what` named.
    fn critical<F>(&self, what: &'static str, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let inner = tokio::spawn(task);
        let cluster = self.clone();
        self.inner.tasks.spawn(async move {
            let ended = match inner.await {
                Err(e) if e.is_panic() => "panicked",
                _ => "stopped",
            };
            if !cluster.inner.stop.is_cancelled() {
                cluster.fail(format!("{what} {ended} while the node was serving"));
            }
        });
    }

    /// Stops the node when asked to from outside, when openraft stops on its
    /// own (a fatal storage error), or when a task it cannot serve without
    /// ends ([`Cluster::fail`]): logs why, then shuts down cleanly.
    /// Meanwhile counts each new leader this node learns of.
    async fn supervise(self, shutdown: CancellationToken) {
        // The server metrics, published only when the role or leader
        // changes (the full ones change at every turn of openraft's core,
        // and waking for each cost a wake-up per turn). openraft drops
        // their sender when its core stops, after it published why in the
        // full metrics.
        let mut server = self.inner.raft.server_metrics();
        let mut leader = None;
        let fatal = loop {
            let now_leads = server.borrow_and_update().current_leader;
            if now_leads.is_some() && now_leads != leader {
                crate::ops::metrics::leader_changed();
                leader = now_leads;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break None,
                _ = self.inner.failed.cancelled() => break self.failure(),
                _ = self.inner.stop.cancelled() => return,
                r = server.changed() => if r.is_err() {
                    break Some(match &self.inner.raft.metrics().borrow().running_state {
                        Err(fatal) => format!("the consensus engine stopped: {fatal}"),
                        Ok(()) => "the consensus engine stopped (its metrics ended)".into(),
                    });
                },
            }
        };
        if let Some(why) = fatal {
            if !self.inner.stop.is_cancelled() {
                let _ = self.inner.failure.set(why.clone());
                tracing::error!(node = self.inner.id, error = %why, "this node cannot serve and stops; the process exits so that a supervisor restarts it");
            }
        }
        self.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(client: &str, peer: &str) -> Member {
        Member {
            client_addr: client.into(),
            peer_addr: peer.into(),
        }
    }

    #[test]
    fn the_only_voter_records_a_moved_port_and_keeps_a_host_whose_port_stayed() {
        use std::collections::BTreeSet;
        let alone = openraft::Membership::new(
            vec![BTreeSet::from([1])],
            BTreeMap::from([(1, at("db1:7436", "127.0.0.1:39181"))]),
        );
        assert_eq!(
            own_addresses_to_record(1, &alone, &at("0.0.0.0:7436", "0.0.0.0:7437")),
            Some(at("db1:7436", "0.0.0.0:7437"))
        );
        assert_eq!(
            own_addresses_to_record(1, &alone, &at("0.0.0.0:7436", "0.0.0.0:39181")),
            None
        );
        // With another voter, it is dialled at the recorded address: the
        // record stays.
        let two = openraft::Membership::new(
            vec![BTreeSet::from([1, 2])],
            BTreeMap::from([
                (1, at("db1:7436", "127.0.0.1:39181")),
                (2, at("db2:7436", "db2:7437")),
            ]),
        );
        assert_eq!(
            own_addresses_to_record(1, &two, &at("db1:7436", "db1:7437")),
            None
        );
    }

    #[test]
    fn a_listed_host_may_differ_from_the_bound_one_but_not_a_port() {
        let listed = at("db1:7436", "db1:7437");
        assert_eq!(
            listed_elsewhere(1, &listed, &at("0.0.0.0:7436", "0.0.0.0:7437")),
            None
        );
        let why = listed_elsewhere(1, &listed, &at("0.0.0.0:7436", "0.0.0.0:7447"))
            .expect("another peer port");
        assert!(
            why.contains("peer address db1:7437") && why.contains("0.0.0.0:7447"),
            "{why}"
        );
        let why = listed_elsewhere(1, &listed, &at("0.0.0.0:7446", "0.0.0.0:7437"))
            .expect("another client port");
        assert!(why.contains("--listen"), "{why}");
    }
}
