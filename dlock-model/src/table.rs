//! The replicated state: the server's own lock table
//! (`dlock_server::table::LockTable`), driven by its commands.
//!
//! The checker must hash, compare and clone every state it meets, and the
//! table is none of those cheaply, so a [`Table`] keeps the table's
//! snapshot written down (MessagePack): equal tables give equal snapshots (the
//! table's determinism contract), so equal bytes are equal tables. Each
//! step that touches the table restores it, applies the commands and
//! writes it down again.

use dlock_server::table::{
    Command, LockTable, OwnerId, Reply, ReqId, Snapshot, TableLimits, TicketState,
    Time as TableTime,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The one key the clients contend for.
pub const KEY: &str = "k";

/// The lock table, as its written-down snapshot.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Table {
    encoded: Arc<[u8]>,
    /// `LockTable::next_deadline` of the table written, kept beside it so
    /// the checker can ask when an Advance has work without reading the
    /// table back (it is a function of the bytes: equal tables, equal
    /// deadlines).
    due: Option<TableTime>,
}

impl Table {
    /// A cluster's table (owners are sessions) with `sessions` sessions of
    /// `ttl` opened at time zero, and their ids in order.
    pub fn with_sessions(sessions: usize, ttl: Duration) -> (Table, Vec<OwnerId>) {
        let limits = TableLimits {
            max_waiters: 16,
            max_held_keys: 16,
        };
        let mut table = LockTable::with_sessions(limits, 1);
        let ids = (0..sessions)
            .map(|_| {
                let open = Command::OpenSession {
                    ttl,
                    identity: String::new(),
                };
                match table.apply(open, TableTime::ZERO).reply {
                    Reply::Session { id, .. } => id,
                    other => panic!("a table with sessions answered OpenSession with {other:?}"),
                }
            })
            .collect();
        (Table::write(&table), ids)
    }

    /// The table rebuilt from its snapshot.
    ///
    /// # Panics
    ///
    /// If the bytes do not restore a table: they were written by
    /// [`Table::write`] from a table, so that is a broken invariant of the
    /// table's snapshot, not an input error.
    pub fn read(&self) -> LockTable {
        let snapshot: Snapshot =
            rmp_serde::from_slice(&self.encoded).expect("a written table snapshot reads back");
        LockTable::restore(snapshot).expect("a table's own snapshot restores")
    }

    /// `table` written down.
    ///
    /// # Panics
    ///
    /// If the snapshot cannot be written, which its types rule out.
    pub fn write(table: &LockTable) -> Table {
        let encoded = rmp_serde::to_vec_named(&table.snapshot()).expect("a table snapshot encodes");
        Table {
            encoded: encoded.into(),
            due: table.next_deadline(),
        }
    }

    /// Whether an Advance to `now` has work to do: a lease, a wait limit
    /// or a session's TTL fell due (stale deadline entries included, which
    /// an Advance drops: it always changes the table).
    pub fn due(&self, now: TableTime) -> bool {
        self.due.is_some_and(|t| t <= now)
    }

    /// What the table knows of waiting request `ticket` of `owner`.
    pub fn ticket(&self, owner: OwnerId, ticket: ReqId) -> TicketState {
        self.read().ticket(owner, ticket)
    }

    /// Who holds [`KEY`] at `now`, and under which fence.
    pub fn holder(&self, now: TableTime) -> Option<(OwnerId, u64)> {
        self.read().inspect(KEY, now).holder
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bytes say nothing to a reader; the table's own Debug does.
        write!(f, "{:?}", self.read().inspect(KEY, TableTime::END))
    }
}
