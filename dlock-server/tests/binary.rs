//! The `dlock-server` binary itself: signals, exit codes, SIGKILL restarts.

mod common;

use common::process::Process;
use common::{status, TestClient};
use dlock::proto::ResponseStatus;
use std::process::Command;

#[tokio::test]
async fn sigterm_answers_waiters_and_exits_zero() {
    let server = Process::start(&[]);
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["k"]).await;
    let mut w = TestClient::connect(server.addr).await;
    let req = w.lock_request(&["k"], 0, 0);
    w.send(&req).await;
    h.await_waiters("k", 1).await;
    server.signal("TERM");
    let r = w.recv().await;
    assert_eq!(status(&r), ResponseStatus::ShuttingDown);
    let code = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(code.code(), Some(0));
}

/// A backup script may send SIGUSR1 (take a snapshot now) to every
/// dlock-server it finds: one without a cluster says it has none to take
/// and goes on serving, its locks held, instead of dying of the signal's
/// default action.
#[tokio::test]
async fn sigusr1_on_a_server_without_a_cluster_changes_nothing() {
    let mut server = Process::start(&[]);
    let mut h = TestClient::connect(server.addr).await;
    h.must_lock(&["k"]).await;
    server.signal("USR1");
    server.wait_for_log("keeps no snapshots");
    // Still held: another client waiting a millisecond is refused.
    let mut other = TestClient::connect(server.addr).await;
    let r = other.lock(&["k"], 1_000, 0).await;
    assert_eq!(status(&r), ResponseStatus::AcquireTimeout);
    server.signal("TERM");
    let code = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(code.code(), Some(0));
}

#[tokio::test]
async fn fencing_tokens_increase_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fence");
    // A ceiling an hour ahead of the clock, as if the clock had stepped back
    // since the last run: tokens must start above it, not at the clock.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ahead = now.as_nanos() as u64 + 3_600 * 1_000_000_000;
    std::fs::write(&file, format!("{ahead}\n")).unwrap();
    let args = ["--fence-file", file.to_str().unwrap()];
    let mut last = ahead - 1;
    for _ in 0..3 {
        let mut server = Process::start(&args);
        let mut c = TestClient::connect(server.addr).await;
        for key in ["x", "y"] {
            let f = c.must_lock(&[key]).await;
            assert!(f > last, "fence {f} not above {last}");
            last = f;
        }
        server.child.kill().expect("SIGKILL");
        server.child.wait().expect("reap");
    }
}

/// Two servers given one fence file would both start from its ceiling and
/// hand out the same tokens.
#[tokio::test]
async fn a_second_server_on_a_fence_file_in_use_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fence");
    let args = ["--fence-file", file.to_str().unwrap()];
    let mut first = Process::start(&args);
    let stderr = refused_at_start(&["--fence-file".as_ref(), file.as_os_str()]);
    assert!(
        stderr.contains("in use by another dlock-server"),
        "{stderr}"
    );
    assert!(stderr.contains("own --fence-file"), "{stderr}");
    // The first still serves, its file untouched by the refused start.
    let mut c = TestClient::connect(first.addr).await;
    c.must_lock(&["x"]).await;
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reap");
    // Its lock died with it: the next server starts.
    let next = Process::start(&args);
    TestClient::connect(next.addr).await.must_lock(&["x"]).await;
}

