#!/usr/bin/env bash
# CI for the TypeScript client (for .ci/run, after `cargo build` made the
# server and clients/python/tools/ci.sh made the venv the conformance kit
# runs in): installs Node.js and npm from Debian's packages when missing,
# installs the node modules from the committed lockfile (npm ci), checks
# that the generated code matches proto/dlock.proto, builds, runs the tests
# against the dlock-server binary, checks that the packed tarball installs
# and loads in an empty project, and runs the client conformance kit on the
# client. Only node and npm (and the npm registry) are needed; openssl for
# the TLS tests, which are skipped without it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
node --version

export DLOCK_SERVER_BIN="${DLOCK_SERVER_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/dlock-server}"
if [ ! -x "$DLOCK_SERVER_BIN" ]; then
  echo "typescript client: $DLOCK_SERVER_BIN not found: build it with cargo build -p dlock-server" >&2
  exit 1
fi

cd "$here"
npm ci --no-audit --no-fund
npm run gen:check
npm run build
# Two test files at a time (package.json's --test-concurrency=2), each with
# servers of its own: their time is mostly waiting for elections and
# failovers, as with `cargo test`'s two threads.
npm test

# The packed tarball installs into an empty project and loads there.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tarball="$(npm pack --silent --pack-destination "$work" | tail -n 1)"
(
  cd "$work"
  npm init -y >/dev/null
  npm install --no-audit --no-fund "./$tarball" >/dev/null
  node -e 'const d = require("dlock"); if (typeof d.connect !== "function" || typeof d.Lock !== "function") process.exit(1)'
  test -f node_modules/dlock/dist/src/index.d.ts
)

# The conformance kit (docs/CLIENTS.md) on the TypeScript client, with the
# Python venv the Python client's CI made (the kit reads frames with protobuf).
# Under .ci/run (DLOCK_KITS_TOGETHER) clients/conformance/ci.sh runs it
# beside the other clients'.
if [ -z "${DLOCK_KITS_TOGETHER:-}" ]; then
  "$root/.ci-venv/bin/python" "$root/clients/conformance/kit.py" \
    --server-bin "$DLOCK_SERVER_BIN" -- node "$here/dist/tools/conformance.js"
fi
