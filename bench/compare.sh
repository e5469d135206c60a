#!/usr/bin/env bash
# Runs dlock-server and redis-server side by side on loopback and prints the
# ratios the performance bar asks for (issue: dlock-bench and the performance
# bar). Installs redis from Debian's packages if it is missing, builds the
# release binaries, and stops everything it started, whatever happens.
#
# Usage: bench/compare.sh [SECONDS_PER_RUN]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
REDIS_PORT=16379
DLOCK_ADDR=127.0.0.1:17436

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "== installing redis-server and redis-tools"
  apt-get update -qq >/dev/null && apt-get install -y -qq redis-server redis-tools >/dev/null
fi
echo "== building release binaries"
cargo build --release -q -p dlock-server -p dlock-bench
BENCH=target/release/dlock-bench

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
PIDS+=($!); RPID=$!
target/release/dlock-server --listen "$DLOCK_ADDR" --threads 1 --max-connections 20000 2>/dev/null &
PIDS+=($!); DPID=$!
for _ in $(seq 50); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && "$BENCH" --server "$DLOCK_ADDR" --duration 100ms ping -c 1 >/dev/null 2>&1 && break
  sleep 0.1
done

TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# CPU microseconds per request of redis-server for one redis-benchmark run.
redis_cpu_per_op() {
  local n=$1; shift
  local c0 c1
  c0=$(cpu_ticks "$RPID")
  redis-benchmark -p "$REDIS_PORT" -n "$n" -q "$@" >/tmp/redis-bench.$$ 2>&1
  c1=$(cpu_ticks "$RPID")
  python3 -c "print(($c1-$c0)/$TCK*1e6/$n)"
}
redis_rps() { grep -oE '[0-9.]+ requests per second' /tmp/redis-bench.$$ | tail -1 | cut -d' ' -f1; }
dlock() { "$BENCH" --server "$DLOCK_ADDR" --server-pid "$DPID" --duration "${SECS}s" --json "$@"; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

echo "== 1. CPU per request, 50 connections, one in flight each"
R_PING=$(redis_cpu_per_op 500000 -c 50 -t ping_mbulk); R_PING_RPS=$(redis_rps)
R_SET=$(redis_cpu_per_op 300000 -c 50 -r 1000000 SET 'key:__rand_int__' val NX PX 10000); R_SET_RPS=$(redis_rps)
# A redis lock cycle is SET NX PX then DEL. Fill most of the key space
# first, so the measured DELs mostly delete (a miss is about 10% cheaper).
redis-benchmark -p "$REDIS_PORT" -n 3000000 -c 50 -P 64 -r 1000000 -q SET 'key:__rand_int__' val >/dev/null 2>&1
R_DEL=$(redis_cpu_per_op 300000 -c 50 -r 1000000 DEL 'key:__rand_int__')
redis-cli -p "$REDIS_PORT" flushall >/dev/null
D_PING_JSON=$(dlock ping -c 50)
D_LU_JSON=$(dlock lock-unlock -c 50)
D_PING=$(echo "$D_PING_JSON" | field "r['server']['cpu_us_per_op']")
D_LU=$(echo "$D_LU_JSON" | field "r['server']['cpu_us_per_op']")
printf '%-34s %10s %10s %8s\n' "" "redis" "dlock" "ratio"
printf '%-34s %10.2f %10.2f %8.2f\n' "PING cpu us/op" "$R_PING" "$D_PING" "$(python3 -c "print($D_PING/$R_PING)")"
printf '%-34s %10.2f %10.2f %8.2f\n' "SET NX PX vs one Lock or Unlock" "$R_SET" "$(python3 -c "print($D_LU/2)")" "$(python3 -c "print($D_LU/2/$R_SET)")"
printf '%-34s %10.2f %10.2f %8.2f\n' "cycle: SET NX PX+DEL vs Lock+Unlock" "$(python3 -c "print($R_SET+$R_DEL)")" "$D_LU" "$(python3 -c "print($D_LU/($R_SET+$R_DEL))")"
printf '%-34s %10.2f %10.2f %8.2f\n' "one SET NX PX vs Lock+Unlock" "$R_SET" "$D_LU" "$(python3 -c "print($D_LU/$R_SET)")"
printf '%-34s %10s %10s\n' "req/s (ping)" "$R_PING_RPS" "$(echo "$D_PING_JSON" | field "round(r['ops_per_sec'])")"
printf '%-34s %10s %10s\n' "req/s (set / lock-unlock pairs)" "$R_SET_RPS" "$(echo "$D_LU_JSON" | field "round(r['ops_per_sec'])")"

echo "== 2. Pipelined PING, one connection, depth 256"
redis_cpu_per_op 5000000 -c 1 -P 256 -t ping_mbulk >/dev/null; R_P=$(redis_rps)
D_P=$(dlock pipeline --depth 256 | field "round(r['ops_per_sec'])")
printf 'redis %s req/s, dlock %s req/s, ratio %.2f (bar: >= 0.8)\n' "$R_P" "$D_P" "$(python3 -c "print($D_P/$R_P)")"

echo "== 3. Contended, 32 clients, one key (bar: >= 20000 handoffs/s, p99 < 1000 us, FIFO)"
dlock contended -c 32 | field "{k: r['extra'][k] for k in ('handoffs_per_sec','handoff_p50_us','handoff_p99_us','fifo_violations')}"

echo "== 6. Multi-key, 8 of 1000 keys, 32 connections (bar: 0 violations)"
dlock multikey -c 32 --keys 8 --pool 1000 | field "(round(r['ops_per_sec']), r['extra']['violations'])"

echo "== 5. Scaling: Lock+Unlock CPU with 1,000,000 other keys held (bar: <= 1.3x)"
BASE=$(dlock lock-unlock -c 50 | field "r['server']['cpu_us_per_op']")
"$BENCH" --server "$DLOCK_ADDR" --duration 120s --json hold --count 1000000 --keep >/dev/null
LOADED=$(dlock lock-unlock -c 50 | field "r['server']['cpu_us_per_op']")
printf 'empty %.2f us/op, with 1M held %.2f us/op, ratio %.2f\n' "$BASE" "$LOADED" "$(python3 -c "print($LOADED/$BASE)")"

echo "== 4. Memory: 1,000,000 lease keys; 10,000 idle connections"
kill "$DPID"; wait "$DPID" 2>/dev/null || true
target/release/dlock-server --listen "$DLOCK_ADDR" --threads 1 --max-connections 20000 2>/dev/null &
PIDS+=($!); DPID=$!
sleep 0.5
dlock hold --count 1000000 | field "{k: r['extra'].get(k) for k in ('rss_held_mib','bytes_per_key','rss_released_mib')}"
kill "$DPID"; wait "$DPID" 2>/dev/null || true
target/release/dlock-server --listen "$DLOCK_ADDR" --threads 1 --max-connections 20000 2>/dev/null &
PIDS+=($!); DPID=$!
sleep 0.5
dlock conns --idle 10000 --active 4 | field "{k: r['extra'][k] for k in ('rss_with_idle_mib','p99_us_without_idle','p99_us_with_idle','p99_ratio')}"
rm -f /tmp/redis-bench.$$
