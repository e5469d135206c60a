//! The client's rules, as pure functions: what an answer proves, when a
//! held lock must be given up, when a session moves to another node (a
//! node gone silent included), what is numbered and sent again. No I/O and
//! no clock of their own: the caller passes the times, so the link
//! (`link.rs`), the silent-node probe (`liveness.rs`), the guards
//! (`guard.rs`: `Hold`, `in_jeopardy`), the model checker (`dlock-model`)
//! and the shared test vectors (`clients/conformance/rules.json`, which the
//! Python, Go and TypeScript clients run) all ask the same code.
//!
//! Times are generic ([`Time`]): `tokio::time::Instant` in the library, a
//! tick count in the model, microseconds in the vectors.

use crate::disconnect::Disconnect;
use crate::proto::{RequestType, ResponseStatus};
use std::ops::Add;
use std::time::Duration;

/// How much faster the server's clock may run than the client's, as a
/// fraction of elapsed time. Clocks disciplined by NTP differ in rate by at
/// most 500 ppm (the kernel's slew limit), free-running quartz by about 100
/// ppm; 0.1 % leaves room beyond both. Only rates matter: the clocks' values
/// never meet.
pub const CLOCK_RATE_BOUND: f64 = 0.001;

/// A point in time the rules can compare and move forward.
pub trait Time: Copy + Ord + Add<Duration, Output = Self> {}

impl<T: Copy + Ord + Add<Duration, Output = T>> Time for T {}

/// The latest moment a lock is still certainly held, for a window (a lease
/// or a session timeout) that started at the server no earlier than `sent`:
/// the window shortened by [`CLOCK_RATE_BOUND`] of itself, in case the
/// server's clock runs faster than the client's.
pub fn deadline<T: Time>(sent: T, window: Duration) -> T {
    sent + window.saturating_sub(window.mul_f64(CLOCK_RATE_BOUND))
}

/// The safety margin in force for `window`: the configured one, at most a
/// quarter of the window, so short windows still leave three quarters for
/// renewing.
pub fn margin(configured: Duration, window: Duration) -> Duration {
    configured.min(window / 4)
}

/// Whether a lock whose deadline is `deadline` is in jeopardy at `now`: its
/// holder must stop, since only `margin` is left before the server may hand
/// the lock on.
pub fn in_jeopardy<T: Time>(now: T, deadline: T, margin: Duration) -> bool {
    now + margin >= deadline
}

/// What a client knows of how long one of its locks lasts at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold<T> {
    /// A lease: when the Lock, or the latest Renew answered, was sent, and
    /// the lease it set. `None`: the lock lives as long as its owner (the
    /// connection, or on a cluster the session).
    pub lease: Option<(T, Duration)>,
    /// The renewal whose lease ends first among those sent since the
    /// latest one was answered, as (send time, lease). The server may have
    /// applied any of them though its answer never came, and applies them
    /// in the order sent, so until the latest-sent renewal is answered the
    /// lock may end with this one: a renewal to a shorter lease, or the
    /// first Renew of a lock without a lease, which makes it a lease.
    pub unconfirmed: Option<(T, Duration)>,
    /// The renewal sent last, as (send time, lease): its answer supersedes
    /// every renewal sent before it.
    pub latest: Option<(T, Duration)>,
}

impl<T: Time> Hold<T> {
    /// A lock granted to a request sent at `sent`, with `lease` if it asked
    /// for one.
    pub fn granted(sent: T, lease: Option<Duration>) -> Self {
        Hold {
            lease: lease.map(|l| (sent, l)),
            unconfirmed: None,
            latest: None,
        }
    }

    /// The safety deadline, given the send time of the latest answer that
    /// proved the owner alive (`owner_acked`) and the owner's timeout.
    pub fn deadline(&self, owner_acked: T, owner_timeout: Duration) -> T {
        let held = match self.lease {
            Some((sent, lease)) => deadline(sent, lease),
            None => deadline(owner_acked, owner_timeout),
        };
        match self.unconfirmed {
            Some((sent, lease)) => held.min(deadline(sent, lease)),
            None => held,
        }
    }

    /// The window the safety margin is taken from: the lease, or the
    /// owner's timeout, or an unconfirmed renewal's lease if shorter (a
    /// renewal to 2 s of a 60 s lease must leave time to renew, not a
    /// margin as long as the new lease).
    pub fn window(&self, owner_timeout: Duration) -> Duration {
        let held = self.lease.map_or(owner_timeout, |(_, lease)| lease);
        self.unconfirmed.map_or(held, |(_, lease)| held.min(lease))
    }