#[test]
fn unusable_token_file_is_a_clear_startup_error() {
    let stderr = refused_at_start(&["--token-file".as_ref(), "/nonexistent/tokens".as_ref()]);
    assert!(
        stderr.contains("cannot read token file /nonexistent/tokens"),
        "{stderr}"
    );

    // A mistyped header: refused, not read as a token with every right.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "tokne jobs s3cret\n    lock jobs/*\n").unwrap();
    let stderr = refused_at_start(&["--token-file".as_ref(), tokens.as_os_str()]);
    assert!(stderr.contains("line 1: expected"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// A mistyped level was read as a target to log at every level, and
/// nothing else: the server ran without a single line.
#[test]
fn a_mistyped_log_level_is_a_clear_startup_error() {
    // 2: a usage error, as for any flag that does not parse.
    let stderr = exits_at_start(&["--log-level".as_ref(), "inof".as_ref()], 2);
    assert!(stderr.contains("\"inof\" is not a level"), "{stderr}");
}

/// Said in the flags' own words, not openraft's field names.
#[test]
fn a_heartbeat_not_below_the_election_timeout_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stderr = refused_at_start(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--heartbeat".as_ref(),
        "1s".as_ref(),
        "--election-timeout".as_ref(),
        "200ms".as_ref(),
    ]);
    let says = "--heartbeat (1s) must be shorter than --election-timeout (200ms)";
    assert!(stderr.contains(says), "{stderr}");
}

/// A node whose own ports differ from its entry in `--initial-cluster`
/// bootstrapped anyway: the others dialled a port where it did not listen,
/// and the cluster never formed.
#[test]
fn a_node_listed_at_other_ports_than_it_listens_on_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stderr = refused_at_start(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--peer-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--initial-cluster".as_ref(),
        "1=127.0.0.1:1@127.0.0.1:2,2=127.0.0.1:3@127.0.0.1:4".as_ref(),
    ]);
    let says = "node 1 is listed in --initial-cluster with peer address 127.0.0.1:2";
    assert!(stderr.contains(says), "{stderr}");
    assert!(
        !data.join("identity").exists(),
        "the directory is left fresh"
    );
}

#[test]
fn a_data_dir_that_is_a_file_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, "").unwrap();
    let stderr = refused_at_start(&["--data-dir".as_ref(), file.as_os_str()]);
    assert!(stderr.contains("is a file, not a directory"), "{stderr}");
    assert!(
        stderr.contains("give --data-dir a directory (it is created if missing)"),
        "{stderr}"
    );
}

/// A client's certificate (`dlock-server cert create-client`'s) given as
/// the server's own, or as a node's on the peer port: it started, and
/// every client then refused it at the handshake.
#[test]
fn a_client_certificate_as_the_servers_own_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["create-ca"][..], &["create-client", "alice"]] {
        let made = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
            .arg("cert")
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .output()
            .expect("run dlock-server cert");
        assert!(made.status.success(), "{made:?}");
    }
    let (cert, key) = (dir.path().join("alice.pem"), dir.path().join("alice.key"));
    let stderr = refused_at_start(&[
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    let says = format!("{} does not allow server authentication", cert.display());
    assert!(stderr.contains(&says), "{stderr}");
    assert!(stderr.contains("create-node"), "{stderr}");
    let data = dir.path().join("data");
    let ca = dir.path().join("ca.pem");
    let stderr = refused_at_start(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--peer-tls-cert".as_ref(),
        cert.as_os_str(),
        "--peer-tls-key".as_ref(),
        key.as_os_str(),
        "--peer-tls-ca".as_ref(),
        ca.as_os_str(),
    ]);
    assert!(stderr.contains(&says), "{stderr}");
}

