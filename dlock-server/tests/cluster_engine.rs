//! The consensus engine on its own: nodes of a cluster in one process, over
//! real TCP on loopback, each with a data directory of its own. Every wait is
//! on the engine's metrics (through `Cluster::wait_until`) with a generous
//! limit; nothing sleeps and hopes.

use dlock_server::engine::raft::{ApplySink, Cluster, ClusterConfig, ClusterError, Member, Role};
use dlock_server::table::{
    Command, Key, LockResult, Output, OwnerId, Reply, Sharing, TableLimits, WaitLimit,
};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Limit on every wait: far beyond what an election or a commit takes, so
/// only a real failure reaches it on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);
const CLUSTER_ID: &str = "engine-test";

type Seen = Arc<Mutex<Vec<(Command, Output)>>>;

/// A node's fixed identity: its data directory and its peer port, kept open
/// across restarts so a restarted node is found where it was.
struct Spec {
    dir: PathBuf,
    listener: std::net::TcpListener,
    member: Member,
}

/// A running node and what its apply sink has seen.
struct Node {
    id: u64,
    cluster: Cluster,
    seen: Seen,
}

impl Node {
    fn seen(&self) -> Vec<(Command, Output)> {
        self.seen.lock().expect("sink lock").clone()
    }

    fn holder(&self, key: &str) -> Option<(OwnerId, u64)> {
        self.cluster.read(|t, now| t.inspect(key, now).holder)
    }

    async fn applied_at_least(&self, index: Option<u64>) {
        self.cluster
            .wait_until(PATIENCE, "applied", |s| s.last_applied_index >= index)
            .await
            .unwrap_or_else(|e| panic!("node {} did not catch up: {e}", self.id));
    }

    async fn shutdown(self) {
        self.cluster.shutdown().await;
    }
}

struct Harness {
    _tmp: TempDir,
    specs: BTreeMap<u64, Spec>,
}

impl Harness {
    fn new(ids: &[u64]) -> Harness {
        let tmp = tempfile::tempdir().expect("temp dir");
        let specs = ids
            .iter()
            .map(|&id| {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                listener.set_nonblocking(true).expect("nonblocking");
                let peer_addr = listener.local_addr().expect("addr").to_string();
                let spec = Spec {
                    dir: tmp.path().join(format!("node-{id}")),
                    listener,
                    member: Member {
                        client_addr: format!("client-of-{id}:7000"),
                        peer_addr,
                    },
                };
                (id, spec)
            })
            .collect();
        Harness { _tmp: tmp, specs }
    }

    fn members(&self, ids: &[u64]) -> BTreeMap<u64, Member> {
        ids.iter()
            .map(|id| (*id, self.specs[id].member.clone()))
            .collect()
    }

    fn peer_addr(&self, id: u64) -> String {
        self.specs[&id].member.peer_addr.clone()
    }

    async fn start(&self, id: u64, initial: BTreeMap<u64, Member>) -> Node {
        let spec = &self.specs[&id];
        let listener = TcpListener::from_std(spec.listener.try_clone().expect("dup listener"))
            .expect("tokio listener");
        let seen = Seen::default();
        let sink: ApplySink = {
            let seen = seen.clone();
            Arc::new(move |cmd: &Command, out: &Output| {
                seen.lock()
                    .expect("sink lock")
                    .push((cmd.clone(), out.clone()));
            })
        };
        let cfg = ClusterConfig {
            node_id: id,
            cluster_id: CLUSTER_ID.into(),
            data_dir: spec.dir.clone(),
            client_addr: spec.member.client_addr.clone(),
            peer_addr: spec.member.peer_addr.clone(),
            ephemeral_peer_port: false,
            // A node outside the initial members is one added at run time.
            join_existing: !initial.is_empty() && !initial.contains_key(&id),
            initial_members: initial,
            heartbeat: Duration::from_millis(100),
            // Twice the usual, so that a loaded test machine does not
            // start elections nobody asked for.
            election_timeout: (Duration::from_millis(1000), Duration::from_millis(2000)),
            limits: TableLimits {
                max_waiters: 1000,
                max_held_keys: 100_000,
            },
            first_fence: 1,
            // The engine alone: owners are bare ids, as on a single server.
            sessions: false,
            peer_tls: None,
            peer_routes: Default::default(),
            clock_rate: 1.0,
            snapshot_every: dlock_server::engine::raft::SNAPSHOT_EVERY,
            snapshot_write_rate: dlock_server::engine::raft::SNAPSHOT_WRITE_RATE,
        };
        let cluster = Cluster::start(cfg, listener, sink, CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("node {id} did not start: {e:#}"));
        Node { id, cluster, seen }
    }

