#!/usr/bin/env bash
# CPU of each node of a 3-node cluster (fsync on) under one load, for two
# builds of dlock-server in one run, alternated ROUNDS times so the
# machine's drift falls on both alike: a dlock-bench WORKLOAD (default
# `lock-unlock -c 32`) against the leader for SECONDS, with each node's CPU
# time read from /proc before and after. Prints operations/s, the leader's
# committed entries/s where the workload reports them (idle-sessions), the
# leader's and the followers' (mean) share of one core, and per operation
# the three nodes' CPU time (summed) and context switches (every thread).
# With SYSCALLS=1 (needs perf and its syscalls tracepoints), also the three
# nodes' pwrite64 and fdatasync calls per operation, counted by `perf stat`
# over the same seconds.
#
# Usage: bench/cluster_cpu.sh BEFORE/dlock-server AFTER/dlock-server [ROUNDS] [SECONDS] [WORKLOAD...]
#   e.g. bench/cluster_cpu.sh old/dlock-server new/dlock-server 2 20 idle-sessions -c 10000
# Needs: python3, target/release/dlock-bench and target/debug/dlock (or release).
set -euo pipefail
trap 'echo "cluster_cpu.sh: line $LINENO failed: $BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."
# shellcheck source=bench/proc_usage.sh
. bench/proc_usage.sh
BEFORE=${1:?the server binary before}
AFTER=${2:?the server binary after}
ROUNDS=${3:-3}
SECS=${4:-10}
WORKLOAD=("${@:5}")
[[ ${#WORKLOAD[@]} -gt 0 ]] || WORKLOAD=(lock-unlock -c 32)
BENCH=target/release/dlock-bench
DLOCK=target/release/dlock
[[ -x target/debug/dlock && target/debug/dlock -nt $DLOCK ]] && DLOCK=target/debug/dlock
for need in python3 "$BENCH" "$DLOCK"; do
  command -v "$need" >/dev/null || [[ -x $need ]] || { echo "cluster_cpu.sh: $need is missing" >&2; exit 2; }
done
TMP=$(mktemp -d)
PIDS=()
# Stops the nodes and waits until their ports are free for the next build.
stop() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
  PIDS=()
}
trap 'stop; rm -rf "$TMP"' EXIT

CLIENT=(127.0.0.1:17701 127.0.0.1:17702 127.0.0.1:17703)
PEER=(127.0.0.1:17711 127.0.0.1:17712 127.0.0.1:17713)
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
ALL=$(IFS=,; echo "${CLIENT[*]}")

SYSCALLS=${SYSCALLS:-0}
if [[ $SYSCALLS == 1 ]]; then
  printf '%-6s %-7s %12s %10s %10s %17s %8s %8s %10s %10s\n' round build "ops/s" "entries/s" "leader %" "follower % (mean)" "us/op" "cs/op" "pwrite/op" "fsync/op"
else
  printf '%-6s %-7s %12s %10s %10s %17s %8s %8s\n' round build "ops/s" "entries/s" "leader %" "follower % (mean)" "us/op" "cs/op"
fi
for round in $(seq "$ROUNDS"); do
  for which in before after; do
    bin=$BEFORE; [[ $which == after ]] && bin=$AFTER
    rm -rf "$TMP"/d*
    for n in 1 2 3; do
      i=$((n - 1))
      "$bin" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$i]}" \
        --peer-listen "${PEER[$i]}" --initial-cluster "$MEMBERS" --max-connections 19000 --log-level warn 2>>"$TMP/log" &
      PIDS+=($!)
      disown
    done
    leader=""
    for _ in $(seq 100); do
      leader=$("$DLOCK" cluster -s "$ALL" status -o json 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(next((m["client_addr"] for m in v["members"] if m["node_id"] == v["leader_id"]), ""))' 2>/dev/null || true)
      [[ -n $leader ]] && break
      sleep 0.1
    done
    [[ -n $leader ]] || { echo "cluster_cpu.sh: no leader" >&2; exit 1; }
    # Which pid leads: the node whose client address the leader has.
    lead_pid=""
    for n in 1 2 3; do
      if [[ ${CLIENT[$((n - 1))]} == "$leader" ]]; then lead_pid=${PIDS[$((n - 1))]}; fi
    done
    # Warm up; a fresh cluster may still be settling, which the run itself
    # rides out.
    "$BENCH" --server "$leader" --duration 2s lock-unlock -c 4 >/dev/null 2>&1 || true
    before_cpu=$(proc_cpu_each "${PIDS[@]}") before_cs=$(proc_switches "${PIDS[@]}")
    perf_pid=""
    if [[ $SYSCALLS == 1 ]]; then
      # Bounded by its own timer, a little past the load's end.
      perf stat -x, -e syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync \
        -p "$(IFS=,; echo "${PIDS[*]}")" -o "$TMP/perf" -- sleep "$SECS" 2>/dev/null &
      perf_pid=$!
    fi
    t0=$(date +%s.%N)
    "$BENCH" --server "$leader" --duration "${SECS}s" --json "${WORKLOAD[@]}" >"$TMP/run.json"
    t1=$(date +%s.%N)
    calls="- -"
    if [[ -n $perf_pid ]]; then
      wait "$perf_pid" || true
      calls=$(awk -F, '/pwrite64/ {p=$1} /fdatasync/ {f=$1} END {print p+0, f+0}' "$TMP/perf")
    fi
    after_cpu=$(proc_cpu_each "${PIDS[@]}") after_cs=$(proc_switches "${PIDS[@]}")
    python3 - "$round" "$which" "$TMP/run.json" "$t0" "$t1" "$before_cpu" "$after_cpu" \
      "${PIDS[*]}" "$lead_pid" "$((after_cs - before_cs))" "$calls" <<'PY'
import json, sys
rnd, which, path, t0, t1, b, a, pids, lead, cs, calls = sys.argv[1:]
wall = float(t1) - float(t0)
used = [(float(y) - float(x)) / wall * 100 for x, y in zip(b.split(), a.split())]
pids = pids.split()
r = json.load(open(path))
rate = r.get("ops_per_sec") or 0
entries = r.get("extra", {}).get("entries_per_sec")
entries = "-" if entries is None else f"{entries:.0f}"
leader = [u for p, u in zip(pids, used) if p == lead]
followers = [u for p, u in zip(pids, used) if p != lead]
ops = max(r.get("ops") or 0, 1)
cpu = sum(float(y) - float(x) for x, y in zip(b.split(), a.split()))
line = f"{rnd:<6} {which:<7} {rate:>12.0f} {entries:>10} {leader[0]:>10.1f} {sum(followers)/len(followers):>17.1f} {cpu / ops * 1e6:>8.1f} {int(cs) / ops:>8.2f}"
if calls != "- -":
    # Counted over SECS started just before the load's own SECS.
    pw, fs = (float(c) for c in calls.split())
    line += f" {pw / ops:>10.2f} {fs / ops:>10.2f}"
print(line)
PY
    stop
  done
done
