//! Two windows on a cluster session's connection that a fake node, driven
//! frame by frame, hits every time.
//!
//! An attempt to resume a session that the client gives up on (the node
//! did not answer in time) ends with a reset, never a clean close: a
//! cluster node takes a clean close as the client ending its session, so
//! a FIN after a resume the node did carry out would end the very session
//! the client goes on trying to resume.
//!
//! A lease granted to a Lock whose caller stopped waiting, sent after the
//! node read the close of the Lock's connection, is still read and
//! released by fence, on a connection (and session) opened for it.
//!
//! A lease outlives its session: its Unlock, which the session could not
//! have answered because the session ended while it moved between nodes,
//! is sent again by fence on a new connection, and `unlock` reports that it
//! went through; the Unlock of a dropped guard is sent again in the same
//! way, and `Client::close` waits for it.

mod fake_node;

use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock::{Client, ClientOptions, Event, LockOptions};
use fake_node::{answer, next_session, ok, read_request, session_opened, Probe, PATIENCE, SESSION};
use std::io::ErrorKind;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

const TTL: Duration = Duration::from_secs(60);
/// The fence of the lease whose Unlock is sent again.
const LEASE_FENCE: u64 = 7;

#[tokio::test]
async fn a_resume_attempt_given_up_resets_its_connection_and_the_next_resumes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    };
    let mut links = fake_node::start(listener, TTL, Probe::Answer);
    let connecting = tokio::spawn(Client::connect_with(addr, options));
    let (mut first, open) = next_session(&mut links).await;
    assert_eq!(open.session, 0, "a new session");
    answer(&mut first, session_opened(&open, TTL)).await;
    let client = connecting.await.expect("task").expect("connected");
    assert_eq!(client.session(), Some(SESSION));
    let mut events = client.events();

    // The path breaks.
    socket2::SockRef::from(&first)
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(first);

    // The next connection asks to resume, and the node, slow to answer,
    // has resumed the session when the client's time runs out.
    let (mut slow, open) = next_session(&mut links).await;
    assert_eq!(open.session, SESSION, "a resume of the session");
    let mut rest = [0u8; 64];
    let end = tokio::time::timeout(PATIENCE, slow.read(&mut rest))
        .await
        .expect("the client gives the attempt up in time");
    match end {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Ok(0) => panic!("a clean close: it would end the session just resumed"),
        other => panic!("expected a reset, got {other:?}"),
    }

    // The attempt after it resumes; the client never saw its session end.
    let (mut good, open) = next_session(&mut links).await;
    assert_eq!(open.session, SESSION);
    answer(&mut good, session_opened(&open, TTL)).await;
    loop {
        match tokio::time::timeout(PATIENCE, events.recv()).await {
            Ok(Ok(Event::Resumed { session, .. })) => {
                assert_eq!(session, SESSION);
                break;
            }
            Ok(Ok(Event::Reconnecting { .. })) => continue,
            other => panic!("expected the session resumed, got {other:?}"),
        }
    }
    assert!(!client.is_closed());
}

/// A fake node and a client connected to it with a session: the node, the
/// client and the client's own connection (kept open: its close would end
/// the session).
async fn connected() -> (fake_node::FakeNode, Client, tokio::net::TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let mut node = fake_node::start(listener, TTL, Probe::Answer);
    let connecting = tokio::spawn(Client::connect(addr));
    let (mut main, open) = next_session(&mut node).await;
    answer(&mut main, session_opened(&open, TTL)).await;
    let client = connecting.await.expect("task").expect("connected");
    (node, client, main)
}