    async fn start_all(&self, ids: &[u64]) -> Vec<Node> {
        let mut nodes = Vec::new();
        for id in ids {
            nodes.push(self.start(*id, self.members(ids)).await);
        }
        nodes
    }
}

/// Waits until every node names the same leader among them, and that node
/// knows it leads; returns its position in `nodes`. (Every initial node
/// campaigns at first start, so leadership may move once or twice before
/// it settles.)
async fn leader(nodes: &[Node]) -> usize {
    let ids: Vec<u64> = nodes.iter().map(|n| n.id).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    'attempt: loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader settled among {ids:?}"
        );
        let status = nodes[0]
            .cluster
            .wait_until(PATIENCE, "a leader among the live nodes", |s| {
                s.leader.is_some_and(|l| ids.contains(&l))
            })
            .await
            .expect("a leader is elected");
        let id = status.leader.expect("checked");
        let at = ids.iter().position(|i| *i == id).expect("among the nodes");
        let settle = Duration::from_secs(3);
        for n in nodes {
            let agreed = n
                .cluster
                .wait_until(settle, "the same leader", |s| s.leader == Some(id))
                .await;
            if agreed.is_err() {
                continue 'attempt;
            }
        }
        if nodes[at]
            .cluster
            .wait_until(settle, "leadership", |s| s.role == Role::Leader)
            .await
            .is_ok()
        {
            return at;
        }
    }
}

/// Proposes on the leader, looking for it again if leadership moved before
/// the command was taken (NotLeader: never applied, so safe to repeat).
async fn propose(nodes: &[Node], cmd: Command) -> Output {
    propose_indexed(nodes, cmd).await.1
}

/// As `propose`, with the log index the command was committed at.
async fn propose_indexed(nodes: &[Node], cmd: Command) -> (u64, Output) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let at = leader(nodes).await;
        match nodes[at].cluster.propose_indexed(cmd.clone()).await {
            Ok(done) => return done,
            Err(ClusterError::NotLeader { .. }) if tokio::time::Instant::now() < deadline => {}
            Err(e) => panic!("proposing {cmd:?}: {e}"),
        }
    }
}

fn lock(owner: OwnerId, key: &str, lease: Option<Duration>) -> Command {
    Command::Lock {
        owner,
        keys: vec![key.into()],
        sharing: Sharing::exclusive(),
        wait: WaitLimit::No,
        lease,
        value: Vec::new(),
    }
}

fn unlock(owner: OwnerId, key: &str) -> Command {
    Command::Unlock {
        owner,
        keys: vec![key.into()],
        fence: None,
    }
}

fn granted(out: &Output) -> u64 {
    match out.reply {
        Reply::Lock(LockResult::Granted { fence }) => fence,
        ref other => panic!("expected a grant, got {other:?}"),
    }
}

