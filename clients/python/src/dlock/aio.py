"""The asyncio client: one TCP connection shared by any number of tasks.

Requests are pipelined: every call is framed and queued for writing at once,
and the frames queued during one turn of the event loop go out in one write.
The server answers in order, so each answer belongs to the oldest unanswered
request; an answer out of order ends the connection. At most
`max_in_flight` requests (default: the server's `max_pipeline`) are
unanswered at once, which bounds what this client buffers; further calls
wait for a slot.

On connect the client sends Hello to learn the server's limits (a server
older than Hello answers InvalidType and the server defaults are assumed).
It then sends a Ping whenever it has sent nothing for a quarter of the
session timeout, so the server never ends a healthy, quiet connection.

Locks belong to the connection, as in every dlock client: the server grants a
key that this connection already holds again at once, under a new fencing
token. Two tasks of one client therefore do not exclude each other on a key;
when it happens the older `Lock` is reported lost. Tasks (or threads, or
processes) that must exclude each other use clients of their own.

When the connection ends, every pending call fails with `ConnectionLost`,
later calls fail at once, and `Client.closed` is set. There is no reconnect:
the server has released every lock held without a lease.

Client-side safety (the rule of docs/PROTOCOL.md): a lock is reported lost
(`Lock.lost` is set) as soon as this client can no longer be sure the server
still holds it for us, which is before the server could give it away:

- held without a lease: when the connection ends, or when no answer has
  arrived to a request sent within the last `session_timeout × (1 − margin)`
  (the server may end a connection that it heard nothing from for the
  session timeout, and an answer to a request proves the server had not when
  it read that request);
- a lease: when `lease × (1 − margin)` has passed since the last Lock or
  Renew that was answered was sent, or when Renew is answered NotHeld.
  Leases are renewed in the background every third of the lease; a lease
  outlives the connection, so losing the connection only stops renewal.

The deadlines count from when requests were *sent*. A Lock that waited long
is answered long after it was sent, so the client follows its grant with a
Renew (lease) or a Ping (no lease) to count from now instead.

A lock reported lost stays lost. The check runs on this event loop: a
process that is paused (SIGSTOP, a long GC, a blocked loop) learns of the
loss only when it runs again, which is why the protected resource must check
the fencing token (see examples/fencing/).
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import Any, Awaitable, Callable, Deque, Generator, Generic, Iterable, List, Optional, TypeVar, Union

from google.protobuf.message import DecodeError

from . import _env
from ._proto import dlock_pb2 as pb
from .errors import (
    ConnectError,
    ConnectionLost,
    DlockError,
    LockLost,
    NotHeld,
    ProtocolError,
    ServerError,
    Status,
    Timeout,
    from_response,
)
from .framing import FrameDecoder, encode
from .lock import Lock
from .types import DEFAULT_LIMITS, KeyInfo, Limits, ServerStats

__all__ = ["Client", "connect"]

PROTOCOL_VERSION = 2

Keys = Union[str, Iterable[str]]
T = TypeVar("T")


def _keys(keys: Keys) -> List[str]:
    """One key or several: a bare string is one key, not its characters."""
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def _micros(seconds: float) -> int:
    # A positive duration below a microsecond still means "a little", not 0
    # (which means "no limit" for wait and "no lease" for release).
    return max(1, round(seconds * 1_000_000))


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
    def __init__(self) -> None:
        self.client: Optional[Client] = None
        self.early: List[bytes] = []
        self.gone: Optional[str] = None

    def data_received(self, data: bytes) -> None:
        if self.client is None:
            self.early.append(data)
        else:
            self.client._on_data(data)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        reason = f"connection error: {exc}" if exc else "server closed the connection"
        if self.client is None:
            self.gone = reason
        else:
            self.client._fail(reason)


class _AwaitableContext(Generic[T]):
    """Both `await x` and `async with x as v`: how connect() and lock() are used."""

    def __init__(self, make: Callable[[], Awaitable[T]], exit: Callable[[T, bool], Awaitable[None]]) -> None:
        self._make = make
        self._exit = exit
        self._value: Optional[T] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._make()
        return self._value

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        assert self._value is not None
        await self._exit(self._value, et is not None)


def connect(
    server: Optional[str] = None,
    *,
    token: Optional[str] = None,
    connect_timeout: float = 5.0,
    max_in_flight: Optional[int] = None,
    margin: float = 0.1,
) -> "_AwaitableContext[Client]":
    """Connects to `server` (`HOST:PORT`; default: DLOCK_SERVER, else 127.0.0.1:7436).

    `token` defaults to DLOCK_TOKEN. `margin` is the fraction of the session
    timeout or lease kept in reserve before a lock is reported lost.
    Use as `client = await connect()` or `async with connect() as client:`.

    Raises `ConnectError` if the connection cannot be made, `AccessDenied`
    if the server refuses the token, `ValueError` for a malformed address.
    """

    async def close(client: Client, failed: bool) -> None:
        await client.close()

    return _AwaitableContext(
        lambda: Client._connect(server, token, connect_timeout, max_in_flight, margin), close
    )


class Client:
    """A connection to a dlock server; make one with `connect()`.

    Every method may be called from any number of tasks of the event loop
    that connected it; their requests share the connection.
    """

    def __init__(self, addr: str, transport: asyncio.Transport, token: str, margin: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.addr = addr
        self._transport = transport
        self._token = token
        if not 0 <= margin < 1:
            raise ValueError(f"margin {margin} must be at least 0 and below 1")
        self._margin = margin
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
        # Send time of the last answered request: the server was reading this
        # connection then, so it cannot have ended it (and released its locks)
        # before fresh + session_timeout.
        self._fresh = now
        self._bound: "set[Lock]" = set()  # held without a lease
        # Which Lock holds each key. The server keeps one holder per key and
        # connection: a Lock on a key this connection holds is granted at once
        # under a new fence, and the older Lock is then no longer held.
        self._holding: "dict[str, Lock]" = {}
        self._leases: "set[Lock]" = set()
        self._watchdog: Optional[asyncio.TimerHandle] = None
        self._pinger: Optional["asyncio.Task[None]"] = None
        self._turned_away: Optional[DlockError] = None
        #: Set when the connection has ended; `close_reason` says why.
        self.closed = asyncio.Event()
        self.close_reason: Optional[str] = None

    @classmethod
    async def _connect(
        cls,
        server: Optional[str],
        token: Optional[str],
        connect_timeout: float,
        max_in_flight: Optional[int],
        margin: float,
    ) -> "Client":
        addr, host, port = _env.server_address(server)
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, host, port), connect_timeout
            )
        except asyncio.TimeoutError:
            raise ConnectError(addr, f"no answer within {connect_timeout} s") from None
        except OSError as e:
            raise ConnectError(addr, str(e)) from e
        _keepalive(transport)
        client = cls(addr, transport, _env.access_token(token), margin)  # type: ignore[arg-type]
        protocol.client = client
        for data in protocol.early:
            client._on_data(data)
        if protocol.gone:
            client._fail(protocol.gone)
        try:
            try:
                # The connect timeout covers the first answer too: a server
                # that accepts but never answers (paused, overloaded) is as
                # unreachable as one that does not accept.
                resp = await asyncio.wait_for(client._call(pb.Hello, None, counted=False), connect_timeout)
                client.limits = Limits.from_proto(resp.limits)
            except asyncio.TimeoutError:
                await client.close()
                raise ConnectError(addr, f"no answer to Hello within {connect_timeout} s") from None
            except ServerError as e:
                if e.status != Status.InvalidType:
                    raise
                # A server older than Hello: assume its defaults.
                client.limits = DEFAULT_LIMITS
        except ConnectionLost as e:
            await client.close()
            if client._turned_away is not None:
                raise client._turned_away from e
            raise
        except BaseException:
            await client.close()
            raise
        client._slots = asyncio.Semaphore(max_in_flight or client.limits.max_pipeline)
        client._pinger = loop.create_task(client._ping_loop())
        return client

    # -- public calls -------------------------------------------------------

    def lock(
        self,
        keys: Keys,
        *,
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        renew: bool = True,
    ) -> "_AwaitableContext[Lock]":
        """Takes all `keys` at once (one key or an iterable of keys).

        `wait`: seconds to wait for busy keys; None waits without limit, 0
        fails at once (try-lock). `lease`: seconds; None holds the keys until
        unlocked or until the connection ends, a number takes a lease that
        outlives the connection and, with `renew`, is renewed in the
        background. Use as `lock = await client.lock(...)` or
        `async with client.lock(...) as lock:` (unlocked on leaving).

        Raises `Timeout` (with the busy keys) when the wait runs out,
        `ServerError` for invalid keys or a server limit, `ConnectionLost`.
        Cancel-safe: a grant that arrives after the call was cancelled is
        released at once.
        """

        async def unlock(lock: Lock, failed: bool) -> None:
            await lock._leave(failed)

        return _AwaitableContext(lambda: self._acquire(keys, wait, lease, renew), unlock)

    async def try_lock(self, keys: Keys, *, lease: Optional[float] = None, renew: bool = True) -> Optional[Lock]:
        """Takes `keys` if all are free now; None if any is busy."""
        try:
            return await self._acquire(keys, 0, lease, renew)
        except Timeout:
            return None

    async def unlock(self, keys: Keys, fence: int) -> None:
        """Releases `keys` held under `fence`, whichever connection took them.

        How a restarted process releases a lease it took earlier. Raises
        `NotHeld` with the keys not held under `fence`.
        """
        await self._call(pb.Unlock, pb.RequestLock(keys=_keys(keys), fence=fence))

    async def renew(self, keys: Keys, fence: int, lease: float) -> None:
        """Sets the lease of `keys` held under `fence` to now + `lease` seconds.

        Raises `NotHeld` with the keys not held under `fence`.
        """
        await self._call(pb.Renew, pb.RequestLock(keys=_keys(keys), fence=fence, release_micro=_micros(lease)))

    async def inspect(self, keys: Keys) -> List[KeyInfo]:
        """Holder, lease and waiters of each of `keys`, in order. Changes nothing."""
        keys = _keys(keys)
        if not keys:
            raise ValueError("inspect needs at least one key; stats() describes the server")
        resp = await self._call(pb.Inspect, pb.RequestLock(keys=keys))
        return [KeyInfo.from_proto(k) for k in resp.key_info]

    async def stats(self) -> ServerStats:
        """Server-wide counts of connections, held keys and waiting requests."""
        s = (await self._call(pb.Inspect, pb.RequestLock())).server_stats
        return ServerStats(s.connections, s.held_keys, s.waiting_requests)

    async def ping(self) -> float:
        """Round trip to the server, in seconds."""
        start = self._loop.time()
        await self._call(pb.Ping, None)
        return self._loop.time() - start

    async def close(self) -> None:
        """Ends the connection. The server releases the locks held without a
        lease; leases stop being renewed and are reported lost at once (they
        stay on the server until they run out or are unlocked by fence)."""
        self._fail("closed by the client", closing=True)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- locks ------------------------------------------------------------

    async def _acquire(self, keys: Keys, wait: Optional[float], lease: Optional[float], renew: bool) -> Lock:
        keys = _keys(keys)
        body = pb.RequestLock(keys=keys)
        if wait is not None:
            if wait < 0:
                raise ValueError(f"wait {wait} must not be negative")
            if wait == 0:
                body.try_lock = True
            else:
                body.wait_micro = _micros(wait)
        if lease is not None:
            if lease <= 0:
                raise ValueError(f"lease {lease} must be positive")
            body.release_micro = _micros(lease)
        # Taken before the request is queued: never later than the real send
        # time, so deadlines counted from it are conservative.
        sent = self._loop.time()
        resp = await self._call(pb.Lock, body, lock_keys=keys)
        sent = await self._refresh_after_wait(keys, resp.fence, lease, sent)
        lock = Lock(self, tuple(keys), resp.fence, lease, sent, renew)
        for key in keys:
            older = self._holding.get(key)
            self._holding[key] = lock
            if older is not None:
                older._set_lost(
                    f"key {key!r} was granted again to this connection (fence {lock.fence}); "
                    "locks belong to connections, so tasks that must exclude each other need "
                    "clients of their own"
                )
        if lease is None:
            self._hold_bound(lock)
        else:
            self._leases.add(lock)
        return lock

    async def _refresh_after_wait(self, keys: List[str], fence: int, lease: Optional[float], sent: float) -> float:
        """One more round trip after a Lock that waited; returns the send time to count from.

        The safety deadline counts from the send time of the Lock, which
        after a long wait may be about to pass (or past) when the grant
        arrives, although the server started the lease only at the grant.
        The answer alone cannot prove when that was, so a lease is renewed
        and a lock without one pinged, which moves the deadline to now.
        """
        now = self._loop.time()
        if lease is not None:
            if now - sent <= lease / 3:
                return sent
        elif now - self._fresh <= self.limits.session_timeout / 4:
            return sent
        try:
            if lease is not None:
                await self._call(pb.Renew, pb.RequestLock(keys=keys, fence=fence, release_micro=_micros(lease)))
                return now
            await self._call(pb.Ping, None)
            return sent
        except NotHeld:
            raise LockLost(f"the lease of {lease:.3g} s ran out before its grant could be renewed") from None
        except BaseException:
            # Cancelled, or the connection failed, between grant and use:
            # nobody will hold this grant, release it.
            if self.close_reason is None:
                self._send(pb.Unlock, pb.RequestLock(keys=keys, fence=fence), None)
            raise

    def _hold_bound(self, lock: Lock) -> None:
        self._bound.add(lock)
        self._arm_watchdog()

    def _forget(self, lock: Lock) -> None:
        self._bound.discard(lock)
        self._leases.discard(lock)
        for key in lock.keys:
            if self._holding.get(key) is lock:
                del self._holding[key]

    def _arm_watchdog(self) -> None:
        if self._watchdog is None and self._bound and self.close_reason is None:
            self._watchdog = self._loop.call_at(self._bound_deadline(), self._check_fresh)

    def _bound_deadline(self) -> float:
        return self._fresh + self.limits.session_timeout * (1 - self._margin)

    def _stale_reason(self) -> str:
        return (
            f"no answer from the server to any request sent in the last "
            f"{self.limits.session_timeout * (1 - self._margin):.3g} s; "
            f"it may have ended the session (timeout {self.limits.session_timeout:.3g} s)"
        )

    def _check_fresh(self) -> None:
        # Re-armed lazily: answers move _fresh forward without touching the
        # timer, which looks again only when it fires.
        self._watchdog = None
        if self._loop.time() < self._bound_deadline():
            self._arm_watchdog()
            return
        reason = self._stale_reason()
        bound, self._bound = self._bound, set()
        for lock in bound:
            lock._set_lost(reason)

    # -- requests ---------------------------------------------------------

    async def _call(
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
            self._send(rtype, body, future, counted, lock_keys)
        except BaseException:
            if counted:
                assert self._slots is not None
                self._slots.release()
            raise
        resp = await future
        if resp.status != Status.Ok:
            raise from_response(resp)
        return resp

    def _send(
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
            self._fail(str(e))
            return
        for body in bodies:
            resp = pb.Response()
            try:
                resp.ParseFromString(body)
            except DecodeError as e:
                self._fail(f"undecodable response: {e}")
                return
            if not self._pending or self._pending[0].id != resp.request_id:
                # An answer to nothing: the server turned the connection away
                # (request_id 0: too many connections, frame too large) or
                # broke ordering.
                head = from_response(resp) if resp.request_id == 0 and resp.status != Status.Ok else None
                text = resp.error_text or f"unexpected answer to request {resp.request_id}"
                self._fail(f"server: {text}", head=head)
                return
            p = self._pending.popleft()
            if p.counted and self._slots is not None:
                self._slots.release()
            self._fresh = p.sent
            if p.rtype == pb.Ping and p.future is None:
                self._pings_out -= 1
            fut = p.future
            if fut is None:
                continue
            if fut.cancelled():
                if p.lock_keys is not None and resp.status == Status.Ok:
                    # The caller stopped waiting: release what it was granted.
                    self._send(pb.Unlock, pb.RequestLock(keys=p.lock_keys, fence=resp.fence), None)
                continue
            fut.set_result(resp)

    def _fail(self, reason: str, *, head: Optional[DlockError] = None, closing: bool = False) -> None:
        """Ends the connection once; fails what is pending and reports locks lost."""
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
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._pinger is not None:
            self._pinger.cancel()
        self.closed.set()
        bound, self._bound = self._bound, set()
        for lock in bound:
            lock._set_lost(f"connection lost: {reason}")
        if closing:
            leases, self._leases = self._leases, set()
            for lock in leases:
                lock._set_lost("client closed: the lease is no longer renewed")
        # Without closing, leases keep their own deadline: they outlive the
        # connection and are reported lost when they could have run out.

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
                self._send(pb.Ping, None, None)
            else:
                self._last_send = now


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
