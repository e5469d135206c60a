//! The one door through which the raft log's files (`wal`) and the
//! snapshot file (`snapshot_file`) reach the disk: opening, reading,
//! writing, growing and syncing a file, and listing, renaming, removing and
//! syncing the entries of a directory.
//!
//! Why a door of its own: whether the log survives a power cut depends on
//! which bytes and which directory entries were synced before it, and a
//! process kill cannot show that (the kernel still writes out its page
//! cache). With every operation going through here, unit tests can put the
//! real log on a simulated disk (`storage_sim`) that loses or tears what
//! was never synced, and fails an operation with EIO or ENOSPC on command;
//! and the torture can put a node's log on a volatile disk
//! (`storage_volatile`) whose unsynced writes die with the process.
//!
//! An enum, not a trait object: the write path is hot (one `pwrite` and one
//! `fdatasync` per append), and a match on a variant that is always
//! [`Storage::Real`] in a shipped server costs nothing that matters, where a
//! generic parameter would spread through every type that holds a file.

#[cfg(test)]
use super::storage_sim::{SimDisk, SimFile, SimLock};
#[cfg(feature = "testing")]
use super::storage_volatile::{VolatileDisk, VolatileFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The disk the log's files live on.
#[derive(Clone)]
pub(crate) enum Storage {
    /// The real filesystem, through `std::fs`.
    Real,
    /// An in-memory disk that models power cuts and I/O errors.
    #[cfg(test)]
    Sim(SimDisk),
    /// The real filesystem, every file's writes held in memory until it is
    /// synced: a SIGKILL is a power cut (the torture's).
    #[cfg(feature = "testing")]
    Volatile(VolatileDisk),
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Storage::Real => "Real",
            #[cfg(test)]
            Storage::Sim(_) => "Sim",
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => "Volatile",
        })
    }
}

/// The disk `--test-volatile-disk` asked for, for the whole process: a
/// global rather than a field handed down through the node's start, since
/// it exists only in test builds and the log is all it changes.
#[cfg(feature = "testing")]
static VOLATILE: std::sync::OnceLock<VolatileDisk> = std::sync::OnceLock::new();

/// Puts every raft log this process opens from now on on a volatile disk
/// (see `storage_volatile`) whose torn writes are drawn from `seed`; says
/// whether its data syncs lie (`DLOCK_TEST_LYING_DISK=1`).
#[cfg(feature = "testing")]
pub(crate) fn use_volatile_disk(seed: u64) -> bool {
    // A second call (a second node in one test process) keeps the first.
    VOLATILE.get_or_init(|| VolatileDisk::new(seed)).lies()
}

/// An open file on a [`Storage`].
pub(crate) enum StorageFile {
    /// A real file.
    Real(File),
    /// A file on a simulated disk.
    #[cfg(test)]
    Sim(SimFile),
    /// A real file whose writes wait in memory for its sync.
    #[cfg(feature = "testing")]
    Volatile(VolatileFile),
}

/// An exclusive hold on a path, released when dropped (or when the process
/// ends): what keeps two writers off one log.
// Never read: held for what dropping them does.
#[allow(dead_code)]
pub(crate) enum StorageLock {
    /// A real file held with `flock`.
    Real(File),
    /// A hold on a simulated disk.
    #[cfg(test)]
    Sim(SimLock),
}

impl Storage {
    /// The disk a node's raft log is on: the real one, unless a test build
    /// was asked for a volatile one.
    pub(crate) fn for_log() -> Storage {
        #[cfg(feature = "testing")]
        if let Some(disk) = VOLATILE.get() {
            return Storage::Volatile(disk.clone());
        }
        Storage::Real
    }

    /// Whether `path` is a directory.
    pub(crate) fn is_dir(&self, path: &Path) -> bool {
        match self {
            Storage::Real => path.is_dir(),
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => path.is_dir(),
            #[cfg(test)]
            Storage::Sim(d) => d.is_dir(path),
        }
    }

