//! A torture run against a cluster of node processes (`--cluster N`): start
//! the nodes, run honest clients while faults kill and pause them, then
//! heal, and check the history and that every node ends in the same empty
//! state, without a panic, exiting 0 on SIGTERM.

use crate::cli::Args;
use crate::cluster_faults::{self, Cluster, Links};
use crate::cluster_honest;
use crate::history::{History, Register};
use crate::report::Report;
use anyhow::Context;
use dlock::{Client, ClientOptions};
use dlock_server::testing::nodes::NodeProcesses;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// After every client left: the longest a no-lease lock outlives its
/// session (the TTL), the longest lease, and slack for a last election.
const DRAIN_SLACK: Duration = Duration::from_secs(20);

/// The longest lease the honest clients take (see `cluster_honest`).
const MAX_LEASE: Duration = Duration::from_secs(3);

/// How long the nodes may take to agree on the applied index once the
/// cluster is empty.
const CONVERGE: Duration = Duration::from_secs(20);

/// How long a node may take to exit on SIGTERM.
const TERM_LIMIT: Duration = Duration::from_secs(20);

/// What every task of a cluster run shares.
pub struct ClusterWorkload {
    pub servers: String,
    pub keys: Vec<String>,
    pub register: Register,
    pub history: History,
    pub report: Report,
    pub counts: Counts,
    /// From a fault on the leader to another node saying it leads.
    pub failovers: Mutex<Vec<Duration>>,
    /// How long clients' sessions went without a connection.
    pub resumes: Mutex<Vec<Duration>>,
    pub stop_at: Instant,
    /// No fault starts after this: the end of the run is calm.
    pub faults_until: Instant,
    /// Set once every fault has healed and the cluster had time to settle:
    /// from then on every node is up and reachable, so a session lost is a
    /// violation, not a count.
    pub calm_from: Mutex<Option<Instant>>,
    /// Faults that may cost a session its life in progress, and when the
    /// last one to heal has settled: see [`ClusterWorkload::sessions_owed`].
    pub disrupted: Mutex<(u32, Instant)>,
    pub session_ttl: Duration,
    pub election_timeout: Duration,
}

