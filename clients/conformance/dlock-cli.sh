#!/bin/sh
# The `dlock` command as a client under test for kit.py: takes KEY, prints
# "held FENCE", keeps the lock until a line arrives on stdin, then lets
# dlock release it. A lost lock makes dlock stop the command and exit 75,
# which the kit counts as lost. DLOCK names the binary (default: dlock).
set -eu
exec "${DLOCK:-dlock}" -k "$1" -- sh -c 'echo "held $DLOCK_FENCE"; read -r _; echo released'
