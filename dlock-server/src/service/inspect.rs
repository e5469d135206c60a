//! Inspect and Watch: reading the table, now or at its next change.
//!
//! Both read applied state, after a read index on a cluster, so a deposed
//! leader does not answer from a state it no longer follows. A Watch is a
//! long poll on one key, answered as soon as the key's first holder (token
//! and value) differs from what the caller says it knows, or when its wait
//! limit runs out. A parked Watch is a task that looks again whenever the
//! registry's hub says the table changed; it is this node's alone (after a
//! failover the client sends it again).
//!
//! Bounds: a connection answers in request order, so it has at most one
//! Watch parked at a time; a server has at most `--max-watchers` (a
//! semaphore, `validate::WatchPermits`); a Watch waits at most
//! `validate::MAX_WATCH_WAIT`. A Watch whose connection ends is withdrawn:
//! its task sees the answer's receiver dropped and ends, giving back its
//! permit.

use super::reply::{self, Refusal};
use super::validate::{busiest_wanted, validate_keys, watch_args};
use super::{Answer, Conn, Service};
use crate::table::{FirstHolder, LockTable, OwnerId, Time};
use dlock_proto::proto::{KeyInfo, Request, ResponseStatus};
use prost::Message;
use std::sync::Arc;

impl Service {
    /// The session a read acts for, to say which holds are the caller's:
    /// the named one, or the connection's implicit one if it has one.
    fn reader(&self, conn: &Conn, session: u64) -> Result<Option<OwnerId>, Refusal> {
        match session {
            0 => Ok(conn.state().implicit),
            s => self.named(conn, s).map(Some),
        }
    }

    /// `key` as `caller` sees it in `table` at `now`, its holders listed
    /// within `budget` bytes of the answer, which it then takes its size
    /// from: an answer naming a key with thousands of holders (or naming it
    /// many times) is bounded while it is built, not only once built.
    fn key_info(
        &self,
        table: &LockTable,
        now: Time,
        key: &str,
        caller: Option<OwnerId>,
        budget: &mut usize,
    ) -> KeyInfo {
        // Which connection a session came from is this node's knowledge
        // only: a session attached elsewhere shows no address.
        let addr = |o| {
            self.outcomes
                .peer_of(o)
                .map(|a| a.to_string())
                .unwrap_or_default()
        };
        let view = table.inspect_within(key, now, *budget, caller);
        let info = reply::key_info(key, view, caller, addr);
        *budget = budget.saturating_sub(info.encoded_len());
        info
    }

    /// Inspect: the named keys, or without keys the server-wide counts.
    pub(super) async fn inspect(&self, conn: &Conn, req: Request) -> Result<Answer, Refusal> {
        let body = req.lock.unwrap_or_default();
        let caller = self.reader(conn, req.session)?;
        let busiest = match body.keys.is_empty() {
            true => busiest_wanted(&body)?,
            false => {
                validate_keys(&self.config, &body.keys)?;
                0
            }
        };
        self.engine.read_index().await?;
        let mut r = reply::response(req.id, ResponseStatus::Ok);
        if body.keys.is_empty() {
            let mut stats = self.stats();
            stats.busiest = self.busiest(busiest, caller);
            r.server_stats = Some(Box::new(stats));
        } else {
            let mut budget = dlock_proto::MAX_RESPONSE_FRAME;
            r.key_info = self.engine.read(|table, now| {
                body.keys
                    .iter()
                    .map(|k| self.key_info(table, now, k, caller, &mut budget))
                    .collect()
            });
        }
        Ok(Answer::Now(reply::within_frame(r)?))
    }

    /// The `n` busiest keys as `caller` sees them. The table is walked a
    /// slice at a time, letting go of it between slices (see
    /// `table::busiest`), and the winners are read again together.
    fn busiest(&self, n: usize, caller: Option<OwnerId>) -> Vec<KeyInfo> {
        // About a hundred microseconds of holding the table per slice.
        const SLICE: usize = 4096;
        if n == 0 {
            return Vec::new();
        }
        let mut top = Vec::with_capacity(n + SLICE);
        let mut from = Some(0);
        while let Some(slot) = from {
            from = self
                .engine
                .read(|table, now| table.rank_busy(now, slot, SLICE, n, &mut top));
        }
        // A key freed since its slice was walked is left out.
        let mut budget = dlock_proto::MAX_RESPONSE_FRAME;
        self.engine.read(|table, now| {
            top.iter()
                .map(|b| self.key_info(table, now, &b.key, caller, &mut budget))
                .filter(|i| i.fence != 0 || i.waiters > 0)
                .collect()
        })
    }

    /// Watch: a task that answers from the applied table, now if the key's
    /// first holder is not the one the caller knows, else after the change
    /// that makes it so, or at its wait limit.
    pub(super) fn watch(self: &Arc<Self>, conn: &Conn, req: Request) -> Result<Answer, Refusal> {
        let id = req.id;
        let caller = self.reader(conn, req.session)?;
        let args = watch_args(&self.config, req.lock.unwrap_or_default())?;
        // A parked Watch is a task; the fuzz harness drives requests without
        // a runtime, and there it is refused rather than answered wrongly.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(reply::watch_without_runtime());
        }
        let permit = self.watches.take()?;
        let svc = self.clone();
        Ok(Answer::Task(Box::pin(async move {
            let _permit = permit;
            match svc.watched(&args, caller).await {
                Ok(info) => {
                    let mut r = reply::response(id, ResponseStatus::Ok);
                    r.key_info = vec![info];
                    reply::within_frame(r).unwrap_or_else(|refusal| reply::refused(id, refusal))
                }
                Err(refusal) => reply::refused(id, refusal),
            }
        })))
    }

    async fn watched(
        &self,
        args: &super::validate::WatchArgs,
        caller: Option<OwnerId>,
    ) -> Result<KeyInfo, Refusal> {
        self.engine.read_index().await?;
        let key = &args.key;
        let look = || {
            self.engine.read(|table, now| {
                let first = table.first_holder(key);
                (!FirstHolder::is_known(first.as_ref(), args.fence, &args.value))
                    .then(|| self.key_info(table, now, key, caller, &mut full_frame()))
            })
        };
        let found = tokio::select! {
            found = self.outcomes.hub().wait_for(args.deadline, look) => found,
            refusal = self.deposed(), if self.engine.cluster().is_some() => return Err(refusal),
        };
        match found {
            Some(info) => Ok(info),
            None => {
                // The limit ran out: the key as it is now (on a cluster,
                // confirmed by a quorum).
                self.engine.read_index().await?;
                Ok(self
                    .engine
                    .read(|table, now| self.key_info(table, now, key, caller, &mut full_frame())))
            }
        }
    }
}

/// The budget of a whole answer: the largest frame a client accepts.
fn full_frame() -> usize {
    dlock_proto::MAX_RESPONSE_FRAME
}
