//! `--on-queued CMD`: a shell command run once when the lock request is in
//! line (not when it is granted at once), before dlock waits for the grant.
//!
//! It runs to its end before COMMAND: the request keeps its place in line
//! meanwhile, and a grant that comes in between waits for it, so a slow
//! hook delays COMMAND but never loses the lock. Its exit status only
//! gets a line on stderr: a failed notification is no reason to skip the
//! job. It gets no stdin (COMMAND may need it) and shares dlock's stdout and
//! stderr.
//!
//! Off a terminal (cron, scripts) it runs in a process group of its own,
//! and whenever dlock stops waiting for it (the request gave up as its `-w`
//! ran out, a signal, any error), the whole group is SIGKILLed, so a
//! `sh -c 'a; sleep 10'` leaves no `sleep` behind. On a terminal it stays in
//! dlock's group, as COMMAND does: in a group of its own it would be a
//! background job, stopped for good (SIGTTIN, SIGTTOU) by a prompt on the
//! terminal or a write under `stty tostop`, while dlock, granted the lock,
//! waited for it. There only the shell is killed; Ctrl-C reaches the whole
//! foreground group anyway. SIGKILL, not SIGTERM and a grace: dlock is giving up and
//! exits at once, and a notification has nothing to clean up that a job
//! would. If dlock itself is killed, the shell dies with it
//! (`PR_SET_PDEATHSIG`) and a guardian of its own kills the rest of the
//! group. What the hook started and left running after it ended is not
//! killed, as for COMMAND.

use crate::child::die_with_dlock;
use crate::guardian::Guardian;
use crate::signals::kill;
use std::process::Stdio;
use tokio::process::Command;

/// Runs `sh -c script` with `DLOCK_KEYS` and `DLOCK_PLACE` (requests ahead
/// of this one) in its environment, and waits for it. Dropping the future
/// kills the hook's process group.
pub async fn on_queued(script: &str, keys: &[String], place: u32) {
    let mut hook = match Hook::spawn(script, keys, place) {
        Ok(h) => h,
        Err(e) => {
            crate::say!("--on-queued command not run: {e}; waiting for the lock anyway");
            return;
        }
    };
    let status = hook.child.wait().await;
    // Reaped: its pid, and so its group's id, may be reused from here on.
    hook.running = false;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => crate::say!("--on-queued command failed ({s}); waiting for the lock anyway"),
        Err(e) => {
            crate::say!("lost track of the --on-queued command: {e}; waiting for the lock anyway")
        }
    }
}

/// A running hook, killed with its group when dropped before it ended.
struct Hook {
    child: tokio::process::Child,
    /// What to kill: its process group (the shell's pid, negated), or on a
    /// terminal the shell alone (its pid).
    target: i32,
    /// Not yet reaped: the group id is still ours to signal.
    running: bool,
    /// Kills the group if dlock dies; told it may exit once the hook ended
    /// or was killed.
    guardian: Option<Guardian>,
}

impl Hook {
    fn spawn(script: &str, keys: &[String], place: u32) -> std::io::Result<Hook> {
        let own_group = !std::io::IsTerminal::is_terminal(&std::io::stdin());
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .env("DLOCK_KEYS", keys.join(","))
            .env("DLOCK_PLACE", place.to_string())
            // The token is dlock's, not the hook's.
            .env_remove("DLOCK_TOKEN")
            .stdin(Stdio::null());
        if own_group {
            cmd.process_group(0);
        }
        // Only when there is something to guard: one more process per hook.
        let guardian = Guardian::start("the --on-queued command");
        die_with_dlock(&mut cmd, guardian.as_ref().map(Guardian::fd), own_group);
        let child = cmd.spawn()?;
        // Only a reaped child has no id, and this one is not waited for yet.
        let pid = child.id().and_then(|p| i32::try_from(p).ok());
        Ok(Hook {
            child,
            // The group's id is the shell's pid; in dlock's group, only the
            // shell is signalled.
            target: pid.map_or(0, |p| if own_group { -p } else { p }),
            running: pid.is_some(),
            guardian,
        })
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if self.running && self.target != 0 {
            // The shell is unreaped, so its pid (and group id) is still its.
            kill(self.target, libc::SIGKILL);
        }
        if let Some(g) = self.guardian.take() {
            g.done();
        }
    }
}
