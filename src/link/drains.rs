//! What a client's links leave running once nobody holds them: the end of
//! a link whose last handle went (its half-close and, with a Lock, an
//! Enqueue or a Wait unanswered, the reading on for a grant that crossed
//! it, in `write_loop`), and the release of such a grant on a link opened
//! for it (`release.rs`); and the Unlock of a lease whose guard was
//! dropped, until it is answered or, its link ended first, sent again on a
//! link opened for it. They are tasks of the runtime and die with it, so a
//! program that exits right after giving up a wait would lose a lease
//! granted as it gave up; [`Drains::finished`] is what `Client::close`
//! waits for instead.

use super::DRAIN_LIMIT;
use std::future::Future;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

/// The drains and late releases of one client's links, counted until they
/// end. Shared by every link of the client (the owner pool makes it) and
/// cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct Drains {
    tasks: TaskTracker,
}

impl Drains {
    /// Counts as one task until dropped: a link whose last handle went,
    /// until its driver ends. Taken where the handle is dropped, not where
    /// the writer notices, so a `close` right after the drop already
    /// waits for it.
    pub(super) fn token(&self) -> TaskTrackerToken {
        self.tasks.token()
    }

    /// Spawns `task`, counted until it ends.
    pub(super) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Waits until every drain and late release counted so far has ended,
    /// and those they started, or until [`DRAIN_LIMIT`] has passed (what a
    /// drain and its release may take together, as the Python, Go and
    /// TypeScript clients bound their close). Whether they all ended.
    pub(crate) async fn finished(&self) -> bool {
        // A closed tracker still counts what is spawned on it later; it
        // only lets `wait` end once the count is zero.
        self.tasks.close();
        tokio::time::timeout(DRAIN_LIMIT, self.tasks.wait())
            .await
            .is_ok()
    }
}
