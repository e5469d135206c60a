//! What the server counts for Prometheus: requests, latencies, grants,
//! waits, connections and bytes, and how they are written out on a scrape.
//!
//! Recording sits on the request path, so it must cost next to nothing:
//! every count is a relaxed atomic add, and the counts bumped per request
//! live in `SHARDS` stripes, one chosen per thread, so the runtime's
//! worker threads do not bounce one cache line between cores. A scrape adds
//! the stripes up. The counts are process-wide statics, like the limit log's
//! throttles: a process runs one server, and the hooks in the connection
//! and request code need no handle passed down to them. The gauges (held
//! keys, waiters, connections) are read through a callback at scrape time, so
//! they cost the request path nothing at all.
//!
//! [`http`](crate::ops::metrics_http) serves what [`Scrape`] encodes.

use dlock_proto::proto::ResponseStatus;
use dlock_proto::proto::ServerStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Stripes of the per-request counts: more than the cores of the machines
/// dlock runs on, so threads rarely share one; 16 stripes of about 2.5 KB.
const SHARDS: usize = 16;

/// Request type label values, indexed by the `RequestType` value; the last
/// one is for a type number the server does not know.
const TYPES: [&str; 17] = [
    "invalid",
    "ping",
    "lock",
    "unlock",
    "renew",
    "inspect",
    "hello",
    "open_session",
    "close_session",
    "cluster_status",
    "cluster_add",
    "cluster_remove",
    "enqueue",
    "wait",
    "proclaim",
    "watch",
    "unknown",
];

/// Every status the server sends, in label form, dense-indexed by
/// [`status_index`].
const STATUSES: [(ResponseStatus, &str); 23] = [
    (ResponseStatus::Ok, "ok"),
    (ResponseStatus::General, "general"),
    (ResponseStatus::Version, "version"),
    (ResponseStatus::InvalidType, "invalid_type"),
    (ResponseStatus::AccessDenied, "access_denied"),
    (ResponseStatus::ShuttingDown, "shutting_down"),
    (ResponseStatus::LimitReached, "limit_reached"),
    (ResponseStatus::FrameTooLarge, "frame_too_large"),
    (ResponseStatus::TooManyKeys, "too_many_keys"),
    (ResponseStatus::InvalidKey, "invalid_key"),
    (ResponseStatus::NoKeys, "no_keys"),
    (ResponseStatus::InvalidArgument, "invalid_argument"),
    (ResponseStatus::AcquireTimeout, "acquire_timeout"),
    (ResponseStatus::NotHeld, "not_held"),
    (ResponseStatus::NotLeader, "not_leader"),
    (ResponseStatus::Unavailable, "unavailable"),
    (ResponseStatus::UnknownSession, "unknown_session"),
    (ResponseStatus::ModeConflict, "mode_conflict"),
    (ResponseStatus::LimitMismatch, "limit_mismatch"),
    (ResponseStatus::Queued, "queued"),
    (ResponseStatus::UnknownTicket, "unknown_ticket"),
    (ResponseStatus::ValueTooLarge, "value_too_large"),
    (ResponseStatus::WatchLimit, "watch_limit"),
];

fn status_index(status: ResponseStatus) -> usize {
    // Exhaustive on purpose: a status added to the protocol fails to
    // compile here until it has a label.
    match status {
        ResponseStatus::Ok => 0,
        ResponseStatus::General => 1,
        ResponseStatus::Version => 2,
        ResponseStatus::InvalidType => 3,
        ResponseStatus::AccessDenied => 4,
        ResponseStatus::ShuttingDown => 5,
        ResponseStatus::LimitReached => 6,
        ResponseStatus::FrameTooLarge => 7,
        ResponseStatus::TooManyKeys => 8,
        ResponseStatus::InvalidKey => 9,
        ResponseStatus::NoKeys => 10,
        ResponseStatus::InvalidArgument => 11,
        ResponseStatus::AcquireTimeout => 12,
        ResponseStatus::NotHeld => 13,
        ResponseStatus::NotLeader => 14,
        ResponseStatus::Unavailable => 15,
        ResponseStatus::UnknownSession => 16,
        ResponseStatus::ModeConflict => 17,
        ResponseStatus::LimitMismatch => 18,
        ResponseStatus::Queued => 19,
        ResponseStatus::UnknownTicket => 20,
        ResponseStatus::ValueTooLarge => 21,
        ResponseStatus::WatchLimit => 22,
    }
}

