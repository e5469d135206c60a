//! The log on a simulated disk (`storage_sim`): seeded rounds of appends,
//! votes, truncations and purges cut by power failures, and disk errors on
//! command. What must hold after every cut: each entry whose append was
//! synced is there with the same bytes, nothing follows a gap, the vote is
//! at least the last synced one, and the log opens (a torn tail that no
//! sync covered never refuses a start). After a failed write or sync,
//! nothing more is written.

use super::*;
use crate::engine::raft::storage_sim::{Op, SimDisk, EIO, ENOSPC};
use crate::engine::raft::types::Stamped;
use crate::table::{Command, Time};
use openraft::{CommittedLeaderId, EntryPayload};

/// Small steps and segments, so that rounds grow files, rotate segments
/// and delete purged ones often.
const SMALL: (u64, u64) = (4096, 16384);

fn data_dir() -> PathBuf {
    PathBuf::from("/node/data")
}

/// A disk whose data directory's parent already exists and is durable, as
/// a data directory's parent is on a real machine.
fn disk(lying: bool) -> SimDisk {
    let disk = if lying {
        SimDisk::lying()
    } else {
        SimDisk::new()
    };
    let storage = Storage::Sim(disk.clone());
    storage
        .create_dir_all(Path::new("/node"))
        .expect("the parent");
    disk.settle();
    disk
}

fn open(disk: &SimDisk) -> Result<(Wal, Replayed), DiskError> {
    Wal::open_with(Storage::Sim(disk.clone()), &data_dir(), SMALL.0, SMALL.1)
}

fn id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// An entry of about `size` × 10 bytes, so that writes span sectors.
fn entry(term: u64, index: u64, size: usize) -> (LogId, Vec<u8>) {
    let e = Entry {
        log_id: id(term, index),
        payload: EntryPayload::Normal(Stamped {
            at: Time::ZERO,
            cmds: vec![Command::Restore { fence_floor: index }; size],
        }),
    };
    (e.log_id, encoding::encode(&e).expect("encode"))
}

/// splitmix64, for the rounds' choices.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// What the log must hold after a cut.
#[derive(Default)]
struct Model {
    /// Entries whose append was synced (acknowledged), by index.
    acked: BTreeMap<u64, Vec<u8>>,
    /// Entries written since the last sync.
    unsynced: BTreeMap<u64, Vec<u8>>,
    /// The last vote synced, and the last written.
    vote: Option<Vote>,
    written_vote: Option<Vote>,
    /// The last purge synced.
    purged: Option<u64>,
    term: u64,
}

impl Model {
    fn last(&self) -> Option<u64> {
        let last = |m: &BTreeMap<u64, Vec<u8>>| m.keys().next_back().copied();
        last(&self.acked).max(last(&self.unsynced))
    }

    /// Takes what a reopened log holds as the truth from here on (opening
    /// made it durable), after checking it against what was promised.
    fn check_and_adopt(&mut self, r: &Replayed) -> Result<(), String> {
        let purged = r.purged.map(|p| p.index);
        if purged < self.purged {
            return Err(format!(
                "purged {purged:?} is behind the synced purge {:?}",
                self.purged
            ));
        }
        for (i, want) in &self.acked {
            if purged.is_some_and(|p| *i <= p) {
                continue;
            }
            let Some(loc) = r.entries.get(i) else {
                return Err(format!("acknowledged entry {i} is lost"));
            };
            let got = loc
                .read()
                .map_err(|e| format!("entry {i} does not read back: {e}"))?;
            let got = encoding::encode(&got).map_err(|e| e.to_string())?;
            if got != *want {
                return Err(format!("acknowledged entry {i} changed"));
            }
        }
        if r.vote < self.vote || r.vote > self.written_vote {
            return Err(format!(
                "vote {:?}: the last synced was {:?}, the last written {:?}",
                r.vote, self.vote, self.written_vote
            ));
        }
        // `Wal::open` refuses a gap; here is the proof nothing was made up.
        if let Some(last) = r.entries.keys().next_back() {
            if Some(*last) > self.last() {
                return Err(format!("entry {last} was never written"));
            }
        }
        self.acked.clear();
        self.unsynced.clear();
        for (i, loc) in &r.entries {
            let e = loc.read().map_err(|e| e.to_string())?;
            self.term = self.term.max(e.log_id.leader_id.term);
            self.acked
                .insert(*i, encoding::encode(&e).map_err(|e| e.to_string())?);
        }
        self.vote = r.vote;
        self.written_vote = r.vote;
        self.purged = purged;
        Ok(())
    }
}

