//! Availability: what the honest clients lost while the cluster could
//! have served them. Safety (no overlap, fences in order) is judged by the
//! history; this counts the other half of a lock service's promise: a
//! holder keeps its lock and a waiter its place in line as long as a
//! majority of the nodes is up and reachable from the clients.
//!
//! The fault scheduler reports each fault's start and heal with how many
//! nodes it takes from the majority (down, paused or cut off from their
//! peers) and whether it cuts the clients off on purpose. A loss is
//! *judged* when, at that moment, the nodes no fault takes are a majority,
//! no fault cuts the clients off, and no fault that broke either has
//! healed within the settling time (a TTL and a few elections: sessions it
//! doomed may still end); and when what was lost had room for a failover.
//! A lock is certain for its window (its lease, or without one the session
//! TTL) past the last answer, less its safety margin; a waiter's place
//! lives as long as its session. A leader that fails, steps aside or is
//! stopped leaves the clients without one for up to 3 to 4 election
//! timeouts (docs/CLUSTER.md), so a window shorter than that, and a slack
//! as long, cannot ride through: a 0.5 s lease renewed as its leader is
//! cut off is lost by arithmetic, not by the cluster. Such losses are
//! counted apart, as are those without a majority. Judged losses are
//! printed by the faults in progress or settling when they happened, and
//! under `--require-availability` each lock or place is a violation.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// What a client lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// A hold cut short: the guard said the lock is lost or in jeopardy,
    /// a Renew failed or came too late to keep it, the session ended
    /// under it.
    Lock,
    /// A Lock that waited in line ended with an error instead of a grant
    /// or its own timeout.
    Place,
    /// Any other request that failed: a Lock that would not wait, an
    /// Unlock whose outcome is unknown. Printed, never required.
    Request,
}

impl Loss {
    /// The summary line and the violation kind.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Lock => "locks lost with a majority up",
            Loss::Place => "places lost with a majority up",
            Loss::Request => "requests failed with a majority up",
        }
    }
}

/// A fault in progress, as [`Availability::fault_began`] returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultId(u64);

#[derive(Debug)]
struct Fault {
    id: u64,
    name: &'static str,
    /// Nodes it takes from the majority.
    out: usize,
    cuts_clients: bool,
    healed: Option<Instant>,
}

#[derive(Debug)]
struct State {
    /// In progress, or healed within the settling time.
    faults: Vec<Fault>,
    next: u64,
    /// Until then a majority may not have been reachable: the first
    /// election, and the settling after a fault that took it away.
    unreachable_until: Instant,
    judged: BTreeMap<&'static str, u64>,
    /// Judged losses by the faults in progress or settling.
    by_fault: BTreeMap<String, u64>,
    /// Not judged: no majority was reachable.
    no_majority: u64,
    /// Not judged: too little room for a failover.
    no_room: u64,
    /// Those, by the faults in progress or settling: which faults a
    /// longer TTL or lease would have ridden through.
    no_room_by_fault: BTreeMap<String, u64>,
}

/// Whether a loss was judged, and if not why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Judged,
    NoMajority,
    NoRoom,
}

/// The fault timeline and the losses judged against it.
#[derive(Debug)]
pub struct Availability {
    /// Nodes of the cluster; 0 for a single server, which no fault takes
    /// away from the honest clients.
    nodes: usize,
    settle: Duration,
    /// The least room a lock or session needs to ride through a failover.
    failover: Duration,
    /// Whether a judged lock or place lost is a violation.
    pub require: bool,
    state: Mutex<State>,
}

