//! An attempt to resume a session that the client gives up on (the node
//! did not answer in time) ends with a reset, never a clean close: a
//! cluster node takes a clean close as the client ending its session, so
//! a FIN after a resume the node did carry out would end the very session
//! the client goes on trying to resume.
//!
//! The node here is a fake the test drives frame by frame, so the window
//! (OpenSession received, its answer not yet back) is hit every time.

mod fake_node;

use dlock::{Client, ClientOptions, Event};
use fake_node::{answer, next_session, session_opened, Probe, PATIENCE, SESSION};
use std::io::ErrorKind;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

const TTL: Duration = Duration::from_secs(60);

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
