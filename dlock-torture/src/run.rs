//! One torture run: start the target, run honest clients and faults until
//! the deadline, then check the history and the server's state.

use crate::cli::Args;
use crate::history::{History, Register};
use crate::report::Report;
use crate::target::{Target, IDLE_TIMEOUT};
use crate::wire::Wire;
use crate::{faults, honest};
use dlock::proto::{RequestType, ServerStats};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What every client task of a run shares: the target, the keys, and the
/// records the checker reads. Named apart from the server's `Shared`.
pub struct Workload {
    pub addr: SocketAddr,
    pub keys: Vec<String>,
    pub register: Register,
    pub history: History,
    pub report: Report,
    pub stop_at: Instant,
}

/// Most faults in progress at once; the scheduler skips a turn beyond it.
const MAX_CONCURRENT_FAULTS: usize = 64;

/// Longest lease any client takes, plus the server's idle timeout and some
/// slack: by then a correct server holds nothing.
const DRAIN: Duration = Duration::from_secs(20);

/// Runs the whole thing: setup, the workload, the drain, the report.
/// `Ok(true)` when no violation was found.
pub async fn run(args: Args) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    if !(args.fault_rate >= 0.0 && args.fault_rate <= 1_000.0) {
        anyhow::bail!("--fault-rate must be between 0 and 1000 per second");
    }
    let target = match (&args.server_bin, &args.server) {
        (Some(bin), _) => Target::child(bin)?,
        (None, Some(addr)) => Target::external(addr, args.server_pid)?,
        (None, None) => Target::in_process()?,
    };
    let began = std::time::Instant::now();
    let sh = Arc::new(Workload {
        addr: target.addr(),
        keys: (0..args.keys).map(|i| format!("key-{i}")).collect(),
        register: Register::default(),
        history: History::default(),
        report: Report::default(),
        stop_at: Instant::now() + args.duration,
    });
    let mut rss = RssSamples {
        start: target.rss(),
        ..RssSamples::default()
    };
    drive(&args, &sh, &target, seed, &mut rss).await;
    let workload = began.elapsed();
    let stats = drain(&sh, &target, &mut rss).await?;
    let problems = target.stop().await;
    let n = problems.len() as u64;
    sh.report.violations_n("server", n, problems);

    let mib = |b: Option<u64>| {
        b.map_or("n/a".to_string(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    let summary = sh.report.summary(&[
        ("seed", seed.to_string()),
        ("clients", args.clients.to_string()),
        ("keys", args.keys.to_string()),
        ("workload", format!("{:.1}s", workload.as_secs_f64())),
        ("total", format!("{:.1}s", began.elapsed().as_secs_f64())),
        ("holds checked", sh.history.len().to_string()),
        ("server left", format!("{stats:?}")),
        ("RSS start", mib(rss.start)),
        ("RSS warm", mib(rss.warm)),
        ("RSS peak", mib(Some(rss.peak).filter(|&p| p > 0))),
        ("RSS end", mib(rss.end)),
    ]);
    print!("{summary}");
    Ok(sh.report.violation_count() == 0)
}

/// The server's resident set size where a run samples it.
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
async fn drive(args: &Args, sh: &Arc<Workload>, target: &Target, seed: u64, rss: &mut RssSamples) {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..u64::from(args.clients) {
        tasks.spawn(honest::run(
            c,
            sh.clone(),
            seed ^ c.wrapping_mul(0x9e37_79b9),
        ));
    }
    let faults = tokio::spawn(schedule_faults(sh.clone(), args.fault_rate, seed));

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

/// Every client is gone: the server must drain to nothing, the history
/// must hold no overlap, and memory must come back near where it was warm.
async fn drain(
    sh: &Workload,
    target: &Target,
    rss: &mut RssSamples,
) -> anyhow::Result<Option<ServerStats>> {
    let mut control = Wire::connect(sh.addr).await?;
    let stats = await_empty(&mut control, sh).await;
    let (overlaps, examples) = sh.history.check();
    sh.report
        .violations_n("history (overlap or fence order)", overlaps, examples);
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
    Ok(stats)
}

/// Starts faults at `rate` per second, cycling through the kinds, until the
/// run's deadline; waits for those in progress to finish.
async fn schedule_faults(sh: Arc<Workload>, rate: f64, seed: u64) {
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
            faults::run(n as usize, id, sh, seed ^ id).await;
            drop(permit);
        });
        n += 1;
        while set.try_join_next().is_some() {}
    }
    while set.join_next().await.is_some() {}
}

/// Polls the server's stats until it holds nothing, has no waiters and
/// only the control connection; a violation if that takes too long.
async fn await_empty(control: &mut Wire, sh: &Workload) -> Option<ServerStats> {
    let deadline = Instant::now() + DRAIN + IDLE_TIMEOUT;
    let mut last = None;
    while Instant::now() < deadline {
        let req = control.request(RequestType::Inspect, &[]);
        match control.call(req, Duration::from_secs(10)).await {
            Ok(r) => {
                last = r.server_stats;
                if let Some(s) = &last {
                    if s.held_keys == 0 && s.waiting_requests == 0 && s.connections <= 1 {
                        return last;
                    }
                }
            }
            Err(e) => {
                sh.report
                    .violation("control connection failed", e.to_string());
                return None;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sh.report.violation(
        "server not empty after every client left",
        format!("{last:?}"),
    );
    last
}
