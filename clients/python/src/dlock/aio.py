"""The asyncio client: one TCP connection shared by any number of tasks.

Requests are pipelined on one `Connection` (connection.py: framing, answers
matched in order, Hello on connect, pings at a quarter of the session
timeout). This module owns the calls and the locks: which are held, by
which connection, and when each must be reported lost.

Each lock has an owner of its own: tasks (threads, goroutines) sharing one
client that lock the same key take turns, first come first served, exactly
as separate processes do; unrelated locks share the client's one pipelined
connection, and a lock whose key another lock of this client holds, or that
must wait, is taken on a connection of its own.

How: the server counts a connection (on a cluster, its session) as one
owner, and grants a key that this owner holds again at once, under a new
fence. So the client *claims* a key on its shared connection from the
moment a Lock or Enqueue naming it is queued there until the connection's
owner no longer holds or waits for it (its Unlock queued: the server
processes requests of one connection in order; its try refused; a cancelled
call's late grant released; the connection ended). A Lock is first sent as
a try-lock on the shared connection, pipelined with every other call; one
with a claimed key, or whose try found a key busy while the caller wants to
wait, is sent on a connection (on a cluster, a session) of its own, where it
waits in line holding back no other call. That connection holds the Lock:
its answers count for the Lock's safety deadline, a Lock without a lease is
lost when it ends, and the Lock's unlock keeps it idle for the next such
Lock (up to `_IDLE_OWNERS`) or closes it. Given up while its Lock waits
(cancelled), it is half-closed: the server withdraws the request, and a
grant that crossed is released by fence on the shared connection. Shared
locks, semaphores and Enqueues follow the same rule, so a second reader of
a key is a second holder, and a writer waits for this client's readers
instead of failing with ModeConflict.

Against a single server, when the connection ends every pending call fails
with `ConnectionLost`, later calls fail at once, and `Client.closed` is set.
There is no reconnect: the server has released every lock held without a
lease on it. A lock held or waited for on a connection of its own is another
owner, as in every dlock client: it lives on with that connection until it
is unlocked (which closes it) or the client is closed.

Clusters: given a cluster's nodes (a list, or DLOCK_SERVER as a
comma-separated list), the client connects to the leader and opens a
session, which owns its locks and outlives a broken connection for its TTL.
When the leader dies, stops leading, cannot commit, or goes silent, the
client resumes the session on the new leader and sends again what was not
answered (connection.py), so calls just take longer and locks stay held
(`on_event` and the "dlock" logger tell of it). Only when the session ends
(no node resumed it within its TTL, or the cluster says it ended) does the
client end as above, with every lock without a lease lost. A program that
closes the client ends its session at once.

Client-side safety (the rule of docs/PROTOCOL.md): a lock is reported lost
(`Lock.lost` is set) as soon as this client can no longer be sure the server
still holds it for us, which is before the server could give it away:

- held without a lease: when the connection ends, or when no answer has
  arrived to a request sent within the last `session_timeout × (1 − margin)`
  (the server may end a connection that it heard nothing from for the
  session timeout, and an answer to a request proves the server had not when
  it read that request). On a cluster node only answers from commands that
  kept the session alive count (`Ok` to a Ping, Lock, Unlock, Renew; see
  `rules.moves_deadline`): a deposed leader's `NotLeader` proves nothing;
- a lease: when `lease × (1 − margin)` has passed since the last Lock or
  Renew that was answered was sent, or when Renew is answered NotHeld.
  Leases are renewed in the background every third of the lease; a lease
  outlives the connection, so losing the connection only stops renewal;
- a Renew sent and not answered (an error, a cancelled call) may still have
  been applied: until an answer to it or a later one comes, the lock is also
  lost when the lease it asked for could have run out, a lock without a
  lease too (its first Renew makes it a lease).

The deadlines and the margin are those of `dlock.rules` (src/rules.rs): the
window less 0.1 % for clock rates, and `margin` (the part of the window
kept in reserve, that 0.1 % included) at most 0.1 % plus a quarter of the
window, which leaves three quarters for renewing.

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
import ssl
from typing import Any, Awaitable, Callable, Generator, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _env, rules
from ._args import Keys, Shared, Value, keys_of, lock_body, micros, value_bytes
from ._proto import dlock_pb2 as pb
from .connection import Connection
from .dial import Dial
from .election import Election, Leader, Leadership
from .enqueue import Queued
from .errors import ConnectionLost, DlockError, LockLost, NotHeld, ProtocolError, Status, Timeout
from .lock import Lock
from .types import Event, KeyInfo, Limits, ServerStats

__all__ = ["Client", "Election", "Keys", "Leader", "Leadership", "Lock", "Queued", "Shared", "Value", "connect"]

#: Idle Watch connections kept for the next Watch.
_IDLE_WATCHERS = 2
#: Idle owners of their own (connections for locks that wait) kept for the
#: next such lock.
_IDLE_OWNERS = 4
#: How long a connection given up while its Lock waited is still read for a
#: grant that crossed the withdrawal (`Connection.drain`).
_DRAIN_LIMIT = 10.0


class _Flag:
    """Set once: whether a request was queued for sending."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def set(self) -> None:
        self.done = True


