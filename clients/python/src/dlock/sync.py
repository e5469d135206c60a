"""The blocking client, for scripts: the asyncio client run on a thread of its own.

Each `Client` starts one daemon thread with an event loop that owns the
connection. Calls block the calling thread until their answer; meanwhile
the loop thread sends pings, renews leases and watches the safety deadlines
exactly as `dlock.aio` does, so a script that computes for minutes inside
`with client.lock(...)` keeps its lock. Any number of threads may share one
client; their requests are pipelined on its connection.

Each lock has an owner of its own: tasks (threads, goroutines) sharing one
client that lock the same key take turns, first come first served, exactly
as separate processes do; unrelated locks share the client's one pipelined
connection, and a lock whose key another lock of this client holds, or that
must wait, is taken on a connection of its own. (Each thread's call runs as
a task of the loop thread, so threads get the rule of `dlock.aio`.)

A paused process (SIGSTOP) pauses that thread too: the protected resource
must still check the fencing token (see examples/fencing/).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Iterator, List, Optional, Tuple, TypeVar, Union

from . import _env, aio
from .election import Election as _AioElection
from .election import Leader
from .election import Leadership as _AioLeadership
from .enqueue import Queued as _AioQueued
from .lock import Lock as _AioLock
from .types import Event, KeyInfo, Limits, ServerStats

__all__ = ["Client", "Election", "Leader", "Leadership", "Lock", "Queued"]

T = TypeVar("T")


class Client:
    """A connection to a dlock server or cluster, for blocking code.

    `Client()` connects to DLOCK_SERVER (one address, or a cluster's nodes
    comma-separated; else 127.0.0.1:7436) with the token DLOCK_TOKEN; the
    arguments are those of `dlock.aio.connect` (`server` may be a list).
    `on_event` is called on the client's own thread. Raises `ConnectError`,
    `AccessDenied`, `NotOneCluster` or `ValueError` like it. Use as a context manager, or call
    `close()`.
    """

    def __init__(
        self,
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
    ) -> None:
        connecting = aio.connect(
            server,
            token=token,
            connect_timeout=connect_timeout,
            max_in_flight=max_in_flight,
            margin=margin,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            ssl_context=ssl_context,
            session_ttl=session_ttl,
            on_event=on_event,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dlock-client", daemon=True)
        self._thread.start()
        #: Set when the connection has ended; `close_reason` says why.
        self.closed = threading.Event()
        try:
            self._aio: aio.Client = self._run(self._connect(connecting))
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self, connecting: Awaitable[aio.Client]) -> aio.Client:
        client = await connecting

        async def watch() -> None:
            await client.closed.wait()
            self.closed.set()

        client._loop.create_task(watch())
        return client

    @property
    def addr(self) -> str:
        """The address of the node connected to now (on a cluster, the leader's)."""
        return self._aio.addr

    @property
    def session(self) -> Optional[int]:
        """The cluster session this client acts for; None on a single server."""
        return self._aio.session

    @property
    def limits(self) -> Limits:
        return self._aio.limits

    @property
    def close_reason(self) -> Optional[str]:
        return self._aio.close_reason

    def lock(
        self,
        keys: aio.Keys,
        *,
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: aio.Shared = False,
        limit: int = 0,
        value: aio.Value = None,
    ) -> "Lock":
        """Takes all `keys` at once; see `dlock.aio.Client.lock`.

        Blocks until granted; use as `with client.lock("jobs/nightly", wait=30) as lock:`.
        Threads sharing this client take turns on a key like processes; a
        thread that locks a key it holds waits for itself. Ctrl-C while
        waiting withdraws the request.
        """
        lock = self._run(self._aio._acquire(keys, wait, lease, renew, shared, limit, value))
        return Lock(self, lock, threading.Event())

    def enqueue(
        self,
        keys: aio.Keys,
        *,
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: aio.Shared = False,
        limit: int = 0,
        value: aio.Value = None,
    ) -> "Union[Lock, Queued]":
        """A Lock in two steps: the `Lock` at once if the keys are free, else
        a `Queued` place in line whose `wait()` blocks for the grant; see
        `dlock.aio.Client.enqueue`."""
        got = self._run(
            self._aio.enqueue(keys, wait=wait, lease=lease, renew=renew, shared=shared, limit=limit, value=value)
        )
        if isinstance(got, _AioQueued):
            return Queued(self, got)
        return Lock(self, got, threading.Event())

    def proclaim(self, keys: aio.Keys, fence: int, value: aio.Value) -> None:
        """Replaces the value of `keys` held under `fence`; see `dlock.aio.Client.proclaim`."""
        self._run(self._aio.proclaim(keys, fence, value))

    def watch(self, key: str, known: "Optional[Tuple[int, aio.Value]]" = None, limit: Optional[float] = None) -> KeyInfo:
        """Blocks until the first holder of `key` is not `known`, or `limit`
        seconds pass; see `dlock.aio.Client.watch`."""
        return self._run(self._aio.watch(key, known, limit))

    def try_lock(
        self,
        keys: aio.Keys,
        *,
        lease: Optional[float] = None,
        renew: bool = True,
        shared: aio.Shared = False,
        limit: int = 0,
    ) -> "Optional[Lock]":
        """Takes `keys` if all are free now; None if any is busy. `shared`
        and `limit` as for `lock`."""
        lock = self._run(self._aio.try_lock(keys, lease=lease, renew=renew, shared=shared, limit=limit))
        return None if lock is None else Lock(self, lock, threading.Event())

    def unlock(self, keys: aio.Keys, fence: int) -> None:
        """Releases `keys` held under `fence`, whichever connection took them."""
        self._run(self._aio.unlock(keys, fence))

    def renew(self, keys: aio.Keys, fence: int, lease: float) -> None:
        """Sets the lease of `keys` held under `fence` to now + `lease` seconds."""
        self._run(self._aio.renew(keys, fence, lease))

    def inspect(self, keys: aio.Keys) -> List[KeyInfo]:
        """Holder, lease and waiters of each of `keys`."""
        return self._run(self._aio.inspect(keys))

    def stats(self) -> ServerStats:
        """Server-wide counts."""
        return self._run(self._aio.stats())

    def ping(self) -> float:
        """Round trip to the server, in seconds."""
        return self._run(self._aio.ping())

    def close(self) -> None:
        """Ends the connection and the client's thread; see `dlock.aio.Client.close`."""
        if self._thread.is_alive():
            try:
                self._run(self._aio.close())
            finally:
                self._stop_loop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, coro: Awaitable[T]) -> T:
        future: "Future[T]" = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C) or failed: make sure the call stops too; a
            # lock granted after this is released by the asyncio client.
            future.cancel()
            raise

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class Lock:
    """Keys held by a blocking `Client`; the same shape as `dlock.aio.Lock`.

    `lost` is a `threading.Event` set from the client's thread when the lock
    can no longer be assumed held; `lost_reason` says why. `with` unlocks on
    leaving, with the same rules as `dlock.aio.Lock`.
    """

    def __init__(self, client: Client, lock: _AioLock, lost: threading.Event) -> None:
        self._client = client
        self._lock = lock
        self.lost = lost
        # Registered on the loop thread, where the loss is decided, so none
        # is missed between the grant and this registration.
        client._loop.call_soon_threadsafe(self._watch)

    def _watch(self) -> None:
        if self._lock.lost_reason is not None:
            self.lost.set()
        else:
            self._lock._on_lost.append(lambda reason: self.lost.set())

    def __repr__(self) -> str:
        return repr(self._lock).replace("dlock.aio.Lock", "dlock.Lock")

    @property
    def keys(self) -> "tuple[str, ...]":
        return self._lock.keys

    @property
    def fence(self) -> int:
        return self._lock.fence

    @property
    def lease(self) -> Optional[float]:
        return self._lock.lease

    @property
    def lost_reason(self) -> Optional[str]:
        return self._lock.lost_reason

    def remaining(self) -> float:
        """Seconds until the safety deadline; see `dlock.aio.Lock.remaining`."""
        return self._client._run(self._remaining())

    async def _remaining(self) -> float:
        return self._lock.remaining()

    def check(self) -> None:
        """Raises `LockLost` if the lock is lost or past its safety deadline,
        reading the clock now; see `dlock.aio.Lock.check`."""
        self._client._run(self._check())

    async def _check(self) -> None:
        self._lock.check()

    def unlock(self) -> None:
        """Releases the keys; see `dlock.aio.Lock.unlock`."""
        self._client._run(self._lock.unlock())

    def proclaim(self, value: aio.Value) -> None:
        """Replaces the value of the keys held under this lock's fence."""
        self._client._run(self._lock.proclaim(value))

    def renew(self, lease: Optional[float] = None) -> None:
        """Sets the lease to now + `lease` seconds; see `dlock.aio.Lock.renew`."""
        self._client._run(self._lock.renew(lease))

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        self._client._run(self._lock._leave(et is not None))



