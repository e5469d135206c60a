#!/usr/bin/env bash
# Checks the systemd unit, the Dockerfile, compose.yaml, the alert rules
# and the dashboard as far as this machine allows: CI machines often have
# neither systemd as init nor a docker daemon, so each tool-dependent step
# says plainly when it is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "packaging: $*" >&2; exit 1; }

# The one build command the image runs; CI builds the same package and
# binary (in the dev profile, which `cargo test --workspace` already built).
BUILD="cargo build --release --locked -p dlock-server -p dlock-client --bin dlock-server --bin dlock"

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
for bin in dlock-server dlock; do
  grep -q "^COPY --from=build /src/target/release/$bin /usr/local/bin/$bin\$" Dockerfile ||
    fail "Dockerfile does not copy $bin, which '$BUILD' makes"
done
grep -q "^USER 10001" Dockerfile || fail "final image does not run as non-root"
for port in 7436 7437 9436; do
  grep -q "^EXPOSE .*\b$port\b" Dockerfile || fail "Dockerfile does not expose $port"
done
grep -q '^HEALTHCHECK .*' Dockerfile || fail "Dockerfile has no HEALTHCHECK"
grep -A1 '^HEALTHCHECK' Dockerfile | grep -q '/usr/local/bin/dlock", "--ping"' ||
  fail "the HEALTHCHECK does not ping with the dlock the image carries"
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
echo "Dockerfile: COPY sources, build command, binaries, user, ports, health check: ok"

echo "-- compose.yaml"
# Every variable it sets is one the server reads (its --help names each
# flag's), or the dlock command's DLOCK_SERVER.
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/dlock-server"
known=$("$bin" --help | sed -n 's/.*\[env: \(DLOCK_[A-Z0-9_]*\)=*.*/\1/p' | sort -u)
[ "$(wc -l <<<"$known")" -ge 40 ] || fail "dlock-server --help names too few DLOCK_ variables"
used=$(grep -o '^ *DLOCK_[A-Z0-9_]*:' compose.yaml | tr -d ' :' | sort -u)
[ -n "$used" ] || fail "compose.yaml sets no DLOCK_ variable"
for v in $used; do
  [ "$v" = DLOCK_SERVER ] || grep -qxF "$v" <<<"$known" || fail "compose.yaml sets $v, which no flag reads"
done
for n in 1 2 3; do
  grep -q "^  node$n:" compose.yaml || fail "compose.yaml has no service node$n"
  grep -q "DLOCK_NODE_ID: \"$n\"" compose.yaml || fail "compose.yaml gives no node id $n"
  grep -q "\"node$n:/var/lib/dlock\"" compose.yaml || fail "node$n has no named volume"
done
grep -q '^  healthcheck:' compose.yaml || fail "compose.yaml has no health check"
echo "compose.yaml: variables, services, volumes, health check: ok"

echo "-- alert rules and dashboard"
# That every metric they name is exported is checked by
# dlock-server/tests/metrics.rs; here, that each file is well formed.
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # Debian's prometheus package carries promtool (about 20 MB).
  install_promtool() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; }
  install_promtool || { apt-get update -qq >/dev/null 2>&1 && install_promtool; } ||
    echo "packaging: could not install promtool"
fi
if command -v promtool >/dev/null 2>&1; then
  promtool check rules packaging/prometheus/alerts.yml || fail "promtool rejects packaging/prometheus/alerts.yml"
else
  echo "SKIPPED: promtool not installed (Debian: apt-get install prometheus); the alert rules were not checked"
fi
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"], "no panels"' \
  packaging/grafana/dlock.json || fail "packaging/grafana/dlock.json is not a dashboard"
echo "grafana dashboard: ok"

if docker info >/dev/null 2>&1; then
  docker build -t dlock-server:ci .
  docker compose config -q
else
  echo "SKIPPED: docker build and docker compose config (no working docker daemon here)"
fi
