//! A few seconds of every workload against a real server: the tool keeps
//! working. No thresholds: speed is measured by bench/compare.sh, not here.

use dlock_server::testing::TestServer;
use dlock_server::Config;
use tokio::process::Command;

async fn bench(server: &TestServer, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-bench"))
        .args([
            "--server",
            &server.addr_string(),
            "--json",
            "--duration",
            "300ms",
        ])
        .args(args)
        .output()
        .await
        .expect("dlock-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dlock-bench {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("JSON report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_and_reports() {
    let server = TestServer::start(Config::default()).await;
    for args in [
        &["ping", "-c", "4"][..],
        &["lock-unlock", "-c", "4"],
        &["pipeline", "--depth", "32"],
        &["pipeline", "--depth", "16", "--kind", "lock-unlock"],
        &["contended", "-c", "4"],
        &["multikey", "-c", "4", "--keys", "3", "--pool", "20"],
        &["hold", "--count", "2000"],
        &["conns", "--idle", "50", "--active", "2"],
        &["churn", "-c", "2"],
    ] {
        let report = bench(&server, args).await;
        assert!(
            report["ops"].as_u64().unwrap_or(0) > 0,
            "{args:?}: {report}"
        );
        assert_eq!(report["errors"].as_u64(), Some(0), "{args:?}: {report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_floor_reports_cpu_per_sync_and_leaves_nothing_behind() {
    let server = TestServer::start(Config::default()).await;
    let dir = tempfile::tempdir().expect("a scratch directory");
    let path = dir.path().to_str().expect("a UTF-8 path");
    let report = bench(&server, &["--ops", "20", "sync-floor", "--dir", path]).await;
    assert_eq!(report["ops"].as_u64(), Some(20), "{report}");
    assert!(
        report["extra"]["cpu_us_per_sync"].as_f64().is_some(),
        "{report}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("the directory is readable")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn sync_floor_in_a_missing_directory_says_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-bench"))
        .args([
            "--ops",
            "5",
            "sync-floor",
            "--dir",
            "/nonexistent/dlock-bench",
        ])
        .output()
        .await
        .expect("dlock-bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot create /nonexistent/dlock-bench/")
            && stderr.contains("No such file"),
        "{stderr}"
    );
}
