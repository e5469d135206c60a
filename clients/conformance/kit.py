#!/usr/bin/env python3
"""The client conformance kit: what a dlock client in any language must
survive on a cluster, checked against real node processes.

    python3 clients/conformance/kit.py --server-bin target/debug/dlock-server -- CLIENT [ARGS...]

CLIENT is the client under test, wrapped in a small program with this
contract (docs/CLIENTS.md, "Conformance kit"): run as `CLIENT ... KEY` with
DLOCK_SERVER set to the nodes' addresses (comma-separated), it takes KEY
exclusively without a lease, waiting as long as it takes; prints
`held FENCE` on stdout; keeps the lock until a line arrives on its stdin;
then releases it, prints `released` and exits 0. If it finds the lock lost
meanwhile it prints `lost REASON` and exits 1 (another exit status counts as
lost too).

The kit starts a 3-node cluster on loopback, a holder and a waiter on one
key, then:
  1. pauses the leader (SIGSTOP) for longer than the session TTL, as a VM
     freeze or an fsync stall would, and checks through the other nodes that
     the holder's grant and the waiter's place outlive the TTL;
  2. wakes the old leader and, once it follows the new one, SIGKILLs the
     new one and checks again;
  3. releases the holder and checks that the waiter gets the key with a
     higher fence.
Then, on the same cluster and on a single server, it checks the ownership
rule: run as `CLIENT ... --turns N KEY`, the client's program has two
workers share ONE client; each, N times, locks KEY exclusively without a
lease (waiting as long as it takes), prints `enter W FENCE` (W is 1 or 2),
holds it for about 20 ms, prints `leave W FENCE` and unlocks; it exits 0
when both are done (`error TEXT` and exit 1 on any error). The kit checks
that every enter is followed by the same worker's leave before the next
enter (two workers of one client take turns, as two processes would), that
fences rise, and that each worker held the key N times.
It prints one line per check and exits 0 only if every one passed. It needs
python3 and the `protobuf` package (the Python client's dependency), and
reads the wire types from the installed Python client or, without it, from
clients/python/src/dlock/_proto.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

HERE = Path(__file__).resolve().parent
try:
    # The Python client's copy, when it is installed: a second copy of the
    # same generated module in one process would clash in protobuf's pool.
    from dlock._proto import dlock_pb2 as pb
except ImportError:
    sys.path.insert(0, str(HERE.parents[0] / "python" / "src" / "dlock" / "_proto"))
    import dlock_pb2 as pb  # type: ignore[no-redef]  # generated from proto/dlock.proto

#: The cluster's session TTL (the nodes' default) and how long the leader is
#: stalled: longer, so a client that only waited would find its session gone.
TTL = 10.0
STALL = TTL + 2.0
#: Upper bound for anything the kit waits for.
PATIENCE = 30.0
#: Holds per worker in the turns check: enough that two workers that do not
#: exclude each other overlap (each asks again as soon as it let go).
TURNS = 10
NODE_FLAGS = ["--heartbeat", "100ms", "--election-timeout", "500ms"]


def reserve_port() -> socket.socket:
    """A listening socket on a free loopback port below the ephemeral range,
    held until its node binds the port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    low = 10_000
    start = random.randrange(low, high)
    for i in range(high - low):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", low + (start - low + i) % (high - low)))
            s.listen(1)
            return s
        except OSError:
            s.close()
    raise SystemExit(f"kit: no free loopback port between {low} and {high}")


def call(addr: str, req: "pb.Request", timeout: float) -> Optional["pb.Response"]:
    """One request on a connection of its own, outside any client under
    test: the answer, or None if the node does not answer within `timeout`
    (down or paused)."""
    body = req.SerializeToString()
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">I", len(body)) + body)
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
                chunk = s.recv(65536)
                if not chunk:
                    return None
                data += chunk
            return pb.Response.FromString(data[4 : 4 + struct.unpack(">I", data[:4])[0]])
    except OSError:
        return None


