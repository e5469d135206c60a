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
