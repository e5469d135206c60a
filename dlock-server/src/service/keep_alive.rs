//! Keep-alives of many connections' sessions, one commit for all of them.
//!
//! On the raft engine every connection with sessions keeps them alive a
//! third of their TTL apart (`Service::keep_connection_alive`). Made one by
//! one, that is a commit per session per third of a TTL: 3,000 commits a
//! second for 10,000 idle clients with the default TTL, each paying a
//! replication round and an fsync on a majority. Instead the connections
//! hand their sessions to one gatherer, which proposes one turn at a time:
//! every request that queued while the previous turn's commit was on its
//! way goes into the next commit together. A lone keep-alive waits for
//! nothing (a Ping on a session is answered after one), and the busier the
//! node, the more sessions share each commit.

use crate::engine::{Engine, EngineError};
use crate::table::{Command, Output, OwnerId};
use std::sync::OnceLock;
use tokio::sync::{mpsc, oneshot};

/// Most sessions kept alive by one commit (past it, the next request of
/// the turn is the last); more wait for the next. As many as the raft
/// batcher puts in one entry, so a turn stays one ordinary entry.
const MAX_SESSIONS: usize = 256;

/// Requests queued for the gatherer at most; a connection's keeper waits
/// while it is full. Every keeper has one request out at a time.
const QUEUE: usize = 4096;

/// What the gatherer answers: one output per session, in order.
type Answer = Result<Vec<Output>, EngineError>;

/// One connection's sessions, waiting for a commit.
struct Ask {
    owners: Vec<OwnerId>,
    answer: oneshot::Sender<Answer>,
}

/// The way to the gatherer, started on first use (only a cluster node's
/// connections ever use it). It ends when this is dropped.
#[derive(Default)]
pub(super) struct KeepAlives {
    asks: OnceLock<mpsc::Sender<Ask>>,
}

impl KeepAlives {
    /// Keeps `owners` alive through `engine`, in one commit with whatever
    /// other connections asked for meanwhile: each session's output
    /// (`UnknownSession` for one that ended), in order.
    pub(super) async fn keep(&self, engine: &Engine, owners: Vec<OwnerId>) -> Answer {
        let asks = self.asks.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(gather(engine.clone(), rx));
            tx
        });
        let stopped = || EngineError::Unavailable("the keep-alive task has stopped".into());
        let (answer, answered) = oneshot::channel();
        asks.send(Ask { owners, answer })
            .await
            .map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// Takes requests in turns: the first of a turn and every one queued
/// behind it (up to [`MAX_SESSIONS`] sessions), all in one commit.
async fn gather(engine: Engine, mut asks: mpsc::Receiver<Ask>) {
    while let Some(first) = asks.recv().await {
        let mut sessions = first.owners.len();
        let mut turn = vec![first];
        while sessions < MAX_SESSIONS {
            match asks.try_recv() {
                Ok(a) => {
                    sessions += a.owners.len();
                    turn.push(a);
                }
                Err(_) => break,
            }
        }
        let cmds = turn
            .iter()
            .flat_map(|a| a.owners.iter().map(|&owner| Command::KeepAlive { owner }))
            .collect();
        match engine.submit_all(cmds).await {
            Ok(outs) => {
                let mut outs = outs.into_iter();
                for a in turn {
                    let mine: Vec<Output> = outs.by_ref().take(a.owners.len()).collect();
                    // The keeper may have gone with its connection.
                    let _ = a.answer.send(Ok(mine));
                }
            }
            Err(e) => {
                for a in turn {
                    let _ = a.answer.send(Err(e.clone()));
                }
            }
        }
    }
}
