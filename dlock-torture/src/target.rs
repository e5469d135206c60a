//! The server under test: inside this process, a child process, one
//! already running elsewhere on loopback, or a cluster of node processes.

use crate::cli::Args;
use crate::faults::nodes::{Cluster, Links};
use anyhow::{bail, Context};
use dlock_server::testing::nodes::NodeProcesses;
use dlock_testkit::proc_sample::ProcSample;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Timeouts short enough that dropped clients are noticed within a run,
/// and a lease limit the clients stay under.
pub const SERVER_ARGS: &[&str] = &[
    "--idle-timeout",
    "1s",
    "--write-timeout",
    "1s",
    "--max-lease",
    "10s",
];

/// The server's idle timeout as set by [`SERVER_ARGS`]; for an external
/// server, the most the checks allow.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

pub enum Target {
    InProcess {
        addr: SocketAddr,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
        panics: Arc<AtomicU64>,
    },
    Child {
        addr: SocketAddr,
        child: Child,
        panics: Arc<Mutex<Vec<String>>>,
    },
    External {
        addr: SocketAddr,
        pid: Option<u32>,
    },
    /// Node processes on loopback; `addr` is the first one's client port.
    Nodes {
        cluster: Arc<Cluster>,
        addr: SocketAddr,
    },
}

/// How long a node may take to exit on SIGTERM.
const TERM_LIMIT: Duration = Duration::from_secs(20);

