//! Sessions with a time to live, for a table that is replicated.
//!
//! On a single server an owner is a connection, and the connection's end is
//! a [`Command::Disconnect`](super::Command::Disconnect). A cluster cannot
//! tie an owner to one connection: the node holding it may die, and the
//! client must be able to come back through another node and find its locks
//! and its place in every queue. There the owner is a *session*, opened by a
//! command, kept alive by every command that names it, and ended by
//! `Disconnect` or by its TTL running out on the table's own time (the
//! leader's clock, carried in the commands), in [`Command::Advance`].
//!
//! A table made by [`LockTable::with_sessions`](super::LockTable::with_sessions)
//! requires them: a command naming an owner that is not an open session is
//! answered [`Reply::UnknownSession`](super::Reply::UnknownSession) and
//! changes nothing. A table made by `new` has none and treats every owner id
//! as a connection, exactly as before.

use super::resend::Answers;
use super::{OwnerId, ReqId, Time};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The open sessions and their deadlines.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Sessions {
    /// Whether owners must be open sessions (a replicated table).
    pub(super) required: bool,
    /// The id the next session gets; ids are never reused.
    next: OwnerId,
    open: BTreeMap<OwnerId, Session>,
    /// `(expiry, session)` of every open session, earliest first.
    expiry: BTreeSet<(Time, OwnerId)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    ttl: Duration,
    expires: Time,
    /// The identity that opened it; only it may resume it.
    #[serde(default)]
    identity: String,
    /// Replies to its numbered commands (see `resend`).
    #[serde(default)]
    answers: Answers,
}

impl Sessions {
    pub(super) fn required() -> Sessions {
        Sessions {
            required: true,
            next: 1,
            ..Sessions::default()
        }
    }

    /// Opens a session for `identity` that ends `ttl` after `now` unless
    /// kept alive.
    pub(super) fn open(&mut self, ttl: Duration, now: Time, identity: String) -> OwnerId {
        let id = self.next.max(1);
        self.next = id + 1;
        let expires = now.saturating_add(ttl);
        self.open.insert(
            id,
            Session {
                ttl,
                expires,
                answers: Answers::default(),
                identity,
            },
        );
        self.expiry.insert((expires, id));
        id
    }

    /// Whether `owner` may act: always without required sessions; else it
    /// must be open, and acting keeps it alive for another TTL from `now`.
    pub(super) fn admit(&mut self, owner: OwnerId, now: Time) -> bool {
        if !self.required {
            return true;
        }
        self.keep_alive(owner, now).is_some()
    }

    /// Moves `owner`'s expiry to a TTL after `now`; its TTL, or `None` when
    /// it is not open.
    pub(super) fn keep_alive(&mut self, owner: OwnerId, now: Time) -> Option<Duration> {
        let s = self.open.get_mut(&owner)?;
        let expires = now.saturating_add(s.ttl).max(s.expires);
        if expires == s.expires {
            // A session that never expires (a single server's, ended with
            // its connection) is kept alive by every command: no heap work.
            return Some(s.ttl);
        }
        self.expiry.remove(&(s.expires, owner));
        s.expires = expires;
        self.expiry.insert((expires, owner));
        Some(s.ttl)
    }

    /// The identity that opened `owner`, if it is an open session.
    pub(super) fn identity(&self, owner: OwnerId) -> Option<&str> {
        self.open.get(&owner).map(|s| s.identity.as_str())
    }

    /// Whether `owner` is open and was opened by `identity`.
    pub(super) fn opened_by(&self, owner: OwnerId, identity: &str) -> bool {
        self.open
            .get(&owner)
            .is_some_and(|s| s.identity == identity)
    }

    /// Forgets `owner`; whether it was open.
    pub(super) fn end(&mut self, owner: OwnerId) -> bool {
        match self.open.remove(&owner) {
            Some(s) => {
                self.expiry.remove(&(s.expires, owner));
                true
            }
            None => false,
        }
    }

    /// The next session opened gets an id of at least `floor`.
    pub(super) fn raise_next(&mut self, floor: OwnerId) {
        self.next = self.next.max(floor);
    }

    /// The open session with the lowest id.
    pub(super) fn first(&self) -> Option<OwnerId> {
        self.open.keys().next().copied()
    }

    /// The earliest open session whose TTL has run out by `now`.
    pub(super) fn pop_expired(&mut self, now: Time) -> Option<OwnerId> {
        let &(t, id) = self.expiry.first()?;
        if t > now {
            return None;
        }
        self.end(id);
        Some(id)
    }

    /// When the next session expires.
    pub(super) fn next_expiry(&self) -> Option<Time> {
        // The end of the timeline is never reached: a session whose TTL
        // saturated there has no deadline to wake a timer for.
        self.expiry
            .first()
            .map(|&(t, _)| t)
            .filter(|&t| t != Time::END)
    }

