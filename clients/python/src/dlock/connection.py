"""One connection to a dlock server: pipelined requests, answers matched in order, pings, its end.

Every request is framed and queued for writing at once, and the frames
queued during one turn of the event loop go out in one write. The server
answers in order, so each answer belongs to the oldest unanswered request;
an answer out of order ends the connection. At most `max_in_flight`
requests (default: the server's `max_pipeline`) are unanswered at once,
which bounds what is buffered here; further calls wait for a slot.

Opening sends Hello to learn the server's limits (a server older than Hello
answers InvalidType and the server defaults are assumed). Then a Ping goes
out whenever nothing was sent for a quarter of the session timeout, so the
server never ends a healthy, quiet connection.

`fresh` is the send time of the last request whose answer proves the owner
alive, the input of the client-side safety rule (`dlock.aio`). On a single
server any answer does: the server was reading the connection then, so it
cannot have ended it before `fresh + session_timeout`. On a cluster node
(Hello says `resumable_sessions`) the owner is a session that ends a TTL
after the last command that kept it alive was committed, so only answers
from such commands count (`keeps_session_alive`): a `NotLeader` or
`Unavailable` answer, from a deposed leader say, proves nothing, and
counting it would keep a lock "held" here after the cluster gave it away.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from typing import Callable, Deque, List, Optional

from google.protobuf.message import DecodeError

from ._proto import dlock_pb2 as pb
from .errors import ConnectError, ConnectionLost, DlockError, ProtocolError, ServerError, Status, from_response
from .framing import FrameDecoder, encode
from .types import DEFAULT_LIMITS, Limits

PROTOCOL_VERSION = 2


class _Pending:
    """A request written and not yet answered."""

    __slots__ = ("id", "rtype", "future", "sent", "counted", "lock_keys")

    def __init__(
        self,
        id: int,
        rtype: int,
        future: "Optional[asyncio.Future[pb.Response]]",
        sent: float,
        counted: bool,
        lock_keys: Optional[List[str]],
    ) -> None:
        self.id = id
        self.rtype = rtype
        self.future = future
        self.sent = sent
        self.counted = counted
        # For Lock: the keys, so a grant nobody waits for any more is released.
        self.lock_keys = lock_keys


class _Protocol(asyncio.Protocol):
    """asyncio's callbacks, handed to the Connection once it exists."""

    def __init__(self) -> None:
        self.conn: Optional[Connection] = None
        self.early: List[bytes] = []
        self.gone: Optional[str] = None

    def data_received(self, data: bytes) -> None:
        if self.conn is None:
            self.early.append(data)
        else:
            self.conn._on_data(data)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        reason = f"connection error: {exc}" if exc else "server closed the connection"
        if self.conn is None:
            self.gone = reason
        else:
            self.conn.end(reason)


