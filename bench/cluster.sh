#!/usr/bin/env bash
# A dlock cluster beside etcd, in one run on this machine: three dlock-server
# nodes (fsync on: --data-dir) and three etcd 3.4 nodes (its default fsync),
# all on loopback; then, against each one's leader, lock cycles of clients on
# keys of their own (1 and 32 clients) and hand-offs of 32 clients on one key.
# etcd takes its own v3 lock (a session lease, Lock, Unlock: what its
# `concurrency` mutex does) through dlock-bench's etcd-lock workload. Beside
# them: the leader's mean log fsync and commit time over each dlock point
# (from its /metrics), and an in-memory single server's one-client lock
# cycle and ping, for the one-client bar (p50 at most the single server's
# plus one fsync and one round trip per command). At 1 and 32 clients on
# own keys, each cluster's CPU time per cycle (its three nodes' user +
# system time, summed, over the point) and context switches per cycle
# (every thread of the three; about one wake-up each), read from /proc,
# with dlock's over etcd's (issue 44: at most a fifth). Last, the one-client
# floor: what six fsyncs (dlock-bench sync-floor, in the nodes' directory)
# and the fewest messages cost per cycle, as a share of etcd's cycle.
#
# Usage: bench/cluster.sh [SECONDS-PER-POINT] [BINARY-DIR]   (default 10, target/release)
# Needs: etcd (Debian: etcd-server), etcdctl (etcd-client), python3, and
#   protoc (protobuf-compiler) for: cargo build --release -p dlock-server -p dlock-client
#   -p dlock-bench --features dlock-bench/etcd
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/proc_usage.sh
. bench/proc_usage.sh
SECS=${1:-10}
BIN=${2:-target/release}
for need in etcd etcdctl python3 "$BIN/dlock-server" "$BIN/dlock" "$BIN/dlock-bench"; do
  command -v "$need" >/dev/null || [[ -x $need ]] || { echo "cluster.sh: $need is missing" >&2; exit 2; }
done
"$BIN/dlock-bench" etcd-lock --help >/dev/null 2>&1 ||
  { echo "cluster.sh: $BIN/dlock-bench was built without --features etcd" >&2; exit 2; }
TMP=$(mktemp -d)
PIDS=()
DPIDS=() EPIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Gone, so that a run right after this one finds its ports free.
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$TMP"
}
trap cleanup EXIT

CLIENT=(127.0.0.1:17601 127.0.0.1:17602 127.0.0.1:17603)
PEER=(127.0.0.1:17611 127.0.0.1:17612 127.0.0.1:17613)
MEMBERS="1=${CLIENT[0]}@${PEER[0]},2=${CLIENT[1]}@${PEER[1]},3=${CLIENT[2]}@${PEER[2]}"
METRICS=(127.0.0.1:17621 127.0.0.1:17622 127.0.0.1:17623)
SINGLE=127.0.0.1:17600
for n in 1 2 3; do
  i=$((n - 1))
  "$BIN/dlock-server" --node-id "$n" --data-dir "$TMP/d$n" --listen "${CLIENT[$i]}" \
    --peer-listen "${PEER[$i]}" --initial-cluster "$MEMBERS" --metrics-listen "${METRICS[$i]}" \
    --log-level warn 2>>"$TMP/d$n.log" &
  PIDS+=($!)
  DPIDS+=($!)
  disown
done
# The in-memory single server, for the one-client reference.
"$BIN/dlock-server" --listen "$SINGLE" --log-level warn 2>>"$TMP/single.log" &
PIDS+=($!)
SPID=$!
disown

