//! The real `dlock` binary against a real server on 127.0.0.1:0.
//!
//! The server runs in this test's runtime; dlock runs as a child process
//! driven through tokio::process so the server keeps serving meanwhile.
//! Nothing here sleeps to synchronise: tests wait for events (a waiter
//! showing up in Inspect, a line on the child's stdout, a process exiting).

mod common;

use common::{await_all_dead, code, pids, stderr, stdout, wait_output, PATIENCE};
use dlock::{Client, LockOptions};
use dlock_server::testing::TestServer;
use dlock_server::Config;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn dlock(server: &TestServer, args: &[&str]) -> Command {
    common::dlock_at(&server.addr_string(), args)
}

async fn run(server: &TestServer, args: &[&str]) -> Output {
    common::run_at(&server.addr_string(), args).await
}

async fn client(server: &TestServer) -> Client {
    Client::connect(&server.addr_string())
        .await
        .expect("connect")
}

/// Waits until `key` has `n` waiters on the server.
async fn await_waiters(c: &Client, key: &str, n: u32) {
    let deadline = Instant::now() + PATIENCE;
    while c.inspect([key]).await.unwrap()[0].waiters != n {
        assert!(Instant::now() < deadline, "{key} never had {n} waiters");
        tokio::task::yield_now().await;
    }
}

/// Waits until the child prints `line` on stdout; returns what it printed.
async fn await_line(child: &mut Child, line: &str) -> String {
    let out = child.stdout.as_mut().expect("stdout piped");
    let mut lines = BufReader::new(out).lines();
    let mut seen = String::new();
    let found = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push_str(&l);
            seen.push('\n');
            if l.trim() == line {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "command never printed {line:?}");
    seen
}

