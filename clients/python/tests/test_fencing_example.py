"""examples/fencing/ runs as its README says: the paused worker is refused when it wakes."""

from __future__ import annotations

import os
import subprocess

from conftest import LIMIT, REPO


def test_the_store_refuses_a_worker_paused_past_its_lease(server, python):
    demo = REPO / "examples" / "fencing" / "demo.py"
    done = subprocess.run(
        [python, str(demo)],
        env=dict(os.environ, DLOCK_SERVER=server.addr),
        capture_output=True, text=True, timeout=LIMIT * 2,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fenced = done.stdout.split("Without fencing")[0]
    assert "A: write with fence" in fenced and "REFUSED" in fenced
    assert "B: write with fence" in fenced and "accepted" in fenced
    assert "the row: written by ['B']" in fenced
    assert "Traceback" not in done.stderr
