"""The liveness probe (dlock.liveness): its limit, what counts as a silence,
and a waiting Lock that keeps its place in line through a leader paused for
longer than the session TTL."""

from __future__ import annotations

import asyncio
import socket
import time

import dlock
import dlock.aio
from dlock import Reconnecting, Resumed
from dlock.dial import Dial, establish
from dlock.liveness import silence_limit, watch_node
from conftest import LIMIT, run
from test_cluster import Events, new_leader


def test_the_silence_limit_is_three_election_timeouts_within_bounds():
    # As src/liveness.rs: 3 × the election timeout (200 ms when the node
    # does not say), at least 1.5 s, at most a quarter of the TTL.
    assert silence_limit(None, 10.0) == 1.5
    assert silence_limit(0.0, 10.0) == 1.5
    assert silence_limit(0.5, 10.0) == 1.5
    assert abs(silence_limit(0.7, 10.0) - 2.1) < 1e-9
    assert silence_limit(1.0, 10.0) == 2.5
    assert silence_limit(0.2, 4.0) == 1.0


def _dial(addr: str) -> Dial:
    return Dial([addr], "", 1.0, None, None, None)


def test_a_node_that_accepts_and_never_answers_is_found_silent_and_tried_last():
    # A listening socket nobody accepts from: the kernel completes the
    # connect, and Hello is never answered, as with a paused node.
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        addr = "127.0.0.1:%d" % mute.getsockname()[1]

        async def body():
            dial = _dial(addr)
            dial.leader = addr
            silent: "asyncio.Queue[tuple[float, str]]" = asyncio.Queue()
            start = time.monotonic()
            unwatch = watch_node(dial, addr, 0.3, lambda waited, why, cannot_serve: silent.put_nowait((waited, why, cannot_serve)))
            # A second watcher shares the probe.
            also: "asyncio.Queue[float]" = asyncio.Queue()
            unwatch_also = watch_node(dial, addr, 0.3, lambda waited, why, cannot_serve: also.put_nowait(waited))
            assert len(dial.probes) == 1
            waited, why, cannot_serve = await asyncio.wait_for(silent.get(), 5)
            assert not cannot_serve
            assert waited >= 0.3 and time.monotonic() - start < 3
            assert why == f"left the liveness probe unanswered for {waited:.3g} s", why
            assert await asyncio.wait_for(also.get(), 1) == waited
            assert dial.suspects() == [addr] and dial.leader is None
            unwatch()
            assert dial.probes, "the other watcher still uses the probe"
            probe = dial.probes[addr]
            unwatch_also()
            assert not dial.probes and probe.stopped
            await asyncio.sleep(0)
            assert probe._task.done()

        run(body())


def test_a_node_found_silent_is_tried_last_until_it_answers_again(start_cluster):
    # A list names a cluster's nodes (a single server in one is refused:
    # test_aio.py); a cluster of one will do.
    cluster = start_cluster(1)
    live = cluster.addrs[cluster.leader()]
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        silent = "127.0.0.1:%d" % mute.getsockname()[1]

        async def body():
            dial = Dial([silent, live], "", 2.0, None, None, None)
            dial.suspect(silent, True)
            start = time.monotonic()
            est = await establish(dial, 0, asyncio.get_running_loop().time() + 2.0, persist=False)
            # Not first: it would have taken its share (1 s) before the server.
            assert est.addr == live and time.monotonic() - start < 0.5
            est.stream.transport.abort()
            dial.suspect(silent, False)
            assert dial.suspects() == []

        run(body())


def test_a_refused_probe_is_no_silence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % s.getsockname()[1]  # bound, not listening: refused

        async def body():
            dial = _dial(addr)
            calls = []
            unwatch = watch_node(dial, addr, 0.2, lambda waited, why, cannot_serve: calls.append(why))
            await asyncio.sleep(1.0)
            assert calls == [] and dial.suspects() == []
            unwatch()

        run(body())


def test_a_waiting_lock_keeps_its_place_through_a_leader_paused_longer_than_the_ttl(start_cluster):
    # The waiter's only request on the paused leader is its Lock, which
    # holds back every answer behind it: only the probe can tell that the
    # node went silent. Without it the waiter's session would expire on the
    # new leader a TTL after the stall began, and its place in line with it.
    cluster = start_cluster(3)  # default TTL (10 s), election timeout 500 ms
    old = cluster.leader()
    others = [a for i, a in enumerate(cluster.addrs) if i != old]

    async def body():
        holder_events, waiter_events = Events(), Events()
        holder = await dlock.aio.connect(cluster.servers, on_event=holder_events)
        waiter = await dlock.aio.connect(cluster.servers, on_event=waiter_events)
        assert holder.addr == waiter.addr == cluster.addrs[old]
        ttl = waiter.limits.session_timeout
        assert ttl == 10.0 and waiter.limits.election_timeout == 0.5
        lock = await holder.lock("k")
        waiting = asyncio.ensure_future(waiter.lock("k"))
        while (await holder.inspect("k"))[0].waiters != 1:
            await asyncio.sleep(0.01)
        cluster.pause(old)
        stalled = asyncio.get_running_loop().time()
        try:
            new = await new_leader(cluster, old)
            elected = asyncio.get_running_loop().time()
            async with dlock.aio.connect(others) as third:
                # Cluster time stands still between two leaders (the new one
                # goes on from the last entry it applied), so a session that
                # nobody kept alive after the stall ends at most a TTL after
                # the new leader took over: past that, a session nobody
                # resumed has expired, and its Lock has left the line.
                await asyncio.sleep(max(0.0, elected + ttl + 1.0 - asyncio.get_running_loop().time()))
                assert asyncio.get_running_loop().time() - stalled > ttl
                [info] = await third.inspect("k")
                assert third.addr == cluster.addrs[new]
                assert (info.fence, info.waiters) == (lock.fence, 1), info
                assert not waiting.done()
        finally:
            cluster.resume(old)
        for events in (holder_events, waiter_events):
            assert any(isinstance(e, Reconnecting) and e.addr == cluster.addrs[old] for e in events.seen)
            assert any(isinstance(e, Resumed) and e.addr == cluster.addrs[new] for e in events.seen)
        assert not lock.lost.is_set(), lock.lost_reason
        await lock.unlock()
        granted = await asyncio.wait_for(waiting, LIMIT)
        assert granted.fence > lock.fence
        await granted.unlock()
        await holder.close()
        await waiter.close()

    run(body())
