"""docs/CLIENTS.md's Python example, run as written so the page cannot rot.

The block after the `lock_run.py` marker is saved as lock_run.py beside a
dlock_pb2.py generated from proto/dlock.proto (with the pinned grpcio-tools,
as the page says), then run against a real server.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest

import dlock
from conftest import LIMIT, REPO

# grpcio-tools (requirements-dev.txt) generates dlock_pb2.py. Without it the
# page cannot be checked: skipped on a developer's machine, a failure in CI.
if not os.environ.get("CI"):
    pytest.importorskip("grpc_tools", reason="needs grpcio-tools from requirements-dev.txt")


@pytest.fixture
def example(tmp_path):
    page = (REPO / "docs" / "CLIENTS.md").read_text()
    match = re.search(r"<!-- lock_run\.py:[^\n]*-->\n```python\n(.*?)\n```", page, re.S)
    assert match, "docs/CLIENTS.md lost its lock_run.py block"
    (tmp_path / "lock_run.py").write_text(match.group(1))
    from grpc_tools import protoc

    assert protoc.main(["protoc", f"-I{REPO / 'proto'}", f"--python_out={tmp_path}", str(REPO / "proto" / "dlock.proto")]) == 0
    return tmp_path


# What the command sees: its fence in the environment, and the key held under it.
CHILD = textwrap.dedent(
    """
    import os, sys, dlock
    with dlock.Client() as client:
        [info] = client.inspect("docs/example")
    print(os.environ["DLOCK_FENCE"], info.fence, file=sys.stderr)
    sys.exit(7)
    """
)


def test_the_python_example_locks_runs_and_unlocks(server, example, python):
    env = dict(os.environ, DLOCK_SERVER=server.addr)
    done = subprocess.run(
        [python, "lock_run.py", "docs/example", python, "-c", CHILD],
        cwd=example, env=env, capture_output=True, text=True, timeout=LIMIT,
    )
    assert done.returncode == 7, done.stderr
    given, held = done.stderr.split()
    assert given == held and int(given) > 0
    with dlock.Client(server.addr) as client:
        assert client.inspect("docs/example")[0].fence == 0


def test_the_python_example_reports_a_refusal_by_its_status(server, example, python):
    env = dict(os.environ, DLOCK_SERVER=server.addr)
    done = subprocess.run(
        [python, "lock_run.py", "", "true"], cwd=example, env=env, capture_output=True, text=True, timeout=LIMIT
    )
    assert done.returncode == 70 and "InvalidKey" in done.stderr, done.stderr