/// A CA certificate (`dlock-server cert create-ca`'s ca.pem) given as the
/// server's own: refused at start, naming the file and what to give
/// instead, rather than a server whose every TLS handshake fails.
#[test]
fn a_ca_certificate_as_the_servers_own_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let made = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["cert", "create-ca", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run dlock-server cert");
    assert!(made.status.success(), "{made:?}");
    let (ca, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    let stderr = refused_at_start(&[
        "--tls-cert".as_ref(),
        ca.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    assert!(
        stderr.contains(&format!("{} is a CA certificate", ca.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("give --tls-cert the server's own certificate")
            && stderr.contains("create-node"),
        "{stderr}"
    );
    // The peer port's certificate too, on a node (a cluster of one).
    let data = dir.path().join("node");
    let stderr = refused_at_start(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--peer-tls-cert".as_ref(),
        ca.as_os_str(),
        "--peer-tls-key".as_ref(),
        key.as_os_str(),
        "--peer-tls-ca".as_ref(),
        ca.as_os_str(),
    ]);
    assert!(
        stderr.contains(&format!("{} is a CA certificate", ca.display()))
            && stderr.contains("give --peer-tls-cert the server's own certificate")
            && stderr.contains("--peer-tls-ca"),
        "{stderr}"
    );
}

/// Runs the server on a loopback port with `args`, which must make it exit
/// 1 at start; returns what it wrote on stderr. A server that starts
/// instead is stopped after 30 s and fails the test, rather than hang it.
fn refused_at_start(args: &[&std::ffi::OsStr]) -> String {
    exits_at_start(args, 1)
}

/// [`refused_at_start`] with exit status `code`.
fn exits_at_start(args: &[&std::ffi::OsStr], code: i32) -> String {
    exits_at_start_within(args, code, None)
}

/// [`exits_at_start`] with the server's address space limited to
/// `address_space` bytes (RLIMIT_AS, soft and hard), when given.
fn exits_at_start_within(
    args: &[&std::ffi::OsStr],
    code: i32,
    address_space: Option<u64>,
) -> String {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-server"));
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(bytes) = address_space {
        // SAFETY: rlimit::setrlimit is one setrlimit(2) call, which is
        // async-signal-safe; it allocates nothing, also on error.
        unsafe {
            cmd.pre_exec(move || rlimit::setrlimit(rlimit::Resource::AS, bytes, bytes));
        }
    }
    let mut child = cmd.spawn().expect("run dlock-server");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for dlock-server") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("dlock-server {args:?} started instead of refusing to");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).expect("read its stderr");
    }
    assert_eq!(status.code(), Some(code), "{stderr}");
    stderr
}

/// A node that joins a running cluster is dialled at the peer address its
/// add names: one the kernel chose (no --peer-listen) would change at its
/// next start.
#[test]
fn a_node_that_joins_needs_a_peer_listen() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node2");
    let stderr = refused_at_start(&[
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--node-id".as_ref(),
        "2".as_ref(),
        "--initial-cluster-state".as_ref(),
        "existing".as_ref(),
    ]);
    assert!(
        stderr.contains("needs --peer-listen") && stderr.contains("--initial-cluster-state"),
        "{stderr}"
    );
}

/// Under systemd, `Restart=on-failure` restarts a server that exits, never
/// one that hangs: a server whose worker threads the OS refuses (here an
/// address space of 400 MB, too small for 1024 thread stacks of 2 MiB)
/// says so in one line and exits 1, rather than panic and then wait for
/// ever, not listening.
#[test]
fn a_server_that_cannot_start_its_threads_says_so_and_exits() {
    let stderr = exits_at_start_within(
        &["--threads".as_ref(), "1024".as_ref()],
        1,
        Some(400_000 * 1024),
    );
    assert!(
        stderr.contains("OS can't spawn worker thread")
            && stderr.contains("--threads 1024")
            && stderr.contains("fewer --threads")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn bad_flag_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["--idle-timeout", "soon"])
        .output()
        .expect("run dlock-server");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--idle-timeout"));
}

#[tokio::test]
async fn json_logs_have_one_parsable_line_per_notable_event_and_none_per_request() {
    let mut server = Process::start(&["--log-format", "json", "--idle-timeout", "1s"]);
    let mut c = TestClient::connect(server.addr).await;
    let client = c.stream().local_addr().expect("client address");
    for _ in 0..5 {
        assert_eq!(status(&c.ping().await), ResponseStatus::Ok);
    }
    // The server closes the quiet connection on its own; waiting for the
    // log line is the synchronisation, not a sleep. Blocking this runtime
    // is harmless: the server is another process.
    let dropped_line = server.wait_for_log("client dropped");
    c.expect_closed().await;
    server.signal("TERM");
    server.wait_for_log("dlock-server stopped");
    let events: Vec<serde_json::Value> = server
        .log_lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(dropped_line.starts_with('{'));

    let start: Vec<_> = events
        .iter()
        .filter(|e| e["message"] == "dlock-server listening")
        .collect();
    assert_eq!(start.len(), 1, "{events:#?}");
    let start = start[0];
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["addr"], server.addr.to_string());
    assert_eq!(start["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(start["access_tokens"], false);
    assert_eq!(start["max_connections"], 10_000);
    assert_eq!(start["max_frame"], 16 * 1024);
    assert_eq!(start["idle_timeout"], "1s");
    assert!(start["timestamp"].is_string());

    let dropped: Vec<_> = events
        .iter()
        .filter(|e| e["message"] == "client dropped")
        .collect();
    assert_eq!(dropped.len(), 1, "{events:#?}");
    assert_eq!(dropped[0]["reason"], "idle");
    assert_eq!(dropped[0]["span"]["peer"], client.to_string());

    // Start, the drop, shutting down, stopped: the pings left no line.
    let messages: Vec<_> = events.iter().map(|e| e["message"].clone()).collect();
    assert_eq!(
        messages,
        [
            "dlock-server listening",
            "client dropped",
            "shutting down",
            "dlock-server stopped"
        ],
        "{events:#?}"
    );
}