    /// Makes `path` and any missing parents, and syncs the directory each
    /// new one was made in: a directory made at a node's first start and
    /// lost to a power cut would take the log (and the vote in it) with it.
    ///
    /// # Errors
    /// A directory cannot be made or synced.
    pub(crate) fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        if self.is_dir(path) {
            return Ok(());
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            // A relative path of one component.
            _ => Path::new("."),
        };
        self.create_dir_all(parent)?;
        match self {
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => Storage::Real.create_dir_all(path)?,
            Storage::Real => match std::fs::create_dir(path) {
                Ok(()) => {}
                // Made by another process meanwhile; synced below all the same.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
                Err(e) => return Err(e),
            },
            #[cfg(test)]
            Storage::Sim(d) => d.create_dir(path)?,
        }
        self.sync_dir(parent)
    }

    /// Removes the directory `path` and everything in it.
    ///
    /// # Errors
    /// Something in it cannot be removed.
    pub(crate) fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        match self {
            Storage::Real => std::fs::remove_dir_all(path),
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => std::fs::remove_dir_all(path),
            #[cfg(test)]
            Storage::Sim(d) => d.remove_dir_all(path),
        }
    }

    /// The names of the entries of directory `path`, in no order; names
    /// that are not UTF-8 are left out (the log never makes one).
    ///
    /// # Errors
    /// The directory cannot be read.
    pub(crate) fn list(&self, path: &Path) -> io::Result<Vec<String>> {
        match self {
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => Storage::Real.list(path),
            Storage::Real => {
                let mut names = Vec::new();
                for item in std::fs::read_dir(path)? {
                    if let Ok(name) = item?.file_name().into_string() {
                        names.push(name);
                    }
                }
                Ok(names)
            }
            #[cfg(test)]
            Storage::Sim(d) => d.list(path),
        }
    }

    /// Opens the existing file `path` to read and write.
    ///
    /// # Errors
    /// It does not exist or cannot be opened.
    pub(crate) fn open(&self, path: &Path) -> io::Result<StorageFile> {
        match self {
            Storage::Real => OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map(StorageFile::Real),
            #[cfg(test)]
            Storage::Sim(d) => d.open(path).map(StorageFile::Sim),
            #[cfg(feature = "testing")]
            Storage::Volatile(v) => match Storage::Real.open(path)? {
                StorageFile::Real(f) => v.wrap(f).map(StorageFile::Volatile),
                other => Ok(other),
            },
        }
    }

    /// Creates `path` empty to read and write (emptying it if it exists,
    /// or refusing if `new` and it exists). The new name is durable only
    /// once the directory is synced.
    ///
    /// # Errors
    /// It cannot be created.
    pub(crate) fn create(&self, path: &Path, new: bool) -> io::Result<StorageFile> {
        match self {
            Storage::Real => {
                let mut options = OpenOptions::new();
                options.read(true).write(true);
                if new {
                    options.create_new(true);
                } else {
                    options.create(true).truncate(true);
                }
                options.open(path).map(StorageFile::Real)
            }
            #[cfg(test)]
            Storage::Sim(d) => d.create(path, new).map(StorageFile::Sim),
            #[cfg(feature = "testing")]
            Storage::Volatile(v) => match Storage::Real.create(path, new)? {
                StorageFile::Real(f) => v.wrap(f).map(StorageFile::Volatile),
                other => Ok(other),
            },
        }
    }

    /// Takes the exclusive hold on `path` (a file created if missing).
    ///
    /// # Errors
    /// `ErrorKind::WouldBlock` when another holder has it; any other error
    /// when the file cannot be made or locked.
    pub(crate) fn lock(&self, path: &Path) -> io::Result<StorageLock> {
        match self {
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => Storage::Real.lock(path),
            Storage::Real => crate::ops::file_lock::exclusive(path).map(StorageLock::Real),
            #[cfg(test)]
            Storage::Sim(d) => d.lock(path).map(StorageLock::Sim),
        }
    }

    /// Renames `from` to `to`, replacing `to` in one step. Durable only
    /// once the directory is synced.
    ///
    /// # Errors
    /// The rename failed; nothing changed.
    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Storage::Real => std::fs::rename(from, to),
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => std::fs::rename(from, to),
            #[cfg(test)]
            Storage::Sim(d) => d.rename(from, to),
        }
    }

    /// Removes the file `path`. Durable only once the directory is synced.
    ///
    /// # Errors
    /// It cannot be removed.
    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<()> {
        match self {
            Storage::Real => std::fs::remove_file(path),
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => std::fs::remove_file(path),
            #[cfg(test)]
            Storage::Sim(d) => d.remove_file(path),
        }
    }

    /// Makes the entries of directory `path` (files made, renamed or
    /// removed in it) durable.
    ///
    /// # Errors
    /// The sync failed: which of those entries reached the disk is unknown.
    pub(crate) fn sync_dir(&self, path: &Path) -> io::Result<()> {
        match self {
            Storage::Real => File::open(path)?.sync_all(),
            #[cfg(feature = "testing")]
            Storage::Volatile(_) => File::open(path)?.sync_all(),
            #[cfg(test)]
            Storage::Sim(d) => d.sync_dir(path),
        }
    }
}

