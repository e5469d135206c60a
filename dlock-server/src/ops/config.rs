//! Server configuration: command-line flags, their defaults and limits.

use clap::Parser;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// The dlock lock server.
///
/// Holds named locks in memory and serves them over TCP with the dlock v2
/// protocol (see docs/PROTOCOL.md). Every limit below is per server unless it
/// says otherwise; a request that hits one gets a status naming it.
#[derive(Debug, Clone, Parser)]
#[command(name = "dlock-server", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on. Loopback by default; use 0.0.0.0:7436 to serve
    /// other machines (and set --token-file).
    #[arg(long, env = "DLOCK_LISTEN", default_value = dlock_proto::DEFAULT_ADDR, value_parser = listen_addr)]
    pub listen: SocketAddr,

    /// Access control file: tokens (a bare token per line has every right)
    /// and named identities with rules such as "lock jobs/*" (see
    /// docs/PROTOCOL.md). When set, every request must come from one of
    /// them. Re-read on SIGHUP.
    #[arg(long, env = "DLOCK_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Serve clients over TLS with this certificate chain (PEM, leaf
    /// first). Re-read on SIGHUP; open connections keep theirs.
    #[arg(
        long,
        env = "DLOCK_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "DLOCK_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Require clients to present a certificate signed by a CA in this PEM
    /// file (mutual TLS). A certificate's subject CN or DNS name can stand
    /// for an access token: see "identity" in the token file.
    #[arg(
        long,
        env = "DLOCK_TLS_CLIENT_CA",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// File that keeps fencing tokens increasing even if the wall clock steps
    /// back across a restart. Without it tokens are derived from the clock.
    /// One server per file: a second is refused while PATH.lock is held.
    /// In-memory server only: with --data-dir the fences are kept in the
    /// data directory (and start from 1 in a new one).
    #[arg(
        long,
        env = "DLOCK_FENCE_FILE",
        value_name = "PATH",
        conflicts_with = "data_dir"
    )]
    pub fence_file: Option<PathBuf>,

    /// Largest request frame body, in bytes.
    #[arg(long, env = "DLOCK_MAX_FRAME", default_value_t = dlock_proto::DEFAULT_MAX_FRAME, value_parser = frame_size)]
    pub max_frame: usize,

    /// Most keys in one request.
    #[arg(long, env = "DLOCK_MAX_KEYS", default_value_t = 256, value_parser = positive)]
    pub max_keys: usize,

    /// Longest key, in bytes.
    #[arg(long, env = "DLOCK_MAX_KEY_LEN", default_value_t = 1024, value_parser = positive)]
    pub max_key_len: usize,

    /// Most client connections at once; further clients get LimitReached.
    /// A client of the Rust library holds one, plus one per lock held (a
    /// `dlock` run holding a lock counts two).
    #[arg(long, env = "DLOCK_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = positive)]
    pub max_connections: usize,

    /// Most unanswered requests per connection; the server stops reading the
    /// connection until it catches up.
    #[arg(long, env = "DLOCK_MAX_PIPELINE", default_value_t = 1024, value_parser = positive)]
    pub max_pipeline: usize,

    /// Most sessions (OpenSession) one connection may have open at once.
    #[arg(long, env = "DLOCK_MAX_SESSIONS", default_value_t = 256, value_parser = positive)]
    pub max_sessions: usize,

    /// Most sessions open at once in a cluster, over all clients and
    /// nodes: a new one beyond it is refused (LimitReached). Each session
    /// costs memory on every node for its TTL after its client left.
    #[arg(long, env = "DLOCK_MAX_CLUSTER_SESSIONS", default_value_t = 100_000, value_parser = positive, help_heading = "Cluster")]
    pub max_cluster_sessions: usize,

    /// Most Watch requests parked at once, over all connections; a Watch
    /// beyond it is refused (WatchLimit). 0 turns Watch off. Each parked
    /// Watch is re-checked after every change to the table.
    #[arg(long, env = "DLOCK_MAX_WATCHERS", default_value_t = 1024)]
    pub max_watchers: usize,

    /// Most Lock requests waiting at once, over all connections.
    #[arg(long, env = "DLOCK_MAX_WAITERS", default_value_t = 100_000, value_parser = positive)]
    pub max_waiters: usize,

    /// Most keys held at once, over all connections.
    #[arg(long, env = "DLOCK_MAX_HELD_KEYS", default_value_t = 4_000_000, value_parser = positive)]
    pub max_held_keys: usize,

    /// Longest lease a Lock or Renew may ask for.
    #[arg(long, env = "DLOCK_MAX_LEASE", default_value = "30days", value_parser = max_lease)]
    pub max_lease: Duration,

    /// Close a connection that sends no complete request for this long.
    #[arg(long, env = "DLOCK_IDLE_TIMEOUT", default_value = "60s", value_parser = idle_timeout)]
    pub idle_timeout: Duration,

    /// Close a connection whose responses cannot be written for this long
    /// (a client that stopped reading).
    #[arg(long, env = "DLOCK_WRITE_TIMEOUT", default_value = "10s", value_parser = dlock_proto::duration::parse_positive)]
    pub write_timeout: Duration,

    /// TCP keepalive: idle time before the first probe.
    #[arg(long, env = "DLOCK_KEEPALIVE_TIME", default_value = "30s", value_parser = dlock_proto::duration::parse_positive)]
    pub keepalive_time: Duration,

    /// TCP keepalive: time between probes.
    #[arg(long, env = "DLOCK_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = dlock_proto::duration::parse_positive)]
    pub keepalive_interval: Duration,

    /// TCP keepalive: unanswered probes before the connection is dropped.
    #[arg(long, env = "DLOCK_KEEPALIVE_RETRIES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=255))]
    pub keepalive_retries: u32,

    /// How long shutdown waits for connections to finish.
    #[arg(long, env = "DLOCK_SHUTDOWN_TIMEOUT", default_value = "5s", value_parser = dlock_proto::duration::parse_positive)]
    pub shutdown_timeout: Duration,

    /// Worker threads; 0 = one per CPU core (with --data-dir, one per core
    /// but one, which the node's consensus thread takes). With 1 the server runs on a
    /// single thread: no cross-thread wake-ups, and a release hands its key
    /// to the next waiter before answering the releaser, which makes lock
    /// hand-offs on a contended key about 30% faster (see BENCHMARKS.md).
    /// Each thread reserves a 2 MiB stack: a server that cannot start them
    /// (a thread or memory limit) says so and exits 1.
    #[arg(long, env = "DLOCK_THREADS", default_value_t = 0, value_parser = threads)]
    pub threads: usize,

    /// Serve Prometheus metrics (/metrics) and health probes (/healthz,
    /// /readyz) over HTTP on this address. Off by default.
    #[arg(long, env = "DLOCK_METRICS_LISTEN", value_name = "ADDR", value_parser = listen_addr)]
    pub metrics_listen: Option<SocketAddr>,

    /// Log filter (e.g. info, debug, dlock_server=trace). Overrides RUST_LOG.
    #[arg(long, env = "DLOCK_LOG_LEVEL")]
    pub log_level: Option<String>,

    /// Log line format: text for people, json (one object per line) for a
    /// log collector.
    #[arg(long, env = "DLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Keep the lock table durable in this directory, replicated by Raft
    /// (docs/CLUSTER.md). Alone: one durable node that keeps leases, holders
    /// and fences across restarts. Without it the server keeps everything
    /// in memory, as a single process.
    #[arg(
        long,
        env = "DLOCK_DATA_DIR",
        value_name = "DIR",
        help_heading = "Cluster"
    )]
    pub data_dir: Option<PathBuf>,

    /// This node's id in the cluster: unique, never reused.
    #[arg(long, env = "DLOCK_NODE_ID", default_value_t = 1, value_parser = node_id, requires = "data_dir", help_heading = "Cluster")]
    pub node_id: u64,

    /// Address the other nodes connect to (the peer port). Needed when the
    /// cluster has more than one node, by a node that joins one, and before
    /// `dlock cluster add` grows a cluster of one: without it, a cluster of
    /// one listens on a loopback port the kernel chooses at each start.
    #[arg(
        long,
        env = "DLOCK_PEER_LISTEN",
        value_name = "ADDR",
        requires = "data_dir",
        value_parser = listen_addr,
        help_heading = "Cluster"
    )]
    pub peer_listen: Option<SocketAddr>,

    /// Client address other nodes give clients in NotLeader answers
    /// (default: --listen's address).
    #[arg(
        long,
        env = "DLOCK_ADVERTISE_CLIENT",
        value_name = "ADDR",
        requires = "data_dir",
        help_heading = "Cluster"
    )]
    pub advertise_client: Option<String>,

    /// Encrypt and authenticate the peer port with mutual TLS: this node's
    /// certificate chain (PEM, leaf first), which must name the host of its
    /// peer address (an IP or DNS subject alternative name). Every node of
    /// the cluster needs --peer-tls-cert, --peer-tls-key and --peer-tls-ca.
    #[arg(long, env = "DLOCK_PEER_TLS_CERT", value_name = "PATH", requires_all = ["peer_tls_key", "peer_tls_ca", "data_dir"], help_heading = "Cluster")]
    pub peer_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --peer-tls-cert.
    #[arg(
        long,
        env = "DLOCK_PEER_TLS_KEY",
        value_name = "PATH",
        requires = "peer_tls_cert",
        help_heading = "Cluster"
    )]
    pub peer_tls_key: Option<PathBuf>,

    /// CA certificates (PEM) that sign every node's peer certificate: a peer
    /// is accepted, and dialled, only if its certificate chains to one.
    #[arg(
        long,
        env = "DLOCK_PEER_TLS_CA",
        value_name = "PATH",
        requires = "peer_tls_cert",
        help_heading = "Cluster"
    )]
    pub peer_tls_ca: Option<PathBuf>,

    /// Peer address other nodes dial (default: --peer-listen's address).
    #[arg(
        long,
        env = "DLOCK_ADVERTISE_PEER",
        value_name = "ADDR",
        requires = "data_dir",
        help_heading = "Cluster"
    )]
    pub advertise_peer: Option<String>,

    /// The members on first start, as ID=CLIENT_ADDR@PEER_ADDR,... (every
    /// initial node gets the same list). Read from the data directory on
    /// later starts, and ignored then.
    #[arg(long, env = "DLOCK_INITIAL_CLUSTER", value_name = "LIST", value_parser = parse_members, requires = "data_dir", help_heading = "Cluster")]
    pub initial_cluster: Option<Members>,

    /// With an empty data directory: `new` bootstraps the --initial-cluster
    /// members (a cluster's first start), and refuses to start if a running
    /// cluster already had this node (its directory was wiped: it lost its
    /// vote); `existing` joins a running cluster instead, waiting for its
    /// leader (a node added with `dlock cluster add`). Ignored once the
    /// directory holds data.
    #[arg(long, env = "DLOCK_INITIAL_CLUSTER_STATE", value_enum, default_value_t = InitialClusterState::New, requires = "data_dir", help_heading = "Cluster")]
    pub initial_cluster_state: InitialClusterState,

    /// For fault-injection tests only: dial node ID at ADDR instead of the
    /// peer address the membership names (ID=ADDR, repeatable), so a test
    /// can put a proxy it controls on each link between two nodes.
    #[arg(long, value_name = "ID=ADDR", value_parser = parse_route, hide = true)]
    pub peer_route: Vec<(u64, String)>,

    /// For fault-injection tests only: this node's clock runs at RATE
    /// times real time while it leads (1.001: 0.1 % fast), so a test can
    /// check that the clients' allowance for clock rates covers a node
    /// whose clock is off.
    #[arg(long, value_name = "RATE", default_value_t = 1.0, value_parser = parse_clock_rate, hide = true)]
    pub test_clock_rate: f64,

    /// For fault-injection tests only (a build with the `testing`
    /// feature): the raft log's writes are held in this process's memory
    /// until synced, some written early and torn (drawn from SEED), so a
    /// SIGKILL of the node is a power cut (engine/raft/storage_volatile.rs).
    #[cfg(feature = "testing")]
    #[arg(long, value_name = "SEED", hide = true)]
    pub test_volatile_disk: Option<u64>,

    /// Prepare the backup in --data-dir (a copy of one node's data
    /// directory, no node running on it) to restore a whole cluster, then
    /// exit: fences issued afterwards start above --fence-floor and every
    /// session in the backup ends. Copy the directory to every node and
    /// start them as usual (docs/CLUSTER.md, "Backup and restore").
    #[arg(
        long,
        env = "DLOCK_RESTORE_BACKUP",
        requires = "data_dir",
        help_heading = "Cluster"
    )]
    pub restore_backup: bool,

    /// With --restore-backup: the least fencing token granted after the
    /// restore (default: the wall clock in nanoseconds, as a single server
    /// starts its tokens).
    #[arg(long, env = "DLOCK_FENCE_FLOOR", value_name = "TOKEN", requires = "restore_backup", value_parser = clap::value_parser!(u64).range(1..=FENCE_FLOOR_MAX), help_heading = "Cluster")]
    pub fence_floor: Option<u64>,

    /// Name every node of one cluster shares; a peer with another is refused.
    #[arg(
        long,
        env = "DLOCK_CLUSTER_ID",
        default_value = "dlock",
        help_heading = "Cluster"
    )]
    pub cluster_id: String,

    /// TTL of a session whose client names none: how long its locks without
    /// a lease outlive a broken connection.
    #[arg(long, env = "DLOCK_SESSION_TTL", default_value = "10s", value_parser = session_ttl, help_heading = "Cluster")]
    pub session_ttl: Duration,

    /// Longest TTL a client may ask for in OpenSession.
    #[arg(long, env = "DLOCK_MAX_SESSION_TTL", default_value = "5min", value_parser = session_ttl, help_heading = "Cluster")]
    pub max_session_ttl: Duration,

    /// How often the leader sends heartbeats.
    #[arg(long, env = "DLOCK_HEARTBEAT", default_value = "100ms", value_parser = dlock_proto::duration::parse_positive, help_heading = "Cluster")]
    pub heartbeat: Duration,

    /// Each node draws a timeout between this and twice this. A follower
    /// that stops hearing its leader refuses other candidates for twice
    /// this (openraft's leader lease) and stands itself after the lease
    /// plus its own timeout: a dead leader is replaced after 3 to 4 times
    /// this. Raise it where a leader's fsync or scheduling can stall for
    /// hundreds of milliseconds, or such stalls start needless elections.
    #[arg(long, env = "DLOCK_ELECTION_TIMEOUT", default_value = "200ms", value_parser = dlock_proto::duration::parse_positive, help_heading = "Cluster")]
    pub election_timeout: Duration,

    /// Write a snapshot of the table after this many log entries since the
    /// last one, and purge the log it covers. Fewer entries keep less log on
    /// disk and make a restart replay less; each snapshot writes the whole
    /// table. SIGUSR1 asks a node for a snapshot at once, whatever this is.
    /// From 100 (below that a node would spend its time writing the whole
    /// table) to 100,000,000 (the log kept on disk grows with it: about
    /// 100 bytes an entry).
    #[arg(long, env = "DLOCK_SNAPSHOT_EVERY", value_name = "ENTRIES", default_value_t = DEFAULT_SNAPSHOT_EVERY, value_parser = clap::value_parser!(u64).range(100..=100_000_000), help_heading = "Cluster")]
    pub snapshot_every: u64,

    /// Write this node's snapshots at most this many MiB a second; 0 writes
    /// them as fast as the disk takes them. A snapshot shares the disk with
    /// the log, whose every commit waits for an fsync: written in one burst
    /// (83 MiB for a million held leases), it doubles the commits' tail
    /// latency while it lasts. Paced, it takes longer (about 3.3 s for a
    /// million leases at the default) and the commits hardly notice.
    /// A snapshot sent to a follower that lags is not paced.
    #[arg(long, env = "DLOCK_SNAPSHOT_WRITE_RATE", value_name = "MIB_PER_S", default_value_t = DEFAULT_SNAPSHOT_WRITE_RATE_MIB, value_parser = clap::value_parser!(u64).range(0..=1_000_000), help_heading = "Cluster")]
    pub snapshot_write_rate: u64,
}

