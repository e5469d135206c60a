//! The Raft log and vote, durable in one redb file (`raft.redb`).
//!
//! Two tables: `log` maps an entry's index to the entry (`encoding`), and
//! `meta` holds the vote, the id of the last purged entry and the last
//! committed id. Every change to the log or the vote is one redb write
//! transaction committed with [`Durability::Immediate`], which returns only
//! after the file is fsynced; openraft is told an append is flushed (its
//! `LogFlushed` callback) only after that commit, and counts this node
//! towards a majority only then. So an acknowledged write is on the disk
//! of a majority of nodes.
//!
//! redb is synchronous: every write goes to one writer thread (see
//! `log_writer`), in order, and appends queued behind each other share one
//! commit. Reads (replication streams read entries concurrently with
//! appends) use redb read transactions, which see the last committed state
//! and never block the writer, plus the entries still queued.

use super::disk::{redb, DiskError, LOG};
use super::encoding;
use super::log_writer::{Change, Pending, Writer};
use super::types::{Entry, LogId, NodeId, TypeConfig, Vote};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogId, StorageError, StorageIOError};
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const PURGED: &str = "purged";
const COMMITTED: &str = "committed";

/// A file created beside `raft.redb` after its first commit of a vote or
/// an entry. A log that is empty while it exists has lost what it held (a
/// file cut short, replaced or deleted): such a node could vote twice in one
/// term, so it must not start (see `start::open_data_dir`).
pub(crate) const WRITTEN_MARKER: &str = "raft.redb.written";

/// `raft.redb` is compacted on opening only when it is larger than this.
const COMPACT_ABOVE: u64 = 8 << 20;

/// The log store is small (entries up to the next snapshot, 10,000 by
/// default): redb's default 1 GiB page cache would be mostly empty.
const CACHE_BYTES: usize = 64 << 20;

impl DiskError {
    fn storage(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> StorageError<NodeId> {
        StorageIOError::new(subject, verb, &self).into()
    }
}

/// The Raft log and vote. openraft owns the one `LogStore` and drops it
/// when it stops, which closes the file: the [`LogReader`]s it hands to
/// replication tasks hold it weakly, because those tasks may outlive the
/// engine briefly (asleep in a backoff), and the data directory must be
/// reusable as soon as the engine has stopped.
pub(crate) struct LogStore {
    db: Arc<Database>,
    /// The last committed index this node knows of, plus one (0: none),
    /// for status reports; openraft's metrics do not carry it.
    committed: Arc<AtomicU64>,
    /// Appended entries the writer has not committed yet.
    pending: Pending,
    /// Whether [`WRITTEN_MARKER`] was there when the file was opened.
    written_before: bool,
    /// Declared last, so it is dropped last: its drop waits for the writer
    /// thread, which holds the file open until it ends.
    writer: Writer,
}

impl LogStore {
    /// Opens (or creates) `raft.redb` in `dir`.
    ///
    /// # Errors
    /// The file cannot be opened or created (it is open in another process,
    /// is damaged, or the directory is not writable).
    pub(crate) fn open(dir: &Path) -> Result<LogStore, DiskError> {
        let mut db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            // The format redb 3 reads, so a later upgrade of redb (which
            // needs a newer Rust than the workspace's minimum) keeps the file.
            .create_with_file_format_v3(true)
            .create(dir.join("raft.redb"))
            .map_err(redb)?;
        let txn = db.begin_write().map_err(redb)?;
        {
            txn.open_table(LOG).map_err(redb)?;
            txn.open_table(META).map_err(redb)?;
        }
        txn.commit().map_err(redb)?;
        // While the node runs, the pages of purged entries are reused but
        // the file never shrinks: a burst of large entries leaves it large.
        // Nothing else has the file yet, so this is the time to give the
        // space back; a small file is left alone (compacting costs a few
        // fsynced commits). Failing to is no reason not to start.
        let size = |db: &Path| std::fs::metadata(db).map(|m| m.len()).unwrap_or(0);
        let path = dir.join("raft.redb");
        let before = size(&path);
        if before > COMPACT_ABOVE {
            match db.compact() {
                Ok(true) => tracing::info!(before, after = size(&path), "raft.redb compacted"),
                Ok(false) => {}
                Err(e) => tracing::warn!("raft.redb could not be compacted: {e}"),
            }
        }
        let db = Arc::new(db);
        let pending = Pending::default();
        let marker = dir.join(WRITTEN_MARKER);
        let written_before = marker.exists();
        let store = LogStore {
            writer: Writer::start(
                db.clone(),
                pending.clone(),
                (!written_before).then_some(marker),
            )?,
            written_before,
            db,
            committed: Arc::new(AtomicU64::new(0)),
            pending,
        };
        let committed: Option<LogId> = store.meta(COMMITTED)?;
        store.note_committed(committed.as_ref());
        Ok(store)
    }

