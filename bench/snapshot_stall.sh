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
for need in "$BIN/dlock-server" "$BIN/dlock" "$BIN/dlock-bench"; do
  [[ -x $need ]] || { echo "snapshot_stall.sh: $need is missing" >&2; exit 2; }
done
TMP=$(mktemp -d)
PIDS=()
HOLDER=""
cleanup() { for p in "${PIDS[@]}" $HOLDER; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

CLIENT=(127.0.0.1:17721 127.0.0.1:17722 127.0.0.1:17723)
PEER=(127.0.0.1:17731 127.0.0.1:17732 127.0.0.1:17733)
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
for n in 1 2 3; do
  i=$((n - 1))
  "$BIN/dlock-server" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$i]}" \
    --peer-listen "${PEER[$i]}" --initial-cluster "$MEMBERS" --max-keys "$BATCH" \
    --max-held-keys $((COUNT + 1000)) --snapshot-every 100000000 --log-level info \
    2>>"$TMP/d$n.log" 3>&- &
  PIDS+=($!)
  disown
done

deadline=$((SECONDS + 60))
LEADER=""
while [[ -z $LEADER ]]; do
  (( SECONDS < deadline )) || { echo "snapshot_stall.sh: no leader within 60 s" >&2; exit 1; }
  sleep 0.5
  LEADER=$("$BIN/dlock" cluster -s "${CLIENT[0]}" status 2>/dev/null | sed -n 's/.*; leader \([0-9]*\);.*/\1/p' | head -1 || true)
done
LADDR=${CLIENT[$((LEADER - 1))]}
FOLLOWER=$((LEADER % 3 + 1))
echo "leader: node $LEADER, follower asked: node $FOLLOWER; $COUNT keys; $(nproc) cores; $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

start=$SECONDS
mkfifo "$TMP/holder.in"
"$BIN/dlock-bench" --server "$LADDR" --duration 1200s hold --count "$COUNT" --batch "$BATCH" \
  --release-on-input -c 4 --depth 1 <"$TMP/holder.in" >"$TMP/holder.out" &
HOLDER=$!
exec 3>"$TMP/holder.in"
until grep -q '^holding' "$TMP/holder.out"; do
  kill -0 "$HOLDER" 2>/dev/null || { cat "$TMP/holder.out"; echo "snapshot_stall.sh: hold failed" >&2; exit 1; }
  (( SECONDS < start + 1200 )) || { echo "snapshot_stall.sh: keys not taken in time" >&2; exit 1; }
  sleep 0.5
done
echo "$(head -1 "$TMP/holder.out"); took $((SECONDS - start)) s"
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
