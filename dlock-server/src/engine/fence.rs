//! Where fencing tokens start, so that they never go backwards across restarts.
//!
//! Without a fence file the first token of a run is the wall clock in
//! nanoseconds since the Unix epoch, and tokens count up by one per grant. A
//! server cannot grant anywhere near one lock per nanosecond, so the tokens of
//! one run stay below the clock reading at the next start, as long as the
//! clock does not step backwards across the restart.
//!
//! With a fence file the server also persists a ceiling: a value above every
//! token it may issue before it writes a higher one. A restart starts at or
//! above the stored ceiling, so tokens increase even if the clock stepped
//! back. The ceiling is reserved [`RESERVE`] tokens ahead and extended when
//! half of that is used, so the file is written at start and then once per
//! two billion grants.
//!
//! A server holds an exclusive lock (`flock`) on `<fence file>.lock` while it
//! runs: two servers given one fence file would start from the same ceiling
//! and issue the same tokens, so the second is refused. The path is
//! resolved first (symbolic links, `..`), so two spellings of one file are
//! one file, and a fence file that is a symbolic link has its target
//! rewritten, not the link replaced by a file of its own.

use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How many tokens one write of the fence file reserves: about 4.3 seconds
/// of the nanosecond clock, so the stored ceiling stays close to the clock,
/// and over two billion grants, so the file is rewritten rarely.
pub const RESERVE: u64 = 1 << 32;

/// Rings when the lock table's next token reaches the point where the fence
/// file's reservation must be extended. Checked on every grant, so one
/// atomic load; the write happens on the keeper's task, never under the
/// table's lock.
#[derive(Debug)]
pub struct FenceAlarm {
    /// `u64::MAX` until a keeper sets it (no fence file: never rings).
    at: AtomicU64,
    ring: Notify,
}

impl Default for FenceAlarm {
    fn default() -> Self {
        FenceAlarm {
            at: AtomicU64::new(u64::MAX),
            ring: Notify::new(),
        }
    }
}

impl FenceAlarm {
    /// Rings if `next`, the table's next token, has reached the alarm.
    pub fn check(&self, next: u64) {
        if next >= self.at.load(Ordering::Relaxed) {
            self.ring.notify_one();
        }
    }

    fn set(&self, at: u64) {
        self.at.store(at, Ordering::Relaxed);
    }
}

/// What issues fencing tokens and rings an alarm as it does: the local
/// engine's table.
pub trait FenceSource {
    /// The alarm the keeper sets.
    fn fence_alarm(&self) -> &FenceAlarm;
    /// The token the next grant will get.
    fn next_fence(&self) -> u64;
}

/// Keeps `file`'s reservation ahead of the tokens `db` issues, until
/// `shutdown` is cancelled.
pub async fn run_keeper(db: impl FenceSource, mut file: FenceFile, shutdown: CancellationToken) {
    let alarm = db.fence_alarm();
    alarm.set(file.refill_at());
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = alarm.ring.notified() => {}
        }
        let next = db.next_fence();
        let written = tokio::task::spawn_blocking(move || {
            let result = file.reserve(next);
            (file, result)
        })
        .await;
        match written {
            Ok((f, Ok(()))) => {
                file = f;
                alarm.set(file.refill_at());
            }
            Ok((f, Err(e))) => {
                // Half a reservation is still unused; the alarm stays set so
                // the next grant tries again.
                file = f;
                tracing::error!(error = %e, "cannot extend the fence file reservation");
            }
            Err(e) => {
                tracing::error!(error = %e, "fence file writer failed");
                return;
            }
        }
    }
}

/// The persisted ceiling of issued fencing tokens.
#[derive(Debug)]
pub struct FenceFile {
    path: PathBuf,
    ceiling: u64,
    /// Held open, and so locked, for as long as the file is this server's
    /// (shared with the server, which keeps it until it has drained).
    lock: Option<std::sync::Arc<std::fs::File>>,
}

