"""Lock-unlock cycles per second of the asyncio client, beside redis-py asyncio, in one run.

    python lock_cycles.py --dlock 127.0.0.1:7436 --redis 127.0.0.1:6379 [--tasks 32] [--seconds 5] [--rounds 3]

Each workload runs `--tasks` asyncio tasks for `--seconds` (and at most
`--max-cycles` cycles), each task on a key of its own, in a loop:

- dlock: `lock = await client.lock(key)` then `await lock.unlock()`, all
  tasks on ONE dlock.aio client (one connection; requests pipelined). Keys
  are per task because locks belong to the connection: tasks sharing one
  connection and one key would not exclude each other.
- redis: `SET key token NX PX 10000` then `DEL key` with redis.asyncio, the
  default pool (one connection per concurrently busy task, so 32).
- redis-1conn: the same on a single connection (redis-py does not pipeline
  concurrent callers: each command waits for the connection).

Rounds alternate the workloads so a drift of the shared machine hits all of
them alike; the median round is reported. Also reported: this process's CPU
time per cycle (where a Python client spends its time) and, with --dlock-pid
and --redis-pid, each server's CPU time per cycle from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Awaitable, Callable, Dict, List, Optional

import dlock.aio

TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pid: Optional[int]) -> float:
    """CPU seconds (user + system) of a process so far; 0 without a pid."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def drive(cycle: Callable[[int], Awaitable[None]], tasks: int, seconds: float, max_cycles: int) -> int:
    """Runs `cycle(task)` in `tasks` tasks until the time or the count is up; returns cycles done."""
    done = 0
    stop = time.monotonic() + seconds

    async def loop(i: int) -> None:
        nonlocal done
        while done < max_cycles and time.monotonic() < stop:
            await cycle(i)
            done += 1

    await asyncio.gather(*(loop(i) for i in range(tasks)))
    return done


async def measure(name: str, args: argparse.Namespace) -> Dict[str, float]:
    if name == "dlock":
        client = await dlock.aio.connect(args.dlock)
        keys = [f"bench/{i}" for i in range(args.tasks)]

        async def cycle(i: int) -> None:
            lock = await client.lock(keys[i])
            await lock.unlock()

        close = client.close
        pid = args.dlock_pid
    else:
        import redis.asyncio as aioredis

        host, port = args.redis.rsplit(":", 1)
        r = aioredis.Redis(host=host, port=int(port), single_connection_client=(name == "redis-1conn"))
        keys = [f"bench:{i}" for i in range(args.tasks)]

        async def cycle(i: int) -> None:
            if not await r.set(keys[i], "token", nx=True, px=10000):
                raise RuntimeError(f"{keys[i]} was not free: the benchmark's keys must be its own")
            await r.delete(keys[i])

        close = r.aclose
        pid = args.redis_pid
    # Warm up: connections made, code paths hot.
    await drive(cycle, args.tasks, 0.3, args.max_cycles)
    cpu0, srv0, t0 = time.process_time(), server_cpu(pid), time.monotonic()
    cycles = await drive(cycle, args.tasks, args.seconds, args.max_cycles)
    elapsed = time.monotonic() - t0
    cpu, srv = time.process_time() - cpu0, server_cpu(pid) - srv0
    await close()
    return {
        "cycles_per_sec": cycles / elapsed,
        "client_cpu_us_per_cycle": cpu / cycles * 1e6,
        "server_cpu_us_per_cycle": srv / cycles * 1e6 if pid else float("nan"),
        "cycles": cycles,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dlock", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--dlock-pid", type=int)
    parser.add_argument("--redis-pid", type=int)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-cycles", type=int, default=10_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = ["dlock", "redis", "redis-1conn"]
    runs: Dict[str, List[Dict[str, float]]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            runs[name].append(asyncio.run(measure(name, args)))
    median = {n: sorted(rs, key=lambda r: r["cycles_per_sec"])[len(rs) // 2] for n, rs in runs.items()}
    if args.json:
        json.dump({"median": median, "runs": runs}, sys.stdout, indent=1)
        print()
        return 0
    print(f"{args.tasks} tasks, {args.seconds} s x {args.rounds} rounds; median round; all rounds in cycles/s")
    print(f"{'':12} {'cycles/s':>10} {'client us/cycle':>16} {'server us/cycle':>16}   rounds")
    for n in names:
        m = median[n]
        rounds = " ".join(f"{r['cycles_per_sec']:.0f}" for r in runs[n])
        print(
            f"{n:12} {m['cycles_per_sec']:10.0f} {m['client_cpu_us_per_cycle']:16.1f} "
            f"{m['server_cpu_us_per_cycle']:16.1f}   {rounds}"
        )
    d = median["dlock"]["cycles_per_sec"]
    print(f"ratio dlock / redis: {d / median['redis']['cycles_per_sec']:.2f}; "
          f"dlock / redis-1conn: {d / median['redis-1conn']['cycles_per_sec']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
