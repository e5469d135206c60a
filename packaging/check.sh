#!/usr/bin/env bash
# Checks the systemd unit and its install commands, the Dockerfile,
# compose.yaml, the alert rules, the dashboard and a scrape of the metrics
# as far as this machine allows: CI machines often have neither systemd as
# init nor a docker daemon, so each tool-dependent step says plainly when it
# is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "packaging: $*" >&2; exit 1; }

# Scratch space, and the server the metrics check starts: both gone on any
# exit.
tmp=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
target="${CARGO_TARGET_DIR:-$PWD/target}"

# The one build command the image runs; CI builds the same package and
# binary (in the dev profile, which `cargo test --workspace` already built).
BUILD="cargo build --release --locked -p dlock-server -p dlock-client --bin dlock-server --bin dlock"

echo "-- systemd unit"
if command -v systemd-analyze >/dev/null 2>&1; then
  # verify insists that ExecStart's binary exists: point it at the one CI
  # just built, in a copy of the unit, and check everything else as is.
  bin="$target/debug/dlock-server"
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

# The install commands at the top of the unit, run as written on a fresh
# machine: a scratch root with what every machine has (/usr/local/bin,
# /etc/systemd/system) and nothing of dlock's. Every absolute path but
# /dev/... moves under it, and the release binary is the dev build's.
# groupadd is not run, since it would change this machine's groups: it must
# come before the first "-g dlock", which then names a stand-in group: as
# root gid 65534, which no file here gets unasked; otherwise this user's own
# group (anyone may give a file their own group, so this needs no root, but
# then a missing "-g dlock" goes unseen). systemctl is left out. Only
# install and groupadd are run, word by word, no shell. Then the files must
# have the owner, modes and group the unit relies on.
check_install_comment() {
  local unit=$1 root=$2 lines words args w i grouped=no dlock_gid
  dlock_gid=$(id -g)
  [ "$(id -u)" != 0 ] || dlock_gid=65534
  lines=$(awk '/^# systemd unit for dlock-server\. Install:$/ { on = 1; next }
    on && /^#   systemctl / { found = 1; exit }
    on && /^#   / { sub(/^#   /, ""); sub(/[ \t]+#.*/, ""); print; next }
    on { exit }
    END { if (!found) exit 1 }' "$unit") ||
    fail "$unit: no install commands from \"# systemd unit for dlock-server. Install:\" to a systemctl line"
  mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system"
  while read -ra words; do
    [ "${#words[@]}" -gt 0 ] || continue
    case "${words[0]}" in
      groupadd)
        [ "${words[-1]}" = dlock ] || fail "$unit: '${words[*]}' does not make the group dlock"
        grouped=yes
        continue ;;
      install) ;;
      *) fail "$unit: the install commands run ${words[0]}, which this check cannot run on a scratch root" ;;
    esac
    args=()
    for ((i = 1; i < ${#words[@]}; i++)); do
      w=${words[i]}
      if [ "$w" = -g ] && [ "${words[i + 1]:-}" = dlock ]; then
        [ "$grouped" = yes ] || fail "$unit: '${words[*]}' uses the group dlock before groupadd makes it"
        args+=(-g "$dlock_gid")
        i=$((i + 1))
        continue
      fi
      case "$w" in
        /dev/*) ;;
        /*) w="$root$w" ;;
        target/release/*) w="$target/debug/${w#target/release/}" ;;
      esac
      args+=("$w")
    done
    install "${args[@]}" 2>"$root.err" ||
      fail "$unit: on a fresh machine '${words[*]}' fails: $(cat "$root.err")"
  done <<<"$lines"
  # path, mode, and whether its group must be dlock; all owned by the
  # installing user (root on a real machine).
  local want path mode group
  for want in "etc/dlock 750 dlock" "etc/dlock/dlock-server.env 644 -" "etc/dlock/tokens 640 dlock" \
    "etc/systemd/system/dlock-server.service 644 -" "usr/local/bin/dlock-server 755 -"; do
    read -r path mode group <<<"$want"
    [ -e "$root/$path" ] || fail "$unit: the install commands make no /$path"
    [ "$(stat -c '%a %u' "$root/$path")" = "$mode $(id -u)" ] ||
      fail "$unit: the install commands leave /$path $(stat -c 'mode %a, owner %u' "$root/$path"), not mode $mode, owner the installer"
    [ "$group" = - ] || [ "$(stat -c %g "$root/$path")" = "$dlock_gid" ] ||
      fail "$unit: the install commands do not give /$path the group dlock"
  done
  # And the unit finds what they installed.
  for path in $(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p; s/^EnvironmentFile=-\{0,1\}//p' "$unit") \
    $(grep -o -- '--token-file [^ ]*' "$unit" | cut -d' ' -f2); do
    [ -e "$root$path" ] || fail "$unit: the unit uses $path, which the install commands do not make"
  done
}
bin="$target/debug/dlock-server"
[ -x "$bin" ] || cargo build --locked -p dlock-server --bin dlock-server
check_install_comment packaging/dlock-server.service "$tmp/root"
echo "install commands: ran on a scratch root; owners, modes and group as the unit needs: ok"

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
# Against --token-file the ping needs a token: the comment above HEALTHCHECK
# must say how the container gives it one (dlock reading that variable is
# checked against its --help after the build below).
health_comment=$(awk '/^#/ { c = c $0 "\n"; next } /^HEALTHCHECK/ { printf "%s", c; exit } { c = "" }' Dockerfile)
grep -q DLOCK_CLIENT_TOKEN_FILE <<<"$health_comment" ||
  fail "the comment above HEALTHCHECK does not say how the check gets a token (DLOCK_CLIENT_TOKEN_FILE)"
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
dlock_help=$("$target/debug/dlock" --help)
grep -qF '[env: DLOCK_CLIENT_TOKEN_FILE=' <<<"$dlock_help" ||
  fail "dlock does not read DLOCK_CLIENT_TOKEN_FILE, which the HEALTHCHECK's comment tells the container to set"
echo "Dockerfile: COPY sources, build command, binaries, user, ports, health check and its token: ok"

echo "-- compose.yaml"
# Every variable it sets is one the server reads (its --help names each
# flag's), or the dlock command's DLOCK_SERVER.
bin="$target/debug/dlock-server"
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

echo "-- metrics"
# promtool lints one scrape of a freshly started cluster of one (the
# families every server writes, and the Raft ones), after one lock so that
# the per-request families have samples: every metric needs help text, a
# type and a name that fits it.
if command -v promtool >/dev/null 2>&1; then
  # None of this shell's DLOCK_ variables: the server reads them as flags.
  clean=()
  for v in $(compgen -e | grep '^DLOCK_' || true); do clean+=(-u "$v"); done
  env "${clean[@]}" "$target/debug/dlock-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --data-dir "$tmp/node1" --log-format text --log-level info 2>"$tmp/server.log" >/dev/null &
  server_pid=$!
  # The log says where each port listens; /readyz says when it leads.
  for _ in $(seq 100); do
    grep -q 'dlock-server listening' "$tmp/server.log" && break
    kill -0 "$server_pid" 2>/dev/null || fail "dlock-server did not start: $(cat "$tmp/server.log")"
    sleep 0.1
  done
  addr_of() { grep "$1" "$tmp/server.log" | sed -n 's/.* addr=\([0-9.:]*\).*/\1/p' | head -1; }
  metrics=$(addr_of 'serving metrics')
  client=$(addr_of 'dlock-server listening')
  [ -n "$metrics" ] && [ -n "$client" ] || fail "dlock-server did not say where it listens: $(cat "$tmp/server.log")"
  # (No proxy: the server is on loopback.)
  get() { python3 -c 'import sys, urllib.request as u; sys.stdout.write(u.build_opener(u.ProxyHandler({})).open(sys.argv[1], timeout=5).read().decode())' "$1"; }
  for _ in $(seq 100); do
    get "http://$metrics/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  env "${clean[@]}" "$target/debug/dlock" -s "$client" -k packaging/check -- true ||
    fail "dlock could not lock on the server it scrapes"
  get "http://$metrics/metrics" >"$tmp/metrics.txt" || fail "cannot scrape http://$metrics/metrics"
  kill "$server_pid"
  wait "$server_pid" || true
  server_pid=
  grep -q '^dlock_raft_leader_changes_total' "$tmp/metrics.txt" || fail "the scrape has no Raft metrics: $(cat "$tmp/metrics.txt")"
  promtool check metrics <"$tmp/metrics.txt" || fail "promtool check metrics rejects a scrape of dlock-server"
  echo "promtool check metrics: ok"
else
  echo "SKIPPED: promtool not installed (Debian: apt-get install prometheus); a scrape of the metrics was not linted"
fi

if docker info >/dev/null 2>&1; then
  docker build -t dlock-server:ci .
  docker compose config -q
else
  echo "SKIPPED: docker build and docker compose config (no working docker daemon here)"
fi
