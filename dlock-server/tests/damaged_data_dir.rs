//! A node whose data directory was damaged while it was down (the file its
//! log was last written to cut short, as by a full disk or a bad copy) refuses to start with a
//! message that names the directory, or starts and catches up: it never
//! crashes with a backtrace, and never serves a state the cluster did not
//! commit. With its file back, it rejoins and the cluster's state is whole.

mod common;

use common::nodes::await_caught_up;
use dlock::proto::RequestType;
use dlock::raw::RawClient;
use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::NodeProcesses;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_cut_log_file_refuses_to_start_or_catches_up_never_crashes() {
    let mut nodes = NodeProcesses::start(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let c = Client::connect(nodes.servers()).await.expect("a leader");
    for i in 0..40 {
        let g = c
            .lock(format!("churn/{i}"), LockOptions::new())
            .await
            .expect("lock");
        g.unlock().await.expect("unlock");
    }
    let lease = c
        .lock("kept", LockOptions::new().lease(Duration::from_secs(600)))
        .await
        .expect("a lease");
    let kept = lease.into_parts();
    let kept_fence = kept.fence;
    assert_eq!(kept.keys, ["kept"]);
    let leader = nodes.index_of(&c.addr()).expect("the client's node");
    let victim = (leader + 1) % 3;
    await_caught_up(&nodes, victim).await;
    nodes.kill(victim);

    let file = nodes.log_file(victim).expect("the node's log file");
    let whole = std::fs::read(&file).expect("the node's log file");
    assert!(whole.len() > 8192, "a log file of {} bytes", whole.len());
    for cut in [whole.len() / 2, whole.len() - 4096, 512, 0] {
        std::fs::write(&file, &whole[..cut]).expect("cut the file");
        match nodes.try_restart(victim) {
            Err(why) => {
                assert!(
                    why.contains("is damaged") || why.contains("cannot open"),
                    "cut to {cut} bytes: the refusal does not say why: {why}"
                );
                assert!(
                    why.contains(&nodes.data_dir(victim).display().to_string()),
                    "cut to {cut} bytes: the refusal does not name the directory: {why}"
                );
            }
            Ok(()) => {
                // Started: it must take the leader's state, not serve its own.
                await_caught_up(&nodes, victim).await;
                nodes.kill(victim);
            }
        }
        assert!(
            !nodes.any_panicked(),
            "cut to {cut} bytes: a node's log says it panicked"
        );
    }

    // The file restored: the node rejoins and the lease is still there.
    std::fs::write(&file, &whole).expect("restore the file");
    nodes.restart(victim);
    await_caught_up(&nodes, victim).await;
    let infos = c.inspect("kept").await.expect("inspect");
    assert_eq!(
        infos[0].fence(),
        Some(kept_fence),
        "the lease outlived the damage"
    );
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_does_not_bootstrap_again_and_joins_only_when_told() {
    let mut nodes = NodeProcesses::start(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let c = Client::connect(nodes.servers()).await.expect("a leader");
    let lease = c
        .lock("kept", LockOptions::new().lease(Duration::from_secs(600)))
        .await
        .expect("a lease")
        .into_parts();
    let leader = nodes.index_of(&c.addr()).expect("the client's node");
    let victim = (leader + 1) % 3;
    await_caught_up(&nodes, victim).await;
    nodes.kill(victim);
    // The whole directory gone, as with a new disk: nothing left to say it
    // was ever written to.
    let dir = nodes.data_dir(victim).to_path_buf();
    std::fs::remove_dir_all(&dir).expect("wipe the data directory");

    let why = nodes
        .try_restart(victim)
        .expect_err("a wiped member must not bootstrap again");
    assert!(why.contains("lost its log and its vote"), "{why}");
    assert!(why.contains("--initial-cluster-state existing"), "{why}");
    assert!(why.contains(&dir.display().to_string()), "{why}");

    // Not under its old id even when told that it joins: openraft does not
    // let a follower's log go back, and its vote is gone.
    nodes.node_flags(victim, &["--initial-cluster-state", "existing"]);
    let why = nodes
        .try_restart(victim)
        .expect_err("a wiped member must not come back under its id");
    assert!(why.contains("lost its log and its vote"), "{why}");

    // What the refusal says to do: remove it, add a node with a new id.
    let mut admin = RawClient::connect(nodes.addr(leader).to_string().as_str())
        .await
        .expect("connect");
    let r = cluster_change(&mut admin, RequestType::ClusterRemove, &nodes, victim).await;
    assert_eq!(r.status, 0, "{}", r.error_text);
    let fresh = nodes.add_joiner();
    nodes.restart(fresh);
    let r = cluster_change(&mut admin, RequestType::ClusterAdd, &nodes, fresh).await;
    assert_eq!(r.status, 0, "{}", r.error_text);
    await_caught_up(&nodes, fresh).await;
    let infos = c.inspect("kept").await.expect("inspect");
    assert_eq!(infos[0].fence(), Some(lease.fence));

    // A node outside --initial-cluster, not told that it joins, refuses.
    let stray = nodes.add_joiner();
    let why = {
        // Without the joiner's flag: as an operator who forgot it.
        nodes.node_flags(stray, &["--initial-cluster-state", "new"]);
        nodes
            .try_restart(stray)
            .expect_err("a stray node must not start")
    };
    assert!(why.contains("not in --initial-cluster"), "{why}");
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// ClusterAdd or ClusterRemove of node `i`.
async fn cluster_change(
    c: &mut RawClient,
    kind: RequestType,
    nodes: &NodeProcesses,
    i: usize,
) -> dlock::proto::Response {
    let mut req = c.request(kind, &[]);
    req.cluster = Some(dlock::proto::RequestCluster {
        node_id: nodes.id(i),
        client_addr: nodes.addr(i).to_string(),
        peer_addr: nodes.peer_addr(i).to_string(),
    });
    c.call(&req).await.expect("an answer")
}

/// Starts nodes 1 and 2 of three, node 3 not yet: a client of the cluster
/// they form.
async fn only_the_first_two_started(nodes: &mut NodeProcesses) -> Client {
    nodes.restart(0);
    nodes.restart(1);
    let first_two = format!("{},{}", nodes.addr(0), nodes.addr(1));
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        match Client::connect(first_two.as_str()).await {
            Ok(c) => return c,
            Err(e) => assert!(Instant::now() < deadline, "no leader of two: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_first_started_after_the_others_formed_the_cluster_bootstraps() {
    let mut nodes = NodeProcesses::prepare(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let c = only_the_first_two_started(&mut nodes).await;
    let g = c.lock("early", LockOptions::new()).await.expect("lock");
    // Its first start, late: the leader has nothing from it, so it is new.
    nodes.restart(2);
    await_caught_up(&nodes, 2).await;
    assert_eq!(
        c.inspect("early").await.expect("inspect")[0].fence(),
        Some(g.fence())
    );
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// `--initial-cluster` as every node gets it, and one with a stale peer
/// address for node 2 (nobody listens there: released at once, below the
/// ephemeral range).
fn right_and_wrong_lists(nodes: &NodeProcesses) -> (String, String) {
    let right = nodes.members_list();
    let stale = dlock_server::testing::ports::reserve().0;
    let wrong = right.replace(&format!("@{}", nodes.peer_addr(1)), &format!("@{stale}"));
    assert_ne!(right, wrong);
    (right, wrong)
}

/// Initial nodes given different `--initial-cluster` lists (here node 3,
/// with a stale address for node 2) would each write their own first
/// membership at the same log position, which openraft takes for the same
/// log: node 3 would follow the others' leader under a membership of its
/// own, or lead beside it. Each records its list and says it in its peer
/// hello, so nodes 1 and 2 form their cluster and serve, and node 3 is
/// refused by both and never joins, with an error on both sides that
/// names both lists. Node 3 starts first, so that no leader exists when it
/// asks the others (a first start of all the nodes: it cannot tell yet
/// which side is wrong, and starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_given_another_initial_list_never_joins_the_others_cluster() {
    let mut nodes = NodeProcesses::prepare(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let (right, wrong) = right_and_wrong_lists(&nodes);
    nodes.initial_cluster(2, &wrong);
    nodes.restart(2);
    nodes.start_all();

    let first_two = format!("{},{}", nodes.addr(0), nodes.addr(1));
    let c = Client::connect(first_two.as_str())
        .await
        .expect("a leader of nodes 1 and 2");
    let g = c.lock("served", LockOptions::new()).await.expect("lock");
    let leader = nodes.index_of(&c.addr()).expect("the client's node");
    assert_ne!(leader, 2);

    // Until both sides said why, with both lists: node 3's when the
    // leader's replication dials it, the leader's from the same refusal.
    let says = "every initial node must be given the same --initial-cluster list";
    let said = |i: usize| {
        let log = nodes.recent_log(i).into_iter();
        log.filter(|l| l.contains("ERROR"))
            .find(|l| l.contains(says))
    };
    let deadline = Instant::now() + common::PATIENCE;
    let (on_3, on_leader) = loop {
        // Without the check, node 3 follows the leader at once: it must
        // never know of one (nor lead: nodes 1 and 2 refuse its votes).
        let three = common::nodes::status(&nodes, 2)
            .await
            .expect("node 3 answers");
        assert_eq!(three.leader_id, 0, "node 3 joined a cluster: {three:?}");
        let view = common::nodes::status(&nodes, leader)
            .await
            .expect("the leader answers");
        let of_3 = view
            .members
            .iter()
            .find(|m| m.node_id == 3)
            .expect("node 3 listed");
        assert_eq!(
            of_3.matched_index, 0,
            "node 3 acknowledged entries: {view:?}"
        );
        if let (Some(a), Some(b)) = (said(2), said(leader)) {
            break (a, b);
        }
        assert!(
            Instant::now() < deadline,
            "no refusal logged: node 3 {:#?}, leader {:#?}",
            nodes.recent_log(2),
            nodes.recent_log(leader)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for line in [&on_3, &on_leader] {
        assert!(line.contains(&wrong) && line.contains(&right), "{line}");
        assert!(line.contains("empty their data directories"), "{line}");
    }
    // The list each bootstrapped with is on disk, for later starts.
    let recorded = std::fs::read_to_string(nodes.data_dir(2).join("identity")).expect("read");
    assert!(recorded.contains(&wrong), "{recorded}");
    g.unlock().await.expect("nodes 1 and 2 still serve");
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// A fresh node whose flags disagree with a running cluster's (another
/// `--initial-cluster` list, another `--cluster-id`) is refused by its
/// members, which say they know a leader: the fresh node is the wrong one.
/// It does not start (sitting apart, refused at every dial, it would only
/// log), its data directory is left empty, and with the right flags it
/// starts and joins. Restarted later with the wrong list, it starts (the
/// list is read from its directory then) and warns that the flag differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_a_running_cluster_refuses_does_not_start_until_its_flags_are_right() {
    let mut nodes = NodeProcesses::prepare(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "1s"],
    );
    let c = only_the_first_two_started(&mut nodes).await;
    let g = c.lock("served", LockOptions::new()).await.expect("lock");
    let dir = nodes.data_dir(2).to_path_buf();
    let (right, wrong) = right_and_wrong_lists(&nodes);

    nodes.initial_cluster(2, &wrong);
    let why = nodes
        .try_restart(2)
        .expect_err("a node with another list must not start");
    assert!(why.contains(&wrong) && why.contains(&right), "{why}");
    assert!(why.contains("is a member of a running cluster"), "{why}");
    assert!(why.contains("Node 3 does not start"), "{why}");
    assert!(!why.contains("refused: refused"), "{why}");
    assert!(why.contains(&dir.display().to_string()), "{why}");
    let stamp = dir.join("identity");
    assert!(!stamp.exists(), "the directory is left as fresh");

    nodes.initial_cluster(2, &right);
    nodes.node_flags(2, &["--cluster-id", "another"]);
    let why = nodes
        .try_restart(2)
        .expect_err("a node with another cluster id must not start");
    assert!(why.contains("cluster id \"another\""), "{why}");
    assert!(why.contains("is a member of a running cluster"), "{why}");
    assert!(!stamp.exists(), "the directory is left as fresh");

    nodes.node_flags(2, &[]);
    nodes.restart(2);
    await_caught_up(&nodes, 2).await;

    // Once it holds data the list is read from its directory: a later
    // start with the wrong one starts, and warns that the flag is ignored
    // (a template that says it would give it to the next fresh node).
    nodes.kill(2);
    nodes.initial_cluster(2, &wrong);
    nodes.restart(2);
    let says = "differs from the list this node was first started with";
    let deadline = Instant::now() + common::PATIENCE;
    let warned = loop {
        if let Some(l) = nodes.recent_log(2).into_iter().find(|l| l.contains(says)) {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "no warning: {:#?}",
            nodes.recent_log(2)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        warned.contains(&wrong) && warned.contains(&right),
        "{warned}"
    );
    await_caught_up(&nodes, 2).await;
    g.unlock().await.expect("the cluster still serves");
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

/// A data directory records whose it is (its `identity` file): a node
/// started on another node's directory, a single server's durable directory
/// used as a cluster node's, or a cluster node's as a single server's, is
/// refused before it touches the log (which would otherwise run a second
/// node under one id, or stop openraft on an assertion), with a message
/// that says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_that_is_not_this_nodes_is_refused_at_start() {
    let bin = env!("CARGO_BIN_EXE_dlock-server");
    let mut nodes = NodeProcesses::start(bin, 3, &[]);
    // Each stamped its directory at its first start, before it listened.
    for i in 0..3 {
        nodes.kill(i);
    }
    let dirs: Vec<PathBuf> = (0..3).map(|i| nodes.data_dir(i).to_path_buf()).collect();
    let before: Vec<_> = dirs.iter().map(|d| contents(d)).collect();

    // Node 1 on node 2's directory (swapped mounts, a wrong unit file).
    swap(&dirs[0], &dirs[1]);
    let why = nodes
        .try_restart(0)
        .expect_err("node 1 on node 2's directory");
    assert!(
        why.contains("belongs to node 2 of cluster 'dlock'"),
        "{why}"
    );
    assert!(why.contains("started as node 1"), "{why}");
    assert!(why.contains("--node-id 2"), "{why}");
    assert!(why.contains(&dirs[0].display().to_string()), "{why}");
    swap(&dirs[0], &dirs[1]);

    // A single server's durable directory as a cluster node's: node 2's
    // (another id) and node 1's (the single server's id, another role).
    let single = tempfile::tempdir().expect("a temporary directory");
    let single_dir = single.path().join("single");
    let mut server = common::process::Process::start(&["--data-dir", path(&single_dir)]);
    let _ = server.child.kill();
    let _ = server.child.wait();
    let single_before = contents(&single_dir);
    for (i, says) in [
        (1, "belongs to a single server (node 1)"),
        (0, "started as a node of a cluster of several"),
    ] {
        swap(&dirs[i], &single_dir);
        let why = nodes
            .try_restart(i)
            .expect_err("a single server's directory as a cluster node's");
        assert!(why.contains(says), "{why}");
        assert!(why.contains("its own data directory"), "{why}");
        swap(&dirs[i], &single_dir);
    }
    assert_eq!(contents(&single_dir), single_before);

    // The converse: node 3's directory as a single server's.
    let why = refused(bin, &["--data-dir", path(&dirs[2])]);
    assert!(why.contains("belongs to node 3"), "{why}");
    assert!(
        why.contains("without --node-id a server is node 1"),
        "{why}"
    );

    // No refused start touched a directory.
    let after: Vec<_> = dirs.iter().map(|d| contents(d)).collect();
    assert!(before == after, "a refused start changed a data directory");

    // A directory of a version without the file: its first start writes it
    // from the flags.
    let file = dirs[2].join("identity");
    std::fs::remove_file(&file).expect("remove the identity file");
    nodes.restart(2);
    let written = std::fs::read_to_string(&file).expect("written again");
    assert!(written.contains(r#""node_id":3"#), "{written}");
    assert!(written.contains(r#""role":"cluster_node""#), "{written}");
    assert!(!nodes.any_panicked(), "a node's log says it panicked");
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read the directory") {
        let p = entry.expect("an entry").path();
        if p.is_dir() {
            found.extend(contents(&p));
        } else {
            found.insert(p.clone(), std::fs::read(&p).expect("read a file"));
        }
    }
    found
}

/// Exchanges directories `a` and `b`.
fn swap(a: &Path, b: &Path) {
    let aside = a.with_extension("aside");
    std::fs::rename(a, &aside).expect("move aside");
    std::fs::rename(b, a).expect("move in");
    std::fs::rename(&aside, b).expect("move back");
}

/// Runs the server with `args`, which must make it exit with a failure
/// before it listens; its log.
fn refused(bin: &str, args: &[&str]) -> String {
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock-server");
    let deadline = Instant::now() + common::PATIENCE;
    let status = loop {
        match child.try_wait().expect("wait for the server") {
            Some(status) => break status,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server started with {args:?} and did not exit");
            }
            // Polling a child process: no event to wait on in std.
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let out = child.wait_with_output().expect("its log");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!status.success(), "exited with {status}: {log}");
    assert!(!log.contains("panicked"), "{log}");
    log
}
