"""Each lock is an owner of its own: tasks and threads sharing one client
take turns on a key, first come first served, exactly as separate
processes do; unrelated locks stay pipelined on the client's connection.

The turn-taking tests run against one server and a three-node cluster,
with another process taking the same key meanwhile. Every holder records
its fence and, on the system-wide monotonic clock (CLOCK_MONOTONIC, the
same in every process on Linux), when it entered and left; the merged
intervals must not overlap and their fences must rise in that order.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

import pytest

import dlock
import dlock.aio
from dlock import Timeout
from dlock.aio import Election, Queued
from conftest import LIMIT, FreezableProxy, run

#: Workers sharing one client, and the turns each takes.
WORKERS, ROUNDS = 4, 25
#: How long a holder holds: the hold, not a wait of the test.
HOLD = 0.002

#: Another owner in its own process: takes the key in a loop until its
#: stdin closes, printing "enter FENCE T" / "leave FENCE T" (T: the
#: monotonic clock) around each hold.
OTHER = textwrap.dedent(
    """
    import sys, threading, time, dlock
    key, hold = sys.argv[1], float(sys.argv[2])
    stop = threading.Event()

    def until_closed():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_closed, daemon=True).start()
    with dlock.Client() as client:
        print("ready", flush=True)
        while not stop.is_set():
            with client.lock(key) as lock:
                print(f"enter {lock.fence} {time.monotonic()!r}", flush=True)
                time.sleep(hold)
                print(f"leave {lock.fence} {time.monotonic()!r}", flush=True)
    """
)


@dataclass
class Hold:
    who: str
    fence: int
    enter: float
    leave: float


class Register:
    """What a fenced store checks of its writers: one at a time, fences
    that only go up. `enter` tests and sets the busy flag atomically (one
    event loop, or a lock for threads)."""

    def __init__(self) -> None:
        self._busy = threading.Lock()
        self._last = 0
        self.holds: List[Hold] = []

    def enter(self, who: str, fence: int) -> float:
        assert self._busy.acquire(blocking=False), f"{who} got fence {fence} while another worker of its client held the key"
        assert fence > self._last, f"{who} got fence {fence} after {self._last}"
        self._last = fence
        return time.monotonic()

    def leave(self, who: str, fence: int, entered: float) -> None:
        self.holds.append(Hold(who, fence, entered, time.monotonic()))
        self._busy.release()


class OtherProcess:
    """`OTHER` running against `servers`; its holds once it has stopped."""

    def __init__(self, python: str, servers: str, key: str) -> None:
        env: Dict[str, Any] = dict(os.environ, DLOCK_SERVER=servers)
        env.pop("DLOCK_TOKEN", None)
        self.proc = subprocess.Popen(
            [python, "-c", OTHER, key, str(HOLD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: List[str] = []
        self._ready = threading.Event()
        # Read as it is written: a pipe left unread would stall the process.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self._ready.set()
            else:
                self.lines.append(line.split())
        self._ready.set()

    def wait_ready(self) -> None:
        assert self._ready.wait(LIMIT), "the other process never connected"
        assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""

    def stop(self) -> List[Hold]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(LIMIT)
        self._reader.join(LIMIT)
        assert self.proc.stderr is not None
        assert self.proc.returncode == 0, self.proc.stderr.read()
        holds: List[Hold] = []
        entered: Optional[List[str]] = None
        for words in self.lines:
            if words[0] == "enter":
                assert entered is None, f"the other process entered twice: {entered}, {words}"
                entered = words
            else:
                assert entered is not None and words[0] == "leave" and words[1] == entered[1], words
                holds.append(Hold("other process", int(words[1]), float(entered[2]), float(words[2])))
                entered = None
        assert entered is None, "the other process stopped while holding"
        return holds

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_turns(holds: List[Hold], workers: int) -> None:
    """No two holds overlap, and fences rise in grant order."""
    holds = sorted(holds, key=lambda h: h.enter)
    for before, after in zip(holds, holds[1:]):
        assert after.enter >= before.leave, f"{after} entered before {before} left"
        assert after.fence > before.fence, f"fences fell in grant order: {before}, then {after}"
    mine = [h for h in holds if h.who != "other process"]
    assert len(mine) == workers * ROUNDS
    assert len(holds) > len(mine), "the other process never got a turn"


@pytest.fixture(params=["one server", "a three-node cluster"])
def servers(request: Any, start_server: Any, start_cluster: Any) -> str:
    """The addresses to connect to, for each kind of deployment."""
    if request.param == "one server":
        return start_server().addr
    cluster = start_cluster(3)
    cluster.leader()
    return cluster.servers


@pytest.fixture
def other_process(python: str, servers: str) -> Iterator[OtherProcess]:
    other = OtherProcess(python, servers, "turns")
    other.wait_ready()
    yield other
    other.kill()


def test_tasks_sharing_an_asyncio_client_take_turns_with_each_other_and_another_process(servers, other_process):
    register = Register()

    async def worker(client: dlock.aio.Client, who: str) -> None:
        for _ in range(ROUNDS):
            async with client.lock("turns") as lock:
                entered = register.enter(who, lock.fence)
                await asyncio.sleep(HOLD)
                register.leave(who, lock.fence, entered)

    async def body():
        async with dlock.aio.connect(servers) as client:
            await asyncio.gather(*(worker(client, f"task {i}") for i in range(WORKERS)))

    run(body())
    check_turns(register.holds + other_process.stop(), WORKERS)


def test_threads_sharing_a_blocking_client_take_turns_with_each_other_and_another_process(servers, other_process):
    register = Register()
    errors: List[BaseException] = []

    def worker(client: dlock.Client, who: str) -> None:
        try:
            for _ in range(ROUNDS):
                with client.lock("turns") as lock:
                    entered = register.enter(who, lock.fence)
                    time.sleep(HOLD)
                    register.leave(who, lock.fence, entered)
        except BaseException as e:  # reported below, with its cause
            errors.append(e)

    with dlock.Client(servers) as client:
        threads = [threading.Thread(target=worker, args=(client, f"thread {i}")) for i in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LIMIT)
        assert not any(t.is_alive() for t in threads), "a worker thread is still running"
    if errors:
        raise errors[0]
    check_turns(register.holds + other_process.stop(), WORKERS)


async def _waiters(client: dlock.aio.Client, key: str, n: int) -> None:
    deadline = asyncio.get_running_loop().time() + LIMIT
    while (await client.inspect(key))[0].waiters != n:
        assert asyncio.get_running_loop().time() < deadline, f"{key} never had {n} waiters"
        await asyncio.sleep(0.005)


async def _grant_in_proxy(proxy: FreezableProxy, other: dlock.aio.Client, held: Any, key: str) -> int:
    """Freezes `proxy` and has `other` let go of `key`: the server grants
    the lease waiting for it behind the proxy, and the grant waits there.
    Returns its fence."""
    proxy.freeze(settle=True)
    await held.unlock()
    await _waiters(other, key, 0)
    granted = (await other.inspect(key))[0].fence
    assert granted > held.fence
    return granted


async def _closed_with_a_grant_held(client: dlock.aio.Client, proxy: FreezableProxy, waiting: Any, key: str,
                                    other: dlock.aio.Client) -> None:
    """Closes `client` with a grant held in the frozen `proxy`: what waits
    (`waiting`) fails as before (ConnectionLost), and once close() returns
    the late lease was released, so `other` takes `key` within a wait far
    shorter than the lease."""
    closing = asyncio.ensure_future(client.close())
    await asyncio.sleep(0)  # close() has ended what it ends (the FIN waits in the proxy)
    with pytest.raises(dlock.ConnectionLost):
        await asyncio.wait_for(waiting, LIMIT)
    proxy.thaw()
    await asyncio.wait_for(closing, LIMIT)
    lock = await other.lock(key, wait=5)  # Timeout while the late lease holds the key
    await lock.unlock()


def test_a_second_task_of_one_client_queues_behind_the_first_in_fifo_order(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            first = await client.lock("fifo")
            assert await client.try_lock("fifo") is None, "a key this client holds is busy for its other locks"
            with pytest.raises(Timeout):
                await client.lock("fifo", wait=0.05)
            second = asyncio.ensure_future(client.lock("fifo"))
            await _waiters(client, "fifo", 1)
            # The first task releases and asks again at once: it goes behind.
            await first.unlock()
            again = asyncio.ensure_future(client.lock("fifo"))
            second_lock = await asyncio.wait_for(second, LIMIT)
            await _waiters(client, "fifo", 1)
            assert not first.lost.is_set() and second_lock.fence > first.fence
            await second_lock.unlock()
            again_lock = await asyncio.wait_for(again, LIMIT)
            assert again_lock.fence > second_lock.fence and not second_lock.lost.is_set()
            await again_lock.unlock()

    run(body())


def test_a_waiting_lock_holds_back_no_other_call_of_its_client(server):
    async def body():
        async with dlock.aio.connect(server.addr) as other, dlock.aio.connect(server.addr) as client:
            hot = await other.lock("hot")
            waiting = asyncio.ensure_future(client.lock("hot"))
            await _waiters(other, "hot", 1)

            async def own(i: int) -> None:
                for _ in range(20):
                    await (await client.lock(f"own-{i}")).unlock()
                await client.ping()

            await asyncio.wait_for(asyncio.gather(*(own(i) for i in range(20))), LIMIT / 3)
            assert not waiting.done(), "the waiting lock still waits"
            await hot.unlock()
            await (await asyncio.wait_for(waiting, LIMIT)).unlock()

    run(body())


def test_unrelated_locks_of_many_tasks_share_the_one_connection(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            locks = await asyncio.gather(*(client.lock(f"own/{i}") for i in range(200)))
            assert (await client.stats()).connections == 1
            await asyncio.gather(*(lock.unlock() for lock in locks))
            assert (await client.stats()).held_keys == 0

    run(body())


def test_a_cancelled_wait_leaves_the_line_at_once(server):
    async def body():
        async with dlock.aio.connect(server.addr) as holder, dlock.aio.connect(server.addr) as client:
            held = await holder.lock("cancel")
            waiting = asyncio.ensure_future(client.lock("cancel", lease=30))
            await _waiters(holder, "cancel", 1)
            waiting.cancel()
            # Withdrawn, not left in line until a grant it would release.
            await _waiters(holder, "cancel", 0)
            await held.unlock()
            assert (await holder.inspect("cancel"))[0].fence == 0
            again = await client.lock("cancel", wait=5)
            await again.unlock()

    run(body())


def test_shared_locks_of_one_client_are_holders_of_their_own(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            s1 = await client.lock("pool", shared=True, limit=2, wait=5)
            s2 = await client.lock("pool", shared=True, limit=2, wait=5)
            [info] = await client.inspect("pool")
            assert sorted(h.fence for h in info.holders) == sorted([s1.fence, s2.fence]) and s1.fence != s2.fence
            # The semaphore is full: a third holder of this client waits.
            assert await client.try_lock("pool", shared=True, limit=2) is None
            third = asyncio.ensure_future(client.lock("pool", shared=True, limit=2))
            await _waiters(client, "pool", 1)
            await s1.unlock()
            s3 = await asyncio.wait_for(third, LIMIT)
            # A writer on a key this client reads waits for the readers
            # instead of being refused (ModeConflict).
            writer = asyncio.ensure_future(client.lock("pool"))
            await _waiters(client, "pool", 1)
            await s2.unlock()
            assert not writer.done()
            await s3.unlock()
            w = await asyncio.wait_for(writer, LIMIT)
            assert w.fence > s3.fence and not any(x.lost.is_set() for x in (s1, s2, s3))
            await w.unlock()

    run(body())


def test_an_enqueue_on_a_key_its_client_holds_waits_in_line(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            held = await client.lock("q")
            queued = await client.enqueue("q", wait=LIMIT)
            assert isinstance(queued, Queued) and queued.place == 0
            await held.unlock()
            got = await asyncio.wait_for(queued.wait(), LIMIT)
            assert got.fence > held.fence and not held.lost.is_set()
            # And the other way round: a lock behind the enqueued one.
            later = asyncio.ensure_future(client.lock("q"))
            await _waiters(client, "q", 1)
            await got.unlock()
            await (await asyncio.wait_for(later, LIMIT)).unlock()

    run(body())


def test_two_campaigns_on_one_client_lead_in_turn(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            first = await Election(client, "svc").campaign("a")
            second = asyncio.ensure_future(Election(client, "svc").campaign("b"))
            await _waiters(client, "svc", 1)
            assert not first.lost.is_set()
            await first.resign()
            lead = await asyncio.wait_for(second, LIMIT)
            assert lead.fence > first.fence and (await Election(client, "svc").leader()).value == b"b"
            await lead.resign()

    run(body())


def test_a_lock_taken_aside_is_lost_with_its_client(server):
    async def body():
        async with dlock.aio.connect(server.addr) as other:
            client = await dlock.aio.connect(server.addr)
            hot = await other.lock("aside")
            waiting = asyncio.ensure_future(client.lock("aside"))
            await _waiters(other, "aside", 1)
            await hot.unlock()
            lock = await asyncio.wait_for(waiting, LIMIT)
            await client.close()
            assert lock.lost.is_set() and "closed by the client" in lock.lost_reason
            # Closed cleanly: the server releases it, and every connection
            # the client opened ends (the server sees the close a moment later).
            deadline = asyncio.get_running_loop().time() + LIMIT
            while (await other.stats()).connections != 1 or (await other.inspect("aside"))[0].fence != 0:
                assert asyncio.get_running_loop().time() < deadline, "a connection of the closed client stayed open"
                await asyncio.sleep(0.01)

    run(body())


def test_killing_the_server_reports_a_lock_taken_aside_lost(server):
    async def body():
        client = await dlock.aio.connect(server.addr)
        first = await client.lock("doomed")
        waiting = asyncio.ensure_future(client.lock("doomed"))
        await _waiters(client, "doomed", 1)
        await first.unlock()
        lock = await asyncio.wait_for(waiting, LIMIT)
        server.kill()
        await asyncio.wait_for(lock.lost.wait(), LIMIT)
        assert lock.lost_reason.startswith("connection lost")
        await asyncio.wait_for(client.closed.wait(), LIMIT)

    run(body())


def test_a_lock_on_a_connection_of_its_own_outlives_the_clients_connection(server):
    # Each lock is an owner of its own: the client's shared connection
    # ending (reset here, by a proxy) ends what it holds, not a Lock waiting
    # or held on a connection of its own, as in the other clients. Closing
    # the client then closes that one too.
    proxy = FreezableProxy(server.addr)

    async def body():
        async with dlock.aio.connect(server.addr) as other:
            client = await dlock.aio.connect(proxy.addr)  # the proxy's connection 0
            first = await client.lock("k")
            waiting = asyncio.ensure_future(client.lock("k"))  # claimed: connection 1
            await _waiters(other, "k", 1)
            proxy.reset(0)
            await asyncio.wait_for(first.lost.wait(), LIMIT)
            assert client.closed.is_set()
            # The server released `first` with its connection, and grants the
            # Lock that still waits on its own.
            lock = await asyncio.wait_for(waiting, LIMIT)
            assert not lock.lost.is_set() and lock.fence > first.fence
            assert (await other.inspect("k"))[0].fence == lock.fence
            await client.close()
            assert lock.lost.is_set() and "closed by the client" in lock.lost_reason
            deadline = asyncio.get_running_loop().time() + LIMIT
            while (await other.inspect("k"))[0].fence != 0:
                assert asyncio.get_running_loop().time() < deadline, "the closed client's lock stayed held"
                await asyncio.sleep(0.01)

    try:
        run(body())
    finally:
        proxy.close()


def test_a_lease_granted_as_its_lock_is_cancelled_is_released_after_the_clients_connection_ended(server):
    # A waiting Lock with a lease, on a connection of its own, is cancelled
    # just as its grant crosses the cancel, after the client's shared
    # connection ended: the grant is released by fence on a connection
    # opened for it, not left to hold the key until the lease runs out.
    proxy = FreezableProxy(server.addr)

    async def body():
        async with dlock.aio.connect(server.addr) as other:
            held = await other.lock("late")
            client = await dlock.aio.connect(proxy.addr)  # the proxy's connection 0
            try:
                waiting = asyncio.ensure_future(client.lock("late", lease=3600))  # tried on 0, waits on 1
                await _waiters(other, "late", 1)
                proxy.reset(0)
                await asyncio.wait_for(client.closed.wait(), LIMIT)
                granted = await _grant_in_proxy(proxy, other, held, "late")
                waiting.cancel()
                await asyncio.sleep(0)  # the cancel half-closes connection 1
                proxy.thaw()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                deadline = asyncio.get_running_loop().time() + LIMIT
                while (await other.inspect("late"))[0].fence == granted:
                    assert asyncio.get_running_loop().time() < deadline, "the late lease stayed held"
                    await asyncio.sleep(0.01)
                assert (await other.inspect("late"))[0].fence == 0
            finally:
                await client.close()

    try:
        run(body())
    finally:
        proxy.close()


def test_a_lease_granted_as_its_lock_is_cancelled_is_released_before_close_returns(server):
    # As above, but the client is closed while the grant is on its way:
    # close() does not end the cancelled Lock's connection, which still
    # reads the grant, and returns only once the lease was released by
    # fence on a connection opened for it.
    proxy = FreezableProxy(server.addr)

    async def body():
        async with dlock.aio.connect(server.addr) as other:
            held = await other.lock("late-close")
            client = await dlock.aio.connect(proxy.addr)  # the proxy's connection 0
            waiting = asyncio.ensure_future(client.lock("late-close", lease=3600))  # tried on 0, waits on 1
            await _waiters(other, "late-close", 1)
            await _grant_in_proxy(proxy, other, held, "late-close")
            waiting.cancel()
            await asyncio.sleep(0)  # the cancel half-closes connection 1 (the FIN waits in the proxy)
            closing = asyncio.ensure_future(client.close())
            await asyncio.sleep(0)  # close() has ended what it ends
            proxy.thaw()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.wait_for(closing, LIMIT)
            assert (await other.inspect("late-close"))[0].fence == 0, "the late lease is released once close() returned"

    try:
        run(body())
    finally:
        proxy.close()


def test_a_lock_cancelled_before_its_answer_leaves_its_key_neither_held_nor_claimed(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            taking = asyncio.ensure_future(client.lock("k"))
            await asyncio.sleep(0)  # sent, not yet answered
            taking.cancel()
            # The grant that follows is released, and the key no longer
            # counts as this client's: the next lock is taken on the shared
            # connection, not on one of its own.
            await client.ping()
            assert (await client.inspect("k"))[0].fence == 0
            lock = await client.lock("k", wait=0)
            assert (await client.stats()).connections == 1
            await lock.unlock()

    run(body())


def test_a_connection_of_its_own_is_kept_for_the_next_lock_that_waits(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            for _ in range(3):
                first = await client.lock("again")
                second = asyncio.ensure_future(client.lock("again"))
                await _waiters(client, "again", 1)
                await first.unlock()
                await (await asyncio.wait_for(second, LIMIT)).unlock()
                # The client's connection and the one the waiting lock used.
                assert (await client.stats()).connections == 2

    run(body())


def test_a_lease_granted_as_its_client_is_closed_is_released_before_close_returns(server):
    # A Lock with a lease still waits as its client is closed, and its grant
    # crosses the close: close() half-closes the Lock's connection and reads
    # on, as a cancel does, so the late lease is released by fence before
    # close() returns; the Lock fails as before (ConnectionLost).
    proxy = FreezableProxy(server.addr)

    async def body():
        async with dlock.aio.connect(server.addr) as other:
            held = await other.lock("late-close-waiting")
            client = await dlock.aio.connect(proxy.addr)  # the proxy's connection 0
            waiting = asyncio.ensure_future(client.lock("late-close-waiting", lease=3600))  # tried on 0, waits on 1
            await _waiters(other, "late-close-waiting", 1)
            await _grant_in_proxy(proxy, other, held, "late-close-waiting")
            await _closed_with_a_grant_held(client, proxy, waiting, "late-close-waiting", other)

    try:
        run(body())
    finally:
        proxy.close()


def test_a_lease_granted_on_the_clients_connection_as_it_is_closed_is_released_before_close_returns(server):
    # A Queued's wait() with a lease waits on the client's own connection as
    # the client is closed, and its grant crosses the close: close()
    # half-closes that connection and reads on, as it does a waiting Lock's
    # own, so the late lease is released by fence before close() returns;
    # the wait() fails as before (ConnectionLost).
    proxy = FreezableProxy(server.addr)

    async def body():
        async with dlock.aio.connect(server.addr) as other:
            held = await other.lock("late-close-shared")
            client = await dlock.aio.connect(proxy.addr)  # the proxy's connection 0
            queued = await client.enqueue("late-close-shared", lease=3600)
            assert isinstance(queued, dlock.aio.Queued) and queued._client is client
            waiting = asyncio.ensure_future(queued.wait())  # on connection 0
            await asyncio.sleep(0)  # the Wait is written
            # The answer to its Wait waits in the proxy.
            await _grant_in_proxy(proxy, other, held, "late-close-shared")
            await _closed_with_a_grant_held(client, proxy, waiting, "late-close-shared", other)

    try:
        run(body())
    finally:
        proxy.close()
