"""Starts real dlock-server processes for the tests: single servers and clusters.

The binary is DLOCK_SERVER_BIN, else target/debug/dlock-server of this
checkout (what `cargo test` builds). Each single server listens on
127.0.0.1:0 and the tests read the port it got from its "listening" log
line, so no port is guessed and none can be taken by someone else in
between. A cluster's nodes must know each other's addresses before they
start, so their ports are reserved first (see `_reserve_port`), as
dlock-server/src/testing/nodes.rs does for the Rust tests.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Coroutine, Iterator, List, Optional, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "conformance"))
import kit  # noqa: E402  (the conformance kit: node processes on reserved ports)

from dlock._proto import dlock_pb2 as pb

REPO = Path(__file__).resolve().parents[3]
SERVER_BIN = Path(os.environ.get("DLOCK_SERVER_BIN") or REPO / "target" / "debug" / "dlock-server")
# Upper bound for anything a test waits for; a hang fails the test instead of CI.
LIMIT = 30.0

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = LIMIT) -> T:
    """Runs an async test body on a fresh loop, failing it after `timeout`."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Server:
    """One dlock-server process on a loopback port it chose itself (or on
    `listen`, for a cluster node)."""

    def __init__(self, *flags: str, listen: str = "127.0.0.1:0") -> None:
        if not SERVER_BIN.exists():
            pytest.fail(f"{SERVER_BIN} not found: build it with `cargo build -p dlock-server` or set DLOCK_SERVER_BIN")
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--listen", listen, "--log-level", "info", *flags],
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
        """SIGSTOP, and returns once every thread of the server has stopped.

        kill(2) returns before the stop takes hold: on a busy machine a server
        thread already running may still answer a request sent just after.
        """
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + LIMIT
        while not _all_threads_stopped(self.proc.pid):
            if time.monotonic() > deadline:
                pytest.fail(f"dlock-server {self.proc.pid} did not stop within {LIMIT} s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (T); one that
    has exited (Z, X, or gone) counts too: the caller's next step says so."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


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


# -- clusters ------------------------------------------------------------

#: Flags every node of a test cluster gets. A short election timeout keeps
#: failovers to a second or two; 500 ms still rides out the scheduling
#: stalls of a loaded two-core CI machine (a needless election is harmless:
#: the clients under test follow it).
NODE_FLAGS = ("--heartbeat", "100ms", "--election-timeout", "500ms")


def _reserve_port() -> socket.socket:
    """A listening socket on a free loopback port below the ephemeral range
    (the conformance kit's: see `kit.reserve_port`), held until its node is
    about to bind the port."""
    return kit.reserve_port()


def _frame_call(addr: str, req: "pb.Request", timeout: float) -> Optional["pb.Response"]:
    """One request on a connection of its own, outside the client under
    test (the conformance kit's `call`); None if the node does not answer
    within `timeout` (down or paused)."""
    return kit.call(addr, req, timeout)


class FreezableProxy:
    """A TCP forwarder on a loopback port of its own to `upstream`, which
    the test can freeze: while frozen, both sockets of every connection
    through it stay open and nothing gets through, either way (no bytes, no
    FIN, no reset), as on a failed link between racks; thawed, what was held
    back is delivered. New connections are accepted while frozen, and
    frozen too. A reset from either end is passed on as a reset, a clean
    close as a clean close; with `swallow_resets`, a reset from upstream is
    not: the downstream end stays open and what it sends is dropped, as
    behind a middlebox that lost the reset. (dlock-server/src/testing/
    proxy.rs, in threads: one per connection, which alone touches its two
    sockets.)
    """

    def __init__(self, upstream: str, *, swallow_resets: bool = False) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._swallow_resets = swallow_resets
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._thawed = threading.Event()
        self._thawed.set()
        self._closed = False
        # Connections accepted so far, and those to reset (by number).
        self._accepted = 0
        self._doomed: "set[int]" = set()
        self._doomed_lock = threading.Lock()
        # For `freeze(settle=True)`: freezes so far, and the latest each
        # live connection has seen (None: it may still be forwarding).
        self._settled = threading.Condition()
        self._freezes = 0
        self._seen: "dict[int, Optional[int]]" = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self, settle: bool = False) -> None:
        """Holds everything back from now on. A connection in the middle of
        forwarding may still pass on what it read: with `settle`, returns
        only once every connection has stopped (within a fifth of a second),
        so nothing sent after the call gets through."""
        with self._settled:
            self._thawed.clear()
            self._freezes += 1
            freezes = self._freezes
            if settle:
                done = self._settled.wait_for(
                    lambda: all(seen is not None and seen >= freezes for seen in self._seen.values()), timeout=5
                )
                assert done, "a connection through the proxy did not stop"

    def thaw(self) -> None:
        self._thawed.set()

    def reset(self, n: int) -> None:
        """Resets the `n`th connection accepted (from 0), both ways (within
        a fifth of a second); the others go on."""
        with self._doomed_lock:
            self._doomed.add(n)

    def _is_doomed(self, n: int) -> bool:
        with self._doomed_lock:
            return n in self._doomed

    def close(self) -> None:
        """Stops accepting, and resets every connection through the proxy
        (within a fifth of a second)."""
        self._closed = True
        self._thawed.set()

    def _accept(self) -> None:
        try:
            while not self._closed:
                try:
                    client, _ = self._listener.accept()
                except socket.timeout:
                    continue
                client.settimeout(None)
                try:
                    server = socket.create_connection(self._upstream, timeout=2)
                except OSError:
                    _reset(client)
                    continue
                server.settimeout(None)
                for s in (client, server):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                n, self._accepted = self._accepted, self._accepted + 1
                with self._settled:
                    self._seen[n] = None
                threading.Thread(target=self._forward, args=(client, server, n), daemon=True).start()
        except OSError:
            pass
        finally:
            self._listener.close()

    def _forward(self, client: socket.socket, server: socket.socket, n: int) -> None:
        other = {client: server, server: client}
        reading = [client, server]
        swallowed = False  # upstream reset, and the client not told
        try:
            while reading and not self._closed:
                if self._is_doomed(n):
                    raise OSError("reset by the test")
                if not self._thawed.is_set():
                    with self._settled:
                        self._seen[n] = self._freezes
                        self._settled.notify_all()
                if not self._thawed.wait(0.2):
                    continue  # frozen: nothing is read, the senders' buffers fill
                with self._settled:
                    self._seen[n] = None
                ready, _, _ = select.select(reading, [], [], 0.2)
                for s in ready:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        if s is server and self._swallow_resets:
                            reading.remove(server)
                            swallowed = True
                            continue
                        raise
                    if swallowed:
                        if not data:
                            raise OSError("closed")
                        continue  # to nowhere
                    if data:
                        other[s].sendall(data)
                    else:  # a clean close: passed on, the other way goes on
                        reading.remove(s)
                        other[s].shutdown(socket.SHUT_WR)
        except OSError:
            pass  # a reset from one end (or a failed write): both are reset
        else:
            if not reading:
                client.close()
                server.close()
                return
        finally:
            with self._settled:
                self._seen.pop(n, None)
                self._settled.notify_all()
        _reset(client)
        _reset(server)


