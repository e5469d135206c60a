#!/usr/bin/env bash
# CI for the Go client (for .ci/run, after `cargo test` built the server):
# installs Go, protoc and the protobuf runtime from Debian's packages when
# missing, checks that the generated code is current, then gofmt, go vet and
# go test against the dlock-server binary, and the client conformance kit
# on the Go client (after clients/python/tools/ci.sh made the venv).
#
# Only Debian's packages are used: no module proxy. Debian ships
# google.golang.org/protobuf as source under /usr/share/gocode, which GOPATH
# mode finds (go.mod is for users, who fetch the module as usual); the
# package is linked into a GOPATH of its own at its import path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gocode=/usr/share/gocode

if ! command -v go >/dev/null || ! command -v protoc >/dev/null \
  || [ ! -d "$gocode/src/google.golang.org/protobuf" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    golang-go protobuf-compiler golang-google-protobuf-dev >/dev/null
fi
go version

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/gopath/src/dlock/clients"
ln -s "$here" "$work/gopath/src/dlock/clients/go"
export GOPATH="$work/gopath:$gocode" GO111MODULE=off GOFLAGS= GOPROXY=off
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlock-go-build}"

GOCODE="$gocode" "$here/tools/gen_proto.sh" --check

unformatted="$(gofmt -l "$here"/*.go "$here"/bench/*.go "$here"/cmd/conformance/*.go)"
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi

export DLOCK_SERVER_BIN="${DLOCK_SERVER_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/dlock-server}"
if [ ! -x "$DLOCK_SERVER_BIN" ]; then
  echo "go client: $DLOCK_SERVER_BIN not found: build it with cargo build -p dlock-server" >&2
  exit 1
fi
cd "$work/gopath/src/dlock/clients/go"
go vet ./...
go test -count=1 -timeout 5m ./...

# The conformance kit (docs/CLIENTS.md) on the Go client, with the Python
# venv the Python client's CI made (the kit reads frames with protobuf).
# Under .ci/run (DLOCK_KITS_TOGETHER) the program is left in the target
# directory and clients/conformance/ci.sh runs it beside the other clients'.
kit_program="${CARGO_TARGET_DIR:-$root/target}/go-conformance"
go build -o "$kit_program" ./cmd/conformance
if [ -z "${DLOCK_KITS_TOGETHER:-}" ]; then
  "$root/.ci-venv/bin/python" "$root/clients/conformance/kit.py" \
    --server-bin "$DLOCK_SERVER_BIN" -- "$kit_program"
fi
