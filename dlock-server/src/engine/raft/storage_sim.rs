//! A simulated disk for tests: the raft log's files in memory, with what
//! was synced kept apart from what was not, so a test can cut the power and
//! see what a real disk could have kept.
//!
//! Why: a process kill shows nothing about durability (the kernel still
//! writes the page cache out), and LazyFS, the FUSE filesystem that can,
//! is not something every test run has. The model follows LazyFS and the
//! ALICE crash studies:
//! - every write or length change of a file since its last sync is, at a
//!   [`SimDisk::power_cut`], lost, kept, or kept as a prefix torn at any
//!   byte (inside a 512-byte sector or at a sector edge), each on its own;
//! - every directory entry made, renamed or removed since the directory's
//!   last sync is kept or lost, each on its own (a rename whole or not at
//!   all);
//! - an operation can be made to fail with EIO or ENOSPC
//!   ([`SimDisk::fail_next`]). A failed sync of a file forgets what it
//!   should have written, as Linux does (it marks the pages clean): a later
//!   sync that succeeds does not make those bytes durable, so code that
//!   retries a failed sync and trusts it loses data here as on a real disk.
//!
//! A cut ends every file handle and lock of the "process" that ran before
//! it: they fail with EIO from then on.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// EIO on Linux.
pub(crate) const EIO: i32 = 5;
/// ENOSPC on Linux.
pub(crate) const ENOSPC: i32 = 28;
const SECTOR: u64 = 512;

/// The kinds of operation a test can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Creating or opening a file or directory.
    Open,
    /// Reading a file.
    Read,
    /// Writing a file.
    Write,
    /// Setting a file's length (allocating it).
    SetLen,
    /// Syncing a file.
    Sync,
    /// Syncing a directory.
    SyncDir,
    /// Renaming.
    Rename,
    /// Removing a file.
    Remove,
}

/// The simulated disk; clones share it.
#[derive(Clone, Default)]
pub(crate) struct SimDisk(Arc<Mutex<State>>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(usize),
}

#[derive(Debug)]
enum DirOp {
    /// `path` appeared.
    Put {
        path: PathBuf,
        node: Node,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    Remove {
        path: PathBuf,
    },
}

impl DirOp {
    /// The directories whose sync makes it durable.
    fn touches(&self, dir: &Path) -> bool {
        let parent_is = |p: &Path| p.parent() == Some(dir);
        match self {
            DirOp::Put { path, .. } | DirOp::Remove { path } => parent_is(path),
            DirOp::Rename { from, to } => parent_is(from) || parent_is(to),
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, Node>) {
        let parent_there = |names: &BTreeMap<PathBuf, Node>, p: &Path| {
            p.parent()
                .is_none_or(|d| d == Path::new("/") || names.get(d) == Some(&Node::Dir))
        };
        match self {
            DirOp::Put { path, node } => {
                if parent_there(names, path) {
                    names.insert(path.clone(), *node);
                }
            }
            DirOp::Rename { from, to } => {
                // Atomic: the new name takes the node, or nothing happens.
                if parent_there(names, to) {
                    if let Some(node) = names.remove(from) {
                        names.insert(to.clone(), node);
                    }
                }
            }
            DirOp::Remove { path } => {
                names.remove(path);
            }
        }
    }
}

#[derive(Debug)]
enum FileOp {
    /// `extends`: the write reached past the file's end when it was made,
    /// so it carries its own change of length. One that did not cannot
    /// make the file longer after a cut: the length it wrote inside came
    /// from a length change, which the cut may have lost.
    Write {
        at: u64,
        bytes: Vec<u8>,
        extends: bool,
    },
    SetLen(u64),
}

#[derive(Default)]
struct Inode {
    /// What reads see.
    live: Vec<u8>,
    /// What a power cut starts from.
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    pending: Vec<FileOp>,
}

#[derive(Default)]
struct State {
    /// The names reads see, and the names on the disk. "/" always exists.
    live: BTreeMap<PathBuf, Node>,
    durable: BTreeMap<PathBuf, Node>,
    /// Directory changes not yet synced, in order.
    pending: Vec<DirOp>,
    /// Directory changes whose sync failed: never made durable by a later
    /// sync, but a cut may still keep them.
    uncertain: Vec<DirOp>,
    inodes: Vec<Inode>,
    faults: Vec<(Op, i32)>,
    locked: BTreeSet<PathBuf>,
    /// Bumped by a power cut: handles from before it are dead.
    boot: u64,
    /// Syncs that do nothing: the negative control.
    lying: bool,
    /// Operations left before the "process" dies mid-way: every one after
    /// that fails until the next power cut.
    countdown: Option<u64>,
    /// What the last power cut did, for a test's failure message.
    last_cut: Vec<String>,
}

/// An open file on a [`SimDisk`].
pub(crate) struct SimFile {
    disk: SimDisk,
    inode: usize,
    boot: u64,
}

/// A hold on a path of a [`SimDisk`]; see [`super::storage::StorageLock`].
pub(crate) struct SimLock {
    disk: SimDisk,
    path: PathBuf,
    boot: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut s = self.disk.state();
        if s.boot == self.boot {
            s.locked.remove(&self.path);
        }
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory", path.display()),
    )
}

fn dead() -> io::Error {
    io::Error::other("simulated disk: the power was cut since this file was opened")
}

/// Writes `bytes` into `data` at `at`, growing it if they reach past its
/// end.
fn apply_write(data: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let at = usize::try_from(at).unwrap_or(usize::MAX);
    let end = at.saturating_add(bytes.len());
    if data.len() < end {
        data.resize(end, 0);
    }
    data[at..end].copy_from_slice(bytes);
}

/// splitmix64: enough randomness for choosing what a cut keeps, and the
/// same choices for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

impl SimDisk {
    /// An empty disk with only `/`.
    pub(crate) fn new() -> SimDisk {
        let disk = SimDisk::default();
        {
            let mut s = disk.state();
            s.live.insert(PathBuf::from("/"), Node::Dir);
            s.durable.insert(PathBuf::from("/"), Node::Dir);
        }
        disk
    }

