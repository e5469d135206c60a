"""A worker: takes the lock as a lease, reads the row, appends its name, writes it back with its fence.

    python worker.py NAME DB [--lease SECONDS] [--pause-before-write] [--no-fencing]

With --pause-before-write it stops itself (SIGSTOP) after its last check
that the lock is still held and before writing: the worst moment for a GC
pause, a swapped-out page or a VM migration. Its lease is no longer renewed
while it is stopped (the renewing thread stops with it), so the lease runs
out and someone else gets the lock. When it is continued it writes at once,
with the fence of a lock it no longer holds.

Exit code: 0 if the store accepted the write, 3 if it refused it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import dlock
import store

KEY = "examples/fencing/register"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("db")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--pause-before-write", action="store_true")
    parser.add_argument("--no-fencing", action="store_true")
    args = parser.parse_args()

    def say(text: str) -> None:
        print(f"{args.name}: {text}", flush=True)

    accepted = False
    with dlock.Client() as client:  # DLOCK_SERVER, DLOCK_TOKEN
        try:
            with client.lock(KEY, wait=30, lease=args.lease) as lock:
                say(f"locked with fence {lock.fence} (lease {args.lease} s, renewed in the background)")
                history, _ = store.read(args.db)
                lock.check()  # still ours: raises LockLost otherwise
                if args.pause_before_write:
                    say("pausing before the write (SIGSTOP)")
                    os.kill(os.getpid(), signal.SIGSTOP)
                    say("continued; writing")
                accepted = store.write(args.db, history + [args.name], lock.fence, fencing=not args.no_fencing)
                say(f"write with fence {lock.fence} " + ("accepted" if accepted else "REFUSED: a newer fence has written"))
        except dlock.LockLost as e:
            # The client noticed too, but only after the write was sent:
            # that is why the store has to check the fence itself.
            say(f"on leaving: {e}")
    return 0 if accepted else 3


if __name__ == "__main__":
    sys.exit(main())
