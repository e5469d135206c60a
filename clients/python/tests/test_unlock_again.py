"""A lease outlives its session: an Unlock that its session could not
send, because the session ended while it moved to another node, is sent
again by fence on a connection opened for it, and the caller is told that
it went through."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import List

import dlock.aio
from dlock import Reconnecting
from dlock._proto import dlock_pb2 as pb
from conftest import LIMIT, FreezableProxy, run


def _end_session(addr: str, session: int) -> List["pb.Response"]:
    """Resumes `session` on a connection of the test's and closes it there,
    as its TTL running out would end it; the two answers."""
    reqs = [
        pb.Request(version=2, id=1, type=pb.OpenSession, session=session),
        pb.Request(version=2, id=2, type=pb.CloseSession, session=session),
    ]
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=LIMIT) as s:
        for req in reqs:
            body = req.SerializeToString()
            s.sendall(struct.pack(">I", len(body)) + body)
        data = b""
        answers: List["pb.Response"] = []
        while len(answers) < len(reqs):
            while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
                chunk = s.recv(65536)
                assert chunk, "the node closed the connection"
                data += chunk
            n = struct.unpack(">I", data[:4])[0]
            answers.append(pb.Response.FromString(data[4 : 4 + n]))
            data = data[4 + n :]
        return answers


def test_a_leases_unlock_queued_while_its_session_moves_is_sent_again_when_the_session_ends(start_cluster):
    cluster = start_cluster(1)
    node = cluster.addrs[0]
    proxy = FreezableProxy(node)

    async def body():
        moving = asyncio.Event()

        def on_event(e: object) -> None:
            if isinstance(e, Reconnecting):
                moving.set()

        async with dlock.aio.connect(node) as other:
            client = await dlock.aio.connect(proxy.addr, on_event=on_event)  # the proxy's connection 0
            try:
                lock = await client.lock("moving", lease=3600)
                # The path breaks and stays cut: the session moves, its
                # resume held in the proxy.
                proxy.freeze(settle=True)
                proxy.reset(0)
                await asyncio.wait_for(moving.wait(), LIMIT)
                unlocking = asyncio.ensure_future(lock.unlock())  # queued: the session has no stream now
                await asyncio.sleep(0)
                answers = await asyncio.get_running_loop().run_in_executor(None, _end_session, node, client.session)
                assert [a.status for a in answers] == [pb.Ok, pb.Ok], answers
                proxy.thaw()  # the resume is answered UnknownSession
                await asyncio.wait_for(unlocking, LIMIT)
                assert (await other.inspect("moving"))[0].fence == 0, "the lease is released"
            finally:
                await client.close()

    try:
        run(body())
    finally:
        proxy.close()
