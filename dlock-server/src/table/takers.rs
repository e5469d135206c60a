//! Which access-control identity took each grant that may still be held.
//!
//! With access control, Unlock, Renew and Proclaim by fencing token belong to
//! the identity that took the lock (and to admins). On one server that
//! record is the server's own; in a cluster it must survive a change of
//! leader, so it is part of the replicated table: a grant to a session that
//! an identity opened notes `fence → identity`. Sessions opened without
//! access control have no identity and note nothing, so a table without
//! access control pays nothing.
//!
//! The record is swept when it has doubled since the last sweep, keeping
//! the grants whose keys still hold their fence: a cost spread over the
//! grants noted since, and the same on every replica (the sweep depends on
//! the table's state alone).

use super::{Key, LockTable, OwnerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Below this many records no sweep runs.
const MIN_SWEEP: usize = 1024;

/// The record: fence → who took it and which keys.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Takers {
    by_fence: BTreeMap<u64, Taken>,
    /// Size at which the next note sweeps.
    sweep_at: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Taken {
    identity: String,
    keys: Vec<Key>,
}

impl Takers {
    /// Whether nothing is recorded (left out of snapshots then).
    pub(super) fn is_empty(&self) -> bool {
        self.by_fence.is_empty() && self.sweep_at == 0
    }
}

impl LockTable {
    /// Notes who took `keys` under `fence`, if `owner` is a session that an
    /// identity opened.
    pub(super) fn note_taker(&mut self, owner: OwnerId, fence: u64, keys: &[Key]) {
        let Some(identity) = self.sessions.identity(owner).filter(|i| !i.is_empty()) else {
            return;
        };
        let taken = Taken {
            identity: identity.to_owned(),
            keys: keys.to_vec(),
        };
        self.takers.by_fence.insert(fence, taken);
        if self.takers.by_fence.len() >= self.takers.sweep_at.max(MIN_SWEEP) {
            let mut by_fence = std::mem::take(&mut self.takers.by_fence);
            by_fence.retain(|&fence, t| t.keys.iter().any(|k| self.holds_fence(k, fence)));
            self.takers.sweep_at = 2 * by_fence.len();
            self.takers.by_fence = by_fence;
        }
    }

    /// Whether `key` has a holder under `fence`.
    fn holds_fence(&self, key: &Key, fence: u64) -> bool {
        self.keys
            .get(key)
            .is_some_and(|s| s.holds.iter().any(|h| h.fence == fence))
    }

    /// The identity that took the lock under `fence`, if one did and may
    /// still hold it.
    pub fn taker(&self, fence: u64) -> Option<&str> {
        self.takers
            .by_fence
            .get(&fence)
            .map(|t| t.identity.as_str())
    }

    /// Whether one of `keys` is held under `fence` by an owner other than
    /// `owner`: an Unlock, Renew or Proclaim by that fence would act on
    /// someone else's lock.
    pub fn fence_held_by_another(&self, keys: &[Key], fence: u64, owner: OwnerId) -> bool {
        keys.iter().any(|k| {
            self.keys
                .get(k)
                .is_some_and(|s| s.holds.iter().any(|h| h.fence == fence && h.owner != owner))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Command, Key, LockResult, LockTable, Reply, TableLimits, Time, WaitLimit};
    use std::time::Duration;

    fn table() -> LockTable {
        let limits = TableLimits {
            max_waiters: 100,
            max_held_keys: 10_000,
        };
        LockTable::with_sessions(limits, 1)
    }

    fn open(t: &mut LockTable, identity: &str) -> u64 {
        let cmd = Command::OpenSession {
            ttl: Duration::from_secs(10),
            identity: identity.into(),
        };
        match t.apply(cmd, Time::ZERO).reply {
            Reply::Session { id, .. } => id,
            other => panic!("no session: {other:?}"),
        }
    }

    fn lock(t: &mut LockTable, owner: u64, key: &str) -> u64 {
        let cmd = Command::Lock {
            owner,
            keys: vec![key.into()],
            sharing: Default::default(),
            wait: WaitLimit::No,
            lease: Some(Duration::from_secs(60)),
            value: Vec::new(),
        };
        match t.apply(cmd, Time::ZERO).reply {
            Reply::Lock(LockResult::Granted { fence }) => fence,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[test]
    fn a_grant_notes_its_identity_and_anonymous_sessions_note_nothing() {
        let mut t = table();
        let jobs = open(&mut t, "jobs");
        let anon = open(&mut t, "");
        let f = lock(&mut t, jobs, "a");
        let g = lock(&mut t, anon, "b");
        assert_eq!(t.taker(f), Some("jobs"));
        assert_eq!(t.taker(g), None);
        assert!(t.fence_held_by_another(&[Key::from("a")], f, anon));
        assert!(!t.fence_held_by_another(&[Key::from("a")], f, jobs));
        assert!(!t.fence_held_by_another(&[Key::from("a")], f + 100, anon));
        // The record outlives the session that took a lease.
        t.apply(Command::Disconnect { owner: jobs }, Time::ZERO);
        assert_eq!(t.taker(f), Some("jobs"));
        let back = t.snapshot();
        let restored = LockTable::restore(back.clone()).expect("restores");
        assert_eq!(restored.taker(f), Some("jobs"));
        assert_eq!(restored.snapshot(), back);
    }

    #[test]
    fn released_grants_are_swept_once_the_record_doubles() {
        let mut t = table();
        let jobs = open(&mut t, "jobs");
        let first = lock(&mut t, jobs, "kept");
        for i in 0..3000 {
            let key = format!("k{i}");
            let f = lock(&mut t, jobs, &key);
            let unlock = Command::Unlock {
                owner: jobs,
                keys: vec![key.as_str().into()],
                fence: Some(f),
            };
            t.apply(unlock, Time::ZERO);
        }
        assert!(t.takers.by_fence.len() < 2 * super::MIN_SWEEP);
        assert_eq!(t.taker(first), Some("jobs"));
    }
}
