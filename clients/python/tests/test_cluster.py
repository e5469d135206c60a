"""The Python client against real three-node clusters: leaders paused, deposed and killed.

Each test starts its own cluster (conftest.Cluster) and waits for events
the client reports (`on_event`) or the cluster reports (ClusterStatus), with
a bound on every wait; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

import pytest

import dlock
import dlock.aio
from dlock import ConnectError, Reconnecting, Resumed, Status, Timeout
from dlock._proto import dlock_pb2 as pb
from dlock.aio import Election, Queued
from dlock.connection import keeps_session_alive
from conftest import LIMIT, run

#: The session TTL of most test clusters: a quarter of it is the ping
#: interval and the time a silent node gets, and a paused leader must be
#: replaced, and the session resumed, within its safety deadline (0.9 TTL
#: after the last answered Ping) on a loaded two-core machine.
TTL = 6.0


class Events:
    """A client's `on_event` calls, waited for in order."""

    def __init__(self) -> None:
        self.queue: "asyncio.Queue[Any]" = asyncio.Queue()
        self.seen: List[Any] = []

    def __call__(self, event: Any) -> None:
        self.seen.append(event)
        self.queue.put_nowait(event)

    async def next(self, kind: type, addr_not: Optional[str] = None, limit: float = LIMIT) -> Any:
        """The next event of `kind` (about another node than `addr_not`):
        a needless election on a loaded machine may move a session too."""
        while True:
            event = await asyncio.wait_for(self.queue.get(), limit)
            if isinstance(event, kind) and event.addr != addr_not:
                return event