ECLIENT=(http://127.0.0.1:23791 http://127.0.0.1:23792 http://127.0.0.1:23793)
EPEER=(http://127.0.0.1:23801 http://127.0.0.1:23802 http://127.0.0.1:23803)
EMEMBERS="e1=${EPEER[0]},e2=${EPEER[1]},e3=${EPEER[2]}"
for n in 1 2 3; do
  i=$((n - 1))
  etcd --name "e$n" --data-dir "$TMP/e$n" --listen-client-urls "${ECLIENT[$i]}" \
    --advertise-client-urls "${ECLIENT[$i]}" --listen-peer-urls "${EPEER[$i]}" \
    --initial-advertise-peer-urls "${EPEER[$i]}" --initial-cluster "$EMEMBERS" \
    --initial-cluster-state new --initial-cluster-token dlock-bench --log-level warn \
    2>>"$TMP/e$n.log" &
  PIDS+=($!)
  EPIDS+=($!)
  disown
done

# The leaders, once each cluster has one (60 s at most).
deadline=$((SECONDS + 60))
DLEADER="" ELEADER=""
while [[ -z $DLEADER || -z $ELEADER ]]; do
  if (( SECONDS >= deadline )); then
    [[ -n $DLEADER ]] || { echo "cluster.sh: dlock has no leader within 60 s" >&2; tail -n 20 "$TMP"/d*.log >&2; }
    [[ -n $ELEADER ]] || { echo "cluster.sh: etcd has no leader within 60 s" >&2; tail -n 20 "$TMP"/e*.log >&2; }
    exit 1
  fi
  sleep 0.5
  if [[ -z $DLEADER ]]; then
    id=$("$BIN/dlock" cluster -s "${CLIENT[0]}" status 2>/dev/null | sed -n 's/.*; leader \([0-9]*\);.*/\1/p' | head -1 || true)
    [[ -n $id ]] && DLEADER=${CLIENT[$((id - 1))]} && DMETRICS=${METRICS[$((id - 1))]}
  fi
  if [[ -z $ELEADER ]]; then
    ELEADER=$(etcdctl --endpoints="$(IFS=,; echo "${ECLIENT[*]}")" endpoint status 2>/dev/null |
      awk -F', ' '$5 == "true" { print $1 }' | head -1 || true)
  fi
done
echo "dlock leader $DLEADER, etcd leader $ELEADER; $SECS s per point; $(nproc) cores: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"

# One point: prints "name clients ops/s p50_us p99_us".
point() { # LABEL ARGS...
  local label=$1; shift
  "$BIN/dlock-bench" --json --duration "${SECS}s" "$@" >"$TMP/point.json" ||
    { echo "cluster.sh: $label failed" >&2; cat "$TMP/point.json" >&2; exit 1; }
  python3 - "$label" "$TMP/point.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]:<22} {r['connections']:>3} {r['ops_per_sec']:>9.0f} {r['latency']['p50_us']/1000:>8.2f} {r['latency']['p99_us']/1000:>8.2f}")
EOF
}
# A point, with the CPU time and context switches of one cluster's three
# nodes read around it: keeps "cpu-seconds switches cycles" in $TMP/use-NAME.
metered() { # NAME "PID PID PID" LABEL ARGS...
  local name=$1 pids=$2 cpu0 sw0
  shift 2
  # shellcheck disable=SC2086
  cpu0=$(proc_cpu $pids) sw0=$(proc_switches $pids)
  point "$@"
  # shellcheck disable=SC2086
  echo "$(proc_cpu $pids) $cpu0 $(proc_switches $pids) $sw0" \
    "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ops"])' "$TMP/point.json")" |
    awk '{ print $1 - $2, $3 - $4, $5 }' >"$TMP/use-$name"
}
# The leader's Raft timings over a point: the mean of its log fsyncs and of
# its commits (proposal to answer), from /metrics before and after.
scrape() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://$DMETRICS/metrics"; }
raft_means() { # BEFORE-FILE AFTER-FILE
  python3 - "$1" "$2" <<'EOF'
import sys
def read(path):
    v = {}
    for line in open(path):
        if line.startswith(("dlock_raft_log_fsync_seconds_", "dlock_raft_commit_seconds_")):
            name, value = line.split()[:2]
            if name.endswith(("_sum", "_count")):
                v[name] = float(value)
    return v
a, b = read(sys.argv[1]), read(sys.argv[2])
def mean(h):
    n = b.get(h + "_count", 0) - a.get(h + "_count", 0)
    return (b.get(h + "_sum", 0) - a.get(h + "_sum", 0)) / n * 1000 if n else float("nan")
print(f"{mean('dlock_raft_log_fsync_seconds'):.2f} {mean('dlock_raft_commit_seconds'):.2f}")
EOF
}
printf '%-22s %3s %9s %8s %8s\n' workload c "cycles/s" "p50 ms" "p99 ms"
for c in 1 32; do
  scrape >"$TMP/m0"
  metered "dlock$c" "${DPIDS[*]}" "dlock lock-unlock" --server "$DLEADER" lock-unlock -c "$c" |
    tee "$TMP/dlock$c"
  scrape >"$TMP/m1"
  read -r FSYNC$c COMMIT$c < <(raft_means "$TMP/m0" "$TMP/m1")
  metered "etcd$c" "${EPIDS[*]}" "etcd lock-unlock" etcd-lock -c "$c" --endpoints "$ELEADER"