    /// A disk whose syncs succeed and do nothing: a test of durability must
    /// fail on it, which shows that it can fail.
    pub(crate) fn lying() -> SimDisk {
        let disk = SimDisk::new();
        disk.state().lying = true;
        disk
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain data, valid whatever a panicking test did.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the next operation of kind `op` fail with OS error `errno`
    /// ([`EIO`], [`ENOSPC`]); several queue up.
    pub(crate) fn fail_next(&self, op: Op, errno: i32) {
        self.state().faults.push((op, errno));
    }

    /// Lets `n` more operations through, then fails every one until the
    /// next [`SimDisk::power_cut`]: the machine died in the middle of
    /// whatever the code was doing (a rotation, a purge's deletions).
    pub(crate) fn die_after(&self, n: u64) {
        self.state().countdown = Some(n);
    }

    /// Whether [`SimDisk::die_after`]'s operations ran out.
    pub(crate) fn died(&self) -> bool {
        self.state().countdown == Some(0)
    }

    /// Cuts the power: every unsynced change is lost, kept or torn, as the
    /// module documentation says, chosen by `seed`. Every handle open
    /// before is dead afterwards.
    pub(crate) fn power_cut(&self, seed: u64) {
        let mut rng = Rng(seed);
        let mut s = self.state();
        let mut log = Vec::new();
        let mut ops = std::mem::take(&mut s.uncertain);
        ops.append(&mut s.pending);
        let mut durable = std::mem::take(&mut s.durable);
        for op in ops {
            if rng.below(2) == 0 {
                log.push(format!("kept {op:?}"));
                op.apply(&mut durable);
            } else {
                log.push(format!("lost {op:?}"));
            }
        }
        s.live = durable.clone();
        s.durable = durable;
        for (ino, inode) in s.inodes.iter_mut().enumerate() {
            let mut data = std::mem::take(&mut inode.durable);
            for op in inode.pending.drain(..) {
                match op {
                    FileOp::SetLen(len) => {
                        if rng.below(2) == 0 {
                            data.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
                            log.push(format!("inode {ino}: kept length {len}"));
                        } else {
                            log.push(format!("inode {ino}: lost length {len}"));
                        }
                    }
                    FileOp::Write { at, bytes, extends } => {
                        let n = bytes.len() as u64;
                        let keep = match rng.below(4) {
                            0 => 0,
                            1 => n,
                            2 => rng.below(n + 1),
                            // Torn where a sector ends.
                            _ => ((at / SECTOR + 1 + rng.below(n / SECTOR + 1)) * SECTOR)
                                .saturating_sub(at)
                                .min(n),
                        };
                        // No hole: bytes past the end whose length change
                        // was lost are unreachable.
                        let keep = if extends {
                            if at > data.len() as u64 {
                                0
                            } else {
                                keep
                            }
                        } else {
                            keep.min((data.len() as u64).saturating_sub(at))
                        };
                        log.push(format!(
                            "inode {ino}: write of {n} at {at}: kept {keep} bytes"
                        ));
                        apply_write(&mut data, at, &bytes[..keep as usize]);
                    }
                }
            }
            inode.live = data.clone();
            inode.durable = data;
        }
        s.locked.clear();
        s.countdown = None;
        s.boot += 1;
        s.last_cut = log;
    }

    /// Makes everything written so far durable, whatever the syncs did:
    /// a test's starting point (a directory that existed long before).
    pub(crate) fn settle(&self) {
        let mut s = self.state();
        let mut ops = std::mem::take(&mut s.uncertain);
        ops.append(&mut s.pending);
        for op in &ops {
            op.apply(&mut s.durable);
        }
        for inode in &mut s.inodes {
            inode.durable = inode.live.clone();
            inode.pending.clear();
        }
    }

    /// What the last power cut kept and lost, one line each.
    pub(crate) fn last_cut(&self) -> Vec<String> {
        self.state().last_cut.clone()
    }

    /// The durable bytes of `path` as the disk holds them now.
    pub(crate) fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.state();
        match s.durable.get(path) {
            Some(Node::File(ino)) => Some(s.inodes[*ino].durable.clone()),
            _ => None,
        }
    }