def inspect(addr: str, key: str) -> Optional["pb.Response"]:
    """An Inspect of `key` (see `call`), given a second to answer."""
    req = pb.Request(version=2, id=1, type=pb.Inspect)
    req.lock.keys.append(key)
    return call(addr, req, 1.0)


class Cluster:
    """Node processes of one cluster on reserved loopback ports (below the
    ephemeral range, so a node restarted after a kill finds its ports free),
    a data dir each under `root`."""

    def __init__(self, server_bin: str, root: Path, n: int = 3) -> None:
        held = [(reserve_port(), reserve_port()) for _ in range(n)]
        self.addrs = [f"127.0.0.1:{c.getsockname()[1]}" for c, _ in held]
        peers = [f"127.0.0.1:{p.getsockname()[1]}" for _, p in held]
        members = ",".join(f"{i + 1}={self.addrs[i]}@{peers[i]}" for i in range(n))
        self._argv = [
            [server_bin, "--listen", self.addrs[i], "--peer-listen", peers[i],
             "--node-id", str(i + 1), "--data-dir", str(root / f"node{i + 1}"),
             "--initial-cluster", members, *NODE_FLAGS]
            for i in range(n)
        ]
        self.procs: List[Optional[subprocess.Popen]] = [None] * n
        for i in range(n):
            for s in held[i]:
                s.close()
            self.start(i)

    def start(self, i: int) -> None:
        """Starts node `i` (again, after a kill), on its ports and data dir."""
        self.procs[i] = subprocess.Popen(
            self._argv[i],
            # The checks say what went wrong; the nodes' logs (elections,
            # peers unreachable) would only bury it.
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def running(self) -> List[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def leader(self, key: str, among: List[int]) -> Tuple[int, "pb.Response"]:
        """The node among `among` that answers an Inspect of `key` (only a
        leader with a quorum does), and its answer."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            for i in among:
                r = inspect(self.addrs[i], key)
                if r is not None and r.status == pb.Ok:
                    return i, r
            time.sleep(0.1)
        raise Failed(f"no leader among nodes {[i + 1 for i in among]} within {PATIENCE:.0f} s")

    def followed(self, i: int, key: str, among: List[int]) -> int:
        """The node among `among` that node `i` names leader (answering
        NotLeader) and that answers as leader itself: once a node woken
        after a stall names it, the woken node has learnt the new term and
        no longer counts itself leader."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            r = inspect(self.addrs[i], key)
            if r is not None and r.status == pb.NotLeader:
                named = [j for j in among if self.addrs[j] == r.leader_addr]
                if named:
                    ok = inspect(self.addrs[named[0]], key)
                    if ok is not None and ok.status == pb.Ok:
                        return named[0]
            time.sleep(0.05)
        raise Failed(f"node {i + 1} did not follow a leader among nodes {[j + 1 for j in among]} "
                     f"within {PATIENCE:.0f} s")

    def signal(self, i: int, sig: int) -> None:
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


class Failed(Exception):
    """A check that did not pass; the message says what was seen."""


class Client:
    """One run of the client under test, its stdout read line by line."""

    def __init__(self, argv: List[str], key: str, servers: str) -> None:
        env = dict(os.environ, DLOCK_SERVER=servers)
        self.proc = subprocess.Popen(
            [*argv, key], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, what: str, timeout: float = PATIENCE) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise Failed(f"no '{what}' line within {timeout:.0f} s") from None
        if line is None:
            raise Failed(f"the client exited ({self.proc.wait()}) before '{what}'")
        return line

    def held(self) -> int:
        line = self.next_line("held FENCE")
        if not line.startswith("held "):
            raise Failed(f"expected 'held FENCE', got {line!r}")
        return int(line.split()[1])

    def said_nothing(self) -> None:
        """Fails if the client reported a loss or exited."""
        try:
            line = self.lines.get_nowait()
        except queue.Empty:
            if self.proc.poll() is not None:
                raise Failed(f"the client exited ({self.proc.returncode})") from None
            return
        raise Failed(f"the client said {line!r}")

    def release(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("release\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            # It exited already (a loss it reported, a crash): a failed
            # check like any other, not the kit's traceback.
            raise Failed(f"the client exited ({self.proc.wait()}) before it was told to release") from None
        line = self.next_line("released")
        if line != "released":
            raise Failed(f"expected 'released', got {line!r}")
        code = self.proc.wait(timeout=PATIENCE)
        if code != 0:
            raise Failed(f"the client exited {code} after releasing")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def expect_state(cluster: Cluster, among: List[int], key: str, fence: int, waiters: int) -> None:
    _, r = cluster.leader(key, among)
    info = r.key_info[0]
    seen = (info.fence, info.waiters)
    if seen != (fence, waiters):
        raise Failed(f"the leader shows fence {info.fence} with {info.waiters} waiters, "
                     f"expected fence {fence} with {waiters}")


def check_turns(argv: List[str], servers: str, key: str) -> None:
    """Two workers sharing one client take turns on `key` (the ownership
    rule, docs/CLIENTS.md): their enter and leave lines alternate, worker by
    worker, and fences rise."""
    env = dict(os.environ, DLOCK_SERVER=servers)
    try:
        proc = subprocess.run(
            [*argv, "--turns", str(TURNS), key], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, text=True, timeout=PATIENCE * 2,
        )
    except subprocess.TimeoutExpired:
        raise Failed(f"the client did not finish {TURNS} turns per worker within {PATIENCE * 2:.0f} s") from None
    lines = proc.stdout.splitlines()
    holding: Optional[Tuple[str, str]] = None
    last_fence = 0
    holds = {"1": 0, "2": 0}
    for n, line in enumerate(lines, 1):
        word, *rest = line.split() or [""]
        if word == "error":
            raise Failed(f"the client reported an error: {line}")
        if word not in ("enter", "leave") or len(rest) != 2 or rest[0] not in holds or not rest[1].isdigit():
            raise Failed(f"line {n}: expected 'enter W FENCE' or 'leave W FENCE', got {line!r}")
        worker, fence = rest[0], rest[1]
        if word == "enter":
            if holding is not None:
                raise Failed(f"line {n}: worker {worker} entered under fence {fence} while worker "
                             f"{holding[0]} still held the key under fence {holding[1]}: two holders at once")
            if int(fence) <= last_fence:
                raise Failed(f"line {n}: fence {fence} after {last_fence}: fences must rise")
            last_fence = int(fence)
            holding = (worker, fence)
            holds[worker] += 1
        else:
            if holding != (worker, fence):
                raise Failed(f"line {n}: worker {worker} left fence {fence}, but the holder was {holding}")
            holding = None
    if proc.returncode != 0:
        raise Failed(f"the client exited {proc.returncode}")
    if holding is not None or holds != {"1": TURNS, "2": TURNS}:
        raise Failed(f"expected {TURNS} holds per worker ending in a leave, saw {holds}"
                     f"{' and an enter without its leave' if holding else ''}")


def single_server(server_bin: str) -> Tuple[subprocess.Popen, str]:
    """A single in-memory server on a reserved loopback port, and its
    address once it answers."""
    s = reserve_port()
    addr = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    proc = subprocess.Popen([server_bin, "--listen", addr], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + PATIENCE
    while call(addr, pb.Request(version=2, id=1, type=pb.Ping), 1.0) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise Failed(f"the single server on {addr} did not answer (exit {proc.poll()})")
        time.sleep(0.05)
    return proc, addr


def run(server_bin: str, argv: List[str]) -> bool:
    key = "conformance/kit"
    ok = True
    with tempfile.TemporaryDirectory() as root:
        cluster = Cluster(server_bin, Path(root))
        servers = ",".join(cluster.addrs)
        clients: List[Client] = []

        def check(name: str, step) -> bool:  # type: ignore[no-untyped-def]
            nonlocal ok
            try:
                step()
            except Failed as e:
                print(f"FAIL  {name}: {e}", flush=True)
                ok = False
                return False
            print(f"ok    {name}", flush=True)
            return True

        try:
            cluster.leader(key, [0, 1, 2])
            holder = Client(argv, key, servers)
            clients.append(holder)
            fence = holder.held()
            # Only now: started together, either could get the key first.
            waiter = Client(argv, key, servers)
            clients.append(waiter)
            print(f"      the holder took the key under fence {fence}", flush=True)

            def in_line() -> None:
                deadline = time.monotonic() + PATIENCE
                while True:
                    _, r = cluster.leader(key, cluster.running())
                    if r.key_info[0].waiters == 1:
                        return
                    if time.monotonic() > deadline:
                        raise Failed("the waiter never got in line")
                    time.sleep(0.05)

            if not check("the second client waits in line", in_line):
                return False
            old, _ = cluster.leader(key, cluster.running())
            cluster.signal(old, signal.SIGSTOP)
            stalled = time.monotonic()
            others = [i for i in cluster.running() if i != old]

            def through_stall() -> None:
                time.sleep(max(0.0, stalled + STALL - time.monotonic()))
                holder.said_nothing()
                waiter.said_nothing()
                expect_state(cluster, others, key, fence, 1)

            check(f"the holder's grant and the waiter's place outlive a {STALL:.0f} s leader stall "
                  f"(session TTL {TTL:.0f} s)", through_stall)
            cluster.signal(old, signal.SIGCONT)

            def through_kill() -> None:
                # The kill waits until the woken node follows the new
                # leader (some 60 ms after the wake). Killed before, the
                # two left took 1.7 to 5.0 s to elect on 2 loaded cores
                # (the woken node stood on its stale log and lost, and the
                # other stood only seconds later), against 1.7 to 2.1 s
                # after: a tail that reaches the alarm of any client whose
                # last proof came a Ping interval before the kill (TTL -
                # margin - TTL/4 = 5.5 s after it), however fast it
                # resumes. The client's part is the same either way:
                # notice the kill, find the new leader (past the node it
                # found silent) and resume there before its alarm.
                new = cluster.followed(old, key, others)
                cluster.signal(new, signal.SIGKILL)
                killed = time.monotonic()
                rest = [i for i in cluster.running() if i != new]
                expect_state(cluster, rest, key, fence, 1)
                elected = time.monotonic() - killed
                try:
                    holder.said_nothing()
                    waiter.said_nothing()
                except Failed as e:
                    raise Failed(f"{e} (the nodes left answered as leader {elected:.1f} s after the kill)") from None

            check("they outlive a leader kill", through_kill)

            def hand_off() -> None:
                holder.release()
                second = waiter.held()
                if second <= fence:
                    raise Failed(f"the waiter's fence {second} is not above {fence}")
                waiter.release()

            check("the holder releases and the waiter gets the key with a higher fence", hand_off)
            check("two workers sharing one client take turns (cluster)",
                  lambda: check_turns(argv, servers, "conformance/turns"))
        except Failed as e:
            print(f"FAIL  {e}", flush=True)
            ok = False
        finally:
            for c in clients:
                c.stop()
            cluster.stop()

    def on_single_server() -> None:
        proc, addr = single_server(server_bin)
        try:
            check_turns(argv, addr, "conformance/turns")
        finally:
            proc.kill()
            proc.wait()

    try:
        on_single_server()
        print("ok    two workers sharing one client take turns (single server)", flush=True)
    except Failed as e:
        print(f"FAIL  two workers sharing one client take turns (single server): {e}", flush=True)
        ok = False
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-bin", required=True, help="the dlock-server binary")
    parser.add_argument("client", nargs=argparse.REMAINDER, help="-- CLIENT [ARGS...]")
    args = parser.parse_args()
    argv = args.client[1:] if args.client[:1] == ["--"] else args.client
    if not argv:
        parser.error("give the client under test after --")
    print(f"conformance kit: {' '.join(argv)}", flush=True)
    passed = run(args.server_bin, argv)
    print("conformance kit: " + ("all checks passed" if passed else "FAILED"), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