/// Log entries between a node's snapshots unless `--snapshot-every` says
/// otherwise: at a few thousand entries a second, a snapshot every few
/// seconds, and about 11,000 entries on disk (with the 1,000 kept after it).
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 10_000;

/// MiB a second a node writes its own snapshots at unless
/// `--snapshot-write-rate` says otherwise: what kept the commits' tail at
/// its usual on the machine measured, where 48 still let it reach twice
/// that (BENCHMARKS.md, "no stall during a snapshot").
pub const DEFAULT_SNAPSHOT_WRITE_RATE_MIB: u64 = 24;

/// The initial members of a cluster: id, client address, peer address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members(pub Vec<(u64, String, String)>);

/// A clock at most twice as fast or slow as real time: anything further
/// is a typo, not a test.
fn parse_clock_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(0.5..=2.0).contains(&rate) {
        return Err(format!("{s}: must be between 0.5 and 2"));
    }
    Ok(rate)
}

fn parse_route(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not ID=ADDR"))?;
    let id = id
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("node id {id:?}: {e}"))?;
    if addr.trim().is_empty() {
        return Err(format!("{s:?} names no address"));
    }
    Ok((id, addr.trim().to_owned()))
}

fn parse_members(s: &str) -> Result<Members, String> {
    let mut out: Vec<(u64, String, String)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (id, addrs) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not ID=CLIENT_ADDR@PEER_ADDR"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{id:?} in {item:?} is not a node id (1 or more)"))?;
        let (client, peer) = addrs
            .split_once('@')
            .ok_or_else(|| format!("{item:?} is not ID=CLIENT_ADDR@PEER_ADDR"))?;
        if client.is_empty() || peer.is_empty() {
            return Err(format!("{item:?} has an empty address"));
        }
        if out.iter().any(|(other, _, _)| *other == id) {
            return Err(format!("node id {id} is listed twice"));
        }
        out.push((id, client.to_string(), peer.to_string()));
    }
    if out.is_empty() {
        return Err("no members listed".into());
    }
    Ok(Members(out))
}