def _reset(s: socket.socket) -> None:
    """Closes `s` with a reset, not a FIN."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


class PeerLinks:
    """A `FreezableProxy` on every directed peer link of a cluster: node
    `a` dials node `b` (`--peer-route`) through a proxy of its own, which
    forwards to `b`'s `--peer-listen` address. The nodes' client ports are
    not proxied. (dlock-server/src/testing/peer_links.rs.)"""

    def __init__(self, peers: List[str]) -> None:
        n = len(peers)
        #: links[a][b] carries what node a sends to node b (and the answers).
        self.links: List[List[Optional[FreezableProxy]]] = [
            [FreezableProxy(peers[b]) if a != b else None for b in range(n)] for a in range(n)
        ]

    def routes(self, i: int) -> List[str]:
        """Node `i`'s flags: a `--peer-route` to every other node through its proxy."""
        flags: List[str] = []
        for b, p in enumerate(self.links[i]):
            if p is not None:
                flags += ["--peer-route", f"{b + 1}={p.addr}"]
        return flags

    def isolate(self, i: int, cut: bool) -> None:
        """Freezes (`cut`) or thaws every link to and from node `i`: it is
        cut off from every other node, and still reachable by clients."""
        for a, row in enumerate(self.links):
            for b, p in enumerate(row):
                if p is not None and i in (a, b):
                    if cut:
                        p.freeze()
                    else:
                        p.thaw()

    def close(self) -> None:
        for row in self.links:
            for p in row:
                if p is not None:
                    p.close()


