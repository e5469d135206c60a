//! The replicated state machine: the lock table, driven by committed log
//! entries, and its snapshots.
//!
//! Applying an entry is `table.apply(cmd, at)` with the leader's stamp,
//! then the [`ApplySink`] call: no clock is read and nothing but the entry
//! decides the outcome, so every node computes the same outputs. Beside the
//! table the machine keeps what openraft needs to resume from it (the last
//! applied log id and membership) and the latest applied cluster time,
//! which a new leader starts its clock from (see `clock`).
//!
//! The machine lives in memory. It is made durable by snapshots (the
//! `snapshot` file, see `snapshot_file`) plus the log after them: on start
//! the table is restored from the snapshot and openraft re-applies the log
//! up to the last committed entry, calling the sink for each of those
//! entries again.

use super::snapshot_file::{Found, SnapshotData, SnapshotFile};
use super::types::{
    Entry, LogId, Member, NodeId, Outputs, SnapshotMeta, Stamped, StoredMembership, TypeConfig,
};
use super::ApplySink;
use crate::engine::alarm::Armed;
use crate::table::{self, LockTable, TableLimits, Time};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, Membership, RaftSnapshotBuilder, StorageError,
    StorageIOError,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{BufReader, Read, Seek};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// The applied state, behind [`MachineHandle::state`].
#[derive(Debug)]
pub(crate) struct Applied {
    /// The lock table.
    pub(crate) table: LockTable,
    /// The last entry applied (or covered by the installed snapshot).
    pub(crate) last_applied: Option<LogId>,
    /// The latest membership applied.
    pub(crate) membership: StoredMembership,
    /// Nodes that were voters and have been removed: their ids are never
    /// given to a node again (a removed node started again with its data
    /// would act as the new one; see `Cluster::add_node`).
    pub(crate) retired: BTreeSet<NodeId>,
    /// The latest command time applied: the table's clock.
    pub(crate) at: Time,
    /// The deadline the timer task sleeps until, to know when a newly
    /// applied entry makes an earlier one (see [`MachineHandle::deadline_moved`]).
    pub(crate) timer_at: Armed,
}

/// What the state machine, the snapshot builder and the cluster handle share.
pub(crate) struct MachineHandle {
    state: Mutex<Applied>,
    sink: ApplySink,
    /// Wakes the timer task when the table's next deadline moved earlier
    /// than the one it sleeps until, or the table was replaced.
    pub(crate) deadline_moved: Notify,
    /// Tells snapshots built from the same state apart.
    snapshot_seq: AtomicU64,
    /// `Applied::at` in microseconds, written with it under the lock: the
    /// leader stamps every proposal from it, and need not wait for the lock
    /// while applying (or a snapshot's freeze) holds it.
    applied_at: AtomicU64,
}

impl MachineHandle {
    /// The latest command time applied, without taking the lock.
    pub(crate) fn applied_at(&self) -> Time {
        Time::from_micros(self.applied_at.load(Ordering::Acquire))
    }

    /// Raises the applied time to `at`; called with the lock held.
    fn advance(&self, st: &mut Applied, at: Time) {
        st.at = st.at.max(at);
        self.applied_at.store(st.at.as_micros(), Ordering::Release);
    }

