//! The snapshot file on a simulated disk (`storage_sim`): after a power
//! cut the file is a snapshot that was written whole, never older than the
//! last one whose commit returned, and a cut or an error while one is
//! written leaves the one before it in place.

use super::*;
use crate::engine::raft::storage_sim::{Op, SimDisk, EIO};

fn dir() -> PathBuf {
    PathBuf::from("/node")
}

fn disk(lying: bool) -> SimDisk {
    let disk = if lying {
        SimDisk::lying()
    } else {
        SimDisk::new()
    };
    Storage::Sim(disk.clone())
        .create_dir_all(&dir())
        .expect("the data directory");
    disk.settle();
    disk
}

fn meta(index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
        last_membership: Default::default(),
        snapshot_id: format!("1-{index}-0"),
    }
}

/// Snapshot `index`'s data: a few sectors, different for each index.
fn data(index: u64) -> Vec<u8> {
    (0..3000u64).map(|i| (i * 7 + index) as u8).collect()
}

fn write(file: &SnapshotFile, index: u64) -> io::Result<bool> {
    let mut w = file.create(&meta(index))?;
    w.data().write_all(&data(index))?;
    w.commit().map(|(_, kept)| kept)
}

/// The snapshot on `disk` after a cut: its index, checked whole.
fn found(disk: &SimDisk) -> Result<Option<u64>, String> {
    let (_, found) = SnapshotFile::open_on(Storage::Sim(disk.clone()), &dir())
        .map_err(|e| format!("the snapshot does not open: {e}"))?;
    let Some(found) = found else {
        return Ok(None);
    };
    let index = found.meta.last_log_id.map_or(0, |l| l.index);
    let mut got = Vec::new();
    found
        .reader()
        .read_to_end(&mut got)
        .map_err(|e| e.to_string())?;
    if got != data(index) {
        return Err(format!("snapshot {index} is not whole"));
    }
    Ok(Some(index))
}

/// One seeded round: snapshots written one after another, the machine
/// dying at a random operation, then a cut.
fn round(disk: &SimDisk, seed: u64) -> Result<(), String> {
    let mut acked = None;
    let mut written = 0;
    let (file, _) =
        SnapshotFile::open_on(Storage::Sim(disk.clone()), &dir()).map_err(|e| e.to_string())?;
    disk.die_after(seed % 40);
    for index in 1..10 {
        written = index;
        match write(&file, index) {
            Ok(_) => acked = Some(index),
            Err(_) if disk.died() => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    drop(file);
    disk.power_cut(seed);
    let got = found(disk)?;
    if got < acked || got > Some(written) {
        return Err(format!(
            "found snapshot {got:?}, the last committed was {acked:?}\n{:#?}",
            disk.last_cut()
        ));
    }
    Ok(())
}

#[test]
fn after_a_power_cut_the_snapshot_is_whole_and_never_older_than_the_last_committed() {
    for seed in 0..200 {
        if let Err(why) = round(&disk(false), seed) {
            panic!("seed {seed}: {why}");
        }
    }
}

#[test]
fn on_a_disk_whose_syncs_do_nothing_the_rounds_lose_committed_snapshots() {
    // The negative control: the check above can fail.
    let failed = (0..50)
        .filter(|seed| round(&disk(true), *seed).is_err())
        .count();
    assert!(
        failed > 10,
        "only {failed} of 50 rounds failed on a lying disk"
    );
}

#[test]
fn a_failed_sync_or_rename_leaves_the_previous_snapshot_in_place() {
    for op in [Op::Sync, Op::Rename, Op::Write] {
        let disk = disk(false);
        let (file, _) = SnapshotFile::open_on(Storage::Sim(disk.clone()), &dir()).expect("open");
        write(&file, 1).expect("the first snapshot");
        disk.fail_next(op, EIO);
        assert!(
            write(&file, 2).is_err(),
            "{op:?}: a failed snapshot was committed"
        );
        // Nothing left behind but the snapshot.
        let names = Storage::Sim(disk.clone()).list(&dir()).expect("list");
        assert_eq!(names, [NAME], "{op:?}");
        drop(file);
        disk.power_cut(7);
        assert_eq!(found(&disk), Ok(Some(1)), "{op:?}");
    }
}

#[test]
fn a_failed_sync_of_the_directory_after_the_rename_is_an_error() {
    let disk = disk(false);
    let (file, _) = SnapshotFile::open_on(Storage::Sim(disk.clone()), &dir()).expect("open");
    write(&file, 1).expect("the first snapshot");
    disk.fail_next(Op::SyncDir, EIO);
    assert!(write(&file, 2).is_err(), "the rename was reported durable");
}
