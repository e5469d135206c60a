//! The fault proxy the cluster tests and the torture put between clients
//! and nodes must pass on what a real path passes on: a reset as a reset,
//! a clean close as a clean close, each after the bytes sent before it,
//! and only once a freeze is over. A cluster node ends a session at once on
//! a clean close and keeps it for its TTL after a reset, so a proxy that
//! turned a client's reset into a clean close ended sessions the client
//! was resuming (the cluster torture's 30-minute run found it as two
//! "session lost with every node up").

use dlock_server::testing::proxy::FreezableProxy;
use std::io::ErrorKind;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PATIENCE: Duration = Duration::from_secs(10);

/// A proxy to a fresh listener, a client through it, and the server's end.
async fn path() -> (FreezableProxy, TcpStream, TcpStream) {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = FreezableProxy::start(upstream.local_addr().unwrap()).await;
    let client = TcpStream::connect(proxy.addr).await.unwrap();
    let (server, _) = tokio::time::timeout(PATIENCE, upstream.accept())
        .await
        .expect("the proxy connects upstream")
        .unwrap();
    (proxy, client, server)
}

/// Reads `want` bytes, then what the next read says: `Ok(0)` for a clean
/// close, the error for a reset.
async fn after(server: &mut TcpStream, want: &[u8]) -> std::io::Result<usize> {
    let mut got = vec![0u8; want.len()];
    tokio::time::timeout(PATIENCE, server.read_exact(&mut got))
        .await
        .expect("the bytes arrive")
        .unwrap();
    assert_eq!(got, want);
    let mut more = [0u8; 16];
    tokio::time::timeout(PATIENCE, server.read(&mut more))
        .await
        .expect("the end arrives")
}

/// Closes `s` with a reset (no linger), as a client does that gives up a
/// connection whose session it means to resume.
fn abort(s: TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

#[tokio::test]
async fn a_reset_arrives_as_a_reset_after_the_bytes_before_it() {
    let (_proxy, mut client, mut server) = path().await;
    client.write_all(b"ping").await.unwrap();
    abort(client);
    let end = after(&mut server, b"ping").await;
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{end:?}"
    );
}

/// A client that resets while answers wait in the proxy for it to read
/// them: the proxy's blocked write towards the client may be the call that
/// learns of the reset (Linux reports it once), and its read of the client
/// then sees an end of stream; and both directions may end in the same
/// turn. That must still reach the node as a reset, or the node ends the
/// session the client is resuming (the torture saw it, seed 44301: a clean
/// close, then the client's resume 10 ms later answered UnknownSession).
/// Several rounds, as which comes first varies.
#[tokio::test]
async fn a_reset_arrives_as_a_reset_while_answers_wait_for_the_client() {
    for _ in 0..10 {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = FreezableProxy::start(upstream.local_addr().unwrap()).await;
        // A small window, so the proxy's write towards it blocks soon.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let client = socket.connect(proxy.addr).await.unwrap();
        let (mut server, _) = tokio::time::timeout(PATIENCE, upstream.accept())
            .await
            .expect("the proxy connects upstream")
            .unwrap();
        // More than the client's window and the proxy's socket hold, less
        // than the proxy's queue: the node's write completes (so no write
        // of its own is pending when the reset comes) and the proxy's
        // write to the client waits.
        let answers = vec![7u8; 512 * 1024];
        tokio::time::timeout(PATIENCE, server.write_all(&answers))
            .await
            .expect("the proxy takes the answers")
            .unwrap();
        abort(client);
        let mut buf = [0u8; 16];
        let end = tokio::time::timeout(PATIENCE, server.read(&mut buf))
            .await
            .expect("the end arrives");
        assert!(
            matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "{end:?}"
        );
    }
}

#[tokio::test]
async fn a_clean_close_arrives_as_a_clean_close() {
    let (_proxy, mut client, mut server) = path().await;
    client.write_all(b"bye").await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(after(&mut server, b"bye").await.unwrap(), 0);
}

#[tokio::test]
async fn a_reset_during_a_freeze_arrives_when_it_thaws() {
    let (proxy, mut client, mut server) = path().await;
    proxy.freeze();
    client.write_all(b"held").await.unwrap();
    abort(client);
    let mut buf = [0u8; 4];
    let early = tokio::time::timeout(Duration::from_millis(200), server.read(&mut buf)).await;
    assert!(early.is_err(), "nothing passes while frozen: {early:?}");
    proxy.thaw();
    let end = after(&mut server, b"held").await;
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{end:?}"
    );
}
