#!/usr/bin/env bash
# One cluster node's memory and disk with COUNT lease keys held, after a
# snapshot, and again after they are released: three dlock-server nodes
# (fsync on) on loopback; dlock-bench takes COUNT keys as one-hour leases
# through the leader (BATCH keys a Lock) and keeps them; enough lock-unlock
# cycles follow for every node to write a snapshot holding every key; then
# a fourth node joins and is sent that snapshot (in chunks); then each
# node's RSS (now and peak) and the size of its data directory; a follower
# is restarted, reading the table back from its snapshot. Then the keys are
# released, snapshots written again, the figures taken again, and node 1
# restarted (reading the emptied table back from its snapshot).
#
# Usage: bench/cluster_memory.sh [COUNT] [BATCH] [BINARY-DIR]   (default 1000000 256 target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000}
BATCH=${2:-256}
BIN=${3:-target/release}
NAME=cluster_memory.sh
CLIENT=(127.0.0.1:17701 127.0.0.1:17702 127.0.0.1:17703 127.0.0.1:17704)
PEER=(127.0.0.1:17711 127.0.0.1:17712 127.0.0.1:17713 127.0.0.1:17714)
NODE_ARGS=(--log-level warn)
# shellcheck source=bench/lib/cluster.sh
source bench/lib/cluster.sh
for n in 1 2 3; do start_node "$n"; done
await_leader
echo "leader: node $LEADER; $COUNT keys, $BATCH a Lock; $(nproc) cores"

NODES=(1 2 3)
figures() { # LABEL
  for n in "${NODES[@]}"; do
    local pid=${PIDS[$((n - 1))]}
    local rss hwm disk
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status")
    hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status")
    disk=$(du -sk "$TMP/d$n" | cut -f1)
    printf '%-16s node %d%s  RSS %6.1f MiB  peak %6.1f MiB  data dir %6.1f MiB\n' "$1" "$n" \
      "$([[ $n == "$LEADER" ]] && echo ' (leader)' || echo '         ')" \
      "$(echo "$rss / 1024" | bc -l)" "$(echo "$hwm / 1024" | bc -l)" "$(echo "$disk / 1024" | bc -l)"
  done
  find "$TMP" -path '*snapshot*' -type f -exec ls -l {} + | awk '{ printf "  %s %.1f MiB\n", $9, $5 / 1048576 }' | sed "s|$TMP/||"
}
# Enough committed entries for every node's next snapshot (one every 10,000
# entries) to hold the table as it is now: one client, so each Lock and each
# Unlock is an entry of its own (the leader puts concurrent commands into one
# entry), until every node has written one after MARK; a snapshot is written
# in the background.
snapshot_everywhere() {
  local mark=$TMP/mark
  touch "$mark"
  sleep 1
  for _ in $(seq 30); do
    snaps=$(find "$TMP" -path '*/snapshot' -type f -newer "$mark" 2>/dev/null | wc -l)
    (( snaps >= ${#NODES[@]} )) && break
    "$BIN/dlock-bench" --server "$LADDR" --duration 60s --ops 2000 lock-unlock -c 1 >/dev/null
  done
  sleep 2
}
# Stops node N (SIGTERM), starts it again on its data directory, and waits
# until it follows the leader again.
restart_node() { # N
  local n=$1 i=$(($1 - 1))
  kill -TERM "${PIDS[$i]}"
  while kill -0 "${PIDS[$i]}" 2>/dev/null; do sleep 0.2; done
  start_node "$n"
  PIDS[i]=${PIDS[-1]}
  unset 'PIDS[-1]'
  local deadline=$((SECONDS + 120))
  # `dlock cluster status` prints the leader's view first, then each node's
  # own (the NODE table): that one must say follower.
  until "$BIN/dlock" cluster -s "${CLIENT[$i]}" status 2>/dev/null |
    awk -v n="$n" '/^NODE/ { own = 1; next } own && $1 == n && $2 == "follower" { found = 1 } END { exit !found }'; do
    (( SECONDS < deadline )) || { echo "cluster_memory.sh: node $n did not come back within 120 s" >&2; exit 1; }
    sleep 0.5
  done
}
figures "empty"
# The holder keeps the keys until its standard input ends (fd 3 closes).
hold_keys
snapshot_everywhere
figures "held, snapshot"

# A fourth node joins: the leader sends it the snapshot, as to any node too
# far behind for the log.
MEMBERS="$MEMBERS,4=${CLIENT[3]}@${PEER[3]}"
start_node 4 --initial-cluster-state existing
NODES=(1 2 3 4)
"$BIN/dlock" cluster -s "$LADDR" add 4 "${CLIENT[3]}" "${PEER[3]}" >/dev/null
figures "node 4 joined"
# A follower restarted with the keys held: it reads the table back from its
# snapshot (the leader stays, so the holder keeps its connections).
FOLLOWER=$((LEADER % 3 + 1))
restart_node "$FOLLOWER"
figures "node $FOLLOWER restarted"

exec 3>&-
wait "$HOLDER" || { cat "$TMP/holder.out"; echo "cluster_memory.sh: releasing failed" >&2; exit 1; }
snapshot_everywhere
figures "released"

# A restart after the release: the table read back from the latest snapshot
# (the log's purged segments were deleted at the purge, before it).
restart_node 1
figures "node 1 restarted"