fn last_applied(node: &Node) -> Option<u64> {
    node.cluster.status().last_applied_index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_and_every_sink_sees_the_same_commands() {
    let h = Harness::new(&[1, 2, 3]);
    let nodes = h.start_all(&[1, 2, 3]).await;
    let at = leader(&nodes).await;
    let leader_node = &nodes[at];

    let out = leader_node
        .cluster
        .propose(lock(7, "a", None))
        .await
        .expect("lock");
    let fence = granted(&out);
    let out = leader_node
        .cluster
        .propose(lock(8, "a", None))
        .await
        .expect("busy lock");
    assert_eq!(out.reply, Reply::Lock(LockResult::Busy(vec!["a".into()])));
    let out = leader_node
        .cluster
        .propose(unlock(7, "a"))
        .await
        .expect("unlock");
    assert_eq!(out.reply, Reply::NotHeld(vec![]));
    let (last, out) = leader_node
        .cluster
        .propose_indexed(lock(8, "a", Some(Duration::from_secs(60))))
        .await
        .expect("lock again");
    assert!(granted(&out) > fence, "fences increase");

    // A follower refuses, naming the leader and its client address.
    let follower = &nodes[(at + 1) % 3];
    match follower.cluster.propose(lock(9, "b", None)).await {
        Err(ClusterError::NotLeader {
            leader: Some((id, member)),
        }) => {
            assert_eq!(id, leader_node.id);
            assert_eq!(member, h.specs[&id].member);
        }
        other => panic!("a follower answered {other:?}"),
    }
    assert!(!follower.cluster.is_leader());
    assert_eq!(follower.cluster.leader().map(|l| l.0), Some(leader_node.id));
    assert!(matches!(
        follower.cluster.read_index().await,
        Err(ClusterError::NotLeader { .. })
    ));

    // The leader's read barrier, then every node applies the same commands
    // with the same outputs in the same order.
    leader_node.cluster.read_index().await.expect("read index");
    assert_eq!(leader_node.holder("a").map(|h| h.0), Some(8));
    for n in &nodes {
        n.applied_at_least(Some(last)).await;
    }
    let expected = leader_node.seen();
    assert_eq!(expected.len(), 4, "the four proposals, nothing else");
    for n in &nodes {
        assert_eq!(n.seen(), expected, "node {} saw another sequence", n.id);
        assert_eq!(n.holder("a").map(|h| h.0), Some(8));
    }

    let status = leader_node.cluster.status();
    assert_eq!(status.role, Role::Leader);
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.voter));
    assert!(status.committed_index >= Some(last));
    for n in nodes {
        n.shutdown().await;
    }
}

