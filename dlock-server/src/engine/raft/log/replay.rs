//! Reading the log back at a start: every segment checked record by
//! record, the torn tail of the last one told from damage by its sync
//! marks (or, in format 1, by an unwritten sector), and what the files say
//! ([`Replayed`]). See `wal.rs` for the rules.

use super::error::DiskError;
use super::format::*;
use super::segment::*;
use super::{Wal, DIR};
use crate::engine::raft::encoding;
use crate::engine::raft::storage::{ReadFrom, Storage, StorageFile};
use crate::engine::raft::types::{Entry, LogId, Vote};
use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

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

pub(super) fn damaged(path: &Path, what: impl std::fmt::Display) -> DiskError {
    DiskError::Damaged(format!("{}: {what}", path.display()))
}

impl Wal {
    pub(super) fn open_with(
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

    pub(super) fn replay_segment(
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
}

/// What a refusal over changed, acknowledged bytes tells the operator.
pub(super) const ACKNOWLEDGED_DAMAGE: &str =
    "What to do: on a node of a cluster, move its data directory \
    aside and add the node back empty (docs/CLUSTER.md, \"Adding and removing nodes\"): it copies \
    the log from its peers, and nothing is lost while a majority has it. On a single durable \
    server, restore the latest backup (--restore-backup), or move the data directory aside and \
    start empty with --fence-floor above the highest fencing token handed out: every lock and \
    lease it held is then lost.";

/// The offset a sync mark after byte `at` (and before `len`) names, if one
/// names an offset past `at`: the bytes there were made durable. Looked for
/// byte by byte, since the records from `at` on cannot be trusted to say
/// where the next one starts; only a damaged log is read this way.
pub(super) fn synced_past(
    file: &StorageFile,
    at: u64,
    len: u64,
    salt: u32,
) -> Result<Option<u64>, DiskError> {
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
pub(super) fn check_crc(record: &[u8]) -> bool {
    record.len() > HEAD
        && crc_of(None, &record[..4], &record[HEAD..])
            == u32::from_le_bytes([record[4], record[5], record[6], record[7]])
}

/// Whether a 512-byte sector of the record at `at` (as far as its length
/// says, or the next 4 KiB when that is not to be trusted) is all zeros.
pub(super) fn has_zero_sector(file: &StorageFile, at: u64, len: u64) -> Result<bool, DiskError> {
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
pub(super) fn zero_after(file: &StorageFile, from: u64, to: u64) -> Result<bool, DiskError> {
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

pub(super) fn zero_from(file: &StorageFile, from: u64, to: u64) -> Result<(), DiskError> {
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
