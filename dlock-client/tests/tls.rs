//! `dlock` over TLS: --tls-ca (and --tls-cert/--tls-key for mutual TLS),
//! or the DLOCK_TLS_* variables, against a real TLS server, with
//! certificates made here by rcgen.

mod common;

use common::{code, run_at, stderr};
use dlock_server::testing::TestServer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::path::{Path, PathBuf};

/// A TLS server with nothing behind it, presenting `cert` (with `key`) to
/// whoever connects to the `localhost:PORT` it returns: for certificates
/// dlock-server refuses to start with. Its thread handshakes until the
/// client gives up, and lives as long as the test process.
fn bare_tls_server(cert: &str, key: &str) -> String {
    use dlock::tls::rustls;
    let config = rustls::ServerConfig::builder_with_provider(dlock::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            dlock::tls::read_certs(cert.as_ref()).unwrap(),
            dlock::tls::read_key(key.as_ref()).unwrap(),
        )
        .unwrap();
    let config = std::sync::Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut tcp in listener.incoming().flatten() {
            let Ok(mut tls) = rustls::ServerConnection::new(config.clone()) else {
                return;
            };
            while tls.is_handshaking() && tls.complete_io(&mut tcp).is_ok() {}
        }
    });
    format!("localhost:{port}")
}

/// Writes `NAME.pem` and `NAME.key` for `host`, signed by `ca`.
fn issue(
    dir: &Path,
    ca: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    host: &str,
    usages: &[ExtendedKeyUsagePurpose],
) -> (String, String) {
    let mut params = CertificateParams::new(vec![host.to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, host);
    params.extended_key_usages = usages.to_vec();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (path(c), path(k))
}

/// A test CA in `dir` (its certificate in ca.pem) and a server
/// certificate for localhost it signed: the CA, the CA file, and the
/// server's certificate and key files.
fn ca_and_server_cert(dir: &Path) -> (CertifiedIssuer<'static, KeyPair>, String, String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let ca_file = path(dir.join("ca.pem"));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let (cert, key) = issue(
        dir,
        &ca,
        "server",
        "localhost",
        &[ExtendedKeyUsagePurpose::ServerAuth],
    );
    (ca, ca_file, cert, key)
}

fn path(p: PathBuf) -> String {
    p.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn dlock_runs_a_command_over_mutual_tls_and_fails_without_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, ca_file, cert, key) = ca_and_server_cert(dir.path());
    let (ccert, ckey) = issue(
        dir.path(),
        &ca,
        "client",
        "cron.example",
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    let server = TestServer::start(flags(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca_file,
    ]))
    .await;
    let addr = format!("localhost:{}", server.addr.port());

    let tls = [
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &ccert,
        "--tls-key",
        &ckey,
    ];
    let args: Vec<&str> = tls
        .iter()
        .copied()
        .chain(["-k", "job", "--", "true"])
        .collect();
    let out = run_at(&addr, &args).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // The same through the environment.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["--ping"])
        .env("DLOCK_SERVER", &addr)
        .env("DLOCK_TLS_CA", &ca_file)
        .env("DLOCK_TLS_CERT", &ccert)
        .env("DLOCK_TLS_KEY", &ckey)
        .output()
        .await
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // Without the client certificate, or without TLS at all: refused,
    // saying which flags the server wants rather than a TLS alert's name.
    let out = run_at(&addr, &["--tls-ca", &ca_file, "--ping"]).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        err.contains("requires a client certificate") && err.contains("--tls-cert"),
        "{err}"
    );
    // A client certificate of another CA: refused, and the server's CA named.
    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let (other_ca, ..) = ca_and_server_cert(&other_dir);
    let (ocert, okey) = issue(
        &other_dir,
        &other_ca,
        "client",
        "cron.example",
        &[ExtendedKeyUsagePurpose::ClientAuth],
    );
    let out = run_at(
        &addr,
        &[
            "--tls-ca",
            &ca_file,
            "--tls-cert",
            &ocert,
            "--tls-key",
            &okey,
            "--ping",
        ],
    )
    .await;
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        err.contains("refused this client's certificate") && err.contains("--tls-client-ca"),
        "{err}"
    );
    let out = run_at(&addr, &["--ping"]).await;
    assert_ne!(code(&out), 0);
    // A certificate without its key is a usage mistake.
    let out = run_at(
        &addr,
        &["--tls-ca", &ca_file, "--tls-cert", &ccert, "--ping"],
    )
    .await;
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("--tls-key"), "{}", stderr(&out));
    // An unreadable CA file names itself.
    let out = run_at(&addr, &["--tls-ca", "/nonexistent/ca.pem", "--ping"]).await;
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/ca.pem"),
        "{}",
        stderr(&out)
    );
    server.stop().await.unwrap();
}