/// Upper bounds, in seconds, of the request latency buckets: a request the
/// server answers at once takes microseconds, a Lock that waits up to
/// minutes.
const LATENCY_BOUNDS: [f64; 14] = [
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0, 600.0,
];

/// Upper bounds, in seconds, of the hand-off wait buckets: from a hand-off
/// on a busy key (tens of microseconds) to a job queue's minutes.
const WAIT_BOUNDS: [f64; 12] = [
    1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// A histogram of atomics: per-bucket (not cumulative) counts, the number
/// of observations and their sum in nanoseconds.
struct Histogram<const N: usize> {
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    const fn new() -> Self {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; N],
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    fn observe(&self, bounds: &[f64; N], d: Duration) {
        let secs = d.as_secs_f64();
        // Beyond the last bound only the count (the +Inf bucket) grows.
        if let Some(i) = bounds.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }
}

/// The per-request counts of one stripe. Aligned so two stripes never
/// share a cache line.
#[repr(align(128))]
struct Shard {
    requests: [[AtomicU64; STATUSES.len()]; TYPES.len()],
    latency: [Histogram<{ LATENCY_BOUNDS.len() }>; TYPES.len()],
    wait: Histogram<{ WAIT_BOUNDS.len() }>,
    /// Grants at once, and grants after a wait.
    grants: [AtomicU64; 2],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Shard {
    const fn new() -> Self {
        Shard {
            requests: [const { [const { AtomicU64::new(0) }; STATUSES.len()] }; TYPES.len()],
            latency: [const { Histogram::new() }; TYPES.len()],
            wait: Histogram::new(),
            grants: [const { AtomicU64::new(0) }; 2],
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }
}

static STRIPES: [Shard; SHARDS] = [const { Shard::new() }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's stripe, handed out round-robin on first use.
    static MY_SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

fn shard() -> &'static Shard {
    let i = MY_SHARD.with(|s| match s.get() {
        Some(i) => i,
        None => {
            let i = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
            s.set(Some(i));
            i
        }
    });
    &STRIPES[i]
}

/// Why a connection ended, as counted in `dlock_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client closed its side.
    ClientClosed,
    /// No complete request for `--idle-timeout`.
    Idle,
    /// Responses could not be written for `--write-timeout`.
    WriteTimeout,
    /// Turned away at `--max-connections`.
    Limit,
    /// A frame length over `--max-frame`.
    FrameTooLarge,
    /// A socket error (reset, keepalive gave up).
    Io,
    /// The server shut down.
    Shutdown,
    /// The TLS handshake failed or took too long.
    TlsHandshake,
    /// A cluster node stopped leading and reset the connections whose
    /// sessions it kept.
    Deposed,
}

const CLOSE_REASONS: [(CloseReason, &str); 9] = [
    (CloseReason::ClientClosed, "client_closed"),
    (CloseReason::Idle, "idle"),
    (CloseReason::WriteTimeout, "write_timeout"),
    (CloseReason::Limit, "limit"),
    (CloseReason::FrameTooLarge, "frame_too_large"),
    (CloseReason::Io, "io_error"),
    (CloseReason::Shutdown, "shutdown"),
    (CloseReason::TlsHandshake, "tls_handshake"),
    (CloseReason::Deposed, "deposed"),
];

/// Upper bounds, in seconds, of the Raft log's fsync and commit buckets:
/// an fsync takes tens of microseconds on a disk whose write cache survives
/// power loss, milliseconds on most, hundreds when stalled; a commit adds a
/// round trip to a majority.
const RAFT_BOUNDS: [f64; 14] = [
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Upper bounds, in seconds, of the snapshot buckets: milliseconds for a
/// small table, tens of seconds at millions of keys.
const SNAPSHOT_BOUNDS: [f64; 10] = [1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 120.0];

// Raft's own timings happen per log write or commit, not per request:
// one histogram each, without stripes.
static LOG_FSYNC: Histogram<{ RAFT_BOUNDS.len() }> = Histogram::new();
static COMMIT: Histogram<{ RAFT_BOUNDS.len() }> = Histogram::new();
static SNAPSHOT: Histogram<{ SNAPSHOT_BOUNDS.len() }> = Histogram::new();
static LEADER_CHANGES: AtomicU64 = AtomicU64::new(0);
/// Peer hellos refused: by this node, and of this node by a peer.
static PEER_REFUSALS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

// Counts that change once per connection or per timer batch, never per
// request: one atomic each is cheap enough.
static CLOSED: [AtomicU64; CLOSE_REASONS.len()] =
    [const { AtomicU64::new(0) }; CLOSE_REASONS.len()];
static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static LEASES_EXPIRED: AtomicU64 = AtomicU64::new(0);

/// Counts a request answered with `status` after `elapsed` in the server.
/// `kind` is the request's raw type number.
pub fn request(kind: i32, status: ResponseStatus, elapsed: Duration) {
    let t = usize::try_from(kind)
        .ok()
        .filter(|&k| k < TYPES.len() - 1)
        .unwrap_or(TYPES.len() - 1);
    let s = shard();
    s.requests[t][status_index(status)].fetch_add(1, Relaxed);
    s.latency[t].observe(&LATENCY_BOUNDS, elapsed);
}

/// Counts a Lock granted at once.
pub fn granted_at_once() {
    shard().grants[0].fetch_add(1, Relaxed);
}

/// Counts a Lock granted after waiting `waited`.
pub fn granted_after(waited: Duration) {
    let s = shard();
    s.grants[1].fetch_add(1, Relaxed);
    s.wait.observe(&WAIT_BOUNDS, waited);
}

/// Grants so far, and of those the ones that had waited (hand-offs).
pub fn grants() -> (u64, u64) {
    let (at_once, after) = (total(|s| &s.grants[0]), total(|s| &s.grants[1]));
    (at_once + after, after)
}

/// Counts bytes read from clients.
pub fn bytes_in(n: usize) {
    shard().bytes_in.fetch_add(n as u64, Relaxed);
}

/// Counts bytes written to clients.
pub fn bytes_out(n: usize) {
    shard().bytes_out.fetch_add(n as u64, Relaxed);
}

/// Counts an accepted connection (one turned away at the limit included).
pub fn connection_accepted() {
    ACCEPTED.fetch_add(1, Relaxed);
}

/// Counts a connection that ended, by why.
pub fn connection_closed(reason: CloseReason) {
    if let Some(i) = CLOSE_REASONS.iter().position(|(r, _)| *r == reason) {
        CLOSED[i].fetch_add(1, Relaxed);
    }
}

/// Counts leases that expired.
pub fn leases_expired(n: usize) {
    LEASES_EXPIRED.fetch_add(n as u64, Relaxed);
}

/// A durable write of the Raft log (its fsync included) took `d`.
pub fn log_fsync(d: Duration) {
    LOG_FSYNC.observe(&RAFT_BOUNDS, d);
}

/// A command proposed on this leader was committed and applied after `d`.
pub fn committed(d: Duration) {
    COMMIT.observe(&RAFT_BOUNDS, d);
}

/// A snapshot of the table took `d` to build and write.
pub fn snapshot_built(d: Duration) {
    SNAPSHOT.observe(&SNAPSHOT_BOUNDS, d);
}

/// This node learned of a new leader (itself included).
pub fn leader_changed() {
    LEADER_CHANGES.fetch_add(1, Relaxed);
}

/// A peer's hello was refused: by this node (`by_this_node`), or this
/// node's by the peer. Counted at every dial, where the log line is paced.
pub fn peer_refused(by_this_node: bool) {
    PEER_REFUSALS[usize::from(!by_this_node)].fetch_add(1, Relaxed);
}

fn total(f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
    STRIPES.iter().map(|s| f(s).load(Relaxed)).sum()
}

/// The gauges read at a scrape: the server's counts and, on a cluster
/// node, its Raft state.
#[derive(Debug, Clone)]
pub struct Gauges {
    /// Connections, held keys, waiting requests and sessions now.
    pub stats: ServerStats,
    /// A cluster node's Raft state.
    pub raft: Option<RaftGauges>,
}

/// A cluster node's Raft state, as its gauges show it.
#[derive(Debug, Clone, Default)]
pub struct RaftGauges {
    /// The current term.
    pub term: u64,
    /// The node's role, in lower case (leader, follower, ...).
    pub role: String,
    /// Whether the node knows a leader.
    pub leader_known: bool,
    /// The last log index it knows committed.
    pub committed_index: u64,
    /// The last log index applied to its table.
    pub applied_index: u64,
    /// Leader only: how many entries each member (by node id) is behind.
    pub lags: Vec<(u64, u64)>,
}

/// Reads the gauges at a scrape.
pub type ReadGauges = Arc<dyn Fn() -> Gauges + Send + Sync>;

/// Writes every dlock metric on a scrape: the static counts above, and the
/// gauges read from the server at that moment.
pub struct Scrape {
    gauges: ReadGauges,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape").finish_non_exhaustive()
    }
}

/// A registry holding dlock's metrics, whose gauges `gauges` reads, ready
/// to encode.
pub fn registry(gauges: ReadGauges) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { gauges }));
    registry
}

