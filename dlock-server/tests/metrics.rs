//! `--metrics-listen`: Prometheus metrics and health probes, scraped over
//! real TCP from a real `dlock-server` process and read with a Prometheus
//! text parser. The counts are process-wide, so each test has its own
//! server process and checks exact values.

mod common;

use common::process::Process;
use common::{status, TestClient, PATIENCE};
use dlock::proto::{RequestType, ResponseStatus};
use dlock_server::testing::nodes::NodeProcesses;
use prometheus_parse::{Sample, Scrape, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP/1.1 GET over a fresh connection: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect to metrics");
    let req = format!("GET {path} HTTP/1.1\r\nHost: dlock\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send request");
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut raw))
        .await
        .expect("metrics answer in time")
        .expect("read answer");
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("headers end");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    (code, body.to_owned())
}

async fn scrape(addr: SocketAddr) -> Scrape {
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("valid exposition format")
}

fn metrics_addr(server: &mut Process) -> SocketAddr {
    addr_in(&server.wait_for_log("serving metrics"))
}

/// The address of a "serving metrics" log line.
fn addr_in(line: &str) -> SocketAddr {
    let rest = line.split("addr=").nth(1).expect("addr field");
    rest.split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .expect("metrics address parses")
}

/// The value of the sample `name` whose labels include `labels`; 0 when
/// there is none (a labelled counter never incremented is not written).
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
        .collect();
    assert!(
        found.len() <= 1,
        "{name} {labels:?} is ambiguous: {found:?}"
    );
    match found.first().map(|x| &x.value) {
        None => 0.0,
        // OpenMetrics names a counter's samples `_total`, which this parser
        // (written for the older format) does not match to the TYPE line.
        Some(Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v)) => *v,
        Some(other) => panic!("{name} is not a number: {other:?}"),
    }
}

