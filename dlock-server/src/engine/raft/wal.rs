//! The Raft log's files (`raft-log/` in a data directory): records appended
//! to preallocated segment files, each write followed by one `fdatasync`.
//!
//! Why not a database: the log is only ever appended to, cut at its end
//! (truncate) or dropped from its start (purge), and every append must be
//! durable before it counts. redb committed an append with ~17 page writes
//! and one fsync (0.25 ms per commit on the benchmark machine); here it is
//! one `pwrite` into space allocated beforehand and one `fdatasync` (0.1 ms
//! there), paid twice per cluster commit (the leader's and a follower's).
//!
//! A segment is named by its sequence number (`00000000000000000001.seg`)
//! and starts with a 16-byte header (magic, format version). Then records:
//! `len: u32 LE | crc: u32 LE | kind: u8 | payload`, `len` counting kind
//! and payload, `crc` (CRC-32) covering `len`, kind and payload. A zero
//! `len` is where writing stopped: files grow in steps of [`STEP`] bytes,
//! allocated (and zero) before they are written, so an `fdatasync` has no
//! block allocation or file size to write out.
//!
//! Every segment begins with the vote, the purged id and the committed id
//! as they were when it was made (a checkpoint), so a segment whose entries
//! are all purged can be deleted: what it said is repeated later.
//!
//! After a crash only the end of the last segment can be torn: writes the
//! crash cut short, which no sync had covered, so nobody relied on them (an
//! append is acknowledged only once its sync returned; the committed id is
//! written without one). A power cut may tear such a write at any byte,
//! inside one sector too. So the log says which of its bytes were durable:
//! the first record written after each completed sync is a *sync mark*
//! naming the offset that sync covered (format 2). Opening stops at the
//! first record of the last segment that does not check out; if no sync
//! mark after it names an offset past it, it was never covered by a sync,
//! and it is dropped and the rest zeroed, so no stale bytes behind the next
//! write can pass for records. If one does, the disk changed bytes that
//! were durable and acknowledged: refused, with what the operator can do.
//! (Segments of format 1 have no marks: there a record that fails its
//! check is dropped only if a whole sector of it is unwritten.) Anything
//! else that does not check out (a record in an earlier segment, a file
//! whose length is not a whole number of steps, a missing segment, a gap
//! in the entries) is damage, and the node refuses to start: it may have
//! acknowledged entries it no longer has.

use super::disk::DiskError;
use super::encoding;
use super::storage::{ReadFrom, Storage, StorageFile, StorageLock};
use super::types::{Entry, LogId, Vote};
use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The log's directory inside a data directory.
pub(crate) const DIR: &str = "raft-log";
/// Files grow in steps of this many bytes.
const STEP: u64 = 4 << 20;
/// A segment this full is closed and a new one started.
const SEGMENT: u64 = 16 << 20;
const MAGIC: [u8; 8] = *b"dlockwal";
/// The record format this version writes: 2 has sync marks.
const VERSION: u8 = 2;
/// The oldest format this version reads: 1, without sync marks.
const OLDEST_VERSION: u8 = 1;
const HEADER: u64 = 16;
/// A record's length and CRC.
const HEAD: usize = 8;
/// A record's kind and payload at most. The largest entry is one batch of
/// commands (1 MiB, plus one command of at most a client frame).
pub(crate) const MAX_RECORD: usize = 64 << 20;
const EXT: &str = "seg";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Entry = 1,
    Vote = 2,
    Committed = 3,
    Truncate = 4,
    Purge = 5,
    /// The offset in this segment up to which a completed sync made the
    /// log durable (a `u64`, little-endian).
    Synced = 6,
}

/// A sync mark's whole record: head, kind and an 8-byte offset.
const MARK_LEN: usize = HEAD + 1 + 8;

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Entry,
            2 => Kind::Vote,
            3 => Kind::Committed,
            4 => Kind::Truncate,
            5 => Kind::Purge,
            6 => Kind::Synced,
            _ => return None,
        })
    }
}

/// Where an entry is: read back with [`Loc::read`]. Holds its segment open,
/// so a reader that found it can still read it after the segment is deleted.
#[derive(Clone)]
pub(crate) struct Loc {
    /// The entry's id.
    pub(crate) id: LogId,
    file: Arc<StorageFile>,
    /// Where its record starts, and the record's length with its head.
    at: u64,
    len: usize,
}

impl Loc {
    /// Reads and decodes the entry.
    ///
    /// # Errors
    /// The read fails, or the record no longer checks out.
    pub(crate) fn read(&self) -> Result<Entry, DiskError> {
        // Once more from the file before giving up: a read that failed or
        // came back wrong may have met a transient fault (a page cache that
        // a FUSE filesystem or a flaky controller got wrong), and a failed
        // read stops the node.
        self.read_once().or_else(|first| {
            tracing::warn!(entry = self.id.index, at = self.at, error = %first, "reading a raft log record failed; reading it again");
            self.read_once()
        })
    }

    fn read_once(&self) -> Result<Entry, DiskError> {
        let mut buf = vec![0; self.len];
        self.file.read_exact_at(&mut buf, self.at)?;
        match check(&buf, 0) {
            Some((Kind::Entry, payload)) => Ok(encoding::decode(payload)?),
            _ => Err(DiskError::Damaged(format!(
                "the raft log record of entry {} (byte {}) no longer checks out",
                self.id.index, self.at
            ))),
        }
    }
}

/// A whole record's kind and payload if its length and CRC check out; a
/// sync mark's CRC covers its segment's `salt` too.
fn check(record: &[u8], salt: u32) -> Option<(Kind, &[u8])> {
    let (head, body) = record.split_at_checked(HEAD)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    if len == 0 || body.len() != len {
        return None;
    }
    let salt = (body[0] == Kind::Synced as u8).then_some(salt);
    if crc_of(salt, &head[..4], body) != crc {
        return None;
    }
    Some((Kind::of(body[0])?, &body[1..]))
}

/// The CRC of a record's length and body, with the segment's salt first
/// for a sync mark: the salt is random and never leaves the file, so bytes
/// a client chose (a key, a value inside an entry) can never pass for a
/// mark when a damaged log is searched for one (see `synced_past`).
fn crc_of(salt: Option<u32>, len: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if let Some(salt) = salt {
        h.update(&salt.to_le_bytes());
    }
    h.update(len);
    h.update(body);
    h.finalize()
}

