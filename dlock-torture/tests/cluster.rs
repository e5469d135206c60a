//! The cluster torture in every `cargo test --workspace`: three node
//! processes killed, paused, partitioned and given a damaged log under
//! honest clients for 60 s, with the seed that found the UnknownSession
//! loop (see docs/RELIABILITY.md, "Cluster torture"); zero violations
//! required. It needs the `dlock-server` binary
//! beside `dlock-torture`, which `cargo test --workspace` builds.

use std::process::Command;

#[test]
fn cluster_run_has_no_violations() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-torture"))
        .args([
            "--cluster",
            "3",
            "--duration",
            "60s",
            "--clients",
            "8",
            "--fault-every",
            "3s",
            "--seed",
            "2",
        ])
        .output()
        .expect("dlock-torture runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "violations or failure:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("violations                 0"), "{stdout}");
    let count = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        count("locks granted") > 0,
        "the workload did nothing:\n{stdout}"
    );
    let faults: u64 = [
        "SIGKILL leader",
        "SIGKILL follower",
        "SIGKILL majority",
        "SIGSTOP leader",
        "partition: leader isolated",
        "partition: leader in the minority",
        "partition: leader -> follower cut one way",
        "partition: follower isolated",
        "follower's log file cut short",
    ]
    .iter()
    .map(|k| count(k))
    .sum();
    assert!(faults >= 3, "too few faults:\n{stdout}");
}