async def new_leader(cluster, old: int) -> int:
    """Waits (in a thread: ClusterStatus calls block) for a leader other than `old`."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: cluster.leader(other_than=old))


def test_only_answers_of_committed_commands_prove_a_session_alive():
    # The rule of src/link.rs (`keeps_session_alive`), which the client-side
    # safety deadline rests on.
    proving = {
        (pb.Ping, Status.Ok),
        (pb.Lock, Status.Ok),
        (pb.Unlock, Status.Ok),
        (pb.Renew, Status.Ok),
        (pb.Enqueue, Status.Ok),
        (pb.Lock, Status.AcquireTimeout),
        (pb.Enqueue, Status.AcquireTimeout),
        (pb.Enqueue, Status.Queued),
        (pb.Unlock, Status.NotHeld),
        (pb.Renew, Status.NotHeld),
    }
    for rtype in pb.RequestType.values():
        for status in Status:
            assert keeps_session_alive(rtype, status) == ((rtype, status) in proving), (
                pb.RequestType.Name(rtype),
                status.name,
            )


def test_a_deposed_leader_never_leaves_a_lock_held_here_that_the_cluster_gave_away(start_cluster):
    # Issue 27: a leader paused (SIGSTOP) until the others replace it, then
    # resumed (SIGCONT), answers the Pings that queued up with NotLeader.
    # Those answers must not keep the lock "held" here: either the holder
    # resumes its session on the new leader (and keeps the lock), or it
    # counts the lock lost before anyone else is granted it. The holder is
    # given the old leader's address alone, so it can only find the new one
    # once the old one answers again.
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()

    async def body():
        events = Events()
        holder = await dlock.aio.connect(cluster.addrs[old], on_event=events)
        assert holder.limits.resumable_sessions and holder.limits.session_timeout == TTL
        assert holder.session is not None
        lock = await holder.lock("k")
        cluster.pause(old)
        try:
            new = await new_leader(cluster, old)
        finally:
            cluster.resume(old)
        async with dlock.aio.connect(cluster.addrs[new]) as other:
            taking = asyncio.ensure_future(other.lock("k", wait=3 * TTL))
            resumed = asyncio.ensure_future(events.next(Resumed, addr_not=cluster.addrs[old]))
            lost = asyncio.ensure_future(lock.lost.wait())
            done, _ = await asyncio.wait({taking, resumed, lost}, timeout=LIMIT, return_when=asyncio.FIRST_COMPLETED)
            assert done, "nothing happened"
            if taking in done:
                # check() reads the clock: this does not depend on which
                # timer the loop ran first.
                assert lock.lost.is_set() or lock.remaining() <= 0, (
                    f"k was granted to another client while the holder's lock was not lost ({lock!r})"
                )
                await (await taking).unlock()
            elif resumed in done and not lock.lost.is_set():
                # The session moved with its lock; nobody else can have it
                # while the holder keeps the session alive.
                await holder.ping()
                assert holder.addr == cluster.addrs[new]
                # Other's Lock waits in line on a connection of its own,
                # opened once its first try found k busy: wait until it queued.
                deadline = asyncio.get_running_loop().time() + LIMIT
                while True:
                    [info] = await holder.inspect("k")
                    assert (info.fence, info.held_by_caller) == (lock.fence, True)
                    if info.waiters == 1:
                        break
                    assert asyncio.get_running_loop().time() < deadline, "other's Lock never queued"
                    await asyncio.sleep(0.01)
                assert not taking.done()
                taking.cancel()
                await lock.unlock()
            else:
                taking.cancel()
            resumed.cancel()
            lost.cancel()
        await holder.close()

    run(body(), timeout=LIMIT + 10)


def test_a_paused_and_deposed_leader_costs_the_holder_nothing(start_cluster):
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()

    async def body():
        events = Events()
        holder = await dlock.aio.connect(cluster.servers, on_event=events)
        assert holder.addr == cluster.addrs[old]
        lock = await holder.lock("k")
        cluster.pause(old)
        try:
            new = await new_leader(cluster, old)
            # The holder notices the silence and moves its session there.
            resumed = await events.next(Resumed, addr_not=cluster.addrs[old])
        finally:
            cluster.resume(old)  # deposed, and running again
        assert resumed.addr == cluster.addrs[new] and resumed.session == holder.session
        assert any(isinstance(e, Reconnecting) and e.addr == cluster.addrs[old] for e in events.seen)
        await holder.ping()
        assert not lock.lost.is_set(), lock.lost_reason
        async with dlock.aio.connect(cluster.servers) as other:
            assert other.addr == cluster.addrs[new]
            assert await other.try_lock("k") is None
            [info] = await other.inspect("k")
            assert info.fence == lock.fence
            await lock.unlock()
            await (await other.lock("k", wait=5)).unlock()
        assert not lock.lost.is_set()
        await holder.close()

    run(body())


def test_a_killed_leader_is_ridden_through_with_locks_and_places_in_line_kept(start_cluster):
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()

    async def body():
        events = Events()
        holder = await dlock.aio.connect(cluster.servers, on_event=events)
        first = await dlock.aio.connect(cluster.servers)
        second = await dlock.aio.connect(cluster.servers)
        lock = await holder.lock("k")
        # Two waiters in line, in a known order.
        wait_first = asyncio.ensure_future(first.lock("k", wait=LIMIT))
        while (await holder.inspect("k"))[0].waiters != 1:
            await asyncio.sleep(0.01)
        wait_second = asyncio.ensure_future(second.lock("k", wait=LIMIT))
        while (await holder.inspect("k"))[0].waiters != 2:
            await asyncio.sleep(0.01)
        cluster.kill(old)
        await events.next(Resumed, addr_not=cluster.addrs[old])
        assert holder.addr != cluster.addrs[old]
        await holder.ping()
        assert not lock.lost.is_set(), lock.lost_reason
        # The waiting Locks were sent again under their numbers: still two
        # in line, in their order, and nobody holds k but the holder.
        for _ in range(int(LIMIT / 0.02)):
            [info] = await holder.inspect("k")
            if info.waiters == 2:
                break
            await asyncio.sleep(0.02)
        assert (info.fence, info.waiters, info.held_by_caller) == (lock.fence, 2, True)
        assert not wait_first.done() and not wait_second.done()
        await lock.unlock()
        granted = await asyncio.wait_for(wait_first, LIMIT)
        assert granted.fence > lock.fence and not wait_second.done()
        await granted.unlock()
        await (await asyncio.wait_for(wait_second, LIMIT)).unlock()
        for client in (holder, first, second):
            await client.close()

    run(body())


def test_with_every_node_down_the_lock_is_lost_and_the_error_names_each_node(start_cluster, monkeypatch):
    ttl = 2.0
    cluster = start_cluster(3, "--session-ttl", f"{ttl:g}s")
    cluster.leader()

    async def body():
        client = await dlock.aio.connect(cluster.servers, connect_timeout=1.5)
        lock = await client.lock("k")
        for i in range(3):
            cluster.kill(i)
        await asyncio.wait_for(client.closed.wait(), LIMIT)
        assert lock.lost.is_set()
        reason = client.close_reason
        assert "not resumed" in reason and all(addr in reason for addr in cluster.addrs), reason
        with pytest.raises(dlock.ConnectionLost):
            await client.ping()

    run(body())
    monkeypatch.setenv("DLOCK_SERVER", cluster.servers)
    with pytest.raises(ConnectError) as e:
        dlock.Client(connect_timeout=1.5)
    assert [addr for addr, _ in e.value.attempts] == cluster.addrs
    assert all(addr in str(e.value) for addr in cluster.addrs)


def test_the_blocking_client_takes_a_list_and_follows_the_leader(start_cluster):
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()
    follower = next(i for i in range(3) if i != old)
    # A follower first: its NotLeader answer names the leader.
    with dlock.Client([cluster.addrs[follower], cluster.addrs[old]]) as client:
        assert client.addr == cluster.addrs[old] and client.session
        with client.lock("sync", wait=5) as lock:
            assert lock.fence > 0
            [info] = client.inspect("sync")
            assert info.held_by_caller and info.fence == lock.fence
        with pytest.raises(Timeout):
            with dlock.Client(cluster.servers) as other, client.lock("busy"):
                other.lock("busy", wait=0)


def test_enqueued_requests_and_an_election_ride_through_a_leader_kill(start_cluster):
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()

    async def body():
        events = Events()
        h = await dlock.aio.connect(cluster.servers)
        e = await dlock.aio.connect(cluster.servers, on_event=events)
        leader = await dlock.aio.connect(cluster.servers)
        observer = await dlock.aio.connect(cluster.servers)
        lead = await Election(leader, "svc").campaign("l")
        seen = Election(observer, "svc").observe()
        first = await asyncio.wait_for(seen.__anext__(), LIMIT)
        assert (first.value, first.fence) == (b"l", lead.fence)
        hold_g, hold_q = await h.lock("g"), await h.lock("q")
        queued_g = await e.enqueue("g", wait=LIMIT)
        queued_q = await e.enqueue("q", wait=LIMIT)
        assert isinstance(queued_g, Queued) and isinstance(queued_q, Queued)
        # More numbered requests on e's session before the Waits: seq_done
        # must still not let the cluster forget the Enqueues' outcomes.
        await (await e.lock("other")).unlock()
        # g is granted to the queued request before the leader dies, and
        # not yet collected; q is still in line when it dies.
        await hold_g.unlock()
        granted_g = (await h.inspect("g"))[0].fence
        assert granted_g > hold_g.fence
        cluster.kill(old)
        await lead.proclaim("l-after")  # answered by the new leader
        now = await asyncio.wait_for(seen.__anext__(), LIMIT)
        assert (now.value, now.fence) == (b"l-after", lead.fence)
        got_g = await asyncio.wait_for(queued_g.wait(), LIMIT)
        assert got_g.fence == granted_g
        await hold_q.unlock()
        got_q = await asyncio.wait_for(queued_q.wait(), LIMIT)
        assert got_q.fence > granted_g
        assert not lead.lost.is_set() and not got_g.lost.is_set()
        await events.next(Resumed, addr_not=cluster.addrs[old])
        await seen.aclose()
        for client in (h, e, leader, observer):
            await client.close()

    run(body())
