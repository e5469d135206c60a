#!/usr/bin/env python3
"""The Python client's program for the cross-language conformance kit.

    DLOCK_SERVER=HOST:PORT[,HOST:PORT...] conformance_client.py KEY
    DLOCK_SERVER=HOST:PORT[,HOST:PORT...] conformance_client.py --turns N KEY

Takes KEY exclusively, without a lease, waiting as long as it takes; prints
`held FENCE` on stdout; keeps the lock until a line arrives on stdin (or
stdin closes); then releases it, prints `released` and exits 0. If the lock
is lost meanwhile (the client reports it lost, or in jeopardy: its safety
deadline passed without an answer that proves the session alive), prints
`lost REASON` and exits 1 at once. Any other error: a message on stderr,
exit 2. Only stdout carries the protocol above; the "dlock" logger writes
to stderr.

With `--turns N`: two workers (tasks) share ONE client; each, N times,
takes KEY exclusively without a lease (waiting as long as it takes), prints
`enter W FENCE` (W: 1 or 2), holds it for 20 ms, prints `leave W FENCE` and
unlocks. Exit 0 once both are done; on any error `error TEXT` on stdout and
exit 1. The kit checks that the two take turns, as two processes would.

Uses only the installed `dlock` package (its asyncio client); DLOCK_TOKEN
and DLOCK_TLS_* apply as to any client.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import List

import dlock
import dlock.aio


#: How long a worker of `--turns` holds the key each time.
TURN_HOLD = 0.02

_out = threading.Lock()


def _print(line: str) -> None:
    # Each line whole: the kit reads them as they come.
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _watch_stdin(loop: asyncio.AbstractEventLoop, done: asyncio.Event) -> None:
    """Sets `done` when a line arrives on stdin or stdin closes. Reads the
    file descriptor itself, on a daemon thread: no lock of sys.stdin is held
    when the program exits while it still waits."""

    def read() -> None:
        try:
            while True:
                chunk = os.read(0, 4096)
                if not chunk or b"\n" in chunk:
                    break
        except OSError:
            pass  # no usable stdin counts as closed
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=read, name="stdin", daemon=True).start()


async def run(key: str) -> int:
    try:
        client = await dlock.aio.connect()
    except (dlock.DlockError, ValueError, OSError) as e:
        print(f"conformance_client: cannot connect: {e}", file=sys.stderr)
        return 2
    try:
        try:
            lock = await client.lock(key)
        except (dlock.DlockError, ValueError) as e:
            print(f"conformance_client: cannot take {key!r}: {e}", file=sys.stderr)
            return 2
        _print(f"held {lock.fence}")
        release = asyncio.Event()
        _watch_stdin(asyncio.get_running_loop(), release)
        lost = asyncio.ensure_future(lock.lost.wait())
        asked = asyncio.ensure_future(release.wait())
        await asyncio.wait({lost, asked}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        asked.cancel()
        try:
            lock.check()  # reads the clock: a deadline whose timer is late counts too
        except dlock.LockLost:
            pass
        if lock.lost_reason is not None:
            _print(f"lost {_one_line(lock.lost_reason)}")
            return 1
        try:
            await lock.unlock()
        except dlock.NotHeld as e:
            _print(f"lost {_one_line(f'not held any more when released ({e})')}")
            return 1
        except dlock.DlockError as e:
            if lock.lost_reason is not None:
                _print(f"lost {_one_line(lock.lost_reason)}")
                return 1
            print(f"conformance_client: cannot release {key!r}: {e}", file=sys.stderr)
            return 2
        _print("released")
        return 0
    finally:
        await client.close()


async def turns(n: int, key: str) -> int:
    """`--turns N KEY`: two workers of one client take KEY N times each."""
    try:
        client = await dlock.aio.connect()
    except (dlock.DlockError, ValueError, OSError) as e:
        _print(f"error {_one_line(f'cannot connect: {e}')}")
        return 1

    async def worker(w: int) -> None:
        for _ in range(n):
            lock = await client.lock(key)
            _print(f"enter {w} {lock.fence}")
            await asyncio.sleep(TURN_HOLD)
            lock.check()  # lost meanwhile: an error, not a turn
            _print(f"leave {w} {lock.fence}")
            await lock.unlock()

    try:
        workers: List["asyncio.Future[None]"] = [asyncio.ensure_future(worker(w)) for w in (1, 2)]
        done, pending = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        for task in done:
            e = task.exception()
            if e is not None:
                _print(f"error {_one_line(f'{type(e).__name__}: {e}')}")
                return 1
        return 0
    finally:
        await client.close()


def main(argv: "list[str]") -> int:
    args = argv[1:]
    if len(args) == 3 and args[0] == "--turns" and args[1].isdigit() and args[2]:
        try:
            return asyncio.run(turns(int(args[1]), args[2]))
        except BaseException as e:  # noqa: BLE001 - the contract: any error is `error TEXT`, exit 1
            _print(f"error {_one_line(f'{type(e).__name__}: {e}')}")
            return 1
    if len(args) != 1 or not args[0]:
        print(
            "usage: conformance_client.py KEY | --turns N KEY   (DLOCK_SERVER names the nodes)",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(run(args[0]))
    except KeyboardInterrupt:
        return 2
    except Exception as e:  # noqa: BLE001 - the contract: any other error is exit 2
        print(f"conformance_client: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