    /// The applied state. Hold the guard briefly and never across an
    /// `.await`: applying waits for it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Applied> {
        // A panic while holding the lock would be a bug in the table; what
        // it left is still the best information there is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A snapshot's data as it is read back: the table, loaded straight into
/// its own structures, and the cluster time. The data (see [`ImageView`])
/// also names the last applied entry and the membership, which the
/// metadata carries as well and is where they are taken from.
#[derive(Deserialize)]
struct Image {
    table: table::LoadedSnapshot,
    at: Time,
    /// Absent from snapshots of older versions: none known then.
    #[serde(default)]
    retired: BTreeSet<NodeId>,
}

/// openraft's state machine: the table plus its snapshot file.
pub(crate) struct StateMachine {
    shared: Arc<MachineHandle>,
    file: SnapshotFile,
}

/// Why a snapshot could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotError {
    /// Reading or writing the file failed.
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    /// The data does not encode or decode.
    #[error("snapshot data: {0}")]
    Codec(#[from] super::encoding::CodecError),
    /// The table inside is inconsistent.
    #[error(transparent)]
    Table(#[from] table::BadSnapshot),
    /// The blocking task did not finish (the runtime is stopping).
    #[error("snapshot task: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A snapshot's data: the whole applied state, encoded by `encoding`
/// straight from it, so that building a snapshot copies nothing. This is
/// what the `snapshot` file holds after its metadata line and what a
/// lagging peer is sent.
#[derive(Serialize)]
struct ImageView<'a> {
    table: table::SnapshotView<'a>,
    last_applied: Option<LogId>,
    membership: &'a StoredMembership,
    at: Time,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    retired: &'a BTreeSet<NodeId>,
}

/// What a snapshot's data holds besides its metadata, read as it is
/// decoded.
struct Decoded {
    table: LockTable,
    at: Time,
    retired: BTreeSet<NodeId>,
}

/// The table a snapshot's data holds, read as it is decoded.
fn decode(data: impl Read) -> Result<Decoded, SnapshotError> {
    let image: Image = super::encoding::decode_from(BufReader::with_capacity(1 << 20, data))?;
    Ok(Decoded {
        table: LockTable::restore_loaded(image.table)?,
        at: image.at,
        retired: image.retired,
    })
}

/// The voters of `before` that `after` leaves out altogether.
fn removed_voters(before: &StoredMembership, after: &Membership<NodeId, Member>) -> Vec<NodeId> {
    before
        .membership()
        .voter_ids()
        .filter(|id| after.get_node(id).is_none())
        .collect()
}

fn snapshot_io(
    meta: Option<&SnapshotMeta>,
    verb: ErrorVerb,
    e: &SnapshotError,
) -> StorageError<NodeId> {
    StorageIOError::new(
        ErrorSubject::Snapshot(meta.map(SnapshotMeta::signature)),
        verb,
        e,
    )
    .into()
}

/// Runs `work` (encoding and writing a snapshot: long for a large table)
/// on a thread of its own at a low CPU priority, so that on a busy machine
/// it takes the time the node's requests leave over rather than theirs. A
/// thread of its own, as a thread's priority cannot be raised again without
/// privileges, and the runtime's blocking threads are shared.
async fn in_background<T, E>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, StorageError<NodeId>>
where
    T: Send + 'static,
    E: Into<SnapshotError> + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("dlock-snapshot".into())
        .spawn(move || {
            lower_this_threads_priority();
            // The receiver is gone only if the node stopped waiting.
            let _ = done.send(work().map_err(Into::into));
        });
    let outcome = match spawned {
        Ok(_) => result.await.unwrap_or_else(|_| {
            Err(SnapshotError::Io(std::io::Error::other(
                "the snapshot thread ended without an answer",
            )))
        }),
        Err(e) => Err(SnapshotError::Io(e)),
    };
    outcome.map_err(|e| snapshot_io(None, ErrorVerb::Write, &e))
}

/// Nice 10 for the calling thread: on Linux a thread's nice value is its
/// own. Best effort: a thread left at normal priority only writes the
/// snapshot sooner.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        let this = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(this), 10) {
            tracing::debug!(error = %e, "cannot lower the snapshot thread's priority");
        }
    }
}

/// Runs `work` (file I/O, encoding or decoding: blocking, and long for a
/// large table) on a blocking thread; its failure is a storage error about
/// the snapshot `meta` names.
async fn blocking<T, E>(
    meta: Option<&SnapshotMeta>,
    verb: ErrorVerb,
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, StorageError<NodeId>>
where
    T: Send + 'static,
    E: Into<SnapshotError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || work().map_err(Into::into))
        .await
        .map_err(SnapshotError::from)
        .and_then(|r| r)
        .map_err(|e| snapshot_io(meta, verb, &e))
}

