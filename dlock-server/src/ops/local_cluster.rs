//! `dlock-server local-cluster`: a cluster of this binary's node
//! processes on loopback, for trying dlock on one machine, with one data
//! directory and one log file per node under one folder. It prints what
//! to export for the clients, reports a node that exits (killing the
//! leader to watch a failover is a fair thing to try), and stops every
//! node on Ctrl-C or SIGTERM, or when its output is closed (`| head -1`).
//! The nodes never outlive it: each is in a process group of its own (a
//! Ctrl-C reaches this command, which stops them in order) and is sent
//! SIGTERM by the kernel if this command dies, even by SIGKILL.

use anyhow::Context;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;

/// Options of `dlock-server local-cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalCluster {
    /// How many nodes: 3 survives one failure, 5 two [default: 3, or the
    /// folder's cluster's].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..=9))]
    pub nodes: Option<u64>,

    /// Folder of the nodes' data directories and logs (node1/, node1.log,
    /// ...). A folder from an earlier run starts that cluster again, with
    /// its locks and sessions, on its ports (listed in
    /// local-cluster.ports) and with its number of nodes.
    #[arg(
        long,
        env = "DLOCK_LOCAL_CLUSTER_DIR",
        default_value = "dlock-local-cluster"
    )]
    pub dir: PathBuf,

    /// Client port of node 1; node N listens on it plus 10 × (N - 1) for
    /// clients and one above that for its peers. 0 picks free ports
    /// [default: 7436, or the folder's cluster's].
    #[arg(long, env = "DLOCK_LOCAL_CLUSTER_PORT")]
    pub port: Option<u16>,
}

/// The file in the folder that lists each node's id, client and peer
/// address, one line each.
const LAYOUT: &str = "local-cluster.ports";

/// The nodes' addresses from the layout file's `text`, in id order.
fn parse_layout(text: &str) -> anyhow::Result<Vec<(SocketAddr, SocketAddr)>> {
    let mut ports = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [id, client, peer] = w[..] else {
            anyhow::bail!("line {line:?} is not 'ID CLIENT PEER'");
        };
        if id.parse::<usize>().ok() != Some(ports.len() + 1) {
            anyhow::bail!("line {line:?}: node ids must run 1, 2, 3, ...");
        }
        let addr = |a: &str| {
            a.parse::<SocketAddr>()
                .with_context(|| format!("line {line:?}: {a:?} is no address"))
        };
        ports.push((addr(client)?, addr(peer)?));
    }
    if ports.is_empty() {
        anyhow::bail!("it lists no node");
    }
    Ok(ports)
}

/// Refuses, before any node starts, ports that something else holds
/// (most often a local cluster already running): the readiness check would
/// otherwise find that other cluster and print its addresses as this one's.
fn all_free(ports: &[(SocketAddr, SocketAddr)], or: &str) -> anyhow::Result<()> {
    for &addr in ports.iter().flat_map(|(c, p)| [c, p]) {
        std::net::TcpListener::bind(addr).with_context(|| {
            format!(
                "cannot listen on {addr} (is another local cluster or dlock-server running?): \
                 stop it, {or}"
            )
        })?;
    }
    Ok(())
}

