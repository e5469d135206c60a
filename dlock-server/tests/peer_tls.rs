//! Mutual TLS on the peer port: three node processes whose peer traffic
//! (replication, votes) runs over TLS elect a leader, serve, and elect a
//! new one when it is killed; a peer that speaks plain TCP, or presents no
//! certificate of the cluster's CA, gets no welcome.

mod common;

use common::pki::Ca;
use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::NodeProcesses;
use rcgen::ExtendedKeyUsagePurpose;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_peers_speak_tls_elects_serves_and_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "cluster");
    // One certificate for every node: they all listen on 127.0.0.1. It is
    // used both to accept peers and to dial them.
    let (cert, key) = ca.issue_for(
        "node",
        &["127.0.0.1"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (cert, key, ca_file) = (
        cert.display().to_string(),
        key.display().to_string(),
        ca.ca_file().display().to_string(),
    );
    let mut nodes = NodeProcesses::start(
        env!("CARGO_BIN_EXE_dlock-server"),
        3,
        &[
            "--heartbeat",
            "100ms",
            "--election-timeout",
            "1s",
            "--peer-tls-cert",
            &cert,
            "--peer-tls-key",
            &key,
            "--peer-tls-ca",
            &ca_file,
        ],
    );
    // A leader (elected over TLS) commits a lock on a majority.
    let c = Client::connect(nodes.servers()).await.expect("a leader");
    let guard = c.lock(["tls"], LockOptions::new()).await.expect("lock");
    let old = nodes.index_of(&guard.client().addr()).expect("a node");

    // A plain-TCP hello at a follower's peer port is not answered: the
    // node expects a TLS handshake.
    let follower = (old + 1) % 3;
    let mut plain = tokio::net::TcpStream::connect(nodes.peer_addr(follower))
        .await
        .expect("connect to the peer port");
    let hello = br#"{"protocol":"dlock-peer/1","cluster_id":"","from":9,"to":1}"#;
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(hello);
    plain.write_all(&frame).await.expect("write");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(common::PATIENCE, plain.read(&mut buf))
        .await
        .expect("the node ends the connection");
    // Over plain TCP the node would answer this hello (with a refusal:
    // the cluster id is wrong); over TLS it reads no hello at all.
    let answered =
        |word: &[u8]| matches!(read, Ok(n) if buf[..n].windows(word.len()).any(|w| w == word));
    assert!(
        !answered(b"Welcome") && !answered(b"Refused"),
        "a plain-TCP peer was answered: {:?}",
        read.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    );

    // Killing the leader: the others elect a new one over TLS, and the
    // session (and its lock) moves there.
    nodes.kill(old);
    guard
        .client()
        .ping()
        .await
        .expect("answered by the new leader");
    let new = nodes.index_of(&guard.client().addr()).expect("a node");
    assert_ne!(new, old);
    let probe = Client::connect(nodes.servers()).await.expect("connect");
    let info = probe.inspect(["tls"]).await.expect("inspect");
    assert_eq!(info[0].fence(), Some(guard.fence()));
    guard.unlock().await.expect("unlock");
    assert!(!nodes.any_panicked());
}