    /// The remembered replies of open session `owner`.
    pub(super) fn answers_mut(&mut self, owner: OwnerId) -> Option<&mut Answers> {
        self.open.get_mut(&owner).map(|s| &mut s.answers)
    }

    /// The remembered replies of open session `owner`, to read.
    pub(super) fn answers(&self, owner: OwnerId) -> Option<&Answers> {
        self.open.get(&owner).map(|s| &s.answers)
    }

    /// Runs `f` on every open session's remembered replies, in id order.
    pub(super) fn for_each_answers(&mut self, f: impl Fn(&mut Answers)) {
        self.open.values_mut().for_each(|s| f(&mut s.answers));
    }

    /// The waiting requests each open session remembers, in id order.
    pub(super) fn remembered_waits(&self) -> impl Iterator<Item = (OwnerId, ReqId)> + '_ {
        self.open
            .iter()
            .flat_map(|(&id, s)| s.answers.waiting().map(move |r| (id, r)))
    }

    pub(super) fn is_open(&self, owner: OwnerId) -> bool {
        self.open.contains_key(&owner)
    }

    /// Open sessions.
    pub(super) fn len(&self) -> usize {
        self.open.len()
    }

    /// The session bookkeeping agrees with itself.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.open.len() != self.expiry.len() {
            return Err("session expiry entries do not match open sessions".into());
        }
        for (&id, s) in &self.open {
            if !self.expiry.contains(&(s.expires, id)) {
                return Err(format!("session {id} has no expiry entry"));
            }
            if id >= self.next {
                return Err(format!("session {id} not below the next id"));
            }
            s.answers.check(id)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::table::{
        Command, Key, LockResult, LockTable, OwnerId, Reply, Sharing, TableLimits, Time, WaitLimit,
        WaitOutcome,
    };
    use std::time::Duration;

    const TTL: Duration = Duration::from_secs(10);

    fn at(secs: f64) -> Time {
        Time::from_micros((secs * 1e6) as u64)
    }

    fn table() -> LockTable {
        LockTable::with_sessions(
            TableLimits {
                max_waiters: 100,
                max_held_keys: 100,
            },
            1,
        )
    }

    fn open(t: &mut LockTable, now: Time) -> OwnerId {
        match t
            .apply(
                Command::OpenSession {
                    ttl: TTL,
                    identity: String::new(),
                },
                now,
            )
            .reply
        {
            Reply::Session { id, ttl } => {
                assert_eq!(ttl, TTL);
                id
            }
            other => panic!("OpenSession answered {other:?}"),
        }
    }

    fn lock(owner: OwnerId, key: &str, lease: Option<Duration>) -> Command {
        Command::Lock {
            owner,
            keys: vec![Key::from(key)],
            sharing: Sharing::exclusive(),
            wait: WaitLimit::Forever,
            lease,
            value: Vec::new(),
        }
    }

    #[test]
    fn owners_must_be_open_sessions() {
        let mut t = table();
        let out = t.apply(lock(7, "k", None), at(0.0));
        assert_eq!(out.reply, Reply::UnknownSession);
        assert_eq!(t.held_keys(), 0);
        let out = t.apply(Command::KeepAlive { owner: 7 }, at(0.0));
        assert_eq!(out.reply, Reply::UnknownSession);
        // A table without sessions has nothing to open.
        let mut plain = LockTable::new(
            TableLimits {
                max_waiters: 1,
                max_held_keys: 1,
            },
            1,
        );
        let out = plain.apply(
            Command::OpenSession {
                ttl: TTL,
                identity: String::new(),
            },
            at(0.0),
        );
        assert_eq!(out.reply, Reply::UnknownSession);
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_session_lives_a_ttl_after_the_last_command_naming_it() {
        let mut t = table();
        let a = open(&mut t, at(0.0));
        let b = open(&mut t, at(0.0));
        assert_ne!(a, b);
        let out = t.apply(lock(a, "k", None), at(1.0));
        assert!(matches!(out.reply, Reply::Lock(LockResult::Granted { .. })));
        let out = t.apply(lock(b, "k", None), at(1.0));
        assert!(matches!(out.reply, Reply::Lock(LockResult::Waiting(_))));
        // b keeps itself alive; a's lock at 1 s carries it to 11 s.
        assert!(matches!(
            t.apply(Command::KeepAlive { owner: b }, at(9.0)).reply,
            Reply::Session { .. }
        ));
        assert_eq!(t.next_deadline(), Some(at(11.0)));
        let out = t.apply(Command::Advance, at(10.999));
        assert!(out.ended_sessions.is_empty());
        let out = t.apply(Command::Advance, at(11.0));
        assert_eq!(out.ended_sessions, [a]);
        assert_eq!(out.woken.len(), 1, "b gets the key a held");
        assert_eq!(out.woken[0].owner, b);
        assert!(matches!(out.woken[0].wake, WaitOutcome::Granted { .. }));
        assert_eq!(
            t.apply(lock(a, "x", None), at(11.0)).reply,
            Reply::UnknownSession,
            "an ended session acts no more"
        );
        let out = t.apply(Command::Advance, at(19.0));
        assert_eq!(out.ended_sessions, [b]);
        assert_eq!((t.held_keys(), t.sessions()), (0, 0));
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_lease_outlives_its_session_and_disconnect_ends_one_at_once() {
        let mut t = table();
        let a = open(&mut t, at(0.0));
        t.apply(lock(a, "lease", Some(Duration::from_secs(60))), at(0.0));
        t.apply(lock(a, "bound", None), at(0.0));
        t.apply(Command::Disconnect { owner: a }, at(1.0));
        assert_eq!(t.sessions(), 0);
        assert_eq!(t.held_keys(), 1, "the lease stays");
        t.apply(Command::Advance, at(60.0));
        assert_eq!(t.held_keys(), 0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_restore_raises_the_next_fence_and_ends_every_session_but_keeps_leases() {
        let mut t = table();
        let a = open(&mut t, at(0.0));
        let b = open(&mut t, at(0.0));
        t.apply(lock(a, "lease", Some(Duration::from_secs(60))), at(0.0));
        t.apply(lock(a, "bound", None), at(0.0));
        let out = t.apply(lock(b, "bound", None), at(0.0));
        assert!(matches!(out.reply, Reply::Lock(LockResult::Waiting(_))));
        let out = t.apply(Command::Restore { fence_floor: 1_000 }, at(1.0));
        assert_eq!(out.ended_sessions, [a, b]);
        assert!(out.woken.is_empty(), "b's wait was withdrawn, not granted");
        assert_eq!(t.sessions(), 0);
        assert_eq!(t.held_keys(), 1, "the lease stays");
        assert_eq!(t.next_fence(), 1_000);
        let c = open(&mut t, at(1.0));
        assert!(
            c >= 1_000,
            "a session id the old cluster may have used: {c}"
        );
        match t.apply(lock(c, "bound", None), at(1.0)).reply {
            Reply::Lock(LockResult::Granted { fence, .. }) => assert_eq!(fence, 1_000),
            other => panic!("{other:?}"),
        }
        let out = t.apply(lock(c, "lease", None), at(1.0));
        match out.reply {
            Reply::Lock(LockResult::Waiting(req)) => assert!(req >= 1_000, "request id {req}"),
            other => panic!("{other:?}"),
        }
        // A floor below the next token changes nothing.
        t.apply(Command::Restore { fence_floor: 5 }, at(2.0));
        assert_eq!(t.next_fence(), 1_001);
        t.check_invariants().unwrap();
    }

    #[test]
    fn only_the_identity_that_opened_a_session_resumes_it() {
        let mut t = table();
        let opened = t.apply(
            Command::OpenSession {
                ttl: TTL,
                identity: "jobs".into(),
            },
            at(0.0),
        );
        let Reply::Session { id, .. } = opened.reply else {
            panic!("OpenSession answered {:?}", opened.reply);
        };
        let resume = |identity: &str| Command::Resume {
            owner: id,
            identity: identity.into(),
        };
        assert_eq!(t.apply(resume("ops"), at(9.0)).reply, Reply::UnknownSession);
        assert_eq!(t.apply(resume(""), at(9.0)).reply, Reply::UnknownSession);
        let out = t.apply(Command::Advance, at(10.0));
        assert_eq!(
            out.ended_sessions,
            [id],
            "a refused resume keeps nothing alive"
        );
        let mut t = table();
        let id = match t
            .apply(
                Command::OpenSession {
                    ttl: TTL,
                    identity: "jobs".into(),
                },
                at(0.0),
            )
            .reply
        {
            Reply::Session { id, .. } => id,
            other => panic!("{other:?}"),
        };
        let out = t.apply(
            Command::Resume {
                owner: id,
                identity: "jobs".into(),
            },
            at(9.0),
        );
        assert_eq!(out.reply, Reply::Session { id, ttl: TTL });
        assert!(t
            .apply(Command::Advance, at(10.0))
            .ended_sessions
            .is_empty());
        t.check_invariants().unwrap();
    }

    #[test]
    fn sessions_survive_a_snapshot_and_replay_the_same() {
        let mut t = table();
        let a = open(&mut t, at(0.0));
        t.apply(lock(a, "k", None), at(0.5));
        let mut restored = LockTable::restore(t.snapshot()).unwrap();
        for cmd in [
            Command::OpenSession {
                ttl: TTL,
                identity: String::new(),
            },
            Command::KeepAlive { owner: a },
            Command::Advance,
        ] {
            assert_eq!(
                t.apply(cmd.clone(), at(12.0)),
                restored.apply(cmd, at(12.0))
            );
        }
        assert!(t.snapshot() == restored.snapshot());
        assert!(restored.session_open(a) && restored.sessions() == 2);
    }
}