T = TypeVar("T")

#: The least `margin`: a server clock may run 0.1 % faster than the client's.
_MIN_MARGIN = rules.CLOCK_RATE_BOUND


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
    server: _env.Servers = None,
    *,
    token: Optional[str] = None,
    connect_timeout: float = 5.0,
    max_in_flight: Optional[int] = None,
    margin: float = 0.1,
    tls_ca: Optional[str] = None,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    ssl_context: Optional[ssl.SSLContext] = None,
    session_ttl: Optional[float] = None,
    on_event: Optional[Callable[[Event], None]] = None,
) -> "_AwaitableContext[Client]":
    """Connects to `server`: `HOST:PORT`, or a cluster's nodes as a list or a
    comma-separated string (default: DLOCK_SERVER, else 127.0.0.1:7436).

    Given a cluster, the client finds the leader (following the `NotLeader`
    answers of the others), opens a session there with a TTL of
    `session_ttl` seconds (default: the cluster's), and rides through leader
    changes: see "Clusters" in the module doc. `on_event` is called with a
    `dlock.Reconnecting` or `dlock.Resumed` when the session moves (the
    same is logged on the "dlock" logger).

    `token` defaults to DLOCK_TOKEN. `margin` is the fraction of the session
    timeout or lease kept in reserve before a lock is reported lost (taken
    as at least 0.001, the allowance for a server clock running 0.1 % fast,
    and at most 0.001 plus a quarter of the window: `dlock.rules`).
    `connect_timeout` bounds the whole connect; given several servers, each
    gets a share of it (at least half a second), so one that accepts but
    never answers cannot use it up.
    TLS: `tls_ca` (default DLOCK_TLS_CA), a PEM file of the CA that signed
    the server's certificate, turns it on; the certificate must name the
    address's host. `tls_cert` and `tls_key` (DLOCK_TLS_CERT, DLOCK_TLS_KEY)
    are this client's certificate for a server that requires one. Or pass a
    ready `ssl_context`. Without any, plain TCP.
    Use as `client = await connect()` or `async with connect() as client:`.

    Raises `ConnectError` if no server answers in time (given several, it
    names each address and why it failed), `AccessDenied` if the server
    refuses the token, `NotOneCluster` if one of several addresses is a
    single server's, `ValueError` for a malformed address.
    """

    async def close(client: Client, failed: bool) -> None:
        await client.close()

    addrs = _env.server_addresses(server)
    tls = _env.tls_context(tls_ca, tls_cert, tls_key, ssl_context)
    if session_ttl is not None and session_ttl < 1:
        # A cluster refuses sessions shorter than a second (InvalidArgument).
        raise ValueError(f"session_ttl {session_ttl} must be at least 1 second")
    dial = Dial(addrs, _env.access_token(token), connect_timeout, tls, session_ttl, on_event)
    return _AwaitableContext(lambda: Client._connect(dial, max_in_flight, margin), close)


