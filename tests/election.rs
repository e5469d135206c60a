//! Election over TCP: one leader among campaigners, the next in line leads
//! when it resigns or its connection ends, a leader learns at once that it
//! was deposed, observers see every change in order; and on a cluster of
//! three node processes, the election and its observers survive a leader
//! kill (the Watch is sent again to the new leader).

use dlock::{Client, Election, Leader, Lost};
use dlock_server::testing::nodes::{server_binary, NodeProcesses};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::time::Duration;
use tokio::sync::watch;

/// How long any expected event may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// The next value `rx` changes to.
async fn next(rx: &mut watch::Receiver<Option<Leader>>) -> Option<Leader> {
    tokio::time::timeout(PATIENCE, rx.changed())
        .await
        .expect("a change in time")
        .expect("observer running");
    rx.borrow_and_update().clone()
}

fn value_of(l: &Option<Leader>) -> Option<&[u8]> {
    l.as_ref().map(|l| l.value.as_slice())
}

/// A server that refuses Watch (here, Watch turned off) left an observer
/// on the state it first read, for ever, without a word: `dlock leader
/// --watch` printed "no leader" while another led.
#[tokio::test]
async fn an_observer_of_a_server_that_refuses_watch_reads_the_state_instead() {
    let server = TestServer::start(Config {
        max_watchers: 0,
        ..Config::default()
    })
    .await;
    let addr = server.addr_string();
    let (a, o) = (
        Client::connect(&addr).await.unwrap(),
        Client::connect(&addr).await.unwrap(),
    );
    let mut seen = Election::new(&o, "svc").observe().await.unwrap();
    assert_eq!(*seen.borrow(), None, "nobody leads yet");
    let lead = Election::new(&a, "svc").campaign("a").await.unwrap();
    assert_eq!(value_of(&next(&mut seen).await), Some(&b"a"[..]));
    lead.resign().await.unwrap();
    assert_eq!(next(&mut seen).await, None);
}

#[tokio::test]
async fn one_leader_at_a_time_and_observers_see_each_change_in_order() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let (a, b, o) = (
        Client::connect(&addr).await.unwrap(),
        Client::connect(&addr).await.unwrap(),
        Client::connect(&addr).await.unwrap(),
    );
    let observer = Election::new(&o, "svc");
    let mut seen = observer.observe().await.unwrap();
    assert_eq!(*seen.borrow(), None, "nobody leads yet");

    let lead_a = Election::new(&a, "svc").campaign("a").await.unwrap();
    assert_eq!(value_of(&next(&mut seen).await), Some(&b"a"[..]));
    // b campaigns and waits in line.
    let election_b = Election::new(&b, "svc");
    let campaign_b = tokio::spawn(async move { election_b.campaign("b").await });
    // a proclaims: observers see the new value of the same leadership.
    lead_a.proclaim("a2").await.unwrap();
    let l = next(&mut seen).await.expect("a leads");
    assert_eq!((l.value.as_slice(), l.fence), (&b"a2"[..], lead_a.fence()));
    assert!(!campaign_b.is_finished(), "b leads only after a");
    let since = l.since;

    lead_a.resign().await.unwrap();
    let lead_b = tokio::time::timeout(PATIENCE, campaign_b)
        .await
        .expect("b leads in time")
        .unwrap()
        .unwrap();
    let l = next(&mut seen).await.expect("b leads");
    assert_eq!((l.value.as_slice(), l.fence), (&b"b"[..], lead_b.fence()));
    assert!(l.since >= since);
    let now = observer.leader().await.unwrap().expect("b leads");
    assert_eq!((now.value, now.fence), (l.value, l.fence));

    // b's process goes away (its connection ends): nobody leads.
    drop(lead_b);
    drop(b);
    assert_eq!(next(&mut seen).await, None);
}

