//! `dlock elect` and `dlock leader` against a real server: a command runs
//! only while its dlock leads, the next campaigner's command starts only
//! once the first dlock is killed, a lost leadership stops the command and
//! campaigns again (or exits 75 with --once), and `dlock leader` prints the
//! leader, or every change with --watch.

mod common;

use common::{client, code, dlock_at, pid_of, run_at, signal_pid, stdout, wait_output, PATIENCE};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// The child's stdout, line by line (one reader for its whole life, so no
/// buffered line is lost between reads).
fn stdout_lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout piped")).lines()
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("a line in time")
        .expect("read stdout")
        .expect("a line, not the end")
}

/// A command that says it leads, with its fencing token, then runs until
/// killed.
const LEAD: &str = r#"echo "leading $DLOCK_FENCE"; touch "$MARK"; exec sleep 600"#;

#[tokio::test]
async fn the_second_campaigner_runs_its_command_only_once_the_first_is_killed() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let (mark_a, mark_b) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = dlock_at(&addr, &["elect", "-k", "svc", "--id", "a", "-c", LEAD])
        .env("MARK", &mark_a)
        .spawn()
        .expect("dlock elect runs");
    let mut a_out = stdout_lines(&mut a);
    let fence_a: u64 = next_line(&mut a_out).await["leading ".len()..]
        .parse()
        .expect("a fence");
    let mut b = dlock_at(&addr, &["elect", "-k", "svc", "--id", "b", "-c", LEAD])
        .env("MARK", &mark_b)
        .spawn()
        .expect("dlock elect runs");
    let mut b_out = stdout_lines(&mut b);
    // b waits in line: its command has not run.
    let probe = client(&addr).await;
    tokio::time::timeout(PATIENCE, async {
        while probe.inspect(["svc"]).await.expect("inspect")[0].waiters != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("b queues");
    assert!(!mark_b.exists(), "b's command ran while a led");
    let o = run_at(&addr, &["leader", "-k", "svc"]).await;
    assert_eq!(code(&o), 0);
    assert!(
        stdout(&o).starts_with(&format!("leader a fence {fence_a} since ")),
        "{}",
        stdout(&o)
    );

    // a's dlock dies: its connection ends, b leads and runs its command.
    signal_pid(pid_of(&a), libc::SIGKILL);
    let line = next_line(&mut b_out).await;
    let fence_b: u64 = line["leading ".len()..].parse().expect("a fence");
    assert!(fence_b > fence_a);
    let o = run_at(&addr, &["leader", "-k", "svc"]).await;
    assert!(stdout(&o).starts_with("leader b "), "{}", stdout(&o));
    let o = run_at(&addr, &["leader", "-o", "json", "-k", "svc"]).await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["leader"]["id"], "b", "{v}");
    assert_eq!(v["leader"]["fence"], fence_b, "{v}");

    // b ends normally on SIGTERM: its command's code (143), resigned.
    signal_pid(pid_of(&b), libc::SIGTERM);
    let _ = a.wait().await;
    let o = wait_output(b).await;
    assert_eq!(code(&o), 143);
    let o = run_at(&addr, &["leader", "-k", "svc"]).await;
    assert_eq!((code(&o), stdout(&o).trim()), (1, "no leader"));
    let o = run_at(&addr, &["leader", "-o", "json", "-k", "svc"]).await;
    assert_eq!((code(&o), stdout(&o).trim()), (1, r#"{"leader":null}"#));
}

#[tokio::test]
async fn a_lost_leadership_stops_the_command_and_campaigns_again_or_exits_75_with_once() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let mark = dir.path().join("m");
    let admin = client(&addr).await;

    // Without --once: the lease is released by its fence behind dlock's
    // back; its next renewal finds out, the command is stopped, and dlock
    // leads again under a new fence.
    let mut e = dlock_at(&addr, &["elect", "--lease", "1s", "-k", "svc", "-c", LEAD])
        .env("MARK", &mark)
        .spawn()
        .expect("dlock elect runs");
    let mut out = stdout_lines(&mut e);
    let first: u64 = next_line(&mut out).await["leading ".len()..]
        .parse()
        .expect("a fence");
    admin
        .unlock_fence("svc", first)
        .await
        .expect("unlock by fence");
    let second: u64 = next_line(&mut out).await["leading ".len()..]
        .parse()
        .expect("a fence");
    assert!(second > first, "campaigned again");
    signal_pid(pid_of(&e), libc::SIGTERM);
    let o = wait_output(e).await;
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("campaigning again"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // With --once: exit 75.
    let mut e = dlock_at(
        &addr,
        &["elect", "--once", "--lease", "1s", "-k", "svc2", "-c", LEAD],
    )
    .env("MARK", &mark)
    .spawn()
    .expect("dlock elect runs");
    let mut out = stdout_lines(&mut e);
    let fence: u64 = next_line(&mut out).await["leading ".len()..]
        .parse()
        .expect("a fence");
    admin
        .unlock_fence("svc2", fence)
        .await
        .expect("unlock by fence");
    let o = wait_output(e).await;
    assert_eq!(code(&o), 75, "{}", String::from_utf8_lossy(&o.stderr));
}

#[tokio::test]
async fn leader_watch_prints_every_change_until_interrupted() {
    let server = TestServer::start(Config::default()).await;
    let addr = server.addr_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut w = dlock_at(&addr, &["leader", "--watch", "-k", "svc"])
        .spawn()
        .expect("dlock leader runs");
    let mut seen = stdout_lines(&mut w);
    assert_eq!(next_line(&mut seen).await, "no leader");
    let mut e = dlock_at(&addr, &["elect", "-k", "svc", "--id", "web-1", "-c", LEAD])
        .env("MARK", dir.path().join("m"))
        .spawn()
        .expect("dlock elect runs");
    let line = next_line(&mut seen).await;
    assert!(line.starts_with("leader web-1 fence "), "{line}");
    signal_pid(pid_of(&e), libc::SIGKILL);
    let _ = e.wait().await;
    assert_eq!(next_line(&mut seen).await, "no leader");
    signal_pid(pid_of(&w), libc::SIGINT);
    let o = wait_output(w).await;
    assert_eq!(code(&o), 0);
    // Usage: exactly one key.
    let o = run_at(&addr, &["leader"]).await;
    assert_eq!(code(&o), 64);
    let o = run_at(&addr, &["elect", "-k", "a", "-k", "b", "--", "true"]).await;
    assert_eq!(code(&o), 64);
}
