#!/usr/bin/env bash
# Failover time of a three-node cluster on this machine: SIGKILL the leader,
# then time until a lock is granted by the new leader (a fresh `dlock -n`
# against each surviving node in turn, so the figure includes finding it).
# The killed node is restarted and the cluster settles before each trial.
# Prints one line per trial, then p50 and max.
#
# Usage: bench/failover.sh [TRIALS] [SERVER-BINARY-DIR]   (default 20, target/release)
# Extra server flags (e.g. --election-timeout 250ms) in $FLAGS.
# Needs dlock-server and dlock built there (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-20}
BIN=${2:-target/release}
SERVER=$BIN/dlock-server
DLOCK=$BIN/dlock
TMP=$(mktemp -d)
declare -A PID
CLIENT=(127.0.0.1:17501 127.0.0.1:17502 127.0.0.1:17503)
PEER=(127.0.0.1:17511 127.0.0.1:17512 127.0.0.1:17513)
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
cleanup() { for p in "${PID[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

start() { # start NODE (1-based)
  local i=$(($1 - 1))
  "$SERVER" --node-id "$1" --data-dir "$TMP/n$1" --listen "${CLIENT[$i]}" --peer-listen "${PEER[$i]}" \
    --initial-cluster "$MEMBERS" --log-level warn ${FLAGS:-} 2>>"$TMP/n$1.log" &
  PID[$1]=$!
}

# The leader every live node names, once they all agree and have applied
# the same log (the node restarted in the last trial has caught up: a
# healthy cluster); empty until then.
settled_leader() {
  local seen="" applied=""
  for n in 1 2 3; do
    local out
    out=$("$DLOCK" cluster -s "${CLIENT[$((n - 1))]}" status 2>/dev/null) || return 0
    local l a
    l=$(sed -n 's/.*; leader \([0-9]*\);.*/\1/p' <<<"$out" | head -1)
    a=$(sed -n 's/.*, applied \([0-9]*\)$/\1/p' <<<"$out" | head -1)
    [[ -n $l && -n $a ]] || return 0
    [[ -z $seen || $seen == "$l" ]] || return 0
    [[ -z $applied || $applied == "$a" ]] || return 0
    seen=$l applied=$a
  done
  echo "$seen"
}

wait_settled() {
  local deadline=$((SECONDS + 60)) l=""
  while [[ -z $l ]]; do
    (( SECONDS < deadline )) || { echo "failover.sh: the cluster never settled" >&2; exit 1; }
    l=$(settled_leader)
  done
  echo "$l"
}

for n in 1 2 3; do start $n; done
times=()
for t in $(seq 1 "$TRIALS"); do
  leader=$(wait_settled)
  kill -9 "${PID[$leader]}"; wait "${PID[$leader]}" 2>/dev/null || true
  unset "PID[$leader]"
  t0=$(date +%s%N)
  done_=""
  deadline=$((SECONDS + 30))
  while [[ -z $done_ ]]; do
    (( SECONDS < deadline )) || { echo "failover.sh: no grant within 30 s" >&2; exit 1; }
    for n in 1 2 3; do
      [[ $n == "$leader" ]] && continue
      if "$DLOCK" -s "${CLIENT[$((n - 1))]}" -n -k "failover-$t" -- true 2>/dev/null; then
        done_=$n; break
      fi
    done
  done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  times+=("$ms")
  echo "trial $t: leader $leader killed; node $done_ granted after $ms ms"
  start "$leader"
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
echo "failover over $TRIALS trials: p50 ${sorted[$(( (TRIALS - 1) / 2 ))]} ms, max ${sorted[$((TRIALS - 1))]} ms"