/// The two text formats a scrape is answered in. They differ in how a
/// counter is named: OpenMetrics gives the family's HELP and TYPE as
/// `dlock_grants` and its samples as `dlock_grants_total`, the older
/// Prometheus format names all three `dlock_grants_total`. A reader of the
/// older format given OpenMetrics (`promtool check metrics`, for one) sees
/// every counter's samples without help text or type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, which Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4, for whoever does not ask for
    /// OpenMetrics (curl, promtool, older scrapers).
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a weight (`q`) above 0 and no
    /// lower than `text/plain`'s; otherwise the older text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let (mut open, mut text) = (0.0f32, 0.0f32);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let q = parts
                .find_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim()
                        .eq_ignore_ascii_case("q")
                        .then(|| v.trim().parse::<f32>().ok())?
                })
                .unwrap_or(1.0);
            if media.eq_ignore_ascii_case("application/openmetrics-text") {
                open = open.max(q);
            } else if media.eq_ignore_ascii_case("text/plain") {
                text = text.max(q);
            }
        }
        if open > 0.0 && open >= text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The Content-Type of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Everything `registry` holds, in `format`.
///
/// # Errors
/// A collector that fails to encode.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut open = String::new();
    prometheus_client::encoding::text::encode(&mut open, registry)?;
    Ok(match format {
        Format::OpenMetrics => open,
        Format::Text => older_text_format(&open),
    })
}

