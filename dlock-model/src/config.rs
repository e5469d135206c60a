//! What one model run explores: the cluster's and the clients' sizes, the
//! protocol's durations, the bounds that keep the state space finite, and
//! which re-introduced bug (if any) the clients carry.

use std::time::Duration;

/// A bug that once lived in (or near) the client rules, or that breaks one
/// of Raft's, swapped back in for one rule call so a test can show the
/// checker finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A NotLeader answer counted as proof of life: it moves the session's
    /// deadline although the node did not keep the session alive.
    NotLeaderProvesLife,
    /// A Renew of a lock with a lease applied to the hold only when
    /// answered (no `Hold::renew_sent`): a renewal to a shorter lease whose
    /// answer is lost leaves the client on the longer one.
    ShorterRenewalUnbounded,
    /// The first Renew of a lock without a lease applied to the hold only
    /// when answered: if its answer is lost the lock is a lease at the
    /// server while the client still counts on its session.
    LeaselessRenewalUnbounded,
    /// The safety deadline computed without the clock-rate bound (the
    /// whole window from the send time), while the clocks drift.
    NoRateBound,
    /// The rule as it was before this checker found the hole: an answered
    /// Renew clears an unconfirmed renewal sent at the same instant, even
    /// one sent after it to a shorter lease.
    SameInstantSuperseded,
    /// An attempt to resume that the client gives up (its node did not
    /// answer in time) closed cleanly: the node takes the FIN as the
    /// client ending its session, and if it had resumed the session for
    /// the attempt, ends it under the next attempt's feet (fixed in
    /// `src/dial.rs`: the attempt lingers 0, a reset, until answered).
    FinAbandonsResume,
    /// A connection's implicit session left to its TTL when the connection
    /// is reset, as a named one is (fixed in the server's
    /// `connection_ended`: nobody can resume it, so it ends with its
    /// connection however it ends).
    ImplicitOutlivesConnection,
    /// A leader that answers a command once it applied it, before a
    /// majority has it in its log: if it loses its leadership first, the
    /// client was told of a grant the cluster forgot.
    AnswerBeforeCommit,
    /// In the replication model ([`crate::replication`]): a voter grants
    /// its vote without checking that the candidate's log is at least as
    /// up to date as its own, so a node that lacks a committed entry can
    /// lead, and its log overwrites the followers'.
    VoteWithoutUpToDate,
    /// In the replication model: a leader commits an entry of an earlier
    /// term once it counts it on a majority (Raft's Figure 8): a node
    /// whose log ends in a later term can still win an election and
    /// overwrite it.
    CommitEarlierTermByCount,
    /// In the ownership model ([`crate::ownership`]), issue 41's (e): the
    /// Go client before 796fce3, which sent every Lock on its one shared
    /// connection (one owner, so the server granted a key two tasks asked
    /// for to both) and reported the older of two such locks lost
    /// (`LostRegranted`), the older by the order the tasks returned in,
    /// which may be the one the server granted last.
    LostByRecordOrder,
    /// A node that learns it was deposed leaves a Lock (or a Wait) waiting
    /// on it unanswered: without the `deposed()` arm of the server's
    /// `await_outcome`, a node that stopped leading learns no more
    /// outcomes and never answers, and the client, whose probe finds the
    /// node alive and whose rules let a Lock wait without an answer
    /// (`rules::may_wait`), waits for a grant the new leader made.
    DeposedKeepsWaiting,
    /// After a resume the client sends again only its numbered requests
    /// (the ones the session can recognise when sent twice), not an
    /// unanswered Wait, which has no number: the Wait's caller waits for
    /// an answer no node will send.
    ResendOnlyNumbered,
    /// The silent-node probe's limit without its cap of a quarter of the
    /// TTL (`rules::silence_limit` without `.min(ttl / 4)`): with a long
    /// election timeout a client waits on a paused node until its session
    /// has expired everywhere else, and resumes it nowhere.
    SilenceUncapped,
}

