#!/usr/bin/env bash
# One cluster node's memory and disk with COUNT lease keys held, after a
# snapshot: three dlock-server nodes (fsync on) on loopback; dlock-bench
# takes COUNT keys as one-hour leases through the leader (BATCH keys a Lock),
# then sends enough Pings (each commits a keep-alive) for the nodes to take a
# snapshot holding every key; then each node's RSS (now and peak) and the
# size of its data directory.
#
# Usage: bench/cluster_memory.sh [COUNT] [BATCH] [BINARY-DIR]   (default 1000000 256 target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000}
BATCH=${2:-256}
BIN=${3:-target/release}
for need in "$BIN/dlock-server" "$BIN/dlock" "$BIN/dlock-bench"; do
  [[ -x $need ]] || { echo "cluster_memory.sh: $need is missing" >&2; exit 2; }
done
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

CLIENT=(127.0.0.1:17701 127.0.0.1:17702 127.0.0.1:17703)
PEER=(127.0.0.1:17711 127.0.0.1:17712 127.0.0.1:17713)
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
for n in 1 2 3; do
  i=$((n - 1))
  "$BIN/dlock-server" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$i]}" \
    --peer-listen "${PEER[$i]}" --initial-cluster "$MEMBERS" --max-keys "$BATCH" \
    --max-held-keys $((COUNT + 1000)) --log-level warn 2>>"$TMP/d$n.log" &
  PIDS+=($!)
  disown
done

deadline=$((SECONDS + 60))
LEADER=""
while [[ -z $LEADER ]]; do
  (( SECONDS < deadline )) || { echo "cluster_memory.sh: no leader within 60 s" >&2; exit 1; }
  sleep 0.5
  LEADER=$("$BIN/dlock" cluster -s "${CLIENT[0]}" status 2>/dev/null | sed -n 's/.*; leader \([0-9]*\);.*/\1/p' | head -1 || true)
done
LADDR=${CLIENT[$((LEADER - 1))]}
echo "leader: node $LEADER; $COUNT keys, $BATCH a Lock; $(nproc) cores"

figures() { # LABEL
  for n in 1 2 3; do
    local pid=${PIDS[$((n - 1))]}
    local rss hwm disk
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
    hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status")
    disk=$(du -sk "$TMP/d$n" | cut -f1)
    printf '%-16s node %d%s  RSS %6.1f MiB  peak %6.1f MiB  data dir %6.1f MiB\n' "$1" "$n" \
      "$([[ $n == "$LEADER" ]] && echo ' (leader)' || echo '         ')" \
      "$(echo "$rss / 1024" | bc -l)" "$(echo "$hwm / 1024" | bc -l)" "$(echo "$disk / 1024" | bc -l)"
  done
}
figures "empty"
start=$SECONDS
"$BIN/dlock-bench" --server "$LADDR" --duration 1200s hold --count "$COUNT" --batch "$BATCH" \
  --keep -c 4 --depth 1
echo "took $((SECONDS - start)) s"
# Enough committed entries for every node's next snapshot (one every 10,000
# entries) to hold all of them: one client, so each Lock and each Unlock is an
# entry of its own (the leader puts concurrent commands into one entry), until
# every node has written one; a snapshot is written in the background.
for _ in $(seq 30); do
  snaps=$(find "$TMP" -path '*snapshot*' -type f 2>/dev/null | wc -l)
  (( snaps >= 3 )) && break
  "$BIN/dlock-bench" --server "$LADDR" --duration 60s --ops 2000 lock-unlock -c 1 >/dev/null
done
sleep 2
figures "held, snapshot"
find "$TMP" -path '*snapshot*' -type f -exec ls -l {} + | awk '{ printf "%s %.1f MiB\n", $9, $5 / 1048576 }' | sed "s|$TMP/||"