class Connection:
    """The connection under a `dlock.aio.Client`; see the module doc."""

    def __init__(self, addr: str, transport: asyncio.Transport, token: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.addr = addr
        self._transport = transport
        self._token = token
        self._decoder = FrameDecoder()
        self._pending: Deque[_Pending] = collections.deque()
        self._out: List[bytes] = []
        self._flush_scheduled = False
        self._next_id = 0
        self._pings_out = 0
        self._slots: Optional[asyncio.Semaphore] = None
        self.limits: Limits = DEFAULT_LIMITS
        now = self._loop.time()
        self._last_send = now
        #: Send time of the last answered request.
        self.fresh = now
        self._pinger: Optional["asyncio.Task[None]"] = None
        self._turned_away: Optional[DlockError] = None
        #: Called once when the connection ends: (reason, closed by us).
        self.on_end: Callable[[str, bool], None] = lambda reason, closing: None
        #: Set when the connection has ended; `close_reason` says why.
        self.closed = asyncio.Event()
        self.close_reason: Optional[str] = None

    @classmethod
    async def open(
        cls,
        addr: str,
        host: str,
        port: int,
        token: str,
        connect_timeout: float,
        max_in_flight: Optional[int],
        tls: Optional[ssl.SSLContext] = None,
    ) -> "Connection":
        """Connects, says Hello, starts pinging.

        Raises `ConnectError` if no connection or no answer to Hello comes
        within `connect_timeout`, the error of the server's refusal
        (`AccessDenied`, `ServerError(LimitReached)`), or `ConnectionLost`.
        """
        loop = asyncio.get_running_loop()
        try:
            # With TLS the handshake is part of the connect, under the same
            # timeout; the server's name is the address's host (an IP
            # literal is checked against the certificate's IP names).
            transport, protocol = await asyncio.wait_for(
                loop.create_connection(
                    _Protocol,
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                    ssl_handshake_timeout=connect_timeout if tls is not None else None,
                ),
                connect_timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectError(addr, f"no answer within {connect_timeout} s") from None
        except ssl.SSLError as e:
            raise ConnectError(addr, f"TLS handshake failed: {e.reason or e}") from e
        except OSError as e:
            raise ConnectError(addr, str(e)) from e
        _keepalive(transport)
        conn = cls(addr, transport, token)  # type: ignore[arg-type]
        protocol.conn = conn
        for data in protocol.early:
            conn._on_data(data)
        if protocol.gone:
            conn.end(protocol.gone)
        try:
            try:
                # The connect timeout covers the first answer too: a server
                # that accepts but never answers (paused, overloaded) is as
                # unreachable as one that does not accept.
                resp = await asyncio.wait_for(conn.call(pb.Hello, None, counted=False), connect_timeout)
                conn.limits = Limits.from_proto(resp.limits)
            except asyncio.TimeoutError:
                conn.end("no answer to Hello", closing=True)
                raise ConnectError(addr, f"no answer to Hello within {connect_timeout} s") from None
            except ServerError as e:
                if e.status != Status.InvalidType:
                    raise
                # A server older than Hello: assume its defaults.
                conn.limits = DEFAULT_LIMITS
        except ConnectionLost as e:
            conn.end("connect failed", closing=True)
            if conn._turned_away is not None:
                raise conn._turned_away from e
            # Lost before the first answer: the connection was never made
            # (a TLS server refusing the handshake late, as TLS 1.3 does for
            # a missing client certificate, or one spoken to in plain TCP).
            hint = "" if tls is not None else " (if the server speaks TLS, give tls_ca)"
            raise ConnectError(addr, f"lost before the server answered Hello: {e}{hint}") from e
        except BaseException:
            conn.end("connect failed", closing=True)
            raise
        conn._slots = asyncio.Semaphore(max_in_flight or conn.limits.max_pipeline)
        conn._pinger = loop.create_task(conn._ping_loop())
        return conn

    async def call(
        self,
        rtype: int,
        body: Optional["pb.RequestLock"],
        *,
        counted: bool = True,
        lock_keys: Optional[List[str]] = None,
    ) -> "pb.Response":
        """Sends one request, waits for its answer; error statuses raise."""
        if self.close_reason is not None:
            raise ConnectionLost(self.close_reason)
        counted = counted and self._slots is not None
        if counted:
            assert self._slots is not None
            await self._slots.acquire()
            if self.close_reason is not None:
                self._slots.release()
                raise ConnectionLost(self.close_reason)
        future: "asyncio.Future[pb.Response]" = self._loop.create_future()
        try:
            self.send(rtype, body, future, counted, lock_keys)
        except BaseException:
            if counted:
                assert self._slots is not None
                self._slots.release()
            raise
        resp = await future
        if resp.status != Status.Ok:
            raise from_response(resp)
        return resp

    def send(
        self,
        rtype: int,
        body: Optional["pb.RequestLock"],
        future: "Optional[asyncio.Future[pb.Response]]",
        counted: bool = False,
        lock_keys: Optional[List[str]] = None,
    ) -> None:
        self._next_id += 1
        req = pb.Request(version=PROTOCOL_VERSION, id=self._next_id, access_token=self._token, type=rtype)  # type: ignore[arg-type]
        if body is not None:
            req.lock.CopyFrom(body)
        frame = encode(req)
        if len(frame) - 4 > self.limits.max_frame:
            # The server would answer FrameTooLarge and close the connection,
            # taking every lock on it along: refuse here instead.
            raise ServerError(
                Status.FrameTooLarge,
                f"request of {len(frame) - 4} bytes is over the server's max_frame of "
                f"{self.limits.max_frame} (not sent)",
            )
        now = self._loop.time()
        self._pending.append(_Pending(self._next_id, rtype, future, now, counted, lock_keys))
        if not self.limits.resumable_sessions or rtype in _KEEPS_ALIVE:
            # On a cluster an Inspect or a Hello keeps nothing alive that the
            # client could prove: a Ping is still due.
            self._last_send = now
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.close_reason is None and self._out:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def _on_data(self, data: bytes) -> None:
        try:
            bodies = self._decoder.feed(data)
        except ProtocolError as e:
            self.end(str(e))
            return
        for body in bodies:
            resp = pb.Response()
            try:
                resp.ParseFromString(body)
            except DecodeError as e:
                self.end(f"undecodable response: {e}")
                return
            if not self._pending or self._pending[0].id != resp.request_id:
                # An answer to nothing: the server turned the connection away
                # (request_id 0: too many connections, frame too large) or
                # broke ordering.
                head = from_response(resp) if resp.request_id == 0 and resp.status != Status.Ok else None
                text = resp.error_text or f"unexpected answer to request {resp.request_id}"
                self.end(f"server: {text}", head=head)
                return
            p = self._pending.popleft()
            if p.counted and self._slots is not None:
                self._slots.release()
            if not self.limits.resumable_sessions or keeps_session_alive(p.rtype, resp.status):
                self.fresh = max(self.fresh, p.sent)
            if p.rtype == pb.Ping and p.future is None:
                self._pings_out -= 1
            fut = p.future
            if fut is None:
                continue
            if fut.cancelled():
                if p.lock_keys is not None and resp.status == Status.Ok:
                    # The caller stopped waiting: release what it was granted.
                    self.send(pb.Unlock, pb.RequestLock(keys=p.lock_keys, fence=resp.fence), None)
                continue
            fut.set_result(resp)

    def end(self, reason: str, *, head: Optional[DlockError] = None, closing: bool = False) -> None:
        """Ends the connection once: fails what is pending, then tells `on_end`."""
        if self.close_reason is not None:
            return
        self._flush()  # a close by the client still sends what was queued
        self.close_reason = reason
        if closing:
            self._transport.close()
        else:
            self._transport.abort()
        pending, self._pending = self._pending, collections.deque()
        for p in pending:
            if p.counted and self._slots is not None:
                self._slots.release()
            if p.future is not None and not p.future.done():
                p.future.set_exception(head or ConnectionLost(reason))
                head = None
        # An answer with request_id 0 that no request took: the server turned
        # the connection away before reading any; connect() raises it.
        self._turned_away = head
        if self._pinger is not None:
            self._pinger.cancel()
        self.closed.set()
        self.on_end(reason, closing)

    async def _ping_loop(self) -> None:
        interval = self.limits.session_timeout / 4
        while self.close_reason is None:
            due = self._last_send + interval
            now = self._loop.time()
            if now < due:
                await asyncio.sleep(due - now)
                continue
            # Pings behind a waiting Lock are read (they keep the session
            # alive) but not answered until the Lock is; past max_pipeline
            # unanswered requests the server stops reading anyway.
            if self._pings_out < self.limits.max_pipeline:
                self._pings_out += 1
                self.send(pb.Ping, None, None)
            else:
                self._last_send = now


#: Requests whose answer can prove a cluster session alive.
_KEEPS_ALIVE = frozenset((pb.Ping, pb.Lock, pb.Unlock, pb.Renew, pb.Enqueue))


def keeps_session_alive(rtype: int, status: int) -> bool:
    """Whether an answer with `status` to a request of type `rtype` comes, on
    a cluster, from a command committed for the session (which kept it
    alive), as src/link.rs decides: `Ok` to a Ping or to a Lock, Unlock,
    Renew or Enqueue; `AcquireTimeout` to a Lock or Enqueue; `Queued` to an
    Enqueue; `NotHeld` to an Unlock or Renew. A refusal (`NotLeader`,
    `Unavailable`, `InvalidArgument`, ...), an Inspect or a Wait (read, not
    committed) proves nothing."""
    if rtype not in _KEEPS_ALIVE:
        return False
    if status == Status.Ok:
        return True
    if status == Status.AcquireTimeout:
        return rtype in (pb.Lock, pb.Enqueue)
    if status == Status.Queued:
        return rtype == pb.Enqueue
    if status == Status.NotHeld:
        return rtype in (pb.Unlock, pb.Renew)
    return False


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
