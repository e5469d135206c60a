//! A fake cluster node the tests drive frame by frame: it answers every
//! connection's Hello as a node does, answers the client's liveness probe
//! (a connection with no session) as the test says, and hands each
//! connection that asks for a session to the test, with its OpenSession.

#![allow(dead_code)] // each test file uses what it needs

use bytes::BytesMut;
use dlock::codec::encode_frame;
use dlock::proto::{Request, RequestType, Response, ResponseStatus, ServerLimits};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long a test waits for the client before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// The session every OpenSession opens or resumes.
pub const SESSION: u64 = 42;

/// How the fake answers the probe's Pings.
#[derive(Debug, Clone, Copy)]
pub enum Probe {
    /// `Ok`, as a node that serves.
    Answer,
    /// Not at all: the probe's connection stays open and silent, as with a
    /// node paused or cut off (its Hello is answered).
    Mute,
    /// `Unavailable`, as a leader cut off from its peers.
    Unavailable,
}

/// A running fake node.
pub struct FakeNode {
    /// Connections that asked for a session, with their OpenSession.
    pub sessions: mpsc::Receiver<(TcpStream, Request)>,
    /// One message per probe connection that ended (the client gave it up).
    pub probes_ended: mpsc::Receiver<()>,
    /// Set, the node closes every new connection at once, as one that
    /// is going away (the probe takes that for no silence).
    pub refuse: Arc<AtomicBool>,
}

/// Serves `listener` as a node whose session TTL is `ttl`.
pub fn start(listener: TcpListener, ttl: Duration, probe: Probe) -> FakeNode {
    let (tx, sessions) = mpsc::channel(8);
    let (ended_tx, probes_ended) = mpsc::channel(64);
    let refuse = Arc::new(AtomicBool::new(false));
    let refusing = refuse.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            if refusing.load(Ordering::Relaxed) {
                continue;
            }
            let (tx, ended) = (tx.clone(), ended_tx.clone());
            tokio::spawn(async move {
                let Some((s, first)) = hello(s, ttl).await else {
                    return;
                };
                match first.r#type() {
                    RequestType::OpenSession => {
                        let _ = tx.send((s, first)).await;
                    }
                    _ => {
                        probed(s, first, probe).await;
                        let _ = ended.send(()).await;
                    }
                }
            });
        }
    });
    FakeNode {
        sessions,
        probes_ended,
        refuse,
    }
}

/// The next request on `s`, or None once the connection ends.
pub async fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    prost::Message::decode(body.as_slice()).ok()
}

/// Writes `resp` on `s`.
pub async fn answer(s: &mut TcpStream, resp: Response) {
    let mut buf = BytesMut::new();
    encode_frame(&resp, &mut buf);
    let _ = s.write_all(&buf).await;
}

/// `Ok` to `req`.
pub fn ok(req: &Request) -> Response {
    Response {
        request_id: req.id,
        ..Response::default()
    }
}

/// Answers the connection's Hello as a cluster node does; returns the
/// request after it.
async fn hello(mut s: TcpStream, ttl: Duration) -> Option<(TcpStream, Request)> {
    let req = read_request(&mut s).await?;
    assert_eq!(req.r#type(), RequestType::Hello);
    let limits = ServerLimits {
        session_timeout_micro: ttl.as_micros() as u64,
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

/// Answers the probe's Pings as `probe` says until the connection ends.
async fn probed(mut s: TcpStream, mut req: Request, probe: Probe) {
    loop {
        match probe {
            Probe::Answer => answer(&mut s, ok(&req)).await,
            Probe::Mute => {}
            Probe::Unavailable => {
                let resp = Response {
                    request_id: req.id,
                    status: ResponseStatus::Unavailable as i32,
                    error_text: "this node cannot serve: it leads no majority".into(),
                    ..Response::default()
                };
                answer(&mut s, resp).await;
            }
        }
        match read_request(&mut s).await {
            Some(next) => req = next,
            None => return,
        }
    }
}

/// The next connection that asks for a session.
pub async fn next_session(node: &mut FakeNode) -> (TcpStream, Request) {
    tokio::time::timeout(PATIENCE, node.sessions.recv())
        .await
        .expect("the client connects in time")
        .expect("the fake node runs")
}

/// The answer to an OpenSession: the session, opened or resumed.
pub fn session_opened(req: &Request, ttl: Duration) -> Response {
    Response {
        request_id: req.id,
        session: SESSION,
        session_ttl_micro: ttl.as_micros() as u64,
        ..Response::default()
    }
}