/// Proposals made at once share log entries (the batcher), yet each gets its
/// own command's output, fences follow log order, and every node (one of
/// them restarted, so reading the entries back from its log) applies the
/// same commands in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_share_log_entries_and_keep_log_order() {
    const N: u64 = 64;
    let h = Harness::new(&[1, 2, 3]);
    let mut nodes = h.start_all(&[1, 2, 3]).await;
    let at = leader(&nodes).await;
    let lead = &nodes[at].cluster;
    let answers = futures_util::future::join_all(
        (0..N).map(|i| lead.propose_indexed(lock(100 + i, &format!("k{i}"), None))),
    )
    .await;
    let mut got: Vec<(u64, u64)> = answers
        .into_iter()
        .map(|a| {
            let (index, out) = a.expect("a proposal on a healthy cluster");
            (index, granted(&out))
        })
        .collect();
    let entries: std::collections::BTreeSet<u64> = got.iter().map(|g| g.0).collect();
    // 64 entries would mean every proposal waited for the one before it:
    // they are all queued long before two fsyncs finish.
    assert!(
        entries.len() < N as usize,
        "{} proposals in {} entries",
        N,
        entries.len()
    );
    got.sort_unstable();
    assert!(
        got.windows(2).all(|w| w[0].1 < w[1].1),
        "fences follow the log: {got:?}"
    );
    let last = entries.last().copied();
    let expected = nodes[at].seen();
    assert_eq!(expected.len(), N as usize);

    let follower = nodes.remove((at + 1) % 3);
    let id = follower.id;
    follower.shutdown().await;
    nodes.push(h.start(id, BTreeMap::new()).await);
    for n in &nodes {
        n.applied_at_least(last).await;
        assert_eq!(n.seen(), expected, "node {} saw another sequence", n.id);
    }
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_keeps_every_held_key_and_issues_higher_fences() {
    let h = Harness::new(&[1, 2, 3]);
    let mut nodes = h.start_all(&[1, 2, 3]).await;
    let bound = granted(&propose(&nodes, lock(1, "bound", None)).await);
    let leased = granted(&propose(&nodes, lock(2, "leased", Some(Duration::from_secs(60)))).await);

    let at = leader(&nodes).await;
    let old = nodes.remove(at);
    let old_id = old.id;
    old.shutdown().await;

    let at = leader(&nodes).await;
    assert_ne!(nodes[at].id, old_id);
    nodes[at].cluster.read_index().await.expect("read index");
    assert_eq!(nodes[at].holder("bound"), Some((1, bound)));
    assert_eq!(nodes[at].holder("leased"), Some((2, leased)));
    let lease_left = nodes[at]
        .cluster
        .read(|t, now| t.inspect("leased", now).lease_remaining)
        .expect("a lease");
    assert!(
        lease_left > Duration::from_secs(50),
        "the lease ran on: {lease_left:?}"
    );

    let out = propose(&nodes, lock(3, "bound", None)).await;
    assert_eq!(
        out.reply,
        Reply::Lock(LockResult::Busy(vec!["bound".into()]))
    );
    let fresh = granted(&propose(&nodes, lock(3, "fresh", None)).await);
    assert!(
        fresh > leased && leased > bound,
        "fences {bound} {leased} {fresh}"
    );
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restarts_from_its_data_dirs_with_keys_and_fences() {
    let h = Harness::new(&[1, 2, 3]);
    let nodes = h.start_all(&[1, 2, 3]).await;
    let bound = granted(&propose(&nodes, lock(1, "bound", None)).await);
    let leased = granted(&propose(&nodes, lock(2, "leased", Some(Duration::from_secs(60)))).await);
    for n in nodes {
        n.shutdown().await;
    }

    // The initial member list is ignored now: the data dirs hold the membership.
    let mut nodes = Vec::new();
    for id in [1, 2, 3] {
        nodes.push(h.start(id, BTreeMap::new()).await);
    }
    let at = leader(&nodes).await;
    nodes[at].cluster.read_index().await.expect("read index");
    assert_eq!(nodes[at].holder("bound"), Some((1, bound)));
    assert_eq!(nodes[at].holder("leased"), Some((2, leased)));
    let fresh = granted(&propose(&nodes, lock(3, "fresh", None)).await);
    assert!(fresh > leased, "fences go on from {leased}: {fresh}");
    assert_eq!(nodes[at].cluster.status().members.len(), 3);
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_serves_and_survives_restart() {
    let h = Harness::new(&[1]);
    let node = h.start(1, BTreeMap::new()).await;
    let nodes = vec![node];
    let fence = granted(&propose(&nodes, lock(1, "k", Some(Duration::from_secs(60)))).await);
    let status = nodes[0].cluster.status();
    assert_eq!(status.role, Role::Leader);
    assert_eq!(status.members.len(), 1);
    assert_eq!(status.members[0].peer_addr, h.peer_addr(1));
    for n in nodes {
        n.shutdown().await;
    }

    let nodes = vec![h.start(1, BTreeMap::new()).await];
    leader(&nodes).await;
    // Applied again from the log on start, before any new write.
    assert_eq!(nodes[0].holder("k"), Some((1, fence)));
    assert!(
        nodes[0]
            .seen()
            .iter()
            .any(|(cmd, _)| *cmd == lock(1, "k", Some(Duration::from_secs(60)))),
        "the sink sees re-applied entries"
    );
    let next = granted(&propose(&nodes, lock(2, "other", None)).await);
    assert!(next > fence);
    for n in nodes {
        n.shutdown().await;
    }
}

/// The space of purged entries is given back while the node runs: their
/// segment files are deleted once a snapshot covers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_gives_back_the_space_of_purged_entries() {
    let h = Harness::new(&[1]);
    let nodes = vec![h.start(1, BTreeMap::new()).await];
    leader(&nodes).await;
    // Entries of about 60 KB each: 64 long key names, taken and released.
    let keys: Vec<Key> = (0..64)
        .map(|i| format!("{i:02}-{}", "x".repeat(900)).into())
        .collect();
    for _ in 0..150 {
        let take = Command::Lock {
            owner: 1,
            keys: keys.clone(),
            sharing: Sharing::exclusive(),
            wait: WaitLimit::No,
            lease: None,
            value: Vec::new(),
        };
        granted(&propose(&nodes, take).await);
        let release = Command::Unlock {
            owner: 1,
            keys: keys.clone(),
            fence: None,
        };
        propose(&nodes, release).await;
    }
    let log = h.specs[&1].dir.join("raft-log");
    let size = || -> u64 {
        std::fs::read_dir(&log)
            .expect("raft-log/")
            .map(|f| f.expect("entry").metadata().expect("metadata").len())
            .sum()
    };
    let grown = size();
    assert!(grown > 16 << 20, "the log grew to {grown} bytes");
    let covered = nodes[0]
        .cluster
        .snapshot()
        .await
        .expect("snapshot")
        .expect("something to cover");
    nodes[0]
        .cluster
        .wait_until(PATIENCE, "log purged", |s| s.purged_index >= Some(covered))
        .await
        .expect("the log is purged up to the snapshot");
    // The purge's record is written before its segments are deleted, by
    // the same thread: one more write after it finds them gone.
    granted(&propose(&nodes, lock(2, "after", None)).await);
    let purged = size();
    assert!(
        purged < grown / 3,
        "{grown} bytes before the purge, {purged} after"
    );
    for n in nodes {
        n.shutdown().await;
    }
    // Nothing was lost on the way.
    let nodes = vec![h.start(1, BTreeMap::new()).await];
    leader(&nodes).await;
    assert_eq!(nodes[0].holder(&keys[0]), None);
    assert!(nodes[0].holder("after").is_some());
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_and_leave_while_commands_flow() {
    let h = Harness::new(&[1, 2, 3, 4]);
    let mut nodes = h.start_all(&[1, 2, 3]).await;
    // Fresh, and not among the initial members: it waits to be added.
    let joiner = h.start(4, h.members(&[1, 2, 3])).await;
    let status = joiner.cluster.status();
    assert!(
        status.members.is_empty() && status.role != Role::Leader,
        "{status:?}"
    );

    let at = leader(&nodes).await;
    let lead = nodes[at].cluster.clone();
    let stop = CancellationToken::new();
    let proposer = {
        let lead = lead.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut done, mut last) = (0u64, 0);
            while !stop.is_cancelled() {
                let key = format!("k{}", done % 5);
                let out = lead.propose(lock(done, &key, None)).await?;
                granted(&out);
                last = lead.propose_indexed(unlock(done, &key)).await?.0;
                done += 1;
            }
            Ok::<_, ClusterError>((done, last))
        })
    };

    lead.add_node(4, h.specs[&4].member.clone())
        .await
        .expect("add node 4");
    let removed = nodes[(at + 1) % 3].id;
    lead.remove_node(removed).await.expect("remove a follower");
    let status = lead
        .wait_until(PATIENCE, "membership 4 in, one out", |s| {
            s.members.iter().any(|m| m.id == 4 && m.voter)
                && s.members.iter().all(|m| m.id != removed)
        })
        .await
        .expect("membership changed");
    assert_eq!(status.members.len(), 3);
    let gone = nodes.remove((at + 1) % 3);
    gone.shutdown().await;

    // Still committing with the new majority, then stop and compare.
    let before = last_applied(&joiner);
    joiner
        .cluster
        .wait_until(PATIENCE, "more entries", |s| s.last_applied_index > before)
        .await
        .expect("the new voter keeps applying");
    stop.cancel();
    let (done, last) = proposer
        .await
        .expect("proposer task")
        .expect("every proposal succeeded");
    assert!(done > 0);
    joiner.applied_at_least(Some(last)).await;
    for n in &nodes {
        n.applied_at_least(Some(last)).await;
        assert_eq!(
            joiner.seen(),
            n.seen(),
            "the new node applied the whole log"
        );
        assert_eq!(
            joiner.cluster.read(|t, _| t.snapshot()),
            n.cluster.read(|t, _| t.snapshot())
        );
    }
    joiner.shutdown().await;
    for n in nodes {
        n.shutdown().await;
    }
}

