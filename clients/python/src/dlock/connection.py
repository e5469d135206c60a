"""A client's connection to dlock: pipelined requests, answers matched in
order, pings, and on a cluster the session that outlives each stream.

Every request is framed and queued for writing at once, and the frames
queued during one turn of the event loop go out in one write. The server
answers in order, so each answer belongs to the oldest unanswered request;
an answer out of order ends the stream. At most `max_in_flight` requests
(default: the server's `max_pipeline`) are unanswered at once, which bounds
what is buffered here; further calls wait for a slot.

Opening (dial.py) says Hello to learn the server's limits and, on a cluster
node (Hello says `resumable_sessions`), opens a session on the leader. Then
a Ping goes out whenever nothing was sent for a quarter of the session
timeout (on a cluster: the session's TTL), so the server never ends a
healthy, quiet owner.

Against a single server the connection ends with its stream: every pending
call fails, and so does every later one, since the server released the
locks bound to it. Against a cluster, as src/link.rs does, the connection
names the session in every request that acts for an owner and numbers those
that change the table (`seq`, with `seq_done`). When the stream breaks, a
node answers `NotLeader`, `Unavailable` or `ShuttingDown` (a node stopping:
nothing was done, as with `NotLeader` naming no leader), the client's
liveness probe of the node goes unanswered while the stream heard nothing
from the node either, or is answered `Unavailable` (a paused node, or a
leader cut off from its peers, noticed even while a Lock waits:
liveness.py), or a request that should be answered at once is not
(the same, noticed later: a fallback), the stream is reset
(never closed with a FIN, which would end the session on the node), the
leader is looked for among the known addresses and those nodes name, the
session is resumed there (OpenSession naming it) and the requests not yet
answered are sent again, in order and under their first numbers: the leader
answers one it already applied as it did the first time, and a waiting Lock
keeps its place in line. Only when the session is really gone (a node says
`UnknownSession`, or no node resumed it within its TTL) does the connection
end as it would against a single server.

`fresh` is the send time of the last request whose answer proves the owner
alive, the input of the client-side safety rule (`dlock.aio`). On a single
server any answer does: the server was reading the connection then, so it
cannot have ended it before `fresh + session_timeout`. On a cluster the
owner is a session that ends a TTL after the last command that kept it
alive was committed, so only answers from such commands count
(`rules.moves_deadline`): a `NotLeader` or `Unavailable` answer, from a
deposed leader say, proves nothing, and counting it would keep a lock "held"
here after the cluster gave it away.

Which requests name the session and which are numbered, which answers send
the session elsewhere, how long a session may be looked for and when an
unanswered request shows a silent node are the rules of rules.py (as
src/rules.rs), which this module asks.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Callable, Deque, List, Optional

from google.protobuf.message import DecodeError

from . import rules
from ._proto import dlock_pb2 as pb
from .dial import PROTOCOL_VERSION, Dial, Established, SessionEnded, Stream, establish, reset
from .errors import ConnectionLost, DlockError, ServerError, Status, from_response
from .framing import encode
from .liveness import silence_limit, watch_node
from .types import Limits, Reconnecting, Resumed

__all__ = ["Connection", "PROTOCOL_VERSION", "keeps_session_alive"]

log = logging.getLogger("dlock")

#: Requests whose answer can prove a cluster session alive (an `Ok` to them
#: moves the deadline): on a session, sending one is what keeps it alive.
_KEEPS_ALIVE = frozenset(k for k in pb.RequestType.values() if rules.moves_deadline(True, k, Status.Ok))


#: Told the answer to a call whose caller stopped waiting, once a grant in it
#: was released (see `Connection.call`).
Abandoned = Callable[["pb.Response"], None]
#: Told the keys and fence of a grant that reached a connection given up
#: with `Connection.drain`: it can no longer release it itself.
Late = Callable[[List[str], int], None]


class _Pending:
    """A request written (or, while the session moves, to be written) and not yet answered."""

    __slots__ = ("id", "rtype", "future", "sent", "counted", "lock_keys", "seq", "frame", "ticket", "on_abandoned")

    def __init__(
        self,
        id: int,
        rtype: int,
        future: "Optional[asyncio.Future[pb.Response]]",
        sent: float,
        counted: bool,
        lock_keys: Optional[List[str]],
        seq: int,
        frame: Optional[bytes],
        ticket: int = 0,
        on_abandoned: "Optional[Abandoned]" = None,
    ) -> None:
        self.id = id
        self.rtype = rtype
        self.future = future
        # When it was (last) written: once it is answered, the server had
        # the owner alive no earlier than this.
        self.sent = sent
        self.counted = counted
        # For Lock, Enqueue and Wait: the keys, so a grant nobody waits for
        # any more is released.
        self.lock_keys = lock_keys
        # Its number in the session; 0 if it changes nothing or there is none.
        self.seq = seq
        # On a session: the request as written, to send again after a
        # reconnect. None against a single server, which never resumes.
        self.frame = frame
        # For Wait: the ticket it collects.
        self.ticket = ticket
        # Told the answer if the caller stopped waiting for it (see `call`).
        self.on_abandoned = on_abandoned


class Connection:
    """The connection under a `dlock.aio.Client`; see the module doc."""

    def __init__(self, dial: Dial, est: Established, max_in_flight: Optional[int], *, quiet: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self._dial = dial
        # A connection the client opened for itself (a Watch's): its moves
        # are logged at debug level and not reported to on_event.
        self._quiet = quiet
        self._stream: Optional[Stream] = None
        #: The node connected to now.
        self.addr = est.addr
        #: The cluster session this connection acts for; 0 on a single server.
        self.session = est.session
        #: The server's limits; on a cluster `session_timeout` is the session's TTL.
        self.limits: Limits = est.limits
        if est.session:
            self.limits = _with_timeout(est.limits, est.session_timeout)
        self._out: List[bytes] = []
        self._flush_scheduled = False
        self._pending: Deque[_Pending] = collections.deque()
        # The numbers of the numbered requests in `_pending`, oldest first:
        # everything below the first has been answered (`seq_done`).
        self._numbered: Deque[int] = collections.deque()
        # Ticket -> number of each Enqueue answered Queued whose Wait has not
        # been answered: `seq_done` stays below them, so that after a
        # failover the new leader still remembers an outcome decided before
        # it (docs/PROTOCOL.md, "Two-phase acquire"). At most the server's
        # max_pipeline tickets are open per connection.
        self._queued: "dict[int, int]" = {}
        self._next_id = 0
        self._next_seq = 1
        self._pings_out = 0
        self._slots = asyncio.Semaphore(max_in_flight or est.limits.max_pipeline)
        self._last_send = est.acked_from
        #: Send time of the last request whose answer proves the owner alive.
        self.fresh = est.acked_from
        self._resuming: "Optional[asyncio.Task[None]]" = None
        # On a session: how long the node may leave the client's liveness
        # probe unanswered before the stream is given up (liveness.py), and
        # how to stop watching the probe of the node of the current stream.
        self._silence_limit = silence_limit(est.limits.election_timeout, est.session_timeout) if est.session else None
        self._unwatch: Optional[Callable[[], None]] = None
        # When the current stream last read a frame from its node (or
        # began): a stream that heard from the node within the silence
        # limit outlives a silence the probe found (`rules.gone_silent`).
        self._heard = self._loop.time()
        # Set while the current stream outlives a silence the probe found:
        # how many probe answers there were then, and the timer that checks
        # the stream's own silence (a limit after it last heard).
        self._suspect: Optional[int] = None
        self._recheck: Optional[asyncio.TimerHandle] = None
        #: Called once when the connection ends: (reason, closed by us).
        self.on_end: Callable[[str, bool], None] = lambda reason, closing: None
        #: Set when the connection has ended; `close_reason` says why.
        self.closed = asyncio.Event()
        self.close_reason: Optional[str] = None
        # Set by `drain`: the connection is given up and writes no more.
        self._late: Optional[Late] = None
        # Why a request sent while it drains is refused (`drain`).
        self._gone = "withdrawn: this connection sends nothing more"
        self._pinger = self._loop.create_task(self._ping_loop())
        self._take(est.stream)

    @classmethod
    async def open(cls, dial: Dial, max_in_flight: Optional[int], *, quiet: bool = False) -> "Connection":
        """Connects (on a cluster: to the leader, with a new session), says
        Hello, starts pinging.

        Raises `ConnectError` if no server answers in time (naming each
        address tried and why it failed), or the error of the server's
        refusal (`AccessDenied`, `ServerError(LimitReached)`).
        """
        loop = asyncio.get_running_loop()
        est = await establish(dial, 0, loop.time() + dial.connect_timeout, persist=False)
        try:
            return cls(dial, est, max_in_flight, quiet=quiet)
        except BaseException:
            reset(est.stream.transport)  # type: ignore[arg-type]
            raise

    async def call(
        self,
        rtype: int,
        body: Optional["pb.RequestLock"],
        *,
        counted: bool = True,
        lock_keys: Optional[List[str]] = None,
        on_queued: Optional[Callable[[], None]] = None,
        on_abandoned: Optional[Abandoned] = None,
    ) -> "pb.Response":
        """Sends one request, waits for its answer; error statuses raise.

        `on_queued` is called once the request is queued for sending: the
        server processes it before any request queued after it.
        `on_abandoned` is told the answer if the caller is cancelled before
        it takes it, once a grant in it (`lock_keys`) was released (its
        Unlock queued); not if the connection ends first.
        """
        if self.close_reason is not None:
            raise ConnectionLost(self.close_reason)
        if counted:
            await self._slots.acquire()
            if self.close_reason is not None:
                self._slots.release()
                raise ConnectionLost(self.close_reason)
        future: "asyncio.Future[pb.Response]" = self._loop.create_future()
        try:
            self.send(rtype, body, future, counted, lock_keys, on_abandoned)
        except BaseException:
            if counted:
                self._slots.release()
            raise
        if on_queued is not None:
            on_queued()
        try:
            resp = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # Answered, but cancelled before this call could take the
                # answer: nobody else will release a grant in it.
                self._abandoned(lock_keys, future.result(), on_abandoned)
            raise
        # Queued is no error: an Enqueue waiting in line, with its ticket.
        if resp.status != Status.Ok and not (rtype == pb.Enqueue and resp.status == Status.Queued):
            raise from_response(resp)
        return resp

    def send(
        self,
        rtype: int,
        body: Optional["pb.RequestLock"],
        future: "Optional[asyncio.Future[pb.Response]]",
        counted: bool = False,
        lock_keys: Optional[List[str]] = None,
        on_abandoned: Optional[Abandoned] = None,
    ) -> None:
        """Queues one request; its answer goes to `future` (None: nobody waits)."""
        if self._late is not None:
            raise ConnectionLost(self._gone)
        req = pb.Request(version=PROTOCOL_VERSION, id=self._next_id + 1, access_token=self._dial.token, type=rtype)  # type: ignore[arg-type]
        if body is not None:
            req.lock.CopyFrom(body)
        seq = 0
        if self.session:
            acts, numbered = rules.session_use(rtype)
            # An Inspect without keys asks for server counts, no owner's.
            names_keys = body is not None and len(body.keys) > 0
            if acts and (numbered or names_keys or rtype == pb.Wait):
                req.session = self.session
            if numbered:
                seq = self._next_seq
                req.seq = seq
                done_below = self._numbered[0] if self._numbered else seq
                if self._queued:
                    done_below = min(done_below, min(self._queued.values()))
                req.seq_done = done_below - 1
        frame = encode(req)
        if len(frame) - 4 > self.limits.max_frame:
            # The server would answer FrameTooLarge and close the connection,
            # taking every lock on it along: refuse here instead.
            raise ServerError(
                Status.FrameTooLarge,
                f"request of {len(frame) - 4} bytes exceeds the server's frame limit of "
                f"{self.limits.max_frame} bytes (not sent)",
                sent=False,
            )
        self._next_id += 1
        if seq:
            self._next_seq += 1
            self._numbered.append(seq)
        now = self._loop.time()
        keep = frame if self.session else None
        ticket = body.ticket if rtype == pb.Wait and body is not None else 0
        self._pending.append(_Pending(self._next_id, rtype, future, now, counted, lock_keys, seq, keep, ticket, on_abandoned))
        if not self.session or rtype in _KEEPS_ALIVE:
            # On a cluster an Inspect keeps nothing alive that the client
            # could prove: a Ping is still due.
            self._last_send = now
        if self._stream is None:
            return  # the session is moving: sent with the rest once resumed
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._stream is not None and self._out:
            assert self._stream.transport is not None
            self._stream.transport.write(b"".join(self._out))
        self._out.clear()

    # -- streams --------------------------------------------------------

    def _take(self, stream: Stream) -> None:
        self._stream = stream
        self._heard = self._loop.time()
        if self._silence_limit is not None:
            # A node found silent ends the stream while a Lock waits as much
            # as while nothing does: its answers cannot tell in time.
            self._stop_watching()
            self._unwatch = watch_node(
                self._dial,
                self.addr,
                self._silence_limit,
                lambda waited, why, cannot_serve: self._on_silent(stream, why, cannot_serve),
            )
        stream.attach(self._on_stream)

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        self._suspect = None
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _heard_nothing_for(self, limit: float) -> bool:
        """Whether the current stream has heard nothing from its node for
        `limit` seconds (`rules.gone_silent`)."""
        now = self._loop.time()
        return rules.gone_silent(rules.to_ns(self._heard), rules.to_ns(now), rules.to_ns(limit))

    def _probe_answered(self) -> int:
        probe = self._dial.probes.get(self.addr)
        return probe.answered if probe is not None else -1

    def _arm_recheck(self, stream: Stream, limit: float) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        # Never in the past: the float sum may round a nanosecond short.
        at = max(self._heard + limit, self._loop.time() + 1e-3)
        self._recheck = self._loop.call_at(at, self._recheck_silence, stream)

    def _recheck_silence(self, stream: Stream) -> None:
        """A limit since the stream, which outlived a silence report, last
        heard from its node: it goes now if it has heard nothing since and
        the probe has not been answered again, not at the probe's next
        report (a retry pause and a whole limit later)."""
        self._recheck = None
        limit = self._silence_limit
        if stream is not self._stream or self._suspect is None or limit is None:
            return
        if self._probe_answered() != self._suspect:
            self._suspect = None  # the node answers again
            return
        if self._heard_nothing_for(limit):
            waited = self._loop.time() - self._heard
            self._stream_failed(
                f"{self.addr} left the liveness probe unanswered, and this connection heard nothing from it for {waited:.3g} s",
                try_last=True,
            )
        else:
            self._arm_recheck(stream, limit)

    def _on_silent(self, stream: Stream, why: str, cannot_serve: bool) -> None:
        """The client's probe found the node of `stream` silent, or unable
        to serve (`why` says which)."""
        if stream is not self._stream or self._silence_limit is None:
            return
        if not cannot_serve and not self._heard_nothing_for(self._silence_limit):
            # This stream heard from the node within the limit: the probe's
            # own connection was slow (a new leader flooded with resumes),
            # not the node. (Unavailable: the node said it cannot serve,
            # whatever this stream heard.) It goes once it too hears nothing
            # for the limit, unless the probe is answered again.
            self._suspect = self._probe_answered()
            self._arm_recheck(stream, self._silence_limit)
            return
        self._stream_failed(f"{self.addr} {why}", try_last=True)

    def _on_stream(self, stream: Stream, bodies: Optional[List[bytes]], gone: Optional[str]) -> None:
        if stream is not self._stream:
            return  # a stream given up already
        if gone is not None:
            self._stream_failed(gone)
            return
        assert bodies is not None
        if bodies:
            self._heard = self._loop.time()
        for body in bodies:
            if stream is not self._stream:
                return
            resp = pb.Response()
            try:
                resp.ParseFromString(body)
            except DecodeError as e:
                self._stream_failed(f"undecodable response: {e}")
                return
            self._on_response(resp)

    def _on_response(self, resp: "pb.Response") -> None:
        if not self._pending or self._pending[0].id != resp.request_id:
            # An answer to nothing: the server turned the connection away
            # (request_id 0: too many connections, frame too large) or
            # broke ordering.
            head = from_response(resp) if resp.request_id == 0 and resp.status != Status.Ok else None
            text = resp.error_text or f"unexpected answer to request {resp.request_id}"
            self._stream_failed(f"server: {text}", head=head)
            return
        if self.session:
            # Answers that send the session elsewhere leave the request in
            # place, to be sent again there.
            where = rules.elsewhere(resp.status, resp.leader_addr or None)
            if where is not None:
                self._go_elsewhere(where, resp)
                return
        p = self._pending.popleft()
        if p.seq:
            self._numbered.popleft()
        if p.rtype == pb.Enqueue and resp.status == Status.Queued and p.seq:
            self._queued[resp.ticket] = p.seq
        elif p.rtype == pb.Wait:
            self._queued.pop(p.ticket, None)
        if p.counted:
            self._slots.release()
        if rules.moves_deadline(bool(self.session), p.rtype, resp.status):
            self.fresh = max(self.fresh, p.sent)
        if p.rtype == pb.Ping and p.future is None:
            self._pings_out -= 1
        fut = p.future
        if fut is None:
            return
        if fut.done():
            # Cancelled, or failed by `drain` (the client was closed): the
            # caller has gone.
            self._abandoned(p.lock_keys, resp, p.on_abandoned)
            return
        fut.set_result(resp)

    def _go_elsewhere(self, where: rules.Elsewhere, resp: "pb.Response") -> None:
        """The node did not act on the request at the head (`rules.elsewhere`)."""
        if where.means == rules.SESSION_ENDED:
            self.end(f"session {self.session} has ended ({resp.error_text}): its locks may be another's")
        elif where.means == rules.NO_QUORUM:
            self._stream_failed(f"{self.addr} could not commit in time (Unavailable)")
        elif resp.status == Status.ShuttingDown:
            # The node is stopping (a rolling restart) and did nothing: as
            # NotLeader naming no leader. The session goes on at the next
            # leader, where what is unanswered is sent again under its
            # number, so nothing is lost or done twice. The node is tried
            # last: it is on its way out.
            self._stream_failed(f"{self.addr} is shutting down", try_last=True)
        else:
            self._stream_failed(f"{self.addr} stopped leading", leader=where.leader)

    def _abandoned(self, lock_keys: Optional[List[str]], resp: "pb.Response", then: Optional[Abandoned]) -> None:
        """The caller stopped waiting for `resp`: release what it was granted."""
        if lock_keys is not None and resp.status == Status.Ok and self.close_reason is None:
            if self._late is not None:
                # Given up: this connection writes nothing more (and a lease
                # outlives it).
                self._late(lock_keys, resp.fence)
            else:
                self.send(pb.Unlock, pb.RequestLock(keys=lock_keys, fence=resp.fence), None)
        if then is not None:
            then(resp)

    @property
    def waiting(self) -> bool:
        """Whether a caller waits for the answer to a Lock, Enqueue or Wait
        on this connection (one whose grant may cross its close)."""
        return any(p.lock_keys is not None and p.future is not None and not p.future.done() for p in self._pending)

    def drain(self, late: Late, bound: float, fail: Optional[str] = None) -> None:
        """Gives up this connection while a request on it waits (a Lock, a
        Wait): what is queued is written, then the writing side is closed.
        The server then withdraws the request (on a cluster, ends the
        session: a lock without a lease goes with it) and closes its side.
        A grant it sent before is still read and handed to `late`, since a
        lease outlives the connection. After `bound` seconds the connection
        ends whatever happened. A stream that cannot be half-closed (TLS),
        or a session between nodes, is closed at once instead: a lease
        granted just before then runs out on its own.

        `fail` (the client is closed): every caller still waiting here (for a
        Lock, Enqueue or Wait, or any other answer) fails at once with
        ConnectionLost(fail), as a closed connection would fail it, and so
        does a request made later; an answer, a grant too, then goes to
        `late`."""
        if self.close_reason is not None or self._late is not None:
            return
        why = "withdrawn"
        if fail is not None:
            why = self._gone = fail
            for p in self._pending:
                if p.future is not None and not p.future.done():
                    p.future.set_exception(ConnectionLost(fail))
        stream = self._stream
        transport = stream.transport if stream is not None else None
        if transport is None or not transport.can_write_eof():
            self.end(why, closing=True)
            return
        self._flush()
        self._late = late
        self._pinger.cancel()
        transport.write_eof()
        self._loop.call_later(bound, lambda: self.end(why, closing=True))

    def _stream_failed(
        self,
        reason: str,
        *,
        head: Optional[DlockError] = None,
        leader: Optional[str] = None,
        try_last: bool = False,
    ) -> None:
        """The stream is of no more use: on a session, move it to the leader;
        otherwise end the connection. `try_last`: the node cannot serve
        (silent, stopping): look for the leader among the others first."""
        if self.close_reason is not None or self._stream is None:
            return
        if not self.session or self._late is not None:
            # (A connection given up has nothing to resume.)
            self.end(reason, head=head)
            return
        stream, self._stream = self._stream, None
        stream.detach()
        if stream.transport is not None:
            reset(stream.transport)
        self._stop_watching()
        self._out.clear()  # every frame in it is pending, and is sent again
        level = logging.DEBUG if self._quiet else logging.WARNING
        log.log(level, "dlock: connection to %s lost (%s); resuming session %d", self.addr, reason, self.session)
        if not self._quiet:
            self._dial.event(Reconnecting(self.addr, reason, self.session))
        self._resuming = self._loop.create_task(
            self._resume(reason, leader, self.addr if try_last else None)
        )

    async def _resume(self, reason: str, leader: Optional[str], avoid: Optional[str]) -> None:
        broke = self._loop.time()
        # The session lives a TTL after the last command that kept it alive:
        # the last answered request, or, while the stream was open, the
        # node's own keep-alives (a third of a TTL apart), which the client
        # does not see while a Lock waits. Past this no node knows it; before
        # it, a node that does not answers UnknownSession. (Locks enforce the
        # safety deadline apart.)
        deadline = rules.to_seconds(
            rules.session_lives_until(
                rules.to_ns(self.fresh), rules.to_ns(broke), rules.to_ns(self.limits.session_timeout)
            )
        )
        try:
            est = await establish(self._dial, self.session, deadline, persist=True, prefer=leader, avoid=avoid)
        except SessionEnded as e:
            self.end(str(e))
            return
        except Exception as e:  # noqa: BLE001 - whatever it was, the session is not resumed
            self.end(f"session {self.session} not resumed after {reason}: {e}")
            return
        if self.close_reason is not None:
            reset(est.stream.transport)  # type: ignore[arg-type]
            return
        self._resuming = None
        self.addr = est.addr
        self.fresh = max(self.fresh, est.acked_from)
        # Everything not answered, first, in order, under its first number
        # (and id): its answer will come from this stream.
        now = self._loop.time()
        frames = []
        for p in self._pending:
            if p.frame is not None:
                frames.append(p.frame)
                p.sent = now
        self._take(est.stream)
        if frames and est.stream.transport is not None:
            est.stream.transport.write(b"".join(frames))
        after = now - broke
        level = logging.DEBUG if self._quiet else logging.INFO
        log.log(level, "dlock: session %d resumed on %s after %.3g s", self.session, est.addr, after)
        if not self._quiet:
            self._dial.event(Resumed(est.addr, self.session, after))

    def end(self, reason: str, *, head: Optional[DlockError] = None, closing: bool = False) -> None:
        """Ends the connection once: fails what is pending, then tells `on_end`.

        `closing`: the client closes it, cleanly (a FIN: a cluster node ends
        the session at once and releases its locks). Otherwise it is reset.
        """
        if self.close_reason is not None:
            return
        self._flush()  # a close by the client still sends what was queued
        self.close_reason = reason
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.detach()
            if stream.transport is not None:
                if closing:
                    stream.transport.close()
                else:
                    reset(stream.transport)
        if self._resuming is not None and self._resuming is not asyncio.current_task():
            self._resuming.cancel()
        pending, self._pending = self._pending, collections.deque()
        self._numbered.clear()
        self._queued.clear()
        for p in pending:
            if p.counted:
                self._slots.release()
            if p.future is not None and not p.future.done():
                p.future.set_exception(head or ConnectionLost(reason))
                head = None
        self._stop_watching()
        self._pinger.cancel()
        self.closed.set()
        self.on_end(reason, closing)

    async def _ping_loop(self) -> None:
        interval = self.limits.session_timeout / 4
        # On a session: the oldest request that should be answered at once,
        # unanswered too long (`rules.unanswered_too_long`: half the TTL),
        # shows a node that is gone (paused, cut off behind a path that
        # drops without a reset) though the probe did not tell (liveness.py).
        ttl = rules.to_ns(self.limits.session_timeout)
        silence = rules.to_seconds(rules.unanswered_limit(ttl))
        while self.close_reason is None:
            now = self._loop.time()
            if self._stream is None:
                await asyncio.sleep(interval)  # the session is moving
                continue
            wake = self._last_send + interval
            if self.session and self._pending:
                head = self._pending[0]
                if not rules.may_wait(head.rtype):
                    waited = now - head.sent
                    if rules.unanswered_too_long(head.rtype, rules.to_ns(waited), ttl):
                        self._stream_failed(f"no answer for {waited:.3g} s", try_last=True)
                        continue
                    wake = min(wake, head.sent + silence)
            if now < wake:
                await asyncio.sleep(wake - now)
                continue
            # Pings behind a waiting Lock are read (they keep the session
            # alive) but not answered until the Lock is; past max_pipeline
            # unanswered requests the server stops reading anyway.
            if self._pings_out < self.limits.max_pipeline:
                self._pings_out += 1
                self.send(pb.Ping, None, None)
            else:
                self._last_send = now


def _with_timeout(limits: Limits, timeout: float) -> Limits:
    return dataclasses.replace(limits, session_timeout=timeout)


def keeps_session_alive(rtype: int, status: int) -> bool:
    """Whether an answer with `status` to a request of type `rtype` comes, on
    a cluster, from a command committed for the session (which kept it
    alive): `rules.moves_deadline` on a session. `Ok` to a Ping or to a
    Lock, Unlock, Renew or Enqueue; `AcquireTimeout` to a Lock or Enqueue;
    `Queued` to an Enqueue; `NotHeld` to an Unlock or Renew. A refusal
    (`NotLeader`, `Unavailable`, `InvalidArgument`, ...), an Inspect or a
    Wait (read, not committed) proves nothing."""
    return rules.moves_deadline(True, rtype, status)