/// How long a node gets to exit after SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// How long the nodes get to elect their first leader.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// Resolves once one of `servers` leads and has committed and applied its
/// whole log (the entry a new leader writes in its term included), so a
/// client's OpenSession can commit at once; `None` if none did within
/// [`READY_LIMIT`].
async fn until_ready(servers: &str) -> Option<()> {
    let deadline = tokio::time::Instant::now() + READY_LIMIT;
    while tokio::time::Instant::now() < deadline {
        for addr in servers.split(',') {
            let status = super::ask::cluster_status(addr, Duration::from_secs(2)).await;
            let serving = |s: &dlock_proto::proto::ClusterInfo| {
                s.leader_id != 0
                    && s.leader_id == s.node_id
                    && s.committed_index > 0
                    && s.committed_index >= s.last_log_index
                    && s.last_applied_index >= s.committed_index
            };
            if status.as_ref().is_some_and(serving) {
                return Some(());
            }
        }
        // The nodes are still binding their ports or electing.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// One running node.
struct Node {
    id: u64,
    client: SocketAddr,
    pid: u32,
}

/// The nodes still running: each node's process is awaited by a task of
/// its own, which ends with the node's id and exit status.
struct Running {
    nodes: Vec<Node>,
    exits: JoinSet<(u64, std::io::Result<ExitStatus>)>,
}

impl LocalCluster {
    /// Runs the cluster until a signal; the error says what could not be
    /// started.
    pub fn run(&self) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        runtime.block_on(self.supervise())
    }

    async fn supervise(&self) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        if self.dir.exists() && !self.dir.is_dir() {
            anyhow::bail!(
                "--dir {} is a file, not a folder: give a folder (made if missing)",
                self.dir.display()
            );
        }
        let made = !self.dir.exists();
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        // Not taken: another run made the folder at the same moment and
        // holds it, and it is not this run's to remove.
        let _in_use = self.take_folder()?;
        let ports = match self.layout() {
            Ok(ports) => ports,
            Err(e) => {
                // Refused before any node started: a folder this run made
                // holds only its lock file, and would be left behind empty.
                if made {
                    let _ = std::fs::remove_dir_all(&self.dir);
                }
                return Err(e);
            }
        };
        if ports.len() == 2 {
            tell!(
                "dlock-server: warning: 2 nodes survive no failure, as 1 does (a majority of 2 \
                 is both); 3 survive one"
            );
        }
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| format!("{}={c}@{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut running = Running {
            nodes: Vec::new(),
            exits: JoinSet::new(),
        };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let id = i as u64 + 1;
            if let Err(e) = running.spawn(&exe, &self.dir, id, client, peer, &members) {
                running.stop().await;
                return Err(e);
            }
        }
        let mut listing = vec![format!(
            "dlock-server: a local cluster of {} nodes, data and logs in {}",
            running.nodes.len(),
            self.dir.display()
        )];
        for n in &running.nodes {
            listing.push(format!(
                "  node {}  {}  pid {}  log {}",
                n.id,
                n.client,
                n.pid,
                self.dir.join(format!("node{}.log", n.id)).display()
            ));
        }
        if !say(&listing) {
            running.stop().await;
            return Ok(());
        }
        let servers = running
            .nodes
            .iter()
            .map(|n| n.client.to_string())
            .collect::<Vec<_>>()
            .join(",");
        // The line to export comes once a client can use it: a leader is
        // elected and has committed its term's first entry.
        // Every node gone first (a data directory in use, a port taken
        // since it was checked) is said at once, not after READY_LIMIT.
        let ready = tokio::select! {
            ready = until_ready(&servers) => ready.map(|()| true),
            () = running.every_node_exited() => {
                anyhow::bail!("every node exited: {}", self.see_logs())
            }
            _ = int.recv() => Some(false),
            _ = term.recv() => Some(false),
        };
        match ready {
            Some(true) => {}
            // Stopped before a leader was elected: as any stop.
            Some(false) => {
                running.stop().await;
                say(&["dlock-server: every node stopped".to_string()]);
                return Ok(());
            }
            None => {
                running.stop().await;
                anyhow::bail!(
                    "no leader was elected within {READY_LIMIT:?}: {}",
                    self.see_logs()
                );
            }
        }
        if !say(&[
            format!("export DLOCK_SERVER={servers}"),
            "Ctrl-C stops every node.".to_string(),
        ]) {
            running.stop().await;
            return Ok(());
        }
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                Some(exit) = running.exits.join_next() => {
                    if let Ok((id, status)) = exit {
                        running.exited(id, &status, "the others go on");
                    }
                    // Waiting on with nothing left to stop would look
                    // like a cluster that serves.
                    if running.nodes.is_empty() {
                        anyhow::bail!("every node exited: {}", self.see_logs());
                    }
                }
            }
        }
        running.stop().await;
        say(&["dlock-server: every node stopped".to_string()]);
        Ok(())
    }

    /// Holds the folder for this run: a second local-cluster on it would
    /// start nodes on data directories in use, which fail, and write into
    /// the running nodes' logs.
    fn take_folder(&self) -> anyhow::Result<std::fs::File> {
        let path = self.dir.join("local-cluster.lock");
        super::file_lock::exclusive(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                anyhow::anyhow!(
                    "{} is in use by another local-cluster: stop that one (Ctrl-C where it \
                     runs), or give --dir another folder",
                    self.dir.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("cannot lock {}", path.display()))
            }
        })
    }

    /// Where the user finds why a node stopped.
    fn see_logs(&self) -> String {
        format!("see the nodes' logs in {}", self.dir.display())
    }

    /// Each node's client and peer address: the folder's own, for a
    /// cluster started in it before, or new ones, written down for the next
    /// run. A cluster's nodes find each other at the peer addresses in
    /// their membership, so a folder's cluster can only run on its ports.
    fn layout(&self) -> anyhow::Result<Vec<(SocketAddr, SocketAddr)>> {
        let path = self.dir.join(LAYOUT);
        let stored = match std::fs::read_to_string(&path) {
            Ok(text) => Some(parse_layout(&text).with_context(|| {
                format!(
                    "{} is damaged: remove the folder, or fix the file",
                    path.display()
                )
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        if let Some(ports) = stored {
            let dir = self.dir.display();
            let n = ports.len();
            if let Some(given) = self.nodes.filter(|&g| g != n as u64) {
                anyhow::bail!(
                    "{dir} holds a cluster of {n} nodes: give -n {n} (or no -n), or another \
                     --dir for a cluster of {given}"
                );
            }
            let first = ports.first().map_or(0, |(c, _)| c.port());
            if let Some(given) = self.port.filter(|&p| p != 0 && p != first) {
                anyhow::bail!(
                    "{dir} holds a cluster whose node 1 listens on port {first}, not \
                     {given}: give --port {first} (or no --port), or another --dir"
                );
            }
            all_free(&ports, "the folder's cluster needs them")?;
            return Ok(ports);
        }
        let ports = self.ports()?;
        // A folder of an earlier version holds nodes but no list: its ports
        // are unknown, and the nodes say so if these differ.
        if !self.dir.join("node1").exists() {
            let text: String = ports
                .iter()
                .enumerate()
                .map(|(i, (c, p))| format!("{} {c} {p}\n", i + 1))
                .collect();
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(ports)
    }

    /// Each node's client and peer address.
    fn ports(&self) -> anyhow::Result<Vec<(SocketAddr, SocketAddr)>> {
        let loopback = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let (nodes, port) = (self.nodes.unwrap_or(3), self.port.unwrap_or(7436));
        if port != 0 {
            let ports = (0..nodes)
                .map(|i| {
                    let client = u64::from(port) + 10 * i;
                    match (u16::try_from(client), u16::try_from(client + 1)) {
                        (Ok(c), Ok(p)) => Ok((loopback(c), loopback(p))),
                        _ => anyhow::bail!(
                            "--port {} leaves no room for node {}'s ports",
                            port,
                            i + 1
                        ),
                    }
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            all_free(&ports, "or give --port 0 to pick free ports")?;
            return Ok(ports);
        }
        // Below the ephemeral range, where no outgoing connection is given
        // one in the moment between choosing and binding (`ports.rs`); held
        // together until all are chosen, so no two are the same.
        let held = (0..nodes * 2)
            .map(|_| super::ports::reserve())
            .collect::<Result<Vec<_>, _>>()
            .context("cannot find free loopback ports")?;
        let addrs: Vec<SocketAddr> = held.iter().map(|(addr, _)| *addr).collect();
        Ok(addrs.chunks(2).map(|p| (p[0], p[1])).collect())
    }
}

impl Running {
    /// Starts node `id`, its log in `dir`/node`id`.log.
    fn spawn(
        &mut self,
        exe: &Path,
        dir: &Path,
        id: u64,
        client: SocketAddr,
        peer: SocketAddr,
        members: &str,
    ) -> anyhow::Result<()> {
        let log_path = dir.join(format!("node{id}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let parent = rustix::process::getpid();
        let mut cmd = Command::new(exe);
        // Its own group: a Ctrl-C in the terminal reaches this command,
        // which stops the nodes in order, not every node at once.
        cmd.process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls are
        // made (prctl, getppid), and nothing is allocated.
        unsafe {
            cmd.pre_exec(move || {
                // The kernel sends SIGTERM when this command dies, however
                // it dies; if it died before this ran, the node must not
                // start at all (its parent is then another process).
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("local-cluster is gone"));
                }
                Ok(())
            });
        }
        let mut child = cmd
            .arg("--listen")
            .arg(client.to_string())
            .arg("--peer-listen")
            .arg(peer.to_string())
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--data-dir")
            .arg(dir.join(format!("node{id}")))
            .arg("--initial-cluster")
            .arg(members)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start node {id} ({})", exe.display()))?;
        let pid = child.id().unwrap_or_default();
        self.exits.spawn(async move { (id, child.wait().await) });
        self.nodes.push(Node { id, client, pid });
        Ok(())
    }

    /// Says that node `id` exited (`then`: what happens now; empty: say
    /// nothing of a clean exit), and forgets its pid, which the system may
    /// give to another process.
    fn exited(&mut self, id: u64, status: &std::io::Result<ExitStatus>, then: &str) {
        match status {
            Ok(s) if then.is_empty() && s.success() => {}
            Ok(s) if then.is_empty() => tell!("dlock-server: node {id} exited ({s})"),
            Ok(s) => tell!("dlock-server: node {id} exited ({s}); {then}"),
            Err(e) => tell!("dlock-server: node {id}: cannot wait for it: {e}"),
        }
        self.nodes.retain(|n| n.id != id);
    }

    /// Resolves once every node has exited, saying so of each; pending
    /// for ever while one runs.
    async fn every_node_exited(&mut self) {
        while let Some(exit) = self.exits.join_next().await {
            if let Ok((id, status)) = exit {
                self.exited(id, &status, "");
            }
        }
        if !self.nodes.is_empty() {
            // A waiting task failed (it panicked): its node is not known to
            // have exited.
            std::future::pending::<()>().await;
        }
    }

    /// SIGTERM to every node still running; those that have not exited
    /// within [`STOP_LIMIT`] are killed.
    async fn stop(&mut self) {
        for n in &self.nodes {
            send(n.pid, rustix::process::Signal::TERM);
        }
        let deadline = tokio::time::Instant::now() + STOP_LIMIT;
        while !self.nodes.is_empty() {
            match tokio::time::timeout_at(deadline, self.exits.join_next()).await {
                Ok(Some(Ok((id, status)))) => self.exited(id, &status, ""),
                Ok(Some(Err(_))) | Ok(None) => break,
                Err(_) => {
                    for n in &self.nodes {
                        tell!(
                            "dlock-server: node {} did not stop within {STOP_LIMIT:?}: killing it",
                            n.id
                        );
                        send(n.pid, rustix::process::Signal::KILL);
                    }
                    while self.exits.join_next().await.is_some() {}
                    break;
                }
            }
        }
    }
}

/// `eprintln!` that never panics: a closed stderr (`2>&1 | head`) loses
/// the line, nothing more.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
use tell;

/// Writes `lines` to stdout; false when it is closed (a reader such as
/// `head -1` went away), which ends the command: its output is how the
/// user learns the nodes' addresses. Never a panic, as `println!` is.
fn say(lines: &[String]) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = lines
        .iter()
        .try_for_each(|l| writeln!(out, "{l}"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        tell!("dlock-server: cannot write to standard output ({e}): stopping every node");
        return false;
    }
    true
}

/// Sends `sig` to `pid`; one that is gone already (Ctrl-C reached it too)
/// needs nothing.
fn send(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}
