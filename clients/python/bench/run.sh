#!/usr/bin/env bash
# Starts a release dlock-server (--threads 1, as bench/compare.sh) and a
# redis-server on loopback ports they or we pick, runs lock_cycles.py against
# both with their pids, and stops both, whatever happens. Not run in CI.
#
# Usage: clients/python/bench/run.sh [lock_cycles.py options]   (PYTHON= the
# interpreter with dlock and redis installed; default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-.venv/bin/python}
command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install -y redis-server" >&2; exit 1; }
"$PY" -c 'import dlock, redis' || { echo "$PY needs: pip install ./clients/python -r clients/python/bench/requirements.txt" >&2; exit 1; }
cargo build --release -q -p dlock-server

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

LOG=$(mktemp)
target/release/dlock-server --listen 127.0.0.1:0 --threads 1 --log-level info 2>"$LOG" &
PIDS+=($!); DPID=$!
# redis cannot pick its own port and say which: take a free one from the kernel.
RPORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
PIDS+=($!); RPID=$!
DADDR=
for _ in $(seq 100); do
  DADDR=$(grep -oE 'listening addr=[0-9.:]+' "$LOG" | cut -d= -f2 || true)
  [ -n "$DADDR" ] && redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break
  sleep 0.05
done
[ -n "$DADDR" ] || { echo "dlock-server did not start: $(cat "$LOG")" >&2; exit 1; }
echo "dlock-server $DADDR (pid $DPID), redis-server 127.0.0.1:$RPORT (pid $RPID)"
"$PY" clients/python/bench/lock_cycles.py --dlock "$DADDR" --dlock-pid "$DPID" \
  --redis "127.0.0.1:$RPORT" --redis-pid "$RPID" "$@"
