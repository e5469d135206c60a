#!/usr/bin/env bash
# What an optional server feature costs on the ping and lock-unlock
# workloads: the same release binaries, the feature off and on, alternated
# twice so a drift of the shared machine shows up as spread, not as cost.
# Prints one line per run: server CPU per request and client-side req/s.
#
# Usage: bench/feature_cost.sh metrics [SECONDS_PER_RUN]   (default 5)
#   metrics: --metrics-listen on, scraped once a second during the run
# Needs release builds of dlock-server and dlock-bench (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURE=${1:?usage: bench/feature_cost.sh metrics [SECONDS]}
SECS=${2:-5}
ADDR=127.0.0.1:17437
METRICS=127.0.0.1:17438
SERVER=target/release/dlock-server
BENCH=target/release/dlock-bench

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# run LABEL SERVER-FLAGS...: one server, both workloads, then stop it.
run() {
  local label=$1; shift
  "$SERVER" --listen "$ADDR" --threads 1 "$@" 2>/dev/null &
  local pid=$!; PIDS+=("$pid")
  for _ in $(seq 50); do
    "$BENCH" --server "$ADDR" --duration 100ms ping -c 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
  local scraper=""
  if [[ $label == on && $FEATURE == metrics ]]; then
    # A scrape a second, as an eager Prometheus would, bounded by the run.
    ( for _ in $(seq $((SECS * 2 + 4))); do curl -s -o /dev/null "http://$METRICS/metrics"; sleep 1; done ) &
    scraper=$!
  fi
  for w in ping lock-unlock; do
    "$BENCH" --server "$ADDR" --server-pid "$pid" --json --duration "${SECS}s" "$w" -c 50 |
      LABEL=$label python3 -c '
import json, os, sys
r = json.load(sys.stdin)
label, w = os.environ["LABEL"], r["workload"]
cpu, ops, p99 = r["server"]["cpu_us_per_op"], r["ops_per_sec"], r["latency"]["p99_us"]
print(f"{label:4} {w:12} {cpu:6.2f} us/op {ops:9.0f} ops/s  p99 {p99} us")'
  done
  [[ -n $scraper ]] && kill "$scraper" 2>/dev/null || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

case $FEATURE in
  metrics) ON=(--metrics-listen "$METRICS") ;;
  *) echo "unknown feature $FEATURE" >&2; exit 2 ;;
esac
for round in 1 2; do
  echo "== round $round"
  run off
  run on "${ON[@]}"
done