/// A new segment's salt (format 2 keeps it at header bytes 12..16):
/// unpredictable.
fn new_salt() -> u32 {
    super::storage::unpredictable()
}

/// Where a segment's salt sits in its header.
const SALT_AT: usize = 12;

/// Records to write together, in one buffer.
#[derive(Default)]
pub(crate) struct Batch {
    buf: Vec<u8>,
    /// Each entry's id, where its record starts in `buf`, and its length.
    entries: Vec<(LogId, usize, usize)>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<Vec<u8>>,
}

impl Batch {
    fn push(&mut self, kind: Kind, payload: &[u8]) -> Result<usize, DiskError> {
        self.push_salted(kind, payload, None)
    }

    /// A sync mark naming `through`, for a segment salted with `salt`.
    fn mark(&mut self, salt: u32, through: u64) -> Result<usize, DiskError> {
        self.push_salted(Kind::Synced, &through.to_le_bytes(), Some(salt))
    }

    fn push_salted(
        &mut self,
        kind: Kind,
        payload: &[u8],
        salt: Option<u32>,
    ) -> Result<usize, DiskError> {
        if payload.len() >= MAX_RECORD {
            return Err(DiskError::Io(std::io::Error::other(format!(
                "a raft log record of {} bytes is over the limit of {MAX_RECORD}",
                payload.len()
            ))));
        }
        let at = self.buf.len();
        let len = u32::try_from(payload.len() + 1)
            .unwrap_or(u32::MAX)
            .to_le_bytes();
        let body_at = at + HEAD;
        self.buf.extend_from_slice(&len);
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(payload);
        let crc = crc_of(salt, &len, &self.buf[body_at..]);
        self.buf[at + 4..body_at].copy_from_slice(&crc.to_le_bytes());
        Ok(at)
    }

    /// An entry, already encoded.
    pub(crate) fn entry(&mut self, id: LogId, encoded: &[u8]) -> Result<(), DiskError> {
        let at = self.push(Kind::Entry, encoded)?;
        self.entries.push((id, at, self.buf.len() - at));
        Ok(())
    }

    /// The vote, encoded.
    pub(crate) fn vote(&mut self, encoded: Vec<u8>) -> Result<(), DiskError> {
        self.push(Kind::Vote, &encoded)?;
        self.vote = Some(encoded);
        Ok(())
    }

    /// The committed id (an `Option<LogId>`), encoded.
    pub(crate) fn committed(&mut self, encoded: Vec<u8>) -> Result<(), DiskError> {
        self.push(Kind::Committed, &encoded)?;
        self.committed = Some(encoded);
        Ok(())
    }

    /// Entries from `from` on are gone.
    pub(crate) fn truncate(&mut self, from: u64) -> Result<(), DiskError> {
        self.push(Kind::Truncate, &from.to_le_bytes())?;
        Ok(())
    }

    /// Entries up to `id` are gone, and `id` is the last purged.
    pub(crate) fn purge(&mut self, id: LogId) -> Result<(), DiskError> {
        let encoded = encoding::encode(&id)?;
        self.push(Kind::Purge, &encoded)?;
        self.purged = Some(encoded);
        Ok(())
    }

    /// Whether it holds no record.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// What the files say, as read on opening.
#[derive(Default)]
pub(crate) struct Replayed {
    /// The last vote saved.
    pub(crate) vote: Option<Vote>,
    /// The last committed id saved.
    pub(crate) committed: Option<LogId>,
    /// The last purged entry's id.
    pub(crate) purged: Option<LogId>,
    /// Every entry not purged, by index.
    pub(crate) entries: BTreeMap<u64, Loc>,
}

struct Segment {
    seq: u64,
    file: Arc<StorageFile>,
    /// The highest entry index written to it.
    max_index: Option<u64>,
}

/// The open log: one writer (the writer thread, or an offline restore) at
/// a time, which an advisory lock on `raft-log/lock` makes sure of.
pub(crate) struct Wal {
    storage: Storage,
    dir: PathBuf,
    _lock: StorageLock,
    /// Oldest first; the last one is written to.
    segments: Vec<Segment>,
    /// Where the next record goes in the last segment.
    end: u64,
    /// The last segment's length.
    len: u64,
    /// What a new segment's checkpoint says: the latest of each, encoded.
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<Vec<u8>>,
    /// A write or sync failed: what reached the disk is unknown, so nothing
    /// more is written (a retried fsync can report success for lost pages).
    failed: bool,
    /// Up to where in the last segment a completed sync made the log
    /// durable, and the offset the last sync mark written names: a new
    /// mark is due when the first is ahead.
    synced: u64,
    marked: u64,
    /// The last segment's salt, which its sync marks' CRCs cover.
    salt: u32,
    /// Whether the last segment is of format 2 (one of format 1, from
    /// before sync marks, is closed at the first start on this version).
    last_has_marks: bool,
    step: u64,
    segment: u64,
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> DiskError {
    DiskError::Damaged(format!("{}: {what}", path.display()))
}

fn round_up(n: u64, step: u64) -> u64 {
    n.div_ceil(step).max(1).saturating_mul(step)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.{EXT}"))
}

impl Wal {
    /// Opens the log in `data_dir` (creating it if there is none) and reads
    /// everything it holds.
    ///
    /// # Errors
    /// Another process has it open, it is damaged (see the module
    /// documentation), or it cannot be read or created.
    pub(crate) fn open(data_dir: &Path) -> Result<(Wal, Replayed), DiskError> {
        Wal::open_on(Storage::for_log(), data_dir)
    }

    /// [`Wal::open`] on the disk `storage`.
    ///
    /// # Errors
    /// As for [`Wal::open`].
    pub(crate) fn open_on(storage: Storage, data_dir: &Path) -> Result<(Wal, Replayed), DiskError> {
        Wal::open_with(storage, data_dir, STEP, SEGMENT)
    }