/// `path` with `suffix` appended to its file name: `fence` gives
/// `fence.lock`, and `fence.txt` gives `fence.txt.lock`, so two fence files
/// never share a lock or a temporary file.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Takes the lock that makes `path` this server's alone.
fn lock(path: &Path) -> anyhow::Result<std::fs::File> {
    let lock_path = beside(path, ".lock");
    crate::ops::file_lock::exclusive(&lock_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            anyhow::anyhow!(
                "fence file {} is in use by another dlock-server (it holds {}); two servers \
                 sharing a fence file would issue the same tokens: give each its own --fence-file",
                path.display(),
                lock_path.display()
            )
        } else {
            anyhow::Error::new(e).context(format!("cannot lock {}", lock_path.display()))
        }
    })
}

/// The file `path` names, as one spelling: its target if it is a symbolic
/// link, and otherwise its folder's real path and its name. Two servers given
/// `f` and `./x/../f`, or a link to `f`, must find one lock.
fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    match std::fs::canonicalize(path) {
        Ok(real) if real.is_dir() => bail!(
            "fence file {} is a folder: give a file's path, such as /var/lib/dlock/fence",
            path.display()
        ),
        Ok(real) => return Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read fence file {}", path.display()))
        }
    }
    // Not there yet, or a link to a file not there yet: the file it will
    // be (so that the link and its target find one lock), whose folder
    // must be.
    let parent = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let target = match std::fs::read_link(path) {
        // A relative target is relative to the link's folder.
        Ok(target) => parent(path).join(target),
        Err(_) => path.to_path_buf(),
    };
    let path = target.as_path();
    let Some(name) = path.file_name() else {
        bail!(
            "fence file {} names no file: give a file's path, such as /var/lib/dlock/fence",
            path.display()
        );
    };
    let folder = parent(path);
    let real = std::fs::canonicalize(&folder).with_context(|| {
        format!(
            "cannot use fence file {}: its folder {} is not there (make it first)",
            path.display(),
            folder.display()
        )
    })?;
    Ok(real.join(name))
}

