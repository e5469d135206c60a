//! Data directories written before the log moved to `raft-log/` kept it in
//! one redb file, `raft.redb`: a table `log` (index to encoded entry) and a
//! table `meta` (the encoded vote, purged id and committed id). The first
//! open of such a directory copies it into `raft-log/` (built beside it and
//! renamed into place, so a crash leaves one or the other whole) and then
//! deletes `raft.redb`.

use super::error::{redb, DiskError};
use super::format::Batch;
use super::wal;
use crate::engine::raft::encoding;
use crate::engine::raft::types::{Entry, LogId, Vote};
use redb::{Database, ReadableTable, TableDefinition};
use std::path::Path;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The file the log was kept in before `raft-log/`.
pub(crate) const FILE: &str = "raft.redb";

/// Imports `dir`'s `raft.redb` into `raft-log/` if it has the one and not
/// the other. With both, `raft.redb` is a leftover (of an import that
/// stopped before deleting it, or made empty by an older version that then
/// refused the directory) and is deleted.
///
/// # Errors
/// `raft.redb` cannot be read (damaged, or open in an older node), or the
/// new log cannot be written.
pub(crate) fn import(dir: &Path) -> Result<(), DiskError> {
    // redb 2.x asserts, rather than returning an error, on some damaged
    // files (one cut short): that is a refusal here, not a crash.
    std::panic::catch_unwind(|| import_unguarded(dir)).unwrap_or_else(|_| {
        Err(DiskError::Damaged(format!(
            "{} is damaged (redb could not read it)",
            dir.join(FILE).display()
        )))
    })
}

fn import_unguarded(dir: &Path) -> Result<(), DiskError> {
    let old = dir.join(FILE);
    if !old.is_file() {
        return Ok(());
    }
    if dir.join(super::DIR).is_dir() {
        std::fs::remove_file(&old)?;
        return Ok(());
    }
    let db = Database::open(&old).map_err(redb)?;
    let txn = db.begin_read().map_err(redb)?;
    let mut batch = Batch::default();
    match txn.open_table(META) {
        Ok(meta) => {
            if let Some(v) = meta.get("vote").map_err(redb)? {
                // Decoded to be sure it reads before the old file goes.
                let _: Vote = encoding::decode(v.value())?;
                batch.vote(v.value().to_vec())?;
            }
            if let Some(v) = meta.get("purged").map_err(redb)? {
                let purged: LogId = encoding::decode(v.value())?;
                batch.purge(purged)?;
            }
            if let Some(v) = meta.get("committed").map_err(redb)? {
                let _: Option<LogId> = encoding::decode(v.value())?;
                batch.committed(v.value().to_vec())?;
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(redb(e)),
    }
    let mut entries = 0_u64;
    match txn.open_table(LOG) {
        Ok(log) => {
            for item in log.iter().map_err(redb)? {
                let (_, v) = item.map_err(redb)?;
                let entry: Entry = encoding::decode(v.value())?;
                batch.entry(entry.log_id, v.value())?;
                entries += 1;
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(redb(e)),
    }
    drop(txn);
    wal::create_imported(dir, batch)?;
    drop(db);
    std::fs::remove_file(&old)?;
    tracing::info!(dir = %dir.display(), entries, "the raft log moved from raft.redb to raft-log/");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Wal;
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    /// A `raft.redb` as the version before `raft-log/` wrote it.
    fn old_dir(dir: &Path) {
        let db = Database::create(dir.join(FILE)).expect("create");
        let txn = db.begin_write().expect("txn");
        {
            let mut meta = txn.open_table(META).expect("meta");
            let vote = encoding::encode(&Vote::new(2, 1)).expect("vote");
            meta.insert("vote", vote.as_slice()).expect("vote");
            let purged = encoding::encode(&id(3)).expect("purged");
            meta.insert("purged", purged.as_slice()).expect("purged");
            let committed = encoding::encode(&Some(id(5))).expect("committed");
            meta.insert("committed", committed.as_slice())
                .expect("committed");
            let mut log = txn.open_table(LOG).expect("log");
            for i in 4..=6 {
                let e = Entry {
                    log_id: id(i),
                    payload: EntryPayload::Blank,
                };
                let bytes = encoding::encode(&e).expect("entry");
                log.insert(i, bytes.as_slice()).expect("insert");
            }
        }
        txn.commit().expect("commit");
    }

    #[test]
    fn an_older_log_is_imported_whole_and_its_file_deleted() {
        let dir = tempfile::tempdir().expect("dir");
        old_dir(dir.path());
        import(dir.path()).expect("import");
        assert!(!dir.path().join(FILE).exists());
        let (_wal, r) = Wal::open(dir.path()).expect("open");
        assert_eq!(r.vote, Some(Vote::new(2, 1)));
        assert_eq!(r.purged, Some(id(3)));
        assert_eq!(r.committed, Some(id(5)));
        assert_eq!(r.entries.keys().copied().collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(r.entries[&6].read().expect("read").log_id, id(6));
    }

    #[test]
    fn a_leftover_raft_redb_beside_the_new_log_is_deleted_unread() {
        let dir = tempfile::tempdir().expect("dir");
        drop(Wal::open(dir.path()).expect("new log"));
        std::fs::write(dir.path().join(FILE), b"not a database").expect("write");
        import(dir.path()).expect("import");
        assert!(!dir.path().join(FILE).exists());
    }

    #[test]
    fn a_damaged_raft_redb_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        old_dir(dir.path());
        let file = dir.path().join(FILE);
        let whole = std::fs::read(&file).expect("read");
        std::fs::write(&file, &whole[..whole.len() / 2]).expect("cut");
        assert!(matches!(
            import(dir.path()),
            Err(DiskError::Redb(_) | DiskError::Damaged(_))
        ));
        assert!(!dir.path().join(super::super::DIR).exists());
    }
}
