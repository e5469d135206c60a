//! Command-line options.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Runs honest lock clients and hostile ones against a dlock server and
/// checks every history: no two holders of a key overlap, fencing tokens
/// increase, every request is answered, and the server is left empty.
///
/// Without --server-bin or --server, a server runs inside this process.
/// With --cluster N, N node processes of --server-bin run on loopback and
/// are killed, paused and partitioned instead (docs/RELIABILITY.md,
/// "Cluster torture").
/// Exits 0 when no violation was seen, 1 otherwise, 2 on bad usage.
#[derive(Debug, Clone, Parser)]
#[command(name = "dlock-torture", version)]
pub struct Args {
    /// Honest clients locking and writing to the fenced register.
    #[arg(short = 'c', long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub clients: u32,

    /// Size of the key pool the clients fight over.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub keys: u32,

    /// How long to run the workload (the final checks come after).
    #[arg(short = 'd', long, default_value = "10s", value_parser = dlock::duration::parse_positive)]
    pub duration: Duration,

    /// Faults started per second, of every kind in turn.
    #[arg(long, default_value_t = 5.0)]
    pub fault_rate: f64,

    /// Seed for every random choice; printed in the summary.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Run this dlock-server binary as a child process (its own RSS and
    /// log are checked) instead of a server inside this process.
    #[arg(long, value_name = "PATH", conflicts_with = "server")]
    pub server_bin: Option<PathBuf>,

    /// Test a server that is already running at HOST:PORT; it must use
    /// --idle-timeout and --write-timeout of at most 2s. RSS is checked
    /// only with --server-pid; its log is not checked.
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,

    /// Process id of the --server, for its RSS.
    #[arg(long, requires = "server")]
    pub server_pid: Option<u32>,

    /// Run a cluster of this many dlock-server node processes on loopback
    /// (--server-bin, by default the one beside this binary) and attack it
    /// with SIGKILL and SIGSTOP instead of hostile clients. 1 is a single
    /// durable server (a cluster of one), for the faults a lone node can
    /// take: --faults kill-leader, power-cut-node, power-cut-cluster, with
    /// --no-partitions.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=5), conflicts_with = "server")]
    pub cluster: Option<u64>,

    /// With --cluster: mean time between two faults' starts.
    #[arg(long, default_value = "3s", value_parser = dlock::duration::parse_positive, requires = "cluster")]
    pub fault_every: Duration,

    /// With --cluster: most faults in progress at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16), requires = "cluster")]
    pub max_faults: u32,

    /// With --cluster: the nodes' --heartbeat.
    #[arg(long, default_value = "100ms", value_parser = dlock::duration::parse_positive, requires = "cluster")]
    pub heartbeat: Duration,

    /// With --cluster: the nodes' --election-timeout.
    #[arg(long, default_value = "1s", value_parser = dlock::duration::parse_positive, requires = "cluster")]
    pub election_timeout: Duration,

    /// With --cluster: the session TTL the honest clients ask for; leader
    /// pauses run past it now and then.
    #[arg(long, default_value = "3s", value_parser = session_ttl, requires = "cluster")]
    pub session_ttl: Duration,

    /// With --cluster: the clock of --clock-nodes nodes runs at this rate
    /// of real time while they lead (their cluster time, leases and TTLs
    /// with it). The default, 0.05 % fast, is what NTP allows; the clients'
    /// allowance for clock rates must cover it. 1 for exact clocks.
    #[arg(long, default_value_t = 1.0005, value_parser = clock_rate, requires = "cluster")]
    pub clock_rate: f64,

    /// With --cluster: how many nodes (the first ones) run at --clock-rate.
    #[arg(long, default_value_t = 1, requires = "cluster")]
    pub clock_nodes: u64,

    /// With --cluster: no proxies on the links between nodes, so no
    /// partition faults (kills, pauses and restarts only).
    #[arg(long, requires = "cluster")]
    pub no_partitions: bool,

    /// With --cluster: only these kinds of fault (comma-separated), each
    /// drawn as often as in the full mix; default: every kind but the power
    /// cuts (power-cut-node, power-cut-minority, power-cut-cluster), which
    /// run the nodes with --test-volatile-disk and so need a dlock-server
    /// built with the testing feature (cargo build -p dlock-server -p
    /// dlock-torture builds it so).
    #[arg(
        long,
        value_name = "KIND,...",
        value_enum,
        value_delimiter = ',',
        requires = "cluster"
    )]
    pub faults: Vec<crate::faults::nodes::Kind>,

    /// Fail the run (exit 1) when a client lost a lock or a waiter its
    /// place in line while a majority of the nodes was up and reachable
    /// (not during a fault that takes a majority down or cuts the clients
    /// off, nor while the cluster settles after one). Without it they are
    /// only counted in the summary.
    #[arg(long)]
    pub require_availability: bool,
}

/// The range a node's `--test-clock-rate` takes.
fn clock_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(0.5..=2.0).contains(&rate) {
        return Err(format!("{s}: must be between 0.5 and 2"));
    }
    Ok(rate)
}

/// A cluster refuses sessions shorter than a second
/// (`dlock_server::ops::config::MIN_SESSION_TTL`), so every honest client
/// would fail to open one.
fn session_ttl(s: &str) -> Result<Duration, String> {
    let ttl = dlock::duration::parse_positive(s)?;
    let least = dlock_server::ops::config::MIN_SESSION_TTL;
    if ttl < least {
        return Err(format!(
            "must be at least {least:?}, the least a cluster accepts"
        ));
    }
    Ok(ttl)
}
