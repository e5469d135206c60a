#!/usr/bin/env bash
# Regenerates dlockpb/dlock.pb.go from proto/dlock.proto, or checks that it is
# current:
#
#     clients/go/tools/gen_proto.sh          # rewrite the checked-in file
#     clients/go/tools/gen_proto.sh --check  # exit 1 if it differs from a fresh run
#
# Needs protoc (Debian: protobuf-compiler) and the source of
# google.golang.org/protobuf (Debian: golang-google-protobuf-dev, under
# /usr/share/gocode), whose protoc-gen-go it builds: the generator then matches
# the runtime the package compiles against. (Debian's golang-goprotobuf-dev
# ships the older github.com/golang/protobuf generator, which writes APIv1
# code: not this.)
# The generated file names the versions that wrote it, so another protoc or
# protoc-gen-go gives a diff in its header even when the .proto did not change:
# the check compares the code below the header.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
proto_dir="$(cd "$here/../../proto" && pwd)"
out="$here/dlockpb/dlock.pb.go"
module="dlock/clients/go"

gocode="${GOCODE:-/usr/share/gocode}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
GO111MODULE=off GOPATH="$gocode" GOFLAGS= go build -o "$tmp/protoc-gen-go" \
  google.golang.org/protobuf/cmd/protoc-gen-go
protoc --plugin=protoc-gen-go="$tmp/protoc-gen-go" -I"$proto_dir" --go_out="$tmp" --go_opt=paths=source_relative \
  --go_opt="Mdlock.proto=$module/dlockpb;dlockpb" "$proto_dir/dlock.proto"

# The version lines ("// 	protoc-gen-go v1.28.1", "// 	protoc        v3.21.12").
body() { grep -v -E '^// +(protoc-gen-go|protoc) +v' "$1"; }

if [ "${1:-}" = "--check" ]; then
  if ! diff -u <(body "$out") <(body "$tmp/dlock.pb.go") >/dev/null; then
    echo "clients/go/dlockpb/dlock.pb.go is not current with proto/dlock.proto: run clients/go/tools/gen_proto.sh" >&2
    diff -u <(body "$out") <(body "$tmp/dlock.pb.go") | head -40 >&2 || true
    exit 1
  fi
  echo "clients/go/dlockpb/dlock.pb.go is current"
  exit 0
fi
cp "$tmp/dlock.pb.go" "$out"
echo "wrote $out"
