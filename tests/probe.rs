//! The silent-node probe and the session links on its node, against a
//! fake node whose probe answers the test controls: a probe left
//! unanswered sends away only a link that has heard nothing from the node
//! within the silence limit either (`rules::gone_silent`: otherwise the
//! probe's own connection was slow, not the node); a probe answered
//! `Unavailable` sends every link away at once, whatever it heard. A link
//! that outlived a silence report goes as soon as it too has heard nothing
//! for the limit, not at the probe's next report.

mod fake_node;

use dlock::{Client, ClientOptions, Disconnect, Event};
use fake_node::{answer, next_session, ok, read_request, session_opened, FakeNode, Probe};
use fake_node::{PATIENCE, SESSION};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The session TTL: with the fake's 200 ms election timeout, the silence
/// limit is 1.5 s (`rules::silence_limit`).
const TTL: Duration = Duration::from_secs(60);

/// A client with its session on a fake node whose probe answers as
/// `probe` says, and the session's connection.
async fn connected(probe: Probe) -> (Client, FakeNode, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let mut node = fake_node::start(listener, TTL, probe);
    let connecting = tokio::spawn(Client::connect_with(addr, ClientOptions::default()));
    let (mut link, open) = next_session(&mut node).await;
    answer(&mut link, session_opened(&open, TTL)).await;
    let client = connecting.await.expect("task").expect("connected");
    assert_eq!(client.session(), Some(SESSION));
    (client, node, link)
}

/// Answers every request on the session's connection `Ok` until `stop`,
/// then returns the connection, open and unanswered.
fn serve(mut link: TcpStream, stop: Arc<Notify>) -> JoinHandle<TcpStream> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.notified() => return link,
                req = read_request(&mut link) => match req {
                    Some(req) => answer(&mut link, ok(&req)).await,
                    None => return link,
                },
            }
        }
    })
}

/// Waits for the probe's first silence report: the probe drops its
/// connection when it finds the node silent and tells the links in the
/// same poll of its task; on this one-thread runtime the fake reads that
/// close only in a later poll, so by then the links have been told.
async fn first_report(node: &mut FakeNode) {
    tokio::time::timeout(PATIENCE, node.probes_ended.recv())
        .await
        .expect("the probe finds the node silent in time")
        .expect("the fake node runs");
}

/// Keeps the session's connection hearing from the node: a Ping every
/// 20 ms, for at most a minute.
fn keep_busy(client: &Client) -> JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        for _ in 0..3000 {
            let _ = client.ping().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// The next event that says the session's connection broke off.
async fn broke_off(events: &mut broadcast::Receiver<Event>) -> Disconnect {
    loop {
        match tokio::time::timeout(PATIENCE, events.recv()).await {
            Ok(Ok(Event::Reconnecting { reason, .. })) => return reason,
            Ok(Ok(_)) => continue,
            other => panic!("expected the connection to break off, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_silent_probe_leaves_a_link_that_hears_from_the_node() {
    let (client, mut node, link) = connected(Probe::Mute).await;
    let mut events = client.events();
    let served = serve(link, Arc::new(Notify::new()));
    let busy = keep_busy(&client);
    first_report(&mut node).await;
    // One more round trip lets the link act on what the probe told it (a
    // link that broke off would resume instead, which the fake never
    // answers: the timeout tells).
    tokio::time::timeout(Duration::from_secs(5), client.ping())
        .await
        .expect("the session's connection still answers")
        .expect("the session's connection answers");
    assert!(
        matches!(events.try_recv(), Err(TryRecvError::Empty)),
        "the connection broke off though it heard from the node"
    );
    assert!(
        node.sessions.try_recv().is_err(),
        "the client asked for its session again"
    );
    busy.abort();
    served.abort();
}

#[tokio::test]
async fn a_silent_probe_sends_away_a_link_that_heard_nothing_either() {
    let (client, mut node, _link) = connected(Probe::Mute).await;
    let mut events = client.events();
    // The link heard its OpenSession answered, then nothing: the probe
    // finds the node silent after 2 s (a third of the limit, then the
    // limit), past the limit since the link last heard.
    let reason = broke_off(&mut events).await;
    assert!(
        matches!(reason, Disconnect::NoAnswer { waited } if waited >= Duration::from_millis(1500)),
        "{reason:?}"
    );
    let (_again, open) = next_session(&mut node).await;
    assert_eq!(open.session, SESSION, "the session is resumed");
}

#[tokio::test]
async fn a_probe_answered_unavailable_sends_away_a_link_that_hears_from_the_node() {
    let (client, mut node, link) = connected(Probe::Unavailable).await;
    let mut events = client.events();
    let served = serve(link, Arc::new(Notify::new()));
    let busy = keep_busy(&client);
    let reason = broke_off(&mut events).await;
    assert!(matches!(reason, Disconnect::NoQuorum), "{reason:?}");
    let (_again, open) = next_session(&mut node).await;
    assert_eq!(open.session, SESSION, "the session is resumed");
    busy.abort();
    served.abort();
}

#[tokio::test]
async fn a_link_that_outlived_a_silent_probe_goes_once_it_hears_nothing_either() {
    let (client, mut node, link) = connected(Probe::Mute).await;
    let mut events = client.events();
    let stop = Arc::new(Notify::new());
    let served = serve(link, stop.clone());
    let busy = keep_busy(&client);
    first_report(&mut node).await;
    // The link outlived the report. Now the node stops answering it, and
    // closes every new connection: the probe reports nothing more (a
    // refusal is no silence), so only the link's own silence can tell.
    node.refuse
        .store(true, std::sync::atomic::Ordering::Relaxed);
    busy.abort();
    stop.notify_one();
    let _held = served.await.expect("the fake's task");
    let reason = broke_off(&mut events).await;
    // A limit (1.5 s) after the link last heard, not the half TTL (30 s)
    // after which an unanswered Ping tells.
    assert!(
        matches!(reason, Disconnect::NoAnswer { waited } if waited < TTL / 4),
        "{reason:?}"
    );
}