done
scrape >"$TMP/m0"
point "dlock contended" --server "$DLEADER" contended -c 32
scrape >"$TMP/m1"
read -r FSYNCH COMMITH < <(raft_means "$TMP/m0" "$TMP/m1")
point "etcd contended" etcd-lock -c 32 --contended --endpoints "$ELEADER"
point "single lock-unlock" --server "$SINGLE" --server-pid "$SPID" lock-unlock -c 1 | tee "$TMP/single"
SINGLE_CPU=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["server"]["cpu_us_per_op"])' "$TMP/point.json")
# The least a commit's fsync costs on this disk, where the nodes' data is.
"$BIN/dlock-bench" --json --duration "${SECS}s" sync-floor --dir "$TMP" >"$TMP/floor.json" ||
  { echo "cluster.sh: sync-floor failed" >&2; cat "$TMP/floor.json" >&2; exit 1; }
SYNC_CPU=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["extra"]["cpu_us_per_sync"])' "$TMP/floor.json")
point "single ping" --server "$SINGLE" ping -c 1 | tee "$TMP/ping"
echo "leader, mean over each dlock point: log fsync / commit (proposal to answer), ms:" \
  "1 client $FSYNC1 / $COMMIT1; 32 clients $FSYNC32 / $COMMIT32; contended $FSYNCH / $COMMITH"
# A cycle is two commands (Lock, Unlock), each one commit: the bar for one
# client's p50 is the single server's plus two (fsync + round trip).
python3 - "$TMP/dlock1" "$TMP/single" "$TMP/ping" "$FSYNC1" <<'EOF'
import sys
p50 = lambda path: float(open(path).read().split()[-2])
cluster, single, rtt, fsync = p50(sys.argv[1]), p50(sys.argv[2]), p50(sys.argv[3]), float(sys.argv[4])
bar = single + 2 * (fsync + rtt)
print(f"one client p50: cluster {cluster:.2f} ms; bar {bar:.2f} ms = single server {single:.2f} + 2 x (fsync {fsync:.2f} + round trip {rtt:.2f}); {'met' if cluster <= bar else 'missed'}")
EOF
# CPU per cycle: the bar is dlock's at most a fifth of etcd's.
python3 - "$TMP" "$SYNC_CPU" "$SINGLE_CPU" <<'EOF'
import sys
def use(name):
    cpu, switches, cycles = open(f"{sys.argv[1]}/use-{name}").read().split()
    cycles = max(float(cycles), 1)
    return float(cpu) / cycles * 1e6, float(switches) / cycles
print("CPU per cycle, three nodes summed (us) and context switches per cycle (all their threads):")
print(f"{'clients':>7} {'dlock us':>9} {'etcd us':>9} {'ratio':>6} {'dlock cs':>9} {'etcd cs':>9} {'ratio':>6}  bar (cpu ratio <= 0.20)")
for c in (1, 32):
    (du, ds), (eu, es) = use(f"dlock{c}"), use(f"etcd{c}")
    r = du / eu if eu else float("nan")
    print(f"{c:>7} {du:>9.1f} {eu:>9.1f} {r:>6.2f} {ds:>9.1f} {es:>9.1f} {ds / es if es else float('nan'):>6.2f}  {'met' if r <= 0.2 else 'missed'}")
# What no design that syncs each commit on every node gets under, at one
# client: a cycle is two commits, each synced on three nodes (six syncs),
# and each commit is at least five message ends (the client's request and
# answer at the leader; to and from each follower, at both ends), which is
# five times the single server's two exchanges per cycle, measured at full
# speed (less than a wake-up from idle costs, so an underestimate).
sync, single = float(sys.argv[2]), float(sys.argv[3])
floor_sync, floor_all = 6 * sync, 6 * sync + 5 * single
eu = use("etcd1")[0]
if eu:
    print(f"one-client floor: 6 syncs x {sync:.0f} us = {floor_sync:.0f} us ({floor_sync / eu:.2f} of etcd's cycle);"
          f" + 5 x the single server's cycle ({single:.1f} us) = {floor_all:.0f} us ({floor_all / eu:.2f});"
          f" the bar leaves {0.2 * eu - floor_all:.0f} us per cycle for the rest")
EOF
