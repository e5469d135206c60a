//! `dlock-bench`: measure a dlock-compatible server.

mod checks;
mod cli;
#[cfg(feature = "etcd")]
mod etcd;
mod memory;
mod rng;
mod sessions;
mod sharing;
mod snapshots;
mod stats;
mod sync_floor;
mod workloads;

use clap::Parser;
use cli::{Cli, PipelineKind, Workload};
use dlock::tls::rustls::ClientConfig;
use dlock::ClientOptions;
use dlock_testkit::proc_sample::ProcSample;
use stats::{Control, Report};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workloads::Target;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let tls = match cli
        .common
        .tls_ca
        .as_deref()
        .map(|ca| dlock::tls::client_config(ca, None))
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("dlock-bench: --tls-ca: {e}");
            return ExitCode::FAILURE;
        }
    };
    raise_fd_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock-bench: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.common.json;
    let report = runtime.block_on(run(cli, tls));
    // Without waiting for a blocking read of stdin that never finished
    // (`hold --release-on-input` past its deadline).
    runtime.shutdown_background();
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("dlock-bench: {e}"),
        }
    } else {
        report.print_table();
    }
    if report.errors > 0 || report.ops == 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Setup, the workload, then the report: the progress line stops either way.
async fn run(cli: Cli, tls: Option<Arc<ClientConfig>>) -> Report {
    let c = &cli.common;
    let options = ClientOptions {
        tls,
        ..ClientOptions::default()
    };
    let target = Target {
        addr: c.server.clone(),
        token: c.token.clone(),
        options,
    };
    let ctl = Control::new(c.duration, c.ops);
    let progress = progress(ctl.clone(), c.duration);
    let server = ServerWatch::start(c.server_pid);
    let report = measure(cli.workload, target, ctl, c.duration, &server).await;
    if let Some(p) = progress {
        p.abort();
    }
    report
}

/// The server's process, sampled at the start of a run and again when a
/// workload reports.
struct ServerWatch {
    pid: Option<u32>,
    before: Option<ProcSample>,
    start: Instant,
}

impl ServerWatch {
    fn start(pid: Option<u32>) -> ServerWatch {
        ServerWatch {
            pid,
            before: pid.and_then(ProcSample::read),
            start: Instant::now(),
        }
    }

    /// The report of a throughput workload: its figures, the time since
    /// the start and the server's use of CPU and memory meanwhile.
    fn report(&self, name: &str, connections: usize, rec: &stats::Recorder) -> Report {
        let after = self.pid.and_then(ProcSample::read);
        Report::new(
            name,
            connections,
            self.start.elapsed(),
            rec,
            self.before,
            after,
        )
    }
}