    /// Whether nothing was ever written: no vote, no entry, nothing purged.
    /// A fresh node is the only kind that may be initialised.
    pub(crate) fn is_fresh(&self) -> Result<bool, DiskError> {
        let vote: Option<Vote> = self.meta(VOTE)?;
        let purged: Option<LogId> = self.meta(PURGED)?;
        let txn = self.db.begin_read().map_err(redb)?;
        let log = txn.open_table(LOG).map_err(redb)?;
        Ok(vote.is_none() && purged.is_none() && log.is_empty().map_err(redb)?)
    }

    /// Whether the log held a vote or entries before and holds nothing now:
    /// the file lost what was written to it.
    pub(crate) fn lost_its_writes(&self) -> Result<bool, DiskError> {
        Ok(self.written_before && self.is_fresh()?)
    }

    /// The handle to the last committed index, shared with status reports.
    pub(crate) fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn note_committed(&self, id: Option<&LogId>) {
        let v = id.map_or(0, |id| id.index.saturating_add(1));
        self.committed.store(v, Ordering::Relaxed);
    }

    fn meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, DiskError> {
        let txn = self.db.begin_read().map_err(redb)?;
        let table = txn.open_table(META).map_err(redb)?;
        let Some(v) = table.get(key).map_err(redb)? else {
            return Ok(None);
        };
        Ok(Some(encoding::decode(v.value())?))
    }

    fn last_entry(&self) -> Result<Option<Entry>, DiskError> {
        if let Some((_, e)) = self.pending.lock().last_key_value() {
            return Ok(Some(e.clone()));
        }
        let txn = self.db.begin_read().map_err(redb)?;
        let table = txn.open_table(LOG).map_err(redb)?;
        let Some((_, v)) = table.last().map_err(redb)? else {
            return Ok(None);
        };
        Ok(Some(encoding::decode(v.value())?))
    }

    /// Runs one write transaction after everything queued before it and
    /// waits for its commit (and so its fsync, for [`Durability::Immediate`]).
    async fn write<F>(&self, durability: Durability, f: F) -> Result<(), DiskError>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), DiskError> + Send + 'static,
    {
        let change: Change = Box::new(f);
        self.writer.write(durability, change).await
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
        durability: Durability,
    ) -> Result<(), DiskError> {
        let bytes = encoding::encode(value)?;
        self.write(durability, move |txn| {
            txn.open_table(META)
                .map_err(redb)?
                .insert(key, bytes.as_slice())
                .map_err(redb)?;
            Ok(())
        })
        .await
    }
}

/// With no node running on `dir` (a backup being restored): appends one
/// normal entry holding `payload` after the log's last entry (or after
/// `snapshot`, the last log id the directory's snapshot covers, when that is
/// later: a node can stop between installing a snapshot and purging the log
/// it covers, and an entry at or below it would be purged unapplied), in
/// that entry's term (as if its leader had appended it), and marks it committed,
/// so every node started from a copy of the directory applies it. Entries
/// the backup held uncommitted at its tail are committed with it, as a new
/// leader's first entry would commit them. Returns the entry's id.
///
/// `None` when the log holds no entry at all (nothing to restore).
///
/// # Errors
/// The file cannot be opened (missing, or open in a running node) or
/// cannot be written.
pub(crate) fn append_committed_offline(
    dir: &Path,
    snapshot: Option<LogId>,
    payload: super::types::Stamped,
) -> Result<Option<LogId>, DiskError> {
    let db = Database::open(dir.join("raft.redb")).map_err(redb)?;
    let last = {
        let txn = db.begin_read().map_err(redb)?;
        let log = txn.open_table(LOG).map_err(redb)?;
        let last: Option<Entry> = match log.last().map_err(redb)? {
            Some((_, v)) => Some(encoding::decode(v.value())?),
            None => None,
        };
        let purged: Option<LogId> = match txn.open_table(META).map_err(redb)?.get(PURGED) {
            Ok(Some(v)) => encoding::decode(v.value())?,
            Ok(None) => None,
            Err(e) => return Err(redb(e)),
        };
        [last.map(|e| e.log_id), purged, snapshot]
            .into_iter()
            .flatten()
            .max_by_key(|id| id.index)
    };
    let Some(last) = last else {
        return Ok(None);
    };
    let id = LogId::new(last.leader_id, last.index.saturating_add(1));
    let entry = Entry {
        log_id: id,
        payload: openraft::EntryPayload::Normal(payload),
    };
    let bytes = encoding::encode(&entry)?;
    let committed = encoding::encode(&Some(id))?;
    let mut txn = db.begin_write().map_err(redb)?;
    txn.set_durability(Durability::Immediate);
    txn.open_table(LOG)
        .map_err(redb)?
        .insert(id.index, bytes.as_slice())
        .map_err(redb)?;
    txn.open_table(META)
        .map_err(redb)?
        .insert(COMMITTED, committed.as_slice())
        .map_err(redb)?;
    txn.commit().map_err(redb)?;
    Ok(Some(id))
}