/// The buckets of histogram `name` with `labels`, cumulative, +Inf last.
fn buckets(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let h = s
        .samples
        .iter()
        .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
        .unwrap_or_else(|| panic!("histogram {name} {labels:?}"));
    match &h.value {
        Value::Histogram(b) => b.iter().map(|c| (c.less_than, c.count)).collect(),
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

#[tokio::test]
async fn metrics_count_requests_grants_waits_and_drops_as_they_happen() {
    counts_move_on(Process::start(&["--metrics-listen", "127.0.0.1:0"])).await;
}

#[tokio::test]
async fn a_cluster_leader_counts_grants_waits_and_expiries_as_a_single_server_does() {
    // The counters are kept where requests are answered, once for both
    // engines: a cluster node's must move exactly as a single server's.
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("node1");
    let server = Process::start(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("a UTF-8 path"),
    ]);
    counts_move_on(server).await;
}

/// Requests, grants at once and after a wait, an expiry and a dropped
/// connection on `server`, with the counts each must move.
async fn counts_move_on(mut server: Process) {
    let http = metrics_addr(&mut server);
    // A cluster of one answers Pings before it has elected itself, and
    // refuses a Lock with NotLeader until then; a single server is ready
    // at once.
    await_ready(http).await;

    let before = scrape(http).await;
    assert_eq!(value(&before, "dlock_requests_total", &[]), 0.0);
    assert_eq!(value(&before, "dlock_connections", &[]), 0.0);

    let mut a = TestClient::connect(server.addr).await;
    for _ in 0..3 {
        assert_eq!(status(&a.ping().await), ResponseStatus::Ok);
    }
    a.must_lock(&["k"]).await;
    let mut b = TestClient::connect(server.addr).await;
    let wait = b.lock_request(&["k"], 0, 0);
    b.send(&wait).await;
    a.await_waiters("k", 1).await;

    let during = scrape(http).await;
    assert_eq!(value(&during, "dlock_connections", &[]), 2.0);
    assert_eq!(value(&during, "dlock_held_keys", &[]), 1.0);
    assert_eq!(value(&during, "dlock_waiting_requests", &[]), 1.0);

    assert_eq!(status(&a.unlock(&["k"]).await), ResponseStatus::Ok);
    assert_eq!(status(&b.recv().await), ResponseStatus::Ok);
    // A second Unlock of the same key: a status other than Ok.
    assert_eq!(status(&a.unlock(&["k"]).await), ResponseStatus::NotHeld);

    // A lease of 1 ms, expired by the timer; waited for through Inspect.
    let mut c = TestClient::connect(server.addr).await;
    assert_eq!(
        status(&c.lock(&["lease"], 0, 1_000).await),
        ResponseStatus::Ok
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while c.inspect("lease").await.fence != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease never expired"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    // A frame over --max-frame: the connection is dropped for it.
    let mut bad = TestClient::connect(server.addr).await;
    bad.send_raw(&[0x7f, 0, 0, 0]).await;
    assert_eq!(status(&bad.recv().await), ResponseStatus::FrameTooLarge);
    bad.expect_closed().await;
    drop(bad);

    // Counted when the connection task ends, a moment after the close.
    await_closed(http, "frame_too_large", 1.0).await;
    let after = scrape(http).await;
    let req = |t: &str, st: &str| {
        value(
            &after,
            "dlock_requests_total",
            &[("type", t), ("status", st)],
        )
    };
    assert_eq!(req("ping", "ok"), 3.0);
    assert_eq!(req("lock", "ok"), 3.0, "a, b after waiting, c");
    assert_eq!(req("unlock", "ok"), 1.0);
    assert_eq!(req("unlock", "not_held"), 1.0);
    assert!(req("inspect", "ok") >= 2.0);
    assert_eq!(
        value(&after, "dlock_grants_total", &[("after", "none")]),
        2.0
    );
    assert_eq!(
        value(&after, "dlock_grants_total", &[("after", "wait")]),
        1.0
    );
    assert_eq!(value(&after, "dlock_leases_expired_total", &[]), 1.0);
    assert_eq!(value(&after, "dlock_connections_accepted_total", &[]), 4.0);
    assert!(value(&after, "dlock_received_bytes_total", &[]) > 0.0);
    assert!(value(&after, "dlock_sent_bytes_total", &[]) > 0.0);
    assert_eq!(value(&after, "dlock_held_keys", &[]), 1.0, "b holds k");
    assert_eq!(value(&after, "dlock_connections", &[]), 3.0);

    // Histograms: cumulative buckets, +Inf holding every observation.
    let ping = buckets(
        &after,
        "dlock_request_duration_seconds",
        &[("type", "ping")],
    );
    let (inf, all) = *ping.last().expect("buckets");
    assert!(inf.is_infinite() && all == 3.0, "{ping:?}");
    assert!(ping.windows(2).all(|w| w[0].1 <= w[1].1), "{ping:?}");
    let wait = buckets(&after, "dlock_lock_wait_seconds", &[]);
    assert_eq!(wait.last().map(|b| b.1), Some(1.0), "{wait:?}");
}

/// Polls the scrape at `http` until `reason` has `n` closed connections.
async fn await_closed(http: SocketAddr, reason: &str, n: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let s = scrape(http).await;
        let got = value(&s, "dlock_connections_closed_total", &[("reason", reason)]);
        if got == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{reason}: {got}, not {n}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn idle_and_limit_drops_are_counted_by_reason() {
    // Separate servers: with one, a stall of the machine longer than the
    // idle timeout could free the only slot before the second client came.
    let mut limited =
        Process::start(&["--metrics-listen", "127.0.0.1:0", "--max-connections", "1"]);
    let http = metrics_addr(&mut limited);
    let mut first = TestClient::connect(limited.addr).await;
    assert_eq!(status(&first.ping().await), ResponseStatus::Ok);
    let mut second = TestClient::connect(limited.addr).await;
    assert_eq!(status(&second.recv().await), ResponseStatus::LimitReached);
    await_closed(http, "limit", 1.0).await;

    let mut idle = Process::start(&["--metrics-listen", "127.0.0.1:0", "--idle-timeout", "200ms"]);
    let http = metrics_addr(&mut idle);
    let mut quiet = TestClient::connect(idle.addr).await;
    assert_eq!(status(&quiet.ping().await), ResponseStatus::Ok);
    quiet.expect_closed().await;
    await_closed(http, "idle", 1.0).await;
}

#[tokio::test]
async fn probes_answer_and_unknown_paths_do_not() {
    let mut server = Process::start(&["--metrics-listen", "127.0.0.1:0"]);
    let http = metrics_addr(&mut server);
    assert_eq!(get(http, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(http, "/readyz").await, (200, "ready\n".into()));
    assert_eq!(get(http, "/nothing").await.0, 404);
    // A request the server cannot decode counts under type "unknown".
    let mut c = TestClient::connect(server.addr).await;
    c.send_raw(&[0, 0, 0, 1, 0xff]).await;
    assert_eq!(status(&c.recv().await), ResponseStatus::General);
    let mut bad_type = c.request(RequestType::Ping, &[]);
    bad_type.r#type = 99;
    assert_eq!(status(&c.call(bad_type).await), ResponseStatus::InvalidType);
    let s = scrape(http).await;
    let unknown = |st: &str| {
        value(
            &s,
            "dlock_requests_total",
            &[("type", "unknown"), ("status", st)],
        )
    };
    assert_eq!(unknown("general"), 1.0);
    assert_eq!(unknown("invalid_type"), 1.0);
}

#[test]
fn an_unusable_metrics_address_stops_the_server_with_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", &addr])
        .output()
        .expect("run dlock-server");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot serve metrics on {addr}")),
        "{err}"
    );
}

#[tokio::test]
async fn a_cluster_node_reports_its_raft_state_and_is_ready_once_it_leads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, http) = ready_cluster_of_one(dir.path()).await;
    let mut c = TestClient::connect(server.addr).await;
    let fence = c.must_lock(&["k"]).await;
    let s = scrape(http).await;
    assert_eq!(value(&s, "dlock_raft_role", &[("role", "leader")]), 1.0);
    assert_eq!(value(&s, "dlock_raft_leader_known", &[]), 1.0);
    assert!(value(&s, "dlock_raft_term", &[]) >= 1.0);
    let applied = value(&s, "dlock_raft_applied_index", &[]);
    assert!(
        applied >= 2.0,
        "the session and the lock were applied: {applied}"
    );
    assert!(value(&s, "dlock_raft_committed_index", &[]) >= applied);
    assert_eq!(
        value(&s, "dlock_raft_replication_lag", &[("node", "1")]),
        0.0
    );
    assert_eq!(
        value(&s, "dlock_held_keys", &[]),
        1.0,
        "the replicated table's count"
    );
    assert!(fence > 0);
    // It elected itself once; the session is open; the session and the
    // lock were written to the log durably and committed.
    assert_eq!(value(&s, "dlock_raft_leader_changes_total", &[]), 1.0);
    assert_eq!(value(&s, "dlock_sessions", &[]), 1.0);
    for h in ["dlock_raft_log_fsync_seconds", "dlock_raft_commit_seconds"] {
        let b = buckets(&s, h, &[]);
        assert!(b.last().is_some_and(|&(_, n)| n >= 2.0), "{h}: {b:?}");
    }
    assert_eq!(
        value(
            &s,
            "dlock_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", dlock_server::COMMIT)
            ]
        ),
        1.0
    );
}

