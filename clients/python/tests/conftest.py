"""Starts real dlock-server processes for the tests.

The binary is DLOCK_SERVER_BIN, else target/debug/dlock-server of this
checkout (what `cargo test` builds). Each server listens on 127.0.0.1:0 and
the tests read the port it got from its "listening" log line, so no port is
guessed and none can be taken by someone else in between.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Coroutine, Iterator, List, Optional, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVER_BIN = Path(os.environ.get("DLOCK_SERVER_BIN") or REPO / "target" / "debug" / "dlock-server")
# Upper bound for anything a test waits for; a hang fails the test instead of CI.
LIMIT = 30.0

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = LIMIT) -> T:
    """Runs an async test body on a fresh loop, failing it after `timeout`."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Server:
    """One dlock-server process on a loopback port it chose itself."""

    def __init__(self, *flags: str) -> None:
        if not SERVER_BIN.exists():
            pytest.fail(f"{SERVER_BIN} not found: build it with `cargo build -p dlock-server` or set DLOCK_SERVER_BIN")
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--listen", "127.0.0.1:0", "--log-level", "info", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: List[str] = []
        lines: "queue.Queue[Optional[str]]" = queue.Queue()
        # Drains stderr for the server's whole life, so a chatty server never
        # blocks on a full pipe.
        threading.Thread(target=self._drain, args=(lines,), daemon=True).start()
        self.addr = ""
        while not self.addr:
            try:
                line = lines.get(timeout=10)
            except queue.Empty:
                self.kill()
                pytest.fail(f"dlock-server did not say where it listens within 10 s: {self.log}")
            if line is None:
                pytest.fail(f"dlock-server exited before listening: {self.log}")
            match = re.search(r"listening addr=(\S+)", line)
            if match:
                self.addr = match.group(1)

    def _drain(self, lines: "queue.Queue[Optional[str]]") -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            lines.put(line)
        lines.put(None)

    def stop(self) -> int:
        """SIGTERM, then the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        return self.proc.wait(timeout=LIMIT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=LIMIT)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def start_server() -> Iterator[Any]:
    """A factory: start_server(*flags) -> Server, each stopped after the test."""
    started: List[Server] = []

    def start(*flags: str) -> Server:
        server = Server(*flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def server(start_server: Any) -> Server:
    """A server with default flags."""
    return start_server()


@pytest.fixture
def python() -> str:
    """The interpreter running the tests, for child processes."""
    return sys.executable
