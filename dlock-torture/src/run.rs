//! One torture run, on either target: start it, run honest clients and
//! faults until the deadline, then check the history, that the target
//! drains to nothing, and that it stops cleanly.
//!
//! What differs by target is who attacks and which honest clients can
//! follow: a single server meets hostile clients (`faults/clients.rs`) and
//! is used both through raw frames (`honest/wire.rs`) and through the
//! library (`honest/library.rs`); a cluster's nodes are killed, paused and
//! cut off (`faults/nodes.rs`), and only the library's clients, which
//! follow the leader and resume their sessions, use it.

use crate::cli::Args;
use crate::faults::{clients, nodes};
use crate::honest::{library, wire};
use crate::target::{Target, IDLE_TIMEOUT};
use crate::workload::{spread, Workload};
use dlock::{Client, ClientOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Most client-side faults in progress at once; the scheduler skips a
/// turn beyond it.
const MAX_CONCURRENT_FAULTS: usize = 64;

/// After every client left: the longest lease, the server's idle timeout
/// or a session's TTL, and slack for a last election.
const DRAIN_SLACK: Duration = Duration::from_secs(20);

/// The longest lease the library's honest clients take.
const MAX_LEASE: Duration = library::MAX_LEASE;

/// How long the nodes may take to agree on the applied index once the
/// cluster is empty.
const CONVERGE: Duration = Duration::from_secs(20);

/// Runs the whole thing: setup, the workload, the drain, the report.
/// `Ok(true)` when no violation was found.
pub async fn run(args: Args) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    if !(args.fault_rate >= 0.0 && args.fault_rate <= 1_000.0) {
        anyhow::bail!("--fault-rate must be between 0 and 1000 per second");
    }
    if args.cluster == Some(2) {
        anyhow::bail!("--cluster 2: a cluster of two stops with either node; give 1, or 3 to 5");
    }
    if args.cluster == Some(1) && !nodes::lone_node_can_take(&args.faults, args.no_partitions) {
        anyhow::bail!(
            "--cluster 1 (a single durable server) takes only --faults kill-leader, \
             power-cut-node and power-cut-cluster, with --no-partitions"
        );
    }
    if args.cluster.is_some() && nodes::drawable(&args.faults, !args.no_partitions).is_empty() {
        anyhow::bail!(
            "--faults: each kind named needs the proxies that --no-partitions leaves out"
        );
    }
    let target = match (args.cluster, &args.server_bin, &args.server) {
        (Some(n), _, _) => {
            println!("dlock-torture: cluster of {n}, seed {seed}");
            Target::nodes(&args, n, seed).await?
        }
        (None, Some(bin), _) => Target::child(bin)?,
        (None, None, Some(addr)) => Target::external(addr, args.server_pid)?,
        (None, None, None) => Target::in_process()?,
    };
    let began = std::time::Instant::now();
    let sh = Arc::new(match target.cluster() {
        // A fresh cluster elects its first leader meanwhile.
        Some(_) => Workload::new(
            &args,
            target.servers(),
            target.addr(),
            calm_length(args.duration),
            args.election_timeout * 4,
        ),
        None => Workload::new(
            &args,
            target.servers(),
            target.addr(),
            Duration::ZERO,
            Duration::ZERO,
        ),
    });
    let mut rss = RssSamples {
        start: target.rss(),
        ..RssSamples::default()
    };
    let (wire_clients, library_clients) = split_clients(&args, &target);
    drive(&args, &sh, &target, seed, wire_clients, &mut rss).await;
    let workload = began.elapsed();

    let (overlaps, examples) = sh.history.check();
    sh.report
        .violations_n("history (overlap or fence order)", overlaps, examples);
    let drained = await_empty(&sh, &target).await;
    rss.end = target.rss();
    if let (Some(warm), Some(end)) = (rss.warm, rss.end) {
        let allowed = warm + (warm / 2).max(16 << 20);
        if end > allowed {
            sh.report.violation(
                "RSS did not return near baseline",
                format!("{} MiB at the end, {} MiB warm", end >> 20, warm >> 20),
            );
        }
    }
    let converged = match target.cluster() {
        Some(cluster) => Some(await_same_applied(&sh, cluster).await),
        None => None,
    };
    let nodes = target.cluster().map(|c| c.len());
    let problems = target.stop().await;
    let n = problems.len() as u64;
    sh.report.violations_n("server", n, problems);

    let mut header = vec![("seed", seed.to_string())];
    if let Some(n) = nodes {
        header.push(("nodes", n.to_string()));
    }
    header.extend([
        (
            "clients",
            format!("{wire_clients} on the wire, {library_clients} through the library"),
        ),
        ("keys", args.keys.to_string()),
    ]);
    if let Some(n) = nodes {
        header.push((
            "clock rate",
            clock_line(args.clock_rate, args.clock_nodes.min(n as u64), n as u64),
        ));
    }
    header.extend([
        ("workload", format!("{:.1}s", workload.as_secs_f64())),
        ("total", format!("{:.1}s", began.elapsed().as_secs_f64())),
        ("holds checked", sh.history.len().to_string()),
        ("empty after", drained),
    ]);
    match converged {
        Some(converged) => header.extend([
            ("same applied index", converged),
            ("failovers", spread(&sh.failovers)),
            ("leader again after SIGTERM", spread(&sh.handovers)),
            ("restarted, caught up in", spread(&sh.restarts)),
            ("sessions resumed after", spread(&sh.resumes)),
            ("calm end checked", sh.calm_checked()),
        ]),
        None => {
            let mib = |b: Option<u64>| {
                b.map_or("n/a".to_string(), |b| {
                    format!("{:.1} MiB", b as f64 / 1048576.0)
                })
            };
            header.extend([
                ("RSS start", mib(rss.start)),
                ("RSS warm", mib(rss.warm)),
                ("RSS peak", mib(Some(rss.peak).filter(|&p| p > 0))),
                ("RSS end", mib(rss.end)),
            ]);
        }
    }
    let counts = sh.counts.lines();
    header.extend(counts.iter().map(|(k, v)| (*k, v.to_string())));
    print!("{}", sh.report.summary(&header, &sh.availability.lines()));
    Ok(sh.report.violation_count() == 0)
}

