//! Stamps the build with the commit it was made from, so `--version`,
//! `dlock_build_info` and `dlock cluster status` can name it (an upgrade
//! rule names commits). `DLOCK_COMMIT` in the environment wins (a Docker
//! build has no `.git`); without either, the commit is "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DLOCK_COMMIT");
    let from_env = std::env::var("DLOCK_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = from_env
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DLOCK_COMMIT={}", commit.trim());
}

/// The short hash of HEAD, when this is a git checkout with git installed;
/// reruns when HEAD moves.
fn git_commit() -> Option<String> {
    let git_dir = Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let git_dir = String::from_utf8(git_dir.stdout).ok()?;
    let git_dir = Path::new(git_dir.trim());
    // Only files that exist: a missing one would rerun this on every build.
    for f in ["HEAD", "packed-refs"] {
        if git_dir.join(f).exists() {
            println!("cargo:rerun-if-changed={}", git_dir.join(f).display());
        }
    }
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD")) {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            if git_dir.join(r).exists() {
                println!("cargo:rerun-if-changed={}", git_dir.join(r).display());
            }
        }
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8(out.stdout).ok()
}
