//! Resource exhaustion against the real binary: too many connections, no
//! file descriptors left, a client that pipelines without reading, and a
//! slowloris crowd. The server's own RSS and CPU time come from /proc.

mod common;

use common::process::{raise_own_fd_limit, Process};
use common::{request, status, TestClient, PATIENCE};
use dlock::proto::{RequestType, ResponseStatus};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;

#[tokio::test]
async fn running_out_of_descriptors_backs_off_and_recovers() {
    // 40 descriptors: a few for the runtime and the listener, the rest for
    // clients, so the 60 clients below cannot all be accepted.
    let mut server = Process::start_with_fd_limit(&[], Some(40));
    let mut clients = Vec::new();
    for _ in 0..60 {
        let mut c = TestClient::connect(server.addr).await;
        let ping = c.request(RequestType::Ping, &[]);
        c.send(&ping).await;
        clients.push(c);
    }
    server.wait_for_log("accept failed");
    // While descriptors are exhausted the accept loop waits between tries:
    // over a second it must use a small fraction of a core, not all of it.
    let before = server.sample().cpu;
    let window = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = server.sample().cpu - before;
    assert!(
        used < window.elapsed() / 4,
        "accept loop used {used:?} of CPU in {:?}",
        window.elapsed()
    );
    // Clients already accepted are still served.
    let first = clients.first_mut().expect("a client");
    assert_eq!(status(&first.recv().await), ResponseStatus::Ok);
    assert_eq!(status(&first.ping().await), ResponseStatus::Ok);
    // Once descriptors free up, every waiting client is accepted and
    // answered: fewer remain than the server has room for.
    clients.drain(..40);
    for c in &mut clients {
        let r = c.recv().await;
        assert_eq!(status(&r), ResponseStatus::Ok, "{r:?}");
    }
}

#[tokio::test]
async fn client_pipelining_without_reading_is_bounded_and_dropped() {
    let server = Process::start(&["--write-timeout", "2s"]);
    let mut other = TestClient::connect(server.addr).await;
    other.ping().await;
    let baseline = server.sample().rss;
    // 100,000 pings, each carrying a kilobyte, written without reading a
    // single answer: 100 MB the server must not buffer.
    let flood = tokio::spawn({
        let addr = server.addr;
        async move {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let mut batch = bytes::BytesMut::new();
            for id in 0..1_000u64 {
                let mut req = request(id, RequestType::Ping, &[]);
                req.access_token = "x".repeat(1_000);
                dlock::codec::encode_frame(&req, &mut batch);
            }
            for _ in 0..100 {
                if stream.write_all(&batch).await.is_err() {
                    return true;
                }
            }
            // Everything fitted in socket buffers; keep writing, still
            // without reading, until the server drops the connection.
            loop {
                if stream.write_all(&batch).await.is_err() {
                    return true;
                }
            }
        }
    });
    // Other clients are served while the flood is on.
    for _ in 0..20 {
        other.must_lock(&["busy"]).await;
        assert_eq!(status(&other.unlock(&["busy"]).await), ResponseStatus::Ok);
    }
    let dropped = tokio::time::timeout(PATIENCE, flood)
        .await
        .expect("the flooding client is dropped in time")
        .expect("flood task");
    assert!(dropped);
    let peak = server.sample().hwm;
    assert!(
        peak < baseline + 32 * MIB,
        "server RSS peaked at {} MiB from a baseline of {} MiB",
        peak / MIB,
        baseline / MIB
    );
    assert_eq!(status(&other.ping().await), ResponseStatus::Ok);
    other.await_empty_server().await;
}

#[tokio::test]
async fn slowloris_crowd_is_dropped_and_others_are_served() {
    // 1,000 as the issue asks, unless this machine's hard descriptor limit
    // is too low for this process to hold them (the server is separate).
    let limit = raise_own_fd_limit();
    let size = 1_000.min(limit.saturating_sub(100) as usize);
    if size < 1_000 {
        eprintln!("open-file limit {limit}: slowloris crowd of {size} instead of 1,000");
    }
    let server = Process::start(&["--idle-timeout", "2s"]);
    let mut crowd = Vec::new();
    for _ in 0..size {
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        // Two bytes of a four-byte length prefix, then nothing.
        s.write_all(&[0, 0]).await.expect("write");
        crowd.push(s);
    }
    let mut c = TestClient::connect(server.addr).await;
    for _ in 0..50 {
        c.must_lock(&["k"]).await;
        assert_eq!(status(&c.unlock(&["k"]).await), ResponseStatus::Ok);
    }
    // Every member of the crowd is closed by the server, while the active
    // client keeps pinging: closing a thousand connections (and logging
    // each) may take the server longer than the idle timeout.
    let closed = tokio::spawn(async move {
        for mut s in crowd {
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .expect("slowloris connection closed in time")
                .unwrap_or(0);
            assert_eq!(n, 0, "no answer to half a frame");
        }
    });
    while !closed.is_finished() {
        assert_eq!(status(&c.ping().await), ResponseStatus::Ok);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    closed.await.expect("the crowd was closed");
    c.await_empty_server().await;
}
