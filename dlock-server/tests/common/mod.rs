//! Shared test helpers: a real server on 127.0.0.1:0 and a raw-frame client.
#![allow(dead_code)]

pub mod nodes;
pub mod pki;
pub mod process;

use dlock::proto::{
    KeyInfo, Request, RequestLock, RequestType, Response, ResponseStatus, ServerStats,
};
use dlock::raw::{RawClient, RawError};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long any single expected event may take before a test fails. Generous
/// so a loaded machine does not cause failures; tests never wait this long
/// when the server behaves.
pub const PATIENCE: Duration = Duration::from_secs(20);

#[allow(unused_imports)]
pub use dlock_server::testing::TestServer;

/// A raw-frame client ([`RawClient`]) whose calls panic on anything a test
/// does not expect, with the requests tests build most.
pub struct TestClient {
    pub raw: RawClient,
}

impl TestClient {
    pub async fn connect(addr: SocketAddr) -> TestClient {
        let raw = RawClient::connect(addr)
            .await
            .expect("connect to test server")
            // Responses may echo long keys; accept anything reasonable.
            .with_max_frame(1 << 24);
        TestClient { raw }
    }

    /// The socket, for socket options, shutdown and addresses.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.raw.stream_mut()
    }

    pub fn next_id(&mut self) -> u64 {
        self.raw.next_id()
    }

    pub async fn send(&mut self, req: &Request) {
        self.raw.send(req).await.expect("write to server");
    }

    /// Sends `req`; false if the server has closed (or reset) the
    /// connection already.
    pub async fn try_send(&mut self, req: &Request) -> bool {
        self.raw.send(req).await.is_ok()
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.raw.send_bytes(bytes).await.expect("write to server");
    }

    /// The next response, or `None` at end of stream (a reset counts as
    /// one: the server may close with requests unread).
    pub async fn try_recv(&mut self) -> Option<Response> {
        let next = tokio::time::timeout(PATIENCE, self.raw.recv_or_closed())
            .await
            .expect("server answers in time");
        match next {
            Ok(r) => r,
            Err(RawError::Io(_)) => None,
            Err(e) => panic!("valid response frame: {e}"),
        }
    }

    pub async fn recv(&mut self) -> Response {
        self.try_recv()
            .await
            .expect("a response, not end of stream")
    }

    /// Asserts the server closes the connection.
    pub async fn expect_closed(&mut self) {
        if let Some(r) = self.try_recv().await {
            panic!("expected close, got {r:?}");
        }
    }

    pub async fn call(&mut self, req: Request) -> Response {
        self.send(&req).await;
        let r = self.recv().await;
        assert_eq!(r.request_id, req.id, "response matches request");
        r
    }

    pub fn request(&mut self, kind: RequestType, keys: &[&str]) -> Request {
        let id = self.next_id();
        request(id, kind, keys)
    }

    pub async fn ping(&mut self) -> Response {
        let r = self.request(RequestType::Ping, &[]);
        self.call(r).await
    }

    /// Lock with a wait limit in microseconds (0 = forever) and a lease.
    pub fn lock_request(&mut self, keys: &[&str], wait_micro: u64, release_micro: u64) -> Request {
        let mut r = self.request(RequestType::Lock, keys);
        let body = r.lock.get_or_insert_with(RequestLock::default);
        body.wait_micro = wait_micro;
        body.release_micro = release_micro;
        r
    }

    pub async fn lock(&mut self, keys: &[&str], wait_micro: u64, release_micro: u64) -> Response {
        let r = self.lock_request(keys, wait_micro, release_micro);
        self.call(r).await
    }

    /// Locks keys that must be free; returns the fence.
    pub async fn must_lock(&mut self, keys: &[&str]) -> u64 {
        let r = self.try_lock(keys).await;
        assert_eq!(status(&r), ResponseStatus::Ok, "lock {keys:?}: {r:?}");
        assert!(r.fence > 0);
        r.fence
    }

    pub async fn try_lock(&mut self, keys: &[&str]) -> Response {
        let mut r = self.lock_request(keys, 0, 0);
        if let Some(l) = r.lock.as_mut() {
            l.try_lock = true;
        }
        self.call(r).await
    }

    pub async fn unlock(&mut self, keys: &[&str]) -> Response {
        let r = self.request(RequestType::Unlock, keys);
        self.call(r).await
    }

    pub async fn inspect(&mut self, key: &str) -> KeyInfo {
        let r = self.request(RequestType::Inspect, &[key]);
        let resp = self.call(r).await;
        assert_eq!(status(&resp), ResponseStatus::Ok);
        resp.key_info.into_iter().next().expect("one key info")
    }

    /// Server-wide counts: Inspect without keys.
    pub async fn stats(&mut self) -> ServerStats {
        let r = self.request(RequestType::Inspect, &[]);
        let resp = self.call(r).await;
        assert_eq!(status(&resp), ResponseStatus::Ok);
        *resp
            .server_stats
            .expect("Inspect without keys answers stats")
    }

    /// Waits until the server holds no keys, has no waiters and this is its
    /// only connection: what every client leaving must lead to.
    pub async fn await_empty_server(&mut self) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let s = self.stats().await;
            if s.held_keys == 0 && s.waiting_requests == 0 && s.connections == 1 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "server never emptied: {s:?}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Waits until `key` has exactly `n` waiters: the explicit
    /// synchronisation tests use instead of sleeping.
    pub async fn await_waiters(&mut self, key: &str, n: u32) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if self.inspect(key).await.waiters == n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key} never had {n} waiters"
            );
            tokio::task::yield_now().await;
        }
    }
}

pub fn request(id: u64, kind: RequestType, keys: &[&str]) -> Request {
    Request {
        version: 2,
        id,
        r#type: kind as i32,
        lock: (!keys.is_empty()).then(|| RequestLock {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ..RequestLock::default()
        }),
        ..Request::default()
    }
}

pub fn status(r: &Response) -> ResponseStatus {
    ResponseStatus::try_from(r.status).expect("known status")
}

/// Cases per property test: the default keeps `cargo test` quick; set
/// PROPTEST_CASES for a longer run (docs/RELIABILITY.md).
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `fut` and returns how long it took along with its output.
pub async fn timed<T>(fut: impl Future<Output = T>) -> (T, Duration) {
    let start = std::time::Instant::now();
    let out = fut.await;
    (out, start.elapsed())
}

/// `req` acting for `session` (0: the connection's own owner).
pub fn in_session(mut req: Request, session: u64) -> Request {
    req.session = session;
    req
}

impl TestClient {
    /// A request of `kind` for `keys` in `session`, sent and answered.
    pub async fn call_in(&mut self, kind: RequestType, keys: &[&str], session: u64) -> Response {
        let req = self.request(kind, keys);
        self.call(in_session(req, session)).await
    }
}