fn signal(child: &Child, sig: i32) {
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill(2) on our own child process.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_and_signal_death_pass_through() {
    let server = TestServer::start(Config::default()).await;
    assert_eq!(
        code(&run(&server, &["-k", "e", "--", "sh", "-c", "exit 7"]).await),
        7
    );
    assert_eq!(
        code(&run(&server, &["-k", "e", "-c", "kill -9 $$"]).await),
        128 + 9
    );
    assert_eq!(code(&run(&server, &["-k", "e", "--", "true"]).await), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_not_found_and_usage_errors() {
    let server = TestServer::start(Config::default()).await;
    assert_eq!(
        code(&run(&server, &["-k", "e", "--", "/nonexistent/cmd"]).await),
        127
    );
    let no_key = run(&server, &["--", "true"]).await;
    assert_eq!(code(&no_key), 64);
    assert!(stderr(&no_key).contains("-k KEY"));
    assert_eq!(code(&run(&server, &["-k", "a"]).await), 64);
    assert_eq!(
        code(&run(&server, &["-k", "a", "--wiat", "1s", "--", "true"]).await),
        64
    );
    assert_eq!(
        code(&run(&server, &["-k", "a", "-w", "soon", "--", "true"]).await),
        64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_lock_gives_conflict_code_with_nonblock_and_wait() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server).await;
    let _g = holder.lock(["busy"], LockOptions::new()).await.unwrap();
    let o = run(
        &server,
        &["-n", "-k", "busy", "--", "touch", "/nonexistent/ran"],
    )
    .await;
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).is_empty(), "quiet like flock: {}", stderr(&o));
    assert_eq!(
        code(&run(&server, &["-n", "-E", "9", "-k", "busy", "--", "true"]).await),
        9
    );
    let start = Instant::now();
    let o = run(&server, &["-w", "0.2s", "-k", "busy", "--", "true"]).await;
    assert_eq!(code(&o), 1);
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_one_key_never_overlap() {
    let server = TestServer::start(Config::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $(date +%s%N) >> {0}; sleep 0.2; echo end $(date +%s%N) >> {0}",
        log.display()
    );
    let runs: Vec<_> = (0..3)
        .map(|_| {
            dlock(&server, &["-k", "one", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    for r in runs {
        assert_eq!(code(&wait_output(r).await), 0);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(String, u128)> = text
        .lines()
        .map(|l| {
            let (what, t) = l.split_once(' ').unwrap();
            (what.to_string(), t.parse().unwrap())
        })
        .collect();
    assert_eq!(events.len(), 6);
    // Strict alternation start, end, start, end...: no two runs overlapped.
    for (i, (what, _)) in events.iter().enumerate() {
        assert_eq!(what, if i % 2 == 0 { "start" } else { "end" }, "{text}");
    }
    assert!(events.windows(2).all(|w| w[0].1 <= w[1].1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_keys_are_taken_atomically() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server).await;
    let _g = holder.lock(["k2"], LockOptions::new()).await.unwrap();
    let o = run(&server, &["-n", "-k", "k1", "-k", "k2", "--", "true"]).await;
    assert_eq!(code(&o), 1);
    assert_eq!(
        holder.inspect(["k1"]).await.unwrap()[0]
            .fence()
            .unwrap_or(0),
        0,
        "k1 was not taken alone"
    );
    let o = run(
        &server,
        &["-k", "k1", "-k", "k3", "--", "sh", "-c", "echo $DLOCK_KEYS"],
    )
    .await;
    assert_eq!(stdout(&o).trim(), "k1,k3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_key_agrees_for_the_same_command() {
    let server = TestServer::start(Config::default()).await;
    let show = ["--auto-key", "--", "sh", "-c", "echo $DLOCK_KEYS"];
    let a = stdout(&run(&server, &show).await);
    let b = stdout(&run(&server, &show).await);
    assert_eq!(a, b);
    assert!(a.starts_with("auto:"));
    let other = stdout(
        &run(
            &server,
            &["--auto-key", "--", "sh", "-c", "echo $DLOCK_KEYS "],
        )
        .await,
    );
    assert_ne!(a, other);
    let prefixed = stdout(&run(&server, &["--auto-key=cron/", "-c", "echo $DLOCK_KEYS"]).await);
    assert!(prefixed.starts_with("cron/"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_increases_between_runs() {
    let server = TestServer::start(Config::default()).await;
    let show = ["-k", "f", "-c", "echo $DLOCK_FENCE"];
    let a: u64 = stdout(&run(&server, &show).await).trim().parse().unwrap();
    let b: u64 = stdout(&run(&server, &show).await).trim().parse().unwrap();
    assert!(b > a, "{b} not above {a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_keeps_the_lock_after_dlock_exits() {
    let server = TestServer::start(Config::default()).await;
    let start = Instant::now();
    let o = run(&server, &["--hold", "1s", "-k", "cron", "--", "true"]).await;
    assert_eq!(code(&o), 0);
    let c = client(&server).await;
    let info = c.inspect(["cron"]).await.unwrap().remove(0);
    if info.fence().is_some() {
        // dlock exited early and left the rest of the hold as a lease.
        assert!(
            info.first().and_then(|h| h.lease_remaining).is_some(),
            "held, but not as a lease"
        );
    } else {
        // Only a machine too slow to inspect within the hold may find the
        // key free, and then the whole hold has passed.
        assert!(
            start.elapsed() >= Duration::from_secs(1),
            "released before the hold ended"
        );
    }
    let g = c
        .lock(["cron"], LockOptions::new().wait(PATIENCE))
        .await
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "released only after the hold"
    );
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_time_stops_the_command() {
    let server = TestServer::start(Config::default()).await;
    let start = Instant::now();
    let o = run(
        &server,
        &[
            "--max-time",
            "200ms",
            "--grace",
            "1s",
            "-k",
            "m",
            "--",
            "sleep",
            "30",
        ],
    )
    .await;
    assert_eq!(code(&o), 124);
    assert!(stderr(&o).contains("--max-time"));
    assert!(start.elapsed() < Duration::from_secs(25));
    assert_eq!(
        client(&server).await.inspect(["m"]).await.unwrap()[0]
            .fence()
            .unwrap_or(0),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_stops_the_command() {
    let server = TestServer::start(Config::default()).await;
    let mut child = dlock(
        &server,
        &[
            "--grace",
            "1s",
            "-k",
            "l",
            "-c",
            "echo ready; exec sleep 30",
        ],
    )
    .spawn()
    .unwrap();
    await_line(&mut child, "ready").await;
    let start = Instant::now();
    server.stop().await.unwrap();
    let o = wait_output(child).await;
    assert_eq!(code(&o), 75);
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_released_under_dlock_kills_a_command_that_ignores_sigterm_at_once() {
    let server = TestServer::start(Config::default()).await;
    let mut child = dlock(
        &server,
        &[
            "--lease",
            "1s",
            "--grace",
            "60s",
            "-k",
            "gone",
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 1; done",
        ],
    )
    .spawn()
    .unwrap();
    await_line(&mut child, "ready").await;
    // Someone releases the lease by its fence: the next renewal hears
    // NotHeld, and the key may be anyone's already.
    let other = client(&server).await;
    let fence = other.inspect(["gone"]).await.unwrap()[0]
        .fence()
        .expect("held");
    other.unlock_fence(["gone"], fence).await.unwrap();
    let taken = other.lock("gone", LockOptions::default()).await.unwrap();
    let o = tokio::time::timeout(Duration::from_secs(30), wait_output(child))
        .await
        .expect("COMMAND killed long before its 60 s of grace");
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("no longer held"), "{}", stderr(&o));
    // dlock's own SIGKILL, not only the guardian's at the lease's end.
    assert!(
        stderr(&o).contains("(SIGTERM, SIGKILL in 0.0s)"),
        "{}",
        stderr(&o)
    );
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_to_the_command() {
    let server = TestServer::start(Config::default()).await;
    let script = "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = dlock(&server, &["-k", "sig", "-c", script])
        .spawn()
        .unwrap();
    await_line(&mut child, "ready").await;
    signal(&child, libc::SIGTERM);
    let o = wait_output(child).await;
    assert_eq!(code(&o), 3);
    assert!(stdout(&o).contains("got-term"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_while_waiting_does_not_run_the_command() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server).await;
    let _g = holder.lock(["wait"], LockOptions::new()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let child = dlock(
        &server,
        &["-k", "wait", "--", "touch", marker.to_str().unwrap()],
    )
    .spawn()
    .unwrap();
    await_waiters(&holder, "wait", 1).await;
    signal(&child, libc::SIGINT);
    let o = wait_output(child).await;
    assert_eq!(code(&o), 130);
    assert!(!marker.exists());
    await_waiters(&holder, "wait", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_token_from_env_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "letmein\n").unwrap();
    let server = TestServer::start(Config {
        token_file: Some(tokens.to_path_buf()),
        ..Config::default()
    })
    .await;
    let denied = run(&server, &["-k", "t", "--", "true"]).await;
    assert_eq!(code(&denied), 77);
    assert!(stderr(&denied).contains("DLOCK_TOKEN"));
    let o = dlock(&server, &["-k", "t", "--", "true"])
        .env("DLOCK_TOKEN", "letmein")
        .output()
        .await
        .unwrap();
    assert_eq!(code(&o), 0);
    let client_token = dir.path().join("client-token");
    std::fs::write(&client_token, "letmein\n").unwrap();
    let o = run(
        &server,
        &[
            "--token-file",
            client_token.to_str().unwrap(),
            "-k",
            "t",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code(&o), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_says_what_it_waits_for_and_who_holds_it() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server).await;
    let g = holder.lock(["v"], LockOptions::new()).await.unwrap();
    let child = dlock(&server, &["-v", "-k", "v", "--", "true"])
        .spawn()
        .unwrap();
    await_waiters(&holder, "v", 1).await;
    g.unlock().await.unwrap();
    let o = wait_output(child).await;
    assert_eq!(code(&o), 0);
    let err = stderr(&o);
    assert!(
        err.contains("waiting for \"v\": held by 127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains("acquired v"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_clear_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let server = TestServer::start(Config::default()).await;
    let o = run(&server, &["--server", &addr, "-k", "x", "--", "true"]).await;
    assert_eq!(code(&o), 69);
    let err = stderr(&o);
    assert!(
        err.contains(&addr) && err.contains("is dlock-server running"),
        "{err}"
    );
    assert_eq!(
        code(&run(&server, &["--server", &addr, "--ping"]).await),
        69
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_inspect() {
    let server = TestServer::start(Config::default()).await;
    let o = run(&server, &["--ping"]).await;
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains(" ok "));
    // An empty key: refused as a usage error, as on the lock path.
    let o = run(&server, &["--inspect", "-k", ""]).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    let o = run(&server, &["--ping", "-o", "json"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["rtt_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{v}");
    assert_eq!(v["cluster_leader"], false, "{v}");
    let holder = client(&server).await;
    let g = holder.lock(["shown"], LockOptions::new()).await.unwrap();
    let o = run(&server, &["--inspect", "-k", "shown", "-k", "free"]).await;
    assert_eq!(code(&o), 0);
    let out = stdout(&o);
    assert!(out.contains(&g.fence().to_string()), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("\"free\" ") && l.contains(" free ")),
        "{out}"
    );
    // The same, for a script.
    let o = run(
        &server,
        &["--inspect", "-o", "json", "-k", "shown", "-k", "free"],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["keys"][0]["key"], "shown");
    assert_eq!(v["keys"][0]["state"], "held");
    assert_eq!(v["keys"][0]["holders"][0]["fence"], g.fence());
    assert_eq!(v["keys"][1]["state"], "free");
    assert!(v["leader"].is_null(), "a single server has no leader: {v}");
    let o = run(&server, &["--inspect", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(v["held_keys"], 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_renews_and_is_released_at_the_end() {
    let server = TestServer::start(Config::default()).await;
    let probe = client(&server).await;
    // The command outlives several lease lengths, so only renewals keep it.
    let mut child = dlock(
        &server,
        &[
            "--lease",
            "300ms",
            "-k",
            "lease",
            "-c",
            "echo ready; sleep 1; echo done",
        ],
    )
    .spawn()
    .unwrap();
    await_line(&mut child, "ready").await;
    let o = wait_output(child).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("done"));
    let info = probe.inspect(["lease"]).await.unwrap().remove(0);
    assert_eq!(
        info.fence(),
        None,
        "released at the end, not left to expire"
    );
}

/// A loopback TCP proxy whose connections can be cut while it keeps
/// accepting new ones: a brief network drop between dlock and the server.
struct Proxy {
    addr: String,
    cut: tokio::sync::broadcast::Sender<()>,
}

impl Proxy {
    async fn start(target: std::net::SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (cut, _) = tokio::sync::broadcast::channel(1);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.recv() => {}
                    }
                });
            }
        });
        Proxy { addr, cut }
    }

    fn cut_all(&self) {
        let _ = self.cut.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_survives_a_dropped_connection() {
    let server = TestServer::start(Config::default()).await;
    let proxy = Proxy::start(server.addr).await;
    let probe = client(&server).await;
    let script = "echo ready; read _; echo done";
    let mut child = dlock(
        &server,
        &[
            "-v",
            "--server",
            &proxy.addr,
            "--lease",
            "5s",
            "-k",
            "net",
            "-c",
            script,
        ],
    )
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    await_line(&mut child, "ready").await;
    let fence = probe.inspect(["net"]).await.unwrap()[0]
        .fence()
        .unwrap_or(0);
    let mut stderr_lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    proxy.cut_all();
    let mut seen = String::new();
    let renewed = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(l)) = stderr_lines.next_line().await {
            seen.push_str(&l);
            seen.push('\n');
            if l.contains("lease renewed by its fencing token") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(renewed, Ok(true), "dlock never reconnected: {seen}");
    // Still the same grant: the lease was kept, not lost and taken again.
    assert_eq!(
        probe.inspect(["net"]).await.unwrap()[0].fence(),
        Some(fence)
    );
    drop(child.stdin.take());
    let o = wait_output(child).await;
    assert_eq!(code(&o), 0, "{seen}");
    assert!(stdout(&o).contains("done"));
    assert_eq!(
        probe.inspect(["net"]).await.unwrap()[0]
            .fence()
            .unwrap_or(0),
        0,
        "released at the end"
    );
}

#[tokio::test]
async fn shared_holders_overlap_a_writer_is_busy_and_inspect_lists_every_holder() {
    let server = TestServer::start(Config::default()).await;
    let a = client(&server).await;
    let b = client(&server).await;
    let _ga = a
        .lock(["config"], LockOptions::new().shared())
        .await
        .expect("a reads");
    let _gb = b
        .lock(["config"], LockOptions::new().shared().no_wait())
        .await
        .expect("b reads alongside a");

    let out = run(&server, &["--shared", "-n", "-k", "config", "--", "true"]).await;
    assert_eq!(code(&out), 0, "a third reader: {}", stderr(&out));
    let out = run(&server, &["-n", "-k", "config", "--", "true"]).await;
    assert_eq!(code(&out), 1, "a writer is busy: {}", stderr(&out));
    let out = run(
        &server,
        &["--limit", "2", "-n", "-k", "config", "--", "true"],
    )
    .await;
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("limit"), "{}", stderr(&out));

    let out = run(&server, &["--inspect", "-k", "config"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("shared")).collect();
    assert_eq!(rows.len(), 2, "{text}");
}

#[tokio::test]
async fn a_semaphore_admits_its_limit_and_the_next_is_busy() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let _one = c.lock(["pool"], LockOptions::new().limit(2)).await.unwrap();
    let _two = c.lock(["pool"], LockOptions::new().limit(2)).await.unwrap();
    let out = run(&server, &["--limit", "2", "-n", "-k", "pool", "--", "true"]).await;
    assert_eq!(code(&out), 1, "the third is busy: {}", stderr(&out));
    let out = run(&server, &["--inspect", "-k", "pool"]).await;
    assert!(stdout(&out).contains("shared 2/2"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_queued_runs_once_when_the_request_waits_and_before_the_command() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let holder = c.lock(["oq"], LockOptions::new()).await.unwrap();
    let mut child = dlock(
        &server,
        &[
            "--on-queued",
            "echo hook $DLOCK_PLACE $DLOCK_KEYS",
            "-k",
            "oq",
            "--",
            "echo",
            "cmd",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("spawn dlock");
    // The hook ran while the request waits in line: nothing holds "oq"
    // but the holder, and its place is first.
    let seen = await_line(&mut child, "hook 0 oq").await;
    assert_eq!(seen, "hook 0 oq\n");
    assert_eq!(c.inspect(["oq"]).await.unwrap()[0].waiters, 1);
    holder.unlock().await.unwrap();
    let out = wait_output(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "cmd\n", "the command after the hook, once");
}

/// `-w` counts from the Enqueue, hook or no hook: the request that runs
/// out while a slow hook runs is reported then (the hook killed), not when
/// the hook ends, which overran the wait by the hook's whole length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_queued_does_not_hold_a_wait_past_its_limit() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let _holder = c.lock(["oq-w"], LockOptions::new()).await.unwrap();
    let child = dlock(
        &server,
        &[
            "-v",
            "-w",
            "300ms",
            "--on-queued",
            "exec sleep 600",
            "-k",
            "oq-w",
            "--",
            "echo",
            "cmd",
        ],
    )
    .spawn()
    .expect("spawn dlock");
    let out = wait_output(child).await;
    assert_eq!(code(&out), 1, "busy: {}", stderr(&out));
    assert!(stderr(&out).contains("lock busy: oq-w"), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no command");
}

/// dlock waiting on `key` (held by someone else) with `extra` flags and a
/// hook that starts a background `sleep` and waits for it: dlock, and the
/// pids of the `sleep` and of the hook's shell, once the hook runs.
async fn queued_with_hook(server: &TestServer, extra: &[&str], key: &str) -> (Child, Vec<i32>) {
    let mut args = extra.to_vec();
    args.extend([
        "--on-queued",
        "sleep 600 & echo $!; echo $$; wait",
        "-k",
        key,
        "--",
        "echo",
        "cmd",
    ]);
    let mut child = dlock(server, &args).spawn().expect("spawn dlock");
    let pids = pids(&mut child, 2).await;
    (child, pids)
}

/// Killing the hook's shell alone left what it started running, reparented
/// to init: the hook's whole process group goes when the wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_queued_hook_and_what_it_started_are_killed_when_the_wait_runs_out() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let _holder = c.lock(["oq-g"], LockOptions::new()).await.unwrap();
    let (child, pids) = queued_with_hook(&server, &["-w", "1500ms"], "oq-g").await;
    let out = wait_output(child).await;
    assert_eq!(code(&out), 1, "busy: {}", stderr(&out));
    await_all_dead(&pids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_queued_hook_and_what_it_started_are_killed_when_dlock_is_interrupted() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let _holder = c.lock(["oq-i"], LockOptions::new()).await.unwrap();
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let (child, pids) = queued_with_hook(&server, &[], "oq-i").await;
        signal(&child, sig);
        let out = wait_output(child).await;
        assert_eq!(code(&out), 128 + sig, "{}", stderr(&out));
        await_all_dead(&pids).await;
    }
}

/// dlock SIGKILLed cannot clean up: the hook's shell dies with it
/// (PR_SET_PDEATHSIG), the rest of its group by the hook's guardian.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_queued_hook_and_what_it_started_are_killed_when_dlock_is_killed() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let _holder = c.lock(["oq-k"], LockOptions::new()).await.unwrap();
    let (mut child, pids) = queued_with_hook(&server, &[], "oq-k").await;
    signal(&child, libc::SIGKILL);
    let _ = child.wait().await;
    await_all_dead(&pids).await;
}

/// The README: COMMAND starts once both the grant and the hook are done; a
/// grant while the hook runs does not kill it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_while_the_hook_runs_waits_for_the_hook() {
    let server = TestServer::start(Config::default()).await;
    let c = client(&server).await;
    let holder = c.lock(["oq-h"], LockOptions::new()).await.unwrap();
    let dir = tempfile::tempdir().expect("temp dir");
    let go = dir.path().join("go");
    let mut child = dlock(
        &server,
        &[
            "--on-queued",
            "echo hook; until [ -e \"$GO\" ]; do sleep 0.01; done; echo hook done",
            "-k",
            "oq-h",
            "--",
            "echo",
            "cmd",
        ],
    )
    .env("GO", &go)
    .spawn()
    .expect("spawn dlock");
    assert_eq!(await_line(&mut child, "hook").await, "hook\n");
    holder.unlock().await.unwrap();
    // Granted to dlock, whose hook still runs.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let info = c.inspect(["oq-h"]).await.unwrap().remove(0);
        if !info.holders.is_empty() && info.waiters == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "never granted to dlock");
        tokio::task::yield_now().await;
    }
    std::fs::write(&go, "").expect("write go");
    let out = wait_output(child).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hook done\ncmd\n");
}

/// Below the minimum the lease was lost to scheduling, the guardian
/// killing COMMAND (137) or dlock finding it in jeopardy (75), run after run.
#[tokio::test]
async fn a_lease_too_short_to_renew_is_refused_with_the_minimum() {
    let server = TestServer::start(Config::default()).await;
    let out = run(&server, &["--lease", "10ms", "-k", "short", "--", "true"]).await;
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("minimum is 100ms"),
        "{}",
        stderr(&out)
    );
    let c = client(&server).await;
    assert!(c.inspect(["short"]).await.unwrap()[0].holders.is_empty());
}

#[tokio::test]
async fn on_queued_does_not_run_when_the_lock_is_granted_at_once() {
    let server = TestServer::start(Config::default()).await;
    let out = run(
        &server,
        &[
            "--on-queued",
            "echo hook",
            "-k",
            "free",
            "--",
            "echo",
            "cmd",
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "cmd\n");
    // It never goes with --nonblock, where nothing waits in line.
    let out = run(
        &server,
        &["--on-queued", "echo hook", "-n", "-k", "free", "--", "true"],
    )
    .await;
    assert_eq!(code(&out), 64, "{}", stderr(&out));
}

/// A subcommand after an option of the lock form was read as COMMAND, and
/// dlock said "no key given" though `-k` followed; it names the mistake,
/// before connecting.
#[tokio::test]
async fn a_subcommand_after_a_lock_option_is_named_as_the_mistake() {
    let o = common::run_at(
        "127.0.0.1:1",
        &["--lease", "5s", "elect", "-k", "e", "--", "true"],
    )
    .await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`elect` is a subcommand: name it before its options"),
        "{}",
        stderr(&o)
    );
}
