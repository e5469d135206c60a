//! TLS on the client port, with certificates made here by rcgen (no key is
//! ever checked in): the Rust client connects when it trusts the CA and the
//! name fits, and is refused otherwise; mutual TLS refuses a client without
//! a certificate and lets a certificate's name stand for an access token;
//! SIGHUP swaps the certificates of a running process without dropping its
//! connections.

mod common;

use common::pki::Ca;
use common::process::Process;
use common::TestServer;
use dlock::tls::rustls::ClientConfig;
use dlock::{Client, ClientOptions, Error, LockOptions, LockWait};
use rcgen::ExtendedKeyUsagePurpose;
use std::path::Path;
use std::sync::Arc;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn options(tls: Arc<ClientConfig>) -> ClientOptions {
    ClientOptions {
        tls: Some(tls),
        connect_timeout: common::PATIENCE,
        ..ClientOptions::default()
    }
}

fn trusting(ca: &Ca) -> ClientOptions {
    options(dlock::tls::client_config(&ca.ca_file(), None).unwrap())
}

/// The error of a connection that must fail.
async fn refused(addr: &str, options: ClientOptions) -> Error {
    match Client::connect_with(addr, options).await {
        Ok(_) => panic!("connected to {addr}, which should have been refused"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_client_that_trusts_the_ca_and_checks_the_name_locks_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "good");
    let (cert, key) = ca.server(&["localhost"]);
    let server = TestServer::start(flags(&["--tls-cert", s(&cert), "--tls-key", s(&key)])).await;
    let addr = format!("localhost:{}", server.addr.port());
    let client = Client::connect_with(&addr, trusting(&ca)).await.unwrap();
    client.ping().await.unwrap();
    let guard = client
        .lock(
            ["k"],
            LockOptions::default().wait(std::time::Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert!(guard.fence() > 0);
    let other = Client::connect_with(&addr, trusting(&ca)).await.unwrap();
    let busy = other
        .lock(
            ["k"],
            LockOptions {
                wait: LockWait::No,
                lease: None,
                ..LockOptions::default()
            },
        )
        .await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    guard.unlock().await.unwrap();
    drop((client, other));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn no_ca_a_wrong_ca_or_a_wrong_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "good");
    let stranger = Ca::new(dir.path(), "stranger");
    let (cert, key) = ca.server(&["localhost"]);
    let server = TestServer::start(flags(&["--tls-cert", s(&cert), "--tls-key", s(&key)])).await;
    let port = server.addr.port();
    let addr = format!("localhost:{port}");

    // Plain TCP to a TLS port: the server sees no handshake, the client
    // no answer it can read.
    let plain = ClientOptions {
        connect_timeout: common::PATIENCE,
        ..ClientOptions::default()
    };
    refused(&addr, plain).await;

    let e = refused(&addr, trusting(&stranger)).await;
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(format!("{e}").contains("UnknownIssuer"), "{e}");
    assert!(
        format!("{e}").contains("give --tls-ca"),
        "what to change: {e}"
    );

    // The right CA, but the certificate names localhost, not 127.0.0.1.
    let e = refused(&format!("127.0.0.1:{port}"), trusting(&ca)).await;
    assert!(format!("{e}").contains("not valid for name"), "{e}");
    assert!(
        format!("{e}").contains("does not name 127.0.0.1"),
        "what to change: {e}"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_and_maps_one_to_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "good");
    let (cert, key) = ca.server(&["localhost"]);
    let (agent_cert, agent_key) = ca.issue(
        "agent",
        &["build-agent", "agent.example"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let (other_cert, other_key) = ca.issue(
        "other",
        &["someone-else"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let acl = dir.path().join("acl");
    std::fs::write(
        &acl,
        "identity agent.example\n    lock ci/*\ntoken ops ops-secret\n    admin\n",
    )
    .unwrap();
    let server = TestServer::start(flags(&[
        "--tls-cert",
        s(&cert),
        "--tls-key",
        s(&key),
        "--tls-client-ca",
        s(&ca.ca_file()),
        "--token-file",
        s(&acl),
    ]))
    .await;
    let addr = format!("localhost:{}", server.addr.port());

    // No certificate: the handshake fails (TLS 1.3 reports it at the first
    // read, so the Hello fails).
    refused(&addr, trusting(&ca)).await;

    let with_cert = |c: &Path, k: &Path| {
        options(dlock::tls::client_config(&ca.ca_file(), Some((c, k))).unwrap())
    };
    // The certificate's DNS name is an identity of the token file: no token needed.
    let agent = Client::connect_with(&addr, with_cert(&agent_cert, &agent_key))
        .await
        .unwrap();
    let guard = agent
        .lock(["ci/build"], LockOptions::default())
        .await
        .unwrap();
    let denied = agent.lock(["prod/deploy"], LockOptions::default()).await;
    match denied {
        Err(Error::AccessDenied(text)) => assert!(text.contains("\"lock prod/deploy\""), "{text}"),
        other => panic!("expected AccessDenied, got {other:?}"),
    }
    guard.unlock().await.unwrap();

    // A certificate from the CA whose names the file does not know: it may
    // connect (TLS is satisfied) but not act without a token.
    let opts = with_cert(&other_cert, &other_key);
    match Client::connect_with(&addr, opts.clone()).await {
        Err(Error::AccessDenied(_)) => {}
        other => panic!("expected AccessDenied at Hello, got {other:?}"),
    }
    // With a token, the token names the identity.
    let ops = Client::connect_with(
        &addr,
        ClientOptions {
            access_token: Some("ops-secret".into()),
            ..opts
        },
    )
    .await
    .unwrap();
    ops.lock(["prod/deploy"], LockOptions::default())
        .await
        .unwrap();
    drop((agent, ops));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn sighup_swaps_the_certificates_and_keeps_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old = Ca::new(dir.path(), "old");
    let new = Ca::new(dir.path(), "new");
    let (cert, key) = old.server(&["localhost"]);
    let (live_cert, live_key) = (dir.path().join("live.pem"), dir.path().join("live.key"));
    std::fs::copy(&cert, &live_cert).unwrap();
    std::fs::copy(&key, &live_key).unwrap();
    let mut server = Process::start(&["--tls-cert", s(&live_cert), "--tls-key", s(&live_key)]);
    let addr = format!("localhost:{}", server.addr.port());
    let before = Client::connect_with(&addr, trusting(&old)).await.unwrap();
    let guard = before.lock(["held"], LockOptions::default()).await.unwrap();

    // A key that does not fit the certificate is refused; nothing changes.
    let (new_cert, new_key) = new.server(&["localhost"]);
    std::fs::copy(&new_cert, &live_cert).unwrap();
    server.signal("HUP");
    server.wait_for_log("TLS certificates in force stay");
    Client::connect_with(&addr, trusting(&old)).await.unwrap();

    std::fs::copy(&new_key, &live_key).unwrap();
    server.signal("HUP");
    server.wait_for_log("TLS certificates reloaded");
    refused(&addr, trusting(&old)).await;
    let after = Client::connect_with(&addr, trusting(&new)).await.unwrap();
    after.ping().await.unwrap();
    // The connection from before the reload still works and still holds.
    before.ping().await.unwrap();
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
}

/// A server configured by its command-line flags, as an operator writes them.
fn flags(args: &[&str]) -> dlock_server::Config {
    use clap::Parser;
    dlock_server::Config::try_parse_from(
        std::iter::once("dlock-server").chain(args.iter().copied()),
    )
    .expect("flags parse")
}

/// A certificate given with another certificate's key (the .key of
/// another node) is refused at start by the server, and by the client
/// library, naming both files and what is wrong rather than rustls's
/// "keys may not be consistent: KeyMismatch".
#[test]
fn a_key_that_is_not_the_certificates_own_is_named_with_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Ca::new(dir.path(), "a"), Ca::new(dir.path(), "b"));
    let ((cert, _), (_, key)) = (a.server(&["localhost"]), b.server(&["localhost"]));
    let flags = flags(&["--tls-cert", s(&cert), "--tls-key", s(&key)]);
    let server = dlock_server::net::tls::Tls::from_config(&flags)
        .map(|_| ())
        .unwrap_err();
    let client = dlock::tls::client_config(&a.ca_file(), Some((&cert, &key)))
        .map(|_| ())
        .unwrap_err();
    for e in [format!("{server:#}"), client.to_string()] {
        assert!(e.contains("not the certificate's own"), "{e}");
        assert!(e.contains(s(&cert)) && e.contains(s(&key)), "{e}");
    }
}
