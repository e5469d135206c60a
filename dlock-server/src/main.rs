//! `dlock-server`: parse flags, set up logging, bind, serve until a signal.

use anyhow::Context;
use clap::{Parser, Subcommand};
use dlock_server::ops::cert::Cert;
use dlock_server::ops::local_cluster::LocalCluster;
use dlock_server::ops::logging;
use dlock_server::Config;

/// The dlock lock server.
///
/// Holds named locks in memory and serves them over TCP with the dlock v2
/// protocol (see docs/PROTOCOL.md); with --data-dir, durable and
/// replicated by Raft (docs/CLUSTER.md). Every flag can also be set in
/// the environment: DLOCK_ and its name in capitals (--max-connections is
/// DLOCK_MAX_CONNECTIONS).
#[derive(Debug, Parser)]
#[command(name = "dlock-server", version = dlock_server::VERSION, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    config: Config,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a cluster of N nodes of this server on loopback (data dirs
    /// and logs in one folder), print the DLOCK_SERVER line for the
    /// clients, and stop every node on Ctrl-C.
    LocalCluster(LocalCluster),
    /// Make the certificates TLS needs: a CA (create-ca), a node's for
    /// clients and peers (create-node NAME --addr HOST), a client's for
    /// mutual TLS (create-client NAME). Keys are written with mode 0600.
    Cert(Cert),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Cert(cert)) = &cli.command {
        return match cert.run() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dlock-server: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if let Some(Cmd::LocalCluster(local)) = cli.command {
        return match local.run() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dlock-server: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let config = cli.config;
    let filter = match logging::filter(config.log_level.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("dlock-server: invalid log filter: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    logging::init(filter, config.log_format);
    if config.restore_backup {
        return restore(&config);
    }
    raise_fd_limit();
    match serve(config) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `--restore-backup`: prepares the directory, says what was done, exits.
fn restore(config: &Config) -> std::process::ExitCode {
    let Some(dir) = &config.data_dir else {
        eprintln!("dlock-server: --restore-backup needs --data-dir");
        return std::process::ExitCode::from(2);
    };
    match dlock_server::engine::raft::restore_backup(dir, config.fence_floor) {
        Ok(r) => {
            println!(
                "dlock-server: {} is ready to restore a cluster: every session in the backup ends \
                 and fences start at {} or above (log entry {}). Copy it to every node's data \
                 directory and start the nodes with their usual flags.",
                dir.display(),
                r.fence_floor,
                r.index
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dlock-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    let runtime = exit_if_threads_fail(config.threads, || build_runtime(&config))
        .context("cannot start the runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        dlock_server::run(listener, config, shutdown_signal()).await
    })
}

fn build_runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    match config.threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 if config.data_dir.is_some() => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cluster_workers())
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
}

/// Runs `build` (the runtime's construction) with a panic on this thread
/// turned into one line naming the cause and an immediate exit 1.
///
/// tokio's `Builder::build` returns an error for what it checks, but it
/// starts the worker threads through its blocking pool, which panics
/// ("OS can't spawn worker thread") when the OS refuses one: a thread or
/// memory limit (ulimit -u, ulimit -v, systemd's TasksMax) below
/// `--threads`. Catching that panic does not help: unwinding out of
/// `build` drops the half-built runtime's blocking pool, which waits for
/// the workers already started, and they wait for a shutdown that no
/// runtime will ever send, so the process hangs, not listening, and a
/// supervisor's restart-on-failure never fires. A panic hook runs before
/// any unwinding, so exiting from it is the one prompt way out. It is
/// scoped to this thread and to the construction: later, a panic in a task
/// is tokio's to isolate (on this thread too, with `--threads 1`), and a
/// worker thread that panics aborts the process by itself.
fn exit_if_threads_fail<T>(threads: usize, build: impl FnOnce() -> T) -> T {
    let builder = std::thread::current().id();
    let previous = std::sync::Arc::new(std::panic::take_hook());
    {
        let previous = previous.clone();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() != builder {
                return previous(info);
            }
            let p = info.payload();
            let why = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            let asked = if threads == 0 {
                "worker threads".to_owned()
            } else {
                format!("{threads} worker threads (--threads {threads})")
            };
            eprintln!(
                "dlock-server: cannot start the runtime's {asked}: {why}. Give fewer \
                 --threads, or raise the limits on threads and memory (ulimit -u, ulimit -v, \
                 systemd's TasksMax and MemoryMax)"
            );
            std::process::exit(1);
        }));
    }
    let built = build();
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
    built
}

/// Worker threads for the client connections of a node with a data
/// directory (a cluster node, or a durable single server, which is a
/// cluster of one): one per core but one, the core its consensus thread
/// takes (`engine/raft/own_thread.rs`), and never fewer than one. One
/// worker more than cores left only woke its idle sibling to take each task
/// just scheduled (BENCHMARKS.md, "client workers one per core but one").
fn cluster_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Each connection is a descriptor, and the default soft limit (often 1024)
/// is far below --max-connections: lift it to the hard limit, as servers do.
/// A failure leaves the limit as it was: the server still runs, with fewer
/// connections.
fn raise_fd_limit() {
    // u64::MAX asks for the hard limit (capped where the OS caps it lower).
    if let Ok(limit) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::debug!(limit, "open-file limit");
    }
}