impl StateMachine {
    /// The state machine of the data directory `file` belongs to: restored
    /// from its snapshot, or a new table with `limits` and `first_fence`.
    ///
    /// # Errors
    /// The snapshot on disk cannot be read or restored.
    pub(crate) fn open(
        file: SnapshotFile,
        found: Option<Found>,
        limits: TableLimits,
        first_fence: u64,
        sessions: bool,
        sink: ApplySink,
    ) -> Result<StateMachine, SnapshotError> {
        let applied = match found {
            Some(found) => {
                let Decoded { table, at, retired } = decode(found.reader())?;
                Applied {
                    table,
                    last_applied: found.meta.last_log_id,
                    membership: found.meta.last_membership,
                    retired,
                    at,
                    timer_at: Armed::default(),
                }
            }
            None => Applied {
                table: if sessions {
                    LockTable::with_sessions(limits, first_fence)
                } else {
                    LockTable::new(limits, first_fence)
                },
                last_applied: None,
                membership: StoredMembership::default(),
                retired: BTreeSet::new(),
                at: Time::ZERO,
                timer_at: Armed::default(),
            },
        };
        Ok(StateMachine {
            shared: Arc::new(MachineHandle {
                applied_at: AtomicU64::new(applied.at.as_micros()),
                state: Mutex::new(applied),
                sink,
                deadline_moved: Notify::new(),
                snapshot_seq: AtomicU64::new(0),
            }),
            file,
        })
    }

    /// The state shared with the cluster handle.
    pub(crate) fn shared(&self) -> Arc<MachineHandle> {
        self.shared.clone()
    }

