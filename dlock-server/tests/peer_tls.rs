//! Mutual TLS on the peer port: three node processes whose peer traffic
//! (replication, votes) runs over TLS elect a leader, serve, and elect a
//! new one when it is killed; a peer that speaks plain TCP, or presents no
//! certificate of the cluster's CA, gets no welcome; SIGHUP rotates the
//! certificates while the cluster serves; a TLS peer at a plain peer port
//! is named as such.

mod common;

use common::pki::Ca;
use dlock::{Client, LockOptions};
use dlock_server::testing::nodes::NodeProcesses;
use rcgen::ExtendedKeyUsagePurpose;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Three nodes whose peer port speaks mutual TLS with these files.
fn tls_cluster(cert: &Path, key: &Path, ca: &Path) -> NodeProcesses {
    let flag = |p: &Path| p.display().to_string();
    let (cert, key, ca) = (flag(cert), flag(key), flag(ca));
    NodeProcesses::start(
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
            &ca,
        ],
    )
}

/// A CA in `dir` and one certificate it signed for every node: they all
/// listen on 127.0.0.1. It is used both to accept peers and to dial them.
fn ca_and_node_cert(dir: &Path) -> (Ca, std::path::PathBuf, std::path::PathBuf) {
    let ca = Ca::new(dir, "cluster");
    let (cert, key) = ca.issue_for(
        "node",
        &["127.0.0.1"],
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    (ca, cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_peers_speak_tls_elects_serves_and_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_node_cert(dir.path());
    let mut nodes = tls_cluster(&cert, &key, &ca.ca_file());
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
    // A dlock client without TLS is answered, in its own protocol: this
    // is a peer port, and here is the client port (not "give --tls-ca").
    let peer = nodes.peer_addr(follower).to_string();
    let wrong = tokio::time::timeout(common::PATIENCE, Client::connect(peer.as_str()))
        .await
        .expect("the client is answered in time");
    let Err(e) = wrong else {
        panic!("a client connected to the peer port {peer}");
    };
    let e = e.to_string();
    assert!(
        e.contains(&peer) && e.contains("peer port of dlock cluster node"),
        "{e}"
    );
    let client_port = nodes.addr(follower).to_string();
    assert!(
        e.contains("--listen") && e.contains(&client_port) && !e.contains("--tls-ca"),
        "{e}"
    );
    // With TLS, trusting the cluster's CA: refused by the peer port's TLS
    // protocol name, and told so, not asked for a client certificate.
    let options = dlock::ClientOptions {
        tls: Some(dlock::tls::client_config(&ca.ca_file(), None).expect("the CA")),
        ..dlock::ClientOptions::default()
    };
    let wrong = tokio::time::timeout(common::PATIENCE, Client::connect_with(&peer, options))
        .await
        .expect("the client is answered in time");
    let Err(e) = wrong else {
        panic!("a TLS client connected to the peer port {peer}");
    };
    let e = e.to_string();
    assert!(
        e.contains(&peer) && e.contains("peer port") && e.contains("--listen"),
        "{e}"
    );
    assert!(!e.contains("client certificate"), "{e}");

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

/// Whether a handshake with the peer port at `addr` succeeds for a client
/// that trusts only `ca` and presents `cert`/`key`.
async fn handshake(addr: std::net::SocketAddr, ca: &Path, cert: &Path, key: &Path) -> bool {
    use std::sync::Arc;
    let config = rustls::ClientConfig::builder_with_provider(dlock::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(dlock::tls::read_roots(ca).unwrap())
        .with_client_auth_cert(
            dlock::tls::read_certs(cert).unwrap(),
            dlock::tls::read_key(key).unwrap(),
        )
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connect = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp);
    matches!(
        tokio::time::timeout(common::PATIENCE, connect).await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_peer_certificates_and_the_cluster_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let both = [
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let one = Ca::new(dir.path(), "one");
    let (cert1, key1) = one.issue_for("node1", &["127.0.0.1"], both.to_vec());
    let two = Ca::new(dir.path(), "two");
    let (cert2, key2) = two.issue_for("node2", &["127.0.0.1"], both.to_vec());
    // The files the nodes read, replaced in place as an operator would.
    let live = |name: &str| dir.path().join(name);
    let (cert, key, ca) = (live("live.pem"), live("live.key"), live("live-ca.pem"));
    std::fs::copy(&cert1, &cert).unwrap();
    std::fs::copy(&key1, &key).unwrap();
    std::fs::copy(one.ca_file(), &ca).unwrap();
    let mut nodes = tls_cluster(&cert, &key, &ca);
    let c = Client::connect(nodes.servers()).await.expect("a leader");
    let guard = c.lock(["rotate"], LockOptions::new()).await.expect("lock");
    let peer0 = nodes.peer_addr(0);
    assert!(handshake(peer0, &one.ca_file(), &cert1, &key1).await);

    // Rotation: the new certificate, and for the switch both CAs trusted.
    let bundle = [
        std::fs::read(one.ca_file()).unwrap(),
        std::fs::read(two.ca_file()).unwrap(),
    ]
    .concat();
    std::fs::write(&ca, bundle).unwrap();
    std::fs::copy(&cert2, &cert).unwrap();
    std::fs::copy(&key2, &key).unwrap();
    for i in 0..3 {
        nodes.reload(i);
    }
    // Node 0 presents the new certificate once it has reloaded: a client
    // that trusts only the old CA can no longer verify it, and one that
    // trusts the new CA (with a certificate of it) can.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while handshake(peer0, &one.ca_file(), &cert1, &key1).await {
        assert!(
            std::time::Instant::now() < deadline,
            "node 0 still presents the old certificate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(handshake(peer0, &two.ca_file(), &cert2, &key2).await);

    // Connections open before the reload still carry the cluster, and new
    // ones (a failover dials afresh) use the new certificates.
    guard
        .client()
        .ping()
        .await
        .expect("served after the reload");
    let old = nodes.index_of(&guard.client().addr()).expect("a node");
    nodes.kill(old);
    guard
        .client()
        .ping()
        .await
        .expect("answered by a leader elected over the new certificates");
    assert_ne!(nodes.index_of(&guard.client().addr()), Some(old));
    guard.unlock().await.expect("unlock");
    assert!(!nodes.any_panicked());
}

/// A plain-TCP hello to the TLS peer port at `addr`, from `from` (an
/// address of the loopback network), until the node closes it.
async fn plain_hello_from(from: std::net::IpAddr, addr: std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(std::net::SocketAddr::new(from, 0))
        .expect("bind a loopback address");
    let mut plain = socket
        .connect(addr)
        .await
        .expect("connect to the peer port");
    let hello = br#"{"protocol":"dlock-peer/1","cluster_id":"dlock","from":9,"to":1}"#;
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(hello);
    plain.write_all(&frame).await.expect("write");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(common::PATIENCE, plain.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the node never closed the connection");
}

/// A node with other `--peer-tls-*` files (or none) dials several times a
/// second, for as long as it runs: the refusal was logged at every dial
/// (about three lines a second on each node it dialled). It is logged once,
/// then once a minute per address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_clusters_tls_is_logged_once_not_at_every_dial() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_node_cert(dir.path());
    let nodes = tls_cluster(&cert, &key, &ca.ca_file());
    let peer_port = nodes.peer_addr(0);
    let (dialler, marker) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
    for _ in 0..5 {
        plain_hello_from(dialler, peer_port).await;
    }
    // Another address's refusal is logged after every one of those.
    plain_hello_from(marker, peer_port).await;
    let refused = |from: &str| {
        let log = nodes.recent_log(0);
        log.iter()
            .filter(|l| {
                l.contains("peer connection refused") && l.contains(&format!("peer={from}:"))
            })
            .count()
    };
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while refused("127.0.0.2") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:#?}",
            nodes.recent_log(0)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(refused("127.0.0.1"), 1, "{:#?}", nodes.recent_log(0));
    assert!(!nodes.any_panicked());
}

/// A node with `--peer-tls-*` files dialling one without them: the plain
/// node read the TLS record's header as a frame length and logged "bad first
/// frame: frame size too big", which did not say that TLS was the mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_at_a_plain_peer_port_is_logged_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_node_cert(dir.path());
    let nodes = NodeProcesses::start(env!("CARGO_BIN_EXE_dlock-server"), 1, &[]);
    assert!(!handshake(nodes.peer_addr(0), &ca.ca_file(), &cert, &key).await);
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        let log = nodes.recent_log(0);
        if log.iter().any(|l| {
            l.contains("peer connection refused")
                && l.contains("a TLS handshake at a peer port without TLS")
                && l.contains("same peer TLS setting")
        }) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{log:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!nodes.any_panicked());
}
