//! A request whose answer comes later: a Lock waiting in the local table,
//! or (on a cluster node) any request whose command is being replicated.
//!
//! A connection has at most one at a time (answers go out in request
//! order, so nothing behind it can be answered first) and polls it beside
//! its socket.

use crate::table::Woken;
use dlock_proto::proto::Response;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

/// Where a pending request's answer arrives.
#[derive(Debug)]
pub enum Pending {
    /// A Lock waiting in this server's table: its outcome.
    Table(oneshot::Receiver<Woken>),
    /// A request a task answers (a cluster node's): the whole response.
    Answer(oneshot::Receiver<Response>),
}

/// What arrived for a pending request.
#[derive(Debug)]
pub enum Arrived {
    /// A waiting Lock's outcome.
    Woken(Woken),
    /// A complete response.
    Response(Response),
}

/// The answer's sender went away without sending: the server is stopping
/// (the table dropped its waiters) or the task answering it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped;

impl Pending {
    /// Polls for the answer.
    pub fn poll_arrived(&mut self, cx: &mut Context<'_>) -> Poll<Result<Arrived, Dropped>> {
        match self {
            Pending::Table(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.map(Arrived::Woken).map_err(|_| Dropped)),
            Pending::Answer(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.map(Arrived::Response).map_err(|_| Dropped)),
        }
    }

    /// The answer if it has arrived; `Err(Dropped)` if it never will;
    /// `Ok(None)` if it may still come.
    pub fn try_take(&mut self) -> Result<Option<Arrived>, Dropped> {
        use oneshot::error::TryRecvError;
        let taken = match self {
            Pending::Table(rx) => rx.try_recv().map(Arrived::Woken),
            Pending::Answer(rx) => rx.try_recv().map(Arrived::Response),
        };
        match taken {
            Ok(a) => Ok(Some(a)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Closed) => Err(Dropped),
        }
    }

    /// Refuses any later answer: one sent after this is never received.
    pub fn close(&mut self) {
        match self {
            Pending::Table(rx) => rx.close(),
            Pending::Answer(rx) => rx.close(),
        }
    }
}
