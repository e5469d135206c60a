"""Client for the dlock lock server (see docs/PROTOCOL.md of the dlock repository).

Blocking use, for scripts::

    import dlock

    with dlock.Client() as client:                      # DLOCK_SERVER, DLOCK_TOKEN
        with client.lock("jobs/nightly", wait=30) as lock:
            do_the_work(fence=lock.fence)               # stop if lock.lost.is_set()

asyncio, with many tasks on one connection::

    import dlock.aio

    async with dlock.aio.connect() as client:
        async with client.lock(["a", "b"], lease=60) as lock:
            ...

Layout: `aio` (the asyncio client), `connection` (its pipelined connection), `lock` (an asyncio
`Lock` and its safety deadlines), `sync` (the blocking client, the asyncio
one on a thread), `framing`, `errors`, `types`, `_proto` (generated).
"""

from .errors import (
    AccessDenied,
    ConnectError,
    ConnectionLost,
    DlockError,
    LockLost,
    NotHeld,
    ProtocolError,
    ServerError,
    Status,
    Timeout,
)
from .sync import Client, Lock
from .types import KeyHolder, KeyInfo, Limits, ServerStats

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "Client",
    "ConnectError",
    "ConnectionLost",
    "DlockError",
    "KeyHolder",
    "KeyInfo",
    "Limits",
    "Lock",
    "LockLost",
    "NotHeld",
    "ProtocolError",
    "ServerError",
    "ServerStats",
    "Status",
    "Timeout",
]
