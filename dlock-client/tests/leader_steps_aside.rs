//! A leader that cannot lead steps aside, and its clients move (issue 45).
//!
//! - Cut off from its peers while its clients still reach it, a leader
//!   stops acting as one within twice the election timeout: it refuses
//!   requests, resets the connections whose sessions it kept and answers
//!   the clients' probe `Unavailable`. A `dlock` holder and a waiter on it
//!   move to the leader the others elected: the holder's command runs to
//!   its end and the waiter then runs, both exit 0, with and without
//!   `--lease`, for longer than the session TTL. Healed, the old leader
//!   follows the new one.
//! - A rolling restart (SIGTERM and start again, every node in turn, twice)
//!   under `dlock` runs in a loop costs no run: a stopping leader steps
//!   aside, and a client treats its ShuttingDown as a reason to go on
//!   elsewhere.

mod common;

use common::{code, dlock_at, lines, seen_by_the_others, stderr, wait_output, PATIENCE};
use dlock::proto::{RequestType, ResponseStatus};
use dlock::raw::RawClient;
use dlock::Client;
use dlock_server::testing::nodes::{cluster_status, server_binary, NodeProcesses};
use dlock_server::testing::peer_links::PeerLinks;
use std::time::{Duration, Instant};

/// One cluster at a time: three node processes are load enough for two
/// cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An election timeout short enough that a new leader is in office well
/// within the TTL on a loaded machine.
const NODE_FLAGS: &[&str] = &["--heartbeat", "100ms", "--election-timeout", "500ms"];

/// For the cut-off leader: a session TTL of 8 s leaves a client that pings
/// every quarter of it and stops trusting its lock 2 s early at least 4 s
/// from the cut to move its session. A leader that goes on answering as
/// one until its commits time out (5 s) costs it its lock; one that steps
/// aside after twice the election timeout (0.6 s) does not.
const CUT_OFF_FLAGS: &[&str] = &[
    "--heartbeat",
    "100ms",
    "--election-timeout",
    "300ms",
    "--session-ttl",
    "8s",
];

/// Longer than the session TTL.
const CUT: Duration = Duration::from_secs(10);

/// The status a session-less Ping (the clients' liveness probe) gets from
/// the node at `addr`.
async fn probe(addr: &str) -> Option<ResponseStatus> {
    let mut c = RawClient::connect(addr).await.ok()?;
    let ping = c.request(RequestType::Ping, &[]);
    let r = tokio::time::timeout(Duration::from_secs(5), c.call(&ping))
        .await
        .ok()?
        .ok()?;
    ResponseStatus::try_from(r.status).ok()
}

