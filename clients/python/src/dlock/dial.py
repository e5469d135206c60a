"""Finding a node to talk to: `Dial` (where and how a client connects) and
`establish`, which connects to a server, or to a cluster's leader by
following `NotLeader` answers, asks its limits (Hello) and, on a cluster,
opens or resumes the session. The connection (connection.py) takes the
stream from there. Mirrors src/dial.rs of the Rust library.

A stream that is given up is reset (`reset`), never closed cleanly: a
cluster node ends a session at once when its client closes the connection
with a FIN, and the session may be one the client is about to resume.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Deque, Dict, List, Optional, Tuple

from google.protobuf.message import DecodeError

from . import _env, _tls
from ._proto import dlock_pb2 as pb
from .errors import (
    AccessDenied,
    ConnectError,
    ConnectionLost,
    DlockError,
    NotOneCluster,
    ProtocolError,
    Status,
    TLSError,
    TLSProblem,
    from_response,
)
from .framing import FrameDecoder, encode
from .types import DEFAULT_LIMITS, Event, Limits

if TYPE_CHECKING:
    from .liveness import Probe

log = logging.getLogger("dlock")

PROTOCOL_VERSION = 2

#: Ids of the handshake's requests: above the ids of calls, which count up
#: from 1, so an answer can never be taken for another's.
HELLO_ID = 2**64 - 1
OPEN_SESSION_ID = 2**64 - 2

#: Shortest time one node gets to answer when there are several.
MIN_ATTEMPT = 0.5
#: First and longest pause between rounds of the nodes: an election takes a
#: few hundred milliseconds at best, and every pause adds to the failover.
FIRST_PAUSE = 0.02
MAX_PAUSE = 0.25
#: Nodes remembered as found silent (`Dial.suspect`); the oldest is
#: forgotten first.
MAX_SUSPECTS = 16


class SessionEnded(DlockError):
    """The cluster no longer knows the session: it ended (its TTL ran out, or it was closed)."""

    def __init__(self, session: int) -> None:
        super().__init__(f"session {session} has ended: its locks without a lease may be another's")
        self.session = session


class Dial:
    """What every connect and reconnect of a client needs: where, how, and
    whom to tell. Holds no connection."""

    def __init__(
        self,
        addrs: List[str],
        token: str,
        connect_timeout: float,
        tls: Optional[ssl.SSLContext],
        session_ttl: Optional[float],
        on_event: Optional[Callable[[Event], None]],
    ) -> None:
        self.addrs = addrs
        self.token = token
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.session_ttl = session_ttl
        self._on_event = on_event
        #: The node that last opened or resumed a session: tried first,
        #: since it was the leader.
        self.leader: Optional[str] = None
        # Nodes a probe found silent and that have not answered since,
        # oldest first: tried last (see liveness.py).
        self._suspects: List[str] = []
        #: The liveness probe of each node some connection of the client is
        #: on (liveness.py); each stops with its last connection.
        self.probes: "Dict[str, Probe]" = {}

    def event(self, event: Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a callback's bug must not break the connection
                log.exception("dlock: on_event callback failed for %s", event)

    def forget_leader(self, addr: str) -> None:
        """Stops trying `addr` first: it did not answer."""
        if self.leader == addr:
            self.leader = None

    def suspect(self, addr: str, silent: bool) -> None:
        """Marks `addr` as found silent (tried last, and no longer first as
        the leader), or as answering again."""
        if addr in self._suspects:
            self._suspects.remove(addr)
        if silent:
            self._suspects.append(addr)
            del self._suspects[:-MAX_SUSPECTS]
            self.forget_leader(addr)

    def suspects(self) -> List[str]:
        """The nodes found silent that have not answered since, oldest first."""
        return list(self._suspects)


@dataclass
class Established:
    """A stream to a node, ready for the connection."""

    stream: "Stream"
    addr: str
    limits: Limits
    #: The session opened or resumed; 0 on a single server.
    session: int
    #: The session's TTL, or the server's session timeout.
    session_timeout: float
    #: When the last request of the handshake was sent: the server (and
    #: the session) was alive no earlier.
    acked_from: float


class Stream(asyncio.Protocol):
    """One transport to one node. Frames are decoded here and handed to the
    handshake (`exchange`) until a connection takes the stream (`attach`).

    On a plain stream the first bytes the server sends are checked for a
    TLS record header before they are read as a frame length: a TLS server
    answers a plain client's Hello with a TLS alert, whose header would
    claim a frame of 352 MB. The stream then ends, with `speaks_tls` set."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self._decoder = FrameDecoder()
        # The first bytes read, until there are enough to tell a TLS record
        # header; None once told (or on a TLS stream).
        self._head: Optional[bytes] = b""
        #: The server answered with a TLS record: it speaks TLS, this
        #: stream does not.
        self.speaks_tls = False
        # The handshake sends one request at a time, so at most a frame or
        # two wait here.
        self._frames: Deque[bytes] = collections.deque()
        self._wake: "Optional[asyncio.Future[None]]" = None
        self._owner: Optional[Callable[["Stream", Optional[List[bytes]], Optional[str]], None]] = None
        #: Why the stream ended, once it has.
        self.gone: Optional[str] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if transport.get_extra_info("ssl_object") is not None:
            self._head = None

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            data = self._head + data
            if len(data) < 3:
                self._head = data  # no frame is complete before 4 bytes either
                return
            self._head = None
            if _tls.looks_like_tls(data):
                self.speaks_tls = True
                self._ended("the server answered with a TLS record")
                if self.transport is not None:
                    reset(self.transport)
                return
        try:
            bodies = self._decoder.feed(data)
        except ProtocolError as e:
            self._ended(str(e))
            if self.transport is not None:
                reset(self.transport)
            return
        if self._owner is not None:
            self._owner(self, bodies, None)
        else:
            self._frames.extend(bodies)
            self._notify()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._ended(f"connection error: {exc}" if exc else "server closed the connection")

    def _ended(self, reason: str) -> None:
        if self.gone is not None:
            return
        self.gone = reason
        if self._owner is not None:
            self._owner(self, None, reason)
        else:
            self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def attach(self, owner: Callable[["Stream", Optional[List[bytes]], Optional[str]], None]) -> None:
        """From now on every frame, and the stream's end, go to `owner`."""
        self._owner = owner
        if self._frames:
            frames, self._frames = list(self._frames), collections.deque()
            owner(self, frames, None)
        if self.gone is not None:
            owner(self, None, self.gone)

    def detach(self) -> None:
        self._owner = None

    async def exchange(self, req: "pb.Request") -> "pb.Response":
        """Sends `req` and reads its answer, before a connection takes the stream.

        Raises `ConnectionLost` if the stream ends first, `ProtocolError` for
        an answer that does not decode or answers another request.
        """
        assert self.transport is not None
        self.transport.write(encode(req))
        while not self._frames:
            if self.gone is not None:
                raise ConnectionLost(self.gone)
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        resp = pb.Response()
        try:
            resp.ParseFromString(self._frames.popleft())
        except DecodeError as e:
            raise ProtocolError(f"undecodable answer to {pb.RequestType.Name(req.type)}: {e}") from e
        # request_id 0 with an error: the server turned the connection away
        # (too many connections) before reading anything.
        if resp.request_id != req.id and not (resp.request_id == 0 and resp.status != Status.Ok):
            raise ProtocolError(f"answer to request {resp.request_id}, expected {req.id}")
        return resp


