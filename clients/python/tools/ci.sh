#!/usr/bin/env bash
# CI for the Python client (called by .ci/run after `cargo test`): a venv in
# the checkout (.ci-venv, git-ignored) with the package installed as users
# install it, a check that the generated code is current, then pytest against
# the dlock-server binary `cargo test` built. pytest's "no tests ran" (exit 5)
# is a failure here: a suite that silently collects nothing must not pass.
set -euo pipefail
cd "$(dirname "$0")/../../.."

VENV=.ci-venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  -r clients/python/requirements-dev.txt ./clients/python
"$VENV/bin/python" clients/python/tools/gen_proto.py --check

bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/dlock-server"
if [ ! -x "$bin" ]; then
  cargo build -p dlock-server
fi
# `import dlock` in the tests finds the installed package: src/ is never put
# on sys.path, so this also checks what `pip install` installs. Four
# workers (pytest-xdist): the tests mostly wait on timers and failovers,
# 130 s one at a time, 45 s in four on 2 cores.
status=0
DLOCK_SERVER_BIN="$bin" \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 4 clients/python/tests || status=$?
if [ "$status" -eq 5 ]; then
  echo "python client: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
