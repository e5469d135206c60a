#!/usr/bin/env bash
# Lock and Unlock latency on a 3-node cluster holding COUNT leases, without
# and with snapshots being written (issue 44, "no stall during a snapshot").
#
# Three dlock-server nodes (fsync on) on loopback, with --snapshot-every too
# large to reach in the run, so that no node writes a snapshot unless asked;
# dlock-bench takes COUNT keys as one-hour leases through the leader (BATCH
# keys a Lock) and keeps them; then `dlock-bench snapshot-stall` runs CONNS
# connections locking and unlocking keys of their own on the leader, PHASE
# seconds quiet, PHASE seconds with the leader asked for a snapshot every
# EVERY (SIGUSR1), PHASE seconds with a follower asked the same. Followers
# refuse client requests (NotLeader), so a follower's stall is seen two
# ways: what it does to the leader's clients, and how long its own applying
# waited for each snapshot (`applying_paused_us`, or `_ms` before issue 44),
# from its `snapshot written` log lines, printed at the end for every node.
#
# Usage: bench/snapshot_stall.sh [COUNT] [PHASE] [BINARY-DIR] [CONNS] [EVERY]
#        (default 1000000 10 target/release 16 1s)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-1000000}
PHASE=${2:-10}
BIN=${3:-target/release}
CONNS=${4:-16}
EVERY=${5:-1s}
BATCH=256
NAME=snapshot_stall.sh
CLIENT=(127.0.0.1:17721 127.0.0.1:17722 127.0.0.1:17723)
PEER=(127.0.0.1:17731 127.0.0.1:17732 127.0.0.1:17733)
NODE_ARGS=(--snapshot-every 100000000 --log-level info)
# shellcheck source=bench/lib/cluster.sh
source bench/lib/cluster.sh
for n in 1 2 3; do start_node "$n"; done
await_leader
FOLLOWER=$((LEADER % 3 + 1))
echo "leader: node $LEADER, follower asked: node $FOLLOWER; $COUNT keys; $(nproc) cores; $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

hold_keys
# Every node has applied the keys before the quiet phase starts.
sleep 3
before=$(cat "$TMP"/d*.log | grep -c 'snapshot written' || true)
"$BIN/dlock-bench" --server "$LADDR" --duration "${PHASE}s" snapshot-stall -c "$CONNS" \
  --leader-pid "${PIDS[$((LEADER - 1))]}" --follower-pid "${PIDS[$((FOLLOWER - 1))]}" --every "$EVERY"
echo "snapshots written before the phases: $before (none expected)"
for n in 1 2 3; do
  role=$([[ $n == "$LEADER" ]] && echo leader || { [[ $n == "$FOLLOWER" ]] && echo "follower asked" || echo follower; })
  paused=$(grep 'snapshot written' "$TMP/d$n.log" | sed -n 's/.*applying_paused_\(ms\|us\)=\([0-9]*\).*/\2\1/p' | tr '\n' ' ' || true)
  took=$(grep 'snapshot written' "$TMP/d$n.log" | sed -n 's/.*took_ms=\([0-9]*\).*/\1ms/p' | tr '\n' ' ' || true)
  echo "node $n ($role): snapshots $(grep -c 'snapshot written' "$TMP/d$n.log" || true), applying paused: ${paused:-none}; each took: ${took:-?}"
done
exec 3>&-
wait "$HOLDER" || true