/// Wall-clock nanoseconds since the Unix epoch; 0 for a clock set before it.
pub fn unix_nanos(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Chooses the first token of this run and, with a fence file, reserves
/// tokens from it on disk before any is issued.
///
/// # Errors
/// The fence file cannot be read, does not hold a number, or cannot be written.
pub fn start(path: Option<&Path>, now: SystemTime) -> anyhow::Result<(u64, Option<FenceFile>)> {
    let clock = unix_nanos(now).max(1);
    let Some(given) = path else {
        return Ok((clock, None));
    };
    let resolved = resolve(given)?;
    let path = resolved.as_path();
    let held = lock(path)?;
    let stored = match std::fs::read_to_string(path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(v) => v,
            // Starting over from the clock could hand out old tokens again.
            Err(_) => bail!(
                "fence file {} does not hold a number; fix or remove it",
                path.display()
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read fence file {}", path.display()))
        }
    };
    // Tokens count up by one per grant from here; starting in the lower half
    // of u64 means they cannot wrap in any real server's lifetime.
    if stored > crate::table::MAX_NEXT_FENCE {
        bail!(
            "fence file {} holds {stored}, too close to the largest token; fix or remove it",
            path.display()
        );
    }
    let first = clock.max(stored);
    let mut file = FenceFile {
        path: path.to_path_buf(),
        ceiling: 0,
        lock: Some(std::sync::Arc::new(held)),
    };
    file.reserve(first)
        .with_context(|| format!("cannot write fence file {}", path.display()))?;
    Ok((first, Some(file)))
}

impl FenceFile {
    /// The stored ceiling: every token issued so far is below it.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// The lock that makes the file this server's: whoever keeps a clone
    /// keeps the file from a second server, after the keeper has stopped.
    pub fn lock(&self) -> Option<std::sync::Arc<std::fs::File>> {
        self.lock.clone()
    }

    /// The token from which [`FenceFile::reserve`] should be called again.
    pub fn refill_at(&self) -> u64 {
        self.ceiling.saturating_sub(RESERVE / 2)
    }

    /// Durably stores a ceiling [`RESERVE`] above `next`, the next token to
    /// be issued. Written to a temporary file, synced, then renamed, so a
    /// crash leaves either the old or the new value.
    ///
    /// # Errors
    /// The file or its directory cannot be written or synced.
    pub fn reserve(&mut self, next: u64) -> std::io::Result<()> {
        let ceiling = next.saturating_add(RESERVE);
        let tmp = beside(&self.path, ".tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            writeln!(f, "{ceiling}")?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        // The rename is durable once its directory is synced: for a bare
        // file name, the working directory.
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()?;
        self.ceiling = ceiling;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn clock_derived_without_file() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let (first, file) = start(None, now).unwrap();
        assert_eq!(first, 1_000_000_000_000);
        assert!(file.is_none());
    }

    #[test]
    fn file_survives_clock_stepping_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        let t1 = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000);
        let (first, file) = start(Some(&path), t1).unwrap();
        let ceiling = file.unwrap().ceiling();
        assert!(ceiling > first);
        // Issue many tokens, then restart with the clock an hour earlier.
        let issued_last = first + 1_000_000;
        let t0 = t1 - Duration::from_secs(3_600);
        let (again, _) = start(Some(&path), t0).unwrap();
        assert!(again > issued_last);
        assert!(again >= ceiling);
    }

    #[test]
    fn value_near_the_top_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        std::fs::write(&path, format!("{}\n", u64::MAX - 5)).unwrap();
        assert!(start(Some(&path), SystemTime::now()).is_err());
    }

    #[test]
    fn garbage_file_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        std::fs::write(&path, "not a number").unwrap();
        let err = start(Some(&path), SystemTime::now()).unwrap_err();
        assert!(err.to_string().contains("does not hold a number"));
    }

    #[test]
    fn a_fence_file_in_use_refuses_a_second_server_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.txt");
        let (_, first) = start(Some(&path), SystemTime::now()).unwrap();
        let err = start(Some(&path), SystemTime::now()).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("in use by another dlock-server"), "{text}");
        assert!(text.contains("fence.txt.lock"), "{text}");
        drop(first);
        let (_, again) = start(Some(&path), SystemTime::now()).unwrap();
        assert!(again.is_some());
    }

    #[test]
    fn two_spellings_of_one_fence_file_are_one_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let path = dir.path().join("fence");
        let (_, first) = start(Some(&path), SystemTime::now()).unwrap();
        let first = first.unwrap();
        let roundabout = dir.path().join("sub").join("..").join("fence");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        for other in [&roundabout, &link] {
            let err = start(Some(other), SystemTime::now()).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains("in use by another dlock-server"), "{text}");
        }
        drop(first);
        // A link to a fence file not made yet finds the same lock as the
        // file's own path.
        let ahead = dir.path().join("ahead");
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("ahead", &dangling).unwrap();
        let (_, by_link) = start(Some(&dangling), SystemTime::now()).unwrap();
        let err = start(Some(&ahead), SystemTime::now()).unwrap_err();
        assert!(format!("{err:#}").contains("in use by another dlock-server"));
        drop(by_link);
        assert!(std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink());
        // Through the link the target is rewritten; the link stays a link.
        let (_, through_link) = start(Some(&link), SystemTime::now()).unwrap();
        let ceiling = through_link.unwrap().ceiling();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let stored: u64 = std::fs::read_to_string(&path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(stored, ceiling);
    }

    #[test]
    fn a_fence_file_in_a_missing_folder_or_naming_no_file_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere").join("fence");
        let err = start(Some(&missing), SystemTime::now()).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("is not there (make it first)"), "{text}");
        let err = start(Some(dir.path()), SystemTime::now()).unwrap_err();
        assert!(format!("{err:#}").contains("is a folder"), "{err:#}");
        let err = start(Some(&missing.join("..")), SystemTime::now()).unwrap_err();
        assert!(format!("{err:#}").contains("names no file"), "{err:#}");
    }

    #[test]
    fn refill_point_is_half_way() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = FenceFile {
            path: dir.path().join("fence"),
            ceiling: 0,
            lock: None,
        };
        f.reserve(10).unwrap();
        assert_eq!(f.ceiling(), 10 + RESERVE);
        assert_eq!(f.refill_at(), 10 + RESERVE / 2);
        let stored: u64 = std::fs::read_to_string(dir.path().join("fence"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(stored, f.ceiling());
    }
}
