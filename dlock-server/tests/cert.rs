//! `dlock-server cert`: a CA, node and client certificates in one command
//! each, enough for a 3-node cluster with mutual TLS for its clients and
//! TLS between its peers; keys are private to their owner, and nothing is
//! overwritten.

use dlock::{Client, ClientOptions, LockOptions};
use dlock_server::testing::nodes::NodeProcesses;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs `dlock-server cert ARGS --dir DIR`; its exit status and stderr.
fn cert(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .arg("cert")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("dlock-server runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("written").permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_certificates_run_a_cluster_with_mutual_and_peer_tls() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("certs");
    // Before the CA exists, a node's certificate says how to make it.
    let (ok, err) = cert(&dir, &["create-node", "n1", "--addr", "127.0.0.1"]);
    assert!(!ok && err.contains("cert create-ca"), "{err}");
    let (ok, err) = cert(&dir, &["create-ca"]);
    assert!(ok, "{err}");
    for i in 1..=3 {
        let (ok, err) = cert(
            &dir,
            &["create-node", &format!("n{i}"), "--addr", "127.0.0.1"],
        );
        assert!(ok, "{err}");
    }
    let (ok, err) = cert(&dir, &["create-client", "alice"]);
    assert!(ok, "{err}");
    for key in ["ca", "n1", "n2", "n3", "alice"] {
        assert_eq!(mode(&dir.join(format!("{key}.key"))), 0o600, "{key}.key");
    }
    assert_eq!(mode(&dir), 0o700);
    // Nothing is overwritten.
    let before = std::fs::read(dir.join("ca.key")).expect("read");
    let (ok, err) = cert(&dir, &["create-ca"]);
    assert!(!ok && err.contains("exists already"), "{err}");
    assert_eq!(std::fs::read(dir.join("ca.key")).expect("read"), before);

    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut nodes = NodeProcesses::prepare(
        dlock_server::testing::nodes::server_binary(),
        3,
        &["--heartbeat", "100ms", "--election-timeout", "500ms"],
    );
    for i in 0..3 {
        let (pem, key) = (
            file(&format!("n{}.pem", i + 1)),
            file(&format!("n{}.key", i + 1)),
        );
        nodes.node_flags(
            i,
            &[
                "--tls-cert",
                &pem,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &file("ca.pem"),
                "--peer-tls-cert",
                &pem,
                "--peer-tls-key",
                &key,
                "--peer-tls-ca",
                &file("ca.pem"),
            ],
        );
    }
    nodes.start_all();
    let tls = dlock::tls::client_config(
        &dir.join("ca.pem"),
        Some((&dir.join("alice.pem"), &dir.join("alice.key"))),
    )
    .expect("the client's TLS from the files");
    let options = ClientOptions {
        tls: Some(tls),
        connect_timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    // The peers elect a leader over TLS; the client reaches it over mutual
    // TLS and takes a lock there, which the cluster commits.
    let c = Client::connect_with(nodes.servers().as_str(), options)
        .await
        .expect("connect over mutual TLS");
    assert!(c.session().is_some(), "a cluster session");
    let g = c
        .lock(["tls/job"], LockOptions::new())
        .await
        .expect("a lock over mutual TLS");
    assert_eq!(
        c.inspect(["tls/job"]).await.expect("inspect")[0].fence(),
        Some(g.fence())
    );
    g.unlock().await.expect("unlock");
    assert!(!nodes.any_panicked());
}
