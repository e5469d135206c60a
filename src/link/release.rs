//! A grant that reached nobody, released: the caller of a Lock (an
//! Enqueue, a Wait) stopped waiting, or every handle on the link went while
//! it closed; or a lease whose guard was dropped, and whose Unlock its link
//! could not deliver. A lock without a lease would end with the connection,
//! but a lease outlives it and would keep the key from everyone until it
//! ran out, so it is released by fence: on the link while it lives, else on
//! a link opened for the Unlock.

use super::{Call, Drains, Link, Pending, DRAIN_LIMIT};
use crate::dial::Dial;
use crate::liveness::Watches;
use crate::proto::{Request, RequestLock, RequestType, Response, ResponseStatus};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

impl Link {
    /// Sends, as request `id`, the Unlock of `keys` held under `fence` by a
    /// lock that may be a lease, without waiting for its answer: a guard
    /// being dropped. If the link has ended, or ends before the answer
    /// comes (on a cluster, its session ended), the Unlock may never have
    /// been applied, so it is sent again by fence on a link opened for it,
    /// as a grant that reached nobody is released. That runs in a task of
    /// the current runtime counted among the client's drains, so
    /// `Client::close` waits for it; the task keeps this link open until
    /// the answer, or a clean close of its last handle would cut the
    /// answer off and cost a needless second Unlock.
    pub(crate) fn release_detached(&self, id: u64, keys: Vec<String>, fence: u64) {
        if tokio::runtime::Handle::try_current().is_err() {
            // Dropped outside any runtime (a plain thread, or after the
            // runtime ended): no task can be started here to wait for the
            // answer or to open a link, and the runtime the link runs on
            // (if it still runs) cannot be reached from here. Only the
            // Unlock on this link is tried; a lease it misses runs out.
            let _ = self.calls.try_send(Call {
                req: unlock_by_fence(id, keys, fence),
                reply: None,
                slot: None,
                release: None,
            });
            return;
        }
        let (reply, answer) = oneshot::channel();
        let call = Call {
            req: unlock_by_fence(id, keys.clone(), fence),
            reply: Some(reply),
            slot: None,
            release: None,
        };
        // Queued before the caller hands the connection on: a later Lock
        // on it finds the keys released. A link that has ended drops the
        // call, and with it the reply: straight to the release.
        let unsent = match self.calls.try_send(call) {
            Err(mpsc::error::TrySendError::Full(call)) => Some(call),
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => None,
        };
        let calls = self.calls.clone();
        let (dial, watches, drains) =
            (self.dial.clone(), self.watches.clone(), self.drains.clone());
        self.drains.spawn(async move {
            let answered = async {
                if let Some(call) = unsent {
                    calls.send(call).await.ok()?;
                }
                answer.await.ok()
            };
            // Any answer means the server had the Unlock (`NotHeld`: the
            // lease had run out). None within the limit (a frozen path) is
            // taken as lost: released again by fence, the worst is a
            // second answer `NotHeld`.
            let answered = tokio::time::timeout(DRAIN_LIMIT, answered).await;
            drop(calls);
            if let Ok(Some(Ok(_))) = answered {
                return;
            }
            release_late(dial, watches, drains, keys, fence).await;
        });
    }
}

/// Where a grant that reached nobody is released.
pub(super) struct Releaser {
    /// The link's own queue, while a handle on it lives.
    pub(super) calls: mpsc::WeakSender<Call>,
    /// Otherwise a link opened for the Unlock, as the link itself was.
    pub(super) dial: Arc<Dial>,
    pub(super) watches: Arc<Watches>,
    /// Counts that link's Unlock among the client's drains, so
    /// `Client::close` waits for it.
    pub(super) drains: Drains,
}

/// Hands a response to its caller. A Lock granted to a caller that stopped
/// waiting is released at once, so a cancelled `lock` leaks nothing: on
/// this link while it lives, else (it is closing: its caller, and every
/// other handle, went) by fence on a link opened for it, since a lease
/// outlives the connection it was granted on.
pub(super) fn deliver(p: Pending, resp: Response, releaser: &Releaser) {
    let granted_fence = (resp.status == ResponseStatus::Ok as i32).then_some(resp.fence);
    let undelivered = match p.reply {
        Some(reply) => reply.send(Ok(resp)).is_err(),
        None => false,
    };
    let (Some(keys), Some(fence), true) = (p.lock_keys, granted_fence, undelivered) else {
        return;
    };
    let Some(calls) = releaser.calls.upgrade() else {
        releaser.drains.spawn(release_late(
            releaser.dial.clone(),
            releaser.watches.clone(),
            releaser.drains.clone(),
            keys,
            fence,
        ));
        return;
    };
    let call = Call {
        // Nobody reads the answer; reusing the grant's id keeps ids unique
        // among requests in flight.
        req: unlock_by_fence(p.id, keys, fence),
        reply: None,
        slot: None,
        release: None,
    };
    if let Err(mpsc::error::TrySendError::Full(call)) = calls.try_send(call) {
        tokio::spawn(async move {
            let _ = calls.send(call).await;
        });
    }
}

/// Releases `keys` granted under `fence` to a link that was closing, on a
/// link opened for the Unlock (on a cluster, with a session of its own,
/// ended again when it closes), within [`DRAIN_LIMIT`]. Best effort: when
/// it fails, the lease runs out on its own.
async fn release_late(
    dial: Arc<Dial>,
    watches: Arc<Watches>,
    drains: Drains,
    keys: Vec<String>,
    fence: u64,
) {
    let unlock = async {
        let link = Link::open(dial, watches, drains).await.ok()?;
        let (reply, answer) = oneshot::channel();
        let call = Call {
            req: unlock_by_fence(1, keys, fence),
            reply: Some(reply),
            slot: None,
            release: None,
        };
        link.calls.send(call).await.ok()?;
        // Whatever the answer: NotHeld means the lease ended meanwhile.
        answer.await.ok().map(drop)
    };
    let _ = tokio::time::timeout(DRAIN_LIMIT, unlock).await;
}

/// An Unlock of `keys` by `fence`, whichever connection holds them.
fn unlock_by_fence(id: u64, keys: Vec<String>, fence: u64) -> Request {
    Request {
        version: crate::PROTOCOL_VERSION,
        id,
        r#type: RequestType::Unlock as i32,
        lock: Some(RequestLock {
            keys,
            fence,
            ..RequestLock::default()
        }),
        ..Request::default()
    }
}
