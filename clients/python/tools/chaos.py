#!/usr/bin/env python3
"""A black-box chaos run of the Python client against a real 3-node cluster.

    python clients/python/tools/chaos.py --server-bin target/release/dlock-server --duration 600

Workers (each a `dlock.Client` of its own, on every node's address) take a
few keys in turn for random times, some short, some spanning the faults;
meanwhile one fault at a time hits the cluster: the leader or a follower
SIGKILLed and restarted, or the leader paused (SIGSTOP) for 0.5 to 14 s.

A hold runs from the moment the worker has its grant until it sends the
Unlock, or until the client reports the lock lost (`lock.lost`), whichever
comes first: that is when a correct program stops using it. The check at
the end: no two holds of one key overlap, and fences grow in grant order.
It prints the counts (holds, losses, busy waits, client failures, faults)
and exits 1 on any violation. The Rust-side torture (`dlock-torture
--cluster`) checks the Rust library the same way with a fenced register;
this is its counterpart for the Python client.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "conformance"))
import kit  # noqa: E402  (the conformance kit's cluster of node processes)

import dlock  # noqa: E402


@dataclass
class Hold:
    key: str
    fence: int
    start: float
    end: float
    lost: Optional[str]
    worker: int


class Record:
    """What the workers saw, under one lock (threads append to it)."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.holds: List[Hold] = []
        self.busy = 0
        self.failures: Dict[str, int] = {}

    def hold(self, h: Hold) -> None:
        with self.mutex:
            self.holds.append(h)

    def failed(self, why: str) -> None:
        with self.mutex:
            self.failures[why] = self.failures.get(why, 0) + 1


def worker(n: int, servers: str, keys: List[str], until: float, seed: int, rec: Record) -> None:
    rng = random.Random(seed)
    client: Optional[dlock.Client] = None
    while time.monotonic() < until:
        try:
            if client is None or client.closed.is_set():
                client = dlock.Client(servers, connect_timeout=10.0)
            key = rng.choice(keys)
            lock = client.lock(key, wait=20)
            start = time.monotonic()
            # Mostly short holds; some long enough to span a fault.
            hold_for = rng.uniform(0.5, 4.0) if rng.random() < 0.15 else rng.uniform(0.01, 0.2)
            lost = lock.lost.wait(hold_for)
            end = time.monotonic()
            rec.hold(Hold(key, lock.fence, start, end, lock.lost_reason if lost else None, n))
            if not lost:
                try:
                    lock.unlock()
                except dlock.DlockError as e:
                    rec.failed(f"unlock: {type(e).__name__}")
        except dlock.Timeout:
            with rec.mutex:
                rec.busy += 1
        except dlock.DlockError as e:
            rec.failed(type(e).__name__)
            if client is not None:
                client.close()
            client = None
    if client is not None:
        client.close()


def faults(cluster: "kit.Cluster", until: float, seed: int, done: Dict[str, int]) -> None:
    rng = random.Random(seed)
    key = "chaos/probe"
    while time.monotonic() < until - 15:
        time.sleep(rng.uniform(2.0, 6.0))
        try:
            leader, _ = cluster.leader(key, cluster.running())
        except kit.Failed:
            continue
        kind = rng.choice(["kill leader", "kill follower", "pause leader"])
        if kind == "pause leader":
            cluster.signal(leader, signal.SIGSTOP)
            time.sleep(rng.uniform(0.5, 14.0))
            cluster.signal(leader, signal.SIGCONT)
        else:
            victim = leader if kind == "kill leader" else rng.choice(
                [i for i in cluster.running() if i != leader])
            cluster.signal(victim, signal.SIGKILL)
            proc = cluster.procs[victim]
            if proc is not None:
                proc.wait()
            time.sleep(rng.uniform(0.5, 3.0))
            cluster.start(victim)
        done[kind] = done.get(kind, 0) + 1


def check(holds: List[Hold]) -> List[str]:
    violations = []
    by_key: Dict[str, List[Hold]] = {}
    for h in holds:
        by_key.setdefault(h.key, []).append(h)
    for key, hs in by_key.items():
        hs.sort(key=lambda h: h.start)
        for i, a in enumerate(hs):
            for b in hs[i + 1:]:
                if b.start >= a.end:
                    break
                violations.append(
                    f"{key}: worker {a.worker} (fence {a.fence}) held it until {a.end:.3f}, "
                    f"worker {b.worker} (fence {b.fence}) from {b.start:.3f}")
            if i + 1 < len(hs) and hs[i + 1].fence <= a.fence:
                violations.append(f"{key}: fence {hs[i + 1].fence} granted after {a.fence}")
    return violations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-bin", required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--keys", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="the clients' reconnect log")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"chaos: {args.workers} workers on {args.keys} keys for {args.duration:.0f} s, seed {seed}",
          flush=True)
    rec = Record()
    done: Dict[str, int] = {}
    keys = [f"chaos/{i}" for i in range(args.keys)]
    with tempfile.TemporaryDirectory() as root:
        cluster = kit.Cluster(args.server_bin, Path(root))
        try:
            cluster.leader("chaos/probe", [0, 1, 2])
            servers = ",".join(cluster.addrs)
            until = time.monotonic() + args.duration
            threads = [
                threading.Thread(target=worker, args=(n, servers, keys, until, seed + n, rec))
                for n in range(args.workers)
            ]
            threads.append(threading.Thread(target=faults, args=(cluster, until, seed, done)))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            cluster.stop()
    violations = check(rec.holds)
    lost = sum(1 for h in rec.holds if h.lost)
    print(f"chaos: {len(rec.holds)} holds, {lost} reported lost while held, {rec.busy} busy waits",
          flush=True)
    print(f"chaos: client failures: {rec.failures or 'none'}", flush=True)
    print(f"chaos: faults: {done or 'none'}", flush=True)
    for v in violations[:20]:
        print(f"VIOLATION {v}", flush=True)
    print(f"chaos: {len(violations)} violations", flush=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
