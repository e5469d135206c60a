#!/usr/bin/env bash
# Checks the systemd unit and the Dockerfile as far as this machine allows,
# in seconds: CI machines often have neither systemd as init nor a docker
# daemon, so each tool-dependent step says plainly when it is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "packaging: $*" >&2; exit 1; }

# The one build command the image runs; CI builds the same package and
# binary (in the dev profile, which `cargo test --workspace` already built).
BUILD="cargo build --release --locked -p dlock-server --bin dlock-server"

echo "-- systemd unit"
if command -v systemd-analyze >/dev/null 2>&1; then
  # verify insists that ExecStart's binary exists: point it at the one CI
  # just built, in a copy of the unit, and check everything else as is.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/dlock-server"
  [ -x "$bin" ] || cargo build --locked -p dlock-server --bin dlock-server
  sed "s|/usr/local/bin/dlock-server|$bin|" packaging/dlock-server.service \
    >"$tmp/dlock-server.service"
  # verify prints problems and, on some versions, still exits 0: fail on
  # any output that names the unit file.
  out=$(systemd-analyze verify --man=no "$tmp/dlock-server.service" 2>&1) || fail "systemd-analyze verify: $out"
  if grep -q "dlock-server.service" <<<"$out"; then
    fail "systemd-analyze verify: $out"
  fi
  echo "systemd-analyze verify: ok"
else
  echo "SKIPPED: systemd-analyze not installed; the unit was not verified"
fi
for key in DynamicUser=yes ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes \
  LimitNOFILE=65536 Restart=on-failure EnvironmentFile= ExecReload= SupplementaryGroups=dlock; do
  grep -q "^$key" packaging/dlock-server.service || fail "unit lacks $key"
done

echo "-- Dockerfile"
# Every COPY source from the build context must exist (COPY --from copies
# from a stage, checked against the build command below).
while read -r src; do
  [ -e "$src" ] || fail "Dockerfile copies $src, which does not exist"
done < <(awk '$1 == "COPY" && $2 !~ /^--from=/ { for (i = 2; i < NF; i++) print $i }' Dockerfile)
grep -qxF "RUN $BUILD" Dockerfile || fail "Dockerfile's build step is not: $BUILD"
grep -q "^COPY --from=build /src/target/release/dlock-server " Dockerfile ||
  fail "Dockerfile does not copy the binary that '$BUILD' makes"
grep -q "^USER 10001" Dockerfile || fail "final image does not run as non-root"
grep -q "^EXPOSE 7436" Dockerfile || fail "Dockerfile does not expose 7436"
# Nothing cargo needs may be left out of the build context.
for need in Cargo.toml Cargo.lock build.rs proto src dlock-server dlock-client dlock-bench dlock-torture; do
  ! grep -qxF "$need" .dockerignore || fail ".dockerignore excludes $need, which the build needs"
done
# The builder's toolchain must meet the workspace's rust-version.
image_rust=$(sed -n 's/^FROM rust:\([0-9]*\.[0-9]*\).*/\1/p' Dockerfile)
msrv=$(sed -n 's/^rust-version = "\([0-9]*\.[0-9]*\).*/\1/p' Cargo.toml)
[ -n "$image_rust" ] || fail "builder image is not a versioned rust:X.Y image"
[ "$(printf '%s\n%s\n' "$msrv" "$image_rust" | sort -V | head -1)" = "$msrv" ] ||
  fail "builder rust:$image_rust is older than rust-version $msrv"
# The image's build step, minus --release so that it reuses what CI built
# (a release build takes minutes); --locked still proves Cargo.lock current.
${BUILD/ --release/}
echo "Dockerfile: COPY sources, build command, user, port: ok"

if docker info >/dev/null 2>&1; then
  docker build -t dlock-server:ci .
else
  echo "SKIPPED: docker build (no working docker daemon here)"
fi
