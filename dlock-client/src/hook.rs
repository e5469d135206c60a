//! `--on-queued CMD`: a shell command run once when the lock request is in
//! line (not when it is granted at once), before dlock waits for the grant.
//!
//! It runs to its end before COMMAND: the request keeps its place in line
//! meanwhile, and a grant that comes in between waits for it, so a slow
//! hook delays COMMAND but never loses the lock. If the request gives up
//! first (its `-w` runs out), dlock says so at once and the hook is killed.
//! Its exit status only
//! gets a line on stderr: a failed notification is no reason to skip the
//! job. It gets no stdin (COMMAND may need it), shares dlock's stdout and
//! stderr, and is killed if dlock is interrupted while it runs.

use std::process::Stdio;
use tokio::process::Command;

/// Runs `sh -c script` with `DLOCK_KEYS` and `DLOCK_PLACE` (requests ahead
/// of this one) in its environment, and waits for it.
pub async fn on_queued(script: &str, keys: &[String], place: u32) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .env("DLOCK_KEYS", keys.join(","))
        .env("DLOCK_PLACE", place.to_string())
        // The token is dlock's, not the hook's.
        .env_remove("DLOCK_TOKEN")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    match cmd.status().await {
        Ok(s) if s.success() => {}
        Ok(s) => crate::say!("--on-queued command failed ({s}); waiting for the lock anyway"),
        Err(e) => crate::say!("--on-queued command not run: {e}; waiting for the lock anyway"),
    }
}
