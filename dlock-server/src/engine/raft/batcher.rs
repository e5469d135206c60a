//! Proposals that queue up behind each other go to openraft as one entry.
//!
//! openraft 0.9 appends each client write to the leader's log and waits for
//! that append's fsync before it takes the next write, so N proposals made
//! at once cost N fsyncs one after another on the leader, and each waits
//! for all those before it. Instead, at most [`IN_FLIGHT`] writes are in
//! openraft at a time, and whatever was proposed meanwhile goes into the
//! next one: one entry, one fsync on each node and one replication round
//! for all of them (up to [`MAX_BATCH`] commands or [`MAX_BATCH_BYTES`]).
//! A proposal made while none is in flight goes at once, alone, so a lone
//! client waits for nothing more than before.
//!
//! Every command of an entry is applied in order at the entry's one stamp;
//! each proposer gets its own commands' outputs. A proposal may carry
//! several commands (the keep-alives of many sessions), which always go
//! into one entry together. Order is kept: proposals enter entries in the
//! order they were made, entries are written in that order.

use super::types::Stamped;
use super::{Cluster, ClusterError, COMMIT_TIMEOUT};
use crate::table::{Command, Output};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

/// Entries in openraft, written or waiting to be, at most. One: the next
/// entry goes once the last is committed and applied here, and takes
/// everything proposed meanwhile. Two (one replicated while the next is
/// written to the leader's log) was the first choice, but openraft's core
/// writes the log on the consensus thread (`log/inline.rs`), so a second
/// entry overlapped little and split the same commands into more entries:
/// with one, 32 clients needed a quarter fewer fsyncs per lock cycle, 10 %
/// fewer context switches and 6-7 % less CPU across the three nodes, at the
/// same or a higher rate and latency from 1 to 256 clients (BENCHMARKS.md,
/// "one entry in flight"). The price is on a network with a long round
/// trip: a proposal made while an entry is in flight waits for its commit,
/// not only for its write.
const IN_FLIGHT: usize = 1;
/// Commands in one entry at most, counted in whole proposals: the
/// proposal that reaches it still goes in whole (its commands share an
/// entry by promise), so an entry may pass it by that proposal's size.
const MAX_BATCH: usize = 256;
/// Key and value bytes in one entry at most (a command alone may exceed
/// it): keeps an entry, encoded, far below the peer frame limit.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Proposals queued for the next entry at most; a proposer waits while it
/// is full. Every proposer is a request bounded by its connection's
/// pipeline, or one of the node's own tasks.
pub(super) const QUEUE: usize = 4096;

/// What one proposer gets back: the entry's log index and its commands'
/// outputs, in order.
pub(super) type Answer = Result<(u64, Vec<Output>), ClusterError>;

/// Commands waiting for an entry, to share one.
pub(super) struct Proposal {
    pub(super) cmds: Vec<Command>,
    pub(super) answer: oneshot::Sender<Answer>,
}

impl Proposal {
    fn weight(&self) -> usize {
        self.cmds.iter().map(weight).sum()
    }
}

/// The key and value bytes a command carries, roughly what it adds to an
/// entry.
fn weight(cmd: &Command) -> usize {
    let keys = |keys: &[crate::table::keymap::Key]| keys.iter().map(|k| k.len() + 8).sum::<usize>();
    64 + match cmd {
        Command::Lock { keys: k, value, .. } | Command::Proclaim { keys: k, value, .. } => {
            keys(k) + value.len()
        }
        Command::Unlock { keys: k, .. }
        | Command::Renew { keys: k, .. }
        | Command::Undelivered { keys: k, .. } => keys(k),
        Command::OpenSession { identity, .. } | Command::Resume { identity, .. } => identity.len(),
        _ => 0,
    }
}

/// Takes proposals from `queue` into entries until `stop` is cancelled;
/// proposals still queued then are dropped, and their proposers told the
/// node is stopping.
pub(super) async fn run(
    cluster: Cluster,
    mut queue: mpsc::Receiver<Proposal>,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        // A slot first, then the proposals: what queues while every slot
        // is taken goes into the next entry together.
        let slot = tokio::select! {
            _ = stop.cancelled() => return,
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return,
            },
        };
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            p = queue.recv() => match p {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.weight();
        let mut cmds = first.cmds.len();
        let mut batch = vec![first];
        while cmds < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            match queue.try_recv() {
                Ok(p) => {
                    bytes += p.weight();
                    cmds += p.cmds.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let c = cluster.clone();
        cluster.inner.tasks.spawn(async move {
            c.write(batch).await;
            drop(slot);
        });
    }
}

impl Cluster {
    /// Writes `batch` as one entry and answers each proposer.
    async fn write(&self, batch: Vec<Proposal>) {
        let mut cmds = Vec::new();
        let mut answers = Vec::with_capacity(batch.len());
        for p in batch {
            answers.push((p.cmds.len(), p.answer));
            cmds.extend(p.cmds);
        }
        match self.write_entry(cmds).await {
            Ok((index, outs)) => {
                // One output per command, in order: each proposer takes as
                // many as it proposed. One left short (it cannot happen) is
                // told its outcome is unknown when its sender drops.
                let mut outs = outs.into_iter();
                for (n, answer) in answers {
                    let mine: Vec<Output> = outs.by_ref().take(n).collect();
                    if mine.len() == n {
                        // Its proposer may have given up waiting.
                        let _ = answer.send(Ok((index, mine)));
                    }
                }
            }
            Err(e) => {
                for (_, answer) in answers {
                    let _ = answer.send(Err(e.clone()));
                }
            }
        }
    }

    /// Stamps `cmds` with the leader's cluster time, replicates them as one
    /// entry and waits until it is applied here.
    async fn write_entry(&self, cmds: Vec<Command>) -> Result<(u64, Vec<Output>), ClusterError> {
        let term = self.leading_term()?;
        let applied = self.inner.machine.applied_at();
        let at = self.inner.clock.now(term, applied);
        let write = self.inner.raft.client_write(Stamped { at, cmds });
        match self.bounded(COMMIT_TIMEOUT, write).await? {
            Ok(response) => Ok((response.log_id.index, response.data)),
            Err(e) => Err(self.write_error(e)),
        }
    }
}
