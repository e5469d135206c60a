//! The cluster under attack: node processes, the proxies on the links
//! between them, which nodes a fault holds, who leads, and the faults
//! themselves (SIGKILL of the leader, of a follower, of a majority; SIGSTOP
//! of the leader; a rolling restart, SIGTERM and start again of every node
//! in turn; partitions: the leader cut off from its peers while the
//! clients still reach it, the leader's side of a split in the minority,
//! one direction of a link cut, a follower cut off; a follower's log file
//! cut short; the clients cut from the leader, silently or by resets; power
//! cuts of one node, of a minority, of the whole cluster at once, when the
//! nodes' logs are on a volatile disk), each healed after a random time.

use crate::workload::Workload;
use dlock::proto::ClusterInfo;
use dlock_server::testing::nodes::NodeProcesses;
use dlock_server::testing::peer_links::PeerLinks;
use dlock_server::testing::proxy::FreezableProxy;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How long a node may take to answer ClusterStatus before it counts as
/// unreachable (paused, dead, or starved).
const STATUS_PATIENCE: Duration = Duration::from_millis(500);

/// How often a fault looks for the leader that replaced the one it hit.
const LEADER_POLL: Duration = Duration::from_millis(50);

/// How long a node may take to exit on SIGTERM in a rolling restart: past
/// the nodes' own `--shutdown-timeout`, so a node that overruns it is
/// seen to exit non-zero rather than killed here.
const TERM_LIMIT: Duration = Duration::from_secs(20);

/// How long a node restarted in a rolling restart may take to catch up
/// (its lag 0 in the leader's ClusterStatus): an election, and the entries
/// written while it was down, on a loaded machine.
const CATCH_UP: Duration = Duration::from_secs(30);

/// How often a rolling restart asks whether the restarted node caught up,
/// or waits for the nodes other faults hold to be let go.
const CATCH_UP_POLL: Duration = Duration::from_millis(100);

/// The node processes, and which of them a fault holds now. The processes
/// sit behind a std mutex touched only by synchronous calls (restarts in
/// `spawn_blocking`), never across an `.await`.
pub struct Cluster {
    nodes: Mutex<NodeProcesses>,
    addrs: Vec<String>,
    /// The nodes' raft ids, copied out so that async code never waits for
    /// the process mutex a restart holds on a blocking thread (a worker
    /// thread waiting for it stalls every client of the run).
    ids: Vec<u64>,
    /// Per node: held by a fault (killed, paused or cut off, or about to
    /// be).
    claimed: Mutex<Vec<bool>>,
    /// The links between nodes, when partitions are on.
    links: Option<Links>,
}

/// A proxy on every directed link `from → to` (the connections `from`
/// dials to `to`: its requests and their answers), and how many faults
/// hold each frozen, so overlapping partitions heal only when the last
/// one does.
pub struct Links {
    proxies: PeerLinks,
    holds: Mutex<Vec<Vec<u32>>>,
    /// Per node, a proxy between the clients and its client port, which
    /// the membership names as the node's address: a client sent on to the
    /// leader goes through it too.
    clients: Vec<FreezableProxy>,
}

impl Links {
    /// Puts a proxy on every link of `nodes`, which must not run yet.
    pub async fn install(nodes: &mut NodeProcesses) -> Links {
        let n = nodes.len();
        let proxies = PeerLinks::install(nodes).await;
        let mut clients = Vec::with_capacity(n);
        for i in 0..n {
            let p = FreezableProxy::start(nodes.addr(i)).await;
            nodes.advertise_client(i, p.addr);
            clients.push(p);
        }
        Links {
            proxies,
            holds: Mutex::new(vec![vec![0; n]; n]),
            clients,
        }
    }

    /// Freezes (`cut`) or lets go of (`!cut`) each link `from → to`: nothing
    /// passes while any fault holds it; what was held back is delivered
    /// when the last lets go, as TCP does after a partition heals.
    fn hold(&self, links: &[(usize, usize)], cut: bool) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        for &(from, to) in links {
            let Some(p) = self.proxies.link(from, to) else {
                continue;
            };
            let h = &mut holds[from][to];
            if cut {
                *h += 1;
                if *h == 1 {
                    p.freeze();
                }
            } else if *h > 0 {
                *h -= 1;
                if *h == 0 {
                    p.thaw();
                }
            }
        }
    }
}

impl Links {
    /// Cuts the clients from node `i` (`silent`: their packets vanish;
    /// otherwise every connection is reset and new ones refused), or lets
    /// them through again.
    fn cut_clients(&self, i: usize, cut: bool, silent: bool) {
        let p = &self.clients[i];
        match (cut, silent) {
            (true, true) => p.freeze(),
            (true, false) => p.sever(),
            (false, true) => p.thaw(),
            (false, false) => p.heal(),
        }
    }

