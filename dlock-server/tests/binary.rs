//! The `dlock-server` binary itself: signals, exit codes, SIGKILL restarts.

mod common;

use common::process::Process;
use common::{status, Conn};
use dlock::proto::ResponseStatus;
use std::process::Command;

#[tokio::test]
async fn sigterm_answers_waiters_and_exits_zero() {
    let server = Process::start(&[]);
    let mut h = Conn::connect(server.addr).await;
    h.must_lock(&["k"]).await;
    let mut w = Conn::connect(server.addr).await;
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
        let mut c = Conn::connect(server.addr).await;
        for key in ["x", "y"] {
            let f = c.must_lock(&[key]).await;
            assert!(f > last, "fence {f} not above {last}");
            last = f;
        }
        server.child.kill().expect("SIGKILL");
        server.child.wait().expect("reap");
    }
}

#[test]
fn unusable_token_file_is_a_clear_startup_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            "/nonexistent/tokens",
        ])
        .output()
        .expect("run dlock-server");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read token file /nonexistent/tokens"),
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
