//! A cluster of real `dlock-server` processes on loopback, for tests that
//! hurt it the way a bad day does: SIGKILL, SIGSTOP/SIGCONT, restarts.
//!
//! Each node gets fixed loopback ports and a data dir of its own under one
//! temporary directory, removed when the cluster is dropped (every node is
//! killed first). The binary is passed in: a test of this crate has it as
//! `env!("CARGO_BIN_EXE_dlock-server")`, another crate's test finds it beside
//! its own executable (see [`server_binary`]).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a node may take to log that it listens.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A cluster of node processes.
#[derive(Debug)]
pub struct NodeProcesses {
    bin: PathBuf,
    nodes: Vec<Node>,
    /// Flags every node gets besides its own.
    extra: Vec<String>,
    /// Set by a node's log reader when a line says a thread panicked.
    panicked: Arc<AtomicBool>,
    dirs: tempfile::TempDir,
}

#[derive(Debug)]
struct Node {
    id: u64,
    client: SocketAddr,
    peer: SocketAddr,
    dir: PathBuf,
    /// The node's two ports, held until its first start.
    reserved: Option<(TcpListener, TcpListener)>,
    /// `--peer-route`s: the address this node dials for another node's id.
    routes: Vec<(u64, SocketAddr)>,
    /// Flags this node alone gets.
    own: Vec<String>,
    /// The `--initial-cluster` this node is given, when not every node's.
    list: Option<String>,
    /// The client address the membership names, when not `client`: a
    /// proxy between clients and this node.
    advertised: Option<SocketAddr>,
    /// Added after the cluster was formed: not in `--initial-cluster`, so
    /// it waits to be added by the leader (ClusterAdd).
    joiner: bool,
    /// Started as a durable single server: no `--initial-cluster`, and
    /// `--peer-listen` only when `Some(true)` (see
    /// [`NodeProcesses::single_server`]).
    single: Option<bool>,
    child: Option<Child>,
    /// The node's latest log lines, for a test that checks what it said.
    log: Arc<Mutex<VecDeque<String>>>,
}