/// Node `i`'s metrics address, once it serves them.
async fn metrics_of(nodes: &NodeProcesses, i: usize) -> SocketAddr {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = nodes.recent_log(i);
        if let Some(line) = log.iter().find(|l| l.contains("serving metrics")) {
            return addr_in(line);
        }
        assert!(Instant::now() < deadline, "node {i} never served metrics");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node started with another `--cluster-id` beside a cluster is refused
/// at every dial, both ways, for as long as both run (openraft dials again
/// every few hundred milliseconds). Each side counts every refusal and logs
/// a peer's refusal once (then once a minute): logged at each dial, one
/// wrong flag wrote a dozen lines a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_another_cluster_is_counted_at_every_refusal_and_logged_once() {
    let mut nodes = NodeProcesses::prepare(
        dlock_server::testing::nodes::server_binary(),
        3,
        &[
            "--heartbeat",
            "100ms",
            "--election-timeout",
            "1s",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    nodes.node_flags(2, &["--cluster-id", "another"]);
    // Started first, so that no leader exists when it asks the others
    // before bootstrapping: refused by a running cluster, it would exit.
    nodes.restart(2);
    nodes.start_all();
    let odd = metrics_of(&nodes, 2).await;
    let (first, second) = (metrics_of(&nodes, 0).await, metrics_of(&nodes, 1).await);
    // Until the odd node refused many dials and was refused many times.
    const MANY: f64 = 10.0;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = scrape(odd).await;
        let refused = value(&s, "dlock_raft_peer_refusals_total", &[("by", "this_node")]);
        let refused_by = value(&s, "dlock_raft_peer_refusals_total", &[("by", "peer")]);
        if refused >= MANY && refused_by >= MANY {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refused {refused}, refused by peers {refused_by}: {:#?}",
            nodes.recent_log(2)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The others: each refused the odd one's votes; the leader's
    // replication was refused by it.
    let mut refused_by = 0.0;
    for http in [first, second] {
        let s = scrape(http).await;
        assert!(value(&s, "dlock_raft_peer_refusals_total", &[("by", "this_node")]) >= 1.0);
        refused_by += value(&s, "dlock_raft_peer_refusals_total", &[("by", "peer")]);
    }
    assert!(refused_by >= 1.0, "the leader was never refused");
    // Each node says it once per peer and side: the odd one of its
    // refusal of each of the two others and of theirs of it; each other
    // of the odd one's. openraft's leader warns of every failed
    // replication RPC: hidden by default, the paced lines say it.
    for (i, most) in [(0, 2), (1, 2), (2, 4)] {
        let log = nodes.recent_log(i);
        let said: Vec<&String> = log
            .iter()
            .filter(|l| l.contains("dlock_server::engine::raft::peer_") && l.contains("cluster id"))
            .collect();
        assert!(!said.is_empty(), "node {i} said nothing: {log:#?}");
        assert!(said.len() <= most, "node {i}: {said:#?}");
        for l in &said {
            assert!(l.contains("once a minute"), "{l}");
            assert!(l.contains("the same --cluster-id"), "says what to do: {l}");
        }
        let unpaced = log.iter().find(|l| l.contains("update progress error"));
        assert!(unpaced.is_none(), "node {i}: {unpaced:?}");
        // A peer that refuses answers: only the refusal's own line says so.
        let not_answering = log.iter().find(|l| l.contains("does not answer"));
        assert!(not_answering.is_none(), "node {i}: {not_answering:?}");
    }
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// A node cut off from its peers stands again and again. openraft logs
/// an error for every peer at every election ("while requesting vote"),
/// about five lines a second for as long as the partition lasts; the
/// server writes each of openraft's warning and error lines once a minute
/// at most (reachability.rs reports each peer that does not answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_its_peers_does_not_repeat_openrafts_errors_at_each_election() {
    let mut nodes = NodeProcesses::prepare(
        dlock_server::testing::nodes::server_binary(),
        1,
        &[
            "--heartbeat",
            "50ms",
            "--election-timeout",
            "100ms",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    // Two more members where nobody listens (ports released at once, below
    // the ephemeral range): node 1 alone of three.
    let nobody = || dlock_server::testing::ports::reserve().0;
    let list = format!(
        "{},2={}@{},3={}@{}",
        nodes.members_list(),
        nobody(),
        nobody(),
        nobody(),
        nobody()
    );
    nodes.initial_cluster(0, &list);
    nodes.start_all();
    let http = metrics_of(&nodes, 0).await;
    const ELECTIONS: f64 = 8.0;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let term = value(&scrape(http).await, "dlock_raft_term", &[]);
        if term >= ELECTIONS {
            break;
        }
        assert!(Instant::now() < deadline, "stood {term} times");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The peers are reported once they have failed for two seconds, which
    // eight elections may take less than.
    let log = loop {
        let log = nodes.recent_log(0);
        if log.iter().any(|l| l.contains("peer does not answer")) {
            break log;
        }
        assert!(Instant::now() < deadline, "{log:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let said = log
        .iter()
        .filter(|l| l.contains("while requesting vote"))
        .count();
    assert_eq!(said, 1, "{log:#?}");
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// A cluster of one with its data in `dir`, once it leads, and its
/// metrics address.
async fn ready_cluster_of_one(dir: &std::path::Path) -> (Process, SocketAddr) {
    let data = dir.join("node1");
    let mut server = Process::start(&[
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("a UTF-8 path"),
    ]);
    let http = metrics_addr(&mut server);
    await_ready(http).await;
    (server, http)
}

/// Waits until `/readyz` says the node accepts clients and knows a
/// leader (a cluster of one elects itself).
async fn await_ready(http: SocketAddr) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (code, body) = get(http, "/readyz").await;
        if code == 200 {
            return;
        }
        assert_eq!(code, 503, "{body}");
        // The probe may answer before the listener accepts clients, too.
        assert!(
            body.contains("no leader") || body.contains("not accepting"),
            "{body}"
        );
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The metric names in `text`, each without the suffix of its samples
/// (`_total`, `_bucket`, `_sum`, `_count`), so a family and its samples
/// compare equal.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("dlock_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let mut name = &tail[..end];
        for suffix in ["_total", "_bucket", "_sum", "_count", "_created"] {
            name = name.strip_suffix(suffix).unwrap_or(name);
        }
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn every_metric_is_documented_and_the_dashboard_and_alerts_name_only_real_ones() {
    // A cluster node exports every family a single server does, and the
    // Raft ones.
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, http) = ready_cluster_of_one(dir.path()).await;
    // A request of each kind the per-type families are written for.
    let mut c = TestClient::connect(server.addr).await;
    c.must_lock(&["k"]).await;
    let (code, body) = get(http, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    let exported: BTreeSet<String> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(metric_names)
        .collect();
    assert!(
        exported.contains("dlock_raft_log_fsync_seconds"),
        "{exported:?}"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |f: &str| std::fs::read_to_string(root.join(f)).expect("the file is in the repo");
    let documented = metric_names(&read("docs/METRICS.md"));
    for m in &exported {
        assert!(
            documented.contains(m),
            "{m} is exported but not in docs/METRICS.md"
        );
    }
    for m in &documented {
        assert!(
            exported.contains(m),
            "docs/METRICS.md lists {m}, which is not exported"
        );
    }
    for f in [
        "packaging/grafana/dlock.json",
        "packaging/prometheus/alerts.yml",
    ] {
        let named = metric_names(&read(f));
        assert!(named.len() >= 5, "{f} names too few metrics: {named:?}");
        for m in named {
            assert!(
                exported.contains(&m),
                "{f} uses {m}, which the server does not export"
            );
        }
    }
}
