#!/usr/bin/env bash
# Memory per held lease, dlock beside redis in one run (issue 44): COUNT
# keys with the same 16-byte names ("hold/00000000042") held as one-hour
# leases, by the in-memory dlock-server (`dlock-bench hold --keep`) and by
# redis-server (`SET name 1 PX 3600000`). Prints each one's RSS before and
# after and the bytes per key, and dlock's ratio to redis.
#
# With --cluster, dlock is a 3-node cluster on loopback (fsync on) instead,
# the keys taken through the leader 256 a Lock, and each node's RSS is read
# once the followers have applied them (a node at rest).
#
# Usage: bench/memory.sh [COUNT] [BINARY_DIR] [--cluster]
#   (default 1000000 target/release; the dir holds dlock-server, dlock-bench
#   and, for --cluster, dlock)
# Needs redis-server (installed from Debian's packages if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000}
BIN=${2:-target/release}
CLUSTER=${3:-}
SERVER=$BIN/dlock-server
BENCH=$BIN/dlock-bench
for need in "$SERVER" "$BENCH"; do
  [[ -x $need ]] || { echo "memory.sh: $need is missing (cargo build --release)" >&2; exit 2; }
done
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt-get update -qq >/dev/null && apt-get install -y -qq redis-server redis-tools >/dev/null
fi
REDIS_PORT=16379
DLOCK_ADDR=127.0.0.1:17436
PIDS=()
TMP=$(mktemp -d)
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$TMP"' EXIT

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
RPID=$!
PIDS+=("$RPID")
if [[ $CLUSTER == --cluster ]]; then
  CLIENT=(127.0.0.1:17701 127.0.0.1:17702 127.0.0.1:17703)
  PEER=(127.0.0.1:17711 127.0.0.1:17712 127.0.0.1:17713)
  MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
  NODE_PIDS=()
  for n in 1 2 3; do
    "$SERVER" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$((n - 1))]}" \
      --peer-listen "${PEER[$((n - 1))]}" --initial-cluster "$MEMBERS" --max-keys 256 \
      --max-held-keys $((COUNT + 1000)) --log-level warn 2>>"$TMP/d$n.log" &
    NODE_PIDS+=($!)
    PIDS+=($!)
  done
  LEADER=""
  for _ in $(seq 120); do
    LEADER=$("$BIN/dlock" cluster -s "${CLIENT[0]}" status 2>/dev/null |
      sed -n 's/.*; leader \([0-9]*\);.*/\1/p' | head -1 || true)
    [[ -n $LEADER ]] && break
    sleep 0.5
  done
  [[ -n $LEADER ]] || { echo "memory.sh: no leader within 60 s" >&2; exit 1; }
  DLOCK_ADDR=${CLIENT[$((LEADER - 1))]}
else
  "$SERVER" --listen "$DLOCK_ADDR" --threads 1 --log-level warn >/dev/null 2>&1 &
  NODE_PIDS=($!)
  PIDS+=($!)
fi
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 &&
    "$BENCH" --server "$DLOCK_ADDR" --duration 100ms ping -c 1 >/dev/null 2>&1 && break
  sleep 0.1
done

R0=$(rss_kib "$RPID")
# The same names dlock-bench's hold takes, sent as one pipelined stream.
python3 - "$COUNT" <<'PY' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
import sys
out = sys.stdout.buffer
for i in range(int(sys.argv[1])):
    k = b"hold/%011d" % i
    out.write(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\n1\r\n$2\r\nPX\r\n$7\r\n3600000\r\n" % (len(k), k))
PY
KEYS=$(redis-cli -p "$REDIS_PORT" dbsize)
R1=$(rss_kib "$RPID")

BEFORE=()
for p in "${NODE_PIDS[@]}"; do BEFORE+=("$(rss_kib "$p")"); done
BATCH=1
[[ $CLUSTER == --cluster ]] && BATCH=256
"$BENCH" --server "$DLOCK_ADDR" --duration 300s --json hold --count "$COUNT" --batch "$BATCH" --keep >/dev/null
if [[ $CLUSTER == --cluster ]]; then
  # At rest: every node has applied every entry (the followers a little
  # after the leader).
  target=$("$BIN/dlock" cluster -s "$DLOCK_ADDR" status -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["committed_index"])')
  for _ in $(seq 120); do
    behind=0
    for addr in "${CLIENT[@]}"; do
      at=$("$BIN/dlock" cluster -s "$addr" status -o json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["last_applied_index"])' || echo 0)
      (( at >= target )) || behind=1
    done
    (( behind == 0 )) && break
    sleep 0.5
  done
  sleep 2
fi
AFTER=()
for p in "${NODE_PIDS[@]}"; do AFTER+=("$(rss_kib "$p")"); done

python3 - "$COUNT" "$KEYS" "$R0" "$R1" "${LEADER:-0}" "${BEFORE[*]}" "${AFTER[*]}" <<'PY'
import sys
count, keys, r0, r1, leader = map(int, sys.argv[1:6])
before = list(map(int, sys.argv[6].split()))
after = list(map(int, sys.argv[7].split()))
rb = (r1 - r0) * 1024 / keys
print(f"{'':14} {'keys':>9} {'RSS before':>11} {'RSS held':>10} {'bytes/key':>10} {'vs redis':>9}")
print(f"{'redis':14} {keys:>9} {r0/1024:>9.1f}Mi {r1/1024:>8.1f}Mi {rb:>10.1f}")
for i, (d0, d1) in enumerate(zip(before, after), 1):
    db = (d1 - d0) * 1024 / count
    name = "dlock" if len(before) == 1 else f"node {i}" + (" (leader)" if i == leader else "")
    print(f"{name:14} {count:>9} {d0/1024:>9.1f}Mi {d1/1024:>8.1f}Mi {db:>10.1f} {db/rb:>9.2f}")
print("bar: bytes per key <= redis's (ratio <= 1.00)")
PY
