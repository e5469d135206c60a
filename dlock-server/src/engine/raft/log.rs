//! The Raft log, in a folder of its own: the project's segment-file
//! write-ahead log and openraft's view of it.
//!
//! - `format.rs`: a record, byte by byte (header, head, kinds, salted sync
//!   marks) and [`Batch`](format::Batch), records for one write.
//! - `segment.rs`: the segment files, their growth and deletion, and where
//!   an entry is ([`Loc`](segment::Loc)).
//! - `replay.rs`: reading the log back at a start, torn tails told from
//!   damage.
//! - `wal.rs`: the open log ([`Wal`](wal::Wal)): the write path and the
//!   sync, and what the format promises after a crash.
//! - `written.rs`: what readers see: the entries, vote and ids on disk,
//!   and the entries appended but not yet written.
//! - `committed.rs`: the committed id saved and not yet written, carried by
//!   the next append or written on its own after a wait.
//! - `disk.rs`: the log's writes ([`Disk`](disk::Disk)), in the order
//!   called, on the thread that calls: what both ways of writing share.
//! - `writer.rs`: the writer thread, one `pwrite` and one `fdatasync` for
//!   everything queued.
//! - `inline.rs`: the log written by openraft's core itself, on a node
//!   whose consensus tasks have a thread of their own.
//! - `store.rs`: the openraft adapter ([`LogStore`]), and the log opened
//!   offline for a restore ([`OfflineLog`]).
//! - `error.rs`: what can go wrong in its files ([`DiskError`]).
//! - `redb_import.rs`: the import of logs of versions that kept them in redb.
//!
//! Its files and directories are reached through `storage.rs`, beside it,
//! which the snapshot file shares.

mod committed;
mod disk;
mod error;
mod format;
mod inline;
mod redb_import;
mod replay;
mod segment;
mod store;
mod wal;
mod writer;
mod written;

use crate::engine::raft::storage::{Storage, StorageLock};
use segment::Segment;
use std::path::PathBuf;

pub(crate) use redb_import::FILE as REDB_FILE;
pub(crate) use store::{LogStore, OfflineLog, WrittenBy, WRITTEN_MARKER};

/// The log's directory inside a data directory.
pub(crate) const DIR: &str = "raft-log";

/// The open log: one writer (the writer thread, openraft's core, or an
/// offline restore) at a time, which an advisory lock on `raft-log/lock`
/// makes sure of.
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
