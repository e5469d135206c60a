//! `dlock-server local-cluster`, as a newcomer runs it: the line it prints
//! is enough to take a lock, the cluster goes on when its leader is
//! killed, and Ctrl-C (SIGINT) stops every node.

use dlock::{Client, ClientOptions, LockOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A node as the command lists it: client address and pid.
struct Listed {
    addr: String,
    pid: i32,
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// The lines after the export line, still to be read.
type Rest = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// Starts `local-cluster` with `args` on `folder` and reads what it prints
/// up to its export line: the nodes listed and the servers to export.
async fn start(
    folder: &std::path::Path,
    args: &[&str],
) -> (std::process::Child, Vec<Listed>, String, Rest) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .arg("local-cluster")
        .args(args)
        .arg("--dir")
        .arg(folder)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = cmd.stdout.take().unwrap();
    let (listed, servers, rest) = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut listed = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(list) = line.strip_prefix("export DLOCK_SERVER=") {
                return (listed, list.to_owned(), lines);
            }
            // "  node 1  127.0.0.1:7436  pid 4242  log DIR/node1.log"
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"node") {
                listed.push(Listed {
                    addr: w[2].to_owned(),
                    pid: w[4].parse().unwrap(),
                });
            }
        }
        panic!("the command ended without an export line");
    })
    .await
    .unwrap();
    (cmd, listed, servers, rest)
}