/// One seeded round: a few lives of the log, each ended by a power cut,
/// each followed by a reopen that must keep what was promised.
fn round(disk: &SimDisk, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let mut model = Model {
        term: 1,
        ..Model::default()
    };
    for life in 0..4 {
        let (mut wal, r) = open(disk).map_err(|e| {
            format!(
                "life {life}: the log does not open: {e}\nlast cut: {:#?}",
                disk.last_cut()
            )
        })?;
        model
            .check_and_adopt(&r)
            .map_err(|e| format!("life {life}: {e}\nlast cut: {:#?}", disk.last_cut()))?;
        if rng.below(2) == 0 {
            // The power fails in the middle of something.
            disk.die_after(rng.below(400));
        }
        let steps = 5 + rng.below(60);
        for _ in 0..steps {
            match step(&mut wal, &mut model, &mut rng) {
                Ok(()) => {}
                Err(_) if disk.died() => break,
                Err(e) => return Err(format!("life {life}: {e}")),
            }
        }
        drop(wal);
        disk.power_cut(seed.wrapping_mul(31).wrapping_add(life));
    }
    let (_wal, r) = open(disk).map_err(|e| format!("the log does not open: {e}"))?;
    model
        .check_and_adopt(&r)
        .map_err(|e| format!("last: {e}\nlast cut: {:#?}", disk.last_cut()))
}

fn sync(wal: &mut Wal, model: &mut Model) -> Result<(), String> {
    wal.sync().map_err(|e| format!("sync: {e}"))?;
    let unsynced = std::mem::take(&mut model.unsynced);
    model.acked.extend(unsynced);
    model.vote = model.written_vote;
    Ok(())
}

