//! What every task of a run shares, whatever the target: where the
//! clients connect, the keys, the fenced register and the history the
//! checker reads, the report, and the clock of the run. The fields about
//! sessions and faults that cut clients off matter on a cluster; on a
//! single server nothing cuts an honest client off, so its session (its
//! connection) is always owed.

use crate::availability::{Availability, Loss, Verdict};
use crate::cli::Args;
use crate::history::{History, Register};
use crate::report::Report;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The failover a lock or session must have room for, in election
/// timeouts: docs/CLUSTER.md gives a new leader 3 to 4, the long runs
/// measured 3.5 at the median and 5.6 at the slowest (1 s timeouts), and
/// the client needs a moment more to find it and resend.
pub const FAILOVER_ELECTIONS: u32 = 6;

/// Named apart from the server's `Shared`.
pub struct Workload {
    /// The address list the library's clients get (a cluster's nodes, or
    /// the one server).
    pub servers: String,
    /// The one server the wire-level clients and the client-side faults
    /// talk to (on a cluster they do not run).
    pub addr: SocketAddr,
    pub keys: Vec<String>,
    pub register: Register,
    pub history: History,
    pub report: Report,
    pub counts: Counts,
    /// From a fault on the leader to another node saying it leads.
    pub failovers: Mutex<Vec<Duration>>,
    /// How long clients' sessions went without a connection.
    pub resumes: Mutex<Vec<Duration>>,
    /// From a SIGTERM to the leader in a rolling restart until a node
    /// leads again: another, or the same one back.
    pub handovers: Mutex<Vec<Duration>>,
    /// From a SIGTERM in a rolling restart to the node back and caught up.
    pub restarts: Mutex<Vec<Duration>>,
    /// Locks and places in line lost while a majority was up and reachable.
    pub availability: Availability,
    pub stop_at: Instant,
    /// No fault starts after this: the end of the run is calm.
    pub faults_until: Instant,
    /// Set once every fault has healed and the cluster had time to settle:
    /// from then on every node is up and reachable, so a session lost is a
    /// violation, not a count.
    pub calm_from: Mutex<Option<Instant>>,
    /// Faults that may cost a session its life in progress, and when the
    /// last one to heal has settled: see [`Workload::sessions_owed`].
    pub disrupted: Mutex<(u32, Instant)>,
    /// The session TTL the library's clients ask for (a single server
    /// states its own session timeout instead).
    pub session_ttl: Duration,
    pub election_timeout: Duration,
}

impl Workload {
    /// The workload `args` ask for, with a calm end of `calm` and nothing
    /// owed for `settle` from now (a fresh cluster's first election).
    pub fn new(
        args: &Args,
        servers: String,
        addr: SocketAddr,
        calm: Duration,
        settle: Duration,
    ) -> Workload {
        let now = Instant::now();
        Workload {
            servers,
            addr,
            keys: (0..args.keys).map(|i| format!("key-{i}")).collect(),
            register: Register::default(),
            history: History::default(),
            report: Report::default(),
            counts: Counts::default(),
            failovers: Mutex::new(Vec::new()),
            resumes: Mutex::new(Vec::new()),
            handovers: Mutex::new(Vec::new()),
            restarts: Mutex::new(Vec::new()),
            availability: match args.cluster {
                Some(n) => Availability::new(
                    n as usize,
                    settle,
                    args.session_ttl + args.election_timeout * 4,
                    args.election_timeout * FAILOVER_ELECTIONS,
                    args.require_availability,
                ),
                // Nothing takes the one server away: every loss is judged.
                None => Availability::new(
                    0,
                    Duration::ZERO,
                    Duration::ZERO,
                    Duration::ZERO,
                    args.require_availability,
                ),
            },
            stop_at: now + args.duration,
            faults_until: now + args.duration - calm,
            calm_from: Mutex::new(None),
            disrupted: Mutex::new((0, now + settle)),
            session_ttl: args.session_ttl,
            election_timeout: args.election_timeout,
        }
    }

    /// Whether the target owes every client its session now: no fault
    /// that can cut a client from the leader (or end the leader's term) is
    /// in progress or settling, so a majority with the leader has been up
    /// and reachable from every client for a TTL and a few elections. Only
    /// followers may be down (killed, their log damaged), and never so many
    /// at once that the leader loses its majority (two faults on the two
    /// followers of three nodes: [`Availability::majority_reachable`]).
    /// Always so in the calm end, and always on a single server.
    pub fn sessions_owed(&self) -> bool {
        let calm = self
            .calm_from
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() >= t);
        let (active, settles) = *self.disrupted.lock().unwrap_or_else(|p| p.into_inner());
        calm || (active == 0 && Instant::now() >= settles && self.availability.majority_reachable())
    }

    /// A session ended while [`Self::sessions_owed`] says it was owed: a
    /// violation, reported with the faults in progress or settling, so a
    /// long run's one loss can be traced to its moment.
    pub fn session_lost_while_owed(&self, detail: String) {
        self.report.violation(
            "session lost with the leader and a majority up",
            format!("{detail} ({})", self.availability.faults_now()),
        );
    }

    /// A client lost `what`, which had `room` (its window less its safety
    /// margin), now: judged against the fault timeline, and a violation
    /// (described by `detail`) under `--require-availability` when a
    /// majority was up and reachable and the room was enough for a
    /// failover. A failed request of another kind is only counted.
    pub fn lost(&self, what: Loss, room: Duration, detail: impl FnOnce() -> String) {
        let judged = self.availability.lost(what, room) == Verdict::Judged;
        if judged && self.availability.require && what != Loss::Request {
            self.report.violation(what.name(), detail());
        }
    }

    /// The room a session gives what it holds or waits for: its TTL less
    /// the client's safety margin for it.
    pub fn session_room(&self) -> Duration {
        let margin = dlock::safety::margin(dlock::safety::DEFAULT_SAFETY_MARGIN, self.session_ttl);
        self.session_ttl.saturating_sub(margin)
    }

    /// A fault that may cost sessions starts.
    pub fn disruption_began(&self) {
        self.disrupted.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    /// Such a fault healed: sessions it doomed may still end within a TTL,
    /// and the cluster may need elections to settle.
    pub fn disruption_healed(&self) {
        let settled = Instant::now() + self.session_ttl + self.election_timeout * 4;
        let mut d = self.disrupted.lock().unwrap_or_else(|p| p.into_inner());
        d.0 = d.0.saturating_sub(1);
        d.1 = d.1.max(settled);
    }

    /// How long the calm lasted, for the summary.
    pub fn calm_checked(&self) -> String {
        match *self.calm_from.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(t) if t < self.stop_at => {
                format!("{:.1}s", (self.stop_at - t).as_secs_f64())
            }
            _ => "none (the faults healed too late)".into(),
        }
    }
}

/// Named counts of things that are not violations but say what happened.
#[derive(Default)]
pub struct Counts(Mutex<BTreeMap<&'static str, u64>>);

impl Counts {
    pub fn bump(&self, what: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what)
            .or_default() += 1;
    }

    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// "n, p50 .., max .." of some durations.
pub fn spread(d: &Mutex<Vec<Duration>>) -> String {
    let mut d = d.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if d.is_empty() {
        return "none".into();
    }
    d.sort();
    format!(
        "{} seen, p50 {:.2}s, max {:.2}s",
        d.len(),
        d[d.len() / 2].as_secs_f64(),
        d[d.len() - 1].as_secs_f64()
    )
}
