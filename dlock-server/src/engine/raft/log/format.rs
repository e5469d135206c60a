//! A record of the raft log, byte by byte: the segment header, the record
//! head (length and CRC), the kinds of record, sync marks and their salted
//! CRC, and [`Batch`], records gathered into one buffer for one write. See
//! `wal.rs` for what the format promises after a crash.

use super::error::DiskError;
use crate::engine::raft::encoding;
use crate::engine::raft::types::LogId;

pub(super) const MAGIC: [u8; 8] = *b"dlockwal";
/// The record format this version writes: 2 has sync marks.
pub(super) const VERSION: u8 = 2;
/// The oldest format this version reads: 1, without sync marks.
pub(super) const OLDEST_VERSION: u8 = 1;
pub(super) const HEADER: u64 = 16;
/// A record's length and CRC.
pub(super) const HEAD: usize = 8;

/// A record's kind and payload at most. The largest entry is one batch of
/// commands (1 MiB, plus one command of at most a client frame).
pub(crate) const MAX_RECORD: usize = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) const MARK_LEN: usize = HEAD + 1 + 8;

impl Kind {
    pub(super) fn of(b: u8) -> Option<Kind> {
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

/// A whole record's kind and payload if its length and CRC check out; a
/// sync mark's CRC covers its segment's `salt` too.
pub(super) fn check(record: &[u8], salt: u32) -> Option<(Kind, &[u8])> {
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
pub(super) fn crc_of(salt: Option<u32>, len: &[u8], body: &[u8]) -> u32 {
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
pub(super) fn new_salt() -> u32 {
    crate::engine::raft::storage::unpredictable()
}

/// Where a segment's salt sits in its header.
pub(super) const SALT_AT: usize = 12;

/// Records to write together, in one buffer.
#[derive(Default)]
pub(crate) struct Batch {
    pub(super) buf: Vec<u8>,
    /// Each entry's id, where its record starts in `buf`, and its length.
    pub(super) entries: Vec<(LogId, usize, usize)>,
    pub(super) vote: Option<Vec<u8>>,
    pub(super) committed: Option<Vec<u8>>,
    pub(super) purged: Option<Vec<u8>>,
}

impl Batch {
    pub(super) fn push(&mut self, kind: Kind, payload: &[u8]) -> Result<usize, DiskError> {
        self.push_salted(kind, payload, None)
    }

    /// A sync mark naming `through`, for a segment salted with `salt`.
    pub(super) fn mark(&mut self, salt: u32, through: u64) -> Result<usize, DiskError> {
        self.push_salted(Kind::Synced, &through.to_le_bytes(), Some(salt))
    }

    pub(super) fn push_salted(
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
