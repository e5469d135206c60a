//! The command dlock runs: spawning it, signalling it, reading its fate.

use crate::exit::{self, Failure};
use std::io::IsTerminal;
use std::process::{ExitStatus, Stdio};
use tokio::process::Command;

/// A running command.
pub struct Child {
    child: tokio::process::Child,
    pid: i32,
    /// The command leads its own process group, so signals can reach the
    /// processes it started as well.
    own_group: bool,
}

impl Child {
    /// Starts `argv` with the lock's keys and fencing token in its
    /// environment and dlock's stdin, stdout and stderr.
    ///
    /// When stdin is not a terminal (cron, scripts) the command gets its own
    /// process group, so stopping it stops everything it started. On a
    /// terminal it stays in the foreground group so it can read the terminal
    /// and receives Ctrl-C and Ctrl-\ directly.
    ///
    /// # Errors
    /// Exit code 127 when the command does not exist, 126 when it cannot be run.
    pub fn spawn(argv: &[String], keys: &[String], fence: u64) -> Result<Child, Failure> {
        let Some((program, args)) = argv.split_first() else {
            return Err(Failure::new(exit::USAGE, "no command given"));
        };
        let own_group = !std::io::stdin().is_terminal();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("DLOCK_KEYS", keys.join(","))
            .env("DLOCK_FENCE", fence.to_string())
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        if own_group {
            cmd.process_group(0);
        }
        let child = cmd.spawn().map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            Failure::new(code, format!("cannot run {program}: {e}"))
        })?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| {
                Failure::new(
                    exit::CANNOT_EXECUTE,
                    format!("{program} exited before it could be watched"),
                )
            })?;
        Ok(Child {
            child,
            pid,
            own_group,
        })
    }

    /// Whether dlock should pass on `signal`, which it received itself. On a
    /// terminal, Ctrl-C and Ctrl-\ already reached the command, which shares
    /// dlock's process group; passing them on would deliver them twice.
    pub fn should_forward(&self, signal: i32) -> bool {
        self.own_group || !(signal == libc::SIGINT || signal == libc::SIGQUIT)
    }

    /// Sends `signal` to the command (and its process group, if it has one).
    pub fn signal(&self, signal: i32) {
        let target = if self.own_group { -self.pid } else { self.pid };
        // SAFETY: kill(2) has no memory-safety preconditions. The pid is our
        // own unreaped child (or its group), so it cannot have been reused.
        unsafe {
            libc::kill(target, signal);
        }
    }

    /// Waits for the command to end.
    ///
    /// # Errors
    /// Only if the operating system cannot report the child's status.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }
}

/// The shell convention: the command's code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(u8::MAX),
        (None, None) => exit::SOFTWARE,
    }
}
