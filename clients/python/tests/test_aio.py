"""The asyncio client against a real server: locking, pipelining, leases, loss."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import dlock
import dlock.aio
from dlock import ConnectionLost, LockLost, NotHeld, Timeout
from conftest import run


def test_a_lock_is_exclusive_and_its_fence_grows(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            async with a.lock("jobs/nightly", wait=5) as first:
                assert first.keys == ("jobs/nightly",)
                with pytest.raises(Timeout) as busy:
                    await b.lock("jobs/nightly", wait=0)
                assert busy.value.busy == ["jobs/nightly"]
                assert await b.try_lock("jobs/nightly") is None
                [info] = await b.inspect("jobs/nightly")
                assert info.fence == first.fence and not info.held_by_caller and info.lease_remaining is None
            second = await b.lock("jobs/nightly", wait=5)
            assert second.fence > first.fence
            await second.unlock()
            assert (await a.stats()).held_keys == 0

    run(body())


def test_a_wait_limit_runs_out_with_the_busy_keys(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            held = await a.lock("b")
            with pytest.raises(Timeout) as e:
                await b.lock(["a", "b"], wait=0.05)
            assert e.value.busy == ["b"]
            await held.unlock()

    run(body())


def test_a_multi_key_lock_takes_all_keys_or_none(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            held_b = await a.lock("b")
            both = asyncio.ensure_future(b.lock(["a", "b"]))
            while (await a.inspect("b"))[0].waiters != 1:
                await asyncio.sleep(0.005)
            [info_a] = await a.inspect("a")
            assert info_a.fence == 0, "no partial hold of 'a' while 'b' is busy"
            await held_b.unlock()
            lock = await both
            infos = await a.inspect(["a", "b"])
            assert [i.fence for i in infos] == [lock.fence, lock.fence]
            await lock.unlock()

    run(body())


def test_waiters_are_granted_in_arrival_order(server):
    async def body():
        holder = await dlock.aio.connect(server.addr)
        waiters = [await dlock.aio.connect(server.addr) for _ in range(5)]
        first = await holder.lock("fifo")
        order = []

        async def take(i, client):
            lock = await client.lock("fifo", wait=10)
            order.append(i)
            await lock.unlock()

        tasks = []
        for i, client in enumerate(waiters):
            tasks.append(asyncio.ensure_future(take(i, client)))
            # Explicit order: the next waiter starts only once this one queues.
            while (await holder.inspect("fifo"))[0].waiters != i + 1:
                await asyncio.sleep(0.005)
        await first.unlock()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4]
        for client in [holder, *waiters]:
            await client.close()

    run(body())


def test_a_thousand_requests_in_flight_on_one_connection_are_answered_in_order(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            assert client.limits.max_pipeline >= 1000
            peak = 0
            flush = client._conn._flush

            def counting_flush():
                nonlocal peak
                peak = max(peak, len(client._conn._pending))
                flush()

            client._conn._flush = counting_flush
            keys = [f"pipe/{i}" for i in range(1000)]
            locks = await asyncio.gather(*(client.lock(k) for k in keys))
            assert peak == 1000, "all 1000 Lock requests were written before any answer"
            # The server runs them in the order sent: fences grow with it.
            fences = [lock.fence for lock in locks]
            assert fences == sorted(fences) and len(set(fences)) == 1000
            assert [lock.keys[0] for lock in locks] == keys
            # Mixed requests, each matched to its own answer.
            results = await asyncio.gather(
                *(lock.unlock() for lock in locks[:500]),
                *(client.inspect(k) for k in keys[500:]),
                client.ping(),
            )
            assert [r[0].fence for r in results[500:1000]] == fences[500:]
            assert (await client.stats()).held_keys == 500

    run(body())


def test_a_lease_is_reported_lost_before_the_server_gives_it_away(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            lease = await a.lock("lease", lease=0.3, renew=False)
            [info] = await b.inspect("lease")
            assert info.lease_remaining is not None and 0 < info.lease_remaining <= 0.3
            later = await b.lock("lease", wait=5)
            # By the time the server gives the key away, the client counts
            # the lease as lost. check() reads the clock, so this does not
            # depend on which of the two callbacks the loop ran first.
            with pytest.raises(LockLost, match="not renewed"):
                lease.check()
            assert lease.lost.is_set()
            assert later.fence > lease.fence
            with pytest.raises(NotHeld):
                await lease.unlock()
            await later.unlock()

    run(body())


def test_a_lease_is_renewed_in_the_background(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            lease = await a.lock("renewed", lease=0.6)
            # Two and a half lease lengths pass while b waits; renewal (every
            # 0.2 s, with 0.4 s to spare on a slow machine) keeps it held.
            with pytest.raises(Timeout):
                await b.lock("renewed", wait=1.5)
            assert not lease.lost.is_set()
            await lease.unlock()
            await (await b.lock("renewed", wait=1.0)).unlock()

    run(body())


def test_renewing_to_a_shorter_lease_renews_on_the_shorter_schedule(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            lease = await a.lock("shortened", lease=30)
            await lease.renew(0.6)
            # Two and a half of the new lease pass while b waits: renewed
            # every 0.2 s it stays held (the keeper used to sleep until a
            # third of the 30 s lease, long after the 0.6 s one ran out).
            with pytest.raises(Timeout):
                await b.lock("shortened", wait=1.5)
            assert not lease.lost.is_set()
            [info] = await b.inspect("shortened")
            assert info.fence == lease.fence and info.lease_remaining <= 0.6
            await lease.unlock()

    run(body())


def test_a_shorter_lease_counts_from_its_sending_even_when_its_answer_never_comes(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a:
            lease = await a.lock("short", lease=60)
            server.pause()
            try:
                # Sent, but the paused server cannot answer in time: once
                # it runs again it applies it, so the 60 s lease is gone.
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(lease.renew(3), 0.1)
                assert lease.remaining() <= 3
                # Reported lost when the 3 s could run out, not when the
                # keeper would have renewed the 60 s lease.
                await asyncio.wait_for(lease.lost.wait(), 5)
                assert "got no answer" in lease.lost_reason
            finally:
                server.resume()

    run(body())


def test_an_unanswered_renew_of_a_lock_without_a_lease_bounds_its_deadline(server):
    # A Renew makes a lock without a lease a lease. Its answer lost, the
    # server may have applied it: the lock may end with the 1 s lease, not
    # with the connection (rules.Hold; the client used to keep trusting
    # the session timeout).
    async def body():
        async with dlock.aio.connect(server.addr) as a:
            lock = await a.lock("unconfirmed")
            assert lock.remaining() > 1
            server.pause()
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(lock.renew(1), 0.1)
                assert lock.lease is None  # not known to be a lease
                assert lock.remaining() <= 1
                await asyncio.wait_for(lock.lost.wait(), 2)
                assert "got no answer" in lock.lost_reason
            finally:
                server.resume()

    run(body())


def test_a_lease_outlives_its_connection_and_is_released_by_fence(server):
    async def body():
        a = await dlock.aio.connect(server.addr)
        lease = await a.lock("handover", lease=30)
        await a.close()
        assert lease.lost.is_set() and "no longer renewed" in lease.lost_reason
        async with dlock.aio.connect(server.addr) as b:
            [info] = await b.inspect("handover")
            assert info.fence == lease.fence
            await b.renew("handover", lease.fence, 60)
            with pytest.raises(NotHeld) as e:
                await b.unlock("handover", lease.fence + 1)
            assert e.value.keys == ["handover"]
            await b.unlock("handover", lease.fence)
            assert (await b.inspect("handover"))[0].fence == 0

    run(body())


def test_a_lock_without_lease_becomes_a_lease_by_renew(server):
    async def body():
        a = await dlock.aio.connect(server.addr)
        lock = await a.lock("promote")
        await lock.renew(30)
        await a.close()
        async with dlock.aio.connect(server.addr) as b:
            [info] = await b.inspect("promote")
            assert info.fence == lock.fence and info.lease_remaining is not None
            await b.unlock("promote", lock.fence)

    run(body())


def test_killing_the_server_reports_the_lock_lost_and_fails_calls(server):
    async def body():
        client = await dlock.aio.connect(server.addr)
        lock = await client.lock("doomed")
        server.kill()
        await asyncio.wait_for(lock.lost.wait(), 5)
        assert lock.lost_reason.startswith("connection lost")
        assert client.closed.is_set()
        with pytest.raises(ConnectionLost):
            await client.ping()
        with pytest.raises(LockLost):
            async with lock:
                pass

    run(body())


def test_a_server_that_stops_answering_makes_the_lock_lost_within_the_session_timeout(start_server):
    server = start_server("--idle-timeout", "1s")

    async def body():
        # A wide margin: loss is reported 0.3 s before the server could end
        # the session, so a slow CI machine still meets the bound below.
        async with dlock.aio.connect(server.addr, margin=0.3) as client:
            assert client.limits.session_timeout == 1.0
            lock = await client.lock("frozen")
            server.pause()  # the connection stays open; nothing is answered
            try:
                loop = asyncio.get_running_loop()
                start = loop.time()
                await asyncio.wait_for(lock.lost.wait(), 5)
                assert loop.time() - start < 1.0
                assert "no answer from the server" in lock.lost_reason
                assert not client.closed.is_set()
            finally:
                server.resume()

    run(body())


def test_pings_keep_a_quiet_connection_and_its_lock(start_server):
    server = start_server("--idle-timeout", "1s")

    async def body():
        async with dlock.aio.connect(server.addr) as client:
            lock = await client.lock("quiet")
            # The condition under test is time passing: 2.5 idle timeouts.
            await asyncio.sleep(2.5)
            assert not lock.lost.is_set() and not client.closed.is_set()
            await lock.unlock()

    run(body())


def test_a_cancelled_wait_releases_the_grant_that_follows(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            held = await a.lock("cancel")
            waiting = asyncio.ensure_future(b.lock("cancel"))
            while (await a.inspect("cancel"))[0].waiters != 1:
                await asyncio.sleep(0.005)
            waiting.cancel()
            await held.unlock()
            # b's grant (if the server made it) is released by b at once.
            again = await a.lock("cancel", wait=5)
            await again.unlock()

    run(body())


def test_hello_tells_the_limits(start_server):
    server = start_server("--max-keys", "7", "--max-key-len", "9", "--idle-timeout", "2s", "--max-lease", "1h")

    async def body():
        async with dlock.aio.connect(server.addr) as client:
            limits = client.limits
            assert (limits.max_keys, limits.max_key_len, limits.session_timeout, limits.max_lease) == (7, 9, 2.0, 3600.0)
            assert limits.max_frame == 16384 and limits.max_pipeline == 1024

    run(body())


def test_dlock_server_and_dlock_token_come_from_the_environment(start_server, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens"
    tokens.write_text("# ops\nsecret-1\n")
    server = start_server("--token-file", str(tokens))
    monkeypatch.setenv("DLOCK_SERVER", server.addr)
    monkeypatch.setenv("DLOCK_TOKEN", "secret-1")

    async def body():
        async with dlock.aio.connect() as client:
            assert client.addr == server.addr
            await (await client.lock("env")).unlock()

    run(body())


def test_a_list_of_servers_none_of_which_answers_names_each_and_why(monkeypatch):
    monkeypatch.setenv("DLOCK_SERVER", " 127.0.0.1:1, 127.0.0.1:2,,")
    with pytest.raises(dlock.ConnectError) as e:
        run(dlock.aio.connect())
    assert [addr for addr, _ in e.value.attempts] == ["127.0.0.1:1", "127.0.0.1:2"]
    assert all("refused" in why.lower() for _, why in e.value.attempts), e.value.attempts
    assert "127.0.0.1:1: " in str(e.value) and "127.0.0.1:2: " in str(e.value)


def test_a_list_that_leads_to_a_single_server_is_refused(start_server):
    # Two single servers share no locks: given as a list, the client moved
    # to the second when the first was down and locked there, beside a
    # holder of the same key on the first. A list must name one cluster's
    # nodes (src/dial.rs of the Rust client does the same).
    first, second = start_server(), start_server()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = "127.0.0.1:%d" % s.getsockname()[1]  # bound, not listening: refused
        for servers in ([down, second.addr], f"{first.addr},{second.addr}"):
            with pytest.raises(dlock.NotOneCluster) as e:
                run(dlock.aio.connect(servers))
            assert e.value.addr in (first.addr, second.addr)
            text = str(e.value)
            assert f"{e.value.addr} is a single server" in text and "alone" in text, text
            with pytest.raises(dlock.NotOneCluster):
                dlock.Client(servers)
    # One address is a single server's, as always.
    with dlock.Client(second.addr) as alone:
        assert alone.ping() >= 0


def test_a_malformed_server_in_a_list_is_named(monkeypatch):
    with pytest.raises(ValueError, match="'nowhere' is not HOST:PORT"):
        dlock.aio.connect(["127.0.0.1:1", "nowhere"])
    monkeypatch.setenv("DLOCK_SERVER", " , ")
    with pytest.raises(ValueError, match="names no address"):
        dlock.aio.connect()


def test_connecting_to_nothing_is_a_connect_error(server):
    addr = server.addr
    server.kill()
    with pytest.raises(dlock.ConnectError, match=addr):
        run(dlock.aio.connect(addr))


def test_check_reads_the_clock_even_when_the_loop_was_blocked(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            lock = await client.lock("blocked", lease=0.2, renew=False)
            lock.check()
            assert 0 < lock.remaining() <= 0.2
            time.sleep(0.25)  # blocks the loop: no timer can fire, as in a paused process
            assert not lock.lost.is_set()
            with pytest.raises(LockLost, match="not renewed"):
                lock.check()
            assert lock.lost.is_set()

    run(body())


def test_leaving_a_block_whose_lock_was_released_elsewhere_raises_lock_lost(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            with pytest.raises(LockLost, match="not held any more"):
                async with a.lock("stolen", lease=30) as lock:
                    await b.unlock("stolen", lock.fence)

    run(body())


def test_a_server_that_accepts_but_never_answers_fails_connect_in_time(server):
    server.pause()
    try:
        with pytest.raises(dlock.ConnectError, match="no answer to Hello"):
            run(dlock.aio.connect(server.addr, connect_timeout=0.3))
    finally:
        server.resume()


def test_a_lease_granted_after_a_wait_longer_than_the_lease_is_usable(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            held = await a.lock("slow")
            waiting = asyncio.ensure_future(b.lock("slow", lease=0.3, renew=False))
            # Judged when the grant arrives, not when this coroutine gets to
            # look, which on a loaded machine may be after the lease's margin.
            at_grant = {}

            def judge(f: "asyncio.Future[dlock.aio.Lock]") -> None:
                if not f.cancelled() and f.exception() is None:
                    at_grant["lost"] = f.result().lost_reason
                    at_grant["remaining"] = f.result().remaining()

            waiting.add_done_callback(judge)
            while (await a.inspect("slow"))[0].waiters != 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.4)  # the condition under test: a wait longer than the lease
            await held.unlock()
            lock = await waiting
            await asyncio.sleep(0)  # the done callback has run
            assert at_grant["lost"] is None
            assert at_grant["remaining"] > 0.2
            await lock.unlock()

    run(body())
