//! The real `dlock-server` binary as a child process: for signals, restarts,
//! resource limits, and the server's own memory and CPU figures.

use dlock_testkit::proc_sample::ProcSample;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

/// A server process on 127.0.0.1:0; its address is read from its log.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
    log: mpsc::Receiver<String>,
    /// Every log line seen so far, for later searches.
    seen: Vec<String>,
}

impl Process {
    pub fn start(extra: &[&str]) -> Process {
        Process::start_with_fd_limit(extra, None)
    }

    /// Starts the server with both its soft and hard open-file limits set
    /// to `nofile`, so it cannot raise them.
    pub fn start_with_fd_limit(extra: &[&str], nofile: Option<u64>) -> Process {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-server"));
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--log-level") {
            cmd.args(["--log-level", "info"]);
        }
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(n) = nofile {
            // SAFETY: rlimit::setrlimit is one setrlimit(2) call, which is
            // async-signal-safe; it allocates nothing, also on error.
            unsafe {
                cmd.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, n, n));
            }
        }
        let mut child = cmd.spawn().expect("spawn dlock-server");
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, log) = mpsc::channel();
        // Keep draining the log so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Process {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            seen: Vec::new(),
        };
        let line = p.wait_for_log("dlock-server listening");
        p.addr = if line.starts_with('{') {
            // --log-format json
            let event: serde_json::Value = serde_json::from_str(&line).expect("start line is JSON");
            event["addr"].as_str().unwrap_or_default().to_owned()
        } else {
            let rest = line.split("addr=").nth(1).unwrap_or_default();
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        }
        .parse()
        .expect("logged address parses");
        p
    }

    /// Blocks until a log line containing `needle` appears (or has
    /// appeared) and returns it.
    pub fn wait_for_log(&mut self, needle: &str) -> String {
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        let deadline = Instant::now() + super::PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("server never logged {needle:?}; log: {:#?}", self.seen),
            }
        }
    }

    /// Every log line so far.
    pub fn log_lines(&mut self) -> &[String] {
        while let Ok(line) = self.log.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for server")
    }

    /// The server's CPU time and memory so far.
    pub fn sample(&self) -> ProcSample {
        ProcSample::read(self.child.id()).expect("read the server's /proc figures")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lifts this test process's open-file limit to its hard limit, for tests
/// that open many connections.
/// Returns the soft limit in force afterwards (0 if it cannot be read).
pub fn raise_own_fd_limit() -> u64 {
    // u64::MAX asks for the hard limit, as dlock-server's own start does.
    rlimit::increase_nofile_limit(u64::MAX)
        .or_else(|_| rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft))
        .unwrap_or(0)
}