/// One configuration of the model.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server nodes (2 or 3); node 0 leads the first term.
    pub nodes: u8,
    /// The sessions' TTL.
    pub ttl: Duration,
    /// The lease a Lock may ask for, and the longer of the two a Renew may
    /// set.
    pub lease: Duration,
    /// The shorter lease a Renew may set.
    pub short_lease: Duration,
    /// The safety margin the clients are configured with.
    pub margin: Duration,
    /// How far one tick of the clock moves time.
    pub step: Duration,
    /// Time stops here: no tick beyond it.
    pub horizon: Duration,
    /// The clients, each with its own session, contending for the one key:
    /// how many requests each may send in all. The first sends every kind
    /// of request; the others (contenders) only ask for the key.
    pub sends: Vec<u8>,
    /// Whether the first client asks for leases and renews them; without,
    /// it takes the lock bound to its session, and pings.
    pub leases: bool,
    /// Whether the clients' clocks run slow against the servers' by the
    /// most the rules allow (`dlock::rules::CLOCK_RATE_BOUND`): the
    /// direction in which a client would believe too long.
    pub drift: bool,
    /// Requests (and answers) in flight on one connection at once.
    pub in_flight: usize,
    /// Elections the cluster may hold.
    pub elections: u8,
    /// Connections each client may open after its first (each resumes a
    /// named session).
    pub reconnects: u8,
    /// Whether a leader may lose its leadership between applying a
    /// command and a majority having it (the command is then lost, and
    /// another node wins the next election).
    pub uncommitted: bool,
    /// Whether the contenders name no session and act through their
    /// connection's implicit session (a dlock v2 client): they give their
    /// lock up with the connection, and the node must end the session when
    /// the connection ends, however it ends.
    pub implicit_contenders: bool,
    /// The bug the clients carry, if any.
    pub bug: Option<Bug>,
    /// How long the contenders' Locks wait for the key (the table's
    /// `WaitLimit::For`); `None`: they never wait (a busy key is answered
    /// at once). With a limit the checker also adds the leader's own
    /// Advance (the server's timer) as a step, and the liveness
    /// properties.
    pub wait: Option<Duration>,
    /// Whether the contenders ask in two steps, Enqueue then Wait on its
    /// ticket, rather than with a Lock that waits.
    pub two_phase: bool,
    /// Whether every fault is bounded and the clients keep going, so that
    /// every behaviour ends (the liveness configuration): the network
    /// breaks a client's connection (a reset, an abandoned resume) only
    /// while the client has a reconnect left, and once they are spent a
    /// client without a connection connects to the leader (it finds it in
    /// the end: NotLeader names it, and the client tries each node).
    pub persistent: bool,
    /// With `persistent`: how many connections the network may break (a
    /// reset, or a resume given up) in all, over every client.
    pub breaks: u8,
    /// Whether a client may send a Renew while another it sent at the same
    /// instant is unanswered. The checker found that `Hold::renew_answered`
    /// once let the first one's answer clear the second from `unconfirmed`
    /// although the server applied the second after it; the rule now
    /// clears only the renewal answered, and CI checks with this on.
    pub same_instant_renewals: bool,
    /// Whether the leader may pause (once, for good: a SIGSTOP, a frozen
    /// VM) and the clients run the silent-node probe: a client on the
    /// paused node that has heard nothing from it for the probe's limit
    /// (`rules::silence_limit`, `rules::gone_silent`) breaks off and
    /// resumes its session at another node, and time does not pass a
    /// break-off that is due (the probe is a timer).
    pub probe: bool,
    /// The nodes' election timeout, which the probe's limit counts in
    /// (only with `probe`).
    pub election_timeout: Duration,
}