impl Availability {
    /// For a cluster of `nodes` (0: a single server) whose first election
    /// ends within `first`, where sessions doomed by a fault end within
    /// `settle` of its heal, and a lock needs `failover` of room (no more
    /// than the slowest failover) to ride through one.
    pub fn new(
        nodes: usize,
        first: Duration,
        settle: Duration,
        failover: Duration,
        require: bool,
    ) -> Availability {
        Availability {
            nodes,
            settle,
            failover,
            require,
            state: Mutex::new(State {
                faults: Vec::new(),
                next: 0,
                unreachable_until: Instant::now() + first,
                judged: BTreeMap::new(),
                by_fault: BTreeMap::new(),
                no_majority: 0,
                no_room: 0,
                no_room_by_fault: BTreeMap::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fault `name` starts, taking `out` nodes from the majority and
    /// cutting the clients off if `cuts_clients`.
    pub fn fault_began(&self, name: &'static str, out: usize, cuts_clients: bool) -> FaultId {
        let mut s = self.state();
        let id = s.next;
        s.next += 1;
        s.faults.push(Fault {
            id,
            name,
            out,
            cuts_clients,
            healed: None,
        });
        FaultId(id)
    }

    /// The fault healed.
    pub fn fault_healed(&self, id: FaultId) {
        self.healed_at(id, Instant::now());
    }

    fn healed_at(&self, id: FaultId, now: Instant) {
        let mut s = self.state();
        let was_broken = self.broken(&s);
        if let Some(f) = s.faults.iter_mut().find(|f| f.id == id.0) {
            f.healed = Some(now);
        }
        if was_broken {
            // Sessions it doomed may end within a TTL, and a node that
            // comes back may force one more election.
            s.unreachable_until = s.unreachable_until.max(now + self.settle);
        }
        let settle = self.settle;
        s.faults
            .retain(|f| f.healed.is_none_or(|h| now < h + settle));
    }

    /// Whether the faults in progress leave no reachable majority, or cut
    /// the clients off.
    fn broken(&self, s: &State) -> bool {
        let active = s.faults.iter().filter(|f| f.healed.is_none());
        let (mut out, mut cut) = (0, false);
        for f in active {
            out += f.out;
            cut |= f.cuts_clients;
        }
        self.nodes > 0 && (cut || out > (self.nodes - 1) / 2)
    }

    fn reachable_at(&self, s: &State, now: Instant) -> bool {
        self.nodes == 0 || (now >= s.unreachable_until && !self.broken(s))
    }

    /// Whether a majority with the leader is up and reachable from the
    /// clients now, and has been since the last outage settled. Two faults
    /// that each take one follower (neither costs a session alone) may
    /// together leave a 3-node leader without a majority, so the sessions
    /// it then cannot keep alive are not owed.
    pub fn majority_reachable(&self) -> bool {
        let s = self.state();
        self.reachable_at(&s, Instant::now())
    }

    /// The faults in progress now, or else those settling: where a
    /// violation happened, for its report line.
    pub fn faults_now(&self) -> String {
        let s = self.state();
        Self::when(&s, Instant::now(), self.settle)
    }

    /// Records a loss now of something that had `room` (its window less
    /// its safety margin) and says whether it is judged; if so, the caller
    /// reports a violation when [`Self::require`] says so.
    pub fn lost(&self, what: Loss, room: Duration) -> Verdict {
        self.lost_at(what, room, Instant::now())
    }

    fn lost_at(&self, what: Loss, room: Duration, now: Instant) -> Verdict {
        let mut s = self.state();
        if !self.reachable_at(&s, now) {
            s.no_majority += 1;
            return Verdict::NoMajority;
        }
        let when = Self::when(&s, now, self.settle);
        if room < self.failover {
            s.no_room += 1;
            *s.no_room_by_fault.entry(when).or_default() += 1;
            return Verdict::NoRoom;
        }
        *s.judged.entry(what.name()).or_default() += 1;
        *s.by_fault.entry(when).or_default() += 1;
        Verdict::Judged
    }

    /// Where a loss at `now` goes: the faults in progress, or else those
    /// healed within the settling time, or none.
    fn when(s: &State, now: Instant, settle: Duration) -> String {
        let names = |settling: bool| {
            let mut names: Vec<&str> = s
                .faults
                .iter()
                .filter(|f| match f.healed {
                    None => !settling,
                    Some(h) => settling && now < h + settle,
                })
                .map(|f| f.name)
                .collect();
            names.sort_unstable();
            names.dedup();
            names.join(" + ")
        };
        let (active, settling) = (names(false), names(true));
        if !active.is_empty() {
            format!("during {active}")
        } else if !settling.is_empty() {
            format!("after {settling}")
        } else {
            "with no fault in progress or settling".into()
        }
    }

    /// The judged losses of `what` so far.
    #[cfg(test)]
    pub fn count(&self, what: Loss) -> u64 {
        self.state().judged.get(what.name()).copied().unwrap_or(0)
    }

    /// The summary's availability section: the judged counts, then where
    /// they happened, then those not judged (with too little room, where).
    pub fn lines(&self) -> Vec<(String, u64)> {
        let s = self.state();
        let mut out: Vec<(String, u64)> = [Loss::Lock, Loss::Place, Loss::Request]
            .into_iter()
            .map(|l| {
                (
                    l.name().to_string(),
                    s.judged.get(l.name()).copied().unwrap_or(0),
                )
            })
            .collect();
        out.extend(s.by_fault.iter().map(|(k, v)| (format!("  {k}"), *v)));
        out.push(("not judged: no majority".into(), s.no_majority));
        out.push((
            format!(
                "not judged: less than {} of room for a failover",
                dlock::duration::format(self.failover)
            ),
            s.no_room,
        ));
        out.extend(
            s.no_room_by_fault
                .iter()
                .map(|(k, v)| (format!("  {k}"), *v)),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(5);
    const FAILOVER: Duration = Duration::from_secs(4);
    /// Room enough for a failover.
    const ROOM: Duration = Duration::from_secs(6);

    fn three_nodes() -> Availability {
        Availability::new(3, Duration::ZERO, SETTLE, FAILOVER, true)
    }

    #[test]
    fn a_loss_while_one_node_of_three_is_down_is_judged_and_put_on_that_fault() {
        let a = three_nodes();
        let now = Instant::now();
        let f = a.fault_began("SIGKILL leader", 1, false);
        assert_eq!(a.lost_at(Loss::Lock, ROOM, now), Verdict::Judged);
        a.healed_at(f, now);
        // Still settling: put on the fault that just healed.
        let soon = now + Duration::from_secs(1);
        assert_eq!(a.lost_at(Loss::Place, ROOM, soon), Verdict::Judged);
        // Long after: on no fault.
        let later = now + SETTLE * 2;
        assert_eq!(a.lost_at(Loss::Lock, ROOM, later), Verdict::Judged);
        assert_eq!(a.count(Loss::Lock), 2);
        assert_eq!(a.count(Loss::Place), 1);
        let lines = a.lines();
        for line in [
            "  during SIGKILL leader",
            "  after SIGKILL leader",
            "  with no fault in progress or settling",
        ] {
            assert!(lines.contains(&(line.into(), 1)), "{line}: {lines:?}");
        }
    }

    #[test]
    fn losses_without_a_reachable_majority_are_not_judged_until_it_has_settled() {
        let a = three_nodes();
        let now = Instant::now();
        let leader = a.fault_began("SIGKILL leader", 1, false);
        let follower = a.fault_began("SIGKILL follower", 1, false);
        // Two of three down: no majority.
        assert_eq!(a.lost_at(Loss::Lock, ROOM, now), Verdict::NoMajority);
        a.healed_at(follower, now);
        // A majority again, but what the outage doomed may still end.
        let soon = now + SETTLE / 2;
        assert_eq!(a.lost_at(Loss::Lock, ROOM, soon), Verdict::NoMajority);
        let later = now + SETTLE * 2;
        assert_eq!(a.lost_at(Loss::Lock, ROOM, later), Verdict::Judged);
        a.healed_at(leader, later);
        assert_eq!(a.count(Loss::Lock), 1);
        let lines = a.lines();
        assert!(
            lines.contains(&("not judged: no majority".into(), 2)),
            "{lines:?}"
        );
    }

    #[test]
    fn two_follower_faults_together_leave_no_majority_until_it_has_settled() {
        let a = three_nodes();
        assert!(a.majority_reachable());
        let one = a.fault_began("SIGKILL follower", 1, false);
        assert!(a.majority_reachable(), "one follower of three down");
        let two = a.fault_began("SIGKILL follower", 1, false);
        assert!(!a.majority_reachable(), "both followers down");
        assert_eq!(a.faults_now(), "during SIGKILL follower");
        a.fault_healed(two);
        // Keep-alives the leader could not commit may still end sessions.
        assert!(!a.majority_reachable(), "settling after the outage");
        a.fault_healed(one);
        assert!(!a.majority_reachable(), "the outage's settling runs on");
        assert_eq!(a.faults_now(), "after SIGKILL follower");
    }

    #[test]
    fn clients_cut_off_on_purpose_are_owed_nothing_until_it_has_settled() {
        let a = three_nodes();
        let now = Instant::now();
        let cut = a.fault_began("clients cut from the leader (reset)", 0, true);
        assert_eq!(a.lost_at(Loss::Place, ROOM, now), Verdict::NoMajority);
        a.healed_at(cut, now);
        assert_eq!(a.lost_at(Loss::Place, ROOM, now + SETTLE), Verdict::Judged);
    }

    #[test]
    fn a_lock_with_less_room_than_a_failover_is_not_judged() {
        let a = three_nodes();
        let now = Instant::now();
        let f = a.fault_began("SIGSTOP leader", 1, false);
        let short = FAILOVER - Duration::from_millis(1);
        assert_eq!(a.lost_at(Loss::Lock, short, now), Verdict::NoRoom);
        assert_eq!(a.lost_at(Loss::Lock, FAILOVER, now), Verdict::Judged);
        a.healed_at(f, now);
        let lines = a.lines();
        let at = lines
            .iter()
            .position(|l| *l == ("not judged: less than 4s of room for a failover".into(), 1));
        let Some(at) = at else {
            panic!("no count of losses without room: {lines:?}");
        };
        // Where they happened follows the count.
        assert_eq!(
            lines.get(at + 1),
            Some(&("  during SIGSTOP leader".into(), 1)),
            "{lines:?}"
        );
    }

    #[test]
    fn a_single_server_judges_every_loss() {
        let a = Availability::new(0, Duration::from_secs(60), SETTLE, Duration::ZERO, false);
        assert_eq!(a.lost(Loss::Request, Duration::ZERO), Verdict::Judged);
        assert_eq!(a.count(Loss::Request), 1);
    }
}
