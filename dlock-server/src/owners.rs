//! The owners one connection acts for: its own, which every older client
//! uses without knowing it, and the sessions it opened with OpenSession.
//!
//! Each owner holds and waits apart from the others, exactly as another
//! connection would: two tasks of one process that use two sessions contend
//! FIFO and release only what they hold. On a single server a session ends
//! with its connection, so every owner here goes when the value is dropped,
//! however the connection task ends (error paths and panics included).

use crate::db::Db;
use crate::table::OwnerId;
use std::net::SocketAddr;

/// The owners of one connection; dropping it ends all of them.
#[derive(Debug)]
pub struct Owners {
    db: Db,
    peer: SocketAddr,
    own: OwnerId,
    /// Sessions opened on the connection, oldest first; at most `max`.
    sessions: Vec<OwnerId>,
    max: usize,
}

/// OpenSession over `--max-sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManySessions;

impl Owners {
    /// Registers a new connection from `peer` that may open up to
    /// `max_sessions` sessions.
    pub fn connect(db: &Db, peer: SocketAddr, max_sessions: usize) -> Owners {
        Owners {
            own: db.connect(peer),
            db: db.clone(),
            peer,
            sessions: Vec::new(),
            max: max_sessions,
        }
    }

    /// The connection's own owner.
    pub fn own(&self) -> OwnerId {
        self.own
    }

    /// The owner a request acts for: `session` 0 is the connection's own;
    /// any other must be a session opened on this connection.
    pub fn resolve(&self, session: u64) -> Option<OwnerId> {
        if session == 0 {
            return Some(self.own);
        }
        // A linear search: sessions per connection are few (--max-sessions),
        // and most requests name none.
        self.sessions.contains(&session).then_some(session)
    }

    /// Opens a session.
    ///
    /// # Errors
    /// The connection already has `--max-sessions` open.
    pub fn open(&mut self) -> Result<OwnerId, TooManySessions> {
        if self.sessions.len() >= self.max {
            return Err(TooManySessions);
        }
        let id = self.db.open_session(self.peer);
        self.sessions.push(id);
        Ok(id)
    }

    /// Ends `session` at once, as its connection's end would; false when it
    /// is not a session of this connection.
    pub fn close(&mut self, session: OwnerId) -> bool {
        let Some(i) = self.sessions.iter().position(|&s| s == session) else {
            return false;
        };
        self.sessions.swap_remove(i);
        self.db.close_session(session);
        true
    }
}

impl Drop for Owners {
    fn drop(&mut self) {
        for &s in &self.sessions {
            self.db.close_session(s);
        }
        self.db.disconnect(self.own);
    }
}