/// Whether a node with an empty data directory starts a cluster or joins
/// one (`--initial-cluster-state`, as etcd names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InitialClusterState {
    /// Bootstrap the initial members: the cluster's first start.
    New,
    /// Join a cluster that already runs.
    Existing,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `tracing`'s human-readable lines.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the
    /// event's fields, and `span` (the connection's `peer`) when in one.
    Json,
}

impl Default for Config {
    fn default() -> Self {
        // The flag defaults are the one source of truth for defaults.
        Config::parse_from(["dlock-server"])
    }
}

impl Config {
    /// The limits the lock table enforces.
    pub fn table_limits(&self) -> crate::table::TableLimits {
        crate::table::TableLimits {
            max_waiters: self.max_waiters,
            max_held_keys: self.max_held_keys,
        }
    }

    /// How long after the last request this server may end a connection:
    /// the idle timeout, or sooner the keepalive give-up time (first probe,
    /// then every unanswered retry), or the write timeout (an answer to a
    /// later request that cannot be written). Locks bound to the connection
    /// are released then, so a client must treat this as its deadline.
    pub fn session_timeout(&self) -> Duration {
        // Saturating: durations on the command line have no ceiling, and
        // an absurd one must not panic every Hello.
        let keepalive = self.keepalive_time.saturating_add(
            self.keepalive_interval
                .saturating_mul(self.keepalive_retries),
        );
        self.idle_timeout.min(keepalive).min(self.write_timeout)
    }