/// OpenMetrics as `prometheus_client` writes dlock's families, in the
/// older text format: a counter's HELP and TYPE lines name its samples
/// (`_total`), and the `# EOF` and `# UNIT` lines, which that format does
/// not have, go. Samples, labels and numbers are written alike in both.
fn older_text_format(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|tag| {
            let (name, rest) = line.strip_prefix(tag)?.split_once(' ')?;
            counters.contains(name).then_some((tag, name, rest))
        });
        match descriptor {
            Some((tag, name, rest)) => {
                out.push_str(tag);
                out.push_str(name);
                out.push_str("_total ");
                out.push_str(rest);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A counter family with one sample per label set.
fn counter<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (L, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in values {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter without labels.
fn plain_counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// Adds up histograms (one per stripe, or a single one) in the encoder's
/// terms: sum in seconds, count, and per-bucket counts ending with +Inf
/// (the encoder makes them cumulative).
fn histogram_totals<'a, const N: usize>(
    bounds: &[f64; N],
    parts: impl IntoIterator<Item = &'a Histogram<N>>,
) -> (f64, u64, Vec<(f64, u64)>) {
    let mut buckets = [0u64; N];
    let (mut count, mut sum) = (0u64, 0u64);
    for h in parts {
        for (b, a) in buckets.iter_mut().zip(&h.buckets) {
            *b += a.load(Relaxed);
        }
        count += h.count.load(Relaxed);
        sum = sum.saturating_add(h.sum_nanos.load(Relaxed));
    }
    let bounded: u64 = buckets.iter().sum();
    // Read a moment apart from the buckets, the count can be behind them:
    // the total must never be below the buckets' sum.
    let count = count.max(bounded);
    let mut out: Vec<(f64, u64)> = bounds.iter().copied().zip(buckets).collect();
    out.push((f64::INFINITY, count - bounded));
    (sum as f64 / 1e9, count, out)
}

/// One unlabelled histogram family.
fn histogram<'a, const N: usize>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bounds: &[f64; N],
    parts: impl IntoIterator<Item = &'a Histogram<N>>,
) -> Result<(), std::fmt::Error> {
    let (sum, count, buckets) = histogram_totals(bounds, parts);
    e.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let mut requests = Vec::new();
        for (t, kind) in TYPES.iter().enumerate() {
            for (i, (_, status)) in STATUSES.iter().enumerate() {
                let n = total(|s| &s.requests[t][i]);
                // Pairs never seen are left out, as a labelled counter
                // that was never incremented would be.
                if n > 0 {
                    requests.push(([("type", *kind), ("status", *status)], n));
                }
            }
        }
        counter(
            e,
            "dlock_requests",
            "Requests answered, by request type and response status.",
            requests,
        )?;

        let mut family = e.encode_descriptor(
            "dlock_request_duration_seconds",
            "Time from executing a request to its answer; for a Lock that waits, the wait included.",
            None,
            MetricType::Histogram,
        )?;
        for (t, kind) in TYPES.iter().enumerate() {
            let (sum, count, buckets) =
                histogram_totals(&LATENCY_BOUNDS, STRIPES.iter().map(|s| &s.latency[t]));
            if count > 0 {
                family
                    .encode_family(&[("type", *kind)])?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }

        histogram(
            e,
            "dlock_lock_wait_seconds",
            "How long Locks that waited waited before their grant (the hand-off time).",
            &WAIT_BOUNDS,
            STRIPES.iter().map(|s| &s.wait),
        )?;

        counter(
            e,
            "dlock_grants",
            "Locks granted, at once or after waiting.",
            [
                ([("after", "none")], total(|s| &s.grants[0])),
                ([("after", "wait")], total(|s| &s.grants[1])),
            ],
        )?;
        plain_counter(
            e,
            "dlock_leases_expired",
            "Keys whose lease ran out.",
            LEASES_EXPIRED.load(Relaxed),
        )?;
        plain_counter(
            e,
            "dlock_connections_accepted",
            "Client connections accepted, including those turned away at --max-connections.",
            ACCEPTED.load(Relaxed),
        )?;
        let closed = CLOSE_REASONS
            .iter()
            .zip(&CLOSED)
            .map(|((_, name), n)| ([("reason", *name)], n.load(Relaxed)));
        counter(
            e,
            "dlock_connections_closed",
            "Client connections ended, by reason.",
            closed,
        )?;
        plain_counter(
            e,
            "dlock_received_bytes",
            "Bytes read from clients.",
            total(|s| &s.bytes_in),
        )?;
        plain_counter(
            e,
            "dlock_sent_bytes",
            "Bytes written to clients.",
            total(|s| &s.bytes_out),
        )?;

        let mut family = e.encode_descriptor(
            "dlock_build_info",
            "1, labelled with this build's version and the commit it was made from.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(family.encode_family(&[
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", crate::COMMIT),
        ])?)?;

        // On a cluster node, this node's copy of the table (a follower's
        // lags by its replication delay).
        let Gauges { stats, raft } = (self.gauges)();
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(status) = &raft {
            raft_gauges(e, status)?;
        }
        gauge(
            e,
            "dlock_connections",
            "Client connections open now.",
            signed(stats.connections),
        )?;
        gauge(
            e,
            "dlock_held_keys",
            "Keys held now, leases included.",
            signed(stats.held_keys),
        )?;
        gauge(
            e,
            "dlock_waiting_requests",
            "Lock requests waiting now.",
            signed(stats.waiting_requests),
        )?;
        gauge(
            e,
            "dlock_sessions",
            "Sessions open now: on a cluster every session, kept for its TTL after its connection ends; on a single server the connections that have asked for a lock.",
            signed(stats.sessions),
        )?;
        Ok(())
    }
}