    pub(crate) fn is_dir(&self, path: &Path) -> bool {
        self.state().live.get(path) == Some(&Node::Dir)
    }

    pub(crate) fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fault(Op::Open)?;
        s.check_parent(path)?;
        if s.live.contains_key(path) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        s.put(path, Node::Dir);
        Ok(())
    }

    pub(crate) fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fault(Op::Remove)?;
        let under: Vec<PathBuf> = s
            .live
            .keys()
            .filter(|p| p.starts_with(path))
            .rev()
            .cloned()
            .collect();
        if under.is_empty() {
            return Err(not_found(path));
        }
        for p in under {
            s.live.remove(&p);
            s.pending.push(DirOp::Remove { path: p });
        }
        Ok(())
    }

    pub(crate) fn list(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut s = self.state();
        s.fault(Op::Read)?;
        if s.live.get(path) != Some(&Node::Dir) {
            return Err(not_found(path));
        }
        Ok(s.live
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    pub(crate) fn open(&self, path: &Path) -> io::Result<SimFile> {
        let mut s = self.state();
        s.fault(Op::Open)?;
        match s.live.get(path) {
            Some(Node::File(inode)) => Ok(SimFile {
                disk: self.clone(),
                inode: *inode,
                boot: s.boot,
            }),
            _ => Err(not_found(path)),
        }
    }

    pub(crate) fn create(&self, path: &Path, new: bool) -> io::Result<SimFile> {
        let mut s = self.state();
        s.fault(Op::Open)?;
        s.check_parent(path)?;
        let inode = match s.live.get(path).copied() {
            Some(_) if new => return Err(io::Error::from(io::ErrorKind::AlreadyExists)),
            Some(Node::Dir) => return Err(io::Error::other("a directory")),
            Some(Node::File(inode)) => {
                let i = &mut s.inodes[inode];
                i.live.clear();
                i.pending.push(FileOp::SetLen(0));
                inode
            }
            None => {
                s.inodes.push(Inode::default());
                let inode = s.inodes.len() - 1;
                s.put(path, Node::File(inode));
                inode
            }
        };
        Ok(SimFile {
            disk: self.clone(),
            inode,
            boot: s.boot,
        })
    }

    pub(crate) fn lock(&self, path: &Path) -> io::Result<SimLock> {
        let mut s = self.state();
        if !s.live.contains_key(path) {
            s.check_parent(path)?;
            s.inodes.push(Inode::default());
            let inode = s.inodes.len() - 1;
            s.put(path, Node::File(inode));
        }
        if !s.locked.insert(path.to_path_buf()) {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        Ok(SimLock {
            disk: self.clone(),
            path: path.to_path_buf(),
            boot: s.boot,
        })
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fault(Op::Rename)?;
        s.check_parent(to)?;
        let node = s.live.remove(from).ok_or_else(|| not_found(from))?;
        s.live.insert(to.to_path_buf(), node);
        s.pending.push(DirOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        });
        Ok(())
    }

    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fault(Op::Remove)?;
        match s.live.get(path) {
            Some(Node::File(_)) => {}
            _ => return Err(not_found(path)),
        }
        s.live.remove(path);
        s.pending.push(DirOp::Remove {
            path: path.to_path_buf(),
        });
        Ok(())
    }

    pub(crate) fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        if s.live.get(path) != Some(&Node::Dir) {
            return Err(not_found(path));
        }
        let failed = s.fault(Op::SyncDir);
        if s.lying && failed.is_ok() {
            return Ok(());
        }
        let (now, later): (Vec<DirOp>, Vec<DirOp>) = std::mem::take(&mut s.pending)
            .into_iter()
            .partition(|op| op.touches(path));
        s.pending = later;
        match failed {
            Ok(()) => {
                let mut durable = std::mem::take(&mut s.durable);
                for op in &now {
                    op.apply(&mut durable);
                }
                s.durable = durable;
                Ok(())
            }
            Err(e) => {
                s.uncertain.extend(now);
                Err(e)
            }
        }
    }
}

