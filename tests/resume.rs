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
use tokio::sync::mpsc;

const PATIENCE: Duration = Duration::from_secs(30);
const SESSION: u64 = 42;
const TTL: Duration = Duration::from_secs(60);

/// A fake cluster node: answers every connection's Hello, keeps answering
/// the Pings of the client's liveness probe (a connection of its own), and
/// hands each connection that asks for a session to the test, with its
/// OpenSession.
fn fake_node(listener: TcpListener) -> mpsc::Receiver<(TcpStream, Request)> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let Some((s, first)) = hello(s).await else {
                    return;
                };
                match first.r#type() {
                    RequestType::OpenSession => {
                        let _ = tx.send((s, first)).await;
                    }
                    _ => pong(s, first).await,
                }
            });
        }
    });
    rx
}

async fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    prost::Message::decode(body.as_slice()).ok()
}

async fn answer(s: &mut TcpStream, resp: Response) {
    let mut buf = BytesMut::new();
    encode_frame(&resp, &mut buf);
    let _ = s.write_all(&buf).await;
}

/// Answers the connection's Hello as a cluster node does; returns the
/// request after it.
async fn hello(mut s: TcpStream) -> Option<(TcpStream, Request)> {
    let req = read_request(&mut s).await?;
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
    let next = read_request(&mut s).await?;
    Some((s, next))
}

/// Answers Pings until the connection ends.
async fn pong(mut s: TcpStream, mut req: Request) {
    loop {
        let resp = Response {
            request_id: req.id,
            ..Response::default()
        };
        answer(&mut s, resp).await;
        match read_request(&mut s).await {
            Some(next) => req = next,
            None => return,
        }
    }
}

/// The next connection that asks for a session.
async fn next_session(links: &mut mpsc::Receiver<(TcpStream, Request)>) -> (TcpStream, Request) {
    tokio::time::timeout(PATIENCE, links.recv())
        .await
        .expect("the client connects in time")
        .expect("the fake node runs")
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
    let mut links = fake_node(listener);
    let connecting = tokio::spawn(Client::connect_with(addr, options));
    let (mut first, open) = next_session(&mut links).await;
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
