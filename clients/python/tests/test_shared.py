"""Shared locks and semaphores from Python, against a real server."""

from __future__ import annotations

import asyncio

import pytest

import dlock
import dlock.aio
from dlock import ServerError, Status, Timeout
from conftest import run


def test_readers_share_a_key_and_a_writer_waits_for_both(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b, dlock.aio.connect(
            server.addr
        ) as w:
            r1 = await a.lock("config", shared=True, wait=5)
            r2 = await b.lock("config", shared=True, wait=5)
            assert r2.fence > r1.fence
            [info] = await w.inspect("config")
            assert info.shared and info.limit == 0
            assert sorted(h.fence for h in info.holders) == [r1.fence, r2.fence]
            assert not any(h.held_by_caller for h in info.holders)
            with pytest.raises(Timeout):
                await w.lock("config", wait=0)
            writer = asyncio.ensure_future(w.lock("config", wait=5))
            # Asked on another connection: answers come in request order, so
            # w's would wait behind its own Lock.
            while (await a.inspect("config"))[0].waiters != 1:
                await asyncio.sleep(0.005)
            await r1.unlock()
            assert not writer.done()
            await r2.unlock()
            held = await writer
            [info] = await a.inspect("config")
            assert not info.shared and info.holders == () and info.fence == held.fence > r2.fence
            await held.unlock()

    run(body())


def test_modes_mix_per_key_and_a_semaphore_admits_its_limit(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b, dlock.aio.connect(
            server.addr
        ) as c:
            # Exclusive on deploy/web, shared on config, in one request.
            mixed = await a.lock(["deploy/web", "config"], shared=["config"], wait=5)
            reader = await b.lock("config", shared=True, wait=0)
            with pytest.raises(Timeout):
                await b.lock("deploy/web", wait=0)
            await reader.unlock()
            await mixed.unlock()

            s1 = await a.lock("pool", shared=True, limit=2, wait=0)
            s2 = await b.lock("pool", shared=True, limit=2, wait=0)
            assert await c.try_lock("pool", shared=True, limit=2) is None
            with pytest.raises(ServerError) as e:
                await c.lock("pool", shared=True, limit=3, wait=0)
            assert e.value.status == Status.LimitMismatch
            [info] = await c.inspect("pool")
            assert info.limit == 2 and len(info.holders) == 2
            await s1.unlock()
            s3 = await c.lock("pool", shared=True, limit=2, wait=5)
            await s2.unlock()
            await s3.unlock()

    run(body())


def test_bad_sharing_arguments_are_refused_before_sending(server):
    with dlock.Client(server.addr) as client:
        with pytest.raises(ValueError, match="not among the keys"):
            client.lock("a", shared=["b"])
        with pytest.raises(ValueError, match="needs shared keys"):
            client.lock("a", limit=2)
        with pytest.raises(ValueError, match="negative"):
            client.lock("a", shared=True, limit=-1)
        # The sync client passes the modes through.
        with client.lock("a", shared=True, wait=5) as lock:
            [info] = client.inspect("a")
            assert info.shared and info.holders[0].fence == lock.fence and info.holders[0].held_by_caller


def test_holders_the_server_left_out_are_counted():
    # The server leaves holders out only past 4 MiB of them (the Rust
    # server tests provoke it); here, that the count reaches the caller.
    from dlock._proto import dlock_pb2 as pb
    from dlock.types import KeyInfo

    info = KeyInfo.from_proto(
        pb.KeyInfo(
            key="pool",
            fence=90,
            shared=True,
            holders=[pb.KeyHolder(fence=3), pb.KeyHolder(fence=90)],
            holders_omitted=4000,
        )
    )
    assert [h.fence for h in info.holders] == [3, 90]
    assert info.holders_omitted == 4000
    assert KeyInfo.from_proto(pb.KeyInfo(key="free")).holders_omitted == 0
