"""Client for the dlock lock server (see docs/PROTOCOL.md of the dlock repository).

Blocking use, for scripts::

    import dlock

    with dlock.Client() as client:                      # DLOCK_SERVER, DLOCK_TOKEN
        with client.lock("jobs/nightly", wait=30) as lock:
            do_the_work(fence=lock.fence)               # stop if lock.lost.is_set()

asyncio, with many tasks on one client::

    import dlock.aio

    async with dlock.aio.connect() as client:
        async with client.lock(["a", "b"], lease=60) as lock:
            ...

Each lock has an owner of its own: tasks (threads, goroutines) sharing one client that lock the
same key take turns, first come first served, exactly as separate processes do; unrelated locks
share the client's one pipelined connection, and a lock whose key another lock of this client
holds, or that must wait, is taken on a connection of its own.

Against a cluster, name its nodes: ``dlock.Client("127.0.0.1:7436,127.0.0.2:7436,127.0.0.3:7436")``
(or a list, or DLOCK_SERVER so); the client follows the leader and keeps its locks through failovers.

Layout: `aio` (the asyncio client), `connection` (its pipelined connection, and on a cluster
the session that outlives it), `dial` (finding the server or the cluster's leader), `lock` (an
asyncio `Lock` and its safety deadlines), `sync` (the blocking client, the asyncio one on a
thread), `enqueue` (a queued request), `election`, `framing`, `errors`, `types`, `_args` (request
arguments), `_env` (DLOCK_* variables), `_tls` (TLS setups that do not fit the server's), `_proto`
(generated).
"""

from .errors import (
    AccessDenied,
    ConnectError,
    ConnectionLost,
    DlockError,
    LockLost,
    NotHeld,
    NotOneCluster,
    ProtocolError,
    ServerError,
    Status,
    Timeout,
    TLSError,
    TLSProblem,
)
from .election import Leader
from .sync import Client, Election, Leadership, Lock, Queued
from .types import Event, KeyHolder, KeyInfo, Limits, Reconnecting, Resumed, ServerStats

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "DlockError",
    "Election",
    "Event",
    "KeyHolder",
    "KeyInfo",
    "Leader",
    "Leadership",
    "Limits",
    "Lock",
    "LockLost",
    "NotHeld",
    "NotOneCluster",
    "ProtocolError",
    "Queued",
    "Reconnecting",
    "Resumed",
    "ServerError",
    "ServerStats",
    "Status",
    "Timeout",
    "TLSError",
    "TLSProblem",
]