    /// The limits a client is told in the answer to Hello.
    pub fn limits(&self) -> dlock_proto::proto::ServerLimits {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        dlock_proto::proto::ServerLimits {
            session_timeout_micro: micros(self.session_timeout()),
            max_lease_micro: micros(self.max_lease),
            max_keys: small(self.max_keys),
            max_key_len: small(self.max_key_len),
            max_frame: small(self.max_frame),
            max_pipeline: small(self.max_pipeline),
            resumable_sessions: false,
            election_timeout_micro: 0,
        }
    }
}

/// The most worker threads `--threads` may ask for: well past any core
/// count, and below where spawning them exhausts the process's limits.
const MOST_THREADS: usize = 1024;

/// `--threads`: 0 (one per core) up to [`MOST_THREADS`].
fn threads(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of threads"))?;
    if n > MOST_THREADS {
        return Err(format!(
            "{n} threads is more than {MOST_THREADS}; 0 (the default) runs one per core"
        ));
    }
    Ok(n)
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The highest --fence-floor: half of the table's
/// [`MAX_NEXT_FENCE`](crate::table::MAX_NEXT_FENCE), so a restored cluster
/// has a quarter of the token range to grant before its snapshots would
/// be taken for damage.
pub const FENCE_FLOOR_MAX: u64 = crate::table::MAX_NEXT_FENCE / 2;

/// The shortest session TTL: a session is kept alive by a commit every
/// third of its TTL while its connection is open, so a TTL of milliseconds
/// would make one idle connection a stream of commits.
pub const MIN_SESSION_TTL: Duration = Duration::from_secs(1);

/// An address to listen on: an IP address and a port. A host name is
/// refused (a name may resolve to several addresses, or to another one
/// after a restart), and the error says so with examples instead of
/// "invalid socket address syntax".
fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let examples = "for example 127.0.0.1:PORT (this machine only), 0.0.0.0:PORT (every \
                    interface) or [::]:PORT";
    match s.rsplit_once(':') {
        Some((host, _)) if host.trim_matches(['[', ']']).parse::<IpAddr>().is_err() => Err(
            format!("{host:?} is not an IP address: give IP:PORT, {examples}"),
        ),
        Some((_, port)) => Err(format!(
            "{port:?} is not a port number (0 to 65535): give IP:PORT, {examples}"
        )),
        None => Err(format!("no port: give IP:PORT, {examples}")),
    }
}

