//! `dlock elect` and `dlock leader` against a real server: a command runs
//! only while its dlock leads, the next campaigner's command starts only
//! once the first dlock is killed, a lost leadership stops the command and
//! campaigns again (or exits 75 with --once), and `dlock leader` prints the
//! leader, or every change with --watch; both outlive a restart of their
//! server.

mod common;

use common::{client, code, dlock_at, pid_of, run_at, signal_pid, stdout, wait_output, PATIENCE};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::net::SocketAddr;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The child's stdout, line by line (one reader for its whole life, so no
/// buffered line is lost between reads).
fn stdout_lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout piped")).lines()
}

/// The child's stderr, line by line, as [`stdout_lines`].
fn stderr_lines(child: &mut Child) -> Lines<BufReader<ChildStderr>> {
    BufReader::new(child.stderr.take().expect("stderr piped")).lines()
}

async fn next_line<R: AsyncBufRead + Unpin>(lines: &mut Lines<R>) -> String {
    tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("a line in time")
        .expect("read stdout")
        .expect("a line, not the end")
}

/// Reads `lines` (a dlock's stderr) up to the first that contains `what`;
/// fails, with what it read, when dlock ends first.
async fn line_containing<R: AsyncBufRead + Unpin>(lines: &mut Lines<R>, what: &str) -> String {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if line.contains(what) {
                return Some(line);
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        Ok(None) => panic!("dlock ended before saying {what:?}; it said: {seen:#?}"),
        Err(_) => panic!("dlock did not say {what:?} in time; it said: {seen:#?}"),
    }
}

/// The fencing token in a line of [`LEAD`].
/// Resolves once the server at `addr` has a request waiting in line for
/// `svc`: the second campaigner queued.
async fn until_one_waits(addr: &str) {
    let probe = client(addr).await;
    tokio::time::timeout(PATIENCE, async {
        while probe.inspect(["svc"]).await.expect("inspect")[0].waiters != 1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("b queues");
}

fn fence_of(line: &str) -> u64 {
    line.strip_prefix("leading ")
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("not a line of LEAD: {line:?}"))
}

/// A single in-memory server on `addr`, which the test chose so that the
/// server can be stopped and started again there, as a restart is.
struct Server {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(addr: SocketAddr) -> Server {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the server's port");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            dlock_server::run(listener, Config::default(), async {
                let _ = stopped.await;
            })
            .await
            .expect("the server runs");
        });
        Server { stop, task }
    }

    /// Stops it as SIGTERM does; its port is free again on return.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the server stops in time")
            .expect("the server did not panic");
    }
}

/// A port for [`Server`]: below the ephemeral range, so that no connection
/// of another test is given it while the server is down.
fn restartable_addr() -> SocketAddr {
    let (addr, held) = dlock_server::testing::ports::reserve();
    drop(held);
    addr
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
    until_one_waits(&addr).await;
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

#[tokio::test]
async fn elect_waits_out_a_restart_of_its_server_and_campaigns_again() {
    let port = restartable_addr();
    let server = Server::start(port).await;
    let addr = port.to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let spawn = |id: &str| {
        dlock_at(&addr, &["elect", "-k", "svc", "--id", id, "-c", LEAD])
            .env("MARK", dir.path().join(id))
            .spawn()
            .expect("dlock elect runs")
    };
    // a leads, b waits in line behind it.
    let mut a = spawn("a");
    let (mut a_out, mut a_err) = (stdout_lines(&mut a), stderr_lines(&mut a));
    let first = fence_of(&next_line(&mut a_out).await);
    let mut b = spawn("b");
    let (mut b_out, mut b_err) = (stdout_lines(&mut b), stderr_lines(&mut b));
    until_one_waits(&addr).await;

    // The server goes away: the leader loses its leadership, the waiter
    // its place, and both wait for the server instead of exiting.
    server.stop().await;
    line_containing(&mut a_err, "trying again until it answers").await;
    line_containing(&mut b_err, "trying again until it answers").await;

    // Back at the same address: both campaign again and one leads.
    let server = Server::start(port).await;
    let (leader, mut other, mut other_out) = tokio::select! {
        line = next_line(&mut a_out) => {
            assert!(fence_of(&line) > first, "{line}");
            (a, b, b_out)
        }
        line = next_line(&mut b_out) => {
            assert!(fence_of(&line) > first, "{line}");
            (b, a, a_out)
        }
    };
    // When it goes, the other leads: both really are in the election.
    signal_pid(pid_of(&leader), libc::SIGTERM);
    assert_eq!(code(&wait_output(leader).await), 143);
    let line = next_line(&mut other_out).await;
    assert!(fence_of(&line) > first, "{line}");
    signal_pid(pid_of(&other), libc::SIGTERM);
    let status = tokio::time::timeout(PATIENCE, other.wait())
        .await
        .expect("dlock ends in time")
        .expect("dlock's status");
    assert_eq!(status.code(), Some(143));
    server.stop().await;
}

#[tokio::test]
async fn leader_watch_reconnects_after_a_restart_of_its_server_and_goes_on() {
    let port = restartable_addr();
    let server = Server::start(port).await;
    let addr = port.to_string();
    let mut w = dlock_at(&addr, &["leader", "--watch", "-k", "svc"])
        .spawn()
        .expect("dlock leader runs");
    let (mut seen, mut said) = (stdout_lines(&mut w), stderr_lines(&mut w));
    assert_eq!(next_line(&mut seen).await, "no leader");

    server.stop().await;
    line_containing(&mut said, "reconnecting").await;
    line_containing(&mut said, "trying again until it answers").await;
    let server = Server::start(port).await;
    line_containing(&mut said, "answers again").await;

    // Still no leader: no line for it again; the next is the next change.
    let holder = client(&addr).await;
    let guard = holder
        .lock_with_value("svc", dlock::LockOptions::default(), "web-2")
        .await
        .expect("lock");
    let line = next_line(&mut seen).await;
    assert!(line.starts_with("leader web-2 fence "), "{line}");
    signal_pid(pid_of(&w), libc::SIGINT);
    assert_eq!(code(&wait_output(w).await), 0);
    drop(guard);
    server.stop().await;
}