/// How many of `--clients` speak raw frames and how many use the
/// library: on a cluster all use the library (the wire-level client does
/// not follow a leader); on a single server a quarter do.
fn split_clients(args: &Args, target: &Target) -> (u32, u32) {
    match target.cluster() {
        Some(_) => (0, args.clients),
        None => {
            let library = args.clients / 4;
            (args.clients - library, library)
        }
    }
}

/// The server's resident set size where a run samples it (a single
/// server only).
#[derive(Default)]
struct RssSamples {
    start: Option<u64>,
    /// Once the workload is warm.
    warm: Option<u64>,
    /// The most seen while the workload runs (0: never read).
    peak: u64,
    /// After the drain.
    end: Option<u64>,
}

/// Runs the honest clients and the faults until the deadline, sampling
/// the server's memory meanwhile, and waits for every task to end.
async fn drive(
    args: &Args,
    sh: &Arc<Workload>,
    target: &Target,
    seed: u64,
    wire_clients: u32,
    rss: &mut RssSamples,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..u64::from(args.clients) {
        let seed = seed ^ c.wrapping_mul(0x9e37_79b9);
        if c < u64::from(wire_clients) {
            tasks.spawn(wire::run(c, sh.clone(), seed));
        } else {
            tasks.spawn(library::run(c, sh.clone(), seed));
        }
    }
    let faults = match target.cluster() {
        Some(cluster) => tokio::spawn(nodes::schedule(
            sh.clone(),
            cluster.clone(),
            args.fault_every,
            args.max_faults as usize,
            args.faults.clone(),
            seed,
        )),
        None => tokio::spawn(schedule_client_faults(sh.clone(), args.fault_rate, seed)),
    };

    // RSS once the workload is warm, and its peak, sampled while it runs.
    tokio::time::sleep(Duration::from_secs(1).min(args.duration / 4)).await;
    rss.warm = target.rss();
    rss.peak = rss.warm.unwrap_or(0);
    while Instant::now() < sh.stop_at {
        tokio::select! {
            _ = tokio::time::sleep_until(sh.stop_at) => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        rss.peak = rss.peak.max(target.rss().unwrap_or(0));
    }
    while tasks.join_next().await.is_some() {}
    if faults.await.is_err() {
        sh.report.violation("fault scheduler failed", String::new());
    }
}

/// Starts client-side faults at `rate` per second, cycling through the
/// kinds, until the run's deadline; waits for those in progress to finish.
async fn schedule_client_faults(sh: Arc<Workload>, rate: f64, seed: u64) {
    if rate <= 0.0 {
        return;
    }
    let every = Duration::from_secs_f64(1.0 / rate);
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_FAULTS));
    let mut set = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(every);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(sh.stop_at) => break,
        }
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let sh = sh.clone();
        let id = 1_000_000 + n;
        set.spawn(async move {
            clients::run(n as usize, id, sh, seed ^ id).await;
            drop(permit);
        });
        n += 1;
        while set.try_join_next().is_some() {}
    }
    while set.join_next().await.is_some() {}
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

/// The fault-free end of a cluster run: a third of it, at most 30 s.
fn calm_length(run: Duration) -> Duration {
    (run / 3).min(Duration::from_secs(30))
}

/// Every client is gone: the server (a cluster's leader) must come to
/// hold no key and have no waiter within a lease and its idle timeout or
/// session TTL, plus slack; a single server must also be left with only
/// the checker's connection. Returns how long it took, for the summary.
async fn await_empty(sh: &Workload, target: &Target) -> String {
    let began = Instant::now();
    let (owner_bound, lone_connection) = match target.cluster() {
        Some(_) => (sh.session_ttl, false),
        None => (IDLE_TIMEOUT, true),
    };
    let deadline = began + owner_bound + MAX_LEASE + DRAIN_SLACK;
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
                        Ok(s)
                            if s.held_keys == 0
                                && s.waiting_requests == 0
                                && (!lone_connection || s.connections <= 1) =>
                        {
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
        .violation("server not empty after every client left", last.clone());
    format!("NOT within the bound: {last}")
}

/// Every node must report the same last applied index, all at once,
/// within [`CONVERGE`].
async fn await_same_applied(sh: &Workload, cluster: &nodes::Cluster) -> String {
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
