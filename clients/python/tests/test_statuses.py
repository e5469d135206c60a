"""Every ResponseStatus, provoked for real and seen as the exception the client raises.

Statuses a correct client never causes (General, Version, InvalidType,
FrameTooLarge from the server) are provoked with raw frames, which also
checks the framing from the outside.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from typing import Callable, Dict

import pytest

import dlock.aio
from dlock import AccessDenied, NotHeld, ServerError, Status, Timeout
from dlock.errors import from_response
from dlock._proto import dlock_pb2 as pb
from dlock.framing import FrameDecoder, encode
from conftest import LIMIT, run

COVERED: Dict[Status, Callable[..., None]] = {}


def covers(status: Status):
    def mark(test):
        COVERED[status] = test
        return test

    return mark


def raw_exchange(addr: str, payload: bytes, answers: int):
    """Sends `payload` on a new connection; returns the first `answers` responses."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=LIMIT) as sock:
        sock.sendall(payload)
        dec = FrameDecoder()
        out = []
        while len(out) < answers:
            data = sock.recv(65536)
            assert data, f"connection closed after {len(out)} answers"
            out += [pb.Response.FromString(b) for b in dec.feed(data)]
        return out


def expect_server_error(addr: str, status: Status, call):
    async def body():
        async with dlock.aio.connect(addr) as client:
            with pytest.raises(ServerError) as e:
                await call(client)
            assert e.value.status == status
            assert e.value.text, "every refusal explains itself"

    run(body())