    /// Slows each link by `by` (zero: back to full speed).
    fn slow(&self, links: &[(usize, usize)], by: Duration) {
        for &(from, to) in links {
            if let Some(p) = self.proxies.link(from, to) {
                p.delay(by);
            }
        }
    }
}

/// Every link between a node of `side` and one outside it, both ways.
fn across(side: &[usize], n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &a in side {
        for b in (0..n).filter(|b| !side.contains(b)) {
            out.push((a, b));
            out.push((b, a));
        }
    }
    out
}

impl Cluster {
    pub fn new(nodes: NodeProcesses, links: Option<Links>) -> Cluster {
        let addrs = (0..nodes.len())
            .map(|i| nodes.addr(i).to_string())
            .collect();
        let ids = (0..nodes.len()).map(|i| nodes.id(i)).collect();
        Cluster {
            claimed: Mutex::new(vec![false; nodes.len()]),
            ids,
            nodes: Mutex::new(nodes),
            addrs,
            links,
        }
    }

    /// The node processes. Only from a blocking thread: a restart holds
    /// them while it waits for the node to listen.
    pub fn nodes(&self) -> MutexGuard<'_, NodeProcesses> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claimed(&self) -> MutexGuard<'_, Vec<bool>> {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The addresses clients are given: the proxies in front of the nodes
    /// when there are any, so that clients can be cut off.
    pub fn client_addrs(&self) -> String {
        match &self.links {
            Some(l) => l
                .clients
                .iter()
                .map(FreezableProxy::addr_string)
                .collect::<Vec<_>>()
                .join(","),
            None => self.addrs.join(","),
        }
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Node `i`'s view of the cluster, or `None` if it does not answer
    /// soon.
    pub async fn status(&self, i: usize) -> Option<ClusterInfo> {
        dlock_server::testing::nodes::cluster_status(&self.addrs[i], STATUS_PATIENCE).await
    }

    /// The node that says it leads, among those no fault holds and not
    /// `except`.
    async fn leader(&self, except: Option<usize>) -> Option<usize> {
        let free: Vec<usize> = {
            let claimed = self.claimed();
            (0..self.len())
                .filter(|&i| !claimed[i] && Some(i) != except)
                .collect()
        };
        self.leader_among(free).await
    }

    /// The first of `nodes` that says it leads, claimed or not.
    async fn leader_among(&self, nodes: impl IntoIterator<Item = usize>) -> Option<usize> {
        for i in nodes {
            if let Some(info) = self.status(i).await {
                if info.role.eq_ignore_ascii_case("leader") {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Waits until a node leads after leader `old` was stopped: another
    /// one, or `old` itself once `old_back` says it was started again (a
    /// stopping node may still call itself leader). Returns how long after
    /// `from` that was and whether it was `old`; `None` if no node led by
    /// `until`.
    async fn next_leader(
        &self,
        old: usize,
        old_back: Arc<AtomicBool>,
        from: Instant,
        until: Instant,
    ) -> Option<(Duration, bool)> {
        loop {
            let back = old_back.load(Ordering::Relaxed);
            let nodes = (0..self.len()).filter(|&i| i != old || back);
            if let Some(l) = self.leader_among(nodes).await {
                return Some((from.elapsed(), l == old));
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Waits until node `i` has caught up: the leader's ClusterStatus
    /// knows its replication and shows it 0 entries behind (or `i` leads,
    /// which it cannot without every committed entry). False if that did
    /// not happen by `until`.
    async fn caught_up(&self, i: usize, until: Instant) -> bool {
        let id = self.ids[i];
        loop {
            for j in 0..self.len() {
                let Some(s) = self.status(j).await else {
                    continue;
                };
                if !s.role.eq_ignore_ascii_case("leader") {
                    continue;
                }
                let level = j == i
                    || s.members
                        .iter()
                        .any(|m| m.node_id == id && m.replication_known && m.lag == 0);
                if level {
                    return true;
                }
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Claims every node once no fault holds any, checking every
    /// [`CATCH_UP_POLL`]; `None` if they were not all free by `until`.
    async fn claim_all(&self, until: Instant) -> Option<Vec<usize>> {
        loop {
            if let Some(all) = self.claim(None, self.len()) {
                return Some(all);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Claims `want` free nodes, `first` among them if given and free;
    /// `None` (nothing claimed) when there are not enough.
    fn claim(&self, first: Option<usize>, want: usize) -> Option<Vec<usize>> {
        let mut claimed = self.claimed();
        let mut got: Vec<usize> = first.filter(|&i| !claimed[i]).into_iter().collect();
        if first.is_some() && got.is_empty() {
            return None;
        }
        for i in 0..claimed.len() {
            if got.len() >= want {
                break;
            }
            if !claimed[i] && !got.contains(&i) {
                got.push(i);
            }
        }
        if got.len() < want {
            return None;
        }
        for &i in &got {
            claimed[i] = true;
        }
        Some(got)
    }

    fn release(&self, held: &[usize]) {
        let mut claimed = self.claimed();
        for &i in held {
            claimed[i] = false;
        }
    }
}

/// The kinds of fault, chosen in turn at random (`--faults` names them in
/// kebab case: `kill-leader`, `isolate-leader`, `rolling-restart`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// SIGKILL of the leader, restarted after 0.2 to 4 s.
    KillLeader,
    /// SIGKILL of a follower, restarted after 0.2 to 4 s.
    KillFollower,
    /// SIGKILL of a majority, the leader among it, restarted after 0.2 to
    /// 4 s.
    KillMajority,
    /// SIGSTOP of the leader for 3 election timeouts and up to a TTL.
    PauseLeader,
    /// The asymmetric partition: every peer link to and from the leader
    /// frozen, while the clients' proxies are left alone, so every client
    /// still reaches it. The leader must step aside (within twice the
    /// election timeout) so its clients move to the one the others elect.
    IsolateLeader,
    /// The leader and fewer than half the nodes cut from the rest (on 3
    /// nodes, the leader alone).
    SplitLeaderMinority,
    /// The leader's link to one follower frozen one way: its appends and
    /// heartbeats stop, the follower's own requests still get through.
    CutLeaderToFollower,
    /// Every link of one follower frozen.
    IsolateFollower,
    /// Every link to and from the leader slowed by 50 to 400 ms each way.
    SlowLeader,
    /// The clients' packets to and from the leader vanish (the leader
    /// and its peers see nothing wrong).
    CutClientsSilently,
    /// The clients' connections to the leader reset, new ones refused.
    ResetClients,
    /// A follower killed, its log file cut short, and started again: it
    /// must refuse with a clear message (or start and catch up); then the
    /// file is put back and it restarts.
    DamageFollowerLog,
    /// Every node in turn, followers first and then the leader: SIGTERM,
    /// a clean exit (status 0, a violation otherwise), a start on the same
    /// data, and a wait until the leader shows it caught up before the
    /// next. Waits for the other faults to heal and holds every node, so
    /// what it costs is its own.
    RollingRestart,
    /// A power cut of one node, the leader or a follower: SIGKILL of a node
    /// whose log keeps unsynced writes in its memory
    /// (`--test-volatile-disk`), so they are lost or torn; started again
    /// after 0.2 to 4 s.
    PowerCutNode,
    /// A power cut of fewer than half the nodes, the leader among them.
    PowerCutMinority,
    /// A power cut of the whole cluster at once: every node SIGKILLed in
    /// the same moment, then all started again. Waits for the other
    /// faults to heal, as it holds every node.
    PowerCutCluster,
}

/// How often each kind is drawn, in parts of the whole. The leader cut off
/// from its peers while its clients still reach it has two parts: it is
/// the fault a leader must notice by itself (nothing tells it but the
/// silence of its peers), and what it costs the clients is the point of
/// `--require-availability`.
const MIX: &[(Kind, u32)] = &[
    (Kind::KillLeader, 2),
    (Kind::KillFollower, 2),
    (Kind::DamageFollowerLog, 1),
    (Kind::KillMajority, 1),
    (Kind::PauseLeader, 3),
    (Kind::RollingRestart, 1),
    (Kind::IsolateLeader, 2),
    (Kind::SplitLeaderMinority, 1),
    (Kind::CutLeaderToFollower, 1),
    (Kind::SlowLeader, 1),
    (Kind::IsolateFollower, 1),
    (Kind::CutClientsSilently, 1),
    (Kind::ResetClients, 1),
    (Kind::PowerCutNode, 2),
    (Kind::PowerCutMinority, 1),
    (Kind::PowerCutCluster, 1),
];

/// The kinds a run may draw: those of `only` (every kind but the power
/// cuts when empty) that need no proxies unless `partitions`. Power cuts
/// are drawn only when named: they need nodes built with the `testing`
/// feature (`--test-volatile-disk`).
pub fn drawable(only: &[Kind], partitions: bool) -> Vec<(Kind, u32)> {
    MIX.iter()
        .copied()
        .filter(|(k, _)| partitions || !k.needs_proxies())
        .filter(|(k, _)| {
            if only.is_empty() {
                !k.is_power_cut()
            } else {
                only.contains(k)
            }
        })
        .collect()
}

/// Whether a cluster of one node (a single durable server) can take the
/// faults `only` names: a kill or a power cut of its node, nothing that
/// needs a follower or a peer link (`--no-partitions`).
pub fn lone_node_can_take(only: &[Kind], no_partitions: bool) -> bool {
    no_partitions
        && !only.is_empty()
        && only.iter().all(|k| {
            matches!(
                k,
                Kind::KillLeader | Kind::PowerCutNode | Kind::PowerCutCluster
            )
        })
}

/// One kind of `mix` at random, by its parts; `None` when `mix` is empty.
fn draw(rng: &mut fastrand::Rng, mix: &[(Kind, u32)]) -> Option<Kind> {
    let total: u32 = mix.iter().map(|(_, w)| w).sum();
    if total == 0 {
        return None;
    }
    let mut at = rng.u32(0..total);
    for &(k, w) in mix {
        if at < w {
            return Some(k);
        }
        at -= w;
    }
    None
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::KillLeader => "SIGKILL leader",
            Kind::KillFollower => "SIGKILL follower",
            Kind::KillMajority => "SIGKILL majority",
            Kind::PauseLeader => "SIGSTOP leader",
            Kind::IsolateLeader => "partition: leader cut off from its peers, clients reach it",
            Kind::SplitLeaderMinority => "partition: leader in the minority",
            Kind::CutLeaderToFollower => "partition: leader -> follower cut one way",
            Kind::IsolateFollower => "partition: follower isolated",
            Kind::SlowLeader => "links of the leader slowed",
            Kind::DamageFollowerLog => "follower's log file cut short",
            Kind::CutClientsSilently => "clients cut from the leader (silent)",
            Kind::ResetClients => "clients cut from the leader (reset)",
            Kind::RollingRestart => "rolling restart (SIGTERM each node in turn)",
            Kind::PowerCutNode => "power cut: one node",
            Kind::PowerCutMinority => "power cut: a minority, the leader among it",
            Kind::PowerCutCluster => "power cut: the whole cluster at once",
        }
    }

    /// Whether the fault is a power cut, which needs the nodes' logs on a
    /// volatile disk (`--test-volatile-disk`).
    pub fn is_power_cut(self) -> bool {
        matches!(
            self,
            Kind::PowerCutNode | Kind::PowerCutMinority | Kind::PowerCutCluster
        )
    }

    /// Whether the fault works through the proxies, which
    /// `--no-partitions` leaves out.
    fn needs_proxies(self) -> bool {
        self.is_partition() || self.cuts_clients()
    }

    /// How many of the `claimed` nodes the fault takes from the majority
    /// the clients can use (down, paused, or cut from their peers), for
    /// judging availability.
    fn out(self, claimed: usize) -> usize {
        match self {
            // Latency only; the clients' cut is judged by itself.
            Kind::SlowLeader | Kind::CutClientsSilently | Kind::ResetClients => 0,
            // The follower that hears the leader no more; the leader keeps
            // the rest.
            Kind::CutLeaderToFollower => 1,
            // One node at a time.
            Kind::RollingRestart => 1,
            _ => claimed,
        }
    }

    /// Whether the fault hits the leader first, so a failover is measured.
    fn hits_leader(self) -> bool {
        matches!(
            self,
            Kind::KillLeader
                | Kind::PauseLeader
                | Kind::IsolateLeader
                | Kind::SplitLeaderMinority
                | Kind::PowerCutMinority
        )
    }

    fn is_partition(self) -> bool {
        matches!(
            self,
            Kind::IsolateLeader
                | Kind::SplitLeaderMinority
                | Kind::CutLeaderToFollower
                | Kind::IsolateFollower
                | Kind::SlowLeader
        )
    }

    /// Whether the fault may legitimately cost a session its life: it cuts
    /// clients from the leader, or may end the leader's term (a failover
    /// takes about as long as the clients' 3 s TTL, which a client counts
    /// from its last answer). A follower killed or given a damaged log
    /// does neither: the leader keeps a majority and its clients.
    fn may_cost_sessions(self) -> bool {
        !matches!(self, Kind::KillFollower | Kind::DamageFollowerLog)
    }

    fn cuts_clients(self) -> bool {
        matches!(self, Kind::CutClientsSilently | Kind::ResetClients)
    }
}

/// Starts faults of the kinds `only` names (every kind when empty) about
/// every `every` (at random, between none and twice that apart), at most
/// `max` at once, until the run's deadline; waits for those in progress to
/// heal.
pub async fn schedule(
    sh: Arc<Workload>,
    cluster: Arc<Cluster>,
    every: Duration,
    max: usize,
    only: Vec<Kind>,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mix = drawable(&only, cluster.links.is_some());
    let limit = Arc::new(tokio::sync::Semaphore::new(max));
    let mut set = tokio::task::JoinSet::new();
    loop {
        let pause = every.mul_f64(rng.f64() * 2.0);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = tokio::time::sleep_until(sh.faults_until) => break,
        }
        while set.try_join_next().is_some() {}
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let Some(kind) = draw(&mut rng, &mix) else {
            // `run` refuses a choice of kinds none of which can be drawn.
            break;
        };
        let leader = cluster.leader(None).await;
        let n = cluster.len();
        let follower = |rng: &mut fastrand::Rng| {
            let followers: Vec<usize> = (0..n).filter(|&i| Some(i) != leader).collect();
            followers[rng.usize(..followers.len())]
        };
        let claimed = match kind {
            Kind::KillLeader
            | Kind::PauseLeader
            | Kind::IsolateLeader
            | Kind::SlowLeader
            | Kind::CutClientsSilently
            | Kind::ResetClients => leader.and_then(|l| cluster.claim(Some(l), 1)),
            Kind::KillFollower | Kind::IsolateFollower | Kind::DamageFollowerLog => {
                cluster.claim(Some(follower(&mut rng)), 1)
            }
            Kind::KillMajority => cluster.claim(leader, n / 2 + 1),
            Kind::PowerCutNode => {
                let i = rng.usize(..n);
                cluster.claim(Some(i), 1)
            }
            Kind::PowerCutMinority => leader.and_then(|l| cluster.claim(Some(l), (n - 1) / 2)),
            Kind::PowerCutCluster => cluster.claim_all(sh.faults_until).await,
            // Every node, once the other faults have healed: no turn is
            // skipped for it, and what it costs is its own.
            Kind::RollingRestart => cluster.claim_all(sh.faults_until).await,
            Kind::SplitLeaderMinority => leader.and_then(|l| cluster.claim(Some(l), (n - 1) / 2)),
            // The leader first, then the follower it is cut from.
            Kind::CutLeaderToFollower => leader.and_then(|l| {
                let f = follower(&mut rng);
                let got = cluster.claim(Some(l), 1)?;
                match cluster.claim(Some(f), 1) {
                    Some(more) => Some([got, more].concat()),
                    None => {
                        cluster.release(&got);
                        None
                    }
                }
            }),
        };
        let Some(nodes) = claimed else {
            sh.counts.bump("fault skipped (no leader or nodes busy)");
            continue;
        };
        let heal_after = match kind {
            // As long as a pause, so a cut-off leader is often replaced and
            // sometimes outlives its clients' sessions.
            Kind::IsolateLeader | Kind::SplitLeaderMinority => {
                sh.election_timeout.mul_f64(3.0 * rng.f64()) + sh.session_ttl.mul_f64(rng.f64())
            }
            // Past an election (a follower waits one to two election
            // timeouts before it stands, and its vote may be refused while
            // the old leader's lease lasts: about 3.5 s in all with 1 s
            // timeouts on a loaded machine), and half the time past the
            // TTL of the clients' sessions.
            Kind::PauseLeader => {
                sh.election_timeout.mul_f64(3.0) + sh.session_ttl.mul_f64(rng.f64())
            }
            _ => Duration::from_millis(rng.u64(200..4_000)),
        };
        if matches!(kind, Kind::PauseLeader) && heal_after > sh.session_ttl {
            sh.counts.bump("SIGSTOP leader past the session TTL");
        }
        // How much of a damaged log file is kept.
        let fraction = rng.f64();
        let (sh, cluster) = (sh.clone(), cluster.clone());
        set.spawn(async move {
            let disrupts = kind.may_cost_sessions();
            if disrupts {
                sh.disruption_began();
            }
            let timeline = sh.availability.fault_began(
                kind.name(),
                kind.out(nodes.len()),
                kind.cuts_clients(),
            );
            run_fault(kind, &nodes, heal_after, fraction, &sh, &cluster).await;
            sh.availability.fault_healed(timeline);
            if disrupts {
                sh.disruption_healed();
            }
            cluster.release(&nodes);
            drop(permit);
        });
    }
    while set.join_next().await.is_some() {}
    // Every fault has healed. Sessions that were already doomed may still
    // end within a TTL, and a node that was cut off may force one more
    // election when it returns: past that, the cluster is whole.
    let settled = Instant::now() + sh.session_ttl + sh.election_timeout * 4;
    *sh.calm_from.lock().unwrap_or_else(|p| p.into_inner()) = Some(settled);
}

/// Does one fault on `nodes` (claimed), measures the failover when it hit
/// the leader, and heals it after `heal_after`.
async fn run_fault(
    kind: Kind,
    nodes: &[usize],
    heal_after: Duration,
    fraction: f64,
    sh: &Workload,
    cluster: &Arc<Cluster>,
) {
    sh.report.fault(kind.name());
    if let Kind::RollingRestart = kind {
        rolling_restart(nodes, fraction, sh, cluster).await;
        return;
    }
    let began = Instant::now();
    let heal_at = began + heal_after;
    let pause = matches!(kind, Kind::PauseLeader);
    let cut = partition(kind, nodes, cluster.len());
    let mut saved = None;
    if let Kind::DamageFollowerLog = kind {
        let i = nodes[0];
        match with_nodes_value(cluster, move |n| damage_log(n, i, fraction)).await {
            Some(Ok((whole, outcome))) => {
                sh.counts.bump(outcome);
                saved = Some(whole);
            }
            Some(Err(why)) => sh.report.violation("damaged log", why),
            None => sh.report.violation("fault failed", kind.name().to_string()),
        }
    } else if let (true, Some(links)) = (kind.cuts_clients(), &cluster.links) {
        links.cut_clients(nodes[0], true, matches!(kind, Kind::CutClientsSilently));
    } else if let (Kind::SlowLeader, Some(links)) = (kind, &cluster.links) {
        links.slow(&cut, Duration::from_millis(50 + (fraction * 350.0) as u64));
    } else if kind.is_partition() {
        if let Some(links) = &cluster.links {
            links.hold(&cut, true);
        }
    } else {
        let hit = nodes.to_vec();
        let done = with_nodes(cluster, move |n| {
            for i in hit {
                if pause {
                    n.pause(i);
                } else {
                    n.kill(i);
                }
            }
        })
        .await;
        if !done {
            sh.report.violation("fault failed", kind.name().to_string());
        }
    }
    if kind.hits_leader() {
        let old = nodes[0];
        loop {
            if Instant::now() >= heal_at {
                sh.counts.bump("no new leader before the heal");
                break;
            }
            if cluster.leader(Some(old)).await.is_some() {
                sh.failovers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(began.elapsed());
                break;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }
    tokio::time::sleep_until(heal_at).await;
    if let Some(whole) = saved {
        let (i, file) = (nodes[0], whole.0);
        let back = with_nodes_value(cluster, move |n| {
            std::fs::write(&file, whole.1)
                .map_err(|e| e.to_string())
                .and_then(|()| n.try_restart(i))
        })
        .await;
        match back {
            Some(Ok(())) => {}
            Some(Err(why)) => sh.report.violation(
                "node did not come back",
                format!("with its log restored: {why}"),
            ),
            None => sh
                .report
                .violation("node did not come back", "with its log restored".into()),
        }
        in_step(nodes, sh, cluster).await;
        return;
    }
    if let (true, Some(links)) = (kind.cuts_clients(), &cluster.links) {
        links.cut_clients(nodes[0], false, matches!(kind, Kind::CutClientsSilently));
        return;
    }
    if let (Kind::SlowLeader, Some(links)) = (kind, &cluster.links) {
        links.slow(&cut, Duration::ZERO);
        return;
    }
    if kind.is_partition() {
        if let Some(links) = &cluster.links {
            links.hold(&cut, false);
        }
        return;
    }
    if kind.is_power_cut() {
        let hit = nodes.to_vec();
        let torn = with_nodes_value(cluster, move |n| {
            hit.into_iter()
                .filter(|&i| {
                    n.restart(i);
                    dropped_a_torn_tail(&n.recent_log(i))
                })
                .count()
        })
        .await;
        match torn {
            Some(torn) => {
                for _ in nodes {
                    sh.counts.bump("power cut: nodes restarted");
                }
                for _ in 0..torn {
                    sh.counts
                        .bump("power cut: a torn log tail dropped at the restart");
                }
            }
            None => sh
                .report
                .violation("node did not come back", format!("after {}", kind.name())),
        }
        in_step(nodes, sh, cluster).await;
        return;
    }
    let hit = nodes.to_vec();
    let healed = with_nodes(cluster, move |n| {
        for i in hit {
            if pause {
                n.resume(i);
            } else {
                n.restart(i);
            }
        }
    })
    .await;
    if !healed {
        sh.report
            .violation("node did not come back", format!("after {}", kind.name()));
    }
    in_step(nodes, sh, cluster).await;
}

/// Waits until every node of `nodes`, just restarted or resumed, has
/// caught up with the leader, so the fault counts as taking them out of
/// the majority until then. A node that is starting, or whose replication
/// the leader is still backing off from, cannot help commit: if another
/// fault took the other follower of three meanwhile, the leader could
/// keep no session alive, and the run must not owe them. Bounded by the
/// run's end; a node still behind then is counted, not judged (a fault
/// in progress elsewhere may be what holds it back).
async fn in_step(nodes: &[usize], sh: &Workload, cluster: &Arc<Cluster>) {
    let until = (Instant::now() + CATCH_UP).min(sh.stop_at);
    for &i in nodes {
        if !cluster.caught_up(i, until).await {
            sh.counts
                .bump("node not caught up within 30 s of its restart");
        }
    }
}

/// Whether a node's log since its latest start (the volatile disk's line
/// opens every start) says it dropped a write cut short at the end of its
/// raft log: the power cut tore what it had not synced.
fn dropped_a_torn_tail(log: &[String]) -> bool {
    let start = log
        .iter()
        .rposition(|l| l.contains("--test-volatile-disk"))
        .unwrap_or(0);
    log[start..]
        .iter()
        .any(|l| l.contains("ends in a write cut short"))
}

/// Restarts every node of `nodes` (all of them, claimed) in turn, as an
/// operator upgrading the cluster would (docs/CLUSTER.md, "Upgrading"):
/// followers first, in an order `fraction` picks, then whoever leads when
/// its turn comes. Each gets SIGTERM and must exit 0; it stays down for up
/// to 5 election timeouts (as installing a binary might take), is started
/// again on its data and must catch up before the next one's turn. A
/// leader back within about 3 election timeouts is usually elected again
/// (its followers still honour its term, and openraft restores a leader
/// whose vote was committed); later, one of the others has taken over:
/// the draw covers both. A node that does not come back or catch up ends
/// the restart there (a violation), as an operator would stop.
async fn rolling_restart(nodes: &[usize], fraction: f64, sh: &Workload, cluster: &Arc<Cluster>) {
    let mut left = nodes.to_vec();
    if left.is_empty() {
        return;
    }
    let turn = ((fraction * left.len() as f64) as usize).min(left.len() - 1);
    left.rotate_left(turn);
    // Drawn here, from the run's seed through `fraction`, so a replay
    // with the same seed stops the nodes for the same times.
    let mut rng = fastrand::Rng::with_seed(fraction.to_bits());
    while !left.is_empty() {
        let leader = cluster.leader_among(0..cluster.len()).await;
        let next = left.iter().position(|&i| Some(i) != leader).unwrap_or(0);
        let i = left.remove(next);
        let began = Instant::now();
        // The next leader is watched for while the leader stops: stepping
        // aside on SIGTERM (its heartbeats off), it lets the others elect
        // one once their election timeout runs out, or it is elected again
        // itself if it is back first.
        let back = Arc::new(AtomicBool::new(false));
        let handover = (Some(i) == leader).then(|| {
            let (c, back) = (cluster.clone(), back.clone());
            tokio::spawn(async move { c.next_leader(i, back, began, began + CATCH_UP).await })
        });
        let exit = with_nodes_value(cluster, move |n| n.terminate(i, TERM_LIMIT)).await;
        let node = i + 1;
        match exit {
            Some(Some(status)) if status.success() => {}
            Some(Some(status)) => sh.report.violation(
                "rolling restart: exit not 0 on SIGTERM",
                format!("node {node}: {status}"),
            ),
            Some(None) => sh.report.violation(
                "rolling restart: no exit on SIGTERM",
                format!("node {node} was not running, or did not exit within {TERM_LIMIT:?} and was killed"),
            ),
            None => sh
                .report
                .violation("fault failed", format!("SIGTERM to node {node}")),
        }
        tokio::time::sleep(sh.election_timeout.mul_f64(5.0 * rng.f64())).await;
        let restarted = with_nodes_value(cluster, move |n| n.try_restart(i)).await;
        match restarted {
            Some(Ok(())) => back.store(true, Ordering::Relaxed),
            Some(Err(why)) => {
                sh.report.violation(
                    "node did not come back",
                    format!("after SIGTERM in a rolling restart: {why}"),
                );
                return;
            }
            None => {
                sh.report.violation(
                    "node did not come back",
                    format!("node {node}, after SIGTERM in a rolling restart"),
                );
                return;
            }
        }
        if !cluster.caught_up(i, Instant::now() + CATCH_UP).await {
            sh.report.violation(
                "rolling restart: node did not catch up",
                format!(
                    "node {node}: not 0 entries behind the leader within {CATCH_UP:?} of its start"
                ),
            );
            return;
        }
        sh.counts
            .bump("rolling restart: nodes restarted and caught up");
        sh.restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(began.elapsed());
        if let Some(h) = handover {
            match h.await {
                Ok(Some((after, again))) => {
                    if again {
                        sh.counts
                            .bump("rolling restart: the stopped leader led again");
                    }
                    sh.handovers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(after);
                }
                _ => sh
                    .counts
                    .bump("rolling restart: no leader after the leader's SIGTERM"),
            }
        }
    }
}

/// The links a partition freezes: `nodes` are those it claimed, the
/// leader first where it hits the leader.
fn partition(kind: Kind, nodes: &[usize], n: usize) -> Vec<(usize, usize)> {
    match kind {
        Kind::IsolateLeader
        | Kind::SplitLeaderMinority
        | Kind::IsolateFollower
        | Kind::SlowLeader => across(nodes, n),
        Kind::CutLeaderToFollower => vec![(nodes[0], nodes[1])],
        _ => Vec::new(),
    }
}

/// Kills node `i`, keeps the file its log was last written to, cuts it to `fraction` of its length
/// and starts the node on it. A refusal that names the damage, or a start
/// (the node then catches up, or the final checks find it did not), is
/// fine; the node is stopped again either way, and the whole file returned
/// to be put back at the heal. Any other outcome is an `Err`.
fn damage_log(
    n: &mut NodeProcesses,
    i: usize,
    fraction: f64,
) -> Result<((PathBuf, Vec<u8>), &'static str), String> {
    n.kill(i);
    let file = n
        .log_file(i)
        .ok_or_else(|| format!("node {i} has no raft log file"))?;
    let whole = std::fs::read(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let cut = ((whole.len() as f64) * fraction) as usize;
    std::fs::write(&file, &whole[..cut.min(whole.len())])
        .map_err(|e| format!("cut {}: {e}", file.display()))?;
    let outcome = match n.try_restart(i) {
        Err(why) if why.contains("is damaged") || why.contains("cannot open") => {
            "damaged log: start refused"
        }
        Err(why) => {
            // Put the file back before reporting, so the run can go on.
            let _ = std::fs::write(&file, &whole);
            return Err(format!(
                "cut to {cut} bytes, the refusal does not say why: {why}"
            ));
        }
        Ok(()) => {
            n.kill(i);
            "damaged log: started anyway"
        }
    };
    Ok(((file, whole), outcome))
}

/// [`with_nodes`] for a closure that returns something; `None` if it
/// panicked.
async fn with_nodes_value<T: Send + 'static>(
    cluster: &Arc<Cluster>,
    f: impl FnOnce(&mut NodeProcesses) -> T + Send + 'static,
) -> Option<T> {
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || f(&mut c.nodes()))
        .await
        .ok()
}

/// Runs `f` on the node processes on a blocking thread (a restart waits
/// for the node to listen); false if it panicked (a node did not start).
async fn with_nodes(
    cluster: &Arc<Cluster>,
    f: impl FnOnce(&mut NodeProcesses) + Send + 'static,
) -> bool {
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || f(&mut c.nodes()))
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each kind comes out of `mix` in `n` draws.
    fn tally(mix: &[(Kind, u32)], n: u32) -> Vec<(Kind, u32)> {
        let mut rng = fastrand::Rng::with_seed(1);
        let mut seen: Vec<(Kind, u32)> = mix.iter().map(|&(k, _)| (k, 0)).collect();
        for _ in 0..n {
            let Some(k) = draw(&mut rng, mix) else {
                panic!("nothing drawn from {mix:?}");
            };
            if let Some(slot) = seen.iter_mut().find(|(s, _)| *s == k) {
                slot.1 += 1;
            }
        }
        seen
    }

    #[test]
    fn every_kind_is_drawn_about_as_often_as_its_parts_say() {
        let mix = drawable(&[], true);
        let power_cuts = MIX.iter().filter(|(k, _)| k.is_power_cut()).count();
        assert_eq!(mix.len(), MIX.len() - power_cuts);
        let total: u32 = mix.iter().map(|(_, w)| w).sum();
        let n = 100_000;
        for ((kind, got), (_, parts)) in tally(&mix, n).into_iter().zip(&mix) {
            let want = f64::from(n) * f64::from(*parts) / f64::from(total);
            let off = (f64::from(got) - want).abs() / want;
            assert!(off < 0.1, "{kind:?}: {got} draws, {want:.0} expected");
        }
    }

    #[test]
    fn without_proxies_no_partition_is_drawn_but_the_rolling_restart_is() {
        let mix = drawable(&[], false);
        assert!(mix.iter().all(|(k, _)| !k.needs_proxies()), "{mix:?}");
        assert!(mix.iter().any(|(k, _)| *k == Kind::RollingRestart));
        assert!(drawable(&[Kind::IsolateLeader], false).is_empty());
    }

    #[test]
    fn a_lone_node_takes_only_kills_and_power_cuts_without_proxies() {
        let lone = [Kind::PowerCutNode, Kind::PowerCutCluster, Kind::KillLeader];
        assert!(lone_node_can_take(&lone, true));
        assert!(!lone_node_can_take(&lone, false), "proxies need peers");
        assert!(
            !lone_node_can_take(&[], true),
            "the default mix needs followers"
        );
        assert!(!lone_node_can_take(&[Kind::KillFollower], true));
    }

    #[test]
    fn power_cuts_are_drawn_only_when_named() {
        assert!(drawable(&[], true).iter().all(|(k, _)| !k.is_power_cut()));
        let named = drawable(&[Kind::PowerCutCluster, Kind::KillLeader], false);
        assert!(named.iter().any(|(k, _)| *k == Kind::PowerCutCluster));
    }

    #[test]
    fn a_torn_tail_is_seen_only_in_the_latest_start() {
        let line = |s: &str| s.to_owned();
        let earlier = [
            line("WARN --test-volatile-disk: ..."),
            line("WARN the raft log ends in a write cut short (the node stopped mid-write)"),
            line("WARN --test-volatile-disk: ..."),
            line("INFO listening"),
        ];
        assert!(!dropped_a_torn_tail(&earlier));
        assert!(dropped_a_torn_tail(&earlier[..2]));
    }

    #[test]
    fn the_faults_named_are_the_only_ones_drawn() {
        let only = [Kind::IsolateLeader, Kind::RollingRestart];
        let mix = drawable(&only, true);
        for (kind, got) in tally(&mix, 1_000) {
            assert!(only.contains(&kind) && got > 0, "{kind:?}: {got}");
        }
    }
}
