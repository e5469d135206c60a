#!/usr/bin/env bash
# Shared locks and semaphores under load (issue 17), each beside a reference
# measured in the same run against the same server: 32 connections on one
# hot key, all writers (the reference), 90 % readers, and a semaphore of 4;
# first with holds of 1 ms (where sharing pays), then unlocking at once
# (where only the server's cost per request counts). Rounds alternate so
# that drift on a shared machine hits every mode alike.
#
# Usage: bench/shared.sh [SECONDS_PER_RUN] [ROUNDS]   (defaults 3 and 3)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
ROUNDS=${2:-3}
ADDR=127.0.0.1:17437
cargo build --release -q -p dlock-server -p dlock-bench
T=${CARGO_TARGET_DIR:-target}
BENCH=$T/release/dlock-bench

"$T"/release/dlock-server --listen "$ADDR" --threads 1 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  "$BENCH" --server "$ADDR" --duration 100ms ping -c 1 >/dev/null 2>&1 && break
  sleep 0.1
done

run() {
  "$BENCH" --server "$ADDR" --server-pid "$PID" --duration "${SECS}s" --json shared -c 32 "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); e=r["extra"]; l=r["latency"]; s=r.get("server") or {}; print(round(r["ops_per_sec"]), l["p50_us"], l["p99_us"], round(s.get("cpu_us_per_op", 0), 1), e["most_holders_seen"], e["violations"])'
}
printf '%-6s %-30s %10s %8s %8s %10s %8s %6s\n' round mode ops/s p50_us p99_us cpu_us/op holders viol
for hold in 1ms 0s; do
for r in $(seq "$ROUNDS"); do
  for mode in "--readers 0 --hold $hold" "--readers 90 --hold $hold" "--limit 4 --hold $hold"; do
    # shellcheck disable=SC2086
    read -r ops p50 p99 cpu most viol < <(run $mode)
    printf '%-6s %-30s %10s %8s %8s %10s %8s %6s\n' "$r" "$mode" "$ops" "$p50" "$p99" "$cpu" "$most" "$viol"
  done
done
done
