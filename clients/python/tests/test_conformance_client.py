"""tools/conformance_client.py keeps its contract: `held FENCE`, then
`released` (exit 0) on a line on stdin; `lost REASON` (exit 1) when the lock
is lost; a message on stderr and exit 2 for anything else."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict

from conftest import LIMIT

TOOL = Path(__file__).resolve().parents[1] / "tools" / "conformance_client.py"


def _start(python: str, servers: str, key: str, tmp_path: Path) -> "subprocess.Popen[str]":
    env: Dict[str, Any] = dict(os.environ, DLOCK_SERVER=servers)
    env.pop("DLOCK_TOKEN", None)
    # Run from elsewhere: only the installed package can be imported.
    return subprocess.Popen(
        [python, str(TOOL), key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def _line(proc: "subprocess.Popen[str]") -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().rstrip("\n")


def test_held_then_released_on_a_line_then_the_next_one_gets_a_higher_fence(start_cluster, python, tmp_path):
    cluster = start_cluster(3)
    cluster.leader()
    servers = cluster.servers  # the comma-separated list
    first = _start(python, servers, "conf", tmp_path)
    held = _line(first)
    assert held.startswith("held "), (held, first.stderr.read() if first.poll() is not None else "")
    fence = int(held.split()[1])
    second = _start(python, servers, "conf", tmp_path)
    try:
        assert first.stdin is not None
        first.stdin.write("\n")
        first.stdin.flush()
        assert _line(first) == "released"
        assert first.wait(LIMIT) == 0
        held2 = _line(second)
        assert held2.startswith("held ") and int(held2.split()[1]) > fence, held2
        # A closed stdin releases too.
        out, err = second.communicate(timeout=LIMIT)
        assert (out, second.returncode) == ("released\n", 0), err
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_lost_lock_is_reported_at_once_with_exit_1(start_server, python, tmp_path):
    srv = start_server()
    proc = _start(python, srv.addr, "conf", tmp_path)
    try:
        held = _line(proc)
        assert held.startswith("held "), held
        srv.kill()  # the connection ends, and the lock with it
        assert proc.wait(LIMIT) == 1
        assert proc.stdout is not None
        lost = proc.stdout.read()
        assert lost.startswith("lost ") and lost.count("\n") == 1 and len(lost.split()) > 1, lost
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_errors_go_to_stderr_with_exit_2(python, tmp_path):
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        proc = _start(python, addr, "conf", tmp_path)
        out, err = proc.communicate(timeout=LIMIT)
    assert (proc.returncode, out) == (2, ""), err
    assert addr in err
    proc = _start(python, "not an address", "conf", tmp_path)
    out, err = proc.communicate(timeout=LIMIT)
    assert (proc.returncode, out) == (2, "") and err
    usage = subprocess.run([python, str(TOOL)], capture_output=True, text=True, timeout=LIMIT, cwd=tmp_path)
    assert (usage.returncode, usage.stdout) == (2, "") and "usage" in usage.stderr


def test_two_workers_of_one_client_take_turns(start_server, python, tmp_path):
    # `--turns N KEY`, as the kit's check_turns reads it.
    srv = start_server()
    env: Dict[str, Any] = dict(os.environ, DLOCK_SERVER=srv.addr)
    env.pop("DLOCK_TOKEN", None)
    done = subprocess.run(
        [python, str(TOOL), "--turns", "5", "turns"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=LIMIT, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert len(lines) == 20, done.stdout
    enters, leaves = lines[0::2], lines[1::2]
    assert all(e[0] == "enter" and l[0] == "leave" and e[1:] == l[1:] for e, l in zip(enters, leaves)), done.stdout
    fences = [int(e[2]) for e in enters]
    assert fences == sorted(set(fences)), "fences rise"
    assert sorted(e[1] for e in enters) == ["1"] * 5 + ["2"] * 5


def test_turns_report_an_error_with_exit_1(python, tmp_path):
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        env: Dict[str, Any] = dict(os.environ, DLOCK_SERVER=addr)
        done = subprocess.run(
            [python, str(TOOL), "--turns", "2", "turns"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=LIMIT, env=env, cwd=tmp_path,
        )
    assert done.returncode == 1 and done.stdout.startswith("error ") and done.stdout.count("\n") == 1, done.stdout