def reset(transport: asyncio.BaseTransport) -> None:
    """Closes `transport` with an RST, not a FIN: a cluster node ends a
    session at once when its connection is closed cleanly, and the session
    is to be resumed elsewhere. (A socket closed with unsent data, or with
    SO_LINGER on and a timeout of 0, is reset.)"""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # closed already
    transport.abort()  # type: ignore[attr-defined]


class _NodeError(Exception):
    """Why one node did not serve: `kind` is not_leader, gone, fatal or failed."""

    def __init__(self, kind: str, why: str, error: Optional[BaseException] = None, *, leader: Optional[str] = None,
                 answered: bool = False) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.error = error
        self.leader = leader
        self.answered = answered


async def establish(
    dial: Dial,
    session: int,
    deadline: float,
    *,
    persist: bool,
    prefer: Optional[str] = None,
    avoid: Optional[str] = None,
) -> Established:
    """Connects to a node among `dial`'s servers before `deadline`: on a
    cluster the leader, opening a session (`session` 0) or resuming
    `session`. Tried in order: `prefer` (a leader some node named), the last
    known leader, the servers in order; each leader a node names right after
    that node. `avoid` (a node that just went silent) and the nodes a
    liveness probe found silent since they last answered
    (`Dial.suspect`) come last, and only in a round in which no other node
    answered or the others name them leader, with at most `MIN_ATTEMPT`
    each: a paused node would take its whole share of the time, every
    round, while the others elect a new leader.

    `persist`: keep going round the servers until the deadline (a session
    to resume). Otherwise (a new client) stop after a round in which no node
    answered at all, so a dead server is reported at once.

    Raises `ConnectError` naming every address tried and why it failed (with
    one address: that attempt's own error, `AccessDenied` or `ServerError`
    included), `AccessDenied`, `NotOneCluster` (one of several servers is a
    single server), or `SessionEnded`.
    """
    loop = asyncio.get_running_loop()
    attempts: List[Tuple[str, str, BaseException]] = []
    pause = FIRST_PAUSE
    n = max(1, len(dial.addrs))
    per_node = dial.connect_timeout if n == 1 else max(dial.connect_timeout / n, MIN_ATTEMPT)
    while True:
        # The silent: `avoid` first, then the probe's suspects, oldest
        # first (the likeliest to answer again).
        late = [a for a in dict.fromkeys((avoid, *dial.suspects())) if a]
        queue: Deque[str] = collections.deque()
        for a in (prefer, dial.leader, *dial.addrs):
            if a and a not in late and a not in queue:
                queue.append(a)
        tried: "set[str]" = set()
        answered = False
        named: "set[str]" = set()  # silent ones another node names leader
        while True:
            if queue:
                addr = queue.popleft()
            else:
                left = [a for a in late if a not in tried and (a in named or not answered)]
                if not left:
                    break
                addr = left[0]
            if addr in tried:
                continue
            tried.add(addr)
            now = loop.time()
            if now >= deadline and attempts:
                break
            share = per_node if addr not in late else min(per_node, MIN_ATTEMPT)
            limit = max(min(share, deadline - now), 0.001)
            stage = ["connect"]
            try:
                est = await asyncio.wait_for(_try_node(dial, addr, session, stage), limit)
            except asyncio.TimeoutError as e:
                what = "" if stage[0] == "connect" else f" to {stage[0]}"
                attempts.append((addr, f"no answer{what} within {limit:.3g} s", e))
                # A dead old leader must not cost every round its time.
                dial.forget_leader(addr)
                continue
            except _NodeError as e:
                if e.kind == "gone":
                    raise SessionEnded(session) from None
                if e.kind == "fatal":
                    assert e.error is not None
                    raise e.error
                answered |= e.answered
                attempts.append((addr, e.why, e.error or e))
                if e.answered:
                    dial.suspect(addr, False)  # it answers again
                if e.kind == "not_leader":
                    if e.leader in late:
                        named.add(e.leader)
                    elif e.leader:
                        queue.appendleft(e.leader)
                elif not e.answered:
                    dial.forget_leader(addr)
                continue
            dial.suspect(addr, False)
            if est.session:
                dial.leader = est.addr
            return est
        now = loop.time()
        if now >= deadline or (not persist and not answered):
            raise _unreachable(attempts)
        # An election takes a few heartbeats: do not hammer the nodes.
        await asyncio.sleep(min(pause, deadline - now))
        pause = min(pause * 2, MAX_PAUSE)
        # Keep the report to the latest rounds.
        del attempts[: max(0, len(attempts) - 4 * n)]


