#!/usr/bin/env bash
# Two builds of dlock-server on one machine in one run: each started with
# --threads 1 and measured alternately, ROUNDS rounds (default 3), with the
# same dlock-bench, so the machine's drift falls on both alike.
#
# Usage: bench/before_after.sh BEFORE/dlock-server AFTER/dlock-server [ROUNDS] [SECONDS]
# Prints one line per workload and build: ops/s and server CPU per operation.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=${1:?the server binary before}
AFTER=${2:?the server binary after}
ROUNDS=${3:-3}
SECS=${4:-4}
BENCH=target/release/dlock-bench
[[ -x $BENCH ]] || cargo build --release -q -p dlock-bench
ADDR=127.0.0.1:7436
TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
printf '%-6s %-7s %-12s %12s %12s\n' round build workload ops/s "cpu us/op"
for round in $(seq "$ROUNDS"); do
  for which in before after; do
    bin=$BEFORE; [[ $which == after ]] && bin=$AFTER
    "$bin" --listen "$ADDR" --threads 1 --max-connections 20000 --log-level warn >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 50); do "$BENCH" --server "$ADDR" --duration 1s --ops 1 ping -c 1 >/dev/null 2>&1 && break; sleep 0.1; done
    for w in "pipeline --depth 256" "lock-unlock -c 50" "contended -c 32"; do
      # shellcheck disable=SC2086
      "$BENCH" --server "$ADDR" --duration "${SECS}s" --server-pid "$pid" --json $w >"$TMP"
      python3 - "$round" "$which" "$TMP" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
print(f"{sys.argv[1]:<6} {sys.argv[2]:<7} {r['workload']:<12} {r['ops_per_sec']:>12.0f} {r['server']['cpu_us_per_op']:>12.3f}")
PY
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