class Queued:
    """A request waiting in line, from `Client.enqueue`; see `dlock.aio.Queued`."""

    def __init__(self, client: Client, queued: _AioQueued) -> None:
        self._client = client
        self._queued = queued

    def __repr__(self) -> str:
        return repr(self._queued)

    @property
    def keys(self) -> "tuple[str, ...]":
        return self._queued.keys

    @property
    def ticket(self) -> int:
        return self._queued.ticket

    @property
    def place(self) -> int:
        return self._queued.place

    def wait(self) -> Lock:
        """Blocks for the grant; see `dlock.aio.Queued.wait`."""
        return Lock(self._client, self._client._run(self._queued.wait()), threading.Event())


class Election:
    """An election on `key` through a blocking `client`; see `dlock.election`.

    `campaign` blocks until this process leads; `leader` says who leads;
    `observe` yields the leader now and then every change (each `next`
    blocks until one comes).
    """

    def __init__(self, client: Client, key: str, *, lease: Optional[float] = None) -> None:
        self._client = client
        self.key = key
        self._aio = _AioElection(client._aio, key, lease=lease)

    def campaign(self, value: aio.Value, *, wait: Optional[float] = None) -> "Leadership":
        return Leadership(self._client, self._client._run(self._aio.campaign(value, wait=wait)))

    def leader(self) -> "Optional[Leader]":
        return self._client._run(self._aio.leader())

    def observe(self) -> "Iterator[Optional[Leader]]":
        changes = self._aio.observe()
        try:
            while True:
                try:
                    yield self._client._run(changes.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if self._client._thread.is_alive():
                self._client._run(changes.aclose())


class Leadership:
    """This process leads an election; see `dlock.election.Leadership`.
    `lost` is a `threading.Event`."""

    def __init__(self, client: Client, leadership: _AioLeadership) -> None:
        self._client = client
        self._leadership = leadership
        self.lost = threading.Event()
        self._lock = Lock(client, leadership.lock, self.lost)

    def __repr__(self) -> str:
        return repr(self._leadership)

    @property
    def fence(self) -> int:
        return self._leadership.fence

    @property
    def key(self) -> str:
        return self._leadership.key

    @property
    def lost_reason(self) -> Optional[str]:
        return self._leadership.lost_reason

    def proclaim(self, value: aio.Value) -> None:
        self._client._run(self._leadership.proclaim(value))

    def resign(self) -> None:
        self._client._run(self._leadership.resign())