/// A duration of at least `least`: below, the flag would make the server
/// useless, and quietly (every lock lost, every connection dropped).
fn at_least(s: &str, least: Duration, why: &str) -> Result<Duration, String> {
    let d = dlock_proto::duration::parse_positive(s)?;
    if d < least {
        return Err(format!(
            "must be at least {}: {why}",
            humantime::format_duration(least)
        ));
    }
    Ok(d)
}

/// `--idle-timeout`: a client pings within it, so it must leave a round
/// trip and a scheduler's delay to spare.
fn idle_timeout(s: &str) -> Result<Duration, String> {
    let why = "a client must get a request through within it, or its connection is closed";
    at_least(s, Duration::from_millis(100), why)
}

/// `--max-lease`: a client renews a lease well before it ends, and gives
/// up a quarter of it as a safety margin.
fn max_lease(s: &str) -> Result<Duration, String> {
    let why = "a shorter lease ends before a client could renew it";
    at_least(s, Duration::from_secs(1), why)
}

fn session_ttl(s: &str) -> Result<Duration, String> {
    let why = "a session is kept alive by a commit every third of its TTL";
    at_least(s, MIN_SESSION_TTL, why)
}

/// Frames must fit a request with a few keys, and their length must fit
/// the 4-byte prefix with room to spare.
fn frame_size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if !(64..=64 * 1024 * 1024).contains(&n) {
        return Err("must be between 64 and 67108864 bytes".into());
    }
    Ok(n)
}