def _unreachable(attempts: List[Tuple[str, str, BaseException]]) -> DlockError:
    """The error for a connect that found no node: with one attempt, that
    attempt's own error (what a client of a single server always got)."""
    if len(attempts) == 1:
        addr, why, cause = attempts[0]
        if isinstance(cause, DlockError) and not isinstance(cause, ConnectionLost):
            return cause
        err = ConnectError(addr, why)
        err.__cause__ = cause
        return err
    latest: "dict[str, str]" = {}
    for addr, why, _ in attempts:
        latest[addr] = why  # the latest reason, in the order first tried
    err = ConnectError(",".join(latest), "; ".join(f"{a}: {w}" for a, w in latest.items()), attempts=list(latest.items()))
    err.__cause__ = attempts[-1][2] if attempts else None
    return err


async def _try_node(dial: Dial, addr: str, session: int, stage: List[str]) -> Established:
    """Connects to `addr`, asks its limits and, on a cluster node, opens or
    resumes the session there. `stage` says how far it got, for the
    message of a timeout."""
    loop = asyncio.get_running_loop()
    try:
        _env.parse_address(addr)
    except ValueError as e:
        raise _NodeError("failed", str(e), e, answered=True) from None
    try:
        stream = await connect_stream(dial, addr)
    except TLSError as e:
        # A TLS setup that does not match the server's is the same on every
        # node: not tried elsewhere, the user has an option to change.
        raise _NodeError("fatal", str(e), e) from None
    except ssl.SSLError as e:
        hint = _tls.certificate_hint(e, addr)
        raise _NodeError("failed", f"TLS handshake failed: {e.reason or e}{hint}", e) from None
    except OSError as e:
        raise _NodeError("failed", _os_reason(e), e) from None
    transport = stream.transport
    assert transport is not None
    try:
        stage[0] = "Hello"
        hello_sent = loop.time()
        try:
            resp = await stream.exchange(pb.Request(version=PROTOCOL_VERSION, id=HELLO_ID, access_token=dial.token, type=pb.Hello))
        except ConnectionLost as e:
            if stream.speaks_tls:
                raise _NodeError("fatal", str(e), TLSError(TLSProblem.SERVER_SPEAKS_TLS, addr)) from None
            # Lost before the first answer: the connection was never made (a
            # TLS server refusing the handshake late, as TLS 1.3 does for a
            # missing client certificate). A TLS server spoken to in plain TCP
            # answers with a TLS record (above): no guess about TLS here.
            raise _NodeError("failed", f"lost before the server answered Hello: {e.reason}", e) from None
        except ProtocolError as e:
            raise _NodeError("fatal", str(e), e) from None
        if resp.status == Status.Ok:
            limits = Limits.from_proto(resp.limits)
        elif resp.status == Status.InvalidType:
            limits = DEFAULT_LIMITS  # a server older than Hello: assume its defaults
        else:
            # ShuttingDown (stopping), LimitReached: the next node is tried.
            err = from_response(resp)
            kind = "fatal" if isinstance(err, AccessDenied) else "failed"
            raise _NodeError(kind, str(err), err)
        if not limits.resumable_sessions:
            # Several addresses must be one cluster's nodes: a single server
            # among them shares no locks with the rest, and a client that
            # fell back to it from a node that is down would lock beside a
            # holder of the same key there. (Resuming, it is just a node
            # that cannot serve, below.)
            if not session and len(dial.addrs) > 1:
                raise _NodeError("fatal", f"{addr} is a single server", NotOneCluster(addr))
            if session:
                raise _NodeError("failed", "not a cluster node: it cannot resume a session", answered=True)
            return Established(stream, addr, limits, 0, limits.session_timeout, hello_sent)
        stage[0] = "OpenSession"
        req = pb.Request(version=PROTOCOL_VERSION, id=OPEN_SESSION_ID, access_token=dial.token, type=pb.OpenSession)
        req.session = session
        if dial.session_ttl is not None:
            req.session_ttl_micro = max(1, round(dial.session_ttl * 1_000_000))
        sent = loop.time()
        try:
            resp = await stream.exchange(req)
        except ConnectionLost as e:
            raise _NodeError("failed", f"lost before the server answered OpenSession: {e.reason}", e) from None
        except ProtocolError as e:
            raise _NodeError("fatal", str(e), e) from None
        status = resp.status
        if status == Status.Ok:
            ttl = resp.session_ttl_micro / 1_000_000 or limits.session_timeout
            return Established(stream, addr, limits, resp.session, ttl, sent)
        if status == Status.NotLeader:
            leader = resp.leader_addr or None
            why = f"not the leader (the leader is {leader})" if leader else "not the leader, and no leader is known yet"
            raise _NodeError("not_leader", why, leader=leader, answered=True)
        if status == Status.UnknownSession and session:
            raise _NodeError("gone", "the session has ended")
        err = from_response(resp)
        if status in (Status.AccessDenied, Status.InvalidArgument):
            raise _NodeError("fatal", str(err), err)
        # ShuttingDown (a node stopping: as NotLeader naming no leader),
        # Unavailable, LimitReached: the next node is tried.
        raise _NodeError("failed", str(err), err, answered=True)
    except BaseException:
        reset(transport)
        raise