#[tokio::test]
async fn the_next_in_line_leads_when_the_leadership_is_dropped() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let a = Client::connect(&addr).await.unwrap();
    let b = Client::connect(&addr).await.unwrap();
    let lead_a = Election::new(&a, "svc").campaign("a").await.unwrap();
    let election_b = Election::new(&b, "svc");
    let campaign_b = tokio::spawn(async move { election_b.campaign("b").await });
    // Dropped without resign(): released in the background. (A process
    // killed outright is dlock-client's tests/elect.rs.)
    let fence_a = lead_a.fence();
    drop(lead_a);
    let lead_b = tokio::time::timeout(PATIENCE, campaign_b)
        .await
        .expect("b leads in time")
        .unwrap()
        .unwrap();
    assert!(lead_b.fence() > fence_a);
    assert!(!lead_b.is_lost());
}

#[tokio::test]
async fn a_leader_learns_at_once_that_it_was_deposed() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let a = Client::connect(&addr).await.unwrap();
    let admin = Client::connect(&addr).await.unwrap();
    let lead = Election::new(&a, "svc").campaign("a").await.unwrap();
    // A proclaim is not a loss.
    lead.proclaim("a2").await.unwrap();
    // An operator releases the key by its fence.
    admin.unlock_fence("svc", lead.fence()).await.unwrap();
    let reason = tokio::time::timeout(PATIENCE, lead.lost())
        .await
        .expect("told in time");
    assert!(matches!(reason, Lost::NotHeld), "{reason}");
    assert!(lead.is_lost());
    assert!(
        lead.proclaim("late").await.is_err(),
        "a deposed leader cannot proclaim"
    );
}

/// One cluster at a time: three node processes are load enough for two
/// cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NODE_FLAGS: &[&str] = &[
    "--heartbeat",
    "100ms",
    "--election-timeout",
    "1s",
    "--session-ttl",
    "20s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_election_and_its_observers_survive_a_leader_kill() {
    let _one = ONE_CLUSTER.lock().await;
    let mut nodes = NodeProcesses::start(server_binary(), 3, NODE_FLAGS);
    let servers = nodes.servers();
    let a = Client::connect(servers.as_str()).await.expect("connect a");
    let o = Client::connect(servers.as_str())
        .await
        .expect("connect observer");
    let mut seen = Election::new(&o, "svc").observe().await.unwrap();
    let lead_a = Election::new(&a, "svc").campaign("a").await.unwrap();
    let l = next(&mut seen).await.expect("a leads");
    assert_eq!((l.value.as_slice(), l.fence), (&b"a"[..], lead_a.fence()));

    // Kill the node that leads the cluster: the observer's parked Watch is
    // sent again to the new leader node, the leadership stays a's.
    let node = nodes.index_of(&a.addr()).expect("a talks to a node");
    nodes.kill(node);
    // Answered by the new leader node: a's leadership is still there.
    lead_a
        .proclaim("a-after")
        .await
        .expect("proclaim on the new leader");
    let l = next(&mut seen).await.expect("a still leads");
    assert_eq!(
        (l.value.as_slice(), l.fence),
        (&b"a-after"[..], lead_a.fence())
    );
    assert!(!lead_a.is_lost(), "the session outlived the failover");

    // The next campaigner leads once a resigns, and the observer sees it.
    let b = Client::connect(servers.as_str()).await.expect("connect b");
    let election_b = Election::new(&b, "svc");
    let campaign_b = tokio::spawn(async move { election_b.campaign("b").await });
    lead_a.resign().await.expect("resign");
    let lead_b = tokio::time::timeout(PATIENCE, campaign_b)
        .await
        .expect("b leads in time")
        .unwrap()
        .unwrap();
    let l = loop {
        // a's resignation and b's grant may come as one change or two.
        if let Some(l) = next(&mut seen).await {
            break l;
        }
    };
    assert_eq!((l.value.as_slice(), l.fence), (&b"b"[..], lead_b.fence()));
    assert!(!nodes.any_panicked());
}