/// The `dlock-server` binary of the build running the calling test: beside
/// the test's directory (`target/debug/deps/..`), where `cargo test
/// --workspace` puts it. `DLOCK_SERVER_BIN` overrides.
///
/// # Panics
/// When it is not there: build it (`cargo build -p dlock-server`).
pub fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("DLOCK_SERVER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("dlock-server"))
        .expect("the test runs from target/<profile>/deps");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p dlock-server` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// Log lines kept per node for [`NodeProcesses::recent_log`].
pub const LOG_LINES: usize = 200;

/// A loopback port nobody else listens on, kept bound (so no other socket
/// of this process, such as a proxy started between `prepare` and the
/// node's first start, is given it) until the node is about to bind it.
/// Below the ephemeral range (see [`super::ports`]), so a restart finds it
/// free again.
fn free_port() -> (SocketAddr, TcpListener) {
    super::ports::reserve()
}

impl NodeProcesses {
    /// Starts `n` nodes of a new cluster, each with `extra` flags besides
    /// its identity, and waits until each listens.
    ///
    /// # Panics
    /// A node that does not start: a broken build or machine.
    pub fn start(bin: impl Into<PathBuf>, n: u64, extra: &[&str]) -> NodeProcesses {
        let mut c = NodeProcesses::prepare(bin, n, extra);
        c.start_all();
        c
    }

    /// Like [`NodeProcesses::start`], but starts nothing yet: the caller can
    /// see every node's addresses and [`NodeProcesses::route`] links through
    /// proxies first, then calls [`NodeProcesses::start_all`].
    pub fn prepare(bin: impl Into<PathBuf>, n: u64, extra: &[&str]) -> NodeProcesses {
        let dirs = tempfile::tempdir().expect("a temporary directory");
        let nodes: Vec<Node> = (1..=n)
            .map(|id| {
                let (client, client_hold) = free_port();
                let (peer, peer_hold) = free_port();
                Node {
                    id,
                    client,
                    peer,
                    reserved: Some((client_hold, peer_hold)),
                    dir: dirs.path().join(format!("node{id}")),
                    routes: Vec::new(),
                    own: Vec::new(),
                    list: None,
                    advertised: None,
                    joiner: false,
                    single: None,
                    child: None,
                    log: Arc::default(),
                }
            })
            .collect();
        NodeProcesses {
            bin: bin.into(),
            nodes,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            panicked: Arc::new(AtomicBool::new(false)),
            dirs,
        }
    }

    /// Makes node `from` dial `via` (a proxy the test controls, forwarding
    /// to [`NodeProcesses::peer_addr`] of `to`) whenever it talks to node
    /// `to`, from its next (re)start on. One proxy per direction gives the
    /// test every partition: cut one link, one direction, or a whole side.
    pub fn route(&mut self, from: usize, to: usize, via: SocketAddr) {
        let to_id = self.nodes[to].id;
        let routes = &mut self.nodes[from].routes;
        routes.retain(|(id, _)| *id != to_id);
        routes.push((to_id, via));
    }

    /// Makes every node name `via` (a proxy the test controls, forwarding
    /// to [`NodeProcesses::addr`] of `i`) as node `i`'s client address, so
    /// that clients sent on to node `i` go through it. Before the first
    /// start only: the membership is fixed then.
    pub fn advertise_client(&mut self, i: usize, via: SocketAddr) {
        self.nodes[i].advertised = Some(via);
    }

    /// `--initial-cluster`: every node's advertised client address and
    /// peer address.
    fn members(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| !n.joiner && n.single.is_none())
            .map(|n| format!("{}={}@{}", n.id, n.advertised.unwrap_or(n.client), n.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Prepares one more node (the next id, fresh ports and data dir) that
    /// is not one of the initial members: started, it waits until a
    /// ClusterAdd names it. Returns its index; start it with
    /// [`NodeProcesses::restart`].
    pub fn add_joiner(&mut self) -> usize {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
        let (client, client_hold) = free_port();
        let (peer, peer_hold) = free_port();
        self.nodes.push(Node {
            id,
            client,
            peer,
            reserved: Some((client_hold, peer_hold)),
            dir: self.dirs.path().join(format!("node{id}")),
            routes: Vec::new(),
            own: Vec::new(),
            list: None,
            advertised: None,
            joiner: true,
            single: None,
            child: None,
            log: Arc::default(),
        });
        self.nodes.len() - 1
    }

    /// Node `i`'s id.
    pub fn id(&self, i: usize) -> u64 {
        self.nodes[i].id
    }

    /// Gives node `i` these flags besides every node's, from its next
    /// (re)start on: a fault only one node has, such as a skewed clock.
    pub fn node_flags(&mut self, i: usize, flags: &[&str]) {
        self.nodes[i].own = flags.iter().map(|s| (*s).to_owned()).collect();
    }

    /// Starts node `i`, from its next (re)start on, as a durable single
    /// server: `--data-dir` without `--initial-cluster` (a cluster of one,
    /// which `dlock cluster add` grows), with `--peer-listen` on its peer
    /// address if `peer_listen`, else on a port the kernel chooses at each
    /// start. The other nodes' `--initial-cluster` leaves it out.
    pub fn single_server(&mut self, i: usize, peer_listen: bool) {
        self.nodes[i].single = Some(peer_listen);
    }

    /// Gives node `i` `list` as its `--initial-cluster` instead of the one
    /// every node gets: a node of a mistyped or stale configuration.
    pub fn initial_cluster(&mut self, i: usize, list: &str) {
        self.nodes[i].list = Some(list.to_owned());
    }

    /// `--initial-cluster` as every node gets it (see
    /// [`NodeProcesses::initial_cluster`] for one that differs).
    pub fn members_list(&self) -> String {
        self.members()
    }

    /// Starts every node that is not running, and waits until each listens.
    ///
    /// # Panics
    /// A node that does not start.
    pub fn start_all(&mut self) {
        // Every port let go before the first node starts, not each just
        // before its own node binds it: a fresh node asks the other listed
        // members about itself before it bootstraps (`standing.rs`), and a
        // port the test still holds accepts the connection and never
        // answers, so each ask waited out its limit (2 s) where a real
        // node not yet started refuses at once. Nothing else of this
        // process binds these ports meanwhile: they are below the
        // ephemeral range.
        for node in &mut self.nodes {
            if node.child.is_none() {
                node.reserved = None;
            }
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                self.restart(i);
            }
        }
    }

    /// Every node's client address, comma-separated, as `dlock -s` takes it.
    pub fn servers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.client.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i`'s client address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].client
    }

    /// Node `i`'s peer address.
    pub fn peer_addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].peer
    }

    /// The node whose client address is `addr`.
    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.client.to_string() == addr)
    }

    /// The node whose `--node-id` is `id`.
    pub fn index_of_id(&self, id: u64) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Starts node `i` (again), on its old ports and data dir, and waits
    /// until it listens.
    ///
    /// # Panics
    /// It is running, or does not start.
    pub fn restart(&mut self, i: usize) {
        if let Err(why) = self.try_restart(i) {
            panic!("{why}");
        }
    }

    /// Node `i`'s data directory.
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.nodes[i].dir
    }

    /// The newest file of node `i`'s raft log (the segment it writes to),
    /// for tests that damage it; `None` if it has none.
    pub fn log_file(&self, i: usize) -> Option<PathBuf> {
        let dir = self.data_dir(i).join("raft-log");
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .max()
    }

    /// Like [`NodeProcesses::restart`], but a node that exits (or does not
    /// listen in time) is an `Err` with its exit status and first log
    /// lines: what a test that damaged its data dir expects to read.
    ///
    /// # Panics
    /// It is running, or cannot be spawned.
    pub fn try_restart(&mut self, i: usize) -> Result<(), String> {
        assert!(self.nodes[i].child.is_none(), "node {i} is running");
        // Let go of the ports just before the node binds them.
        self.nodes[i].reserved = None;
        let members = self.members();
        let n = &self.nodes[i];
        let list = n.list.as_ref().unwrap_or(&members);
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--listen")
            .arg(n.client.to_string())
            .arg("--data-dir")
            .arg(&n.dir)
            .arg("--node-id")
            .arg(n.id.to_string())
            .args(
                (n.single != Some(false))
                    .then(|| ["--peer-listen".to_owned(), n.peer.to_string()])
                    .into_iter()
                    .flatten(),
            )
            // None for a single server, or for a joiner when every other
            // node is one.
            .args(
                (n.single.is_none() && !list.is_empty())
                    .then_some(["--initial-cluster", list.as_str()])
                    .into_iter()
                    .flatten(),
            )
            // A node added at run time says it joins a running cluster,
            // unless the test says otherwise.
            .args(
                (n.joiner && !n.own.iter().any(|f| f == "--initial-cluster-state"))
                    .then_some(["--initial-cluster-state", "existing"])
                    .into_iter()
                    .flatten(),
            )
            .args(
                n.advertised
                    .iter()
                    .flat_map(|a| ["--advertise-client".to_owned(), a.to_string()]),
            )
            .args(
                n.routes
                    .iter()
                    .flat_map(|(id, via)| ["--peer-route".to_owned(), format!("{id}={via}")]),
            )
            .args(&self.extra)
            .args(&n.own)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn dlock-server");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (up_tx, up) = mpsc::sync_channel(1);
        let panicked = self.panicked.clone();
        let id = n.id;
        let log = n.log.clone();
        // A long run's whole logs, to explain what it reports: the ring
        // keeps only the last lines.
        let mut keep = std::env::var_os("DLOCK_TEST_NODE_LOG_DIR").and_then(|dir| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(&dir).join(format!("node-{id}.log")))
                .ok()
        });
        // Reads the log to its end, so the node never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut up_tx = Some(up_tx);
            // Until the node is up: its last lines, for the panic if it
            // never is.
            let mut early: Vec<String> = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                {
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line.clone());
                }
                if let Some(f) = keep.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                if line.contains("panicked") {
                    // Into the test's output, shown when it fails.
                    eprintln!("node {id}: {line}");
                    panicked.store(true, Ordering::Relaxed);
                }
                if line.contains("dlock-server listening") {
                    if let Some(tx) = up_tx.take() {
                        let _ = tx.send(Ok(()));
                    }
                } else if up_tx.is_some() && early.len() < 20 {
                    early.push(line);
                }
            }
            if let Some(tx) = up_tx.take() {
                let _ = tx.send(Err(early.join("\n")));
            }
        });
        match up.recv_timeout(START_LIMIT) {
            Ok(Ok(())) => {}
            outcome => {
                let _ = child.kill();
                let status = child.wait();
                let log = match outcome {
                    Ok(Err(log)) => log,
                    _ => "(no exit within the start limit)".into(),
                };
                return Err(format!(
                    "node {} did not start: {status:?}; its log:\n{log}",
                    n.id
                ));
            }
        }
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// SIGKILL to node `i`, and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM to node `i` and its exit status once it has exited; `None`
    /// when it was not running, or did not exit within `limit` (it is then
    /// killed: a node that ignores SIGTERM is a finding, not a hang).
    pub fn terminate(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        let mut child = self.nodes[i].child.take()?;
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = std::time::Instant::now() + limit;
        while sent && std::time::Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Waits up to `limit` for node `i` to exit by itself, and returns its
    /// exit status; `None` if it was not running or is still running (it
    /// is left running then).
    pub fn wait_for_exit(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        let child = self.nodes[i].child.as_mut()?;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.nodes[i].child = None;
                    return Some(status);
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => return None,
            }
        }
    }

    /// Node `i`'s latest log lines (at most the last [`LOG_LINES`]), over
    /// all its runs.
    pub fn recent_log(&self, i: usize) -> Vec<String> {
        let log = self.nodes[i].log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect()
    }

    /// Whether node `i` runs (it may be paused).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// How many nodes the cluster has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// SIGSTOP to node `i`: it keeps its sockets but does nothing. Returns
    /// once every thread of it has stopped: kill(2) returns before that, and
    /// on a busy machine a thread already running could still answer a
    /// request sent just after.
    pub fn pause(&self, i: usize) {
        self.signal(i, "STOP");
        let pid = self.nodes[i].child.as_ref().expect("node is running").id();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "node {i} did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT to node `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, "CONT");
    }

    /// Sends node `i` SIGHUP: it re-reads its certificates and rules.
    pub fn reload(&self, i: usize) {
        self.signal(i, "HUP");
    }

    fn signal(&self, i: usize, name: &str) {
        let child = self.nodes[i].child.as_ref().expect("node is running");
        let ok = Command::new("kill")
            .args([format!("-{name}"), child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{name} node {i} failed");
    }

    /// Whether any node's log said a thread panicked.
    pub fn any_panicked(&self) -> bool {
        self.panicked.load(Ordering::Relaxed)
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            // A paused node ignores SIGKILL's cousins but not SIGKILL.
            self.kill(i);
        }
    }
}

pub use crate::ops::ask::cluster_status;

/// Whether every thread of process `pid` is stopped (state T in
/// /proc/PID/task/TID/stat); one that has exited (Z, X, or gone) counts
/// too, for the test's next step reports that.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.filter_map(Result::ok).all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        matches!(state, None | Some("T" | "t" | "Z" | "X"))
    })
}
