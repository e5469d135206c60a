//! The least CPU a durable commit costs on this machine's disk, with no
//! consensus code around it: small records appended to a file whose space
//! was allocated and zeroed beforehand, each `pwrite` followed by one
//! `fdatasync`, as a cluster node's log writes them (its segments are
//! preallocated so that a sync carries no metadata).
//!
//! A lock cycle on a three-node cluster is two commits, each synced on
//! every node before or soon after it is answered: at least six of these.
//! Set beside etcd's CPU per cycle in the same run, it tells how much of a
//! CPU bar is left for everything else (`bench/cluster.sh`).

use crate::stats::{Control, Recorder};
use dlock_testkit::proc_sample::ProcSample;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The file's allocated size, a log segment's (16 MiB): the appends wrap
/// around inside it, so a long run never grows it.
const SPACE: u64 = 16 << 20;

/// What a run measured.
pub struct Floor {
    /// Each append's write and sync, timed.
    pub rec: Recorder,
    /// This process's CPU time (user + system) over the appends.
    pub cpu: Duration,
    /// How long the appends took, the allocation before them not counted.
    pub elapsed: Duration,
}

/// Appends `record`-byte records to a new file in `dir`, each synced,
/// until `ctl` says stop; removes the file.
///
/// # Errors
/// The directory cannot take the file, or a write or sync failed.
pub fn measure(ctl: &Control, dir: &Path, record: usize) -> io::Result<Floor> {
    let path = dir.join(format!("dlock-bench-sync-floor.{}", std::process::id()));
    let file = File::create_new(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))?;
    let result = appends(ctl, &path, file, record)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())));
    // Whatever happened, the run leaves nothing behind.
    let _ = std::fs::remove_file(&path);
    result
}

fn appends(ctl: &Control, path: &Path, mut file: File, record: usize) -> io::Result<Floor> {
    allocate(&mut file, path)?;
    let file = OpenOptions::new().write(true).open(path)?;
    // Not all zero, as a real record is not: the bytes still cost the same.
    let bytes: Vec<u8> = (0..record).map(|i| (i % 251) as u8 + 1).collect();
    let slots = (SPACE / record.max(1) as u64).max(1);
    let mut rec = Recorder::default();
    let before = own_cpu()?;
    let start = Instant::now();
    let mut n = 0u64;
    while ctl.next() {
        let started = Instant::now();
        file.write_all_at(&bytes, (n % slots) * record as u64)?;
        file.sync_data()?;
        rec.ok(started.elapsed());
        n += 1;
    }
    let cpu = own_cpu()?.saturating_sub(before);
    Ok(Floor {
        rec,
        cpu,
        elapsed: start.elapsed(),
    })
}

/// Zeroes the whole space and makes it durable, size and all, so that each
/// later sync writes data only.
fn allocate(file: &mut File, path: &Path) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..SPACE >> 20 {
        file.write_all(&zeros)?;
    }
    file.sync_all()?;
    // The new name too, or a crash could lose the file (and a later sync
    // of it would have the directory's metadata to write).
    if let Some(parent) = path.parent().map(PathBuf::from) {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

fn own_cpu() -> io::Result<Duration> {
    ProcSample::of_self()
        .map(|s| s.cpu)
        .ok_or_else(|| io::Error::other("cannot read this process's CPU time from /proc"))
}