/// A server configured by its command-line flags, as an operator writes them.
fn flags(args: &[&str]) -> dlock_server::Config {
    use clap::Parser;
    dlock_server::Config::try_parse_from(
        std::iter::once("dlock-server").chain(args.iter().copied()),
    )
    .expect("flags parse")
}

/// A cluster of one that speaks TLS only, its data in `dir`: the server,
/// the address its certificate names, and the CA file that trusts it.
async fn tls_node(dir: &Path, peer_tls: bool) -> (TestServer, String, String) {
    let (ca, ca_file, cert, key) = ca_and_server_cert(dir);
    let data = path(dir.join("node1"));
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key, "--data-dir", &data];
    // A node's peer certificate serves and dials.
    let both = [
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let (pcert, pkey) = issue(dir, &ca, "peer", "localhost", &both);
    if peer_tls {
        args.extend(["--peer-tls-cert", &pcert, "--peer-tls-key", &pkey]);
        args.extend(["--peer-tls-ca", &ca_file]);
    }
    let server = TestServer::start(flags(&args)).await;
    let addr = format!("localhost:{}", server.addr.port());
    (server, addr, ca_file)
}

#[tokio::test]
async fn dlock_cluster_status_speaks_tls_to_a_tls_node() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr, ca_file) = tls_node(dir.path(), true).await;
    // A cluster of one elects itself after an election timeout.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let status = loop {
        let out = run_at(
            &addr,
            &["cluster", "status", "--tls-ca", &ca_file, "-o", "json"],
        )
        .await;
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let status: serde_json::Value = serde_json::from_str(&common::stdout(&out)).unwrap();
        if status["role"] == "leader" {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "never a leader");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Plain TCP to a TLS port gets no answer it can read.
    let out = run_at(&addr, &["cluster", "status"]).await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));

    // Its peer port (TLS too), given by mistake, with or without --tls-ca:
    // named as a peer port, with the flag of the port to give instead,
    // rather than a hint to add --tls-ca or a client certificate.
    let peer = status["members"][0]["peer_addr"].as_str().unwrap();
    let peer = peer.replace("127.0.0.1", "localhost");
    let forms = [
        &["--ping"][..],
        &["cluster", "status"][..],
        &["--ping", "--tls-ca", &ca_file][..],
        &["cluster", "status", "--tls-ca", &ca_file][..],
    ];
    for args in forms {
        let out = run_at(&peer, args).await;
        let err = stderr(&out);
        assert_ne!(code(&out), 0, "{args:?}: {err}");
        assert!(
            err.contains(&peer) && err.contains("peer port") && err.contains("--listen"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("give the CA certificate") && !err.contains("client certificate"),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_top_shows_a_tls_cluster_node_and_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr, ca_file) = tls_node(dir.path(), false).await;
    let options = dlock::ClientOptions {
        tls: Some(dlock::tls::client_config(std::path::Path::new(&ca_file), None).unwrap()),
        ..dlock::ClientOptions::default()
    };
    // A cluster of one elects itself; the client finds the leader.
    let holder = dlock::Client::connect_with(&addr, options).await.unwrap();
    let guard = holder
        .lock("nightly/report", dlock::LockOptions::default())
        .await
        .unwrap();

    let mut top = common::screen::Screen::start(
        &addr,
        &["top", "--tls-ca", &ca_file, "--interval", "200ms"],
        30,
        140,
    );
    top.wait_for("the node as leader and the held key", |s| {
        let c = s.contents();
        let node = c.lines().find(|l| l.trim_start().starts_with("1 "));
        let key = c.lines().find(|l| l.starts_with("nightly/report"));
        node.is_some_and(|l| l.contains("leader"))
            && key.is_some_and(|l| l.contains(&guard.fence().to_string()))
    })
    .await;
    top.send(b"\x03");
    assert_eq!(top.exit_code().await, 0, "Ctrl-C quits");
}

#[tokio::test]
async fn a_tls_mismatch_says_which_flag_to_change_and_exits_69() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ca_file, cert, key) = ca_and_server_cert(dir.path());
    let tls = TestServer::start(flags(&["--tls-cert", &cert, "--tls-key", &key])).await;
    let tls_addr = format!("localhost:{}", tls.addr.port());
    // A plain client at a TLS port: not a 352 MB "frame", in the lock
    // form or `dlock cluster` (which reads its answers apart).
    for args in [&["--ping"][..], &["cluster", "status"][..]] {
        let out = run_at(&tls_addr, args).await;
        let err = stderr(&out);
        assert_eq!(code(&out), 69, "{args:?}: {err}");
        assert!(
            err.contains("speaks TLS") && err.contains("--tls-ca"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("is dlock-server running"), "{err}");
    }

    // A TLS client at a plain port.
    let plain = TestServer::start(flags(&[])).await;
    let plain_addr = format!("localhost:{}", plain.addr.port());
    let out = run_at(&plain_addr, &["--tls-ca", &ca_file, "--ping"]).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(err.contains("does not speak TLS"), "{err}");
    assert!(!err.contains("is dlock-server running"), "{err}");

    // One self-signed CA certificate as both the server's and the CA file.
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key_pair = KeyPair::generate().unwrap();
    let both = params.self_signed(&key_pair).unwrap();
    let (both_file, both_key) = (
        path(dir.path().join("both.pem")),
        path(dir.path().join("both.key")),
    );
    std::fs::write(&both_file, both.pem()).unwrap();
    std::fs::write(&both_key, key_pair.serialize_pem()).unwrap();
    // dlock-server refuses to start with it; other TLS servers do not.
    let odd_addr = bare_tls_server(&both_file, &both_key);
    let out = run_at(&odd_addr, &["--tls-ca", &both_file, "--ping"]).await;
    let err = stderr(&out);
    assert_eq!(code(&out), 69, "{err}");
    assert!(
        err.contains("CA certificate as its own") && err.contains("dlock-server cert create-ca"),
        "{err}"
    );

    // Nobody listening: the one case for the hint.
    let out = run_at("127.0.0.1:1", &["--ping"]).await;
    assert!(
        stderr(&out).contains("is dlock-server running"),
        "{}",
        stderr(&out)
    );
}