#[tokio::test]
async fn a_lease_granted_after_the_node_read_the_close_is_released_on_a_session_of_its_own() {
    let (mut node, client, _main) = connected().await;

    let hour = LockOptions::new().lease(Duration::from_secs(3600));
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.lock(["crossed"], hour).await }
    });
    // The Lock goes out on a connection (and session) of its own.
    let (mut own, open) = next_session(&mut node).await;
    answer(&mut own, session_opened(&open, TTL)).await;
    let lock = loop {
        let req = tokio::time::timeout(PATIENCE, read_request(&mut own))
            .await
            .expect("the Lock in time")
            .expect("the Lock");
        match req.r#type() {
            RequestType::Ping => answer(&mut own, ok(&req)).await,
            RequestType::Lock => break req,
            other => panic!("expected the Lock, got {other:?}"),
        }
    };
    // The caller stops waiting: the node reads the connection's close (a
    // Ping parked behind the Lock may come first)...
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    loop {
        match tokio::time::timeout(PATIENCE, read_request(&mut own)).await {
            Ok(None) => break,
            Ok(Some(req)) => assert_eq!(req.r#type(), RequestType::Ping),
            Err(_) => panic!("the Lock's connection is not closed"),
        }
    }
    // ...after it had granted the lease, whose answer is on its way.
    const FENCE: u64 = 7;
    let grant = Response {
        fence: FENCE,
        ..ok(&lock)
    };
    answer(&mut own, grant).await;
    drop(own);

    let (mut release, open) = tokio::time::timeout(PATIENCE, node.sessions.recv())
        .await
        .expect("the grant is released: a lease would keep the key for an hour")
        .expect("the fake node runs");
    assert_eq!(open.session, 0, "a session of its own");
    answer(&mut release, session_opened(&open, TTL)).await;
    let unlock = tokio::time::timeout(PATIENCE, read_request(&mut release))
        .await
        .expect("the Unlock in time")
        .expect("the Unlock");
    assert_eq!(unlock.r#type(), RequestType::Unlock);
    let body = unlock.lock.clone().expect("the keys");
    assert_eq!((body.keys, body.fence), (vec!["crossed".to_owned()], FENCE));
    assert_eq!((unlock.session, unlock.seq), (SESSION, 1));
    answer(&mut release, ok(&unlock)).await;
    // Then that session ends with a clean close.
    let mut rest = [0u8; 1];
    let end = tokio::time::timeout(PATIENCE, release.read(&mut rest))
        .await
        .expect("the release's connection closes");
    assert_eq!(end.expect("a clean close, not a reset"), 0);
    assert!(!client.is_closed());
}

#[tokio::test]
async fn a_leases_unlock_is_sent_again_by_fence_when_its_session_ends_while_moving() {
    let (mut node, client, _main) = connected().await;

    // The path breaks: the session moves, and the node it tries says the
    // session has ended (its TTL ran out, or it was closed).
    let (guard, mut resume, open) =
        a_lease_then_its_session_moves(&mut node, &client, "moving").await;
    let mut unlocking = tokio::spawn(guard.unlock());
    answer(&mut resume, unknown_session(&open)).await;

    // The Unlock comes again, by fence, on a new session.
    let (mut again, open) = tokio::select! {
        s = next_session(&mut node) => s,
        r = &mut unlocking => panic!("unlock returned without sending the Unlock again: {r:?}"),
    };
    assert_eq!(open.session, 0, "a new session");
    answer(&mut again, session_opened(&open, TTL)).await;
    let unlock = read_request(&mut again).await.expect("the Unlock");
    assert_eq!(unlock.r#type(), RequestType::Unlock);
    let body = unlock.lock.clone().unwrap_or_default();
    assert_eq!(
        (body.keys.as_slice(), body.fence),
        (&["moving".to_string()][..], LEASE_FENCE)
    );
    answer(&mut again, ok(&unlock)).await;
    unlocking.await.expect("task").expect("the lease released");
}

#[tokio::test]
async fn a_dropped_lease_guards_unlock_is_sent_again_by_fence_when_its_session_ends_while_moving() {
    let (mut node, client, _main) = connected().await;

    // The path breaks; the guard is dropped while its session moves, and
    // the node tried says the session has ended: the Unlock queued on it
    // is never sent.
    let (guard, mut resume, open) =
        a_lease_then_its_session_moves(&mut node, &client, "dropped").await;
    drop(guard);
    let mut closing = tokio::spawn(client.close());
    answer(&mut resume, unknown_session(&open)).await;

    // The Unlock comes again, by fence, on a new session, and close waits
    // for it.
    let (mut again, open) = tokio::select! {
        s = next_session(&mut node) => s,
        r = &mut closing => panic!("close returned without sending the Unlock again: {r:?}"),
    };
    assert_eq!(open.session, 0, "a new session");
    answer(&mut again, session_opened(&open, TTL)).await;
    let unlock = tokio::select! {
        r = read_request(&mut again) => r.expect("the Unlock"),
        r = &mut closing => panic!("close returned before the Unlock was sent again: {r:?}"),
    };
    assert_eq!(unlock.r#type(), RequestType::Unlock);
    let body = unlock.lock.clone().unwrap_or_default();
    assert_eq!(
        (body.keys.as_slice(), body.fence),
        (&["dropped".to_string()][..], LEASE_FENCE)
    );
    assert!(!closing.is_finished(), "close returned before the answer");
    answer(&mut again, ok(&unlock)).await;
    tokio::time::timeout(PATIENCE, closing)
        .await
        .expect("close returns once the lease is released")
        .expect("task");
}

/// A lease on `key`, taken on a connection (a session) of its own, whose
/// path then breaks: its guard, and the client's resume of that session,
/// not answered yet.
async fn a_lease_then_its_session_moves(
    node: &mut fake_node::FakeNode,
    client: &Client,
    key: &str,
) -> (dlock::LockGuard, tokio::net::TcpStream, Request) {
    let locking = {
        let client = client.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            client
                .lock(key, LockOptions::new().lease(Duration::from_secs(3600)))
                .await
        })
    };
    let (mut own, open) = next_session(node).await;
    answer(&mut own, session_opened(&open, TTL)).await;
    let lock = read_request(&mut own).await.expect("the Lock");
    assert_eq!(lock.r#type(), RequestType::Lock);
    answer(&mut own, granted(&lock)).await;
    let guard = locking.await.expect("task").expect("locked");
    socket2::SockRef::from(&own)
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(own);
    let (resume, open) = next_session(node).await;
    assert_eq!(open.session, SESSION, "a resume of the session");
    (guard, resume, open)
}

fn granted(req: &Request) -> Response {
    Response {
        fence: LEASE_FENCE,
        ..ok(req)
    }
}

fn unknown_session(req: &Request) -> Response {
    Response {
        request_id: req.id,
        status: ResponseStatus::UnknownSession as i32,
        error_text: format!("session {SESSION} has ended"),
        ..Response::default()
    }
}
