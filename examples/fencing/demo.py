"""Why fencing tokens matter: a paused worker wakes up after its lease ran out and writes.

    cargo run --release -p dlock-server &        # or DLOCK_SERVER=host:port
    pip install ./clients/python
    python examples/fencing/demo.py

Runs the same story twice, once against a store that checks fences and once
against one that does not:

1. Worker A takes the lock (a 1 s lease), reads the row, and is paused
   before it writes.
2. Its lease runs out on the server; worker B gets the lock with a higher
   fence, reads the row, appends "B" and writes.
3. A is continued and writes what it prepared before the pause.

With fencing the store refuses A (its fence is older than B's) and B's
update survives. Without it A's stale write replaces B's: a lost update.
Exit code 0 when both turn out that way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import store

HERE = Path(__file__).resolve().parent
LIMIT = 30  # seconds any one step may take before the demo gives up


def worker(name: str, db: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "worker.py"), name, db, *flags],
        stdout=subprocess.PIPE,
        text=True,
    )


def story(db: str, fencing: bool) -> list:
    flags = [] if fencing else ["--no-fencing"]
    a = worker("A", db, "--pause-before-write", *flags)
    assert a.stdout is not None
    for line in a.stdout:
        print("  " + line, end="")
        if "pausing" in line:
            break
    else:
        sys.exit(f"worker A ended before pausing (exit {a.wait()})")
    # Wait until A is really stopped, not just about to stop.
    _, status = os.waitpid(a.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        sys.exit("worker A did not stop")
    try:
        b = worker("B", db, *flags)
        out, _ = b.communicate(timeout=LIMIT)
        print("  " + out.replace("\n", "\n  ").rstrip(" "), end="")
        if b.returncode != 0:
            sys.exit(f"worker B's write was not accepted (exit {b.returncode})")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out, _ = a.communicate(timeout=LIMIT)
    print("  " + out.replace("\n", "\n  ").rstrip(" "), end="")
    history, fence = store.read(db)
    print(f"  the row: written by {history}, last fence {fence}")
    return history


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        print("With fencing (UPDATE ... WHERE fence <= ?):")
        db = os.path.join(tmp, "fenced.db")
        store.create(db)
        fenced = story(db, fencing=True)
        print("Without fencing (UPDATE ... WHERE id = 1):")
        db = os.path.join(tmp, "unfenced.db")
        store.create(db)
        unfenced = story(db, fencing=False)
    ok = fenced == ["B"] and unfenced == ["A"]
    print(
        "As expected: the store refused the paused worker; without the fence check B's update was lost."
        if ok
        else f"Unexpected: with fencing {fenced}, without {unfenced}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