    fn open_with(
        storage: Storage,
        data_dir: &Path,
        step: u64,
        segment: u64,
    ) -> Result<(Wal, Replayed), DiskError> {
        let dir = data_dir.join(DIR);
        storage.create_dir_all(&dir)?;
        let lock = match storage.lock(&dir.join("lock")) {
            Ok(lock) => lock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(DiskError::InUse(dir));
            }
            Err(e) => return Err(DiskError::Io(e)),
        };
        let mut seqs = Vec::new();
        for name in storage.list(&dir)? {
            if name.ends_with(".tmp") {
                // A segment being made when the node stopped: nothing in it
                // was acknowledged.
                storage.remove_file(&dir.join(&name))?;
            } else if let Some(seq) = name
                .strip_suffix(&format!(".{EXT}"))
                .filter(|s| s.len() == 20)
                .and_then(|s| s.parse::<u64>().ok())
            {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let mut wal = Wal {
            storage,
            dir,
            _lock: lock,
            segments: Vec::new(),
            end: 0,
            len: 0,
            vote: None,
            committed: None,
            purged: None,
            failed: false,
            synced: 0,
            marked: 0,
            salt: 0,
            last_has_marks: true,
            step,
            segment,
        };
        let mut replayed = Replayed::default();
        if seqs.is_empty() {
            wal.start_segment(1, 0)?;
            return Ok((wal, replayed));
        }
        if seqs.windows(2).any(|w| w[1] != w[0].saturating_add(1)) {
            return Err(damaged(
                &wal.dir,
                format!("segments are missing between {:?}", seqs),
            ));
        }
        let last = seqs.len() - 1;
        for (i, seq) in seqs.into_iter().enumerate() {
            wal.replay_segment(seq, i == last, &mut replayed)?;
        }
        if !wal.last_has_marks {
            // Written by a version without sync marks: its tail is judged by
            // the older rule. Closed now, so what is written from here on
            // is in a segment whose tail the marks vouch for.
            wal.rotate(0)?;
        }
        // openraft's first entry has index 0, and a purge leaves the log
        // starting right after what it purged (or empty).
        let first = replayed.purged.map_or(0, |p| p.index.saturating_add(1));
        if let Some(at) = replayed.entries.keys().next().filter(|i| **i != first) {
            return Err(damaged(
                &wal.dir,
                format!(
                    "the log should start at entry {first} but starts at {at} (a segment lost?)"
                ),
            ));
        }
        if let Some(w) = replayed
            .entries
            .keys()
            .zip(replayed.entries.keys().skip(1))
            .find(|(a, b)| a.saturating_add(1) != **b)
        {
            return Err(damaged(
                &wal.dir,
                format!("entries are missing between {} and {}", w.0, w.1),
            ));
        }
        Ok((wal, replayed))
    }

    fn replay_segment(
        &mut self,
        seq: u64,
        last: bool,
        replayed: &mut Replayed,
    ) -> Result<(), DiskError> {
        let path = segment_path(&self.dir, seq);
        let file = Arc::new(self.storage.open(&path)?);
        let len = file.len()?;
        if len == 0 || len % self.step != 0 {
            return Err(damaged(
                &path,
                format!(
                    "it is {len} bytes long, not a whole number of {}-byte steps (cut short?)",
                    self.step
                ),
            ));
        }
        let mut reader = BufReader::with_capacity(1 << 20, ReadFrom::new(&file, 0));
        let mut header = [0; HEADER as usize];
        reader.read_exact(&mut header)?;
        if header[..8] != MAGIC {
            return Err(damaged(&path, "not a dlock raft log segment"));
        }
        if !(OLDEST_VERSION..=VERSION).contains(&header[8]) {
            return Err(damaged(
                &path,
                format!(
                    "written in log format {}, this version reads {OLDEST_VERSION} to {VERSION} \
                     (a newer dlock?)",
                    header[8]
                ),
            ));
        }
        let has_marks = header[8] >= 2;
        let salt = u32::from_le_bytes([
            header[SALT_AT],
            header[SALT_AT + 1],
            header[SALT_AT + 2],
            header[SALT_AT + 3],
        ]);
        let mut max_index = None;
        let mut at = HEADER;
        let mut torn = false;
        let mut record = Vec::new();
        loop {
            if at + HEAD as u64 > len {
                break;
            }
            let mut head = [0; HEAD];
            reader.read_exact(&mut head)?;
            let n = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            if n == 0 {
                break;
            }
            if n > MAX_RECORD || at + (HEAD + n) as u64 > len {
                // A length that cannot be: written only in part (it can
                // straddle two sectors), or damaged.
                torn = true;
                break;
            }
            record.clear();
            record.extend_from_slice(&head);
            record.resize(HEAD + n, 0);
            reader.read_exact(&mut record[HEAD..])?;
            let Some((kind, payload)) = check(&record, salt) else {
                if record.get(HEAD).is_some_and(|k| Kind::of(*k).is_none()) && check_crc(&record) {
                    return Err(damaged(
                        &path,
                        format!("a record of unknown kind {} (a newer dlock?)", record[HEAD]),
                    ));
                }
                torn = true;
                break;
            };
            let bad = |e: encoding::CodecError| damaged(&path, format!("record at byte {at}: {e}"));
            match kind {
                Kind::Entry => {
                    let entry: Entry = encoding::decode(payload).map_err(bad)?;
                    let index = entry.log_id.index;
                    max_index = max_index.max(Some(index));
                    let loc = Loc {
                        id: entry.log_id,
                        file: file.clone(),
                        at,
                        len: record.len(),
                    };
                    replayed.entries.insert(index, loc);
                }
                Kind::Vote => {
                    replayed.vote = Some(encoding::decode(payload).map_err(bad)?);
                    self.vote = Some(payload.to_vec());
                }
                Kind::Committed => {
                    replayed.committed = encoding::decode(payload).map_err(bad)?;
                    self.committed = Some(payload.to_vec());
                }
                Kind::Truncate => {
                    let from = payload.try_into().map(u64::from_le_bytes).map_err(|_| {
                        damaged(&path, format!("record at byte {at}: bad truncate"))
                    })?;
                    drop(replayed.entries.split_off(&from));
                }
                Kind::Purge => {
                    let id: LogId = encoding::decode(payload).map_err(bad)?;
                    replayed.entries = replayed.entries.split_off(&id.index.saturating_add(1));
                    replayed.purged = Some(id);
                    self.purged = Some(payload.to_vec());
                }
                // Only read when a record before it fails its check.
                Kind::Synced => {}
            }
            at += record.len() as u64;
        }
        if torn && !last {
            return Err(damaged(
                &path,
                format!("the record at byte {at} does not check out, and later segments follow"),
            ));
        }
        if torn && has_marks {
            // Bytes a completed sync covered were acknowledged (or relied
            // on, as a vote); bytes no sync covered may be torn anywhere.
            if let Some(through) = synced_past(&file, at, len, salt)? {
                return Err(damaged(
                    &path,
                    format!(
                        "the record at byte {at} does not check out, yet a later sync mark says \
                         the log was durable through byte {through}: the disk changed data that \
                         was acknowledged. {ACKNOWLEDGED_DAMAGE}"
                    ),
                ));
            }
        } else if torn && !has_zero_sector(&file, at, len)? {
            // Format 1 has no marks. A write cut short leaves whole sectors
            // of it unwritten, and the file was zero there; a record that
            // fails its check with none of its sectors zero was written
            // whole and changed since (a damaged disk): dropping it could
            // drop acknowledged entries or a vote.
            return Err(damaged(
                &path,
                format!(
                    "the record at byte {at} does not check out and was not cut short (no \
                     unwritten sector in it): the file was changed after it was written. \
                     {ACKNOWLEDGED_DAMAGE}"
                ),
            ));
        }
        if last && !torn && has_marks && !zero_after(&file, at, len)? {
            // Reading stopped at a length of zero with bytes after it: a
            // write whose first bytes never landed, or synced records whose
            // start was zeroed by a damaged disk. A mark past the stop says
            // which.
            if let Some(through) = synced_past(&file, at, len, salt)? {
                return Err(damaged(
                    &path,
                    format!(
                        "reading stopped at byte {at} (a record length of zero), yet a later sync \
                         mark says the log was durable through byte {through}: the disk changed \
                         data that was acknowledged. {ACKNOWLEDGED_DAMAGE}"
                    ),
                ));
            }
        }
        drop(reader);
        // Behind where reading stopped, the next write goes. Bytes left
        // there by a write cut short (even one whose first bytes stayed
        // zero) could otherwise line up behind later records and be read
        // as records.
        if last && (torn || !zero_after(&file, at, len)?) {
            tracing::warn!(
                path = %path.display(),
                at,
                "the raft log ends in a write cut short (the node stopped mid-write); it is dropped"
            );
            zero_from(&file, at, len)?;
        }
        if last {
            // What was read may be only in the page cache (the process
            // stopped, not the machine): durable from here on, so the next
            // write's mark may say so.
            file.sync_data()?;
            self.synced = at;
            self.marked = 0;
            self.salt = salt;
            self.last_has_marks = has_marks;
        }
        self.segments.push(Segment {
            seq,
            file,
            max_index,
        });
        self.end = at;
        self.len = len;
        Ok(())
    }

    /// Writes the records of `batch` (not yet durable: see [`Wal::sync`])
    /// and says where its entries are.
    ///
    /// # Errors
    /// A write failed now or before.
    pub(crate) fn write(&mut self, batch: Batch) -> Result<Vec<Loc>, DiskError> {
        if self.failed {
            return Err(failed());
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let result = self.write_inner(batch);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn write_inner(&mut self, mut batch: Batch) -> Result<Vec<Loc>, DiskError> {
        // Room for a mark: a new segment's own mark goes in front.
        let n = (batch.buf.len() + MARK_LEN) as u64;
        if self.end > HEADER && self.end + n > self.segment {
            self.rotate(n)?;
        }
        if self.synced > self.marked {
            batch = self.marked_first(batch)?;
        }
        let n = batch.buf.len() as u64;
        if self.end + n > self.len {
            let len = round_up(self.end + n, self.step);
            self.active().file.allocate(len)?;
            self.len = len;
        }
        let at = self.end;
        let active = self.segments.last_mut().ok_or_else(failed)?;
        active.file.write_all_at(&batch.buf, at)?;
        self.end += n;
        let mut locs = Vec::with_capacity(batch.entries.len());
        for (id, offset, len) in batch.entries {
            active.max_index = active.max_index.max(Some(id.index));
            locs.push(Loc {
                id,
                file: active.file.clone(),
                at: at + offset as u64,
                len,
            });
        }
        if let Some(v) = batch.vote {
            self.vote = Some(v);
        }
        if let Some(c) = batch.committed {
            self.committed = Some(c);
        }
        if let Some(p) = batch.purged {
            self.purged = Some(p);
        }
        Ok(locs)
    }

    /// `batch` behind a sync mark naming what the last sync covered.
    fn marked_first(&mut self, batch: Batch) -> Result<Batch, DiskError> {
        let mut marked = Batch::default();
        marked.mark(self.salt, self.synced)?;
        let shift = marked.buf.len();
        marked.buf.extend_from_slice(&batch.buf);
        marked.entries = batch
            .entries
            .into_iter()
            .map(|(id, at, len)| (id, at + shift, len))
            .collect();
        marked.vote = batch.vote;
        marked.committed = batch.committed;
        marked.purged = batch.purged;
        // Before the write: if it fails, nothing more is written anyway.
        self.marked = self.synced;
        Ok(marked)
    }

    /// Writes a sync mark alone, unsynced, when one is due: what the writer
    /// does when it runs out of work, so that the last synced bytes are
    /// vouched for too once the page cache writes the mark out.
    ///
    /// # Errors
    /// The write failed now, or a write or sync did before.
    pub(crate) fn mark_synced(&mut self) -> Result<(), DiskError> {
        if self.failed {
            // Reported when it failed; nothing is written any more.
            return Ok(());
        }
        if self.synced <= self.marked {
            return Ok(());
        }
        // Not through `write`, which skips an empty batch.
        let result = self.write_inner(Batch::default()).map(|_| ());
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn active(&self) -> &Segment {
        // There is always one: `open` makes or finds it.
        &self.segments[self.segments.len() - 1]
    }

    /// Makes everything written durable.
    ///
    /// # Errors
    /// The sync failed now, or a write or sync did before.
    pub(crate) fn sync(&mut self) -> Result<(), DiskError> {
        if self.failed {
            return Err(failed());
        }
        let result = injected_fault(&self.dir).map_or_else(|| self.active().file.sync_data(), Err);
        if result.is_err() {
            // Never retried as if it had worked: after a failed fsync the
            // kernel may have dropped the dirty pages it could not write.
            self.failed = true;
        }
        result?;
        self.synced = self.end;
        Ok(())
    }

    /// Closes the last segment and starts the next, with room for `n` more
    /// bytes.
    fn rotate(&mut self, n: u64) -> Result<(), DiskError> {
        // A segment that is not the last must hold no torn record.
        self.active().file.sync_data()?;
        let seq = self.active().seq.saturating_add(1);
        self.start_segment(seq, n)
    }

    /// Makes segment `seq`: a header, the checkpoint, room for `n` bytes.
    fn start_segment(&mut self, seq: u64, n: u64) -> Result<(), DiskError> {
        let mut head = Batch::default();
        head.buf.extend_from_slice(&MAGIC);
        head.buf.push(VERSION);
        head.buf.resize(HEADER as usize, 0);
        let salt = new_salt();
        head.buf[SALT_AT..SALT_AT + 4].copy_from_slice(&salt.to_le_bytes());
        if let Some(v) = self.vote.clone() {
            head.vote(v)?;
        }
        if let Some(p) = self.purged.clone() {
            head.push(Kind::Purge, &p)?;
        }
        if let Some(c) = self.committed.clone() {
            head.committed(c)?;
        }
        let len = round_up(head.buf.len() as u64 + n, self.step);
        let path = segment_path(&self.dir, seq);
        let tmp = path.with_extension(format!("{EXT}.tmp"));
        let file = self.storage.create(&tmp, false)?;
        file.allocate(len)?;
        file.write_all_at(&head.buf, 0)?;
        file.sync_all()?;
        self.storage.rename(&tmp, &path)?;
        self.storage.sync_dir(&self.dir)?;
        self.segments.push(Segment {
            seq,
            file: Arc::new(file),
            max_index: None,
        });
        self.end = head.buf.len() as u64;
        self.len = len;
        // The checkpoint is synced: the first write vouches for it.
        self.synced = self.end;
        self.marked = 0;
        self.salt = salt;
        self.last_has_marks = true;
        Ok(())
    }

    /// Deletes the segments before the last whose entries are all at or
    /// below `purged`; when the last one's are too and it has grown past
    /// one step, starts a new one first, so that an idle log gives back
    /// its space. Call after the purge record is durable.
    ///
    /// # Errors
    /// Starting the new segment, or syncing the directory after a deletion,
    /// failed (then nothing more is written); a failed deletion is only
    /// logged.
    pub(crate) fn drop_purged(&mut self, purged: u64) -> Result<(), DiskError> {
        if self.failed {
            return Ok(());
        }
        let below = |s: &Segment| s.max_index.is_none_or(|m| m <= purged);
        if self.end > self.step && below(self.active()) && !self.failed {
            if let Err(e) = self.rotate(0) {
                self.failed = true;
                return Err(e);
            }
        }
        let keep_from = self.segments[..self.segments.len() - 1]
            .iter()
            .position(|s| !below(s))
            .unwrap_or(self.segments.len() - 1);
        // Oldest first, stopping at a failure: a segment left behind a
        // deleted one would be a gap (read as damage); it is tried again at
        // the next purge. The directory is synced after each deletion: a
        // power cut may keep or lose each unsynced one on its own (the
        // simulated disk found a later one kept and an earlier one back,
        // a gap that refused the start).
        let mut deleted = 0;
        let mut result = Ok(());
        for s in &self.segments[..keep_from] {
            let path = segment_path(&self.dir, s.seq);
            if let Err(e) = self.storage.remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot delete a purged raft log segment");
                break;
            }
            deleted += 1;
            if let Err(e) = self.storage.sync_dir(&self.dir) {
                // Whether the deletion is durable is unknown, and a later
                // one that is could leave this segment behind a gap: as
                // after any failed sync, nothing more is written.
                self.failed = true;
                result = Err(DiskError::Io(e));
                break;
            }
        }
        drop(self.segments.drain(..deleted));
        result
    }

    /// The segment files, oldest first.
    #[cfg(test)]
    fn files(&self) -> Vec<PathBuf> {
        self.segments
            .iter()
            .map(|s| segment_path(&self.dir, s.seq))
            .collect()
    }
}

/// A storage error a test asked for: with the `testing` feature, a file
/// named `FAIL-SYNC` in the log's directory makes every sync fail with EIO,
/// as a dying disk's would. Never in a build without that feature.
#[cfg(feature = "testing")]
fn injected_fault(dir: &Path) -> Option<std::io::Error> {
    /// EIO on Linux.
    const EIO: i32 = 5;
    dir.join("FAIL-SYNC")
        .exists()
        .then(|| std::io::Error::from_raw_os_error(EIO))
}

#[cfg(not(feature = "testing"))]
fn injected_fault(_dir: &Path) -> Option<std::io::Error> {
    None
}

fn failed() -> DiskError {
    DiskError::Io(std::io::Error::other(
        "an earlier raft log write failed; the node must restart to write again",
    ))
}

/// What a refusal over changed, acknowledged bytes tells the operator.
const ACKNOWLEDGED_DAMAGE: &str = "What to do: on a node of a cluster, move its data directory \
    aside and add the node back empty (docs/CLUSTER.md, \"Adding and removing nodes\"): it copies \
    the log from its peers, and nothing is lost while a majority has it. On a single durable \
    server, restore the latest backup (--restore-backup), or move the data directory aside and \
    start empty with --fence-floor above the highest fencing token handed out: every lock and \
    lease it held is then lost.";

/// The offset a sync mark after byte `at` (and before `len`) names, if one
/// names an offset past `at`: the bytes there were made durable. Looked for
/// byte by byte, since the records from `at` on cannot be trusted to say
/// where the next one starts; only a damaged log is read this way.
fn synced_past(file: &StorageFile, at: u64, len: u64, salt: u32) -> Result<Option<u64>, DiskError> {
    const CHUNK: usize = 1 << 20;
    let mark_len = (MARK_LEN - HEAD) as u32;
    let mut buf = vec![0; CHUNK];
    let mut pos = at + 1;
    while pos + MARK_LEN as u64 <= len {
        let n = (len - pos).min(CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        for i in 0..=n - MARK_LEN {
            if buf[i..i + 4] != mark_len.to_le_bytes() {
                continue;
            }
            if let Some((Kind::Synced, payload)) = check(&buf[i..i + MARK_LEN], salt) {
                let through = payload.try_into().map(u64::from_le_bytes).unwrap_or(0);
                // A real mark names an offset before itself.
                if through > at && through <= pos + i as u64 {
                    return Ok(Some(through));
                }
            }
        }
        // The chunks overlap by a mark's length less one, so no mark falls
        // between two of them.
        pos += (n - (MARK_LEN - 1)) as u64;
    }
    Ok(None)
}

/// Whether a record's CRC checks out, whatever its kind (a mark's is
/// salted: never taken for an unknown kind).
fn check_crc(record: &[u8]) -> bool {
    record.len() > HEAD
        && crc_of(None, &record[..4], &record[HEAD..])
            == u32::from_le_bytes([record[4], record[5], record[6], record[7]])
}

/// Whether a 512-byte sector of the record at `at` (as far as its length
/// says, or the next 4 KiB when that is not to be trusted) is all zeros.
fn has_zero_sector(file: &StorageFile, at: u64, len: u64) -> Result<bool, DiskError> {
    const SECTOR: u64 = 512;
    let mut head = [0; HEAD];
    let claimed = match file.read_exact_at(&mut head, at) {
        Ok(()) => u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]])),
        Err(_) => 0,
    };
    let end = if claimed > 0 && claimed <= MAX_RECORD as u64 {
        at + HEAD as u64 + claimed
    } else {
        at + 4096
    }
    .min(len);
    let mut sector = at - at % SECTOR;
    let mut buf = [0; SECTOR as usize];
    while sector < end {
        // Only sectors wholly after the record's start: the one it starts
        // in also holds the records before it.
        if sector >= at && sector + SECTOR <= len {
            file.read_exact_at(&mut buf, sector)?;
            if buf.iter().all(|b| *b == 0) {
                return Ok(true);
            }
        }
        sector += SECTOR;
    }
    Ok(false)
}

/// Whether the file holds only zeros from `from` to `to`.
fn zero_after(file: &StorageFile, from: u64, to: u64) -> Result<bool, DiskError> {
    let mut buf = vec![0; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

fn zero_from(file: &StorageFile, from: u64, to: u64) -> Result<(), DiskError> {
    let zeros = vec![0; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    file.sync_data()?;
    Ok(())
}

/// Makes `raft-log/` in `data_dir` from what an older log held (see
/// `redb_import`): built beside it and renamed into place, so it appears
/// whole or not at all.
///
/// # Errors
/// The files cannot be written.
pub(crate) fn create_imported(data_dir: &Path, records: Batch) -> Result<(), DiskError> {
    let storage = Storage::Real;
    let tmp = data_dir.join(format!("{DIR}.tmp"));
    if storage.is_dir(&tmp) {
        storage.remove_dir_all(&tmp)?;
    }
    storage.create_dir_all(&tmp)?;
    let path = segment_path(&tmp, 1);
    let file = storage.create(&path, true)?;
    let mut header = [0; HEADER as usize];
    header[..8].copy_from_slice(&MAGIC);
    header[8] = VERSION;
    let salt = new_salt();
    header[SALT_AT..SALT_AT + 4].copy_from_slice(&salt.to_le_bytes());
    // Synced below, so a mark behind them vouches for them.
    let mut records = records;
    let through = HEADER + records.buf.len() as u64;
    records.mark(salt, through)?;
    file.allocate(round_up(HEADER + records.buf.len() as u64, STEP))?;
    file.write_all_at(&header, 0)?;
    file.write_all_at(&records.buf, HEADER)?;
    file.sync_all()?;
    storage.sync_dir(&tmp)?;
    storage.rename(&tmp, &data_dir.join(DIR))?;
    storage.sync_dir(data_dir)?;
    Ok(())
}

#[cfg(test)]
#[path = "wal_power_cut.rs"]
mod power_cut;

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;

    fn id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> (LogId, Vec<u8>) {
        let e = Entry {
            log_id: id(term, index),
            payload: EntryPayload::Blank,
        };
        (e.log_id, encoding::encode(&e).expect("encode"))
    }

    fn append(wal: &mut Wal, from: u64, to: u64) -> Vec<Loc> {
        let mut b = Batch::default();
        for i in from..=to {
            let (id, bytes) = entry(1, i);
            b.entry(id, &bytes).expect("entry");
        }
        let locs = wal.write(b).expect("write");
        wal.sync().expect("sync");
        locs
    }

    fn indexes(r: &Replayed) -> Vec<u64> {
        r.entries.keys().copied().collect()
    }

    const SMALL: (u64, u64) = (4096, 16384);

    #[test]
    fn what_is_written_reads_back_after_reopening() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let (mut wal, r) = Wal::open(dir.path()).expect("open");
            assert!(r.entries.is_empty() && r.vote.is_none());
            let locs = append(&mut wal, 0, 5);
            assert_eq!(locs[3].read().expect("read").log_id, id(1, 3));
            let mut b = Batch::default();
            let vote = Vote::new(3, 2);
            b.vote(encoding::encode(&vote).expect("vote")).expect("b");
            b.committed(encoding::encode(&Some(id(1, 4))).expect("c"))
                .expect("b");
            b.truncate(5).expect("b");
            wal.write(b).expect("write");
            wal.sync().expect("sync");
        }
        let (_wal, r) = Wal::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&r), [0, 1, 2, 3, 4]);
        assert_eq!(r.vote, Some(Vote::new(3, 2)));
        assert_eq!(r.committed, Some(id(1, 4)));
        assert_eq!(r.entries[&4].read().expect("read").log_id, id(1, 4));
    }

