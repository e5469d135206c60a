#!/usr/bin/env bash
# The Python and Go clients of two commits side by side, against one server:
# lock+unlock cycles/s of 32 tasks (goroutines) on ONE client, each on a key
# of its own (unrelated locks), rounds alternating old/new so a drift of the
# shared machine hits both alike. With a 1-connection Ping rate (Go's
# ping-1) as the same-run reference. Not run in CI.
#
# Usage: bench/clients_before_after.sh OLD_COMMIT [ROUNDS] [SECONDS]
#   Needs: python3, go, Debian's golang-google-protobuf-dev (as clients/go/ci.sh),
#   redis-server (lock_cycles.py measures redis-py beside dlock), and
#   target/debug/dlock-server (cargo build -p dlock-server); SERVER= another
#   binary (a release build) if wanted.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/clients_before_after.sh OLD_COMMIT [ROUNDS] [SECONDS]}
rounds=${2:-5}
seconds=${3:-3}
server=${SERVER:-target/debug/dlock-server}
root=$PWD
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

git worktree add --detach -q "$work/old" "$old"
for side in old new; do
  src=$root; [ "$side" = old ] && src=$work/old
  python3 -m venv "$work/venv-$side"
  "$work/venv-$side/bin/pip" install -q --disable-pip-version-check "$src/clients/python" \
    -r "$root/clients/python/bench/requirements.txt"
  mkdir -p "$work/gopath-$side/src/dlock/clients"
  ln -s "$src/clients/go" "$work/gopath-$side/src/dlock/clients/go"
  (cd "$work/gopath-$side/src/dlock/clients/go" \
    && GOPATH="$work/gopath-$side:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOPROXY=off \
       go build -o "$work/gobench-$side" ./bench)
done

log=$(mktemp)
"$server" --listen 127.0.0.1:0 --log-level info 2>"$log" &
pids+=($!); spid=$!
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
pids+=($!)
addr=
for _ in $(seq 100); do
  addr=$(grep -oE 'listening addr=[0-9.:]+' "$log" | cut -d= -f2 || true)
  [ -n "$addr" ] && break
  sleep 0.05
done
[ -n "$addr" ] || { echo "dlock-server did not start" >&2; exit 1; }
echo "server $server at $addr; $rounds rounds of ${seconds}s; old $old, new $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for side in old new; do
    py=$("$work/venv-$side/bin/python" clients/python/bench/lock_cycles.py --dlock "$addr" \
      --dlock-pid "$spid" --redis "127.0.0.1:$rport" --seconds "$seconds" --rounds 1 2>&1 \
      | awk '$1 == "dlock" {print $2}' || true)
    go=$("$work/gobench-$side" -server "$addr" -seconds "$seconds" -rounds 1 \
      | awk '/^one-conn/ {o=$2} /^ping-1/ {p=$2} END {print o, p}')
    echo "round $r $side: python-32-tasks ${py:-?} cycles/s; go one-conn/ping-1 $go"
  done
done
