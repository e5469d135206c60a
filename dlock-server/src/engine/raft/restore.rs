//! Restoring a whole cluster from a backup without handing out a fencing
//! token twice (`dlock-server --restore-backup`).
//!
//! A backup is one node's data directory, copied while that node was
//! stopped. The cluster went on after it: it issued fences the backup does
//! not know, and its clients' sessions moved on. Started from the backup as
//! it is, the cluster would issue those fences again, and a client whose
//! session is in the backup could resume it and go on reporting a lock the
//! restored table has free and may grant again. So the directory is
//! prepared once, offline, before it is copied to every node: one more log
//! entry, committed, holding [`Command::Restore`], which every node applies
//! at its first start: the next fence jumps above anything the old cluster
//! could have issued, and every session in the backup ends (its clients
//! are told `UnknownSession` when they try to resume).
//!
//! The floor is the wall clock in nanoseconds unless given: the old
//! cluster's fences grew by one per grant from 1 (or from an earlier
//! restore's floor, itself a clock reading), and no cluster grants a lock
//! per nanosecond, so as long as the clock of the machine preparing the
//! restore does not run behind the one that prepared the last, the floor is
//! above every fence issued. The single server's fence file makes the same
//! assumption. Give `--fence-floor` to choose it yourself.
//!
//! The directory's identity file (`identity`) loses its node id, so that
//! every node may start on a copy.

use super::log::OfflineLog;
use super::snapshot_file::SnapshotFile;
use super::types::Stamped;
use crate::table::{Command, Time};
use anyhow::Context;
use std::path::Path;
use std::time::SystemTime;

/// What a restore did, for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// The index of the entry it appended.
    pub index: u64,
    /// Every fence issued from now on is at least this.
    pub fence_floor: u64,
}

/// Prepares the backup in `dir` (no node may run on it) to be a whole
/// cluster's state: see the module documentation. `fence_floor`: the least
/// token granted afterwards; `None`, the wall clock in nanoseconds.
///
/// # Errors
/// `dir` holds no cluster log (not a data directory, or one never used),
/// a node runs on it, or it cannot be written.
pub fn restore_backup(dir: &Path, fence_floor: Option<u64>) -> anyhow::Result<Restored> {
    if !dir.join(super::log::DIR).is_dir() && !dir.join(super::log::REDB_FILE).is_file() {
        anyhow::bail!(
            "{} holds no raft log ({}/ or {}): give the copy of a node's data directory",
            dir.display(),
            super::log::DIR,
            super::log::REDB_FILE
        );
    }
    let fence_floor = match fence_floor {
        Some(f) => f,
        None => clock_nanos()?,
    };
    let entry = Stamped {
        at: Time::ZERO,
        cmds: vec![Command::Restore { fence_floor }],
    };
    // The log first: holding it open is what keeps a node from starting on
    // the directory meanwhile (and refuses one that runs on it), before
    // opening the snapshot tidies its temporary files.
    let log = OfflineLog::open(dir).map_err(|e| {
        anyhow::Error::new(e).context(format!("cannot open the raft log in {}", dir.display()))
    })?;
    let (_, snapshot) = SnapshotFile::open(dir)
        .with_context(|| format!("cannot read the snapshot in {}", dir.display()))?;
    let covered = snapshot.and_then(|found| found.meta.last_log_id);
    let appended = log
        .append_committed(covered, entry)
        .with_context(|| format!("cannot write the raft log in {}", dir.display()))?;
    let Some(id) = appended else {
        anyhow::bail!(
            "{}'s log holds no entry: this directory never belonged to a running cluster",
            dir.display()
        );
    };
    // The copy goes to every node: its identity keeps the cluster and the
    // role, and each node's first start fills in its own id. A backup of a
    // version without the file gets it from each node's flags instead.
    if let Some(found) = super::identity::read(dir)? {
        super::identity::write(dir, &super::identity::for_restore(&found))?;
    }
    Ok(Restored {
        index: id.index,
        fence_floor,
    })
}

fn clock_nanos() -> anyhow::Result<u64> {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .context("the system clock is before 1970: give --fence-floor")?;
    u64::try_from(since.as_nanos()).context("the system clock is past 2554: give --fence-floor")
}