/// Runs one workload to its end and reports it.
async fn measure(
    workload: Workload,
    target: Target,
    ctl: Control,
    duration: Duration,
    server: &ServerWatch,
) -> Report {
    match workload {
        Workload::Ping { connections } => {
            let rec = workloads::ping(target, ctl, connections).await;
            server.report("ping", connections, &rec)
        }
        Workload::LockUnlock { connections } => {
            let rec = workloads::lock_unlock(target, ctl, connections, "bench/lu").await;
            server.report("lock-unlock", connections, &rec)
        }
        Workload::Pipeline {
            connections,
            depth,
            kind,
        } => {
            let pairs = kind == PipelineKind::LockUnlock;
            let rec = workloads::pipeline(target, ctl, connections, depth.max(1), pairs).await;
            let name = if pairs {
                "pipeline-lock-unlock"
            } else {
                "pipeline-ping"
            };
            server
                .report(name, connections, &rec)
                .with("depth", depth as u64)
        }
        Workload::Churn { connections } => {
            let rec = workloads::churn(target, ctl, connections).await;
            server.report("churn", connections, &rec)
        }
        Workload::Contended { connections } => {
            let out = checks::contended(target, ctl, connections).await;
            let report = server.report("contended", connections, &out.rec);
            let h = stats::Latency::of(&out.handoff_latency);
            let handoffs_per_sec = out.handoffs as f64 / report.duration_s.max(1e-9);
            report
                .with("handoffs", out.handoffs)
                .with("handoffs_per_sec", handoffs_per_sec.round())
                .with("handoff_p50_us", h.p50_us)
                .with("handoff_p99_us", h.p99_us)
                .with("handoff_max_us", h.max_us)
                .with("fifo_violations", out.fifo_violations)
                .with("fifo_margin_us", checks::FIFO_MARGIN.as_micros() as u64)
        }
        Workload::Multikey {
            connections,
            keys,
            pool,
        } => {
            let out = checks::multikey(target, ctl, connections, keys, pool).await;
            let mut r = server
                .report("multikey", connections, &out.rec)
                .with("keys_per_op", keys as u64)
                .with("pool", pool as u64)
                .with("violations", out.violations);
            r.errors += out.violations;
            r
        }
        Workload::Shared {
            connections,
            readers,
            keys,
            limit,
            hold,
        } => {
            let mix = sharing::Mix {
                readers_pct: readers,
                keys: keys as usize,
                limit,
                hold,
            };
            let out = sharing::shared(target, ctl, connections, mix).await;
            let name = if limit > 0 { "semaphore" } else { "shared" };
            let mut r = server
                .report(name, connections, &out.rec)
                .with(
                    "readers_pct",
                    u64::from(if limit > 0 { 100 } else { readers }),
                )
                .with("keys", u64::from(keys))
                .with("limit", u64::from(limit))
                .with("hold_us", hold.as_micros() as u64)
                .with("reads", out.reads)
                .with("writes", out.writes)
                .with("most_holders_seen", out.most_holders)
                .with("violations", out.violations);
            r.errors += out.violations;
            r
        }
        Workload::Hold {
            count,
            connections,
            depth,
            batch,
            keep,
            release_on_input,
        } => {
            let pace = memory::Pace {
                depth: depth.max(1),
                batch,
            };
            let release = if keep {
                memory::Release::Never
            } else if release_on_input {
                memory::Release::OnInput
            } else {
                memory::Release::AtOnce
            };
            memory::hold(target, ctl, count, connections, pace, release, server.pid)
                .await
                .with("keys_per_request", batch)
        }
        Workload::Conns { idle, active } => {
            memory::conns(target, duration, idle, active.max(1), server.pid).await
        }
        Workload::SnapshotStall {
            connections,
            leader_pid,
            follower_pid,
            every,
            rounds,
        } => {
            let nodes = snapshots::Nodes {
                leader: leader_pid,
                follower: follower_pid,
                every,
            };
            snapshots::stall(target, duration, connections.max(1), nodes, rounds).await
        }
        Workload::SyncFloor { dir, record } => {
            let run = tokio::task::spawn_blocking(move || {
                sync_floor::measure(&ctl, &dir, record as usize)
            });
            match run.await.map_err(std::io::Error::other).and_then(|r| r) {
                Ok(floor) => {
                    let ops = floor.rec.ops.max(1) as f64;
                    Report::new("sync-floor", 1, floor.elapsed, &floor.rec, None, None)
                        .with("record_bytes", u64::from(record))
                        .with(
                            "cpu_us_per_sync",
                            (floor.cpu.as_secs_f64() * 1e6 / ops).round(),
                        )
                }
                Err(e) => {
                    eprintln!("dlock-bench: sync-floor: {e}");
                    std::process::exit(1);
                }
            }
        }
        Workload::IdleSessions { connections, every } => {
            match sessions::idle(target, duration, connections, every, server.pid).await {
                Ok(report) => report,
                Err(e) => {
                    eprintln!("dlock-bench: idle-sessions: {e}");
                    std::process::exit(1);
                }
            }
        }
        #[cfg(feature = "etcd")]
        Workload::EtcdLock {
            connections,
            endpoints,
            contended,
        } => {
            let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
            let rec = etcd::lock_unlock(endpoints, ctl, connections, contended).await;
            let name = if contended {
                "etcd-contended"
            } else {
                "etcd-lock-unlock"
            };
            server.report(name, connections, &rec)
        }
    }
}

/// A progress line on a terminal (stderr), nothing when piped.
fn progress(ctl: Control, duration: Duration) -> Option<tokio::task::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {elapsed}/{duration} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            let secs = start.elapsed().as_secs_f64().max(1e-3);
            bar.set_position(start.elapsed().as_millis() as u64);
            bar.set_message(format!(
                "{} ops, {:.0} ops/s",
                ctl.claimed(),
                ctl.claimed() as f64 / secs
            ));
            if start.elapsed() >= duration {
                bar.finish_and_clear();
                return;
            }
        }
    }))
}

/// Many connections need many descriptors: lift the soft limit to the hard one.
/// A failure leaves the limit as it was; a run that needs more descriptors
/// then reports its connect errors.
fn raise_fd_limit() {
    // u64::MAX asks for the hard limit (capped where the OS caps it lower).
    let _ = rlimit::increase_nofile_limit(u64::MAX);
}