/// Reads one frame of the peer protocol; `None` when the connection closed.
fn read_frame(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn closed(s: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_strangers_at_the_peer_port_are_refused_and_the_cluster_keeps_working() {
    let h = Harness::new(&[1, 2, 3]);
    let nodes = h.start_all(&[1, 2, 3]).await;
    let at = leader(&nodes).await;
    let follower = &nodes[(at + 1) % 3];
    let addr = h.peer_addr(follower.id);
    let follower_id = follower.id;
    // What every node bootstrapped with, in canonical form (sorted by id).
    let list = h
        .members(&[1, 2, 3])
        .iter()
        .map(|(id, m)| format!("{id}={}@{}", m.client_addr, m.peer_addr))
        .collect::<Vec<_>>()
        .join(",");

    let strangers = tokio::task::spawn_blocking(move || {
        let connect = || {
            let s = std::net::TcpStream::connect(&addr).expect("connect");
            s.set_read_timeout(Some(PATIENCE)).expect("timeout");
            s
        };
        // Text where a length should be: 1.2 GB, over the hello limit.
        let mut s = connect();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        assert!(closed(&mut s), "HTTP is refused");
        // A length at the limit of u32.
        let mut s = connect();
        s.write_all(&[0xff; 4]).expect("write");
        assert!(closed(&mut s), "an oversized frame is refused");
        // A frame of the right size that is not a hello.
        let mut s = connect();
        s.write_all(&frame(b"\x08\x01\x10\x06 not json"))
            .expect("write");
        assert!(closed(&mut s), "a non-hello frame is refused");
        // Another cluster: told why, then closed.
        let mut s = connect();
        let hello = format!(
            r#"{{"protocol":"dlock-peer/1","cluster_id":"other","from":9,"to":{follower_id}}}"#
        );
        s.write_all(&frame(hello.as_bytes())).expect("write");
        let reply = read_frame(&mut s).expect("a refusal");
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.contains("Refused") && reply.contains("other"),
            "{reply}"
        );
        assert!(closed(&mut s), "closed after the refusal");
        // The right cluster, the wrong node.
        let mut s = connect();
        let hello = format!(
            r#"{{"protocol":"dlock-peer/1","cluster_id":"{CLUSTER_ID}","from":9,"to":77}}"#
        );
        s.write_all(&frame(hello.as_bytes())).expect("write");
        let reply = read_frame(&mut s).expect("a refusal");
        assert!(String::from_utf8_lossy(&reply).contains("Refused"));
        // Bootstrapped with another --initial-cluster list: told why, with
        // both lists, then closed.
        let mut s = connect();
        let hello = format!(
            r#"{{"protocol":"dlock-peer/1","cluster_id":"{CLUSTER_ID}","from":9,"to":{follower_id},"initial_cluster":"9=c@p"}}"#
        );
        s.write_all(&frame(hello.as_bytes())).expect("write");
        let reply = read_frame(&mut s).expect("a refusal");
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.contains("Refused"), "{reply}");
        assert!(
            reply.contains("node 9 was first started with --initial-cluster 9=c@p"),
            "{reply}"
        );
        assert!(reply.contains(&format!("with {list}")), "{reply}");
        assert!(closed(&mut s), "closed after the refusal");
        // The same list: welcomed.
        let mut s = connect();
        let hello = format!(
            r#"{{"protocol":"dlock-peer/1","cluster_id":"{CLUSTER_ID}","from":9,"to":{follower_id},"initial_cluster":"{list}"}}"#
        );
        s.write_all(&frame(hello.as_bytes())).expect("write");
        let reply = read_frame(&mut s).expect("a welcome");
        assert_eq!(reply, b"\"Welcome\"");
        // No list (a node that joined, or of an older version): not
        // checked, welcomed; then garbage instead of a request.
        let mut s = connect();
        let hello = format!(
            r#"{{"protocol":"dlock-peer/1","cluster_id":"{CLUSTER_ID}","from":9,"to":{follower_id}}}"#
        );
        s.write_all(&frame(hello.as_bytes())).expect("write");
        let reply = read_frame(&mut s).expect("a welcome");
        assert_eq!(reply, b"\"Welcome\"");
        s.write_all(&frame(b"{\"Nonsense\":1}")).expect("write");
        assert!(closed(&mut s), "a bad request closes the connection");
    });
    strangers.await.expect("stranger checks");

    // A dlock client dialling the peer port by mistake gets an error, not a hang.
    let client = tokio::time::timeout(PATIENCE, dlock::Client::connect(&h.peer_addr(follower_id)))
        .await
        .expect("the client is answered in time");
    match client {
        Ok(_) => panic!("the peer port does not speak the client protocol"),
        // It says so, in the client's protocol.
        Err(e) => assert!(e.to_string().contains("peer port"), "{e}"),
    }

    // The follower attacked still replicates.
    let (target, out) = propose_indexed(&nodes, lock(1, "after", None)).await;
    granted(&out);
    let target = Some(target);
    for n in &nodes {
        n.applied_at_least(target).await;
        assert_eq!(
            n.holder("after").map(|h| h.0),
            Some(1),
            "node {} applied it",
            n.id
        );
    }
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_purged_entries_catches_up_from_a_snapshot() {
    let h = Harness::new(&[1, 2, 3]);
    let mut nodes = h.start_all(&[1, 2, 3]).await;
    granted(&propose(&nodes, lock(1, "early", None)).await);
    let at = leader(&nodes).await;
    let lagger = nodes.remove((at + 1) % 3);
    let lagger_id = lagger.id;
    lagger.shutdown().await;

    for i in 0..20u64 {
        granted(
            &propose(
                &nodes,
                lock(100 + i, &format!("k{i}"), Some(Duration::from_secs(600))),
            )
            .await,
        );
    }
    let at = leader(&nodes).await;
    let lead = nodes[at].cluster.clone();
    let covered = lead
        .snapshot()
        .await
        .expect("snapshot")
        .expect("something applied");
    let status = lead
        .wait_until(PATIENCE, "log purged", |s| s.purged_index >= Some(covered))
        .await
        .expect("the log is purged");
    assert!(status.snapshot_index >= Some(covered));
    let on_disk = std::fs::metadata(h.specs[&lead.node_id()].dir.join("snapshot"))
        .expect("snapshot file")
        .len();
    assert!(on_disk > 0);

    // Its next entry is gone from the leader's log: only a snapshot helps.
    let lagger = h.start(lagger_id, BTreeMap::new()).await;
    let status = lagger
        .cluster
        .wait_until(PATIENCE, "snapshot installed", |s| {
            s.snapshot_index >= Some(covered)
        })
        .await
        .expect("the lagging node installs the snapshot");
    assert!(status.last_applied_index >= Some(covered));
    assert_eq!(lagger.holder("k19").map(|h| h.0), Some(119));
    assert_eq!(lagger.holder("early").map(|h| h.0), Some(1));
    // The sink saw no entry the snapshot covered.
    assert!(lagger.seen().iter().all(|(cmd, _)| !matches!(
        cmd,
        Command::Lock {
            owner: 100..=119,
            ..
        }
    )));

    // And follows the log again from there.
    let (target, out) = propose_indexed(&nodes, lock(5, "later", None)).await;
    granted(&out);
    let target = Some(target);
    lagger.applied_at_least(target).await;
    for n in &nodes {
        n.applied_at_least(target).await;
        assert_eq!(
            lagger.cluster.read(|t, _| t.snapshot()),
            n.cluster.read(|t, _| t.snapshot())
        );
    }
    assert!(lagger
        .seen()
        .iter()
        .any(|(cmd, _)| *cmd == lock(5, "later", None)));
    lagger.shutdown().await;
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_stops_the_node_cleanly() {
    let h = Harness::new(&[1]);
    let nodes = vec![h.start(1, BTreeMap::new()).await];
    granted(&propose(&nodes, lock(1, "k", None)).await);
    // A directory (not empty) where the snapshot must go: renaming the new
    // snapshot over it fails, even for root, and openraft treats that as
    // fatal.
    let in_the_way = h.specs[&1].dir.join("snapshot");
    std::fs::create_dir(&in_the_way).expect("mkdir");
    std::fs::write(in_the_way.join("keep"), b"").expect("a file in it");
    let node = &nodes[0];
    assert!(node.cluster.snapshot().await.is_err());
    tokio::time::timeout(PATIENCE, node.cluster.stopped())
        .await
        .expect("the node stops on its own");
    match node.cluster.propose(lock(2, "j", None)).await {
        Err(ClusterError::Unavailable(_) | ClusterError::Fatal(_)) => {}
        other => panic!("a stopped node answered {other:?}"),
    }
    assert_eq!(node.cluster.status().role, Role::Stopped);
    // Shutting down a stopped node is harmless.
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_grants_are_replicated_and_a_new_leader_keeps_every_reader() {
    let h = Harness::new(&[1, 2, 3]);
    let mut nodes = h.start_all(&[1, 2, 3]).await;
    let read = |owner: OwnerId| Command::Lock {
        owner,
        keys: vec!["config".into()],
        sharing: Sharing::all(&["config".into()], 0),
        wait: WaitLimit::No,
        lease: None,
        value: Vec::new(),
    };
    let first = granted(&propose(&nodes, read(1)).await);
    let (index, out) = propose_indexed(&nodes, read(2)).await;
    let second = granted(&out);
    // A writer is refused while the readers hold the key.
    let out = propose(&nodes, lock(3, "config", None)).await;
    assert_eq!(
        out.reply,
        Reply::Lock(LockResult::Busy(vec!["config".into()]))
    );
    for n in &nodes {
        n.applied_at_least(Some(index)).await;
        let holders = n.cluster.read(|t, now| {
            let view = t.inspect("config", now);
            view.holders
                .iter()
                .map(|h| (h.owner, h.fence))
                .collect::<Vec<_>>()
        });
        assert_eq!(holders, vec![(1, first), (2, second)], "node {}", n.id);
    }

    let at = leader(&nodes).await;
    let old = nodes.remove(at);
    old.shutdown().await;
    let at = leader(&nodes).await;
    nodes[at].cluster.read_index().await.expect("read index");
    let readers = nodes[at]
        .cluster
        .read(|t, now| t.inspect("config", now).holders.len());
    assert_eq!(readers, 2);
    // A third reader joins under a higher token on the new leader.
    let third = granted(&propose(&nodes, read(4)).await);
    assert!(third > second);
    for n in nodes {
        n.shutdown().await;
    }
}
