"""A node that cannot serve, and the client moving off it (issue 45).

A cluster leader cut off from its peers while its clients still reach it
steps aside within twice the election timeout: it answers requests
`NotLeader` naming no leader, resets the connections of named sessions,
and answers the liveness probe's session-less Ping `Unavailable`, which the
client takes as a silence at once (liveness.py). A node stopping on SIGTERM
steps aside the same way; a client that still gets `ShuttingDown` on a
session treats it as `NotLeader` naming no leader (connection.py).

The first tests use fake nodes (asyncio servers in the test's loop that
answer as a cluster node would, with the statuses under test); the last
ones run real node processes: a leader cut off from its peers through
proxies the test freezes (conftest.PeerLinks), its clients reaching it
directly or through proxies that lose its resets, and a leader stopped
with SIGTERM.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Dict, List, Optional

import pytest

import dlock
import dlock.aio
from dlock import Reconnecting, Resumed
from dlock._proto import dlock_pb2 as pb
from dlock.dial import Dial
from dlock.framing import FrameDecoder, encode
from dlock.liveness import Probe, watch_node
from conftest import LIMIT, FreezableProxy, run
from test_cluster import Events

# -- fake nodes ----------------------------------------------------------

#: The fake nodes' session TTL and election timeout, in seconds.
FAKE_TTL = 6.0
FAKE_ELECTION = 0.3

Handler = Callable[["FakeNode", "pb.Request"], Awaitable[Optional["pb.Response"]]]


class FakeNode:
    """A loopback server that speaks dlock's framing and answers as a
    cluster node does (Hello with resumable sessions, OpenSession, Ping,
    Unlock, CloseSession all Ok), except where `answer` says otherwise:
    given each request, it returns a response (its status and fields; the
    id is filled in), or None for the default. Requests on one connection
    are answered in order, one at a time, as the server does; every one is
    recorded in `requests` as (connection number, request)."""

    def __init__(self, answer: Optional[Handler] = None) -> None:
        self._answer = answer
        self.requests: "List[tuple[int, pb.Request]]" = []
        self.addr = ""
        self._server: Optional[asyncio.AbstractServer] = None
        self._conns = 0
        self._writers: List[asyncio.StreamWriter] = []
        #: Set, new connections are closed at once (the probe takes that
        #: for no silence).
        self.refuse = False

    async def start(self) -> "FakeNode":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.addr = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()

    def of_type(self, rtype: int) -> "List[pb.Request]":
        return [r for _, r in self.requests if r.type == rtype]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        self._conns += 1
        conn = self._conns
        self._writers.append(writer)
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for body in decoder.feed(data):
                    req = pb.Request.FromString(body)
                    self.requests.append((conn, req))
                    resp = await self._answer(self, req) if self._answer is not None else None
                    if resp is None:
                        resp = _default(req)
                    resp.version = 2
                    resp.request_id = req.id
                    writer.write(encode(resp))
        except (ConnectionError, OSError):
            return
        finally:
            writer.transport.abort()


_next_session = [100]


def _default(req: "pb.Request") -> "pb.Response":
    if req.type == pb.Hello:
        resp = pb.Response(status=pb.Ok)
        limits = resp.limits
        limits.session_timeout_micro = int(FAKE_TTL * 1e6)
        limits.max_lease_micro = int(3600e6)
        limits.max_keys = 64
        limits.max_key_len = 256
        limits.max_frame = 1 << 20
        limits.max_pipeline = 64
        limits.resumable_sessions = True
        limits.election_timeout_micro = int(FAKE_ELECTION * 1e6)
        return resp
    if req.type == pb.OpenSession:
        session = req.session
        if not session:
            _next_session[0] += 1
            session = _next_session[0]
        return pb.Response(status=pb.Ok, session=session, session_ttl_micro=int(FAKE_TTL * 1e6))
    if req.type == pb.Lock:
        return pb.Response(status=pb.Ok, fence=1)
    return pb.Response(status=pb.Ok)


def _status(status: int, text: str = "") -> "pb.Response":
    return pb.Response(status=status, error_text=text)  # type: ignore[arg-type]


def test_a_probe_answered_unavailable_finds_the_node_silent_at_once():
    # A leader cut off from its peers answers the probe's session-less Ping
    # Unavailable: its sessions must move now, not when the node has left
    # the probe unanswered for the limit (it never does: it answers).
    async def answer(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Ping:
            return _status(pb.Unavailable, "this node cannot serve: it leads no majority")
        return None

    async def body():
        node = await FakeNode(answer).start()
        dial = Dial([node.addr], "", 1.0, None, None, None)
        dial.leader = node.addr
        limit = 3.0
        silent: "asyncio.Queue[tuple[float, str]]" = asyncio.Queue()
        start = time.monotonic()
        unwatch = watch_node(dial, node.addr, limit, lambda waited, why, cannot_serve: silent.put_nowait((waited, why, cannot_serve)))
        # The first Ping goes a third of the limit after the Hello.
        waited, why, cannot_serve = await asyncio.wait_for(silent.get(), limit)
        assert cannot_serve
        took = time.monotonic() - start
        assert took < limit / 3 + 1.0, f"found after {took:.3g} s, the limit is {limit} s"
        assert waited < 1.0 and "Unavailable" in why and "leads no majority" in why, (waited, why)
        assert dial.suspects() == [node.addr] and dial.leader is None
        assert node.of_type(pb.Ping) and not any(r.session for r in node.of_type(pb.Ping))
        unwatch()
        await node.stop()

    run(body())


@pytest.mark.parametrize("status", [pb.General, pb.LimitReached, pb.NotLeader], ids=pb.ResponseStatus.Name)
def test_a_probe_answered_another_error_is_no_silence(status):
    async def answer(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        return _status(status) if req.type == pb.Ping else None

    async def body():
        node = await FakeNode(answer).start()
        dial = Dial([node.addr], "", 1.0, None, None, None)
        calls: list = []
        unwatch = watch_node(dial, node.addr, 0.6, lambda waited, why, cannot_serve: calls.append(why))
        await asyncio.sleep(1.5)
        assert node.of_type(pb.Ping), "the probe pinged"
        assert calls == [] and dial.suspects() == []
        unwatch()
        await node.stop()

    run(body())


def test_a_connection_on_a_node_that_tells_the_probe_it_cannot_serve_resumes_elsewhere():
    # The client's session connection is on `a`; its probe of `a` is
    # answered Unavailable while the session's own Pings are answered Ok
    # (as a stepped-aside node would, had its reset of the connection been
    # lost): the session moves to `b` at once.
    async def cannot_serve(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Ping and not _on_session(node, req):
            return _status(pb.Unavailable, "cannot serve")
        return None

    async def body():
        a = await FakeNode(cannot_serve).start()
        b = await FakeNode().start()
        events = Events()
        client = await dlock.aio.connect([a.addr, b.addr], on_event=events)
        assert client.addr == a.addr
        session = client.session
        resumed = await events.next(Resumed, limit=5)
        assert resumed.addr == b.addr and resumed.session == session
        [moved] = [e for e in events.seen if isinstance(e, Reconnecting)]
        assert moved.addr == a.addr and "Unavailable" in moved.reason, moved
        assert [r.session for r in b.of_type(pb.OpenSession)] == [session]
        await client.ping()
        assert client.addr == b.addr
        await client.close()
        for node in (a, b):
            await node.stop()

    run(body())


def test_a_silent_probe_leaves_a_connection_that_hears_from_the_node():
    # The probe's Pings go unanswered while the session's own are answered
    # (the probe's connection is slow, not the node): the session stays
    # (rules.gone_silent). The silence limit is 1.5 s.
    never = asyncio.Event()

    async def mute_probe(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Ping and not _on_session(node, req):
            await never.wait()
        return None

    async def body():
        a = await FakeNode(mute_probe).start()
        events = Events()
        client = await dlock.aio.connect([a.addr], on_event=events)
        probe = await _hear_until_the_probe_finds_silence(client, a)
        await client.ping()
        assert not [e for e in events.seen if isinstance(e, Reconnecting)], events.seen
        assert len(a.of_type(pb.OpenSession)) == 1, "the session was resumed"
        await client.close()
        never.set()
        await a.stop()

    run(body())


def test_a_connection_that_outlived_a_silent_probe_goes_once_it_hears_nothing_either():
    # After the probe's first silence, which the busy connection outlives,
    # the node stops answering it and closes every new connection (so the
    # probe reports nothing more): the connection goes a limit (1.5 s)
    # after it last heard, not when its own unanswered Ping tells (half
    # the TTL).
    never = asyncio.Event()
    stalled = False

    async def answer(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        on_session = _on_session(node, req)
        if (req.type == pb.Ping and not on_session) or (stalled and on_session):
            await never.wait()
        return None

    async def body():
        nonlocal stalled
        a = await FakeNode(answer).start()
        events = Events()
        client = await dlock.aio.connect([a.addr], on_event=events)
        probe = await _hear_until_the_probe_finds_silence(client, a)
        stalled, a.refuse = True, True
        moved = await events.next(Reconnecting, limit=LIMIT)
        assert "heard nothing" in moved.reason, moved
        assert probe.silences == 1
        await client.close()
        never.set()
        await a.stop()

    run(body())


async def _hear_until_the_probe_finds_silence(client: dlock.aio.Client, node: FakeNode) -> Probe:
    """Pings every 20 ms, so that the session's connection keeps hearing
    from `node`, until the client's probe of it finds it silent; returns the
    probe. (The probe tells the connections in the same step that counts
    the silence.)"""
    probe = client._conn._dial.probes[node.addr]
    deadline = asyncio.get_running_loop().time() + LIMIT
    while probe.silences == 0:
        assert asyncio.get_running_loop().time() < deadline, "the probe never found the node silent"
        await client.ping()
        await asyncio.sleep(0.02)
    return probe


def _on_session(node: FakeNode, req: "pb.Request") -> bool:
    """Whether `req` came on a connection that opened or resumed a session
    (the probe's never does)."""
    conn = next(c for c, r in reversed(node.requests) if r is req)
    return any(c == conn and r.type == pb.OpenSession for c, r in node.requests)


def test_shutting_down_on_a_session_is_not_an_error_the_request_goes_on_elsewhere():
    # A stopping node answers the client's Lock ShuttingDown (as servers
    # before issue 45 did; today's reset the connection instead). Nothing was
    # done: the session resumes on the next node, which gets the same Lock
    # under the same session and number, and the caller sees only the
    # grant.
    async def stopping(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Lock:
            return _status(pb.ShuttingDown, "the server is shutting down")
        return None

    async def granting(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Lock:
            return pb.Response(status=pb.Ok, fence=7)
        return None

    async def body():
        a = await FakeNode(stopping).start()
        b = await FakeNode(granting).start()
        events = Events()
        client = await dlock.aio.connect([a.addr, b.addr], on_event=events)
        assert client.addr == a.addr
        lock = await asyncio.wait_for(client.lock("k", wait=0), LIMIT)
        assert lock.fence == 7 and client.addr == b.addr
        [on_a], [on_b] = a.of_type(pb.Lock), b.of_type(pb.Lock)
        assert (on_b.session, on_b.seq, list(on_b.lock.keys)) == (client.session, on_a.seq, ["k"])
        assert on_a.session == client.session and on_a.seq == 1
        assert [r.session for r in b.of_type(pb.OpenSession)] == [client.session]
        [moved] = [e for e in events.seen if isinstance(e, Reconnecting)]
        assert moved.addr == a.addr and "shutting down" in moved.reason
        assert any(isinstance(e, Resumed) and e.addr == b.addr for e in events.seen)
        await lock.unlock()
        assert not lock.lost.is_set()
        await client.close()
        for node in (a, b):
            await node.stop()

    run(body())


def test_a_waiting_lock_answered_shutting_down_keeps_its_place_on_the_next_node():
    # The waiter's Lock waits on `a` (on a connection of its own, opened
    # when the first try found the key busy) when `a` stops and answers it
    # ShuttingDown: it waits on in line at `b`, under its session and
    # number, and gets the key there.
    let_go = asyncio.Event()

    async def stopping(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Lock:
            if req.lock.try_lock:
                return pb.Response(status=pb.AcquireTimeout, keys=list(req.lock.keys))
            await asyncio.sleep(0.3)  # in line, until the node stops
            return _status(pb.ShuttingDown, "the server is shutting down")
        return None

    async def granting(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == pb.Lock:
            await let_go.wait()  # the holder lets go
            return pb.Response(status=pb.Ok, fence=9)
        return None

    async def body():
        a = await FakeNode(stopping).start()
        b = await FakeNode(granting).start()
        waiter = await dlock.aio.connect([a.addr, b.addr])
        assert waiter.addr == a.addr
        waiting = asyncio.ensure_future(waiter.lock("k"))
        deadline = asyncio.get_running_loop().time() + 5
        while not b.of_type(pb.Lock):
            assert not waiting.done(), waiting
            assert asyncio.get_running_loop().time() < deadline, "the Lock never went on to b"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not waiting.done(), "the Lock failed or was granted before its time"
        let_go.set()
        lock = await asyncio.wait_for(waiting, LIMIT)
        assert lock.fence == 9
        [tried, in_line] = a.of_type(pb.Lock)
        [sent_again] = b.of_type(pb.Lock)
        assert tried.lock.try_lock and tried.session == waiter.session
        # Waited on a connection of its own, with a session of its own,
        # which went on at b with the Lock under its first number.
        assert not in_line.lock.try_lock and in_line.session not in (0, waiter.session)
        assert (sent_again.session, sent_again.seq, sent_again.lock.try_lock) == (in_line.session, in_line.seq, False)
        assert [r.session for r in b.of_type(pb.OpenSession)] == [in_line.session]
        await lock.unlock()
        await waiter.close()
        for node in (a, b):
            await node.stop()

    run(body())


@pytest.mark.parametrize("refused", [pb.Hello, pb.OpenSession], ids=pb.RequestType.Name)
def test_a_node_answering_the_handshake_shutting_down_is_passed_over(refused):
    async def stopping(node: FakeNode, req: "pb.Request") -> Optional["pb.Response"]:
        if req.type == refused:
            return _status(pb.ShuttingDown, "the server is shutting down")
        return None

    async def body():
        a = await FakeNode(stopping).start()
        b = await FakeNode().start()
        async with dlock.aio.connect([a.addr, b.addr]) as client:
            assert client.addr == b.addr and client.session
            await client.ping()
        # Alone, it is what the connect reports.
        with pytest.raises(dlock.DlockError) as e:
            await dlock.aio.connect([a.addr], connect_timeout=1.0)
        assert "ShuttingDown" in str(e.value)
        for node in (a, b):
            await node.stop()

    run(body())


# -- real nodes ------------------------------------------------------------

#: As dlock-client/tests/leader_steps_aside.rs CUT_OFF_FLAGS: a session TTL
#: of 8 s leaves a client that pings every quarter of it and stops trusting
#: its lock 0.9 TTL after the last answered Ping at least 4 s from the cut
#: to move its session. A leader that goes on answering as one until its
#: commits time out (5 s) costs it its lock; one that steps aside after
#: twice the election timeout (0.6 s) does not.
CUT_OFF_BASE = ("--heartbeat", "100ms", "--election-timeout", "300ms")
CUT_OFF_TTL = 8.0
#: How long the leader is cut off: longer than the TTL.
CUT = 10.0


def _ping_status(addr: str) -> Optional[int]:
    """The status the node at `addr` answers a session-less Ping (the
    clients' liveness probe) with; None without an answer."""
    import kit

    resp = kit.call(addr, pb.Request(version=2, id=1, type=pb.Ping), 2.0)
    return None if resp is None else resp.status


async def _in_thread(fn: Callable[[], object]) -> object:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


async def _seen_by(addrs: List[str], key: str) -> "tuple[int, int]":
    """The key's fence and waiters as a fresh client connected to `addrs`
    alone sees them, retrying until one of them leads."""
    deadline = asyncio.get_running_loop().time() + LIMIT
    while True:
        try:
            async with dlock.aio.connect(addrs, connect_timeout=2.0) as c:
                [info] = await c.inspect(key)
                return info.fence, info.waiters
        except (dlock.DlockError, OSError):
            assert asyncio.get_running_loop().time() < deadline, f"no leader among {addrs}"
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("clients_via", ["direct", "resets_lost"])
def test_a_leader_cut_off_from_its_peers_costs_no_lock_and_no_place_in_line(start_cluster, clients_via):
    # The holder and the waiter (its Lock waiting on a connection of its
    # own) are on the leader when its peer links are cut for longer than
    # the TTL; clients still reach it. It steps aside: it resets their
    # connections and answers their probe Unavailable.
    # direct: the reset alone moves them (as it did before the probe took
    # Unavailable for a silence).
    # resets_lost: they reach the nodes through proxies that swallow a
    # node's resets (a middlebox that lost them): only the probe's
    # Unavailable moves them in time. Before, the waiting Lock's
    # connection, whose answers wait behind the Lock, stayed on the old
    # leader until its session ran out, and the Lock left the line.
    cluster = start_cluster(3, "--session-ttl", f"{CUT_OFF_TTL:g}s", base=CUT_OFF_BASE, peer_links=True)
    first = cluster.leader()
    proxies = (
        [FreezableProxy(a, swallow_resets=True) for a in cluster.addrs] if clients_via == "resets_lost" else []
    )
    # The leader first: a follower's NotLeader would name its real address.
    entry = [p.addr for p in proxies] or list(cluster.addrs)
    entry.insert(0, entry.pop(first))
    timings: Dict[str, float] = {}
    reasons: List[str] = []

    async def body():
        loop = asyncio.get_running_loop()
        holder_events, waiter_events = Events(), Events()
        holder = await dlock.aio.connect(entry, on_event=holder_events)
        waiter = await dlock.aio.connect(entry, on_event=waiter_events)
        assert holder.limits.session_timeout == CUT_OFF_TTL
        lock = await holder.lock("k")
        waiting = asyncio.ensure_future(waiter.lock("k"))
        while (await holder.inspect("k"))[0].waiters != 1:
            await asyncio.sleep(0.01)
        assert holder.addr == waiter.addr == entry[0], "a needless election moved the clients before the cut"
        old = first
        others = [a for i, a in enumerate(cluster.addrs) if i != old]
        # Where the clients may go on: the others, directly or by proxy.
        elsewhere = others + [p.addr for i, p in enumerate(proxies) if i != old]
        assert await _in_thread(lambda: _ping_status(cluster.addrs[old])) == pb.Ok

        # Only the leader's peer links are cut: its client port stays open.
        cluster.links.isolate(old, True)
        cut = loop.time()
        assert await _seen_by(others, "k") == (lock.fence, 1), "after the election"
        timings["elected"] = loop.time() - cut
        # It knows it cannot serve, and tells the probe so.
        while await _in_thread(lambda: _ping_status(cluster.addrs[old])) != pb.Unavailable:
            assert loop.time() - cut < LIMIT, "the cut-off leader never answered the probe Unavailable"
            await asyncio.sleep(0.05)
        for events in (holder_events, waiter_events):
            resumed = await events.next(Resumed, addr_not=entry[0], limit=CUT_OFF_TTL)
            assert resumed.addr in elsewhere
        timings["resumed"] = loop.time() - cut
        await asyncio.sleep(max(0.0, cut + CUT - loop.time()))
        assert await _seen_by(others, "k") == (lock.fence, 1), "a TTL after the cut, both sessions live on"
        assert not lock.lost.is_set(), lock.lost_reason
        assert not waiting.done(), waiting
        await holder.ping()
        assert holder.addr in elsewhere

        # Healed, the old leader follows the one elected without it.
        cluster.links.isolate(old, False)
        while True:
            info = await _in_thread(lambda: cluster.status(old, 1.0))
            if info is not None and info.leader_id not in (0, old + 1):
                break
            assert loop.time() - cut < CUT + LIMIT, f"the healed old leader never followed: {info}"
            await asyncio.sleep(0.05)
        assert not lock.lost.is_set(), lock.lost_reason
        await lock.unlock()
        granted = await asyncio.wait_for(waiting, LIMIT)
        assert granted.fence > lock.fence
        await granted.unlock()
        for name, events in (("holder", holder_events), ("waiter", waiter_events)):
            moves = [e.reason for e in events.seen if isinstance(e, Reconnecting) and e.addr == entry[0]]
            assert moves, f"the {name} never left the old leader"
            if clients_via == "resets_lost":
                assert "Unavailable" in moves[0], f"the {name} moved for another reason: {moves[0]}"
            reasons.append(f"{name}: {moves[0]}")
        await holder.close()
        await waiter.close()

    try:
        run(body(), timeout=CUT + LIMIT)
    finally:
        for p in proxies:
            p.close()
    print(
        f"cut-off leader, clients {clients_via}: elected {timings['elected']:.2f} s, both resumed "
        f"{timings['resumed']:.2f} s after the cut; {reasons}"
    )


def test_a_leader_stopped_with_sigterm_costs_no_lock_and_no_place_in_line(start_cluster):
    ttl = 6.0
    cluster = start_cluster(3, "--session-ttl", f"{ttl:g}s")
    cluster.leader()

    async def body():
        holder_events, waiter_events = Events(), Events()
        holder = await dlock.aio.connect(cluster.servers, on_event=holder_events)
        waiter = await dlock.aio.connect(cluster.servers, on_event=waiter_events)
        lock = await holder.lock("k")
        # The waiter's Lock waits on the leader when it stops: the one
        # request a stopping node used to answer ShuttingDown for certain.
        waiting = asyncio.ensure_future(waiter.lock("k"))
        while (await holder.inspect("k"))[0].waiters != 1:
            await asyncio.sleep(0.01)
        old = cluster.addrs.index(holder.addr)
        others = [a for i, a in enumerate(cluster.addrs) if i != old]
        stopped = asyncio.get_running_loop().time()
        code = await _in_thread(lambda: cluster.terminate(old))
        assert code == 0, f"the leader exits 0 on SIGTERM, not {code}"
        assert await _seen_by(others, "k") == (lock.fence, 1), "after the leader stopped"
        for events in (holder_events, waiter_events):
            await events.next(Resumed, addr_not=cluster.addrs[old], limit=ttl)
        print(f"SIGTERMed leader: both resumed {asyncio.get_running_loop().time() - stopped:.2f} s after the signal")
        assert not waiting.done(), waiting
        await holder.ping()
        assert not lock.lost.is_set(), lock.lost_reason
        await lock.unlock()
        granted = await asyncio.wait_for(waiting, LIMIT)
        assert granted.fence > lock.fence
        await granted.unlock()
        await holder.close()
        await waiter.close()

    run(body())