class Cluster:
    """Node processes of one cluster on reserved loopback ports, with a data
    dir each under `root`: started, SIGKILLed, SIGTERMed, paused (SIGSTOP)
    and resumed by the test. `base` replaces `NODE_FLAGS`; with
    `peer_links` the nodes reach each other through `PeerLinks` the test
    can cut (`self.links`)."""

    def __init__(
        self,
        root: Path,
        n: int,
        flags: "tuple[str, ...]",
        *,
        base: "tuple[str, ...]" = NODE_FLAGS,
        peer_links: bool = False,
    ) -> None:
        self._root = root
        self._flags = (*base, *flags)
        self._held = [(_reserve_port(), _reserve_port()) for _ in range(n)]
        self.addrs = [f"127.0.0.1:{c.getsockname()[1]}" for c, _ in self._held]
        self._peers = [f"127.0.0.1:{p.getsockname()[1]}" for _, p in self._held]
        self._members = ",".join(f"{i + 1}={self.addrs[i]}@{self._peers[i]}" for i in range(n))
        self.links: Optional[PeerLinks] = PeerLinks(self._peers) if peer_links else None
        self.nodes: List[Optional[Server]] = [None] * n
        self._paused: "set[int]" = set()
        for i in range(n):
            self.start(i)

    @property
    def servers(self) -> str:
        """Every node's client address, comma-separated, as DLOCK_SERVER takes it."""
        return ",".join(self.addrs)

    def start(self, i: int) -> None:
        """Starts node `i` (again, on its ports and data dir) and waits until it listens."""
        assert self.nodes[i] is None, f"node {i} runs"
        for s in self._held[i]:
            s.close()
        flags = (
            "--data-dir", str(self._root / f"node{i + 1}"),
            "--node-id", str(i + 1),
            "--peer-listen", self._peers[i],
            "--initial-cluster", self._members,
            *(self.links.routes(i) if self.links is not None else ()),
            *self._flags,
        )
        self.nodes[i] = Server(*flags, listen=self.addrs[i])

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            node.kill()
            self.nodes[i] = None
            self._paused.discard(i)

    def terminate(self, i: int) -> int:
        """Stops node `i` with SIGTERM, as a rolling restart does; its exit code."""
        node = self.nodes[i]
        assert node is not None, f"node {i} does not run"
        code = node.stop()
        self.nodes[i] = None
        self._paused.discard(i)
        return code

    def pause(self, i: int) -> None:
        node = self.nodes[i]
        assert node is not None
        node.pause()
        self._paused.add(i)

    def resume(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None and i in self._paused:
            node.resume()
            self._paused.discard(i)

    def status(self, i: int, timeout: float = 0.5) -> "Optional[pb.ClusterInfo]":
        """Node `i`'s view of the cluster (ClusterStatus), None if it does not answer."""
        if self.nodes[i] is None or i in self._paused:
            return None
        resp = _frame_call(self.addrs[i], pb.Request(version=2, id=1, type=pb.ClusterStatus), timeout)
        if resp is None or resp.status != pb.Ok:
            return None
        return resp.cluster

    def leader(self, *, other_than: Optional[int] = None, limit: float = LIMIT) -> int:
        """The index of the node that leads, other than `other_than`; waits up
        to `limit` for one.

        A node that says it leads is taken once it also answers an Inspect,
        which it does only after a majority confirmed its lead (read index):
        a node says it leads for a moment longer than it does, at start.
        """
        deadline = time.monotonic() + limit
        stats = pb.Request(version=2, id=1, type=pb.Inspect)
        while True:
            for i in range(len(self.nodes)):
                if i == other_than:
                    continue
                info = self.status(i)
                if info is None or info.role != "Leader":
                    continue
                resp = _frame_call(self.addrs[i], stats, 1.0)
                if resp is not None and resp.status == pb.Ok:
                    return i
            if time.monotonic() > deadline:
                pytest.fail(f"no leader (other than node {other_than}) within {limit} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for i in range(len(self.nodes)):
            self.resume(i)
            self.kill(i)
        for pair in self._held:
            for s in pair:
                s.close()
        if self.links is not None:
            self.links.close()


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Any]:
    """A factory: start_cluster(n=3, *flags, base=NODE_FLAGS, peer_links=False)
    -> Cluster (see `Cluster`), every node killed after the test."""
    started: List[Cluster] = []

    def start(n: int = 3, *flags: str, base: "tuple[str, ...]" = NODE_FLAGS, peer_links: bool = False) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(started)}", n, flags, base=base, peer_links=peer_links)
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