/// The Raft state of a cluster node: term, role, indexes, and (on the
/// leader) each member's replication lag.
fn raft_gauges(e: &mut DescriptorEncoder, s: &RaftGauges) -> Result<(), std::fmt::Error> {
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    gauge(
        e,
        "dlock_raft_term",
        "This node's current Raft term.",
        signed(s.term),
    )?;
    let mut family = e.encode_descriptor(
        "dlock_raft_role",
        "1 for this node's Raft role (leader, follower, candidate, learner, stopped, stepped_aside: a leader without a majority lately).",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(1i64).encode(family.encode_family(&[("role", s.role.as_str())])?)?;
    gauge(
        e,
        "dlock_raft_leader_known",
        "1 when this node knows a leader.",
        i64::from(s.leader_known),
    )?;
    gauge(
        e,
        "dlock_raft_committed_index",
        "The last log index this node knows committed.",
        signed(s.committed_index),
    )?;
    gauge(
        e,
        "dlock_raft_applied_index",
        "The last log index applied to this node's table.",
        signed(s.applied_index),
    )?;
    let mut family = e.encode_descriptor(
        "dlock_raft_replication_lag",
        "Leader only: log entries each member is behind the leader's log.",
        None,
        MetricType::Gauge,
    )?;
    for &(node, lag) in &s.lags {
        let node = node.to_string();
        ConstGauge::new(signed(lag)).encode(family.encode_family(&[("node", node.as_str())])?)?;
    }
    plain_counter(
        e,
        "dlock_raft_leader_changes",
        "Times this node learned of a new leader (itself included).",
        LEADER_CHANGES.load(Relaxed),
    )?;
    counter(
        e,
        "dlock_raft_peer_refusals",
        "Peer connections refused at their hello (another --cluster-id or --initial-cluster, or an address that reached the wrong node), by which side refused.",
        [
            ([("by", "this_node")], PEER_REFUSALS[0].load(Relaxed)),
            ([("by", "peer")], PEER_REFUSALS[1].load(Relaxed)),
        ],
    )?;
    histogram(
        e,
        "dlock_raft_log_fsync_seconds",
        "Durable writes of this node's Raft log, their fsync included.",
        &RAFT_BOUNDS,
        [&LOG_FSYNC],
    )?;
    histogram(
        e,
        "dlock_raft_commit_seconds",
        "Leader only: from proposing a command to its answer, committed by a majority and applied.",
        &RAFT_BOUNDS,
        [&COMMIT],
    )?;
    histogram(
        e,
        "dlock_raft_snapshot_seconds",
        "Snapshots of the table this node built and wrote.",
        &SNAPSHOT_BOUNDS,
        [&SNAPSHOT],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_own_label() {
        for (i, (status, _)) in STATUSES.iter().enumerate() {
            assert_eq!(status_index(*status), i);
        }
    }

    #[test]
    fn openmetrics_only_for_whoever_asks_for_it() {
        let open = |a: &str| Format::negotiate(Some(a)) == Format::OpenMetrics;
        assert_eq!(Format::negotiate(None), Format::Text);
        assert!(!open("*/*"), "curl");
        assert!(!open("text/plain; version=0.0.4"));
        // Prometheus 2 and 3 by default.
        assert!(open("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
        assert!(open("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"));
        // A Prometheus told to prefer the older format.
        assert!(!open(
            "text/plain;version=0.0.4;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4"
        ));
        assert!(!open("application/openmetrics-text; q=0"));
        assert!(open("Application/OpenMetrics-Text; Q=0.9"));
    }

    /// What `promtool check metrics` asks of the older format: every
    /// sample's family has HELP and TYPE under the sample's own name (a
    /// histogram's `_bucket`, `_sum` and `_count` under the family's).
    #[test]
    fn in_the_older_format_every_sample_has_help_and_a_type() {
        // Every family a cluster node writes, each with samples.
        request(1, ResponseStatus::Ok, Duration::from_micros(50));
        leader_changed();
        let gauges: ReadGauges = Arc::new(|| Gauges {
            stats: ServerStats::default(),
            raft: Some(RaftGauges {
                role: "leader".into(),
                lags: vec![(2, 0)],
                ..RaftGauges::default()
            }),
        });
        let registry = registry(gauges);
        let open = encode(&registry, Format::OpenMetrics).unwrap();
        assert!(open.contains("# TYPE dlock_grants counter\n"), "{open}");
        assert!(open.ends_with("# EOF\n"), "{open}");
        let text = encode(&registry, Format::Text).unwrap();
        assert!(!text.contains("# EOF"), "{text}");
        let described = |tag: &str| -> std::collections::HashMap<String, String> {
            text.lines()
                .filter_map(|l| l.strip_prefix(tag)?.split_once(' '))
                .map(|(name, rest)| (name.to_owned(), rest.to_owned()))
                .collect()
        };
        let (help, types) = (described("# HELP "), described("# TYPE "));
        let mut samples = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = &line[..line.find(['{', ' ']).unwrap_or(line.len())];
            let family = ["_bucket", "_sum", "_count"]
                .into_iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                .unwrap_or(name);
            assert!(
                help.get(family).is_some_and(|h| !h.is_empty()),
                "{name} has no help text:\n{text}"
            );
            let t = types
                .get(family)
                .unwrap_or_else(|| panic!("{name} has no type"));
            assert_eq!(t == "counter", name.ends_with("_total"), "{name} is a {t}");
            samples += 1;
        }
        for counter in [
            "dlock_requests_total",
            "dlock_grants_total",
            "dlock_leases_expired_total",
            "dlock_connections_accepted_total",
            "dlock_connections_closed_total",
            "dlock_received_bytes_total",
            "dlock_sent_bytes_total",
            "dlock_raft_leader_changes_total",
            "dlock_raft_peer_refusals_total",
        ] {
            assert_eq!(
                types.get(counter).map(String::as_str),
                Some("counter"),
                "{text}"
            );
        }
        assert!(samples > 50, "{text}");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_every_observation() {
        static H: Histogram<2> = Histogram::new();
        let bounds = [1e-3, 1.0];
        H.observe(&bounds, Duration::from_micros(10));
        H.observe(&bounds, Duration::from_millis(500));
        H.observe(&bounds, Duration::from_secs(5));
        let buckets: Vec<u64> = H.buckets.iter().map(|b| b.load(Relaxed)).collect();
        assert_eq!(buckets, [1, 1]);
        assert_eq!(H.count.load(Relaxed), 3);
        assert_eq!(H.sum_nanos.load(Relaxed), 5_500_010_000);
    }
}
