# shellcheck shell=bash
# The start of the cluster bench scripts that hold many leases
# (cluster_memory.sh, snapshot_stall.sh): three dlock-server nodes (fsync on)
# on loopback, the leader found, and COUNT one-hour leases taken through it
# and kept until fd 3 closes. Source it after setting:
#   NAME       the script's name, for its messages
#   BIN        the directory of dlock-server, dlock and dlock-bench
#   COUNT      keys to hold; BATCH keys a Lock
#   CLIENT, PEER  arrays of the nodes' client and peer addresses
#   NODE_ARGS  an array of further flags every node gets
# It sets TMP (removed at exit), PIDS, MEMBERS, and after `await_leader`,
# LEADER and LADDR.

for need in "$BIN/dlock-server" "$BIN/dlock" "$BIN/dlock-bench"; do
  [[ -x $need ]] || { echo "$NAME: $need is missing" >&2; exit 2; }
done
TMP=$(mktemp -d)
PIDS=()
HOLDER=""
cleanup() { for p in "${PIDS[@]}" $HOLDER; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"

# Starts node N with NODE_ARGS and any further ARGS; its log is $TMP/dN.log.
start_node() { # N [ARGS...]
  local n=$1 i=$(($1 - 1))
  shift
  "$BIN/dlock-server" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$i]}" \
    --peer-listen "${PEER[$i]}" --initial-cluster "$MEMBERS" --max-keys "$BATCH" \
    --max-held-keys $((COUNT + 1000)) "${NODE_ARGS[@]}" "$@" 2>>"$TMP/d$n.log" 3>&- &
  PIDS+=($!)
  disown
}

# Waits up to 60 s for a leader; sets LEADER (its id) and LADDR.
await_leader() {
  local deadline=$((SECONDS + 60))
  LEADER=""
  while [[ -z $LEADER ]]; do
    (( SECONDS < deadline )) || { echo "$NAME: no leader within 60 s" >&2; exit 1; }
    sleep 0.5
    LEADER=$("$BIN/dlock" cluster -s "${CLIENT[0]}" status 2>/dev/null | sed -n 's/.*; leader \([0-9]*\);.*/\1/p' | head -1 || true)
  done
  LADDR=${CLIENT[$((LEADER - 1))]}
}

# Takes the COUNT leases through the leader; they are held until fd 3
# closes, after which `wait "$HOLDER"` says whether releasing worked.
hold_keys() {
  local start=$SECONDS
  mkfifo "$TMP/holder.in"
  "$BIN/dlock-bench" --server "$LADDR" --duration 1200s hold --count "$COUNT" --batch "$BATCH" \
    --release-on-input -c 4 --depth 1 <"$TMP/holder.in" >"$TMP/holder.out" &
  HOLDER=$!
  exec 3>"$TMP/holder.in"
  until grep -q '^holding' "$TMP/holder.out"; do
    kill -0 "$HOLDER" 2>/dev/null || { cat "$TMP/holder.out"; echo "$NAME: hold failed" >&2; exit 1; }
    (( SECONDS < start + 1200 )) || { echo "$NAME: keys not taken in time" >&2; exit 1; }
    sleep 0.5
  done
  echo "$(head -1 "$TMP/holder.out"); took $((SECONDS - start)) s"
}