impl Config {
    /// The configuration CI checks: 2 nodes, 2 clients (3 requests and 2),
    /// a 4 s TTL and lease, renewals to 2 s or 4 s, 2 s ticks up to 4 s,
    /// one election, clients' clocks slow by the rate bound, and no safety
    /// margin: a margin only ends beliefs sooner, so without one the
    /// deadline alone must keep the property.
    pub fn ci() -> Config {
        Config {
            nodes: 2,
            ttl: Duration::from_secs(4),
            lease: Duration::from_secs(4),
            short_lease: Duration::from_secs(2),
            margin: Duration::ZERO,
            step: Duration::from_secs(2),
            horizon: Duration::from_secs(4),
            sends: vec![3, 2],
            leases: true,
            drift: true,
            in_flight: 2,
            elections: 1,
            reconnects: 0,
            uncommitted: true,
            implicit_contenders: false,
            bug: None,
            same_instant_renewals: true,
            wait: None,
            two_phase: false,
            persistent: false,
            breaks: 0,
            probe: false,
            election_timeout: Duration::from_secs(2),
        }
    }

    /// The configuration CI checks sessions with: CI's sizes and times,
    /// and connections that break, are resumed (each client may connect
    /// once more, to either node) and end with FIN or RST; the first client
    /// takes the lock bound to its session (no lease: what a session's end
    /// releases), the contender acts through its connection's implicit
    /// session; one request in flight per connection.
    pub fn sessions() -> Config {
        Config {
            sends: vec![2, 1],
            leases: false,
            in_flight: 1,
            reconnects: 1,
            implicit_contenders: true,
            ..Config::ci()
        }
    }

    /// The configuration CI checks liveness with: client B's Lock waits up
    /// to 2 s for the key client A holds (A locks with a 2 s lease or
    /// none, then unlocks, renews or pings); 2 nodes, one election (which
    /// may depose the leader mid-commit); a client whose node no longer
    /// leads resumes at either node (once), then at the leader, and sends
    /// again what is unanswered; no other network fault (`breaks` 0);
    /// every fault bounded and the clients persistent (`persistent`), time
    /// up to 2 s in one step, within the 4 s TTL, since the node's
    /// keep-alives of a waiting session are not modelled. Every behaviour
    /// ends, and the ending states are where liveness is checked.
    pub fn liveness() -> Config {
        Config {
            lease: Duration::from_secs(2),
            horizon: Duration::from_secs(2),
            sends: vec![2, 1],
            in_flight: 1,
            reconnects: 1,
            wait: Some(Duration::from_secs(2)),
            persistent: true,
            ..Config::ci()
        }
    }

    /// The liveness configuration with client B asking in two steps:
    /// Enqueue, then Wait on its ticket.
    pub fn two_phase() -> Config {
        Config {
            two_phase: true,
            ..Config::liveness()
        }
    }

    /// The configuration CI checks the silent-node probe with: one client
    /// (a lock bound to its session, then Unlock or Ping, one request in
    /// flight, one reconnect), 2 nodes, one election, a leader that may
    /// pause at any moment, a 4 s TTL and a 2 s election timeout, so the
    /// probe's limit is a quarter of the TTL, 1 s (three election
    /// timeouts, 6 s, would outlast the session); time in 2 s steps up to
    /// 4 s, the clients' clocks on time (the property compares the
    /// client's own times).
    pub fn probe() -> Config {
        Config {
            sends: vec![2],
            leases: false,
            drift: false,
            in_flight: 1,
            reconnects: 1,
            uncommitted: false,
            same_instant_renewals: false,
            probe: true,
            ..Config::ci()
        }
    }

    /// The probe's limit, by the client's rule (`rules::silence_limit`),
    /// or with [`Bug::SilenceUncapped`] without its cap.
    pub fn silence_limit(&self) -> Duration {
        if self.has(Bug::SilenceUncapped) {
            return (3 * self.election_timeout).max(dlock::rules::MIN_SILENCE);
        }
        dlock::rules::silence_limit(Some(self.election_timeout), self.ttl)
    }

    /// The same with `bug` swapped in.
    pub fn with_bug(self, bug: Bug) -> Config {
        Config {
            bug: Some(bug),
            ..self
        }
    }

    /// Whether this run carries `bug`.
    pub fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}
