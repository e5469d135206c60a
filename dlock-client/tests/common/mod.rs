//! Helpers for running the real `dlock` binary against a real server.
#![allow(dead_code)]

use dlock::Client;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Upper bound for anything a test waits for; only reached on failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// `dlock ARGS` talking to `server` (an address), output piped, no stdin.
pub fn dlock_at(server: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.args(args)
        .env("DLOCK_SERVER", server)
        .env_remove("DLOCK_TOKEN")
        .env_remove("DLOCK_CLIENT_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `dlock ARGS` to the end.
pub async fn run_at(server: &str, args: &[&str]) -> Output {
    tokio::time::timeout(PATIENCE, dlock_at(server, args).output())
        .await
        .expect("dlock finishes")
        .expect("dlock runs")
}

/// Waits (at most PATIENCE) for dlock to end and returns its output.
pub async fn wait_output(child: Child) -> Output {
    tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("dlock finishes")
        .expect("dlock output")
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("dlock exits normally")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub async fn client(addr: &str) -> Client {
    Client::connect(addr).await.expect("connect")
}

/// The next `n` lines the child prints on stdout.
pub async fn lines(child: &mut Child, n: usize) -> Vec<String> {
    let out = child.stdout.as_mut().expect("stdout piped");
    let mut reader = BufReader::new(out);
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while got.len() < n {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                break;
            }
            got.push(line.trim().to_string());
        }
    })
    .await
    .expect("the command prints in time");
    assert_eq!(got.len(), n, "the command ended early: {got:?}");
    got
}

/// Sends `sig` to a process.
pub fn signal_pid(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
}

pub fn pid_of(child: &Child) -> i32 {
    child.id().expect("running") as i32
}

/// The state letter of a process (`R`, `S`, `T`, `Z`, …), `None` if gone.
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Whether a process has ended (gone, or a zombie not yet reaped).
pub fn is_dead(pid: i32) -> bool {
    matches!(state(pid), None | Some('Z') | Some('X'))
}

/// Waits until `pid` is in a state that `ok` accepts.
pub async fn await_state(pid: i32, what: &str, ok: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ok(state(pid)) {
        assert!(
            Instant::now() < deadline,
            "process {pid} never became {what} (state {:?})",
            state(pid)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every one of `pids` has ended.
pub async fn await_all_dead(pids: &[i32]) {
    for &pid in pids {
        await_state(pid, "dead", |s| matches!(s, None | Some('Z') | Some('X'))).await;
    }
}

/// Runs `sh -c SCRIPT` under dlock on `key`, where SCRIPT starts a
/// background child and prints its pid, then its own: returns dlock and both.
pub async fn with_background_child(server: &str, key: &str, stdin: Stdio) -> (Child, Vec<i32>) {
    let mut child = dlock_at(
        server,
        &["-k", key, "-c", "sleep 600 & echo $!; echo $$; wait"],
    )
    .stdin(stdin)
    .spawn()
    .expect("dlock runs");
    let pids = pids(&mut child, 2).await;
    (child, pids)
}

/// The next `n` lines of `child`'s stdout, each a pid.
pub async fn pids(child: &mut Child, n: usize) -> Vec<i32> {
    lines(child, n)
        .await
        .iter()
        .map(|l| l.parse().expect("a pid"))
        .collect()
}
pub mod screen;

/// The key's state as the cluster's nodes other than `except` see it, once
/// one of them leads: its first holder's fence and its waiters.
pub async fn seen_by_the_others(
    nodes: &dlock_server::testing::nodes::NodeProcesses,
    except: usize,
    key: &str,
) -> (u64, u32) {
    let others: Vec<String> = (0..nodes.len())
        .filter(|&i| i != except)
        .map(|i| nodes.addr(i).to_string())
        .collect();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(c) = Client::connect(others.clone()).await {
            if let Ok(info) = c.inspect([key]).await {
                return (info[0].fence().unwrap_or(0), info[0].waiters);
            }
        }
        assert!(Instant::now() < deadline, "no new leader among the others");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
