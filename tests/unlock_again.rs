//! A lease outlives its session: its Unlock, which the session could not
//! have answered because the session ended while it moved between nodes,
//! is sent again by fence on a new connection, and `unlock` reports that it
//! went through.
//!
//! The node here is a fake the test drives frame by frame, so the session
//! ends exactly while the Unlock waits for it.

mod fake_node;

use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use dlock::{Client, LockOptions};
use fake_node::{answer, next_session, ok, read_request, session_opened, Probe, SESSION};
use std::time::Duration;
use tokio::net::TcpListener;

const TTL: Duration = Duration::from_secs(60);
const FENCE: u64 = 7;

#[tokio::test]
async fn a_leases_unlock_is_sent_again_by_fence_when_its_session_ends_while_moving() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let mut node = fake_node::start(listener, TTL, Probe::Answer);
    let connecting = tokio::spawn(Client::connect(addr));
    let (mut main, open) = next_session(&mut node).await;
    answer(&mut main, session_opened(&open, TTL)).await;
    let client = connecting.await.expect("task").expect("connected");

    // The lease, taken on a connection (a session) of its own.
    let locking = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock(
                    "moving",
                    LockOptions::new().lease(Duration::from_secs(3600)),
                )
                .await
        })
    };
    let (mut own, open) = next_session(&mut node).await;
    answer(&mut own, session_opened(&open, TTL)).await;
    let lock = read_request(&mut own).await.expect("the Lock");
    assert_eq!(lock.r#type(), RequestType::Lock);
    answer(&mut own, granted(&lock)).await;
    let guard = locking.await.expect("task").expect("locked");

    // The path breaks: the session moves, and the node it tries says the
    // session has ended (its TTL ran out, or it was closed).
    socket2::SockRef::from(&own)
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(own);
    let (mut resume, open) = next_session(&mut node).await;
    assert_eq!(open.session, SESSION, "a resume of the session");
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
        (&["moving".to_string()][..], FENCE)
    );
    answer(&mut again, ok(&unlock)).await;
    unlocking.await.expect("task").expect("the lease released");
}

fn granted(req: &Request) -> Response {
    Response {
        fence: FENCE,
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
