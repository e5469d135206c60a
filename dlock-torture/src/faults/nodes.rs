//! The cluster under attack: node processes, the proxies on the links
//! between them, which nodes a fault holds, who leads, and the faults
//! themselves (SIGKILL of the leader, of a follower, of a majority; SIGSTOP
//! of the leader; partitions: the leader isolated, the leader's side of a
//! split in the minority, one direction of a link cut, a follower cut off;
//! a follower's log file cut short; the clients cut from the leader, silently
//! or by resets), each healed after a random time.

use crate::workload::Workload;
use dlock::proto::ClusterInfo;
use dlock_server::testing::nodes::NodeProcesses;
use dlock_server::testing::peer_links::PeerLinks;
use dlock_server::testing::proxy::FreezableProxy;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How long a node may take to answer ClusterStatus before it counts as
/// unreachable (paused, dead, or starved).
const STATUS_PATIENCE: Duration = Duration::from_millis(500);

/// How often a fault looks for the leader that replaced the one it hit.
const LEADER_POLL: Duration = Duration::from_millis(50);

/// The node processes, and which of them a fault holds now. The processes
/// sit behind a std mutex touched only by synchronous calls (restarts in
/// `spawn_blocking`), never across an `.await`.
pub struct Cluster {
    nodes: Mutex<NodeProcesses>,
    addrs: Vec<String>,
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
        Cluster {
            claimed: Mutex::new(vec![false; nodes.len()]),
            nodes: Mutex::new(nodes),
            addrs,
            links,
        }
    }

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
        for i in free {
            if let Some(info) = self.status(i).await {
                if info.role.eq_ignore_ascii_case("leader") {
                    return Some(i);
                }
            }
        }
        None
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

/// The kinds of fault, chosen in turn at random.
#[derive(Debug, Clone, Copy)]
enum Kind {
    KillLeader,
    KillFollower,
    KillMajority,
    PauseLeader,
    /// Every link to and from the leader frozen.
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
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::KillLeader => "SIGKILL leader",
            Kind::KillFollower => "SIGKILL follower",
            Kind::KillMajority => "SIGKILL majority",
            Kind::PauseLeader => "SIGSTOP leader",
            Kind::IsolateLeader => "partition: leader isolated",
            Kind::SplitLeaderMinority => "partition: leader in the minority",
            Kind::CutLeaderToFollower => "partition: leader -> follower cut one way",
            Kind::IsolateFollower => "partition: follower isolated",
            Kind::SlowLeader => "links of the leader slowed",
            Kind::DamageFollowerLog => "follower's log file cut short",
            Kind::CutClientsSilently => "clients cut from the leader (silent)",
            Kind::ResetClients => "clients cut from the leader (reset)",
        }
    }

    /// Whether the fault hits the leader first, so a failover is measured.
    fn hits_leader(self) -> bool {
        matches!(
            self,
            Kind::KillLeader | Kind::PauseLeader | Kind::IsolateLeader | Kind::SplitLeaderMinority
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

/// Starts faults about every `every` (at random, between none and twice
/// that apart), at most `max` at once, until the run's deadline; waits for
/// those in progress to heal.
pub async fn schedule(
    sh: Arc<Workload>,
    cluster: Arc<Cluster>,
    every: Duration,
    max: usize,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
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
        let kinds = if cluster.links.is_some() { 16 } else { 9 };
        let kind = match rng.u8(0..kinds) {
            0..=1 => Kind::KillLeader,
            2 => Kind::KillFollower,
            3 => Kind::DamageFollowerLog,
            4 => Kind::KillMajority,
            5..=7 => Kind::PauseLeader,
            8 => Kind::KillFollower,
            9 => Kind::IsolateLeader,
            10 => Kind::SplitLeaderMinority,
            11 => Kind::CutLeaderToFollower,
            12 => Kind::SlowLeader,
            13 => Kind::IsolateFollower,
            14 => Kind::CutClientsSilently,
            _ => Kind::ResetClients,
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
            run_fault(kind, &nodes, heal_after, fraction, &sh, &cluster).await;
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