impl State {
    /// The error a test asked for, if the next `op` is to fail.
    fn fault(&mut self, op: Op) -> io::Result<()> {
        match self.countdown {
            Some(0) => return Err(io::Error::other("simulated disk: the machine died")),
            Some(n) => self.countdown = Some(n - 1),
            None => {}
        }
        match self.faults.iter().position(|(o, _)| *o == op) {
            Some(i) => {
                let (_, errno) = self.faults.remove(i);
                Err(io::Error::from_raw_os_error(errno))
            }
            None => Ok(()),
        }
    }

    fn check_parent(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(dir) if self.live.get(dir) == Some(&Node::Dir) => Ok(()),
            Some(dir) => Err(not_found(dir)),
            None => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
        }
    }

    fn put(&mut self, path: &Path, node: Node) {
        self.live.insert(path.to_path_buf(), node);
        self.pending.push(DirOp::Put {
            path: path.to_path_buf(),
            node,
        });
    }
}

impl SimFile {
    fn with<T>(&self, op: Op, f: impl FnOnce(&mut Inode, bool) -> io::Result<T>) -> io::Result<T> {
        let mut s = self.disk.state();
        if s.boot != self.boot {
            return Err(dead());
        }
        s.fault(op)?;
        let lying = s.lying;
        f(&mut s.inodes[self.inode], lying)
    }

    pub(crate) fn len(&self) -> io::Result<u64> {
        self.with(Op::Read, |i, _| Ok(i.live.len() as u64))
    }

    pub(crate) fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.with(Op::Read, |i, _| {
            let from = usize::try_from(at).unwrap_or(usize::MAX);
            let src = from
                .checked_add(buf.len())
                .and_then(|to| i.live.get(from..to))
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        })
    }

    pub(crate) fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        self.with(Op::Write, |i, _| {
            let from = usize::try_from(at).map_err(io::Error::other)?;
            let to = from + buf.len();
            let extends = i.live.len() < to;
            if extends {
                i.live.resize(to, 0);
            }
            i.live[from..to].copy_from_slice(buf);
            i.pending.push(FileOp::Write {
                at,
                bytes: buf.to_vec(),
                extends,
            });
            Ok(())
        })
    }

    pub(crate) fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(Op::SetLen, |i, _| {
            i.live
                .resize(usize::try_from(len).map_err(io::Error::other)?, 0);
            i.pending.push(FileOp::SetLen(len));
            Ok(())
        })
    }

    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut s = self.disk.state();
        if s.boot != self.boot {
            return Err(dead());
        }
        let result = s.fault(Op::Sync);
        let lying = s.lying;
        let inode = &mut s.inodes[self.inode];
        match result {
            Ok(()) if lying => {}
            Ok(()) => {
                // Only what is pending: bytes a failed sync forgot stay
                // off the disk although reads still see them.
                for op in inode.pending.drain(..) {
                    match op {
                        FileOp::SetLen(len) => inode
                            .durable
                            .resize(usize::try_from(len).unwrap_or(usize::MAX), 0),
                        FileOp::Write { at, bytes, .. } => {
                            apply_write(&mut inode.durable, at, &bytes)
                        }
                    }
                }
            }
            // The kernel could not write the dirty pages and marked them
            // clean: the bytes stay readable but never reach the disk, and
            // a later sync has nothing left to write.
            Err(_) => inode.pending.clear(),
        }
        result
    }
}