fn entries<R: RangeBounds<u64>>(
    db: &Database,
    pending: &Pending,
    range: R,
) -> Result<Vec<Entry>, DiskError> {
    let bounds: (Bound<u64>, Bound<u64>) =
        (range.start_bound().cloned(), range.end_bound().cloned());
    // Queued entries first: they only ever move from the queue into the
    // file, so reading the queue before the file misses none.
    let queued: Vec<(u64, Entry)> = pending
        .lock()
        .range(bounds)
        .map(|(i, e)| (*i, e.clone()))
        .collect();
    let txn = db.begin_read().map_err(redb)?;
    let table = txn.open_table(LOG).map_err(redb)?;
    let mut out = BTreeMap::new();
    for item in table.range(bounds).map_err(redb)? {
        let (k, v) = item.map_err(redb)?;
        out.insert(k.value(), encoding::decode(v.value())?);
    }
    out.extend(queued);
    Ok(out.into_values().collect())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        entries(&self.db, &self.pending, range)
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

/// Reads entries for a replication task while the engine runs.
pub(crate) struct LogReader {
    db: Weak<Database>,
    pending: Pending,
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        let Some(db) = self.db.upgrade() else {
            let e = std::io::Error::other("the raft log is closed: the engine has stopped");
            return Err(StorageIOError::read_logs(&e).into());
        };
        entries(&db, &self.pending, range)
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let read = || -> Result<_, DiskError> {
            let purged: Option<LogId> = self.meta(PURGED)?;
            let last = self.last_entry()?.map(|e| *e.get_log_id());
            Ok(LogState {
                last_purged_log_id: purged,
                last_log_id: last.or(purged),
            })
        };
        read().map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            db: Arc::downgrade(&self.db),
            pending: self.pending.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError<NodeId>> {
        self.put_meta(VOTE, vote, Durability::Immediate)
            .await
            .map_err(|e| e.storage(ErrorSubject::Vote, ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError<NodeId>> {
        self.meta(VOTE)
            .map_err(|e| e.storage(ErrorSubject::Vote, ErrorVerb::Read))
    }

    /// Kept so that a restarted node applies what it knows was committed at
    /// once, instead of waiting for a leader to tell it again. Queued behind
    /// the appends before it (so the record never points past entries this
    /// node has on disk) but not waited for, so it never holds openraft up
    /// behind an fsync; not fsynced on its own: the next append's commit
    /// carries it, and losing it only delays that re-apply.
    async fn save_committed(
        &mut self,
        committed: Option<LogId>,
    ) -> Result<(), StorageError<NodeId>> {
        self.note_committed(committed.as_ref());
        let to_err = |e: DiskError| e.storage(ErrorSubject::Store, ErrorVerb::Write);
        let bytes = encoding::encode(&committed).map_err(|e| to_err(e.into()))?;
        let change: Change = Box::new(move |txn| {
            txn.open_table(META)
                .map_err(redb)?
                .insert(COMMITTED, bytes.as_slice())
                .map_err(redb)?;
            Ok(())
        });
        self.writer
            .write_detached(Durability::None, change)
            .await
            .map_err(to_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<NodeId>> {
        let committed: Option<Option<LogId>> = self
            .meta(COMMITTED)
            .map_err(|e| e.storage(ErrorSubject::Store, ErrorVerb::Read))?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        let mut queued = Vec::new();
        for e in entries {
            match encoding::encode(&e) {
                Ok(bytes) => encoded.push((e.log_id, bytes)),
                Err(e) => {
                    let e = DiskError::from(e);
                    callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                    return Err(e.storage(ErrorSubject::Logs, ErrorVerb::Write));
                }
            }
            queued.push(e);
        }
        // Readable from now on, though not yet on disk: openraft may send
        // them to followers meanwhile, but counts this node towards the
        // majority only once the writer calls `callback`.
        {
            let mut pending = self.pending.lock();
            for e in queued {
                pending.insert(e.log_id.index, e);
            }
        }
        self.writer
            .append(encoded, callback)
            .await
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Write))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let from = log_id.index;
        self.write(Durability::Immediate, move |txn| {
            let mut log = txn.open_table(LOG).map_err(redb)?;
            for item in log.extract_from_if(from.., |_, _| true).map_err(redb)? {
                item.map_err(redb)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Delete))?;
        // Every append queued before the truncation was committed (and left
        // the queue) before it; nothing from `from` on may stay readable.
        drop(self.pending.lock().split_off(&from));
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<NodeId>> {
        let upto = log_id.index;
        let purged = encoding::encode(&log_id)
            .map_err(|e| DiskError::from(e).storage(ErrorSubject::Logs, ErrorVerb::Delete))?;
        // The purged id and the deletion commit together, so the log never
        // appears to start later than the record of what was purged.
        self.write(Durability::Immediate, move |txn| {
            txn.open_table(META)
                .map_err(redb)?
                .insert(PURGED, purged.as_slice())
                .map_err(redb)?;
            let mut log = txn.open_table(LOG).map_err(redb)?;
            for item in log.extract_from_if(..=upto, |_, _| true).map_err(redb)? {
                item.map_err(redb)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Delete))
    }
}
