//! Command line of dlock-bench.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::time::Duration;

/// Load generator and benchmark for dlock-compatible servers.
///
/// Speaks only the dlock wire protocol, so it can measure any server that
/// does, including the original one. Every run is bounded by --duration and
/// optionally --ops, and stops by itself. With --server-pid the server's CPU
/// time per operation and its memory are read from /proc.
#[derive(Debug, Parser)]
#[command(name = "dlock-bench", version, about, long_about = None, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(subcommand)]
    pub workload: Workload,
}

const EXAMPLES: &str = "\
Examples:
  dlock-bench --server-pid $(pidof dlock-server) ping -c 50
  dlock-bench --duration 5s pipeline --depth 256
  dlock-bench contended -c 32
  dlock-bench multikey -c 32 --keys 8 --pool 1000
  dlock-bench --server-pid $(pidof dlock-server) hold --count 1000000
  dlock-bench --server-pid $(pidof dlock-server) conns --idle 10000
  dlock-bench --server LEADER snapshot-stall --leader-pid P1 --follower-pid P2
  dlock-bench --duration 5s sync-floor --dir /var/lib/dlock
  dlock-bench --json --duration 2s ping | jq .ops_per_sec";

/// Options every workload takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Server address (loopback only in this project's scripts).
    #[arg(long, global = true, default_value = dlock::DEFAULT_ADDR)]
    pub server: String,
    /// How long the measured part runs at most.
    #[arg(long, global = true, default_value = "10s", value_parser = duration)]
    pub duration: Duration,
    /// Stop after this many operations, if that comes first.
    #[arg(long, global = true)]
    pub ops: Option<u64>,
    /// Server process id: report its CPU time per operation and memory.
    #[arg(long, global = true)]
    pub server_pid: Option<u32>,
    /// Access token to send with every request.
    #[arg(
        long,
        global = true,
        env = "DLOCK_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    pub token: String,
    /// Connect with TLS, trusting the CA certificates in this PEM file (the
    /// server's certificate must name the host of --server).
    #[arg(long, global = true, env = "DLOCK_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum Workload {
    /// N connections, one Ping in flight each.
    Ping {
        #[arg(short = 'c', long, default_value_t = 50, value_parser = at_least_one)]
        connections: usize,
    },
    /// N connections, each locking and unlocking its own key (2 round trips per op).
    LockUnlock {
        #[arg(short = 'c', long, default_value_t = 50, value_parser = at_least_one)]
        connections: usize,
    },
    /// Connections with DEPTH requests in flight each.
    Pipeline {
        #[arg(short = 'c', long, default_value_t = 1, value_parser = at_least_one)]
        connections: usize,
        #[arg(long, default_value_t = 256)]
        depth: usize,
        /// Requests to pipeline: pings, or lock+unlock pairs (one op per pair).
        #[arg(long, value_enum, default_value_t = PipelineKind::Ping)]
        kind: PipelineKind,
    },
    /// N clients on one key: handoffs/s, handoff latency, FIFO check.
    Contended {
        #[arg(short = 'c', long, default_value_t = 32, value_parser = at_least_one)]
        connections: usize,
    },
    /// N connections locking K random keys of a pool of P; checks exclusivity.
    Multikey {
        #[arg(short = 'c', long, default_value_t = 32, value_parser = at_least_one)]
        connections: usize,
        #[arg(long, default_value_t = 8)]
        keys: usize,
        #[arg(long, default_value_t = 1000)]
        pool: usize,
    },
    /// N connections on a few hot keys, READERS percent of them taking
    /// their key shared (or all under a semaphore of --limit); checks that
    /// no writer shares a key and no semaphore overfills.
    Shared {
        #[arg(short = 'c', long, default_value_t = 32, value_parser = at_least_one)]
        connections: usize,
        /// Percent of the locks that read (shared); the rest write.
        #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(0..=100))]
        readers: u8,
        /// Hot keys the connections pick from.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        keys: u32,
        /// Every lock shared under this limit: a semaphore (0: readers and
        /// writers as --readers says).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// How long each holder keeps its key before unlocking (0: unlock
        /// at once). Readers gain from sharing only when holds last.
        #[arg(long, default_value = "0s", value_parser = hold_time)]
        hold: Duration,
    },
    /// Take COUNT keys (16-byte names) as leases, report server memory, release, report again.
    Hold {
        #[arg(long, default_value_t = 1_000_000)]
        count: u64,
        #[arg(short = 'c', long, default_value_t = 4, value_parser = at_least_one)]
        connections: usize,
        #[arg(long, default_value_t = 128)]
        depth: usize,
        /// Keys per Lock (a cluster commits each request once: batches
        /// fill its table faster). At most the server's --max-keys.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
        batch: u64,
        /// Leave the keys held (as one-hour leases) instead of releasing
        /// them, to measure other workloads against a full table.
        #[arg(long)]
        keep: bool,
        /// Once the keys are taken, print `holding N keys` and wait for a
        /// line (or the end) of standard input, or the --duration, before
        /// releasing them: a script measures the server full, then emptied.
        #[arg(long, conflicts_with = "keep")]
        release_on_input: bool,
    },
    /// Lock-unlock latency of a few clients without and with IDLE idle connections open.
    Conns {
        #[arg(long, default_value_t = 10_000)]
        idle: usize,
        #[arg(long, default_value_t = 4)]
        active: usize,
    },
    /// A cluster's cost of idle clients: N connections each open a session
    /// and then only Ping, every --every; reports the log entries the
    /// leader commits per second, and Pings per entry.
    IdleSessions {
        #[arg(short = 'c', long, default_value_t = 1000, value_parser = at_least_one)]
        connections: usize,
        /// A client library's heartbeat: a quarter of the session TTL.
        #[arg(long, default_value = "2.5s", value_parser = dlock::duration::parse_positive)]
        every: Duration,
    },
    /// Lock and Unlock latency on a cluster's leader in three phases of
    /// --duration each: quiet, the leader asked for a snapshot every
    /// --every (SIGUSR1), then a follower asked the same
    /// (bench/snapshot_stall.sh holds 1M leases first).
    SnapshotStall {
        #[arg(short = 'c', long, default_value_t = 16, value_parser = at_least_one)]
        connections: usize,
        /// The leader's process id.
        #[arg(long)]
        leader_pid: u32,
        /// A follower's process id.
        #[arg(long)]
        follower_pid: u32,
        /// How often a snapshot is asked for.
        #[arg(long, default_value = "1s", value_parser = dlock::duration::parse_positive)]
        every: Duration,
        /// Times the three phases are run, one after another.
        #[arg(long, default_value_t = 1)]
        rounds: u32,
    },
    /// The least CPU a durable commit costs here: RECORD-byte appends to a
    /// preallocated file in DIR, each followed by an fdatasync, as a
    /// cluster node's log writes them; reports this process's CPU per
    /// append (--server is not used). DIR must be on the disk the nodes'
    /// data directories are on (not a tmpfs).
    SyncFloor {
        /// Directory for the scratch file (removed at the end).
        #[arg(long, value_name = "DIR")]
        dir: std::path::PathBuf,
        /// Bytes per append: about one lock command's log entry.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
        record: u32,
    },
    /// Connect, lock, disconnect, repeatedly.
    Churn {
        #[arg(short = 'c', long, default_value_t = 8, value_parser = at_least_one)]
        connections: usize,
    },
    /// etcd's v3 lock as a reference: N clients, each with a session lease,
    /// Lock then Unlock through etcd's Lock service (built with --features
    /// etcd; --server is not used).
    #[cfg(feature = "etcd")]
    EtcdLock {
        #[arg(short = 'c', long, default_value_t = 32, value_parser = at_least_one)]
        connections: usize,
        /// etcd client URLs, comma-separated (give the leader's alone to
        /// spare requests a follower's hop).
        #[arg(long, default_value = "http://127.0.0.1:2379")]
        endpoints: String,
        /// Every client on one lock name: each cycle is a hand-off.
        #[arg(long)]
        contended: bool,
    },
}

/// Request mix of the pipeline workload.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum PipelineKind {
    Ping,
    LockUnlock,
}

/// A hold is at most a second: the workload is bounded by --duration.
fn hold_time(s: &str) -> Result<Duration, String> {
    let d = dlock::duration::parse(s)?;
    if d > Duration::from_secs(1) {
        return Err("must be at most 1s".into());
    }
    Ok(d)
}

/// Runs are bounded: at most an hour.
fn duration(s: &str) -> Result<Duration, String> {
    let d = dlock::duration::parse_positive(s)?;
    if d > Duration::from_secs(3600) {
        return Err("must be at most 1h".into());
    }
    Ok(d)
}

/// A client count: none would measure nothing (and divide by zero), and
/// the load stays bounded.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > 100_000 => Err("must be at most 100000".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_count_of_zero_is_refused() {
        assert!(Cli::try_parse_from(["dlock-bench", "contended", "-c", "0"]).is_err());
        assert!(Cli::try_parse_from(["dlock-bench", "contended", "-c", "2"]).is_ok());
    }
}