/// Over TLS too, and on a cluster (of one), a Lock given up while its
/// lease's grant is on the wire half-closes (close_notify, then a FIN)
/// and reads on: the grant is read and released by fence, not left to keep
/// the key for an hour. (The library's own tests, `tests/client.rs` and
/// `tests/resume.rs`, do this over plain TCP.)
#[tokio::test]
async fn a_lease_granted_as_its_lock_is_given_up_over_tls_is_released() {
    use dlock::{Client, ClientOptions, LockOptions};
    use dlock_server::testing::proxy::FreezableProxy;
    use std::time::Duration;
    const PATIENCE: Duration = Duration::from_secs(30);

    let dir = tempfile::tempdir().unwrap();
    let (server, addr, ca_file) = tls_node(dir.path(), false).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let tls = dlock::tls::client_config(Path::new(&ca_file), None).unwrap();
    let options = || ClientOptions {
        tls: Some(tls.clone()),
        ..ClientOptions::default()
    };
    let holder = Client::connect_with(addr.as_str(), options())
        .await
        .unwrap();
    let waiter = Client::connect_with(format!("localhost:{}", proxy.addr.port()), options())
        .await
        .unwrap();
    let g = holder.lock(["tls"], LockOptions::new()).await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let hour = LockOptions::new().lease(Duration::from_secs(3600));
        async move { waiter.lock(["tls"], hour).await }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while holder.inspect(["tls"]).await.unwrap()[0].waiters != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Lock never arrived"
        );
        tokio::task::yield_now().await;
    }
    proxy.freeze();
    g.unlock().await.unwrap();
    let state = holder.inspect(["tls"]).await.unwrap().remove(0);
    assert!(
        state.first().and_then(|h| h.lease_remaining).is_some(),
        "{state:?}"
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    drop(waiter);
    proxy.thaw();
    let taken = holder
        .lock(["tls"], LockOptions::new().wait(PATIENCE))
        .await;
    assert!(
        taken.is_ok(),
        "the grant that crossed the close was lost: {taken:?}"
    );
}
