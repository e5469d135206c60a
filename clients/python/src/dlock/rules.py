"""The client's rules, as pure functions: what an answer proves, when a held
lock must be given up, when a session moves to another node, what is
numbered and sent again. Mirrors src/rules.rs of the Rust library, the one
written form of the rules; the shared test vectors
(clients/conformance/rules.json, written from it) run against this module
(tests/test_rule_vectors.py).

No I/O and no clock of its own: the caller passes the times. Times and
durations are whole nanoseconds (`int`), as exact as Rust's `Duration`;
`to_ns` and `to_seconds` convert the event loop's float seconds. Request
kinds and answer statuses are the `RequestType` and `ResponseStatus` numbers
of proto/dlock.proto (`dlock_pb2.Ping`, `dlock.Status.NotLeader`, ...).
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple, Optional, Tuple

from ._proto import dlock_pb2 as pb

__all__ = [
    "CLOCK_RATE_BOUND",
    "DEFAULT_ELECTION_TIMEOUT",
    "MIN_SILENCE",
    "NO_QUORUM",
    "NOT_LEADER",
    "SESSION_ENDED",
    "SILENCE_FLOOR",
    "Elsewhere",
    "Hold",
    "deadline",
    "elsewhere",
    "gone_silent",
    "in_jeopardy",
    "margin",
    "may_wait",
    "moves_deadline",
    "session_lives_until",
    "session_use",
    "silence_limit",
    "to_ns",
    "to_seconds",
    "unanswered_limit",
    "unanswered_too_long",
]

#: How much faster the server's clock may run than the client's, as a
#: fraction of elapsed time. Clocks disciplined by NTP differ in rate by at
#: most 500 ppm (the kernel's slew limit), free-running quartz by about 100
#: ppm; 0.1 % leaves room beyond both. Only rates matter: the clocks' values
#: never meet.
CLOCK_RATE_BOUND = 0.001

_NANOS = 1_000_000_000


def to_ns(seconds: float) -> int:
    """Float seconds (`loop.time()`, a lease) as whole nanoseconds."""
    return round(seconds * _NANOS)


def to_seconds(ns: int) -> float:
    """Whole nanoseconds as float seconds."""
    return ns / _NANOS


def _mul_f64(duration: int, factor: float) -> int:
    """Rust's `Duration::mul_f64`, exactly: the duration as f64 seconds
    times `factor`, rounded to the nearest nanosecond."""
    secs, nanos = divmod(duration, _NANOS)
    product = factor * (float(secs) + float(nanos) / float(_NANOS))
    return round(Fraction(product) * _NANOS)


def deadline(sent: int, window: int) -> int:
    """The latest moment a lock is still certainly held, for a window (a
    lease or a session timeout) that started at the server no earlier than
    `sent`: the window shortened by `CLOCK_RATE_BOUND` of itself, in case the
    server's clock runs faster than the client's."""
    return sent + max(window - _mul_f64(window, CLOCK_RATE_BOUND), 0)


def margin(configured: int, window: int) -> int:
    """The safety margin in force for `window`: the configured one, at most
    a quarter of the window, so short windows still leave three quarters for
    renewing."""
    return min(configured, window // 4)


def in_jeopardy(now: int, deadline: int, margin: int) -> bool:
    """Whether a lock whose deadline is `deadline` is in jeopardy at `now`:
    its holder must stop, since only `margin` is left before the server may
    hand the lock on."""
    return now + margin >= deadline


#: A window that started at the server no earlier than a send time: (sent, length).
Window = Tuple[int, int]


class Hold:
    """What a client knows of how long one of its locks lasts at the server.

    `lease`: a lease, as (when the Lock, or the latest Renew answered, was
    sent, the lease it set); None: the lock lives as long as its owner (the
    connection, or on a cluster the session).

    `unconfirmed`: the renewal whose lease ends first among those sent
    since the latest one was answered, as (send time, lease). The server may
    have applied any of them though its answer never came, and applies them
    in the order sent, so until the latest-sent renewal is answered the lock
    may end with this one: a renewal to a shorter lease, or the first Renew
    of a lock without a lease, which makes it a lease.

    `latest`: the renewal sent last, as (send time, lease): its answer
    supersedes every renewal sent before it.
    """

    __slots__ = ("lease", "unconfirmed", "latest")

    def __init__(
        self,
        lease: Optional[Window] = None,
        unconfirmed: Optional[Window] = None,
        latest: Optional[Window] = None,
    ) -> None:
        self.lease = lease
        self.unconfirmed = unconfirmed
        self.latest = latest

    @classmethod
    def granted(cls, sent: int, lease: Optional[int]) -> "Hold":
        """A lock granted to a request sent at `sent`, with `lease` if it
        asked for one."""
        return cls(None if lease is None else (sent, lease))

    def __repr__(self) -> str:
        return f"Hold(lease={self.lease}, unconfirmed={self.unconfirmed}, latest={self.latest})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hold) and (self.lease, self.unconfirmed, self.latest) == (
            other.lease,
            other.unconfirmed,
            other.latest,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def deadline(self, owner_acked: int, owner_timeout: int) -> int:
        """The safety deadline, given the send time of the latest answer
        that proved the owner alive (`owner_acked`) and the owner's
        timeout."""
        if self.lease is not None:
            held = deadline(*self.lease)
        else:
            held = deadline(owner_acked, owner_timeout)
        if self.unconfirmed is not None:
            return min(held, deadline(*self.unconfirmed))
        return held

    def window(self, owner_timeout: int) -> int:
        """The window the safety margin is taken from: the lease, or the
        owner's timeout, or an unconfirmed renewal's lease if shorter (a
        renewal to 2 s of a 60 s lease must leave time to renew, not a
        margin as long as the new lease)."""
        held = owner_timeout if self.lease is None else self.lease[1]
        if self.unconfirmed is not None:
            return min(held, self.unconfirmed[1])
        return held

    def renewal(self) -> Optional[Window]:
        """When a keeper renews this lock, and to what lease, as (when, the
        lease): a third into the lease in force, to that lease again. None
        for a lock without a lease, even when an unanswered Renew may have
        made it one: that Renew's answer comes before any later one's
        (answers keep the order of requests), so a renewal sent behind it
        could prove nothing sooner, and renewing to the lease in force while
        a shorter renewal is unanswered would undo the shortening the owner
        asked for. Until the answer comes, the deadline follows the
        unanswered renewal. As `Hold::renewal` in src/rules.rs."""
        if self.lease is None:
            return None
        sent, lease = self.lease
        return sent + lease // 3, lease

    def renew_sent(self, sent: int, lease: int) -> bool:
        """A Renew to `lease` was sent at `sent`: once sent, the server may
        apply it though its answer never comes. Returns whether the hold
        changed."""
        self.latest = (sent, lease)
        sooner = self.unconfirmed is None or deadline(sent, lease) < deadline(*self.unconfirmed)
        if sooner:
            self.unconfirmed = (sent, lease)
        return sooner

    def renew_answered(self, sent: int, lease: int) -> bool:
        """The Renew to `lease` sent at `sent` was answered: the server
        replaces a lease's end with each Renew, in the order sent, so the
        latest-sent renewal answered is the one in force, even if it set a
        shorter lease. Only the answer to the renewal sent last supersedes
        every other: one sent later may still be applied after this one, and
        `unconfirmed` keeps only the soonest end of those in flight, so it
        stays (on the safe side) until that answer. Renewals are told apart
        by send time and lease, so of two sent at one instant the first's
        answer does not clear the second. Returns whether the hold changed."""
        newer = self.lease is None or self.lease[0] <= sent
        if newer:
            self.lease = (sent, lease)
        last = self.latest == (sent, lease)
        if last:
            self.unconfirmed = None
            self.latest = None
        return newer or last


#: What `elsewhere` answers: the cluster ended the session.
SESSION_ENDED = "session_ended"
#: The node does not lead (`Elsewhere.leader`: the leader it named, if any).
NOT_LEADER = "not_leader"
#: The node could not commit in time.
NO_QUORUM = "no_quorum"

_ALIVE_OK = frozenset((pb.Ping, pb.Lock, pb.Unlock, pb.Renew, pb.Enqueue))


def moves_deadline(on_session: bool, kind: int, status: int) -> bool:
    """Whether the answer `status` to a request of `kind` proves the owner
    was alive when the request was sent, and so moves the deadline of the
    locks bound to it. On a single server every answer does: the connection
    is the owner. On a session only an answer from a command that kept the
    session alive does; a refusal, an Inspect, a NotLeader or a request the
    cluster could not commit proves nothing."""
    if not on_session:
        return True
    if status == pb.Ok:
        return kind in _ALIVE_OK
    if status == pb.AcquireTimeout:
        return kind in (pb.Lock, pb.Enqueue)
    if status == pb.Queued:
        return kind == pb.Enqueue
    if status == pb.NotHeld:
        return kind in (pb.Unlock, pb.Renew)
    return False


class Elsewhere(NamedTuple):
    """Why a session must go on elsewhere (`elsewhere`)."""

    #: `SESSION_ENDED`, `NOT_LEADER` or `NO_QUORUM`.
    means: str
    #: For `NOT_LEADER`: the leader the node named, if any.
    leader: Optional[str] = None


def elsewhere(status: int, leader: Optional[str]) -> Optional[Elsewhere]:
    """On a session, whether the answer `status` means the request was not
    acted on at this node and the session must go on elsewhere (or has
    ended), and why; None if it was acted on here. `leader` is the address
    a NotLeader named, if any."""
    if status == pb.UnknownSession:
        # The cluster ended the session (its TTL ran out while the client
        # could not reach it): its locks may be another's now.
        return Elsewhere(SESSION_ENDED)
    if status == pb.NotLeader:
        # The node stopped leading and did not act: send the request (and
        # everything behind it) again to the new leader.
        return Elsewhere(NOT_LEADER, leader)
    if status == pb.Unavailable:
        # It could not commit in time: it may still be applied, so only a
        # resend under the same number is safe, after a fresh look for the
        # leader.
        return Elsewhere(NO_QUORUM)
    if status == pb.ShuttingDown:
        # The node is stopping (a rolling restart): the session goes on at
        # the next leader, where what is unanswered is sent again under its
        # number, so nothing is lost or done twice.
        return Elsewhere(NOT_LEADER, None)
    return None


def session_use(kind: int) -> Tuple[bool, bool]:
    """How a request of `kind` uses a session: (whether it acts for the
    session's owner, whether it is numbered with `seq` and so sent again
    after a reconnect under the same number). What changes the table is
    numbered; a Wait changes nothing (sent again after a failover, the new
    leader finds its ticket in the session) and an Inspect only reads."""
    if kind in (pb.Lock, pb.Unlock, pb.Renew, pb.Enqueue):
        return True, True
    if kind in (pb.Inspect, pb.Wait):
        return True, False
    return False, False


def may_wait(kind: int) -> bool:
    """Requests whose answer may rightly take long: a Lock and a Wait wait
    for busy keys, a Watch for a change, up to its limit."""
    return kind in (pb.Lock, pb.Wait, pb.Watch)


def session_lives_until(acked: int, broke: int, ttl: int) -> int:
    """How long a session may be looked for after its stream broke at
    `broke`: it lives a TTL after the last command that kept it alive, the
    latest answered one (`acked`) or, while the stream was open, the node's
    own keep-alives, which the client does not see while a Lock waits. Past
    this no node knows it."""
    return max(acked, broke) + ttl


def unanswered_too_long(kind: int, waited: int, ttl: int) -> bool:
    """Whether the oldest unanswered request on a session, of `kind` and
    waiting for `waited`, shows a node that accepts but does not answer (a
    paused or stalled node, a path that drops without a reset): one that
    may not rightly wait, unanswered for half a TTL."""
    return not may_wait(kind) and waited >= unanswered_limit(ttl)


#: The election timeout assumed for a node that does not state one
#: (dlock-server's default), ns.
DEFAULT_ELECTION_TIMEOUT = 200_000_000
#: The shortest silence taken for a stall, ns: a healthy node on a loaded
#: machine may take a few hundred milliseconds to answer a Ping, and a false
#: alarm costs a reconnect.
MIN_SILENCE = 1_500_000_000
#: The shortest silence limit whatever the TTL, ns: below it a healthy
#: node's scheduling delays would count as silence.
SILENCE_FLOOR = 250_000_000


def silence_limit(election_timeout: Optional[int], ttl: int) -> int:
    """How long a node may leave the silent-node probe (liveness.py)
    unanswered before it is taken for gone: three election timeouts (by then
    the others have replaced it if it led), at least `MIN_SILENCE`, and at
    most a quarter of the session's `ttl` (which wins: a short TTL must
    leave room to resume), but never below `SILENCE_FLOOR`, so that a node
    stating no TTL does not make the probe spin. `election_timeout` is the
    node's, if it states one (None: `DEFAULT_ELECTION_TIMEOUT`)."""
    election = DEFAULT_ELECTION_TIMEOUT if election_timeout is None else election_timeout
    return max(min(max(3 * election, MIN_SILENCE), ttl // 4), SILENCE_FLOOR)


def gone_silent(last_heard: int, now: int, limit: int) -> bool:
    """Whether a connection that last heard from its node at `last_heard`
    has gone silent at `now` for `limit` (`silence_limit`): once
    the probe finds the node silent, such a connection breaks off and
    resumes its session elsewhere; one that heard from the node within the
    limit stays (the probe's own connection was slow, not the node). A
    probe answered `Unavailable` sends every connection away, whatever it
    heard: the node said it cannot serve."""
    return last_heard + limit <= now


def unanswered_limit(ttl: int) -> int:
    """How long a request that may not rightly wait may go unanswered on a
    session (`unanswered_too_long`): half the TTL. (The moment a caller
    looks again; not in src/rules.rs, whose caller looks every heartbeat.)"""
    return ttl // 2
