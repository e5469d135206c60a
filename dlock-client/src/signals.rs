//! The signals dlock handles: while waiting they end dlock cleanly, while
//! the command runs they are passed on to it; and [`kill`], how dlock and its
//! guardian send one.

use crate::exit::{self, Failure};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Listeners for SIGINT, SIGTERM, SIGHUP and SIGQUIT, and, when the command
/// runs in a process group of its own, SIGTSTP and SIGCONT. Installed before
/// the lock is requested, so none of them can kill dlock without cleanup.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
    /// Job control, caught only without a terminal: a stopped dlock would
    /// stop watching the lock while the command runs on, so the stop is
    /// passed to the command instead and dlock keeps the lock alive. On a
    /// terminal dlock and the command stop together, as the shell expects.
    job: Option<(Signal, Signal)>,
}

impl Signals {
    /// Installs the listeners; `job_control`: also SIGTSTP and SIGCONT.
    ///
    /// # Errors
    /// If the operating system refuses a handler (exit code 70).
    pub fn install(job_control: bool) -> Result<Signals, Failure> {
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install signal handler: {e}"),
                )
            })
        };
        let job = if job_control {
            Some((
                listen(SignalKind::from_raw(libc::SIGTSTP))?,
                listen(SignalKind::from_raw(libc::SIGCONT))?,
            ))
        } else {
            None
        };
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
            quit: listen(SignalKind::quit())?,
            job,
        })
    }

    /// The next signal received, as its number.
    pub async fn recv(&mut self) -> i32 {
        let Signals {
            int,
            term,
            hup,
            quit,
            job,
        } = self;
        let job = async {
            match job {
                Some((tstp, cont)) => tokio::select! {
                    _ = tstp.recv() => libc::SIGTSTP,
                    _ = cont.recv() => libc::SIGCONT,
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = int.recv() => libc::SIGINT,
            _ = term.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
            _ = quit.recv() => libc::SIGQUIT,
            sig = job => sig,
        }
    }
}

/// The signal's name, for messages.
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGTSTP => "SIGTSTP".into(),
        libc::SIGCONT => "SIGCONT".into(),
        n => format!("signal {n}"),
    }
}

/// Sends `signal` to process `target`, or to the group `-target` when it
/// is negative (kill(2)'s convention). The pid is our own unreaped child
/// (or its group, or a member of our own group); one already gone needs
/// nothing.
pub(crate) fn kill(target: i32, signal: i32) {
    let Some(sig) = rustix::process::Signal::from_named_raw(signal) else {
        return;
    };
    let _ = match rustix::process::Pid::from_raw(target.saturating_abs()) {
        Some(pid) if target < 0 => rustix::process::kill_process_group(pid, sig),
        Some(pid) => rustix::process::kill_process(pid, sig),
        None => Ok(()),
    };
}