fn step(wal: &mut Wal, model: &mut Model, rng: &mut Rng) -> Result<(), String> {
    let first = model.purged.map_or(0, |p| p + 1);
    let next = model.last().map_or(first, |l| l + 1);
    let mut b = Batch::default();
    match rng.below(10) {
        // Appends, the common case; most synced at once, as the writer does.
        0..=5 => {
            for i in next..next + 1 + rng.below(12) {
                let (id, bytes) = entry(model.term, i, 1 + rng.below(80) as usize);
                b.entry(id, &bytes).map_err(|e| e.to_string())?;
                model.unsynced.insert(i, bytes);
            }
            wal.write(b).map_err(|e| format!("append: {e}"))?;
            if rng.below(4) != 0 {
                sync(wal, model)?;
            }
        }
        6 => {
            model.term += 1;
            let vote = Vote::new(model.term, 1 + rng.below(3));
            b.vote(encoding::encode(&vote).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            wal.write(b).map_err(|e| format!("vote: {e}"))?;
            model.written_vote = Some(vote);
            sync(wal, model)?;
        }
        // The committed id, never synced by itself.
        7 => {
            let committed = model.acked.keys().next_back().map(|i| id(model.term, *i));
            b.committed(encoding::encode(&committed).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            wal.write(b).map_err(|e| format!("committed: {e}"))?;
        }
        // A truncation of the last few entries, synced before it counts
        // (then later appends of a new term take their place).
        8 => {
            if next > first {
                let from = next - 1 - rng.below((next - first).min(5));
                b.truncate(from).map_err(|e| e.to_string())?;
                wal.write(b).map_err(|e| format!("truncate: {e}"))?;
                sync(wal, model)?;
                drop(model.acked.split_off(&from));
                model.term += 1;
            }
        }
        // A purge of most synced entries, then their segments deleted.
        _ => {
            let synced_last = model.acked.keys().next_back().copied();
            if let Some(last) = synced_last.filter(|l| *l >= first) {
                let upto = first + rng.below(last - first + 1);
                b.purge(id(1, upto)).map_err(|e| e.to_string())?;
                wal.write(b).map_err(|e| format!("purge: {e}"))?;
                sync(wal, model)?;
                model.acked = model.acked.split_off(&(upto + 1));
                model.purged = Some(upto);
                wal.drop_purged(upto)
                    .map_err(|e| format!("drop purged: {e}"))?;
            }
        }
    }
    if rng.below(5) == 0 {
        // The writer out of work.
        wal.mark_synced().map_err(|e| format!("mark: {e}"))?;
    }
    Ok(())
}

#[test]
fn every_synced_entry_and_vote_survives_power_cuts_and_torn_tails_never_block_a_start() {
    for seed in 0..300 {
        let disk = disk(false);
        if let Err(why) = round(&disk, seed) {
            panic!("seed {seed}: {why}");
        }
    }
}

#[test]
fn on_a_disk_whose_syncs_do_nothing_the_rounds_lose_acknowledged_entries() {
    // The negative control: the checks above can fail.
    let failed = (0..50)
        .filter(|seed| round(&disk(true), *seed).is_err())
        .count();
    assert!(
        failed > 25,
        "only {failed} of 50 rounds failed on a lying disk"
    );
}

/// A log holding entries 0..=9, synced, on a fresh disk.
fn ten_synced() -> (SimDisk, Wal) {
    let disk = disk(false);
    let (mut wal, _) = open(&disk).expect("open");
    let mut b = Batch::default();
    for i in 0..10 {
        let (id, bytes) = entry(1, i, 5);
        b.entry(id, &bytes).expect("entry");
    }
    wal.write(b).expect("write");
    wal.sync().expect("sync");
    (disk, wal)
}

fn append_one(wal: &mut Wal, index: u64, size: usize) -> Result<(), DiskError> {
    let mut b = Batch::default();
    let (id, bytes) = entry(1, index, size);
    b.entry(id, &bytes)?;
    wal.write(b)?;
    wal.sync()
}

/// After a failure: nothing more is written, and after a cut the log
/// opens with every synced entry.
fn stays_failed_and_keeps_synced(disk: &SimDisk, mut wal: Wal, next: u64) {
    assert!(
        append_one(&mut wal, next, 5).is_err(),
        "a write after a failure succeeded"
    );
    assert!(wal.sync().is_err(), "a sync after a failure succeeded");
    drop(wal);
    for seed in 0..20 {
        disk.power_cut(seed);
        let (_wal, r) = open(disk).expect("the log opens after a failure and a cut");
        assert!(
            r.entries.keys().copied().take(10).eq(0..10),
            "synced entries lost: {:?}",
            r.entries.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn an_eio_on_write_fails_the_append_and_every_later_one() {
    let (disk, mut wal) = ten_synced();
    disk.fail_next(Op::Write, EIO);
    let Err(e) = append_one(&mut wal, 10, 5) else {
        panic!("a failed write was reported as written");
    };
    assert!(e.to_string().contains("Input/output error"), "{e}");
    stays_failed_and_keeps_synced(&disk, wal, 11);
}

#[test]
fn an_eio_on_sync_is_never_retried_as_if_it_had_worked() {
    let (disk, mut wal) = ten_synced();
    disk.fail_next(Op::Sync, EIO);
    assert!(append_one(&mut wal, 10, 5).is_err());
    // The disk would now report a retried sync as done, with entry 10
    // never written: the log must not ask it.
    stays_failed_and_keeps_synced(&disk, wal, 11);
}

#[test]
fn the_simulated_disk_loses_what_a_failed_sync_should_have_written_even_after_a_retry() {
    // What the test above guards against, shown on the disk itself.
    let disk = disk(false);
    let storage = Storage::Sim(disk.clone());
    let path = Path::new("/node/f");
    let file = storage.create(path, true).expect("create");
    storage.sync_dir(Path::new("/node")).expect("sync dir");
    file.write_all_at(b"acknowledged?", 0).expect("write");
    disk.fail_next(Op::Sync, EIO);
    assert!(file.sync_data().is_err());
    file.sync_data().expect("the retry succeeds");
    let mut buf = [0; 13];
    file.read_exact_at(&mut buf, 0).expect("read");
    assert_eq!(&buf, b"acknowledged?", "the page cache still has it");
    disk.power_cut(1);
    assert_eq!(disk.durable_bytes(path), Some(Vec::new()));
}

#[test]
fn an_eio_on_the_rename_of_a_new_segment_fails_the_write() {
    let (disk, mut wal) = ten_synced();
    disk.fail_next(Op::Rename, EIO);
    let mut failed = None;
    // Enough to fill the segment and start a new one.
    for i in 10..400 {
        if let Err(e) = append_one(&mut wal, i, 40) {
            failed = Some((i, e));
            break;
        }
    }
    let (at, _) = failed.expect("the rotation failed");
    assert!(wal.files().len() == 1);
    drop(wal);
    disk.power_cut(3);
    let (mut wal, r) = open(&disk).expect("reopen");
    assert_eq!(
        r.entries.keys().copied().collect::<Vec<_>>(),
        (0..at).collect::<Vec<_>>()
    );
    append_one(&mut wal, at, 40).expect("a new life writes again");
}

#[test]
fn a_full_disk_fails_the_write_with_a_clear_error_and_every_later_one() {
    for op in [Op::SetLen, Op::Write] {
        let (disk, mut wal) = ten_synced();
        disk.fail_next(op, ENOSPC);
        let mut err = None;
        for i in 10..400 {
            if let Err(e) = append_one(&mut wal, i, 40) {
                err = Some((i, e));
                break;
            }
        }
        let (at, e) = err.expect("the full disk was noticed");
        assert!(e.to_string().contains("No space left on device"), "{e}");
        stays_failed_and_keeps_synced(&disk, wal, at + 1);
    }
}

#[test]
fn a_failed_sync_of_the_directory_after_a_new_segment_fails_the_write() {
    let (disk, mut wal) = ten_synced();
    disk.fail_next(Op::SyncDir, EIO);
    let mut failed = false;
    for i in 10..400 {
        if append_one(&mut wal, i, 40).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "a failed directory sync went unnoticed");
    assert!(append_one(&mut wal, 1000, 5).is_err());
}

#[test]
fn a_new_data_directory_survives_a_power_cut_after_its_first_synced_append() {
    for seed in 0..40 {
        // Nothing of the data directory exists before the first start.
        let disk = disk(false);
        let (mut wal, _) = open(&disk).expect("open");
        append_one(&mut wal, 0, 5).expect("append");
        drop(wal);
        disk.power_cut(seed);
        let (_wal, r) = open(&disk).expect("reopen");
        assert_eq!(
            r.entries.len(),
            1,
            "seed {seed}: the acknowledged entry went with its directory: {:#?}",
            disk.last_cut()
        );
    }
}

#[test]
fn a_failed_directory_sync_after_deleting_a_purged_segment_stops_the_log() {
    let (disk, mut wal) = ten_synced();
    let mut i = 10;
    while wal.files().len() < 4 {
        append_one(&mut wal, i, 40).expect("append");
        i += 1;
    }
    let mut b = Batch::default();
    b.purge(id(1, i - 2)).expect("purge");
    wal.write(b).expect("write");
    wal.sync().expect("sync");
    disk.fail_next(Op::SyncDir, EIO);
    assert!(
        wal.drop_purged(i - 2).is_err(),
        "a failed directory sync went unnoticed"
    );
    assert!(
        append_one(&mut wal, i, 5).is_err(),
        "written after a failed sync"
    );
    drop(wal);
    for seed in 0..20 {
        disk.power_cut(seed);
        let (_wal, r) = open(&disk).expect("opens after the failure and a cut");
        assert_eq!(r.entries.keys().next_back(), Some(&(i - 1)));
    }
}