/// A node id: 0 is no node's (openraft and the wire use it for "none").
fn node_id(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("node ids start at 1".into()),
        Ok(id) => Ok(id),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag an operator may set can come from the environment
    /// instead (a container, a systemd unit), under one rule for its name.
    #[test]
    fn every_flag_has_an_environment_variable_named_after_it() {
        use clap::CommandFactory;
        let cmd = Config::command();
        let mut seen = 0;
        for a in cmd.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if a.is_hide_set() || matches!(long, "help" | "version") {
                continue;
            }
            let want = format!("DLOCK_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                a.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            seen += 1;
        }
        assert!(seen >= 40, "only {seen} flags seen");
    }

    #[test]
    fn defaults_parse() {
        let c = Config::default();
        assert_eq!(c.listen.to_string(), dlock_proto::DEFAULT_ADDR);
        assert_eq!(c.max_frame, 16 * 1024);
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn session_timeout_is_the_soonest_way_the_server_ends_a_connection() {
        // The write timeout, 10 s by default.
        assert_eq!(Config::default().session_timeout(), Duration::from_secs(10));
        let c = Config::parse_from([
            "s",
            "--keepalive-time",
            "5s",
            "--keepalive-interval",
            "1s",
            "--write-timeout",
            "60s",
        ]);
        // 5 s + 3 retries x 1 s
        assert_eq!(c.session_timeout(), Duration::from_secs(8));
        let c = Config::parse_from(["s", "--idle-timeout", "2s"]);
        assert_eq!(c.limits().session_timeout_micro, 2_000_000);
    }

    #[test]
    fn initial_cluster_lists_parse_and_bad_ones_are_refused() {
        let c = Config::parse_from([
            "s",
            "--data-dir",
            "d",
            "--initial-cluster",
            "1=127.0.0.1:7001@127.0.0.1:8001, 2=127.0.0.1:7002@127.0.0.1:8002",
        ]);
        let m = c.initial_cluster.expect("parsed");
        assert_eq!(m.0.len(), 2);
        assert_eq!(
            m.0[1],
            (2, "127.0.0.1:7002".into(), "127.0.0.1:8002".into())
        );
        for bad in ["", "1=a", "x=a@b", "0=a@b", "1=a@b,1=c@d", "1=@b"] {
            assert!(
                Config::try_parse_from(["s", "--data-dir", "d", "--initial-cluster", bad]).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_listen_address_is_an_ip_and_a_port_and_a_bad_one_says_which_part_is_wrong() {
        let parse = |flag: &str, value: &str| {
            Config::try_parse_from(["s", "--data-dir", "d", flag, value])
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        for flag in ["--listen", "--metrics-listen", "--peer-listen"] {
            assert!(parse(flag, "127.0.0.1:7436").is_ok());
            assert!(parse(flag, "[::1]:0").is_ok());
            let e = parse(flag, "localhost:7436").unwrap_err();
            assert!(e.contains("\"localhost\" is not an IP address"), "{e}");
            assert!(e.contains("0.0.0.0:PORT"), "{e}");
            let e = parse(flag, "127.0.0.1:99999").unwrap_err();
            assert!(e.contains("\"99999\" is not a port number"), "{e}");
            let e = parse(flag, "127.0.0.1").unwrap_err();
            assert!(e.contains("no port"), "{e}");
        }
    }

    #[test]
    fn session_ttls_and_the_fence_floor_have_bounds() {
        let parse = |args: &[&str]| Config::try_parse_from([&["s"], args].concat());
        assert!(parse(&["--session-ttl", "999ms"]).is_err());
        assert!(parse(&["--max-session-ttl", "100ms"]).is_err());
        assert!(parse(&["--session-ttl", "1s"]).is_ok());
        let floor = |n: u64| {
            let n = n.to_string();
            let args = ["--data-dir", "d", "--restore-backup", "--fence-floor", &n];
            parse(&args).map(|c| c.fence_floor)
        };
        assert_eq!(floor(FENCE_FLOOR_MAX).ok(), Some(Some(FENCE_FLOOR_MAX)));
        assert!(floor(FENCE_FLOOR_MAX + 1).is_err());
    }

    #[test]
    fn timeouts_too_short_to_serve_are_refused() {
        let parse = |args: &[&str]| Config::try_parse_from([&["s"], args].concat());
        for (flag, low, least) in [
            ("--idle-timeout", "1ms", "100ms"),
            ("--max-lease", "999ms", "1s"),
        ] {
            let e = parse(&[flag, low]).expect_err(low).to_string();
            assert!(e.contains("must be at least"), "{e}");
            assert!(parse(&[flag, least]).is_ok(), "{flag} {least}");
        }
    }

    #[test]
    fn cluster_flags_without_a_data_dir_are_refused_not_ignored() {
        let parse = |args: &[&str]| Config::try_parse_from([&["s"], args].concat());
        assert!(parse(&[]).is_ok(), "the defaults need nothing");
        for args in [
            &["--node-id", "5"][..],
            &["--peer-listen", "127.0.0.1:7437"],
            &["--initial-cluster", "1=127.0.0.1:1@127.0.0.1:2"],
            &["--initial-cluster-state", "existing"],
            &["--advertise-client", "h:1"],
            &["--advertise-peer", "h:2"],
        ] {
            let e = parse(args).expect_err(args[0]).to_string();
            assert!(e.contains("--data-dir"), "{args:?}: {e}");
            assert!(
                parse(&[args, &["--data-dir", "d"]].concat()).is_ok(),
                "{args:?}"
            );
        }
    }

    #[test]
    fn threads_are_bounded() {
        let parse = |n: &str| Config::try_parse_from(["s", "--threads", n]).map(|c| c.threads);
        assert_eq!(parse("0").ok(), Some(0));
        assert_eq!(parse("1024").ok(), Some(1024));
        assert!(parse("1025").is_err());
        assert!(parse("100000").is_err());
    }

    #[test]
    fn node_id_0_is_refused_saying_where_ids_start() {
        let parse = |args: &[&str]| Config::try_parse_from([&["s"], args].concat());
        let e = parse(&["--data-dir", "d", "--node-id", "0"]).unwrap_err();
        assert!(e.to_string().contains("node ids start at 1"), "{e}");
        assert!(parse(&["--data-dir", "d", "--node-id", "7"]).is_ok());
    }

    #[test]
    fn a_fence_file_is_refused_beside_a_data_dir_which_keeps_the_fences() {
        let parse = |args: &[&str]| Config::try_parse_from([&["s"], args].concat());
        assert!(parse(&["--fence-file", "f"]).is_ok());
        let both = parse(&["--fence-file", "f", "--data-dir", "d"]);
        let e = both.expect_err("ignored before");
        assert!(e.to_string().contains("--data-dir"), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Config::try_parse_from(["s", "--max-keys", "0"]).is_err());
        assert!(Config::try_parse_from(["s", "--idle-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["s", "--idle-timeout", "soon"]).is_err());
        assert!(Config::try_parse_from(["s", "--max-frame", "1"]).is_err());
        assert!(Config::try_parse_from(["s", "--log-format", "xml"]).is_err());
    }
}