/// Named counts of things that are not violations but say what happened.
#[derive(Default)]
pub struct Counts(Mutex<BTreeMap<&'static str, u64>>);

impl Counts {
    pub fn bump(&self, what: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what)
            .or_default() += 1;
    }

    fn lines(&self) -> Vec<(&'static str, u64)> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// The `dlock-server` binary: `--server-bin`, or the one beside this
/// program (where cargo builds both).
fn server_bin(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(b) = &args.server_bin {
        return Ok(b.clone());
    }
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let bin = exe
        .parent()
        .map(|d| d.join("dlock-server"))
        .context("this program has no directory")?;
    if !bin.exists() {
        anyhow::bail!(
            "{} is missing: build it (cargo build -p dlock-server) or pass --server-bin",
            bin.display()
        );
    }
    Ok(bin)
}

/// Runs the cluster torture; `Ok(true)` when no violation was found.
pub async fn run(args: Args, nodes: u64) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!("dlock-torture: cluster of {nodes}, seed {seed}");
    let bin = server_bin(&args)?;
    let flags = [
        "--heartbeat".to_string(),
        dlock::duration::format(args.heartbeat),
        "--election-timeout".to_string(),
        dlock::duration::format(args.election_timeout),
        "--log-level".to_string(),
        "info".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut procs = NodeProcesses::prepare(bin, nodes, &flags);
    let skewed = args.clock_nodes.min(nodes);
    let rate = args.clock_rate.to_string();
    for i in 0..skewed {
        procs.node_flags(i as usize, &["--test-clock-rate", &rate]);
    }
    let links = if args.no_partitions {
        None
    } else {
        Some(Links::install(&mut procs).await)
    };
    let procs = tokio::task::spawn_blocking(move || {
        procs.start_all();
        procs
    })
    .await
    .context("the nodes did not start")?;
    let cluster = Arc::new(Cluster::new(procs, links));
    let began = std::time::Instant::now();
    let sh = Arc::new(ClusterWorkload {
        servers: cluster.client_addrs(),
        keys: (0..args.keys).map(|i| format!("key-{i}")).collect(),
        register: Register::default(),
        history: History::default(),
        report: Report::default(),
        counts: Counts::default(),
        failovers: Mutex::new(Vec::new()),
        resumes: Mutex::new(Vec::new()),
        stop_at: Instant::now() + args.duration,
        faults_until: Instant::now() + args.duration - calm_length(args.duration),
        calm_from: Mutex::new(None),
        // A fresh cluster elects its first leader meanwhile.
        disrupted: Mutex::new((0, Instant::now() + args.election_timeout * 4)),
        session_ttl: args.session_ttl,
        election_timeout: args.election_timeout,
    });

    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..u64::from(args.clients) {
        tasks.spawn(cluster_honest::run(
            c,
            sh.clone(),
            seed ^ c.wrapping_mul(0x9e37_79b9),
        ));
    }
    let faults = tokio::spawn(cluster_faults::schedule(
        sh.clone(),
        cluster.clone(),
        args.fault_every,
        args.max_faults as usize,
        seed,
    ));
    while tasks.join_next().await.is_some() {}
    if faults.await.is_err() {
        sh.report.violation("fault scheduler failed", String::new());
    }
    let workload = began.elapsed();

    let (overlaps, examples) = sh.history.check();
    sh.report
        .violations_n("history (overlap or fence order)", overlaps, examples);
    let drained = await_empty(&sh).await;
    let converged = await_same_applied(&sh, &cluster).await;
    stop_nodes(&sh, &cluster).await;

    let mut header = vec![
        ("seed", seed.to_string()),
        ("nodes", nodes.to_string()),
        ("clients", args.clients.to_string()),
        ("keys", args.keys.to_string()),
        ("clock rate", clock_line(args.clock_rate, skewed, nodes)),
        ("workload", format!("{:.1}s", workload.as_secs_f64())),
        ("total", format!("{:.1}s", began.elapsed().as_secs_f64())),
        ("holds checked", sh.history.len().to_string()),
        ("cluster empty after", drained),
        ("same applied index", converged),
        ("failovers", spread(&sh.failovers)),
        ("sessions resumed after", spread(&sh.resumes)),
        ("calm end checked", sh.calm_checked()),
    ];
    let counts = sh.counts.lines();
    header.extend(counts.iter().map(|(k, v)| (*k, v.to_string())));
    print!("{}", sh.report.summary(&header));
    Ok(sh.report.violation_count() == 0)
}

/// Which nodes' clocks run at what rate, for the summary.
fn clock_line(rate: f64, skewed: u64, nodes: u64) -> String {
    if skewed == 0 || rate == 1.0 {
        return "exact on every node".into();
    }
    let who = match skewed {
        1 => "node 1".to_string(),
        n if n >= nodes => "every node".to_string(),
        n => format!("nodes 1-{n}"),
    };
    format!("{rate}x real time on {who}")
}

/// The fault-free end of a run: a third of it, at most 30 s.
fn calm_length(run: Duration) -> Duration {
    (run / 3).min(Duration::from_secs(30))
}

impl ClusterWorkload {
    /// Whether the cluster owes every client its session now: no fault
    /// that can cut a client from the leader (or end the leader's term) is
    /// in progress or settling, so a majority with the leader has been up
    /// and reachable from every client for a TTL and a few elections. Only
    /// followers may be down (killed, their log damaged). Always so in the
    /// calm end.
    pub fn sessions_owed(&self) -> bool {
        let calm = self
            .calm_from
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() >= t);
        let (active, settles) = *self.disrupted.lock().unwrap_or_else(|p| p.into_inner());
        calm || (active == 0 && Instant::now() >= settles)
    }

    /// A fault that may cost sessions starts.
    pub fn disruption_began(&self) {
        self.disrupted.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    /// Such a fault healed: sessions it doomed may still end within a TTL,
    /// and the cluster may need elections to settle.
    pub fn disruption_healed(&self) {
        let settled = Instant::now() + self.session_ttl + self.election_timeout * 4;
        let mut d = self.disrupted.lock().unwrap_or_else(|p| p.into_inner());
        d.0 = d.0.saturating_sub(1);
        d.1 = d.1.max(settled);
    }

    /// How long the calm lasted, for the summary.
    fn calm_checked(&self) -> String {
        match *self.calm_from.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(t) if t < self.stop_at => {
                format!("{:.1}s", (self.stop_at - t).as_secs_f64())
            }
            _ => "none (the faults healed too late)".into(),
        }
    }
}

/// "n, p50 .., max .." of some durations.
fn spread(d: &Mutex<Vec<Duration>>) -> String {
    let mut d = d.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if d.is_empty() {
        return "none".into();
    }
    d.sort();
    format!(
        "{} seen, p50 {:.2}s, max {:.2}s",
        d.len(),
        d[d.len() / 2].as_secs_f64(),
        d[d.len() - 1].as_secs_f64()
    )
}

/// Every client is gone: the leader must come to hold no key and have no
/// waiter within a session TTL and a lease, plus slack. Returns how long
/// it took, for the summary.
async fn await_empty(sh: &ClusterWorkload) -> String {
    let began = Instant::now();
    let deadline = began + sh.session_ttl + MAX_LEASE + DRAIN_SLACK;
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        match Client::connect_with(sh.servers.as_str(), options.clone()).await {
            Ok(control) => {
                while Instant::now() < deadline {
                    match control.stats().await {
                        Ok(s) if s.held_keys == 0 && s.waiting_requests == 0 => {
                            return format!("{:.1}s", began.elapsed().as_secs_f64());
                        }
                        Ok(s) => last = format!("{s:?}"),
                        Err(e) => {
                            last = e.to_string();
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sh.report
        .violation("cluster not empty after every client left", last.clone());
    format!("NOT within the bound: {last}")
}

/// Every node must report the same last applied index, all at once,
/// within [`CONVERGE`].
async fn await_same_applied(sh: &ClusterWorkload, cluster: &Cluster) -> String {
    let began = Instant::now();
    let mut last = Vec::new();
    while began.elapsed() < CONVERGE {
        last.clear();
        for i in 0..cluster.len() {
            last.push(cluster.status(i).await.map(|s| s.last_applied_index));
        }
        if last.iter().all(|a| a.is_some() && *a == last[0]) {
            return format!(
                "{} on every node within {:.1}s",
                last[0].unwrap_or_default(),
                began.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sh.report.violation(
        "nodes disagree on the applied index",
        format!("{last:?} after {CONVERGE:?}"),
    );
    format!("NOT within {CONVERGE:?}: {last:?}")
}

/// SIGTERM to every node: each must exit 0, and no node's log may have
/// said a thread panicked.
async fn stop_nodes(sh: &ClusterWorkload, cluster: &Arc<Cluster>) {
    let c = cluster.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut n = c.nodes();
        let exits: Vec<_> = (0..n.len()).map(|i| n.terminate(i, TERM_LIMIT)).collect();
        (exits, n.any_panicked())
    })
    .await;
    let Ok((exits, panicked)) = outcome else {
        sh.report
            .violation("cannot stop the nodes", "the stopping thread failed".into());
        return;
    };
    for (i, status) in exits.into_iter().enumerate() {
        match status {
            Some(s) if s.success() => {}
            Some(s) => sh
                .report
                .violation("node exit on SIGTERM", format!("node {i}: {s}")),
            None => sh.report.violation(
                "node exit on SIGTERM",
                format!("node {i}: not running or no exit within {TERM_LIMIT:?}"),
            ),
        }
    }
    if panicked {
        sh.report
            .violation("a node panicked", "a node's log says \"panicked\"".into());
    }
}
