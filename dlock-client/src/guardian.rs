//! The guardian: a small process that outlives dlock to stop COMMAND when
//! dlock cannot.
//!
//! COMMAND dies with dlock through `PR_SET_PDEATHSIG`, but the processes it
//! started do not, and a dlock that is paused (SIGSTOP, Ctrl-Z, a stalled
//! machine) stops watching the lock's deadline while COMMAND runs on. The
//! guardian is dlock re-executed (`dlock __dlock_guardian`) in a process
//! group of its own, started before COMMAND. dlock keeps a pipe to it and
//! writes short messages: the time by which COMMAND must be gone
//! (CLOCK_MONOTONIC nanoseconds) whenever it moves, what to kill once COMMAND
//! exists (its pid, negated for its process group), and [`DONE`] when COMMAND
//! has ended. The guardian SIGKILLs the
//! target when the pipe closes without [`DONE`] (dlock died) or when the last
//! time passes without a newer one (dlock stalled). Before it kills, it
//! writes [`KILLED`] on a second pipe, its stdout, so a dlock that is alive
//! when COMMAND ends knows why and exits 75, not with COMMAND's 137.
//!
//! The `--on-queued` command gets a guardian of its own (`hook.rs`), with no
//! deadline: only dlock's death makes it kill the hook's process group.
//!
//! What remains impossible: a process that left COMMAND's group on purpose
//! (setsid, setpgid) is beyond reach, and a guardian that is itself killed or
//! stopped protects nothing.

use crate::guardian_message::{message, parse, DEADLINE, DONE, MESSAGE, TARGET};
use std::io::Write;
use std::os::fd::AsFd;
use std::process::{ExitCode, Stdio};
use std::time::Duration;
use tokio::time::Instant;

/// First argument that makes `dlock` run as a guardian; the second names
/// what it guards, for its message.
pub const ARG: &str = "__dlock_guardian";

/// What the guardian writes to dlock just before it kills the target.
const KILLED: u8 = b'K';

/// dlock's end of the pipes to its guardian.
pub struct Guardian {
    pipe: std::process::ChildStdin,
    /// The guardian's stdout: [`KILLED`] arrives on it.
    back: std::process::ChildStdout,
    /// Not waited for: a stopped guardian must not hold dlock's exit up.
    child: std::process::Child,
}

impl Guardian {
    /// Starts a guardian for `what` ("the command", as its message says
    /// when it kills). `None` if it cannot be started: dlock then runs
    /// without it.
    pub fn start(what: &str) -> Option<Guardian> {
        let exe = if cfg!(target_os = "linux") {
            // The running binary even if it was replaced on disk meanwhile.
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe().ok()?
        };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg(ARG)
            .arg(what)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Out of the terminal's reach: Ctrl-C or Ctrl-Z must not stop it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().ok()?;
        let pipe = child.stdin.take()?;
        let back = child.stdout.take()?;
        // A stopped guardian must not stop dlock: once the pipe is full,
        // updates are dropped instead of blocking (9-byte writes are atomic);
        // and reading what it said must not wait for it to say anything.
        for fd in [pipe.as_fd(), back.as_fd()] {
            if let Ok(flags) = rustix::fs::fcntl_getfl(fd) {
                let _ = rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK);
            }
        }
        Some(Guardian { pipe, back, child })
    }

    /// Whether the guardian has killed its target. Certain once the target
    /// is seen dead: the guardian says so before it kills.
    pub fn killed(&mut self) -> bool {
        let mut said = [0u8; 1];
        matches!(std::io::Read::read(&mut self.back, &mut said), Ok(1) if said[0] == KILLED)
    }

    /// The pipe to the guardian, for COMMAND to name itself as the target
    /// before it runs (see [`target_message`]).
    pub fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.pipe)
    }

    /// Tells the guardian the lock's current safety deadline; `None`: no
    /// deadline to enforce (only dlock's death counts).
    pub fn deadline(&mut self, deadline: Option<Instant>) {
        let value = deadline.map_or(0, |d| {
            let left = d.saturating_duration_since(Instant::now());
            monotonic_nanos()
                .saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
                .max(1)
        });
        self.send(DEADLINE, value);
    }

    fn send(&mut self, tag: u8, value: u64) {
        let _ = self.pipe.write_all(&message(tag, value));
    }

    /// COMMAND has ended: the guardian exits without killing anything.
    pub fn done(mut self) {
        if self.pipe.write_all(&message(DONE, 0)).is_err() {
            // The pipe is full (the guardian is stopped): it would later
            // kill a target that may no longer be COMMAND's. Being dlock's
            // own unreaped child, its pid is safe to kill.
            let _ = self.child.kill();
        }
    }
}