    /// When a keeper renews this lock, and to what lease: a third into the
    /// lease in force, to that lease again. `None` for a lock without a
    /// lease, even when an unanswered Renew may have made it one: that
    /// Renew's answer comes before any later one's (answers keep the order
    /// of requests), so a renewal sent behind it could prove nothing
    /// sooner, and renewing to the lease in force while a shorter renewal
    /// is unanswered would undo the shortening the owner asked for. Until
    /// the answer comes, the deadline follows the unanswered renewal.
    pub fn renewal(&self) -> Option<(T, Duration)> {
        self.lease.map(|(sent, lease)| (sent + lease / 3, lease))
    }

    /// A Renew to `lease` was sent at `sent` (after every renewal sent
    /// before): once sent, the server may apply it though its answer never
    /// comes. Returns whether the deadline may have moved.
    pub fn renew_sent(&mut self, sent: T, lease: Duration) -> bool {
        self.latest = Some((sent, lease));
        let sooner = self
            .unconfirmed
            .is_none_or(|(s, l)| deadline(sent, lease) < deadline(s, l));
        if sooner {
            self.unconfirmed = Some((sent, lease));
        }
        sooner
    }

    /// The Renew to `lease` sent at `sent` was answered: the server
    /// replaces a lease's end with each Renew, in the order sent, so the
    /// latest-sent renewal answered is the one in force, even if it set a
    /// shorter lease. Only the answer to the renewal sent last supersedes
    /// every other: one sent later may still be applied after this one, and
    /// `unconfirmed` keeps only the soonest end of those in flight, so it
    /// stays (on the safe side) until that answer. Renewals are told apart
    /// by send time and lease, so of two sent at one instant the first's
    /// answer does not clear the second (the model checker found that hole:
    /// Renew 4 s and Renew 2 s at one instant). Returns whether the hold
    /// changed.
    pub fn renew_answered(&mut self, sent: T, lease: Duration) -> bool {
        let newer = self.lease.is_none_or(|(s, _)| s <= sent);
        if newer {
            self.lease = Some((sent, lease));
        }
        let last = self.latest == Some((sent, lease));
        if last {
            self.unconfirmed = None;
            self.latest = None;
        }
        newer || last
    }
}

/// Whether the answer `status` to a request of `kind` proves the owner was
/// alive when the request was sent, and so moves the deadline of the locks
/// bound to it. On a single server every answer does: the connection is the
/// owner. On a session only an answer from a command that kept the session
/// alive does; a refusal, an Inspect, a NotLeader or a request the cluster
/// could not commit proves nothing.
pub fn moves_deadline(on_session: bool, kind: RequestType, status: ResponseStatus) -> bool {
    use RequestType as K;
    use ResponseStatus as S;
    !on_session
        || matches!(
            (kind, status),
            (K::Ping | K::Lock | K::Unlock | K::Renew | K::Enqueue, S::Ok)
                | (K::Lock | K::Enqueue, S::AcquireTimeout)
                | (K::Enqueue, S::Queued)
                | (K::Unlock | K::Renew, S::NotHeld)
        )
}

/// On a session, whether the answer `status` means the request was not
/// acted on at this node and the session must go on elsewhere (or has
/// ended), and why. `leader` is the address a NotLeader named, if any.
pub fn elsewhere(status: ResponseStatus, leader: Option<String>) -> Option<Disconnect> {
    match status {
        // The cluster ended the session (its TTL ran out while the client
        // could not reach it): its locks may be another's now.
        ResponseStatus::UnknownSession => Some(Disconnect::SessionEnded),
        // The node stopped leading and did not act: send the request (and
        // everything behind it) again to the new leader.
        ResponseStatus::NotLeader => Some(Disconnect::NotLeader { leader }),
        // It could not commit in time: it may still be applied, so only a
        // resend under the same number is safe, after a fresh look for the
        // leader.
        ResponseStatus::Unavailable => Some(Disconnect::NoQuorum),
        // The node is stopping (a rolling restart): the session goes on at
        // the next leader, where what is unanswered is sent again under its
        // number, so nothing is lost or done twice.
        ResponseStatus::ShuttingDown => Some(Disconnect::NotLeader { leader: None }),
        _ => None,
    }
}