async fn holder_and_waiter_move_off_a_leader_cut_off_from_its_peers(extra: &[&'static str]) {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::prepare(server_binary(), 3, CUT_OFF_FLAGS);
    let links = PeerLinks::install(&mut nodes).await;
    nodes.start_all();
    let servers = nodes.servers();
    let dir = tempfile::tempdir().expect("temp dir");
    let done = dir.path().join("done");
    let log = dir.path().join("log");
    let with = |args: &[&'static str]| -> Vec<&'static str> {
        let mut all = vec!["-v"];
        all.extend_from_slice(extra);
        all.extend_from_slice(args);
        all
    };
    let script = r#"echo "$DLOCK_FENCE"; while [ ! -e "$DONE" ]; do sleep 0.05; done; echo holder >> "$LOG""#;
    let mut holder = dlock_at(&servers, &with(&["-k", "iso", "--", "sh", "-c", script]))
        .env("DONE", &done)
        .env("LOG", &log)
        .spawn()
        .expect("dlock starts");
    let fence: u64 = lines(&mut holder, 1).await[0].parse().expect("a fence");
    let waiter = dlock_at(
        &servers,
        &with(&["-k", "iso", "--", "sh", "-c", r#"echo waiter >> "$LOG""#]),
    )
    .env("LOG", &log)
    .spawn()
    .expect("dlock starts");
    let observer = Client::connect(servers.as_str()).await.expect("connect");
    let deadline = Instant::now() + PATIENCE;
    while observer.inspect(["iso"]).await.expect("inspect")[0].waiters != 1 {
        assert!(Instant::now() < deadline, "the waiter never got in line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = nodes.index_of(&observer.addr()).expect("a node");
    drop(observer);
    assert_eq!(
        probe(&nodes.addr(old).to_string()).await,
        Some(ResponseStatus::Ok)
    );

    // Only the old leader's peer traffic is dropped: its client port stays
    // reachable.
    links.isolate(old, true);
    let cut = Instant::now();
    let (held, waiting) = seen_by_the_others(&nodes, old, "iso").await;
    assert_eq!((held, waiting), (fence, 1), "after the election");
    // The old leader knows it cannot serve, and tells the probe so.
    let deadline = Instant::now() + PATIENCE;
    loop {
        match probe(&nodes.addr(old).to_string()).await {
            Some(ResponseStatus::Unavailable) => break,
            other => assert!(
                Instant::now() < deadline,
                "the cut-off leader still answers the probe {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep_until((cut + CUT).into()).await;
    let (held, waiting) = seen_by_the_others(&nodes, old, "iso").await;
    assert_eq!(
        (held, waiting),
        (fence, 1),
        "a TTL after the cut, both sessions live on the majority's side"
    );

    // Healed, the old leader follows the leader elected without it.
    links.isolate(old, false);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = cluster_status(&nodes.addr(old).to_string(), Duration::from_secs(2)).await;
        if s.as_ref()
            .is_some_and(|s| s.leader_id != 0 && s.leader_id != nodes.id(old))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the healed old leader never followed the new one: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    std::fs::write(&done, b"").expect("tell the holder to end");
    let out = wait_output(holder).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "the holder's command ran to its end: {err}");
    assert!(err.contains("resumed on"), "{err}");
    let out = wait_output(waiter).await;
    assert_eq!(code(&out), 0, "the waiter ran: {}", stderr(&out));
    let order = std::fs::read_to_string(&log).expect("the log");
    assert_eq!(order, "holder\nwaiter\n", "one after the other, in line");
    assert!(!nodes.any_panicked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_peers_costs_no_lock_and_no_place_in_line() {
    holder_and_waiter_move_off_a_leader_cut_off_from_its_peers(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_peers_costs_no_lease_and_no_place_in_line() {
    holder_and_waiter_move_off_a_leader_cut_off_from_its_peers(&["--lease", "30s"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_costs_no_lock_and_no_place_in_line() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let servers = nodes.servers();
    let dir = tempfile::tempdir().expect("temp dir");
    let done = dir.path().join("done");
    let log = dir.path().join("log");
    let script = r#"echo "$DLOCK_FENCE"; while [ ! -e "$DONE" ]; do sleep 0.05; done; echo holder >> "$LOG""#;
    let mut holder = dlock_at(&servers, &["-v", "-k", "term", "--", "sh", "-c", script])
        .env("DONE", &done)
        .env("LOG", &log)
        .spawn()
        .expect("dlock starts");
    let fence: u64 = lines(&mut holder, 1).await[0].parse().expect("a fence");
    // The waiter's Lock is waiting on the leader when it stops: the one
    // request a stopping node used to answer ShuttingDown for certain.
    let waiter = dlock_at(
        &servers,
        &[
            "-v",
            "-k",
            "term",
            "--",
            "sh",
            "-c",
            r#"echo waiter >> "$LOG""#,
        ],
    )
    .env("LOG", &log)
    .spawn()
    .expect("dlock starts");
    let observer = Client::connect(servers.as_str()).await.expect("connect");
    let deadline = Instant::now() + PATIENCE;
    while observer.inspect(["term"]).await.expect("inspect")[0].waiters != 1 {
        assert!(Instant::now() < deadline, "the waiter never got in line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = nodes.index_of(&observer.addr()).expect("a node");
    drop(observer);
    let status = nodes
        .terminate(old, PATIENCE)
        .expect("the leader stops on SIGTERM within the shutdown timeout");
    assert!(status.success(), "{status:?}");
    let (held, waiting) = seen_by_the_others(&nodes, old, "term").await;
    assert_eq!((held, waiting), (fence, 1), "after the leader stopped");
    nodes.restart(old);
    std::fs::write(&done, b"").expect("tell the holder to end");
    let out = wait_output(holder).await;
    assert_eq!(
        code(&out),
        0,
        "the holder's command ran to its end: {}",
        stderr(&out)
    );
    let out = wait_output(waiter).await;
    assert_eq!(code(&out), 0, "the waiter ran: {}", stderr(&out));
    let order = std::fs::read_to_string(&log).expect("the log");
    assert_eq!(order, "holder\nwaiter\n", "one after the other, in line");
}

/// Waits until node `i` follows a leader whose log it has caught up with.
async fn caught_up(nodes: &NodeProcesses, i: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        for j in 0..nodes.len() {
            if !nodes.is_running(j) {
                continue;
            }
            let Some(s) = cluster_status(&nodes.addr(j).to_string(), Duration::from_secs(2)).await
            else {
                continue;
            };
            let me = nodes.id(i);
            let leader_sees_it = s.role == "Leader"
                && s.members
                    .iter()
                    .any(|m| m.node_id == me && m.replication_known && m.lag == 0);
            if leader_sees_it {
                return;
            }
        }
        assert!(Instant::now() < deadline, "node {i} never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_looping_dlock_runs_costs_no_run() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let servers = nodes.servers();
    let dir = tempfile::tempdir().expect("temp dir");
    let stop = dir.path().join("stop");
    // Four workers on two keys, each running dlock in a loop until told to
    // stop, writing every run's exit status and its output when not 0.
    let worker = r#"
        n=0
        while [ ! -e "$STOP" ] && [ "$n" -lt 2000 ]; do
          if "$DLOCK" -k "$KEY" -- sh -c 'sleep 0.02' 2>"$ERR.last"; then
            echo 0 >> "$CODES"
          else
            c=$?; echo "$c" >> "$CODES"; cat "$ERR.last" >> "$ERR"
          fi
          n=$((n + 1))
        done"#;
    let mut workers = Vec::new();
    for w in 0..4 {
        let codes = dir.path().join(format!("codes{w}"));
        let err = dir.path().join(format!("err{w}"));
        let child = tokio::process::Command::new("sh")
            .args(["-c", worker])
            .env("DLOCK", env!("CARGO_BIN_EXE_dlock"))
            .env("DLOCK_SERVER", &servers)
            .env_remove("DLOCK_TOKEN")
            .env("KEY", if w % 2 == 0 { "roll-a" } else { "roll-b" })
            .env("STOP", &stop)
            .env("CODES", &codes)
            .env("ERR", &err)
            .kill_on_drop(true)
            .spawn()
            .expect("worker starts");
        workers.push((child, codes, err));
    }
    let runs = |workers: &[(
        tokio::process::Child,
        std::path::PathBuf,
        std::path::PathBuf,
    )]| {
        workers
            .iter()
            .map(|(_, codes, _)| {
                std::fs::read_to_string(codes)
                    .map(|s| s.lines().count())
                    .unwrap_or(0)
            })
            .sum::<usize>()
    };
    for _round in 0..2 {
        for i in 0..nodes.len() {
            let before = runs(&workers);
            let status = nodes
                .terminate(i, PATIENCE)
                .expect("the node stops on SIGTERM within the shutdown timeout");
            assert!(status.success(), "node {i} exits 0 on SIGTERM: {status:?}");
            nodes.restart(i);
            caught_up(&nodes, i).await;
            // Runs went on through the restart before the next one.
            let deadline = Instant::now() + PATIENCE;
            while runs(&workers) < before + 8 {
                assert!(Instant::now() < deadline, "the workers stopped running");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    std::fs::write(&stop, b"").expect("stop the workers");
    for (child, codes, err) in workers {
        let status = tokio::time::timeout(PATIENCE, child.wait_with_output())
            .await
            .expect("a worker ends")
            .expect("worker output");
        assert!(status.status.success());
        let codes = std::fs::read_to_string(&codes).expect("codes");
        let failed = codes.lines().filter(|c| *c != "0").count();
        assert_eq!(
            failed,
            0,
            "{failed} of {} runs failed: {}",
            codes.lines().count(),
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }
    assert!(!nodes.any_panicked());
}