    #[test]
    fn a_second_opener_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let _first = Wal::open(dir.path()).expect("open");
        assert!(matches!(Wal::open(dir.path()), Err(DiskError::InUse(_))));
    }

    #[test]
    fn purged_segments_are_deleted_and_the_checkpoint_keeps_what_they_said() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let (mut wal, _) =
                Wal::open_with(Storage::Real, dir.path(), SMALL.0, SMALL.1).expect("open");
            let mut b = Batch::default();
            b.vote(encoding::encode(&Vote::new(7, 1)).expect("v"))
                .expect("b");
            wal.write(b).expect("w");
            append(&mut wal, 0, 0);
            for i in 0..400 {
                append(&mut wal, i * 10 + 1, i * 10 + 10);
            }
            let before = wal.files().len();
            assert!(before > 8, "{:?}", wal.files());
            let mut b = Batch::default();
            b.purge(id(1, 3000)).expect("b");
            wal.write(b).expect("w");
            wal.sync().expect("s");
            wal.drop_purged(3000).expect("drop");
            let left = wal.files();
            // Entries 3001 to 4000 are a quarter of the log.
            assert!(left.len() <= before / 4 + 1, "{before} then {left:?}");
            assert!(!segment_path(&wal.dir, 1).exists());
        }
        let (_wal, r) =
            Wal::open_with(Storage::Real, dir.path(), SMALL.0, SMALL.1).expect("reopen");
        assert_eq!(r.vote, Some(Vote::new(7, 1)));
        assert_eq!(r.purged, Some(id(1, 3000)));
        assert_eq!(r.entries.keys().next(), Some(&3001));
        assert_eq!(r.entries.keys().last(), Some(&4000));
        assert_eq!(r.entries[&3500].read().expect("read").log_id, id(1, 3500));
    }

    #[test]
    fn an_idle_log_whose_entries_are_all_purged_gives_its_space_back() {
        let dir = tempfile::tempdir().expect("dir");
        let (mut wal, _) =
            Wal::open_with(Storage::Real, dir.path(), SMALL.0, 1 << 30).expect("open");
        append(&mut wal, 0, 0);
        for i in 0..100 {
            append(&mut wal, i * 10 + 1, i * 10 + 10);
        }
        let size = |w: &Wal| -> u64 {
            w.files()
                .iter()
                .map(|f| std::fs::metadata(f).expect("meta").len())
                .sum()
        };
        assert!(size(&wal) > 4 * SMALL.0);
        let mut b = Batch::default();
        b.purge(id(1, 1000)).expect("b");
        wal.write(b).expect("w");
        wal.sync().expect("s");
        wal.drop_purged(1000).expect("drop");
        assert_eq!(size(&wal), SMALL.0);
    }

    #[test]
    fn a_torn_last_write_is_dropped_and_zeroed() {
        let dir = tempfile::tempdir().expect("dir");
        let seg;
        let cut_at;
        {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            let locs = append(&mut wal, 4, 4);
            seg = wal.files()[0].clone();
            cut_at = locs[0].at + 3;
        }
        // The last record half written: its CRC fails.
        let f = OpenOptions::new().write(true).open(&seg).expect("seg");
        f.write_all_at(&[0xAB; 7], cut_at).expect("tear");
        drop(f);
        let (mut wal, r) = Wal::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
        append(&mut wal, 4, 5);
        drop(wal);
        let (_wal, r) = Wal::open(dir.path()).expect("reopen again");
        assert_eq!(indexes(&r), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn bytes_behind_a_write_whose_length_never_landed_are_zeroed() {
        let dir = tempfile::tempdir().expect("dir");
        let (seg, at) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            let locs = append(&mut wal, 4, 6);
            (wal.files()[0].clone(), locs[0].at)
        };
        // The first bytes of a write stayed zero, the rest landed: reading
        // stops there, and what follows must not be read later.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg)
            .expect("seg");
        f.write_all_at(&[0; 4], at).expect("zero the length");
        drop(f);
        let (wal, r) = Wal::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
        let f = StorageFile::Real(File::open(&seg).expect("seg"));
        let len = f.len().expect("meta");
        assert!(zero_after(&f, at, len).expect("read"));
        drop(wal);
    }

    #[test]
    fn damage_is_refused_not_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let files;
        {
            let (mut wal, _) =
                Wal::open_with(Storage::Real, dir.path(), SMALL.0, SMALL.1).expect("open");
            append(&mut wal, 0, 0);
            for i in 0..100 {
                append(&mut wal, i * 10 + 1, i * 10 + 10);
            }
            files = wal.files();
        }
        assert!(files.len() > 2);
        let open = || Wal::open_with(Storage::Real, dir.path(), SMALL.0, SMALL.1).map(|_| ());
        // A record in a closed segment.
        let whole = std::fs::read(&files[0]).expect("read");
        let mut bad = whole.clone();
        bad[HEADER as usize + 12] ^= 1;
        std::fs::write(&files[0], &bad).expect("write");
        assert!(matches!(open(), Err(DiskError::Damaged(_))));
        // A file cut short.
        std::fs::write(&files[0], &whole[..whole.len() / 2]).expect("write");
        assert!(matches!(open(), Err(DiskError::Damaged(_))));
        std::fs::write(&files[0], &whole).expect("write");
        open().expect("whole again");
        // A segment missing.
        let middle = std::fs::read(&files[1]).expect("read");
        std::fs::remove_file(&files[1]).expect("rm");
        assert!(matches!(open(), Err(DiskError::Damaged(_))));
        std::fs::write(&files[1], &middle).expect("write");
        // Another format version.
        let mut newer = whole.clone();
        newer[8] = VERSION + 1;
        std::fs::write(&files[0], &newer).expect("write");
        let Err(DiskError::Damaged(why)) = open() else {
            panic!("a newer format opened");
        };
        assert!(why.contains("newer dlock"), "{why}");
        std::fs::write(&files[0], &whole).expect("write");
        // A record changed in the segment being written (a bit flip, not a
        // write cut short): refused, not dropped with what follows it.
        let last = files.last().expect("a last segment");
        let whole = std::fs::read(last).expect("read");
        let mut bad = whole.clone();
        bad[HEADER as usize + 40] ^= 0x10;
        std::fs::write(last, &bad).expect("write");
        let Err(DiskError::Damaged(why)) = open() else {
            panic!("a changed record was dropped as a torn write");
        };
        assert!(why.contains("durable through"), "{why}");
        std::fs::write(last, &whole).expect("write");
        open().expect("whole again");
        // The first segment lost while it held entries not purged.
        std::fs::remove_file(&files[0]).expect("rm");
        assert!(matches!(open(), Err(DiskError::Damaged(_))));
    }

    /// A log of entries 0..=3, each append synced, and then the committed
    /// id written unsynced, as the writer does: the path of the segment
    /// and where that last write starts and ends.
    fn log_ending_in_a_committed_write(dir: &Path) -> (PathBuf, u64, u64) {
        let (mut wal, _) = Wal::open(dir).expect("open");
        append(&mut wal, 0, 1);
        append(&mut wal, 2, 3);
        let from = wal.end;
        let mut b = Batch::default();
        b.committed(encoding::encode(&Some(id(1, 3))).expect("c"))
            .expect("b");
        wal.write(b).expect("write");
        (wal.files()[0].clone(), from, wal.end)
    }

    #[test]
    fn an_unsynced_committed_record_torn_at_any_byte_inside_a_sector_never_blocks_a_start() {
        // A power cut tears a write no sync covered anywhere: the bytes from
        // some point on never landed (still zero), or any one came out wrong.
        for flip in [false, true] {
            let dir = tempfile::tempdir().expect("dir");
            let (seg, from, to) = log_ending_in_a_committed_write(dir.path());
            assert!(to - from < 512, "one write inside one sector");
            let whole = std::fs::read(&seg).expect("read");
            for k in from..to {
                let mut torn = whole.clone();
                if flip {
                    torn[k as usize] ^= 0x5A;
                } else {
                    torn[k as usize..to as usize].fill(0);
                }
                std::fs::write(&seg, &torn).expect("tear");
                let (wal, r) = Wal::open(dir.path())
                    .unwrap_or_else(|e| panic!("torn at byte {k} (flip {flip}): {e}"));
                assert_eq!(indexes(&r), [0, 1, 2, 3], "torn at byte {k}");
                drop(wal);
                std::fs::write(&seg, &whole).expect("restore");
            }
        }
    }

    #[test]
    fn a_write_cut_at_a_sector_edge_is_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let (seg, from, to) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            let from = wal.end;
            // Entries enough to span sectors, written but never synced.
            let mut b = Batch::default();
            for i in 4..40 {
                let (id, bytes) = entry(1, i);
                b.entry(id, &bytes).expect("entry");
            }
            wal.write(b).expect("write");
            (wal.files()[0].clone(), from, wal.end)
        };
        assert!(to - from > 1024);
        // The sectors from the second on never landed.
        let edge = (from / 512 + 1) * 512;
        let mut torn = std::fs::read(&seg).expect("read");
        torn[edge as usize..to as usize].fill(0);
        std::fs::write(&seg, &torn).expect("tear");
        let (_wal, r) = Wal::open(dir.path()).expect("reopen");
        assert!(indexes(&r).starts_with(&[0, 1, 2, 3]));
        assert!(r.entries.len() < 40, "a record cut at the edge is dropped");
    }

    #[test]
    fn a_changed_record_that_a_later_sync_covered_is_refused_with_what_to_do() {
        // The last appends were synced, and the writer, idle, vouched for
        // them: a bit flip there is damage to acknowledged entries, not a
        // torn write.
        let dir = tempfile::tempdir().expect("dir");
        let (seg, at) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            let locs = append(&mut wal, 4, 4);
            wal.mark_synced().expect("mark");
            (wal.files()[0].clone(), locs[0].at)
        };
        let mut bad = std::fs::read(&seg).expect("read");
        bad[at as usize + HEAD + 2] ^= 1;
        std::fs::write(&seg, &bad).expect("flip");
        let Err(DiskError::Damaged(why)) = Wal::open(dir.path()).map(|_| ()) else {
            panic!("a changed, acknowledged record was dropped");
        };
        assert!(
            why.contains("durable through") && why.contains("--restore-backup"),
            "{why}"
        );
        // Without the mark (the crash came before the idle writer wrote
        // it), the same bytes were never vouched for: a torn write.
        let mut unvouched = bad.clone();
        let mark_at = bad
            .windows(4)
            .enumerate()
            .skip(at as usize + 1)
            .find(|(i, w)| {
                *w == ((MARK_LEN - HEAD) as u32).to_le_bytes()
                    && check(
                        &bad[*i..*i + MARK_LEN],
                        u32::from_le_bytes([bad[12], bad[13], bad[14], bad[15]]),
                    )
                    .is_some()
            })
            .map(|(i, _)| i)
            .expect("the idle writer's mark");
        unvouched[mark_at..mark_at + MARK_LEN].fill(0);
        std::fs::write(&seg, &unvouched).expect("unmark");
        let (_wal, r) = Wal::open(dir.path()).expect("a write no sync vouched for may be torn");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
    }

    #[test]
    fn a_log_of_format_1_still_opens_under_the_sector_rule() {
        let dir = tempfile::tempdir().expect("dir");
        let seg = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            wal.files()[0].clone()
        };
        let mut old = std::fs::read(&seg).expect("read");
        old[8] = 1;
        std::fs::write(&seg, &old).expect("as format 1");
        let (mut wal, r) = Wal::open(dir.path()).expect("format 1 opens");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
        append(&mut wal, 4, 4);
        drop(wal);
        let (_wal, r) = Wal::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&r), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn synced_records_whose_start_was_zeroed_are_refused_not_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let (seg, at) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            let locs = append(&mut wal, 4, 6);
            append(&mut wal, 7, 7);
            wal.mark_synced().expect("mark");
            (wal.files()[0].clone(), locs[0].at)
        };
        // A damaged disk zeroes the length of a synced record: reading stops
        // there as at a clean end, but later marks say it was durable.
        let mut bad = std::fs::read(&seg).expect("read");
        bad[at as usize..at as usize + 4].fill(0);
        std::fs::write(&seg, &bad).expect("zero");
        let Err(DiskError::Damaged(why)) = Wal::open(dir.path()).map(|_| ()) else {
            panic!("synced entries after a zeroed length were dropped");
        };
        assert!(why.contains("durable through"), "{why}");
    }

    #[test]
    fn a_mark_forged_inside_an_entry_never_passes_for_one() {
        let dir = tempfile::tempdir().expect("dir");
        let (seg, torn_at) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            // One write no sync covered: an entry, then an entry whose bytes
            // a client chose to read as a mark naming everything before it.
            let at = wal.end;
            let mut forged = Batch::default();
            forged
                .push(Kind::Synced, &at.saturating_add(1).to_le_bytes())
                .expect("push");
            let mut b = Batch::default();
            let (id, bytes) = entry(1, 4);
            b.entry(id, &bytes).expect("entry");
            b.entry(id, &[forged.buf.as_slice(), &[0; 8]].concat())
                .expect("entry");
            wal.write(b).expect("write");
            (wal.files()[0].clone(), at)
        };
        let mut torn = std::fs::read(&seg).expect("read");
        torn[torn_at as usize + HEAD + 1] ^= 0x40;
        std::fs::write(&seg, &torn).expect("tear");
        let (_wal, r) = Wal::open(dir.path()).expect("the forged mark is no mark: a torn write");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
    }

    #[test]
    fn a_last_segment_of_format_1_is_closed_at_the_first_start() {
        let dir = tempfile::tempdir().expect("dir");
        let seg = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            append(&mut wal, 0, 3);
            wal.files()[0].clone()
        };
        let mut old = std::fs::read(&seg).expect("read");
        old[8] = 1;
        std::fs::write(&seg, &old).expect("as format 1");
        let (wal, r) = Wal::open(dir.path()).expect("opens");
        assert_eq!(indexes(&r), [0, 1, 2, 3]);
        assert_eq!(wal.files().len(), 2, "a segment of format 2 follows it");
    }
}