@covers(Status.Ok)
def test_ok(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            assert await client.ping() >= 0

    run(body())


@covers(Status.General)
def test_general_for_an_undecodable_body_keeps_the_connection(server):
    garbage = b"\xff\xff\xff"
    ping = encode(pb.Request(version=2, id=9, type=pb.Ping))
    bad, good = raw_exchange(server.addr, struct.pack(">I", len(garbage)) + garbage + ping, 2)
    assert (bad.status, bad.request_id) == (Status.General, 0) and bad.error_text
    assert (good.status, good.request_id) == (Status.Ok, 9)


@covers(Status.Version)
def test_version(server):
    [resp] = raw_exchange(server.addr, encode(pb.Request(version=3, id=1, type=pb.Ping)), 1)
    assert (resp.status, resp.request_id) == (Status.Version, 1)


@covers(Status.InvalidType)
def test_invalid_type(server):
    expect_server_error(server.addr, Status.InvalidType, lambda c: c._call(pb.Invalid, None))


@covers(Status.AccessDenied)
def test_access_denied_without_or_with_a_wrong_token(start_server, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens"
    tokens.write_text("right\n")
    server = start_server("--token-file", str(tokens))
    monkeypatch.delenv("DLOCK_TOKEN", raising=False)
    for token in (None, "wrong"):
        with pytest.raises(AccessDenied) as e:
            run(dlock.aio.connect(server.addr, token=token))
        assert e.value.status == Status.AccessDenied

    async def body():
        async with dlock.aio.connect(server.addr, token="right") as client:
            await client.ping()

    run(body())


@covers(Status.ShuttingDown)
def test_shutting_down_answers_a_waiting_lock(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            await a.lock("k")
            waiting = asyncio.ensure_future(b.lock("k"))
            while (await a.inspect("k"))[0].waiters != 1:
                await asyncio.sleep(0.005)
            server.proc.terminate()
            with pytest.raises(ServerError) as e:
                await waiting
            assert e.value.status == Status.ShuttingDown

    run(body())
    assert server.proc.wait(timeout=LIMIT) == 0


@covers(Status.LimitReached)
def test_limit_reached(start_server):
    # Five connections: a, b and c, and one each for the Locks of b and c
    # that wait (a Lock that must wait does so on a connection of its own).
    server = start_server("--max-waiters", "1", "--max-connections", "5")

    async def body():
        a, b, c = [await dlock.aio.connect(server.addr) for _ in range(3)]
        await a.lock("k")
        first = asyncio.ensure_future(b.lock("k"))
        while (await a.inspect("k"))[0].waiters != 1:
            await asyncio.sleep(0.005)
        with pytest.raises(ServerError) as e:
            await c.lock("k", wait=5)
        assert e.value.status == Status.LimitReached
        # A sixth connection is turned away with request_id 0.
        with pytest.raises(ServerError) as e:
            await dlock.aio.connect(server.addr)
        assert e.value.status == Status.LimitReached
        first.cancel()
        for client in (a, b, c):
            await client.close()

    run(body())


@covers(Status.FrameTooLarge)
def test_frame_too_large_from_the_server_and_refused_by_the_client(start_server):
    server = start_server("--max-frame", "64")
    big = encode(pb.Request(version=2, id=5, type=pb.Lock, lock=pb.RequestLock(keys=["k" * 100])))
    ping = encode(pb.Request(version=2, id=4, type=pb.Ping))
    before, resp = raw_exchange(server.addr, ping + big, 2)
    assert (before.status, before.request_id) == (Status.Ok, 4)
    assert (resp.status, resp.request_id) == (Status.FrameTooLarge, 0)
    # The client refuses to send it (it would end the connection and its locks).
    expect_server_error(server.addr, Status.FrameTooLarge, lambda c: c.lock("k" * 100))


def test_a_request_over_the_servers_frame_limit_says_it_was_not_sent(start_server):
    # The client refuses it itself, from the server's limits: the message
    # must not say the server answered, nor contradict "(not sent)".
    server = start_server("--max-frame", "64")

    async def body():
        async with dlock.aio.connect(server.addr) as client:
            with pytest.raises(ServerError) as e:
                await client.lock("k" * 100)
            said = re.fullmatch(r"request of (\d+) bytes exceeds the server's frame limit of 64 bytes \(not sent\)", str(e.value))
            assert said and int(said.group(1)) > 100, str(e.value)
            assert e.value.status == Status.FrameTooLarge and e.value.sent is False
            # The connection, and what it holds, goes on.
            assert await client.ping() >= 0

    run(body())


@covers(Status.TooManyKeys)
def test_too_many_keys(start_server):
    server = start_server("--max-keys", "2")
    expect_server_error(server.addr, Status.TooManyKeys, lambda c: c.lock(["a", "b", "c"]))


@covers(Status.InvalidKey)
def test_invalid_key(server):
    expect_server_error(server.addr, Status.InvalidKey, lambda c: c.lock(""))


@covers(Status.NoKeys)
def test_no_keys(server):
    expect_server_error(server.addr, Status.NoKeys, lambda c: c.lock([]))


@covers(Status.InvalidArgument)
def test_invalid_argument(start_server):
    server = start_server("--max-lease", "1s")
    expect_server_error(server.addr, Status.InvalidArgument, lambda c: c.lock("k", lease=10))


@covers(Status.AcquireTimeout)
def test_acquire_timeout(server):
    async def body():
        async with dlock.aio.connect(server.addr) as a, dlock.aio.connect(server.addr) as b:
            await a.lock("k")
            with pytest.raises(Timeout) as e:
                await b.lock("k", wait=0.01)
            assert e.value.status == Status.AcquireTimeout and e.value.busy == ["k"]

    run(body())


@covers(Status.NotHeld)
def test_not_held(server):
    async def body():
        async with dlock.aio.connect(server.addr) as client:
            with pytest.raises(NotHeld) as e:
                await client.unlock(["a", "b"], fence=1)
            assert e.value.status == Status.NotHeld and e.value.keys == ["a", "b"]

    run(body())


@covers(Status.UnknownSession)
def test_unknown_session_for_a_session_not_opened_here(server):
    lock = pb.Request(version=2, id=3, type=pb.Lock, session=987654321, lock=pb.RequestLock(keys=["k"], try_lock=True))
    (resp,) = raw_exchange(server.addr, encode(lock), 1)
    assert (resp.status, resp.request_id) == (Status.UnknownSession, 3)
    assert "987654321" in resp.error_text


@covers(Status.ModeConflict)
@covers(Status.LimitMismatch)
def test_mode_conflict_and_limit_mismatch_name_the_keys(server):
    # The Python client does not take shared locks yet: raw frames on one
    # connection, which holds "pool" shared under a limit of 2.
    def lock(rid, shared, limit):
        body = pb.RequestLock(keys=["pool"], try_lock=True, shared_keys=["pool"] if shared else [], limit=limit)
        return encode(pb.Request(version=2, id=rid, type=pb.Lock, lock=body))

    first, upgrade, other_limit = raw_exchange(server.addr, lock(1, True, 2) + lock(2, False, 0) + lock(3, True, 3), 3)
    assert first.status == Status.Ok and first.fence > 0
    assert (upgrade.status, list(upgrade.keys)) == (Status.ModeConflict, ["pool"]) and upgrade.error_text
    assert (other_limit.status, list(other_limit.keys)) == (Status.LimitMismatch, ["pool"]) and other_limit.error_text


@covers(Status.Queued)
@covers(Status.UnknownTicket)
def test_queued_enqueue_and_unknown_ticket(server):
    # The Python client has no enqueue/wait yet: raw frames, with "tq" held
    # on another connection so the Enqueue waits in line.
    host, port = server.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=LIMIT) as holder:
        take = pb.Request(version=2, id=1, type=pb.Lock, lock=pb.RequestLock(keys=["tq"], try_lock=True))
        holder.sendall(encode(take))
        dec, got = FrameDecoder(), []
        while not got:
            data = holder.recv(65536)
            assert data, "holder connection closed"
            got += [pb.Response.FromString(b) for b in dec.feed(data)]
        assert got[0].status == Status.Ok
        enqueue = pb.Request(version=2, id=2, type=pb.Enqueue, lock=pb.RequestLock(keys=["tq"]))
        stray = pb.Request(version=2, id=3, type=pb.Wait, lock=pb.RequestLock(ticket=987654321))
        queued, unknown = raw_exchange(server.addr, encode(enqueue) + encode(stray), 2)
    assert (queued.status, queued.place, queued.fence) == (Status.Queued, 0, 0) and queued.ticket > 0
    assert unknown.status == Status.UnknownTicket and "987654321" in unknown.error_text


@covers(Status.ValueTooLarge)
def test_value_too_large(server):
    # The Python client does not set values yet: a raw Lock with one byte over the limit.
    body = pb.RequestLock(keys=["k"], try_lock=True, value=b"v" * 1025)
    (resp,) = raw_exchange(server.addr, encode(pb.Request(version=2, id=6, type=pb.Lock, lock=body)), 1)
    assert (resp.status, resp.request_id) == (Status.ValueTooLarge, 6) and "1024" in resp.error_text


@covers(Status.WatchLimit)
def test_watch_limit(start_server):
    server = start_server("--max-watchers", "0")
    body = pb.RequestLock(keys=["k"], wait_micro=1000)
    (resp,) = raw_exchange(server.addr, encode(pb.Request(version=2, id=7, type=pb.Watch, lock=body)), 1)
    assert (resp.status, resp.request_id) == (Status.WatchLimit, 7) and "max-watchers" in resp.error_text


@covers(Status.NotLeader)
@covers(Status.Unavailable)
def test_cluster_statuses_become_server_errors_that_keep_their_text():
    # A single server never sends these; the cluster tests send them for real.
    for status in (Status.NotLeader, Status.Unavailable):
        resp = pb.Response(version=2, request_id=1, status=int(status), error_text="why", leader_addr="127.0.0.1:7437")
        err = from_response(resp)
        assert isinstance(err, ServerError) and err.status == status and "why" in str(err)


def test_every_status_of_the_proto_has_a_test():
    assert set(COVERED) == set(Status)
