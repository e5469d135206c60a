//! A short torture run in every `cargo test`: honest clients (on raw
//! frames and through the library) and every kind of fault against an
//! in-process server, zero violations required.
//! The long run is documented in docs/RELIABILITY.md.

use std::process::Command;

#[test]
fn short_run_has_no_violations() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-torture"))
        .args(["--duration", "3s", "--clients", "16", "--fault-rate", "12"])
        .output()
        .expect("dlock-torture runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "violations or failure:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("violations                 0"), "{stdout}");
    // A quarter of the honest clients go through the library.
    assert!(
        stdout.contains("12 on the wire, 4 through the library"),
        "{stdout}"
    );
    // Every fault kind ran at least once.
    for kind in [
        "rst while holding",
        "silent while holding",
        "stops reading",
        "half a frame",
        "garbage",
        "connection storm",
    ] {
        assert!(stdout.contains(kind), "no {kind} fault in:\n{stdout}");
    }
    let granted = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("locks granted"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("a count of granted locks");
    assert!(granted > 0, "the workload did nothing:\n{stdout}");
}

#[test]
fn bad_options_are_usage_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-torture"))
        .args(["--server", "example.com:7436"])
        .output()
        .expect("dlock-torture runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server"));
}