    /// Writes the snapshots this node builds at most `bytes_per_second`
    /// (0: unpaced); see [`SnapshotFile::pace_writes`].
    pub(crate) fn pace_snapshot_writes(&mut self, bytes_per_second: u64) {
        self.file.pace_writes(bytes_per_second);
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership), StorageError<NodeId>> {
        let st = self.shared.lock();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outputs>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut outputs = Vec::new();
        for entry in entries {
            // An entry is applied whole under one lock: openraft builds
            // snapshots in a task of their own, and a snapshot must hold
            // all of an entry's commands or none, as its log id says.
            let applied = {
                let mut st = self.shared.lock();
                st.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Membership(m) => {
                        let gone = removed_voters(&st.membership, &m);
                        st.retired.extend(gone);
                        st.membership = StoredMembership::new(Some(entry.log_id), m);
                        Vec::new()
                    }
                    EntryPayload::Normal(Stamped { at, cmds }) => {
                        let applied: Vec<_> = cmds
                            .into_iter()
                            .map(|cmd| {
                                let out = st.table.apply(cmd.clone(), at);
                                (cmd, out)
                            })
                            .collect();
                        self.shared.advance(&mut st, at);
                        let next = st.table.next_deadline();
                        st.timer_at.rearm(next, &self.shared.deadline_moved);
                        applied
                    }
                }
            };
            // The sink runs without the lock, so it may read the table;
            // applying waits for it, which keeps log order.
            let mut outs = Outputs::with_capacity(applied.len());
            for (cmd, out) in applied {
                (self.shared.sink)(&cmd, &out);
                outs.push(out);
            }
            outputs.push(outs);
        }
        Ok(outputs)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        Builder {
            shared: self.shared.clone(),
            file: self.file.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<SnapshotData>, StorageError<NodeId>> {
        // Received into a file rather than memory: a snapshot is as large
        // as the table.
        let file = self.file.clone();
        let received = blocking(None, ErrorVerb::Write, move || file.receiving()).await?;
        Ok(Box::new(SnapshotData::receiving(received)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<NodeId>> {
        let received = snapshot
            .into_file()
            .await
            .map_err(|e| snapshot_io(Some(meta), ErrorVerb::Write, &e.into()))?;
        let file = self.file.clone();
        let owned_meta = meta.clone();
        // Decoding a large table and fsyncing the file are blocking work.
        // The data is decoded (and so checked) before it replaces the file.
        let Decoded { table, at, retired } = blocking(Some(meta), ErrorVerb::Write, move || {
            let mut received = received;
            let decoded = decode(&received)?;
            received.seek(std::io::SeekFrom::Start(0))?;
            let mut writer = file.create(&owned_meta)?;
            std::io::copy(&mut received, writer.data())?;
            writer.commit()?;
            Ok::<_, SnapshotError>(decoded)
        })
        .await?;
        let mut st = self.shared.lock();
        st.table = table;
        // Added to, not replaced: a snapshot of an older leader has none,
        // and the ids only ever grow along one log.
        st.retired.extend(retired);
        st.last_applied = meta.last_log_id;
        st.membership = meta.last_membership.clone();
        self.shared.advance(&mut st, at);
        st.timer_at.set(None);
        drop(st);
        tracing::info!(snapshot = %meta, "installed a snapshot from the leader");
        self.shared.deadline_moved.notify_one();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let file = self.file.clone();
        let found = blocking(None, ErrorVerb::Read, move || {
            file.read()?
                .map(|found| {
                    let meta = found.meta.clone();
                    SnapshotData::new(found).map(|data| (meta, data))
                })
                .transpose()
        })
        .await?;
        Ok(found.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(data),
        }))
    }
}

/// Builds a snapshot of the applied state at the moment it is called.
pub(crate) struct Builder {
    shared: Arc<MachineHandle>,
    file: SnapshotFile,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let started = std::time::Instant::now();
        // The table is frozen under the lock, so the data and the log id it
        // is stamped with agree: that copies a pointer per chunk of the
        // table's large collections and clones its small maps (see
        // `table::FrozenTable`), and applying waits only that long. Here,
        // not on the encoding thread, so the lock is never held by a thread
        // of low priority.
        let (frozen, meta, membership, at, retired, paused) = {
            let st = self.shared.lock();
            let locked = std::time::Instant::now();
            let frozen = st.table.freeze();
            let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
            let id = match st.last_applied {
                Some(l) => format!("{}-{}-{seq}", l.leader_id.term, l.index),
                None => format!("0-0-{seq}"),
            };
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id: id,
            };
            let (membership, at) = (st.membership.clone(), st.at);
            let retired = st.retired.clone();
            (frozen, meta, membership, at, retired, locked.elapsed())
        };
        let file = self.file.clone();
        // Encoded into the file while applying goes on (docs/CLUSTER.md
        // "Snapshots and disk use"); a write meanwhile copies the chunk it
        // lands in, once. openraft purges the log this snapshot covers once
        // this returns: the file must be on disk by then.
        let (meta, data, bytes) = in_background(move || {
            let mut writer = file.create_paced(&meta)?;
            let image = ImageView {
                table: frozen.view(),
                last_applied: meta.last_log_id,
                membership: &membership,
                at,
                retired: &retired,
            };
            super::encoding::encode_to(writer.data(), &image)?;
            // The chunks only it still holds are freed here, off the lock.
            drop(frozen);
            let (found, _) = writer.commit()?;
            let bytes = found.len().unwrap_or(0);
            let meta = found.meta.clone();
            let data = SnapshotData::new(found)?;
            Ok::<_, SnapshotError>((meta, data, bytes))
        })
        .await?;
        crate::ops::metrics::snapshot_built(started.elapsed());
        tracing::info!(
            snapshot = %meta,
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            applying_paused_us = paused.as_micros() as u64,
            "snapshot written"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use std::collections::BTreeMap;

    fn membership(configs: &[&[NodeId]], learners: &[NodeId]) -> Membership<NodeId, Member> {
        let configs: Vec<BTreeSet<NodeId>> = configs
            .iter()
            .map(|c| c.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<NodeId, Member> = configs
            .iter()
            .flatten()
            .chain(learners)
            .map(|&id| (id, Member::default()))
            .collect();
        Membership::new(configs, nodes)
    }

    fn stored(m: Membership<NodeId, Member>) -> StoredMembership {
        StoredMembership::new(Some(LogId::new(CommittedLeaderId::new(1, 1), 1)), m)
    }

    #[test]
    fn only_a_voter_left_out_altogether_is_retired() {
        let three = stored(membership(&[&[1, 2, 3]], &[4]));
        // Into the joint membership: 3 is still on its old side.
        let joint = membership(&[&[1, 2, 3], &[1, 2]], &[4]);
        assert!(removed_voters(&three, &joint).is_empty());
        // Out of it: 3 is gone.
        let two = membership(&[&[1, 2]], &[4]);
        assert_eq!(removed_voters(&stored(joint), &two), vec![3]);
        // A learner removed (an add that did not finish) may come again.
        let no_learner = membership(&[&[1, 2, 3]], &[]);
        assert!(removed_voters(&three, &no_learner).is_empty());
        // A voter made a learner is still a node of the cluster.
        let demoted = membership(&[&[1, 2]], &[3]);
        assert!(removed_voters(&three, &demoted).is_empty());
    }
}
