//! The command dlock runs: spawning it, signalling it, reading its fate.

use crate::exit::{self, Failure};
use crate::signals::kill;
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
    /// With `own_group` (dlock's stdin is not a terminal: cron, scripts) the command gets its own
    /// process group, so stopping it stops everything it started. On a
    /// terminal it stays in the foreground group so it can read the terminal
    /// and receives Ctrl-C and Ctrl-\ directly.
    ///
    /// The command is SIGKILLed if dlock dies (`PR_SET_PDEATHSIG` on Linux;
    /// the guardian extends that to its process group), and does not see
    /// `DLOCK_TOKEN`: the token is dlock's, not the command's.
    ///
    /// # Errors
    /// Exit code 127 when the command does not exist, 126 when it cannot be run.
    pub fn spawn(
        argv: &[String],
        keys: &[String],
        fence: u64,
        own_group: bool,
        guardian: Option<std::os::fd::RawFd>,
    ) -> Result<Child, Failure> {
        let Some((program, args)) = argv.split_first() else {
            return Err(Failure::new(exit::USAGE, "no command given"));
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("DLOCK_KEYS", keys.join(","))
            .env("DLOCK_FENCE", fence.to_string())
            .env_remove("DLOCK_TOKEN")
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        if own_group {
            cmd.process_group(0);
        }
        die_with_dlock(&mut cmd, guardian, own_group);
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

    /// Sends `signal` to the command and everything it started: its process
    /// group, or, when it shares dlock's group on a terminal, every member
    /// of that group but dlock itself.
    pub fn signal(&self, signal: i32) {
        if self.own_group {
            kill(-self.pid, signal);
            return;
        }
        // Found before anyone is signalled: once the command dies, what it
        // started is reparented and no longer looks like dlock's.
        let started = fellow_group_members();
        kill(self.pid, signal);
        for pid in started {
            if pid != self.pid {
                kill(pid, signal);
            }
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

/// Makes `cmd` die with dlock: SIGKILLed when dlock dies
/// (`PR_SET_PDEATHSIG` on Linux; dlock runs on one thread, so the parent
/// thread the signal follows lives as long as dlock), and named, between fork
/// and exec, to the guardian on `guardian` as its target, its process group
/// with it if `own_group`.
pub(crate) fn die_with_dlock(
    cmd: &mut Command,
    guardian: Option<std::os::fd::RawFd>,
    own_group: bool,
) {
    #[cfg(target_os = "linux")]
    {
        let parent = rustix::process::getpid().as_raw_nonzero().get();
        // SAFETY: in the child only prctl and getppid run, both
        // async-signal-safe, and no memory is touched.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // dlock died between fork and prctl: the signal will
                // never come, so do not start.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("dlock exited"));
                }
                Ok(())
            });
        }
    }
    if let Some(fd) = guardian {
        // SAFETY: in the child only getpid, signal and write(2) of a
        // stack buffer run, all async-signal-safe; `fd` is the open pipe
        // to the guardian, inherited across fork and closed by exec.
        // A guardian that is gone must not kill COMMAND by SIGPIPE (std
        // has reset it to the default here): ignored for the write,
        // restored before exec.
        unsafe {
            cmd.pre_exec(move || {
                let msg = crate::guardian_message::target_message(libc::getpid(), own_group);
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                libc::write(fd, msg.as_ptr().cast(), msg.len());
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                Ok(())
            });
        }
    }
}

/// dlock's descendants in its own process group: what the command started
/// without leaving the group (Linux: from /proc; empty elsewhere, where only
/// the command itself is signalled). The rest of the group (a script that
/// called dlock) is not dlock's to signal.
fn fellow_group_members() -> Vec<i32> {
    let group = rustix::process::getpgrp().as_raw_nonzero().get();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // pid -> (parent, group), from field 4 and 5 of stat, counted after the
    // command name, which may itself hold spaces and parentheses.
    let procs: std::collections::HashMap<i32, (i32, i32)> = dir
        .filter_map(|e| {
            let pid = e.ok()?.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(1);
            let parent = fields.next()?.parse().ok()?;
            let pgrp = fields.next()?.parse().ok()?;
            Some((pid, (parent, pgrp)))
        })
        .collect();
    let descends = |mut pid: i32| {
        // Bounded walk: a pid table is finite, and a cycle is impossible
        // but must not hang dlock.
        for _ in 0..procs.len() {
            match procs.get(&pid) {
                Some(&(parent, _)) if parent == me => return true,
                Some(&(parent, _)) if parent > 1 => pid = parent,
                _ => return false,
            }
        }
        false
    };
    procs
        .iter()
        .filter(|&(&pid, &(_, pgrp))| pgrp == group && pid != me && descends(pid))
        .map(|(&pid, _)| pid)
        .collect()
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