/// Stops `cmd` with SIGINT and returns what it printed after the export
/// line, once it exited 0.
async fn stop(cmd: std::process::Child, rest: Rest) -> Vec<String> {
    let mut cmd = cmd;
    assert!(signal(cmd.id() as i32, libc::SIGINT));
    let status = tokio::task::spawn_blocking(move || cmd.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    rest.map_while(Result::ok).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_serves_through_a_leader_kill_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("cluster");
    let (cmd, listed, servers, rest) = start(&folder, &["--port", "0"]).await;
    assert_eq!(listed.len(), 3);
    let addrs: Vec<&str> = listed.iter().map(|n| n.addr.as_str()).collect();
    assert_eq!(servers, addrs.join(","));

    let options = ClientOptions {
        connect_timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    // Ready when the line is printed: the first connect finds a leader.
    let c = Client::connect_with(&servers, options.clone())
        .await
        .unwrap();
    let g = c.lock(["local/job"], LockOptions::new()).await.unwrap();
    let leader = g.client().addr();
    g.unlock().await.unwrap();
    drop(c);

    let killed = listed.iter().find(|n| n.addr == leader).unwrap();
    assert!(signal(killed.pid, libc::SIGKILL));
    let c = Client::connect_with(&servers, options).await.unwrap();
    let g = c
        .lock(
            ["local/job"],
            LockOptions::new().wait(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_ne!(g.client().addr(), leader, "a new leader granted it");
    g.unlock().await.unwrap();
    drop(c);

    let said = stop(cmd, rest).await;
    assert!(
        said.iter().any(|l| l.contains("every node stopped")),
        "{said:?}"
    );
    // Every node was reaped by the command: none is left running.
    for n in &listed {
        assert!(!signal(n.pid, 0), "node at {} still runs", n.addr);
    }

    // The folder's cluster runs on its own ports and size only: its nodes
    // dial each other at the peer addresses of their membership. Another
    // size or port is refused before any node starts (it waited 30 s for
    // a leader, or listed nodes that had exited).
    let again = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dlock-server"))
            .arg("local-cluster")
            .args(args)
            .arg("--dir")
            .arg(dir.path().join("cluster"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let first_port = servers
        .split(',')
        .next()
        .and_then(|a| a.rsplit(':').next())
        .unwrap()
        .to_owned();
    let out = again(&["-n", "5", "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("holds a cluster of 3 nodes: give -n 3"),
        "{err}"
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = taken.local_addr().unwrap().port().to_string();
    let out = again(&["--port", &other]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "listens on port {first_port}, not {other}: give --port {first_port}"
        )),
        "{err}"
    );
    // Without -n and --port (whose defaults, 3 and 7436, are not this
    // folder's) it starts the folder's cluster on the folder's ports.
    let (cmd, listed, again_servers, rest) = start(&folder, &[]).await;
    assert_eq!(listed.len(), 3);
    assert_eq!(again_servers, servers);
    stop(cmd, rest).await;
}

/// Node processes whose command line names `dir` (the cluster's folder),
/// wherever they were reparented. A zombie no longer runs.
fn running_under(dir: &std::path::Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'));
            let cmdline = String::from_utf8_lossy(&cmdline);
            !zombie && cmdline.contains(&needle) && cmdline.contains("--node-id")
        })
        .collect()
}

/// The last lines of each node's log under `dir`, for a failure message.
fn logs_of(dir: &std::path::Path) -> String {
    (1..=3)
        .map(|n| {
            let text =
                std::fs::read_to_string(dir.join(format!("node{n}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n");
            format!("node{n}.log:\n{tail}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until no process names `dir`; panics with those left after 30 s.
async fn none_left(dir: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = running_under(dir);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodes left running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_into_head_it_ends_without_a_panic_and_leaves_no_node_behind() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    let script = r#"set -o pipefail; "$BIN" local-cluster --port 0 --dir "$DIR" | head -1"#;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("bash")
            .args(["-c", script])
            .env("BIN", env!("CARGO_BIN_EXE_dlock-server"))
            .env("DIR", &cluster)
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("the pipeline ends once head has its line")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.starts_with("dlock-server: a local cluster of 3 nodes"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success(),
        "local-cluster exits 0: {:?} {stderr}",
        out.status
    );
    none_left(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_command_leaves_no_node_behind() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["local-cluster", "--port", "0", "--dir"])
        .arg(&cluster)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = cmd.stdout.take().unwrap();
    // The reader is kept open until the end: a closed stdout is how
    // `local-cluster | head -1` ends, and it would stop the nodes while the
    // test still counts them.
    let (pids, _open_stdout) = tokio::task::spawn_blocking(move || {
        let mut pids = Vec::new();
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line.starts_with("export DLOCK_SERVER=") {
                return (pids, lines);
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"node") {
                pids.push(w[4].parse::<i32>().unwrap());
            }
        }
        panic!("the command ended without an export line");
    })
    .await
    .unwrap();
    assert_eq!(pids.len(), 3);
    let running = running_under(&cluster);
    // A node gone this early is a failure of its own: its log's end says
    // why.
    assert_eq!(
        running.len(),
        3,
        "the three nodes run: {running:?} of {pids:?}\n{}",
        logs_of(&cluster)
    );
    assert!(signal(cmd.id() as i32, libc::SIGKILL));
    let _ = tokio::task::spawn_blocking(move || cmd.wait()).await;
    none_left(&cluster).await;
}

/// A second local cluster on the ports of one that runs (here, a port
/// some other program holds) is refused before any node starts, rather
/// than printing the other cluster's addresses as its own, and leaves no
/// empty folder behind; nodes that all
/// fail to start (data directories that cannot be made) end the command
/// with an error instead of leaving it waiting with nothing running.
#[test]
fn ports_in_use_or_nodes_that_all_fail_end_the_command_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["local-cluster", "-n", "1", "--port", &port, "--dir"])
        .arg(dir.path().join("cluster"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")) && err.contains("--port 0"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The folder it made for the run is not left behind, empty.
    assert!(!dir.path().join("cluster").exists());

    // Each node's data directory is a file: every node exits at once.
    let cluster = dir.path().join("broken");
    std::fs::create_dir(&cluster).unwrap();
    for id in 1..=3 {
        std::fs::write(cluster.join(format!("node{id}")), "not a directory").unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-server"))
        .args(["local-cluster", "--port", "0", "--dir"])
        .arg(&cluster)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("every node exited"), "{err}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!said.contains("export DLOCK_SERVER"), "{said}");
}

/// A second local-cluster on a folder in use started nodes on data
/// directories in use, which failed, and wrote into the running nodes'
/// logs; a file given as the folder got "File exists".
#[test]
fn a_folder_in_use_or_a_file_is_refused_before_any_node_starts() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    std::fs::create_dir(&cluster).unwrap();
    // Held as a running local-cluster holds it.
    let held = std::fs::File::create(cluster.join("local-cluster.lock")).unwrap();
    // SAFETY: flock on an open descriptor has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let run = |folder: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_dlock-server"))
            .args(["local-cluster", "--port", "0", "--dir"])
            .arg(folder)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&cluster);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("in use by another local-cluster"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&cluster).unwrap().collect();
    assert_eq!(left.len(), 1, "nothing but the lock: {left:?}");

    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = run(&file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is a file, not a folder"), "{err}");
}
