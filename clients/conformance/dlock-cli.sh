#!/bin/sh
# The `dlock` command as a client under test for kit.py: takes KEY, prints
# "held FENCE", keeps the lock until a line arrives on stdin, then lets
# dlock release it. A lost lock makes dlock stop the command and exit 75,
# which the kit counts as lost. DLOCK names the binary (default: dlock).
#
# With `--turns N KEY`: two workers, each a loop of N `dlock` runs on KEY
# (a dlock run is the CLI's client), print "enter W FENCE" and
# "leave W FENCE" around a 20 ms hold. Each line is one short write, so
# the two loops' lines never mix.
set -eu
dlock="${DLOCK:-dlock}"
if [ "${1:-}" = "--turns" ]; then
  n="$2" key="$3"
  worker() {
    i=0
    while [ "$i" -lt "$n" ]; do
      W="$1" "$dlock" -k "$key" -- sh -c \
        'echo "enter $W $DLOCK_FENCE"; sleep 0.02; echo "leave $W $DLOCK_FENCE"' \
        || { echo "error worker $1: dlock exited $?"; return 1; }
      i=$((i + 1))
    done
  }
  worker 1 & one=$!
  worker 2 & two=$!
  status=0
  wait "$one" || status=1
  wait "$two" || status=1
  exit "$status"
fi
exec "$dlock" -k "$1" -- sh -c 'echo "held $DLOCK_FENCE"; read -r _; echo released'