/// How a request of `kind` uses a session: (whether it acts for the
/// session's owner, whether it is numbered with `seq` and so sent again
/// after a reconnect under the same number). What changes the table is
/// numbered; a Wait changes nothing (sent again after a failover, the new
/// leader finds its ticket in the session) and an Inspect only reads.
pub fn session_use(kind: RequestType) -> (bool, bool) {
    match kind {
        RequestType::Lock | RequestType::Unlock | RequestType::Renew | RequestType::Enqueue => {
            (true, true)
        }
        RequestType::Inspect | RequestType::Wait => (true, false),
        _ => (false, false),
    }
}

/// Requests whose answer may rightly take long: a Lock and a Wait wait for
/// busy keys, a Watch for a change, up to its limit.
pub fn may_wait(kind: RequestType) -> bool {
    matches!(
        kind,
        RequestType::Lock | RequestType::Wait | RequestType::Watch
    )
}

/// How long a session may be looked for after its stream broke at `broke`:
/// it lives a TTL after the last command that kept it alive, the latest
/// answered one (`acked`) or, while the stream was open, the node's own
/// keep-alives, which the client does not see while a Lock waits. Past
/// this no node knows it.
pub fn session_lives_until<T: Time>(acked: T, broke: T, ttl: Duration) -> T {
    acked.max(broke) + ttl
}

/// Whether the oldest unanswered request on a session, of `kind` and
/// waiting since `waited`, shows a node that accepts but does not answer (a
/// paused or stalled node, a path that drops without a reset): one that
/// may not rightly wait, unanswered for half a TTL.
pub fn unanswered_too_long(kind: RequestType, waited: Duration, ttl: Duration) -> bool {
    !may_wait(kind) && waited >= ttl / 2
}

/// The election timeout assumed for a node that does not state one
/// (dlock-server's default).
pub const DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_millis(200);

/// The shortest silence taken for a stall: a healthy node on a loaded
/// machine may take a few hundred milliseconds to answer a Ping, and a
/// false alarm costs a reconnect.
pub const MIN_SILENCE: Duration = Duration::from_millis(1500);

/// The shortest silence limit whatever the TTL: below it a healthy node's
/// scheduling delays would count as silence.
pub const SILENCE_FLOOR: Duration = Duration::from_millis(250);

/// How long a node may leave the silent-node probe (`liveness.rs`)
/// unanswered before it is taken for gone: three election timeouts (by
/// then the others have replaced it if it led), at least [`MIN_SILENCE`],
/// and at most a quarter of the session's TTL (which wins: a short TTL
/// must leave room to resume), so that finding a new leader and resuming
/// there fit in what is left (docs/PROTOCOL.md, "Cluster", has the whole
/// budget). `election_timeout` is the node's, if it states one.
pub fn silence_limit(election_timeout: Option<Duration>, ttl: Duration) -> Duration {
    let election = election_timeout.unwrap_or(DEFAULT_ELECTION_TIMEOUT);
    // A quarter TTL wins over MIN_SILENCE (a short TTL leaves no time), but
    // never below the floor: a node stating no TTL must not make the probe
    // spin.
    // Saturating: the election timeout is the node's word.
    election
        .saturating_mul(3)
        .max(MIN_SILENCE)
        .min(ttl / 4)
        .max(SILENCE_FLOOR)
}

