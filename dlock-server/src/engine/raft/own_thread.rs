//! openraft, the peer port and the batcher on a runtime of one thread of
//! their own, apart from the client connections.
//!
//! A commit hands an entry from task to task: the batcher, openraft's core,
//! the replication tasks, the peer connections, the state-machine task. On a
//! multi-thread runtime each of those hand-offs may wake an idle worker to
//! take the task just scheduled, a context switch each; on a follower nearly
//! every one of them does (issue 44, BENCHMARKS.md "Cluster: CPU per lock
//! cycle beside etcd"). On one thread they are polled one after the other
//! without a wake between threads. The client connections stay on the
//! server's runtime, where more threads may serve them: the only hand-offs
//! between the two are a proposal into the batcher and its answer back.
//!
//! On a server started with `--threads 1` (a current-thread runtime already)
//! nothing moves: one thread per node is what that flag asks for.

use std::future::Future;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio_util::sync::CancellationToken;

/// Where the node's consensus tasks run: a thread of their own, which ends
/// when `ends` is cancelled, or the caller's runtime.
pub(super) struct Place {
    handle: Option<Handle>,
    ends: CancellationToken,
}

impl Place {
    /// A thread of its own for node `node` when the caller runs on a
    /// multi-thread runtime, else the caller's runtime. The thread, if any,
    /// runs until `ends` is cancelled, then drops whatever is still on it.
    ///
    /// # Errors
    /// The runtime or its thread cannot be created.
    pub(super) fn for_node(node: u64, ends: CancellationToken) -> std::io::Result<Place> {
        if Handle::current().runtime_flavor() != RuntimeFlavor::MultiThread {
            return Ok(Place { handle: None, ends });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let until = ends.clone();
        std::thread::Builder::new()
            .name(format!("dlock-raft-{node}"))
            .spawn(move || runtime.block_on(until.cancelled()))?;
        Ok(Place {
            handle: Some(handle),
            ends,
        })
    }

    /// Whether the tasks get a thread of their own, which nothing else
    /// runs on: there openraft's core may block on the log's fsync
    /// (`log/inline.rs`) without stalling a client connection.
    pub(super) fn is_own_thread(&self) -> bool {
        self.handle.is_some()
    }

    /// Runs `start` there and returns what it returned. If it fails (or
    /// panics), the thread ends: nothing started on it is left running.
    pub(super) async fn run<T, F>(&self, start: F) -> anyhow::Result<T>
    where
        F: Future<Output = anyhow::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let outcome = match &self.handle {
            None => start.await,
            Some(h) => match h.spawn(start).await {
                Ok(r) => r,
                Err(e) => Err(anyhow::anyhow!("starting the consensus engine: {e}")),
            },
        };
        if outcome.is_err() {
            self.ends.cancel();
        }
        outcome
    }
}