/// Runs as the guardian, from `main`, before any argument parsing.
pub fn run() -> ExitCode {
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTSTP] {
        // SAFETY: installing SIG_IGN has no preconditions; the guardian is
        // single-threaded and installs no other handlers.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let mut watch = Watch::default();
    // The raw descriptor, not `stdin()`: a buffered reader would take
    // several messages at once and leave them where poll(2) cannot see them.
    // SAFETY: descriptor 0 is the pipe from dlock, owned by nobody else in
    // this process, which does nothing but this.
    let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(0) };
    let why = watch.run(&mut pipe);
    if let (Some(why), Some(target)) = (why, watch.target) {
        // Said first, so it is there to read when dlock sees the target
        // dead. Nobody may read it (dlock died): Rust ignores SIGPIPE, and
        // the error is no reason not to kill.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&[KILLED]).and_then(|()| out.flush());
        // A negative target is the command's process group.
        crate::signals::kill(target, libc::SIGKILL);
        let what = std::env::args()
            .nth(2)
            .unwrap_or_else(|| "the command".into());
        crate::say!("guardian: {why}; killed {what} (SIGKILL)");
    }
    ExitCode::SUCCESS
}

/// The guardian's knowledge, from dlock's messages.
#[derive(Default)]
struct Watch {
    /// What to kill: a pid, or a negated process group id.
    target: Option<i32>,
    /// CLOCK_MONOTONIC nanoseconds by which the target must be gone.
    deadline: Option<u64>,
    /// The deadline passed before the target was named.
    expired: bool,
}

impl Watch {
    /// Reads messages until [`DONE`] (`None`) or until the target must die
    /// (`Some(reason)`).
    fn run(
        &mut self,
        input: &mut (impl std::io::Read + std::os::fd::AsRawFd),
    ) -> Option<&'static str> {
        let mut msg = [0u8; MESSAGE];
        let mut have = 0;
        loop {
            let timeout_ms = match self.deadline {
                None => -1,
                Some(d) => {
                    let now = monotonic_nanos();
                    if now < d {
                        // Round up, so the wake-up is never before the deadline.
                        i32::try_from((d - now).div_ceil(1_000_000)).unwrap_or(i32::MAX)
                    } else if self.target.is_some() {
                        return Some("dlock did not renew the lock's deadline in time");
                    } else {
                        // COMMAND is about to name itself: kill it then.
                        self.expired = true;
                        -1
                    }
                }
            };
            let mut pfd = libc::pollfd {
                fd: input.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if ready == 0 {
                continue;
            }
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Some("lost track of dlock");
            }
            match input.read(&mut msg[have..]) {
                Ok(0) => return Some("dlock ended without saying the command had"),
                Ok(n) => have += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Some("lost track of dlock"),
            }
            if have < MESSAGE {
                continue;
            }
            have = 0;
            let (tag, value) = parse(&msg);
            match tag {
                DONE => return None,
                TARGET => {
                    self.target = i32::try_from(i64::from_be_bytes(value.to_be_bytes()))
                        .ok()
                        .filter(|&t| t != 0);
                    if self.expired {
                        return Some("the lock's deadline had passed when the command started");
                    }
                }
                DEADLINE => self.deadline = (value != 0).then_some(value),
                _ => return Some("dlock sent something unknown"),
            }
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one timeline for dlock and its guardian.
fn monotonic_nanos() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let d = Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    );
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