/// Whether a link last heard from its node at `last_heard` has gone
/// silent at `now` for `limit` ([`silence_limit`]): once the probe finds
/// the node silent, such a link breaks off and resumes its session
/// elsewhere; one that heard from the node within the limit stays (the
/// probe's own connection was slow, not the node). A probe answered
/// `Unavailable` sends every link away, whatever it heard: the node said
/// it cannot serve.
pub fn gone_silent<T: Time>(last_heard: T, now: T, limit: Duration) -> bool {
    last_heard + limit <= now
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_unanswered_renewal_of_a_lock_without_a_lease_bounds_its_deadline() {
        // The hole the model found: a Renew of a lock bound to its session,
        // answer lost, may have made it a 1 s lease at the server while the
        // client went on believing in the 10 s session.
        let mut hold = Hold::granted(Duration::ZERO, None);
        assert_eq!(hold.deadline(ms(5_000), ms(10_000)), ms(5_000) + ms(9_990));
        assert!(hold.renew_sent(ms(6_000), ms(1_000)));
        assert_eq!(hold.deadline(ms(6_000), ms(10_000)), ms(6_000) + ms(999));
        assert!(hold.lease.is_none(), "not known to be a lease");
        assert!(hold.renew_answered(ms(6_000), ms(1_000)));
        assert_eq!(hold.lease, Some((ms(6_000), ms(1_000))));
        assert_eq!(hold.unconfirmed, None);
    }

    #[test]
    fn a_later_answer_supersedes_an_earlier_unanswered_renewal_and_not_the_reverse() {
        let mut hold = Hold::granted(Duration::ZERO, Some(ms(30_000)));
        hold.renew_sent(ms(1_000), ms(2_000));
        hold.renew_sent(ms(1_500), ms(30_000));
        // The second, the last sent, is answered: the first, sent before
        // it, was applied before it, and is superseded.
        assert!(hold.renew_answered(ms(1_500), ms(30_000)));
        assert_eq!(hold.unconfirmed, None);
        assert_eq!(hold.lease, Some((ms(1_500), ms(30_000))));
        // An answer to an older renewal changes nothing.
        assert!(!hold.renew_answered(ms(1_000), ms(2_000)));
    }

    #[test]
    fn of_two_renewals_sent_at_one_instant_the_first_answer_clears_only_itself() {
        let mut hold = Hold::granted(Duration::ZERO, Some(ms(30_000)));
        hold.renew_sent(ms(1_000), ms(4_000));
        hold.renew_sent(ms(1_000), ms(2_000));
        hold.renew_answered(ms(1_000), ms(4_000));
        assert_eq!(hold.unconfirmed, Some((ms(1_000), ms(2_000))));
        assert_eq!(hold.deadline(ms(0), ms(10_000)), ms(1_000) + ms(1_998));
        hold.renew_answered(ms(1_000), ms(2_000));
        assert_eq!(hold.unconfirmed, None);
        assert_eq!(hold.lease, Some((ms(1_000), ms(2_000))));
    }

    #[test]
    fn an_answer_before_the_last_renewal_keeps_the_bound_of_those_still_in_flight() {
        // 2 s at 1, 30 s at 2, 5 s at 3; the first two answered: the third,
        // never recorded as the soonest, may still be applied, so the bound
        // stays until the last is answered.
        let mut hold = Hold::granted(Duration::ZERO, Some(ms(30_000)));
        hold.renew_sent(ms(1_000), ms(2_000));
        hold.renew_sent(ms(2_000), ms(30_000));
        hold.renew_sent(ms(3_000), ms(5_000));
        hold.renew_answered(ms(1_000), ms(2_000));
        hold.renew_answered(ms(2_000), ms(30_000));
        assert!(hold.deadline(ms(0), ms(10_000)) <= ms(3_000) + ms(5_000));
        hold.renew_answered(ms(3_000), ms(5_000));
        assert_eq!(hold.unconfirmed, None);
        assert_eq!(hold.deadline(ms(0), ms(10_000)), ms(3_000) + ms(4_995));
    }

    #[test]
    fn only_answers_that_kept_a_session_alive_move_its_deadline() {
        use RequestType as K;
        use ResponseStatus as S;
        assert!(moves_deadline(true, K::Ping, S::Ok));
        assert!(!moves_deadline(true, K::Ping, S::NotLeader));
        assert!(!moves_deadline(true, K::Inspect, S::Ok));
        assert!(!moves_deadline(true, K::Lock, S::Unavailable));
        assert!(moves_deadline(false, K::Inspect, S::NotLeader));
    }

    #[test]
    fn the_silence_limit_is_three_election_timeouts_within_its_floor_and_a_quarter_ttl() {
        // The default election timeout: 3 x 200 ms is below the minimum.
        assert_eq!(silence_limit(None, ms(60_000)), ms(1_500));
        assert_eq!(silence_limit(Some(ms(1_000)), ms(60_000)), ms(3_000));
        // A quarter of the TTL wins over both.
        assert_eq!(silence_limit(Some(ms(1_000)), ms(4_000)), ms(1_000));
        assert_eq!(silence_limit(None, ms(3_000)), ms(750));
        // Never below the floor.
        assert_eq!(silence_limit(None, Duration::ZERO), ms(250));
        // A node's absurd election timeout saturates, it does not panic.
        assert_eq!(silence_limit(Some(Duration::MAX), ms(4_000)), ms(1_000));
    }

    #[test]
    fn a_link_is_silent_once_it_has_heard_nothing_for_the_whole_limit() {
        assert!(!gone_silent(ms(1_000), ms(1_999), ms(1_000)));
        assert!(gone_silent(ms(1_000), ms(2_000), ms(1_000)));
    }
}
