"""Two-phase acquire, values, Proclaim, Watch and elections from Python, against a real server."""

from __future__ import annotations

import asyncio

import pytest

import dlock
import dlock.aio
from dlock import NotHeld, ServerError, Status, Timeout
from dlock.aio import Election, Leader, Queued
from conftest import LIMIT, run


def test_enqueue_is_granted_at_once_or_queued_with_its_place(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b, dlock.aio.connect(
            server.addr
        ) as c:
            held = await a.enqueue("q")
            assert isinstance(held, dlock.aio.Lock) and held.fence > 0
            first = await b.enqueue("q", wait=LIMIT)
            second = await c.enqueue("q", lease=30)
            assert isinstance(first, Queued) and isinstance(second, Queued)
            assert (first.place, second.place) == (0, 1) and first.ticket != second.ticket
            # A try-enqueue is a try-lock: busy at once, nothing queued.
            async with dlock.aio.connect(server.addr) as d:
                with pytest.raises(Timeout) as busy:
                    await d.enqueue("q", wait=0)
                assert busy.value.busy == ["q"]
            await held.unlock()
            got = await first.wait()
            assert got.fence > held.fence
            [info] = await a.inspect("q")
            assert (info.fence, info.waiters) == (got.fence, 1)
            await got.unlock()
            leased = await second.wait()
            assert leased.lease == 30 and leased.fence > got.fence
            with pytest.raises(ServerError) as e:
                await second.wait()
            assert e.value.status == Status.UnknownTicket
            await leased.unlock()

    run(body())


def test_a_queued_request_times_out_at_its_wait_limit(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            held = await a.lock("slow")
            queued = await b.enqueue("slow", wait=0.2)
            with pytest.raises(Timeout) as e:
                await queued.wait()
            assert e.value.busy == ["slow"]
            await held.unlock()

    run(body())


def test_values_are_set_by_lock_and_proclaim_and_watch_follows_them(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            # Free: a Watch naming "free" waits its limit and answers the same.
            info = await b.watch("v", None, limit=0.1)
            assert info.first() is None
            lock = await a.lock("v", value="host-a")
            info = await b.watch("v", None)
            assert (info.first().fence, info.first().value) == (lock.fence, b"host-a")
            assert info.held_for is not None and info.value == b"host-a"
            watching = asyncio.ensure_future(b.watch("v", (lock.fence, "host-a")))
            # Parked on a connection of its own: b's other calls are not held back.
            [seen] = await b.inspect("v")
            assert seen.value == b"host-a" and not watching.done()
            await lock.proclaim(b"host-a2")
            info = await asyncio.wait_for(watching, LIMIT)
            assert info.first().value == b"host-a2"
            await b.proclaim("v", lock.fence, "by-fence")
            assert (await a.inspect("v"))[0].value == b"by-fence"
            await lock.unlock()
            with pytest.raises(NotHeld):
                await lock.proclaim("late")
            with pytest.raises(ServerError) as e:
                await a.lock("v", value=b"x" * 1025)
            assert e.value.status == Status.ValueTooLarge

    run(body())


def test_an_election_hands_over_in_line_and_observers_see_each_leader(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b, dlock.aio.connect(
            server.addr
        ) as o:
            seen = Election(o, "svc").observe()
            assert await asyncio.wait_for(seen.__anext__(), LIMIT) is None
            lead_a = await Election(a, "svc").campaign("a")
            now = await asyncio.wait_for(seen.__anext__(), LIMIT)
            assert isinstance(now, Leader) and (now.value, now.fence) == (b"a", lead_a.fence)
            leader = await Election(o, "svc").leader()
            assert (leader.value, leader.fence) == (b"a", lead_a.fence)
            campaign_b = asyncio.ensure_future(Election(b, "svc").campaign("b"))
            await lead_a.proclaim("a2")
            now = await asyncio.wait_for(seen.__anext__(), LIMIT)
            assert (now.value, now.fence) == (b"a2", lead_a.fence)
            await lead_a.resign()
            lead_b = await asyncio.wait_for(campaign_b, LIMIT)
            now = await asyncio.wait_for(seen.__anext__(), LIMIT)
            assert (now.value, now.fence) == (b"b", lead_b.fence) and lead_b.fence > lead_a.fence
            assert not lead_b.lost.is_set()
            # An operator releases the key by its fence: b is told at once.
            await o.unlock("svc", lead_b.fence)
            await asyncio.wait_for(lead_b.lost.wait(), LIMIT)
            assert "deposed" in lead_b.lost_reason
            with pytest.raises(NotHeld):
                await lead_b.proclaim("late")
            await seen.aclose()

    run(body())


def test_the_blocking_client_enqueues_proclaims_and_campaigns(server):
    with dlock.Client(server.addr) as a, dlock.Client(server.addr) as b:
        held = a.enqueue("s", value="a")
        assert isinstance(held, dlock.Lock)
        queued = b.enqueue("s", wait=LIMIT)
        assert isinstance(queued, dlock.Queued) and queued.place == 0
        held.proclaim("a2")
        assert b.inspect("s")[0].value == b"a2"
        held.unlock()
        got = queued.wait()
        assert got.fence > held.fence
        got.unlock()

        election = dlock.Election(b, "sync-svc")
        observed = election.observe()
        assert next(observed) is None
        lead = dlock.Election(a, "sync-svc").campaign("a")
        leader = next(observed)
        assert (leader.value, leader.fence) == (b"a", lead.fence)
        assert election.leader().fence == lead.fence
        lead.resign()
        assert next(observed) is None
        observed.close()
        assert not lead.lost.is_set()
