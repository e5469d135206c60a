//! An attempt to resume a session that the client gives up on (the node
//! did not answer in time) ends with a reset, never a clean close: a
//! cluster node takes a clean close as the client ending its session, so
//! a FIN after a resume the node did carry out would end the very session
//! the client goes on trying to resume.
//!
//! The node here is a fake the test drives frame by frame, so the window
//! (OpenSession received, its answer not yet back) is hit every time.

use bytes::BytesMut;
use dlock::codec::encode_frame;
use dlock::proto::{Request, RequestType, Response, ServerLimits};
use dlock::{Client, ClientOptions, Event};
use std::io::ErrorKind;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PATIENCE: Duration = Duration::from_secs(30);
const SESSION: u64 = 42;
const TTL: Duration = Duration::from_secs(60);

async fn read_request(s: &mut TcpStream) -> Request {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.expect("a frame's length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.expect("a frame's body");
    prost::Message::decode(body.as_slice()).expect("a Request")
}

async fn answer(s: &mut TcpStream, resp: Response) {
    let mut buf = BytesMut::new();
    encode_frame(&resp, &mut buf);
    s.write_all(&buf).await.expect("write an answer");
}

/// Accepts a connection and answers its Hello as a cluster node does;
/// returns the stream and the OpenSession that follows.
async fn hello(listener: &TcpListener) -> (TcpStream, Request) {
    let (mut s, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the client connects in time")
        .expect("accept");
    let req = read_request(&mut s).await;
    assert_eq!(req.r#type(), RequestType::Hello);
    let limits = ServerLimits {
        session_timeout_micro: TTL.as_micros() as u64,
        max_lease_micro: 3_600_000_000,
        max_keys: 256,
        max_key_len: 1024,
        max_frame: 16384,
        max_pipeline: 1024,
        resumable_sessions: true,
        election_timeout_micro: 200_000,
    };
    let resp = Response {
        request_id: req.id,
        limits: Some(limits),
        ..Response::default()
    };
    answer(&mut s, resp).await;
    let open = read_request(&mut s).await;
    assert_eq!(open.r#type(), RequestType::OpenSession);
    (s, open)
}

fn session_opened(req: &Request) -> Response {
    Response {
        request_id: req.id,
        session: SESSION,
        session_ttl_micro: TTL.as_micros() as u64,
        ..Response::default()
    }
}

#[tokio::test]
async fn a_resume_attempt_given_up_resets_its_connection_and_the_next_resumes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    };
    let connecting = tokio::spawn(Client::connect_with(addr, options));
    let (mut first, open) = hello(&listener).await;
    assert_eq!(open.session, 0, "a new session");
    answer(&mut first, session_opened(&open)).await;
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
    let (mut slow, open) = hello(&listener).await;
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
    let (mut good, open) = hello(&listener).await;
    assert_eq!(open.session, SESSION);
    answer(&mut good, session_opened(&open)).await;
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
