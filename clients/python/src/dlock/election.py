"""Leader election on a key, as src/election.rs does it (after etcd's
`concurrency.Election`): campaigners queue for the key (FIFO, like any
Lock), the holder is the leader, its hold's value says who it is.

- `Election.campaign` waits until this process leads and returns a
  `Leadership`, whose `lost` event is set as soon as leading can no longer
  be assumed: the lock's own loss (connection or session ended, deadline),
  or the key taken from under it, which a Watch reports at once.
- `Election.leader` says who leads now; `Election.observe` follows every
  change, pushed by the server (Watch), without campaigning.

Leadership is a lock bound to its connection (on a cluster: its session,
which survives a change of leader node) by default: the client's, or, for a
campaign that waited in line, one of its own (`dlock.aio`: each lock has an
owner of its own, so two campaigns of one client take turns like two
processes'). A leader whose process ends hands over at once. `lease=` makes
it a lease renewed in the background instead, which outlives a brief network
drop but leaves the key held for up to the lease after a crash.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncGenerator, Optional, Tuple

from ._args import value_bytes
from .errors import ConnectionLost, DlockError, ServerError, Status
from .types import KeyInfo

if TYPE_CHECKING:
    from ._args import Value
    from .aio import Client
    from .lock import Lock

#: Pause after a failed Watch before the next (a server that refuses
#: Watches, a cluster between leaders), doubling up to the second bound.
_RETRY = 0.25
_MAX_RETRY = 5.0


@dataclass(frozen=True)
class Leader:
    """Who leads an election."""

    #: The leader's value: what it campaigned with, or proclaimed since.
    value: bytes
    #: The fencing token of its leadership: higher for every later leader.
    fence: int
    #: Seconds it has led, when the server says.
    held_for: Optional[float] = None

    @classmethod
    def of(cls, info: KeyInfo) -> "Optional[Leader]":
        """The leader of a key as Inspect or Watch saw it: its first holder."""
        first = info.first()
        if first is None:
            return None
        return cls(first.value, first.fence, first.held_for)

    def same(self, other: "Optional[Leader]") -> bool:
        """The same leadership with the same value (`held_for` is not compared)."""
        return other is not None and (self.fence, self.value) == (other.fence, other.value)


def _known(leader: Optional[Leader]) -> Optional[Tuple[int, bytes]]:
    return None if leader is None else (leader.fence, leader.value)


class Election:
    """An election on `key`, through `client` (a `dlock.aio.Client`)."""

    def __init__(self, client: "Client", key: str, *, lease: Optional[float] = None) -> None:
        self._client = client
        self.key = key
        self._lease = lease

    async def campaign(self, value: "Value", *, wait: Optional[float] = None) -> "Leadership":
        """Waits until this campaigner leads, in line behind earlier ones
        (`wait`: at most that many seconds, else `Timeout`), announcing
        `value` (at most 1024 bytes). Cancel-safe: a cancelled campaign
        leaves the line."""
        lock = await self._client.lock(self.key, wait=wait, lease=self._lease, value=value)
        return Leadership(self, lock, value)

    async def leader(self) -> Optional[Leader]:
        """Who leads now, if anyone."""
        [info] = await self._client.inspect(self.key)
        return Leader.of(info)

    async def observe(self) -> AsyncGenerator[Optional[Leader], None]:
        """The leader now (None: nobody), then every new leader or
        proclaimed value as the server pushes it (one Watch at a time, sent
        again after its limit or an error; against a cluster, to the new
        leader node too). A change and its reversal between two answers may
        be seen as none. Ends when the client is closed."""
        known = await self.leader()
        yield known
        pause = _RETRY
        while True:
            try:
                info = await self._client.watch(self.key, _known(known))
            except ConnectionLost:
                if self._client.closed.is_set():
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY)
                continue
            except DlockError:
                # A server that keeps refusing (WatchLimit, no Watch) is not polled.
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY)
                continue
            pause = _RETRY
            now = Leader.of(info)
            if not (now.same(known) if now is not None else known is None):
                known = now
                yield now


class Leadership:
    """This process leads an election; from `Election.campaign`.

    `lost` (an `asyncio.Event`, the lock's) is set when it can no longer be
    assumed to lead; `lost_reason` says why. Fence what you do as leader
    with `fence`, so a deposed leader's late writes are refused.
    """

    def __init__(self, election: Election, lock: "Lock", value: "Value") -> None:
        self._election = election
        self.lock = lock
        self.key = election.key
        self._resigned = False
        self._keeper = asyncio.get_running_loop().create_task(self._watch_deposed(value))

    def __repr__(self) -> str:
        return f"<dlock.Leadership {self.key!r} fence={self.fence} lost={self.lost.is_set()}>"

    @property
    def fence(self) -> int:
        return self.lock.fence

    @property
    def lost(self) -> asyncio.Event:
        return self.lock.lost

    @property
    def lost_reason(self) -> Optional[str]:
        return self.lock.lost_reason

    async def _watch_deposed(self, value: "Value") -> None:
        """Sets the lock lost when the key's first holder is no longer this
        leadership, as the server pushes it (a lock bound to its connection
        would otherwise learn only from its next Unlock). A value proclaimed
        is followed; errors are retried, the lock reporting its own loss."""
        client = self._election._client
        known = (self.fence, value_bytes(value))
        pause = _RETRY
        while not self.lost.is_set():
            try:
                info = await client.watch(self.key, known)
            except ServerError as e:
                if e.status == Status.InvalidType:
                    return  # a server without Watch: the lock alone tells
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY)
                continue
            except DlockError:
                if client.closed.is_set():
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY)
                continue
            pause = _RETRY
            first = info.first()
            if first is not None and first.fence == self.fence:
                known = (first.fence, first.value)
                continue
            holder = f"fence {first.fence}" if first is not None else "nobody"
            self.lock._set_lost(f"deposed: the key {self.key!r} is held by {holder} now")
            return

    async def proclaim(self, value: "Value") -> None:
        """Announces `value` as the leader's, for `Election.leader` and
        observers. Raises `NotHeld` when this process no longer leads."""
        await self.lock.proclaim(value)

    async def resign(self) -> None:
        """Gives up leadership: the next campaigner in line leads. Raises
        `NotHeld` when it was lost already."""
        if self._resigned:
            return
        self._resigned = True
        self._keeper.cancel()
        await self.lock.unlock()
