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

use super::error::DiskError;
use super::format::*;
use super::replay::*;
use super::segment::*;
use super::{Wal, DIR};
use crate::engine::raft::storage::Storage;
// What the tests (here and in power_cut.rs) read the log with.
#[cfg(test)]
use crate::engine::raft::{
    encoding,
    storage::StorageFile,
    types::{Entry, LogId, Vote},
};
#[cfg(test)]
use std::collections::BTreeMap;
use std::path::Path;
#[cfg(test)]
use std::path::PathBuf;

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

    pub(super) fn write_inner(&mut self, mut batch: Batch) -> Result<Vec<Loc>, DiskError> {
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
    pub(super) fn marked_first(&mut self, batch: Batch) -> Result<Batch, DiskError> {
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

    /// Whether a sync mark is due and not written yet.
    #[cfg(test)]
    pub(crate) fn mark_due(&self) -> bool {
        self.synced > self.marked
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
}

/// A storage error a test asked for: with the `testing` feature, a file
/// named `FAIL-SYNC` in the log's directory makes every sync fail with EIO,
/// as a dying disk's would. Never in a build without that feature.
#[cfg(feature = "testing")]
pub(super) fn injected_fault(dir: &Path) -> Option<std::io::Error> {
    /// EIO on Linux.
    const EIO: i32 = 5;
    dir.join("FAIL-SYNC")
        .exists()
        .then(|| std::io::Error::from_raw_os_error(EIO))
}

#[cfg(not(feature = "testing"))]
pub(super) fn injected_fault(_dir: &Path) -> Option<std::io::Error> {
    None
}

pub(super) fn failed() -> DiskError {
    DiskError::Io(std::io::Error::other(
        "an earlier raft log write failed; the node must restart to write again",
    ))
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
#[path = "power_cut.rs"]
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