async def connect_stream(dial: Dial, addr: str) -> Stream:
    """A TCP (with `dial.tls`, TLS) connection to `addr`, with keepalive on.

    Raises `ValueError` for a malformed address, `TLSError` for a TLS
    handshake that found no TLS at the server, a server certificate that is
    a CA's or a server that refuses the protocol name "dlock" (a cluster's
    peer port), `ssl.SSLError`, `OSError`.
    """
    loop = asyncio.get_running_loop()
    _, host, port = _env.parse_address(addr)
    tls = dial.tls
    # With TLS the handshake is part of the connect, under the caller's
    # timeout; the server's name is the address's host (an IP literal is
    # checked against the certificate's IP names).
    try:
        transport, stream = await loop.create_connection(
            Stream,
            host,
            port,
            ssl=tls,
            server_hostname=host if tls is not None else None,
        )
    except ssl.SSLError as e:
        if _tls.not_tls(e):
            raise TLSError(TLSProblem.SERVER_SPEAKS_NO_TLS, addr, _tls.detail(e)) from e
        if _tls.no_application_protocol(e):
            raise TLSError(TLSProblem.NOT_A_CLIENT_PORT, addr, _tls.detail(e)) from e
        raise
    if tls is not None:
        why = _tls.ca_as_own(transport.get_extra_info("ssl_object"))
        if why is not None:
            reset(transport)
            raise TLSError(TLSProblem.CA_USED_AS_SERVER_CERTIFICATE, addr, why)
    _keepalive(transport)
    return stream


def _os_reason(e: OSError) -> str:
    """"Connection refused" rather than asyncio's "[Errno 111] Connect call failed (...)"."""
    if e.errno and e.errno > 0 and not isinstance(e, socket.gaierror):
        return os.strerror(e.errno)
    return str(e)


def _keepalive(transport: asyncio.BaseTransport) -> None:
    """TCP keepalive so a silently dead path is noticed while the client is quiet."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 3)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except OSError:
        pass  # an optimisation; the session-timeout rule does not rely on it
