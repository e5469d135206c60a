#!/usr/bin/env bash
# What an optional server feature costs on the ping and lock-unlock
# workloads: the same release binaries, the feature off and on, alternated
# twice so a drift of the shared machine shows up as spread, not as cost.
# Prints one line per run: server CPU per request and client-side req/s.
#
# Usage: bench/feature_cost.sh metrics|tls [SECONDS_PER_RUN]   (default 5)
#   metrics: --metrics-listen on, scraped once a second during the run
#   tls:     TLS on the client port (a throwaway ECDSA P-256 certificate made
#            with openssl), and churn added: a new connection per lock, so
#            the handshake's cost shows apart from the steady state
# Needs release builds of dlock-server and dlock-bench (cargo build --release),
# in target/release or in $BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURE=${1:?usage: bench/feature_cost.sh metrics|tls [SECONDS]}
SECS=${2:-5}
ADDR=127.0.0.1:17437
METRICS=127.0.0.1:17438
BIN=${BIN:-target/release}
SERVER=$BIN/dlock-server
BENCH=$BIN/dlock-bench

PIDS=()
TMP=$(mktemp -d)
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

# run LABEL SERVER-FLAGS...: one server, the workloads, then stop it.
run() {
  local label=$1; shift
  local client=() target=$ADDR
  if [[ $label == on && $FEATURE == tls ]]; then
    client=(--tls-ca "$TMP/ca.pem"); target=localhost:${ADDR##*:}
  fi
  "$SERVER" --listen "$ADDR" --threads 1 "$@" 2>/dev/null &
  local pid=$!; PIDS+=("$pid")
  for _ in $(seq 50); do
    "$BENCH" --server "$target" "${client[@]}" --duration 100ms ping -c 1 >/dev/null 2>&1 && break
    sleep 0.1
  done
  local scraper=""
  if [[ $label == on && $FEATURE == metrics ]]; then
    # A scrape a second, as an eager Prometheus would, bounded by the run.
    ( for _ in $(seq $((SECS * 2 + 4))); do curl -s -o /dev/null "http://$METRICS/metrics"; sleep 1; done ) &
    scraper=$!
  fi
  for w in "${WORKLOADS[@]}"; do
    local conns=50
    [[ $w == churn ]] && conns=8
    "$BENCH" --server "$target" "${client[@]}" --server-pid "$pid" --json --duration "${SECS}s" "$w" -c "$conns" |
      LABEL=$label python3 -c '
import json, os, sys
r = json.load(sys.stdin)
label, w = os.environ["LABEL"], r["workload"]
cpu, ops, p99 = r["server"]["cpu_us_per_op"], r["ops_per_sec"], r["latency"]["p99_us"]
print(f"{label:4} {w:12} {cpu:6.2f} us/op {ops:9.0f} ops/s  p99 {p99} us")'
  done
  [[ -n $scraper ]] && kill "$scraper" 2>/dev/null || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

WORKLOADS=(ping lock-unlock)
case $FEATURE in
  metrics) ON=(--metrics-listen "$METRICS") ;;
  tls)
    # A throwaway CA and a server certificate for localhost it signs.
    EC=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    openssl req -x509 "${EC[@]}" -days 1 -subj /CN=bench-ca \
      -keyout "$TMP/ca.key" -out "$TMP/ca.pem" 2>/dev/null
    openssl req "${EC[@]}" -subj /CN=localhost -keyout "$TMP/key.pem" -out "$TMP/req.pem" 2>/dev/null
    printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$TMP/ext"
    openssl x509 -req -in "$TMP/req.pem" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial \
      -days 1 -extfile "$TMP/ext" -out "$TMP/cert.pem" 2>/dev/null
    ON=(--tls-cert "$TMP/cert.pem" --tls-key "$TMP/key.pem")
    WORKLOADS=(ping lock-unlock churn) ;;
  *) echo "unknown feature $FEATURE" >&2; exit 2 ;;
esac
for round in 1 2; do
  echo "== round $round"
  run off
  run on "${ON[@]}"
done