impl StorageFile {
    /// The real file, for what needs one (tokio's, to stream a snapshot
    /// to openraft).
    ///
    /// # Errors
    /// It is a simulated file, or one whose writes are held in memory.
    pub(crate) fn into_real(self) -> io::Result<File> {
        match self {
            StorageFile::Real(f) => Ok(f),
            #[allow(unreachable_patterns)]
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not a real file: a simulated or volatile disk",
            )),
        }
    }

    /// The file's length.
    ///
    /// # Errors
    /// Its metadata cannot be read.
    pub(crate) fn len(&self) -> io::Result<u64> {
        match self {
            StorageFile::Real(f) => Ok(f.metadata()?.len()),
            #[cfg(test)]
            StorageFile::Sim(f) => f.len(),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.len(),
        }
    }

    /// Fills `buf` from byte `at`.
    ///
    /// # Errors
    /// The read failed or the file ends before `buf` is full.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            StorageFile::Real(f) => f.read_exact_at(buf, at),
            #[cfg(test)]
            StorageFile::Sim(f) => f.read_exact_at(buf, at),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.read_exact_at(buf, at),
        }
    }

    /// Writes all of `buf` at byte `at`; durable only once synced.
    ///
    /// # Errors
    /// The write failed: how much of it reached the file is unknown.
    pub(crate) fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        match self {
            StorageFile::Real(f) => f.write_all_at(buf, at),
            #[cfg(test)]
            StorageFile::Sim(f) => f.write_all_at(buf, at),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.write_all_at(buf, at),
        }
    }

    /// Makes the file `len` bytes long, its blocks allocated beforehand so
    /// that writes below `len` need no block allocation (where the
    /// filesystem cannot, only the length is set). The blocks are allocated
    /// first without changing the length, then the length is set in one
    /// step: an allocation that fails half way (a full disk) or a crash
    /// leaves the old length. Durable only once synced.
    ///
    /// # Errors
    /// The disk is full, or the length cannot be set.
    pub(crate) fn allocate(&self, len: u64) -> io::Result<()> {
        match self {
            StorageFile::Real(f) => {
                #[cfg(target_os = "linux")]
                {
                    use rustix::fs::{fallocate, FallocateFlags};
                    match fallocate(f, FallocateFlags::KEEP_SIZE, 0, len) {
                        Ok(()) => {}
                        Err(e) if e == rustix::io::Errno::OPNOTSUPP => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                f.set_len(len)
            }
            #[cfg(test)]
            StorageFile::Sim(f) => f.set_len(len),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.allocate(len),
        }
    }

    /// Makes the file's bytes and length durable (`fdatasync`).
    ///
    /// # Errors
    /// The sync failed: what was written since the last sync may be lost
    /// even if a later sync succeeds, so it must not be retried.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        match self {
            StorageFile::Real(f) => f.sync_data(),
            #[cfg(test)]
            StorageFile::Sim(f) => f.sync(),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.sync(false),
        }
    }

    /// [`StorageFile::sync_data`], and the file's other metadata too
    /// (`fsync`).
    ///
    /// # Errors
    /// As for [`StorageFile::sync_data`].
    pub(crate) fn sync_all(&self) -> io::Result<()> {
        match self {
            StorageFile::Real(f) => f.sync_all(),
            #[cfg(test)]
            StorageFile::Sim(f) => f.sync(),
            #[cfg(feature = "testing")]
            StorageFile::Volatile(f) => f.sync(true),
        }
    }
}

/// An unpredictable number, from the random keys std seeds its hash maps
/// with: the salt of a log segment, the suffix of a snapshot's temporary
/// name.
pub(crate) fn unpredictable() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    // The low half of a 64-bit hash: no bias that matters here.
    h.finish() as u32
}

/// Reads a [`StorageFile`] front to back from a position of its own, so a
/// `BufReader` can stand on it (the file itself is read by offset only).
pub(crate) struct ReadFrom<'a> {
    file: &'a StorageFile,
    at: u64,
}

impl<'a> ReadFrom<'a> {
    /// Reads `file` from byte `at` on.
    pub(crate) fn new(file: &'a StorageFile, at: u64) -> Self {
        ReadFrom { file, at }
    }
}

impl io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = self.file.len()?;
        let n = usize::try_from(len.saturating_sub(self.at))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        self.file.read_exact_at(&mut buf[..n], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}
