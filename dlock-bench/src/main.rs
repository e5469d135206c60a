//! `dlock-bench`: measure a dlock-compatible server.

mod checks;
mod cli;
mod conn;
mod memory;
mod stats;
mod workloads;

use clap::Parser;
use cli::{Cli, PipelineKind, Workload};
use dlock::tls::rustls::ClientConfig;
use stats::{Control, ProcSample, Report};
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
    {
        None => None,
        Some(Ok(config)) => Some(config),
        Some(Err(e)) => {
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

async fn run(cli: Cli, tls: Option<Arc<ClientConfig>>) -> Report {
    let c = cli.common;
    let target = Target {
        addr: c.server.clone(),
        token: c.token.clone(),
        tls,
    };
    let ctl = Control::new(c.duration, c.ops);
    let progress = progress(ctl.clone(), c.duration);
    let pid = c.server_pid;
    let before = pid.and_then(ProcSample::read);
    let start = Instant::now();
    let report = match cli.workload {
        Workload::Ping { connections } => {
            let rec = workloads::ping(target, ctl, connections).await;
            Report::new(
                "ping",
                connections,
                start.elapsed(),
                &rec,
                before,
                pid.and_then(ProcSample::read),
            )
        }
        Workload::LockUnlock { connections } => {
            let rec = workloads::lock_unlock(target, ctl, connections, "bench/lu").await;
            Report::new(
                "lock-unlock",
                connections,
                start.elapsed(),
                &rec,
                before,
                pid.and_then(ProcSample::read),
            )
        }
        Workload::Pipeline {
            connections,
            depth,
            kind,
        } => {
            let rec = workloads::pipeline(
                target,
                ctl,
                connections,
                depth.max(1),
                kind == PipelineKind::LockUnlock,
            )
            .await;
            let name = if kind == PipelineKind::Ping {
                "pipeline-ping"
            } else {
                "pipeline-lock-unlock"
            };
            Report::new(
                name,
                connections,
                start.elapsed(),
                &rec,
                before,
                pid.and_then(ProcSample::read),
            )
            .with("depth", depth as u64)
        }
        Workload::Churn { connections } => {
            let rec = workloads::churn(target, ctl, connections).await;
            Report::new(
                "churn",
                connections,
                start.elapsed(),
                &rec,
                before,
                pid.and_then(ProcSample::read),
            )
        }
        Workload::Contended { connections } => {
            let out = checks::contended(target, ctl, connections).await;
            let elapsed = start.elapsed();
            let h = stats::Latency::of(&out.handoff_latency);
            Report::new(
                "contended",
                connections,
                elapsed,
                &out.rec,
                before,
                pid.and_then(ProcSample::read),
            )
            .with("handoffs", out.handoffs)
            .with(
                "handoffs_per_sec",
                (out.handoffs as f64 / elapsed.as_secs_f64()).round(),
            )
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
            let mut r = Report::new(
                "multikey",
                connections,
                start.elapsed(),
                &out.rec,
                before,
                pid.and_then(ProcSample::read),
            )
            .with("keys_per_op", keys as u64)
            .with("pool", pool as u64)
            .with("violations", out.violations);
            r.errors += out.violations;
            r
        }
        Workload::Hold {
            count,
            connections,
            depth,
            keep,
        } => memory::hold(target, ctl, count, connections, depth.max(1), keep, pid).await,
        Workload::Conns { idle, active } => {
            memory::conns(target, c.duration, idle, active.max(1), pid).await
        }
    };
    if let Some(p) = progress {
        p.abort();
    }
    report
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
