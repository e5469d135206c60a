"""The Python client against real three-node clusters: leaders paused, deposed and killed."""

from __future__ import annotations

import asyncio

import dlock.aio
from conftest import run

#: The session TTL of the test clusters: a quarter of it is the ping
#: interval, and a deposed leader must be replaced well within it.
TTL = 5.0


def test_a_deposed_leaders_answers_do_not_keep_a_lock_the_cluster_gave_away(start_cluster):
    cluster = start_cluster(3, "--session-ttl", f"{TTL:g}s")
    old = cluster.leader()

    async def body():
        holder = await dlock.aio.connect(cluster.addrs[old])
        assert holder.limits.resumable_sessions and holder.limits.session_timeout == TTL
        lock = await holder.lock("k")
        # The leader stops until the others have elected a new one, then
        # runs again, deposed: it answers the Pings that queued up meanwhile
        # (NotLeader), but keeps nobody's session alive.
        cluster.pause(old)
        try:
            new = await asyncio.get_running_loop().run_in_executor(None, lambda: cluster.leader(other_than=old))
        finally:
            cluster.resume(old)
        async with dlock.aio.connect(cluster.addrs[new]) as other:
            # Granted once the holder's session ran out on the new leader.
            taken = await other.lock("k", wait=3 * TTL)
            # By then the holder must count its lock as lost: check() reads
            # the clock, so this does not depend on which timer ran first.
            lost = lock.lost.is_set() or lock.remaining() <= 0
            assert lost, f"k was granted to another client while the holder's lock was not lost ({lock!r})"
            assert taken.fence > lock.fence
            await taken.unlock()
        await holder.close()

    run(body())
