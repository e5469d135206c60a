//! openraft's own storage test suite, run against the log store and
//! the table state machine, with the log written by either writer.

use super::log::{LogStore, WrittenBy};
use super::machine::StateMachine;
use super::snapshot_file::SnapshotFile;
use super::types::{NodeId, TypeConfig};
use super::ApplySink;
use crate::table::{Command, Output, TableLimits};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use std::sync::Arc;
use tempfile::TempDir;

/// A log store, written by its `WrittenBy`, and a state machine in a
/// fresh data directory each time.
struct Fresh(WrittenBy);

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Fresh {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(dir.path(), self.0).expect("log store");
        let (file, found) = SnapshotFile::open(dir.path()).expect("snapshot file");
        let limits = TableLimits {
            max_waiters: 10,
            max_held_keys: 10,
        };
        let sink: ApplySink = Arc::new(|_: &Command, _: &Output| {});
        let sm = StateMachine::open(file, found, limits, 1, false, sink).expect("state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn log_store_and_state_machine_pass_openraft_s_storage_suite() {
    Suite::test_all(Fresh(WrittenBy::WriterThread)).expect("the suite passes");
}

#[test]
fn the_log_written_on_the_caller_passes_openraft_s_storage_suite() {
    Suite::test_all(Fresh(WrittenBy::Caller)).expect("the suite passes");
}
