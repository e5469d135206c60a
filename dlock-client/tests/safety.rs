//! `dlock` never lets two holders run at once: it stops COMMAND before the
//! server could hand the lock to someone else, whatever fails (a frozen
//! network path, a paused or killed dlock), and every exit is bounded.
//!
//! The frozen path is a forwarder between dlock and the server that passes
//! nothing while both sockets stay open. Each test asserts the order of two
//! events, never wall-clock figures: when a second client is granted the key,
//! COMMAND is already dead.

mod common;

use common::*;
use dlock::LockOptions;
use dlock_server::testing::proxy::FreezableProxy;
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::process::Stdio;
use std::time::Duration;

/// COMMAND that prints its pid and ignores SIGTERM: only the SIGKILL that
/// dlock sends before the deadline (or its guardian) can stop it.
const STUBBORN: &str = "trap '' TERM; echo $$; exec sleep 600";

/// Runs `dlock ARGS -k part -c STUBBORN` through a forwarder, freezes it,
/// and checks COMMAND is dead by the time a direct client gets the key.
async fn frozen_path_stops_command_first(server: &TestServer, args: &[&str]) {
    let proxy = FreezableProxy::start(server.addr).await;
    let mut all = args.to_vec();
    all.extend(["-k", "part", "-c", STUBBORN]);
    let mut child = dlock_at(&proxy.addr_string(), &all).spawn().unwrap();
    let pid: i32 = lines(&mut child, 1).await[0].parse().unwrap();
    let other = client(&server.addr_string()).await;
    let waiting = tokio::spawn(async move { other.lock(["part"], LockOptions::new()).await });
    proxy.freeze();
    let second = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the server hands the key on")
        .unwrap()
        .expect("granted");
    assert!(
        is_dead(pid),
        "COMMAND still ran when the key was granted to another client"
    );
    let o = wait_output(child).await;
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
    second.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_path_stops_the_command_before_an_idle_server_hands_the_lock_on() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(3),
        ..Config::default()
    })
    .await;
    frozen_path_stops_command_first(&server, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_path_stops_the_command_before_its_lease_runs_out() {
    let server = TestServer::start(Config::default()).await;
    frozen_path_stops_command_first(&server, &["--lease", "3s"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_dlock_cannot_leave_its_command_running() {
    // A 1 s margin: the guardian acts a quarter of it before the deadline.
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(4),
        ..Config::default()
    })
    .await;
    let mut child = dlock_at(&server.addr_string(), &["-k", "paused", "-c", STUBBORN])
        .spawn()
        .unwrap();
    let pid: i32 = lines(&mut child, 1).await[0].parse().unwrap();
    let other = client(&server.addr_string()).await;
    let waiting = tokio::spawn(async move { other.lock(["paused"], LockOptions::new()).await });
    // dlock stops pinging; its guardian must act in its place.
    signal_pid(pid_of(&child), libc::SIGSTOP);
    let second = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the server hands the key on")
        .unwrap()
        .expect("granted");
    let dead = is_dead(pid);
    signal_pid(pid_of(&child), libc::SIGCONT);
    let o = wait_output(child).await;
    assert!(
        dead,
        "COMMAND still ran while dlock was paused: {}",
        stderr(&o)
    );
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("guardian"), "{}", stderr(&o));
    second.unlock().await.unwrap();
}

/// The guardian of the dlock `parent`, once it runs.
async fn guardian_of(parent: i32) -> i32 {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let found = std::fs::read_dir("/proc").ok().and_then(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .find(|pid| {
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    let ppid = stat
                        .rfind(')')
                        .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                        .and_then(|p| p.parse::<i32>().ok());
                    ppid == Some(parent)
                        && cmdline.split(|&b| b == 0).any(|a| a == b"__dlock_guardian")
                })
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dlock {parent} has no guardian"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A guardian whose deadline passes while dlock is alive and the lock
/// still held (dlock too slow to move it on, as with a lease of 10ms) kills
/// COMMAND: dlock exits 75, COMMAND stopped for the lock's sake, not with
/// COMMAND's 137, and still releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_its_guardian_killed_ends_dlock_with_75() {
    let server = TestServer::start(Config::default()).await;
    let mut child = dlock_at(&server.addr_string(), &["-k", "gk", "-c", STUBBORN])
        .spawn()
        .unwrap();
    let pid: i32 = lines(&mut child, 1).await[0].parse().unwrap();
    let guardian = guardian_of(pid_of(&child)).await;
    // A stale deadline, as a slow dlock leaves it, written on the guardian's
    // own pipe from dlock (a tag, then CLOCK_MONOTONIC ns big-endian: 1 is
    // long past).
    let mut message = [0u8; 9];
    message[0] = b'D';
    message[1..].copy_from_slice(&1u64.to_be_bytes());
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{guardian}/fd/0"))
        .and_then(|mut pipe| std::io::Write::write_all(&mut pipe, &message))
        .expect("write to the guardian's pipe");
    let o = wait_output(child).await;
    assert!(is_dead(pid));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("guardian"), "{}", stderr(&o));
    let c = client(&server.addr_string()).await;
    assert!(
        c.inspect(["gk"]).await.unwrap()[0].holders.is_empty(),
        "released: {}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_dlock_kills_the_command_and_its_group() {
    let server = TestServer::start(Config::default()).await;
    let (child, pids) = with_background_child(&server.addr_string(), "sigk", Stdio::null()).await;
    signal_pid(pid_of(&child), libc::SIGKILL);
    await_all_dead(&pids).await;
    let _ = wait_output(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_after_the_command_is_bounded_when_the_server_stops_answering() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let mut child = dlock_at(
        &proxy.addr_string(),
        &[
            "--release-timeout",
            "1s",
            "-k",
            "rel",
            "-c",
            "echo ready; read _; exit 4",
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    lines(&mut child, 1).await;
    proxy.freeze();
    drop(child.stdin.take());
    let o = wait_output(child).await;
    assert_eq!(code(&o), 4, "the command's code: {}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("did not answer the release") && err.contains("when the connection closes"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_beyond_the_servers_maximum_lease_is_refused_before_the_command_runs() {
    let server = TestServer::start(Config::default()).await;
    let o = run_at(
        &server.addr_string(),
        &["--hold", "31d", "-k", "h", "-c", "echo ran"],
    )
    .await;
    assert_eq!(code(&o), 64);
    assert_eq!(stdout(&o), "", "the command must not run");
    assert!(
        stderr(&o).contains("--hold 31days exceeds the server's maximum lease of 30days"),
        "{}",
        stderr(&o)
    );
    let o = run_at(
        &server.addr_string(),
        &["--lease", "40days", "-k", "h", "-c", "echo ran"],
    )
    .await;
    assert_eq!(code(&o), 64);
    let long_key = "k".repeat(2000);
    let o = run_at(&server.addr_string(), &["-k", &long_key, "-c", "echo ran"]).await;
    assert_eq!(code(&o), 64);
    assert!(stderr(&o).contains("at most 1024"), "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_server_idle_timeout_does_not_kill_a_held_lock() {
    let server = TestServer::start(Config {
        idle_timeout: Duration::from_secs(2),
        ..Config::default()
    })
    .await;
    // Two and a half idle timeouts of a quiet command.
    let o = run_at(&server.addr_string(), &["-k", "idle", "--", "sleep", "5"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_ignore_still_exits_75() {
    let server = TestServer::start(Config::default()).await;
    let mut child = dlock_at(
        &server.addr_string(),
        &[
            "--on-lost",
            "ignore",
            "-k",
            "ign",
            "-c",
            "echo ready; read _",
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    lines(&mut child, 1).await;
    let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap());
    server.stop().await.unwrap();
    // The command keeps running after the loss, until it ends by itself.
    let mut line = String::new();
    tokio::time::timeout(PATIENCE, async {
        while !line.contains("keeps running") {
            line.clear();
            tokio::io::AsyncBufReadExt::read_line(&mut err, &mut line)
                .await
                .unwrap();
        }
    })
    .await
    .expect("dlock reports the loss");
    drop(child.stdin.take());
    let o = wait_output(child).await;
    assert_eq!(code(&o), 75);
}

/// Interrupted while it waits with a lease, dlock gives the wait up. The
/// server granted the lease just before (its answer held in the frozen
/// path as SIGINT came): dlock releases it before it exits, not leaving
/// the key held by nobody for the lease's hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granted_as_dlock_is_interrupted_while_waiting_is_released_before_it_exits() {
    let server = TestServer::start(Config::default()).await;
    let proxy = FreezableProxy::start(server.addr).await;
    let holder = client(&server.addr_string()).await;
    let held = holder.lock(["intr"], LockOptions::new()).await.unwrap();
    let mut child = dlock_at(
        &proxy.addr_string(),
        &["--lease", "1h", "-k", "intr", "-c", "true"],
    )
    .spawn()
    .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while holder.inspect(["intr"]).await.unwrap()[0].waiters != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dlock's Lock never arrived"
        );
        tokio::task::yield_now().await;
    }
    proxy.freeze();
    held.unlock().await.unwrap();
    let state = holder.inspect(["intr"]).await.unwrap().remove(0);
    assert!(
        state.first().and_then(|h| h.lease_remaining).is_some(),
        "dlock holds the lease now: {state:?}"
    );
    signal_pid(pid_of(&child), libc::SIGINT);
    // dlock has given the wait up once it says so; only then may the
    // grant reach it.
    let err = child.stderr.take().expect("stderr piped");
    let mut err = tokio::io::BufReader::new(err);
    let mut line = String::new();
    tokio::time::timeout(
        PATIENCE,
        tokio::io::AsyncBufReadExt::read_line(&mut err, &mut line),
    )
    .await
    .expect("dlock says it was interrupted")
    .unwrap();
    assert!(line.contains("interrupted by SIGINT"), "{line}");
    proxy.thaw();
    let o = wait_output(child).await;
    assert_eq!(code(&o), 130, "{line}");
    match holder
        .lock(["intr"], LockOptions::new().wait(PATIENCE))
        .await
    {
        Ok(g) => g.unlock().await.unwrap(),
        Err(e) => panic!("the lease granted as dlock was interrupted stays held: {e}"),
    }
}
