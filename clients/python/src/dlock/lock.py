"""`Lock`: keys held by an asyncio client, their fencing token, and their loss.

A Lock is held by a connection: the client's, or one of its own for a Lock
that waited or whose key another Lock of the client held (`dlock.aio`). Its
safety deadline counts from that connection's answers, a Lock without a
lease is lost when that connection ends, and its unlock goes there.

What the client knows of how long the lock lasts at the server is a
`rules.Hold`: its lease, if any, and the renewal sent and not answered that
may end it sooner (the server may have applied it though its answer never
came, also the first Renew of a lock without a lease, which makes it a
lease). The safety deadline, the margin and jeopardy are the rules' too
(rules.py, as src/rules.rs).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from . import rules
from ._args import micros
from ._proto import dlock_pb2 as pb
from .errors import ConnectionLost, DlockError, LockLost, NotHeld

if TYPE_CHECKING:
    from ._args import Value
    from .aio import Client


class Lock:
    """Keys held together under one fencing token; returned by `Client.lock`.

    `lost` is an `asyncio.Event` set when the lock can no longer be assumed
    held (see the client-side safety rule in `dlock.aio`); `lost_reason` then
    says why. Stop working on the protected resource when it is set, and pass
    `fence` to the resource so it can refuse a holder that did not notice in
    time.

    Leaving `async with` unlocks. If the block raised, that exception is kept
    and an unlock failure is ignored; if it did not and the lock was lost
    meanwhile (or the unlock finds it no longer held), `LockLost` is raised,
    since the work was not protected to its end.
    """

    def __init__(
        self,
        client: "Client",
        keys: Tuple[str, ...],
        fence: int,
        lease: Optional[float],
        sent: float,
        renew: bool,
    ) -> None:
        self._client = client
        self.keys = keys
        self.fence = fence
        self.lost = asyncio.Event()
        self.lost_reason: Optional[str] = None
        self._released = False
        # Holds the claim of its keys on the client's shared connection,
        # until its Unlock is queued (see `dlock.aio.Client._claims`).
        self._claimed = False
        # The lease and the send time of the Lock or latest Renew answered
        # (the server started counting later), and the renewal sent and not
        # answered that may end the lock sooner; in nanoseconds, a lease as
        # the server takes it (whole microseconds).
        self._hold = rules.Hold.granted(rules.to_ns(sent), None if lease is None else micros(lease) * 1_000)
        self._auto_renew = renew
        # For a lease: renews it, and reports it lost when it could run out.
        self._keeper: Optional["asyncio.Task[None]"] = None
        # For a lock without a lease after a Renew that got no answer (which
        # may have made it a lease): reports it lost when that lease could
        # run out. The client's watchdog watches the session's deadline.
        self._alarm: Optional[asyncio.TimerHandle] = None
        # Held across a renewal, and while renew() replaces the keeper.
        self._renewing = asyncio.Lock()
        self._on_lost: List[Callable[[str], None]] = []
        if lease is not None:
            self._start_keeper()

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self._released else "held"
        return f"<dlock.aio.Lock {list(self.keys)} fence={self.fence} lease={self.lease} {state}>"

    @property
    def lease(self) -> Optional[float]:
        """Lease length in seconds (the one the server last confirmed); None
        for a lock held without a lease."""
        held = self._hold.lease
        return None if held is None else rules.to_seconds(held[1])

    def remaining(self) -> float:
        """Seconds until the safety deadline less the safety margin: how
        long the lock may still be relied on without a fresh answer from the
        server (negative when past)."""
        return self._deadline() - self._client._loop.time()

    def check(self) -> None:
        """Raises `LockLost` if the lock is lost or its safety deadline has
        passed, reading the clock now instead of waiting for the timer (which
        a paused or busy process runs late)."""
        if self.lost_reason is None and not self._released:
            deadline, margin = self._safety()
            if rules.in_jeopardy(rules.to_ns(self._client._loop.time()), deadline, margin):
                self._set_lost(self._past_deadline())
        if self.lost_reason is not None:
            raise LockLost(self.lost_reason)

    def _may_be_lease(self) -> bool:
        """Whether the server may hold the keys as a lease, which outlives
        the connection: taken with one, or a Renew sent."""
        hold = self._hold
        return hold.lease is not None or hold.unconfirmed is not None or hold.latest is not None

    def _safety(self) -> Tuple[int, int]:
        """The safety deadline and the margin in force, in nanoseconds
        (`rules.Hold`): the lease's, or the owner's (the connection's or
        session's), or an unanswered renewal's if it ends sooner."""
        client = self._client
        timeout = rules.to_ns(client.limits.session_timeout)
        deadline = self._hold.deadline(rules.to_ns(client._conn.fresh), timeout)
        return deadline, client._margin_ns(self._hold.window(timeout))

    def _deadline(self) -> float:
        """When the lock falls into jeopardy: the safety deadline less the margin."""
        deadline, margin = self._safety()
        return rules.to_seconds(deadline - margin)

    def _unconfirmed_binds(self) -> bool:
        """Whether an unanswered renewal is what ends the lock soonest."""
        unconfirmed = self._hold.unconfirmed
        if unconfirmed is None:
            return False
        return rules.deadline(*unconfirmed) < rules.Hold(self._hold.lease).deadline(
            rules.to_ns(self._client._conn.fresh), rules.to_ns(self._client.limits.session_timeout)
        )

    def _past_deadline(self) -> str:
        if self._unconfirmed_binds():
            assert self._hold.unconfirmed is not None
            lease = rules.to_seconds(self._hold.unconfirmed[1])
            return f"a Renew to a lease of {lease:.3g} s got no answer in time: the lease it may have set could run out"
        if self.lease is not None:
            return f"lease of {self.lease:.3g} s not renewed in time"
        return self._client._stale_reason()

    async def unlock(self) -> None:
        """Releases the keys (by fence, so a later grant to someone else is never touched).

        Raises `NotHeld` if they were no longer held, e.g. after the lease ran
        out; `ConnectionLost` if the connection is gone (a lock without a
        lease is then already released).

        A lease outlives its connection (on a cluster, its session): if that
        ends before the Unlock is answered, perhaps before it was sent (a
        session that ends while it moves to a new leader), the Unlock is
        sent again by fence on a connection opened for it, within 10 s. It
        returns if that released the keys; raises `NotHeld` if they were not
        so held any more (the lease ran out, or the first Unlock was applied
        after all), `ConnectionLost` if no server could be reached (or the
        client was closed): the lease then runs until it ends.
        """
        if self._released:
            return
        self._released = True
        self._stop()
        await self._client._unlock(self)

    async def proclaim(self, value: "Value") -> None:
        """Replaces the value of the keys held under this lock's fence (what
        Inspect and Watch show). Raises `NotHeld` if they are no longer held."""
        await self._client.proclaim(self.keys, self.fence, value)

    async def renew(self, lease: Optional[float] = None) -> None:
        """Sets the lease to now + `lease` seconds (default: the lease it has).

        A lock held without a lease becomes a lease: it then outlives the
        connection, and is renewed in the background if the lock was taken
        with `renew=True`. Raises `NotHeld` if the keys are no longer held.
        """
        lease = lease if lease is not None else self.lease
        if lease is None or lease <= 0:
            raise ValueError("renew needs a positive lease for a lock taken without one")
        async with self._renewing:
            await self._renew_locked(lease)
            if self._hold.lease is not None and self in self._client._bound:
                # A lease now, as the server confirmed: it outlives the
                # connection.
                self._client._bound.discard(self)
                self._client._leases.add(self)
                self._disarm()
            # The keeper sleeps until a time reckoned from the lease it
            # had: a shorter lease needs its renewal (or its loss) sooner.
            # Holding the lock, it is not in the middle of a renewal whose
            # answer would be lost with it.
            keeper, self._keeper = self._keeper, None
            if keeper is not None and keeper is not asyncio.current_task():
                keeper.cancel()
            self._start_keeper()

    async def _renew_once(self, lease: float) -> None:
        async with self._renewing:
            await self._renew_locked(lease)

    async def _renew_locked(self, lease: float) -> None:
        # One renewal at a time: the server applies them in the order sent,
        # and the latest sent of those answered is the lease in force.
        sent, lease_ns = rules.to_ns(asyncio.get_running_loop().time()), micros(lease) * 1_000
        body = pb.RequestLock(keys=self.keys, fence=self.fence, release_micro=micros(lease))
        # Once sent, the server may apply it though its answer never comes
        # (an error, a cancelled call): until an answer to it (or a later
        # one) comes, the lock may end with it. So for a lease ending sooner
        # than the one in force, and for a lock without a lease, which it
        # makes a lease (still lost with its connection until the server
        # confirms it).
        before = self._deadline()
        if self._hold.renew_sent(sent, lease_ns):
            if self._hold.lease is None:
                self._arm()
            elif self._deadline() < before and self._keeper is not asyncio.current_task():
                # The keeper sleeps until a time reckoned from the hold
                # before: it must look again sooner.
                keeper, self._keeper = self._keeper, None
                if keeper is not None:
                    keeper.cancel()
                self._start_keeper()
        await self._client._call(pb.Renew, body)
        self._hold.renew_answered(sent, lease_ns)

    def _arm(self) -> None:
        """Watches the deadline of a lock without a lease that an unanswered
        renewal may have made a lease: it is lost when that lease could run
        out, whatever the session's answers say."""
        self._disarm()
        if self.lost_reason is None and not self._released and self._hold.unconfirmed is not None:
            self._alarm = self._client._loop.call_at(self._deadline(), self._on_alarm)

    def _disarm(self) -> None:
        alarm, self._alarm = self._alarm, None
        if alarm is not None:
            alarm.cancel()

    def _on_alarm(self) -> None:
        self._alarm = None
        if self.lost_reason is not None or self._released or self._hold.lease is not None:
            return  # lost, released, or a lease now, which its keeper watches
        deadline, margin = self._safety()
        if rules.in_jeopardy(rules.to_ns(self._client._loop.time()), deadline, margin):
            self._set_lost(self._past_deadline())
        else:
            self._arm()

    def _start_keeper(self) -> None:
        if self.lost_reason is None and not self._released:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        """Renews the lease every third of it; reports it lost when it could run out."""
        loop = asyncio.get_running_loop()
        while True:
            renewal = self._hold.renewal()
            assert renewal is not None
            now = loop.time()
            deadline, margin = self._safety()
            if rules.in_jeopardy(rules.to_ns(now), deadline, margin):
                self._set_lost(self._past_deadline())
                return
            lose_at = rules.to_seconds(deadline - margin)
            renew_at = rules.to_seconds(renewal[0])
            if not self._auto_renew or now < renew_at:
                # (A renewal sent and not answered may end it before the
                # next one is due.)
                await asyncio.sleep((lose_at if not self._auto_renew else min(renew_at, lose_at)) - now)
                continue
            try:
                await asyncio.wait_for(self._renew_once(self.lease), lose_at - now)
            except NotHeld:
                self._set_lost("the server no longer holds the lease (NotHeld on renew)")
                return
            except asyncio.TimeoutError:
                self._set_lost(f"lease of {self.lease:.3g} s not renewed in time (no answer)")
                return
            except DlockError as e:
                # The lease outlives the connection: it is lost only when it
                # could have run out.
                why = e.reason if isinstance(e, ConnectionLost) else str(e)
                await asyncio.sleep(max(0.0, lose_at - loop.time()))
                self._set_lost(f"lease could not be renewed ({why}) and may have run out")
                return

    def _set_lost(self, reason: str) -> None:
        if self.lost_reason is not None or self._released:
            return
        self.lost_reason = reason
        self.lost.set()
        self._stop()
        for callback in self._on_lost:
            callback(reason)

    def _stop(self) -> None:
        self._client._forget(self)
        self._disarm()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()

    async def _leave(self, failed: bool) -> None:
        if self._released:
            return
        if failed:
            try:
                await self.unlock()
            except DlockError:
                pass  # the block's own exception says more
            return
        try:
            self.check()
        except LockLost:
            try:
                await self.unlock()
            except DlockError:
                pass  # lost already: the server may have released it
            raise
        try:
            await self.unlock()
        except NotHeld as e:
            # Lost without this client seeing it before the server did.
            raise LockLost(f"not held any more when unlocked ({e})") from e

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        await self._leave(et is not None)
