#!/usr/bin/env bash
# CI for the client conformance kit (called by .ci/run after the Python
# client's CI, whose venv has the protobuf runtime the kit reads frames
# with and the dlock package the Python adapter uses): the kit against the
# `dlock` command, the Rust library (examples/conformance_client.rs, built by
# `cargo test`) and the Python client, and under .ci/run the Go and
# TypeScript clients too, all at once.
set -euo pipefail
cd "$(dirname "$0")/../.."

py=.ci-venv/bin/python
target="${CARGO_TARGET_DIR:-$PWD/target}/debug"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# The runs at once: each is mostly waiting (a leader paused past the TTL,
# a failover), on its own cluster and random loopback ports, so together
# they take about the time of one. Under .ci/run (DLOCK_KITS_TOGETHER) the
# Go and TypeScript clients' programs, which their CI built, run here too.
runs=(cli rust python)
DLOCK="$target/dlock" "$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- clients/conformance/dlock-cli.sh >"$out/cli" 2>&1 &
pid_cli=$!
"$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- "$target/examples/conformance_client" >"$out/rust" 2>&1 &
pid_rust=$!
"$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- "$py" clients/python/tools/conformance_client.py >"$out/python" 2>&1 &
pid_python=$!
if [ -n "${DLOCK_KITS_TOGETHER:-}" ]; then
  "$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
    -- "${CARGO_TARGET_DIR:-$PWD/target}/go-conformance" >"$out/go" 2>&1 &
  pid_go=$!
  "$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
    -- node clients/typescript/dist/tools/conformance.js >"$out/typescript" 2>&1 &
  pid_typescript=$!
  runs+=(go typescript)
fi

status=0
for run in "${runs[@]}"; do
  pid="pid_$run"
  if ! wait "${!pid}"; then
    status=1
  fi
  cat "$out/$run"
done
exit "$status"