class Client:
    """A connection to a dlock server or cluster; make one with `connect()`.

    Every method may be called from any number of tasks of the event loop
    that connected it; their requests share the connection, except Locks
    that must wait or whose key another Lock of this client holds, which
    are taken on connections of their own (see the module doc).
    """

    def __init__(
        self,
        conn: Connection,
        margin: float,
        max_in_flight: Optional[int] = None,
        parent: "Optional[Client]" = None,
    ) -> None:
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._margin = margin
        self._max_in_flight = max_in_flight
        # Set on an owner of its own (see `_owner`): the client it serves.
        self._parent = parent
        self._bound: "set[Lock]" = set()  # held without a lease
        self._leases: "set[Lock]" = set()
        # The claims on the shared connection, per key: Locks and Enqueues
        # naming the key from when they are queued for sending until the
        # connection's owner no longer holds or waits for it. The server
        # grants a key that an owner holds again at once, so a Lock on a
        # claimed key is taken on a connection of its own.
        self._claims: "dict[str, int]" = {}
        # Owners of their own (clients on connections of their own, for
        # locks that wait or whose key is claimed): every one open, and
        # those idle for the next such lock.
        self._owners: "set[Client]" = set()
        self._idle: "List[Client]" = []
        # Unlocks by fence of late grants on connections opened for them
        # (`_release_late`), kept so that they are not collected mid-way and
        # so that close() waits for them.
        self._releasing: "set[asyncio.Task[None]]" = set()
        # close() was called: no connection is opened after it but for a
        # late grant's release, which close() waits for.
        self._closing = False
        self._watchdog: Optional[asyncio.TimerHandle] = None
        # Connections of Watches (a parked Watch holds back the answers
        # behind it): every one open, and those idle for the next Watch.
        self._side: "set[Connection]" = set()
        self._watchers: List[Connection] = []
        conn.on_end = self._on_end

    @classmethod
    async def _connect(cls, dial: Dial, max_in_flight: Optional[int], margin: float) -> "Client":
        if not 0 <= margin < 1:
            raise ValueError(f"margin {margin} must be at least 0 and below 1")
        # Never less than the clock-rate allowance: the server's clock may
        # run up to 0.1 % faster than this one.
        margin = max(margin, _MIN_MARGIN)
        conn = await Connection.open(dial, max_in_flight)
        return cls(conn, margin, max_in_flight)

    @property
    def addr(self) -> str:
        """The address of the node connected to now (on a cluster, the leader's)."""
        return self._conn.addr

    @property
    def session(self) -> Optional[int]:
        """The cluster session this client acts for; None on a single server."""
        return self._conn.session or None

    @property
    def limits(self) -> Limits:
        """The server's limits, from its answer to Hello; on a cluster,
        `session_timeout` is the session's TTL."""
        return self._conn.limits

    @property
    def closed(self) -> asyncio.Event:
        """Set when the connection has ended; `close_reason` says why."""
        return self._conn.closed

    @property
    def close_reason(self) -> Optional[str]:
        return self._conn.close_reason

    # -- public calls -------------------------------------------------------

    def lock(
        self,
        keys: Keys,
        *,
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: Shared = False,
        limit: int = 0,
        value: Value = None,
    ) -> "_AwaitableContext[Lock]":
        """Takes all `keys` at once (one key or an iterable of keys).

        `wait`: seconds to wait for busy keys; None waits without limit, 0
        fails at once (try-lock). `lease`: seconds; None holds the keys until
        unlocked or until the connection ends, a number takes a lease that
        outlives the connection and, with `renew`, is renewed in the
        background. `shared`: True takes every key shared (a reader lock: any
        number of shared holders, or one exclusive holder), or name the keys
        to take shared (the others exclusively). `limit`: with `shared`, at
        most this many holders of each shared key at once (a semaphore);
        everyone sharing a key must name the same limit. `value` (bytes, or
        a str sent as UTF-8; at most 1024 bytes): what Inspect and Watch
        show for this hold, an election's leader identity. Use as
        `lock = await client.lock(...)` or `async with client.lock(...) as
        lock:` (unlocked on leaving).

        Each Lock is an owner of its own: a key that another Lock of this
        client holds is busy for it, and it waits in line (FIFO) as another
        process's Lock would. So a task that locks a key it already holds
        waits for itself: without a `wait` limit, forever. Free keys are
        taken on the client's connection, pipelined with every other call;
        a Lock that must wait waits on a connection of its own (see the
        module doc).

        Raises `Timeout` (with the busy keys) when the wait runs out,
        `ServerError` for invalid keys or a server limit (`LimitMismatch`
        when the key's holders agreed on another limit), `ConnectionLost`,
        and what `connect` raises when a connection of its own cannot be
        opened. Cancel-safe: a request cancelled while it waits is
        withdrawn, and a grant that arrives after the call was cancelled is
        released at once.
        """

        async def unlock(lock: Lock, failed: bool) -> None:
            await lock._leave(failed)

        return _AwaitableContext(lambda: self._acquire(keys, wait, lease, renew, shared, limit, value), unlock)

    async def try_lock(
        self,
        keys: Keys,
        *,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: Shared = False,
        limit: int = 0,
    ) -> Optional[Lock]:
        """Takes `keys` if all are free now; None if any is busy (held by
        anyone else, another Lock of this client included). `shared` and
        `limit` as for `lock`."""
        try:
            return await self._acquire(keys, 0, lease, renew, shared, limit)
        except Timeout:
            return None

    async def unlock(self, keys: Keys, fence: int) -> None:
        """Releases `keys` held under `fence`, whichever connection took them.

        How a restarted process releases a lease it took earlier. Raises
        `NotHeld` with the keys not held under `fence`.
        """
        await self._call(pb.Unlock, pb.RequestLock(keys=keys_of(keys), fence=fence))

    async def renew(self, keys: Keys, fence: int, lease: float) -> None:
        """Sets the lease of `keys` held under `fence` to now + `lease` seconds.

        Raises `NotHeld` with the keys not held under `fence`.
        """
        await self._call(pb.Renew, pb.RequestLock(keys=keys_of(keys), fence=fence, release_micro=micros(lease)))

    async def enqueue(
        self,
        keys: Keys,
        *,
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: Shared = False,
        limit: int = 0,
        value: Value = None,
    ) -> Union[Lock, Queued]:
        """A Lock in two steps: answered at once with the `Lock` when the keys
        are free, else with a `Queued` place in line whose `wait()` collects
        the grant. The arguments are `lock`'s; the wait limit counts from
        now. The request keeps its FIFO place meanwhile (on a cluster, across
        a leader change too).

        Like a Lock, an Enqueue is its own owner: on a key that another lock
        (or Enqueue) of this client holds or asks for it goes to a
        connection of its own, and the `Queued` and the `Lock` belong to
        that. Otherwise it runs on this client's connection, and a `Queued`
        belongs to it until its `wait()` is answered: answers come in
        request order, so a `wait()` holds back the answers to calls made
        after it; while that matters, enqueue on a client of its own.
        Raises as `lock` does, `Timeout` at once when `wait` is 0 and a key
        is busy.
        """
        keys = keys_of(keys)
        body = lock_body(keys, wait, lease, shared, limit, value)
        if self._claimed(keys):
            return await self._enqueue_aside(keys, body, lease, renew)
        sent = self._loop.time()
        queued = self._claim(keys)

        def abandoned(resp: "pb.Response") -> None:
            # Still in line (Queued): the owner will hold the key, claimed
            # until the client ends.
            if resp.status != Status.Queued:
                self._unclaim(keys)

        try:
            resp = await self._conn.call(pb.Enqueue, body, lock_keys=keys, on_queued=queued.set, on_abandoned=abandoned)
        except asyncio.CancelledError:
            if not queued.done:
                self._unclaim(keys)
            raise
        except BaseException:
            self._unclaim(keys)
            raise
        if resp.status == Status.Queued:
            # The claim passes to the Queued, and on to its outcome.
            return Queued(self, tuple(keys), resp.ticket, resp.place, lease, renew, sent, claimed=True)
        return await self._granted(keys, resp.fence, lease, renew, sent, claimed=True)

    async def proclaim(self, keys: Keys, fence: int, value: Value) -> None:
        """Replaces the value of `keys` held under `fence`, whichever
        connection took them (an election's leader announcing a new
        identity). Raises `NotHeld` with the keys not so held."""
        await self._call(pb.Proclaim, pb.RequestLock(keys=keys_of(keys), fence=fence, value=value_bytes(value)))

    async def watch(
        self,
        key: str,
        known: Optional[Tuple[int, Value]] = None,
        limit: Optional[float] = None,
    ) -> KeyInfo:
        """Waits until the first holder of `key` (the one with the lowest
        fencing token, `KeyInfo.first()`) is not `known` (its fence and
        value; None: the key is free), or until `limit` seconds pass
        (default: 30, or half the session timeout if shorter), and returns
        the key as it is then: no polling, the server answers as soon as
        the change is applied (on a cluster, committed). Compare
        `info.first()` with `known` to tell a change from the limit.

        Runs on a connection of its own (kept for the next Watch), so it
        holds back no other call; cancelled, that connection is closed and
        the server forgets the Watch. Against a cluster a parked Watch is
        the leader's alone: after a failover it is sent again to the new
        leader. Raises `ServerError` (`WatchLimit`) when the server has its
        most Watches parked, connection errors.
        """
        if limit is None:
            limit = max(0.1, min(30.0, self.limits.session_timeout / 2))
        fence, value = known if known is not None else (0, b"")
        body = pb.RequestLock(keys=[key], fence=fence, value=value_bytes(value), wait_micro=micros(limit))
        conn = self._watchers.pop() if self._watchers else None
        if conn is None:
            if self._conn.close_reason is not None:
                raise ConnectionLost(self._conn.close_reason)
            conn = await Connection.open(self._conn._dial, 1, quiet=True)
            self._side.add(conn)
        try:
            resp = await conn.call(pb.Watch, body, counted=False)
        except BaseException:
            # Cancelled or failed: a clean close withdraws the parked Watch
            # (and ends the connection's session, which holds nothing).
            self._side.discard(conn)
            conn.end("watch abandoned", closing=True)
            raise
        if self._conn.close_reason is None and conn.close_reason is None and len(self._watchers) < _IDLE_WATCHERS:
            self._watchers.append(conn)
        else:
            self._side.discard(conn)
            conn.end("not needed", closing=True)
        if not resp.key_info:
            raise ProtocolError("Watch answered without key_info")
        return KeyInfo.from_proto(resp.key_info[0])

    async def inspect(self, keys: Keys) -> List[KeyInfo]:
        """Holder, lease and waiters of each of `keys`, in order. Changes nothing."""
        keys = keys_of(keys)
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
        """Ends the connection, and every connection the client opened for
        its locks and Watches. The server releases the locks held without a
        lease; leases stop being renewed and are reported lost at once (they
        stay on the server until they run out or are unlocked by fence).

        A Lock, Enqueue or Queued.wait() that waits (it fails with
        ConnectionLost), or was cancelled, while its grant may still be on
        its way is the exception, on the client's connection as on a Lock's
        own: its connection is half-closed, and close() returns only once that
        connection has ended and a grant that arrived on it, a lease too, was
        released by fence (on a connection opened for it), or once the drain
        limit (10 s) has passed."""
        self._closing = True
        why = "closed by the client"
        owners = list(self._owners)
        if self._conn.waiting:
            # An Enqueue or Wait (or a try-Lock) on this connection may be
            # granted as the server reads the close: drained as an owner's
            # is, and what its end does (`_on_end`) is done now.
            self._conn.drain(self._release_late, _DRAIN_LIMIT, fail=why)
            self._on_end(why, True)
        else:
            self._conn.end(why, closing=True)
        # Owners that outlived the client's connection (see `_on_end`).
        self._close_owners(why)
        # Each ends by itself once the server has closed its side (it
        # withdrew the request) or its drain limit passed, and hands a grant
        # that crossed the cancel or the close to `_release_late`.
        draining = [c for c in [self._conn] + [o._conn for o in owners] if c._late is not None]
        for conn in draining:
            await conn.closed.wait()
        while self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    def _close_owners(self, why: str) -> None:
        """Ends every owner's connection but those draining a late grant
        (`Connection.drain`): each ends by itself, within the drain limit.
        One whose Lock still waits may be granted as the server reads the
        close: it is drained as if cancelled, so that grant is read and
        released, and the Lock fails with ConnectionLost(why)."""
        for owner in list(self._owners):
            if owner._conn.waiting:
                owner._conn.drain(self._release_late, _DRAIN_LIMIT, fail=why)
            elif owner._conn._late is None:
                owner._conn.end(why, closing=True)
        self._owners.clear()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- locks ------------------------------------------------------------

    async def _acquire(
        self,
        keys: Keys,
        wait: Optional[float],
        lease: Optional[float],
        renew: bool,
        shared: Shared = False,
        limit: int = 0,
        value: Value = None,
    ) -> Lock:
        keys = keys_of(keys)
        # Taken before the request is queued: never later than the real send
        # time, so deadlines counted from it are conservative.
        sent = self._loop.time()
        if wait is not None and wait < 0:
            raise ValueError(f"wait {wait} must not be negative")
        if self._claimed(keys):
            # Another lock of this client holds or asks for a key: the
            # shared connection's owner would be granted it again at once.
            return await self._lock_aside(keys, wait, sent, lease, renew, shared, limit, value)
        # First without waiting, pipelined on the shared connection.
        body = lock_body(keys, 0, lease, shared, limit, value)
        queued = self._claim(keys)
        try:
            resp = await self._conn.call(
                pb.Lock, body, lock_keys=keys, on_queued=queued.set, on_abandoned=lambda resp: self._unclaim(keys)
            )
        except asyncio.CancelledError:
            # Once queued, the answer ends the claim (on_abandoned).
            if not queued.done:
                self._unclaim(keys)
            raise
        except Timeout:
            self._unclaim(keys)
            if wait == 0 or (wait is not None and self._loop.time() >= sent + wait):
                raise
            busy = True
        except BaseException:
            self._unclaim(keys)
            raise
        else:
            busy = False
        if busy:
            # Wait in line on a connection of its own, so the wait holds
            # back no other call.
            return await self._lock_aside(keys, wait, sent, lease, renew, shared, limit, value)
        return await self._granted(keys, resp.fence, lease, renew, sent, claimed=True)

    async def _lock_aside(
        self,
        keys: List[str],
        wait: Optional[float],
        since: float,
        lease: Optional[float],
        renew: bool,
        shared: Shared,
        limit: int,
        value: Value,
    ) -> Lock:
        """Takes `keys` on a connection of its own, waiting for them up to
        `wait` seconds from `since` (None: without limit, 0: not at all)."""
        body = lock_body(keys, wait, lease, shared, limit, value)
        owner = await self._owner()
        if wait:
            # What is left of it, at least a microsecond (0 is a try-lock).
            body.wait_micro = micros(max(since + wait - self._loop.time(), 1e-6))
        sent = self._loop.time()
        resp = await self._call_aside(owner, pb.Lock, body, keys)
        try:
            return await owner._granted(keys, resp.fence, lease, renew, sent)
        except BaseException:
            # Released (its Unlock queued) or not held: the owner holds nothing.
            self._done_with(owner)
            raise

    async def _enqueue_aside(self, keys: List[str], body: "pb.RequestLock", lease: Optional[float], renew: bool) -> Union[Lock, Queued]:
        owner = await self._owner()
        sent = self._loop.time()
        resp = await self._call_aside(owner, pb.Enqueue, body, keys)
        if resp.status == Status.Queued:
            return Queued(owner, tuple(keys), resp.ticket, resp.place, lease, renew, sent)
        try:
            return await owner._granted(keys, resp.fence, lease, renew, sent)
        except BaseException:
            self._done_with(owner)
            raise

    async def _collect(self, queued: Queued) -> Lock:
        """The grant of a `Queued` of this client's (a Wait for its ticket)."""
        keys = list(queued.keys)
        body = pb.RequestLock(ticket=queued.ticket)
        if self._parent is not None:
            parent = self._parent
            resp = await parent._call_aside(self, pb.Wait, body, keys)
            try:
                return await self._granted(keys, resp.fence, queued._lease, queued._renew, queued._sent)
            except BaseException:
                parent._done_with(self)
                raise
        # On the shared connection: the claim passes from the Queued to the
        # outcome of its Wait.
        claimed, queued._claimed = queued._claimed, False
        on_wire = _Flag() if claimed else None

        def abandoned(resp: "pb.Response") -> None:
            if claimed:
                self._unclaim(keys)

        try:
            resp = await self._conn.call(
                pb.Wait, body, lock_keys=keys, on_queued=on_wire.set if on_wire else None, on_abandoned=abandoned
            )
        except asyncio.CancelledError:
            if on_wire is not None and not on_wire.done:
                queued._claimed = True  # never sent: still in line
            raise
        except BaseException:
            # The ticket's outcome (its wait limit, unknown) or the end of
            # the connection: the owner no longer waits.
            if claimed:
                self._unclaim(keys)
            raise
        return await self._granted(keys, resp.fence, queued._lease, queued._renew, queued._sent, claimed=claimed)

    async def _granted(
        self,
        keys: List[str],
        fence: int,
        lease: Optional[float],
        renew: bool,
        sent: float,
        *,
        claimed: bool = False,
    ) -> Lock:
        """The `Lock` for a grant of `keys` under `fence` to a request sent at
        `sent`; `claimed`: the keys are claimed on the shared connection, a
        claim the Lock takes over."""
        try:
            sent = await self._refresh_after_wait(keys, fence, lease, sent)
        except BaseException:
            if claimed:
                # Released (its Unlock queued), or not held any more.
                self._unclaim(keys)
            raise
        lock = Lock(self, tuple(keys), fence, lease, sent, renew)
        lock._claimed = claimed
        if lease is None:
            self._hold_bound(lock)
        else:
            self._leases.add(lock)
        return lock

    async def _unlock(self, lock: Lock) -> None:
        """Sends `lock`'s Unlock on its connection (see `Lock.unlock`)."""
        body = pb.RequestLock(keys=lock.keys, fence=lock.fence)
        parent = self._parent
        try:
            if parent is None:
                # The claim ends as soon as the Unlock is queued: the server
                # processes it before any request queued after it.
                await self._conn.call(pb.Unlock, body, on_queued=lambda: self._release_claim(lock))
                return
            try:
                await self._conn.call(pb.Unlock, body)
            except NotHeld:
                parent._done_with(self)
                raise
            except BaseException:
                # Cancelled or failed: whether it still holds the keys is not
                # known, and a clean close releases them.
                self._conn.end("not needed", closing=True)
                raise
            parent._done_with(self)
        except ConnectionLost as lost:
            # A lease outlives the connection (session) that failed the
            # Unlock: sent again by fence elsewhere.
            if not lock._may_be_lease():
                raise
            await (parent or self)._unlock_again(body, lost)

    # -- owners -----------------------------------------------------------

    def _claimed(self, keys: Sequence[str]) -> bool:
        claims = self._claims
        for key in keys:
            if key in claims:
                return True
        return False

    def _claim(self, keys: Sequence[str]) -> "_Flag":
        """Claims `keys` on the shared connection; returns a flag to set once
        the request that claims them is queued."""
        claims = self._claims
        for key in keys:
            claims[key] = claims.get(key, 0) + 1
        return _Flag()

    def _unclaim(self, keys: Sequence[str]) -> None:
        if self._conn.close_reason is not None or self._closing:
            return  # the claims ended with the connection (or close())
        claims = self._claims
        for key in keys:
            n = claims[key] - 1
            if n:
                claims[key] = n
            else:
                del claims[key]

    def _release_claim(self, lock: Lock) -> None:
        if lock._claimed:
            lock._claimed = False
            self._unclaim(lock.keys)

    async def _owner(self) -> "Client":
        """An owner of its own: an idle one, else a new connection (on a
        cluster, a new session) from the same `Dial`."""
        while self._idle:
            owner = self._idle.pop()
            if owner._conn.close_reason is None:
                return owner
        if self._conn.close_reason is not None:
            raise ConnectionLost(self._conn.close_reason)
        # Quiet: its moves on a cluster are the shared connection's, which
        # on_event already tells of.
        conn = await Connection.open(self._conn._dial, self._max_in_flight, quiet=True)
        owner = Client(conn, self._margin, self._max_in_flight, parent=self)
        if self._conn.close_reason is not None:
            conn.end(f"the client's connection ended: {self._conn.close_reason}", closing=True)
            raise ConnectionLost(self._conn.close_reason)
        self._owners.add(owner)
        return owner

    async def _call_aside(self, owner: "Client", rtype: int, body: "pb.RequestLock", keys: List[str]) -> "pb.Response":
        """A Lock, Enqueue or Wait on `owner`'s connection. Cancelled, the
        connection is given up (the server withdraws the request); an error
        answer leaves `owner` holding nothing."""
        try:
            return await owner._conn.call(rtype, body, lock_keys=keys)
        except asyncio.CancelledError:
            owner._conn.drain(self._release_late, _DRAIN_LIMIT)
            raise
        except BaseException:
            self._done_with(owner)
            raise

    def _release_late(self, keys: List[str], fence: int) -> None:
        """Releases, by fence, a grant that reached an owner of its own given
        up meanwhile (a lease outlives it): on the shared connection, or, when
        that has ended (the owner outlives it), on a connection opened for
        the Unlock, so the lease does not keep others out until it runs out."""
        body = pb.RequestLock(keys=keys, fence=fence)
        if self._conn.close_reason is None and self._conn._late is None:
            # (Draining, the shared connection writes nothing more.)
            self._conn.send(pb.Unlock, body, None)
            return
        task = self._loop.create_task(self._release_elsewhere(body))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_elsewhere(self, body: "pb.RequestLock") -> None:
        """One Unlock by fence on a connection of its own, within the drain
        limit; on failure (NotHeld: the lease ended or was released
        meanwhile) the lease runs out on its own."""
        try:
            await self._unlock_on_new(body)
        except (DlockError, OSError, asyncio.TimeoutError):
            pass

    async def _unlock_on_new(self, body: "pb.RequestLock") -> None:
        """One Unlock by fence on a connection (on a cluster, a session)
        opened for it and closed after, each within the drain limit. Raises
        what the connect or the Unlock failed with."""
        conn = await asyncio.wait_for(Connection.open(self._conn._dial, 1, quiet=True), _DRAIN_LIMIT)
        try:
            await asyncio.wait_for(conn.call(pb.Unlock, body), _DRAIN_LIMIT)
        finally:
            conn.end("an unlock by fence sent", closing=True)

    async def _unlock_again(self, body: "pb.RequestLock", lost: ConnectionLost) -> None:
        """The Unlock of a lock that may be a lease failed with `lost`: its
        connection (on a cluster, its session) ended before the answer came,
        perhaps before it was sent (a session that ends while it moves
        between nodes fails what it had queued). A lease outlives the
        session, so the Unlock is sent again by fence on a connection opened
        for it. Returns once that released the keys; raises `NotHeld` if
        they were not so held any more (the lease ran out, or the first
        Unlock was applied though its answer was lost), else `lost` (no
        server reached, or the client was closed)."""
        if self._closing:
            raise lost
        try:
            await self._unlock_on_new(body)
        except NotHeld:
            raise
        except (DlockError, OSError, asyncio.TimeoutError) as e:
            raise lost from e

    def _done_with(self, owner: "Client") -> None:
        """`owner`'s lock is over: keeps it for the next lock that waits, or closes it."""
        if owner._conn.close_reason is not None or owner._conn._late is not None:
            # (Draining, close() gave it up: it ends by itself.)
            return
        if (
            self._conn.close_reason is None
            and len(self._idle) < _IDLE_OWNERS
            and not owner._bound
            and not owner._leases
        ):
            self._idle.append(owner)
        else:
            owner._conn.end("not needed", closing=True)

    def _owner_ended(self, owner: "Client") -> None:
        self._owners.discard(owner)
        if owner in self._idle:
            self._idle.remove(owner)

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
        elif now - self._conn.fresh <= self.limits.session_timeout / 4:
            return sent
        try:
            if lease is not None:
                await self._call(pb.Renew, pb.RequestLock(keys=keys, fence=fence, release_micro=micros(lease)))
                return now
            await self._call(pb.Ping, None)
            return sent
        except NotHeld:
            raise LockLost(f"the lease of {lease:.3g} s ran out before its grant could be renewed") from None
        except BaseException:
            # Cancelled, or the connection failed, between grant and use:
            # nobody will hold this grant, release it.
            if self._conn.close_reason is None:
                self._conn.send(pb.Unlock, pb.RequestLock(keys=keys, fence=fence), None)
            raise

    def _hold_bound(self, lock: Lock) -> None:
        self._bound.add(lock)
        self._arm_watchdog()

    def _forget(self, lock: Lock) -> None:
        self._bound.discard(lock)
        self._leases.discard(lock)

    def _arm_watchdog(self) -> None:
        if self._watchdog is None and self._bound and self._conn.close_reason is None:
            self._watchdog = self._loop.call_at(self._bound_deadline(), self._check_fresh)

    def _margin_ns(self, window: int) -> int:
        """The safety margin in force for `window` (nanoseconds, as
        `rules.margin`): `margin` is the fraction of the window kept in
        reserve, the clock-rate allowance (`rules.deadline`) included, so
        the configured margin is the rest of it, at most a quarter of the
        window."""
        configured = round((self._margin - rules.CLOCK_RATE_BOUND) * window)
        return rules.margin(max(configured, 0), window)

    def _bound_deadline(self) -> float:
        """When the locks held without a lease fall into jeopardy: the
        owner's safety deadline, from the latest answer that proved it
        alive, less the margin."""
        timeout = rules.to_ns(self.limits.session_timeout)
        deadline = rules.deadline(rules.to_ns(self._conn.fresh), timeout)
        return rules.to_seconds(deadline - self._margin_ns(timeout))

    def _stale_reason(self) -> str:
        return (
            f"no answer from the server to any request sent in the last "
            f"{self._bound_deadline() - self._conn.fresh:.3g} s; "
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

    def _call(
        self,
        rtype: int,
        body: Optional["pb.RequestLock"],
        *,
        counted: bool = True,
        lock_keys: Optional[List[str]] = None,
    ) -> "Awaitable[pb.Response]":
        """Sends one request, waits for its answer; error statuses raise."""
        return self._conn.call(rtype, body, counted=counted, lock_keys=lock_keys)

    def _on_end(self, reason: str, closing: bool) -> None:
        """The connection ended: locks without a lease held on it are gone
        with it, and so are its Watches' connections; closed by the client,
        every connection it opened."""
        if self._parent is not None:
            self._parent._owner_ended(self)
        why = reason if closing else f"the client's connection ended: {reason}"
        for conn in list(self._side):
            conn.end(why, closing=True)
        self._side.clear()
        self._watchers.clear()
        # Closed cleanly, they release what they hold without a lease. An
        # owner that holds or waits for a lock is another owner, as in the
        # other clients: it lives on and ends by itself (its unlock closes
        # it), unless the client is closed. Idle ones are of no more use.
        idle, self._idle = self._idle, []
        for owner in idle:
            owner._conn.end(why, closing=True)
        if closing:
            self._close_owners(why)
        self._claims.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        bound, self._bound = self._bound, set()
        for lock in bound:
            lock._set_lost(f"connection lost: {reason}")
        if closing:
            leases, self._leases = self._leases, set()
            for lock in leases:
                lock._set_lost("client closed: the lease is no longer renewed")
        # Otherwise leases keep their own deadline: they outlive the
        # connection and are reported lost when they could have run out.