impl Target {
    /// A server on its own runtime and threads, so the clients' load does
    /// not share its scheduler.
    pub fn in_process() -> anyhow::Result<Target> {
        let panics = Arc::new(AtomicU64::new(0));
        let seen = panics.clone();
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            seen.fetch_add(1, Ordering::Relaxed);
            default_hook(info);
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let config = <dlock_server::Config as clap::Parser>::try_parse_from(
            std::iter::once("dlock-server").chain(SERVER_ARGS.iter().copied()),
        )?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    dlock_server::run(listener, config, async {
                        let _ = stopped.await;
                    })
                    .await
                })
            })?;
        Ok(Target::InProcess {
            addr,
            stop: Some(stop),
            thread: Some(thread),
            panics,
        })
    }

    /// Runs `bin` with [`SERVER_ARGS`] on 127.0.0.1:0 and reads its address
    /// from its log.
    pub fn child(bin: &Path) -> anyhow::Result<Target> {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--log-level", "info"])
            .args(SERVER_ARGS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        let stderr = child.stderr.take().context("server stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                bail!("{} exited before listening", bin.display());
            };
            if let Some(rest) = line.split("addr=").nth(1) {
                let a = rest.split_whitespace().next().unwrap_or_default();
                break a
                    .parse()
                    .context("the server logged an unreadable address")?;
            }
        };
        let panics = Arc::new(Mutex::new(Vec::new()));
        let seen = panics.clone();
        // Drain the log for the whole run, so the server never blocks on a
        // full pipe, keeping what reports a panic.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if line.contains("panicked") {
                    seen.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            }
        });
        Ok(Target::Child {
            addr,
            child,
            panics,
        })
    }

    pub fn external(addr: &str, pid: Option<u32>) -> anyhow::Result<Target> {
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("--server {addr:?} is not an ip:port"))?;
        if !addr.ip().is_loopback() {
            bail!("--server must be a loopback address: the torture run floods it");
        }
        Ok(Target::External { addr, pid })
    }

    /// `nodes` node processes of the `dlock-server` binary (`--server-bin`,
    /// or the one beside this program), with proxies on their links
    /// unless `--no-partitions`, started and ready for clients.
    /// `seed`: the run's, from which each node's volatile disk (when a
    /// power cut is among the faults) draws its torn writes.
    pub async fn nodes(args: &Args, nodes: u64, seed: u64) -> anyhow::Result<Target> {
        let bin = server_bin(args)?;
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
        let rate = args.clock_rate.to_string();
        for i in 0..args.clock_nodes.min(nodes) {
            procs.node_flags(i as usize, &["--test-clock-rate", &rate]);
        }
        if args.faults.iter().any(|k| k.is_power_cut()) {
            // Every node's log on a volatile disk, so that a SIGKILL loses
            // what it never synced; a seed of its own for its torn writes.
            for i in 0..nodes {
                let seed = seed.wrapping_add(i).to_string();
                procs.node_flags(i as usize, &["--test-volatile-disk", &seed]);
            }
        }
        let links = if args.no_partitions {
            None
        } else {
            Some(Links::install(&mut procs).await)
        };
        let addr = procs.addr(0);
        let procs = tokio::task::spawn_blocking(move || {
            procs.start_all();
            procs
        })
        .await
        .context("the nodes did not start")?;
        Ok(Target::Nodes {
            cluster: Arc::new(Cluster::new(procs, links)),
            addr,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Target::InProcess { addr, .. }
            | Target::Child { addr, .. }
            | Target::External { addr, .. }
            | Target::Nodes { addr, .. } => *addr,
        }
    }

    /// The address list a client of the library is given.
    pub fn servers(&self) -> String {
        match self {
            Target::Nodes { cluster, .. } => cluster.client_addrs(),
            t => t.addr().to_string(),
        }
    }

    /// The nodes, on a cluster.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        match self {
            Target::Nodes { cluster, .. } => Some(cluster),
            _ => None,
        }
    }

    /// The server's resident set size in bytes, when it can be known (in
    /// process, it is the whole process's).
    pub fn rss(&self) -> Option<u64> {
        let pid = match self {
            Target::InProcess { .. } => std::process::id(),
            Target::Child { child, .. } => child.id(),
            Target::External { pid, .. } => (*pid)?,
            Target::Nodes { .. } => return None,
        };
        ProcSample::read(pid).map(|s| s.rss)
    }

    /// Stops the server as SIGTERM would and returns the problems seen:
    /// panics, a failed exit.
    pub async fn stop(self) -> Vec<String> {
        let mut problems = Vec::new();
        match self {
            Target::InProcess {
                mut stop,
                mut thread,
                panics,
                ..
            } => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                if let Some(t) = thread.take() {
                    match tokio::task::spawn_blocking(move || t.join()).await {
                        Ok(Ok(Ok(()))) => {}
                        Ok(Ok(Err(e))) => problems.push(format!("server returned an error: {e:#}")),
                        _ => problems.push("server thread panicked".into()),
                    }
                }
                let n = panics.load(Ordering::Relaxed);
                if n > 0 {
                    problems.push(format!("{n} panics in the process"));
                }
            }
            Target::Child {
                mut child, panics, ..
            } => {
                // SAFETY: kill has no memory-safety preconditions; the pid is
                // our own child, not yet reaped.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
                }
                match tokio::task::spawn_blocking(move || child.wait()).await {
                    Ok(Ok(status)) if status.success() => {}
                    Ok(Ok(status)) => problems.push(format!("server exited with {status}")),
                    _ => problems.push("cannot wait for the server".into()),
                }
                problems.extend(panics.lock().unwrap_or_else(|p| p.into_inner()).drain(..));
            }
            Target::External { .. } => {}
            Target::Nodes { cluster, .. } => {
                let outcome = tokio::task::spawn_blocking(move || {
                    let mut n = cluster.nodes();
                    let exits: Vec<_> = (0..n.len()).map(|i| n.terminate(i, TERM_LIMIT)).collect();
                    (exits, n.any_panicked())
                })
                .await;
                let Ok((exits, panicked)) = outcome else {
                    return vec!["cannot stop the nodes: the stopping thread failed".into()];
                };
                for (i, status) in exits.into_iter().enumerate() {
                    match status {
                        Some(s) if s.success() => {}
                        Some(s) => problems.push(format!("node {i} exited with {s} on SIGTERM")),
                        None => problems.push(format!(
                            "node {i}: not running or no exit within {TERM_LIMIT:?} of SIGTERM"
                        )),
                    }
                }
                if panicked {
                    problems.push("a node's log says \"panicked\"".into());
                }
            }
        }
        problems
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
        bail!(
            "{} is missing: build it (cargo build -p dlock-server) or pass --server-bin",
            bin.display()
        );
    }
    Ok(bin)
}
