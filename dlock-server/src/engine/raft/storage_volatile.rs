//! For the torture only (the `testing` feature, `--test-volatile-disk`):
//! the raft log's files on the real disk, but every write and length
//! change held in the process's memory until the file is synced, so that a
//! SIGKILL of the node is a power cut.
//!
//! Why: after a plain SIGKILL the kernel still writes out what the process
//! wrote, so a kill shows nothing about what was synced. Here a file's sync
//! writes its held bytes and then fsyncs them; what was never synced dies
//! with the process. Some writes also reach the file early, a prefix torn
//! at a random byte, as a disk that had written part of the page cache
//! back when the power went: the file then holds a torn tail for the next
//! start to deal with.
//!
//! The negative control: with `DLOCK_TEST_LYING_DISK=1` in the node's
//! environment, `fdatasync` (every append's sync) reports success and
//! writes nothing (a new segment's `fsync` still works, so the node finds
//! its files): a power cut then loses acknowledged entries, and the
//! torture must report it.
//!
//! Directory entries (a new segment's rename, a purged segment's removal)
//! are made at once: the log syncs the directory right after each, so
//! there is no window to speak of here. Unsynced directory entries are
//! what the unit tests' simulated disk (`storage_sim`) covers.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One in this many writes reaches the file early, torn.
const EARLY_ONE_IN: u64 = 4;

/// The volatile disk of one node process: a seed from which each file
/// draws its own, and whether its data syncs lie.
#[derive(Clone)]
pub(crate) struct VolatileDisk {
    seed: Arc<AtomicU64>,
    lies: bool,
}

impl VolatileDisk {
    /// A disk whose torn early writes are drawn from `seed`.
    pub(crate) fn new(seed: u64) -> VolatileDisk {
        VolatileDisk {
            seed: Arc::new(AtomicU64::new(seed)),
            lies: std::env::var_os("DLOCK_TEST_LYING_DISK").is_some_and(|v| v == "1"),
        }
    }

    /// Whether its data syncs lie (the negative control).
    pub(crate) fn lies(&self) -> bool {
        self.lies
    }

    /// `file`, its writes held until synced.
    pub(crate) fn wrap(&self, file: File) -> io::Result<VolatileFile> {
        let len = file.metadata()?.len();
        let seed = self
            .seed
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        Ok(VolatileFile {
            file,
            lies: self.lies,
            held: Mutex::new(Held {
                writes: Vec::new(),
                len,
                set_len: None,
                rng: seed,
            }),
        })
    }
}

struct Held {
    /// Writes not yet synced, in order.
    writes: Vec<(u64, Vec<u8>)>,
    /// The length reads see.
    len: u64,
    /// A length set and not yet synced.
    set_len: Option<u64>,
    rng: u64,
}

impl Held {
    /// splitmix64.
    fn below(&mut self, n: u64) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// A real file whose writes wait in memory for its sync.
pub(crate) struct VolatileFile {
    file: File,
    lies: bool,
    held: Mutex<Held>,
}

impl VolatileFile {
    fn held(&self) -> MutexGuard<'_, Held> {
        // Plain data, valid whatever a panicking holder did.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn len(&self) -> io::Result<u64> {
        Ok(self.held().len)
    }

    pub(crate) fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        let held = self.held();
        let end = at.saturating_add(buf.len() as u64);
        if end > held.len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        // The file's bytes (zero past its end on disk), then the held
        // writes over them in order.
        let on_disk = self.file.metadata()?.len();
        buf.fill(0);
        if at < on_disk {
            let n = usize::try_from(on_disk - at).map_or(buf.len(), |n| n.min(buf.len()));
            self.file.read_exact_at(&mut buf[..n], at)?;
        }
        for (w_at, bytes) in &held.writes {
            let from = (*w_at).max(at);
            let to = (w_at + bytes.len() as u64).min(end);
            if from < to {
                let (src, dst) = ((from - w_at) as usize, (from - at) as usize);
                let n = (to - from) as usize;
                buf[dst..dst + n].copy_from_slice(&bytes[src..src + n]);
            }
        }
        Ok(())
    }

    pub(crate) fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        let mut held = self.held();
        if held.below(EARLY_ONE_IN) == 0 {
            // Part of it reached the disk already: a prefix, within what
            // the file's length on disk covers (bytes past it would need
            // the length change, still held).
            let on_disk = self.file.metadata()?.len();
            let room = on_disk.saturating_sub(at).min(buf.len() as u64);
            let n = held.below(room + 1) as usize;
            if n > 0 {
                self.file.write_all_at(&buf[..n], at)?;
            }
        }
        held.writes.push((at, buf.to_vec()));
        held.len = held.len.max(at + buf.len() as u64);
        Ok(())
    }

    /// Allocates at once (that changes nothing a reader sees) and holds
    /// the new length.
    pub(crate) fn allocate(&self, len: u64) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            use rustix::fs::{fallocate, FallocateFlags};
            match fallocate(&self.file, FallocateFlags::KEEP_SIZE, 0, len) {
                Ok(()) => {}
                Err(e) if e == rustix::io::Errno::OPNOTSUPP => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut held = self.held();
        held.set_len = Some(len);
        held.len = len;
        Ok(())
    }

    /// Writes what is held, then syncs it (`all`: `fsync`, else
    /// `fdatasync`, which the negative control turns into a lie).
    pub(crate) fn sync(&self, all: bool) -> io::Result<()> {
        if self.lies && !all {
            // Held on: reads still see it, a SIGKILL loses it.
            return Ok(());
        }
        let mut held = self.held();
        if let Some(len) = held.set_len.take() {
            self.file.set_len(len)?;
        }
        for (at, bytes) in held.writes.drain(..) {
            self.file.write_all_at(&bytes, at)?;
        }
        if all {
            self.file.sync_all()
        } else {
            self.file.sync_data()
        }
    }
}
