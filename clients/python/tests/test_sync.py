"""The blocking client: the same behaviour through `with`, and across processes."""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time

import pytest

import dlock
from conftest import LIMIT

WORKER = textwrap.dedent(
    """
    import os, sys, dlock
    counter, inside, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with dlock.Client() as client:
        for _ in range(rounds):
            with client.lock("counter", wait=60) as lock:
                # O_EXCL fails if another process is inside at the same time.
                fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                with open(counter) as f:
                    n = int(f.read())
                with open(counter, "w") as f:
                    f.write(str(n + 1))
                os.close(fd)
                os.unlink(inside)
    """
)


def test_processes_take_turns_under_one_lock(server, python, tmp_path, monkeypatch):
    counter = tmp_path / "counter"
    counter.write_text("0")
    inside = tmp_path / "inside"
    monkeypatch.setenv("DLOCK_SERVER", server.addr)
    procs, rounds = 4, 25
    workers = [
        subprocess.Popen([python, "-c", WORKER, str(counter), str(inside), str(rounds)], stderr=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    for w in workers:
        _, err = w.communicate(timeout=LIMIT * 2)
        assert w.returncode == 0, err
    assert int(counter.read_text()) == procs * rounds


def test_with_a_lock_unlocks_on_leaving(server):
    with dlock.Client(server.addr) as a, dlock.Client(server.addr) as b:
        with a.lock("jobs/nightly", wait=30, lease=None) as lock:
            assert lock.fence > 0 and lock.keys == ("jobs/nightly",) and lock.lease is None
            assert not lock.lost.is_set()
            assert b.try_lock("jobs/nightly") is None
            with pytest.raises(dlock.Timeout) as e:
                b.lock("jobs/nightly", wait=0.01)
            assert e.value.busy == ["jobs/nightly"]
        assert b.inspect("jobs/nightly")[0].fence == 0
        again = b.try_lock(["jobs/nightly", "other"], lease=5)
        assert again is not None and again.fence > lock.fence
        again.unlock()
        assert b.stats().held_keys == 0


def test_an_exception_in_the_block_unlocks_and_propagates(server):
    with dlock.Client(server.addr) as client:
        with pytest.raises(ZeroDivisionError):
            with client.lock("k"):
                1 / 0
        assert client.inspect("k")[0].fence == 0


def test_threads_with_a_client_each_exclude_each_other(server):
    inside = []
    errors = []

    def work():
        try:
            with dlock.Client(server.addr) as client:
                for _ in range(20):
                    with client.lock("shared", wait=30):
                        inside.append(1)
                        assert len(inside) == 1
                        inside.pop()
        except Exception as e:  # reported below, with its cause
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIMIT)
    assert not errors


def test_a_key_taken_twice_on_one_client_waits_for_the_first_lock(server):
    # Each lock is an owner of its own: the second waits as another
    # process's would, and the first stays held.
    with dlock.Client(server.addr) as client:
        first = client.lock("k")
        assert client.try_lock("k") is None
        with pytest.raises(dlock.Timeout):
            client.lock("k", wait=0)
        got: "list[dlock.Lock]" = []
        second = threading.Thread(target=lambda: got.append(client.lock("k", wait=LIMIT)))
        second.start()
        deadline = time.monotonic() + LIMIT
        while client.inspect("k")[0].waiters != 1:
            assert time.monotonic() < deadline, "the second lock never queued"
            time.sleep(0.005)
        assert not first.lost.is_set() and not got
        first.unlock()
        second.join(LIMIT)
        assert got and got[0].fence > first.fence and not first.lost.is_set()
        got[0].unlock()


def test_a_lost_lease_is_seen_and_leaving_raises_lock_lost(server):
    with dlock.Client(server.addr) as a, dlock.Client(server.addr) as b:
        with pytest.raises(dlock.LockLost, match="not renewed"):
            with a.lock("lease", lease=0.2, renew=False) as lock:
                assert lock.lost.wait(LIMIT)
                with pytest.raises(dlock.LockLost):
                    lock.check()
        taken = b.lock("lease", wait=5)
        assert taken.fence > lock.fence
        taken.unlock()


def test_a_lease_is_renewed_while_the_script_works(server):
    with dlock.Client(server.addr) as a, dlock.Client(server.addr) as b:
        with a.lock("long-job", lease=0.6) as lock:
            with pytest.raises(dlock.Timeout):
                b.lock("long-job", wait=1.5)
            assert not lock.lost.is_set()
        b.lock("long-job", wait=1.0).unlock()


def test_killing_the_server_sets_lost_and_closed(server):
    client = dlock.Client(server.addr)
    lock = client.lock("doomed")
    server.kill()
    assert lock.lost.wait(LIMIT) and client.closed.wait(LIMIT)
    assert "connection lost" in lock.lost_reason
    with pytest.raises(dlock.ConnectionLost):
        client.ping()
    client.close()


def test_unlock_and_renew_by_fence_from_another_client(server):
    with dlock.Client(server.addr) as a:
        lease = a.lock("handover", lease=30)
        fence = lease.fence
    with dlock.Client(server.addr) as b:
        b.renew("handover", fence, 60)
        assert b.inspect("handover")[0].lease_remaining > 30
        b.unlock("handover", fence)
        with pytest.raises(dlock.NotHeld):
            b.unlock("handover", fence)


def test_connect_errors_are_typed(server):
    addr = server.addr
    server.kill()
    with pytest.raises(dlock.ConnectError):
        dlock.Client(addr)
