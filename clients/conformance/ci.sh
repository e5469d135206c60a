#!/usr/bin/env bash
# CI for the client conformance kit (called by .ci/run after the Python
# client's CI, whose venv has the protobuf runtime the kit reads frames
# with and the dlock package the Python adapter uses): the kit against the
# `dlock` command, the Rust library (examples/conformance_client.rs, built by
# `cargo test`) and the Python client.
set -euo pipefail
cd "$(dirname "$0")/../.."

py=.ci-venv/bin/python
target="${CARGO_TARGET_DIR:-$PWD/target}/debug"
DLOCK="$target/dlock" "$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- clients/conformance/dlock-cli.sh
"$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- "$target/examples/conformance_client"
"$py" clients/conformance/kit.py --server-bin "$target/dlock-server" \
  -- "$py" clients/python/tools/conformance_client.py
