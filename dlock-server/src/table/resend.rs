//! Recognising a request sent again: [`Command::Sequenced`].
//!
//! A cluster client whose connection broke does not know whether the
//! requests it had in flight were applied. It resumes its session through
//! the new leader and sends them again, each with the number it had in the
//! session (`seq`, counting up from 1). The session remembers the reply of
//! every numbered command it applied, so a command sent again is answered
//! as the first time and not acted on twice: an Unlock sent again after the
//! session locked the key anew must not release the new lock.
//!
//! What is remembered is part of the session, and so of the table's state:
//! snapshots carry it and a session's end drops it. A Lock that waited is
//! remembered as waiting until the table decides it; its entry then becomes
//! the outcome ([`Reply::Waited`]). The client says which answers it has
//! (`done`: every one numbered up to there), and those are forgotten; a
//! client that never says so costs at most [`MAX_REMEMBERED`] replies,
//! oldest forgotten first. A command whose number was applied but whose
//! reply is forgotten is answered [`Reply::Forgotten`] and not acted on.

use super::{Command, LockResult, LockTable, Output, OwnerId, Reply, ReqId, Time, WaitOutcome};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Replies a session remembers at most. Part of the replicated rules:
/// every node must use the same value, or their tables would forget
/// different replies.
pub const MAX_REMEMBERED: usize = 1024;

/// Keys named in a session's remembered replies (busy keys, keys not held)
/// at most, so that replies with long key lists cannot make a session's
/// memory grow to 1024 full requests' worth; oldest forgotten first. Part
/// of the replicated rules, as [`MAX_REMEMBERED`].
pub const MAX_REMEMBERED_KEYS: usize = 4096;

/// Keys a reply names.
fn named_keys(reply: &Reply) -> usize {
    match reply {
        Reply::NotHeld(keys) | Reply::Lock(LockResult::Busy(keys)) => keys.len(),
        Reply::Waited {
            outcome: WaitOutcome::TimedOut(keys),
            ..
        } => keys.len(),
        _ => 0,
    }
}

/// One session's remembered replies.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Answers {
    /// The highest number applied; 0 before the first.
    applied: u64,
    /// The replies of applied numbers above the client's `done`, by number.
    replies: BTreeMap<u64, Reply>,
    /// The Locks among them still waiting: request to number, so that an
    /// outcome finds its entry without a scan.
    waiting: BTreeMap<ReqId, u64>,
    /// Keys named in `replies`, for [`MAX_REMEMBERED_KEYS`].
    #[serde(default)]
    keys: usize,
}

/// What a session knows of a number.
enum Seen {
    /// Not applied yet.
    New,
    /// Applied; this was the reply (or the outcome it came to).
    Again(Reply),
    /// Applied, and its reply forgotten.
    Forgotten,
}

impl Answers {
    /// Forgets the replies numbered up to `done`.
    fn trim(&mut self, done: u64) {
        let kept = match done.checked_add(1) {
            Some(first_kept) => self.replies.split_off(&first_kept),
            None => BTreeMap::new(),
        };
        let dropped = std::mem::replace(&mut self.replies, kept);
        for reply in dropped.values() {
            self.keys -= named_keys(reply).min(self.keys);
            if let Reply::Lock(LockResult::Waiting(req)) = reply {
                self.waiting.remove(req);
            }
        }
    }

    /// Forgets the oldest replies while more are remembered than allowed.
    fn evict(&mut self) {
        while self.replies.len() > MAX_REMEMBERED || self.keys > MAX_REMEMBERED_KEYS {
            let Some((_, reply)) = self.replies.pop_first() else {
                break;
            };
            self.keys -= named_keys(&reply).min(self.keys);
            if let Reply::Lock(LockResult::Waiting(req)) = reply {
                self.waiting.remove(&req);
            }
        }
    }

    fn seen(&self, seq: u64) -> Seen {
        if seq > self.applied {
            return Seen::New;
        }
        match self.replies.get(&seq) {
            Some(r) => Seen::Again(r.clone()),
            None => Seen::Forgotten,
        }
    }

    /// Remembers `reply` as the answer to `seq`, just applied, unless the
    /// client already said it has it (`seq <= done`).
    fn record(&mut self, seq: u64, done: u64, reply: &Reply) {
        self.applied = self.applied.max(seq);
        if seq <= done {
            return;
        }
        if let Reply::Lock(LockResult::Waiting(req)) = reply {
            self.waiting.insert(*req, seq);
        }
        self.keys += named_keys(reply);
        if let Some(old) = self.replies.insert(seq, reply.clone()) {
            self.keys -= named_keys(&old).min(self.keys);
        }
        self.evict();
    }

    /// The table decided waiting request `req`: its entry, if it has one,
    /// becomes the outcome.
    fn decided(&mut self, req: ReqId, outcome: &WaitOutcome) {
        if let Some(seq) = self.waiting.remove(&req) {
            let outcome = outcome.clone();
            let reply = Reply::Waited { req, outcome };
            self.keys += named_keys(&reply);
            if let Some(old) = self.replies.insert(seq, reply) {
                self.keys -= named_keys(&old).min(self.keys);
            }
            self.evict();
        }
    }

    /// Every waiting request was withdrawn by Close: a Lock sent again is
    /// answered as a new one would be.
    fn shut_down(&mut self) {
        for seq in std::mem::take(&mut self.waiting).into_values() {
            self.replies
                .insert(seq, Reply::Lock(LockResult::ShuttingDown));
        }
    }

    /// The remembered replies, oldest first.
    pub(super) fn replies(&self) -> impl Iterator<Item = &Reply> + '_ {
        self.replies.values()
    }

    /// The waiting requests remembered, for the table's invariants.
    pub(super) fn waiting(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.waiting.keys().copied()
    }

    /// The bookkeeping agrees with itself.
    pub(super) fn check(&self, owner: OwnerId) -> Result<(), String> {
        if self.replies.len() > MAX_REMEMBERED {
            return Err(format!("session {owner} remembers too many replies"));
        }
        let keys: usize = self.replies.values().map(named_keys).sum();
        if keys != self.keys || keys > MAX_REMEMBERED_KEYS {
            return Err(format!(
                "session {owner} counts {} remembered keys, holds {keys}",
                self.keys
            ));
        }
        if self
            .replies
            .last_key_value()
            .is_some_and(|(&s, _)| s > self.applied)
        {
            return Err(format!("session {owner} remembers a reply above applied"));
        }
        let waits = self
            .replies
            .values()
            .filter(|r| matches!(r, Reply::Lock(LockResult::Waiting(_))))
            .count();
        if waits != self.waiting.len() {
            return Err(format!("session {owner}: waiting replies do not match"));
        }
        for (req, seq) in &self.waiting {
            if self.replies.get(seq) != Some(&Reply::Lock(LockResult::Waiting(*req))) {
                return Err(format!("session {owner}: request {req} not at seq {seq}"));
            }
        }
        Ok(())
    }
}

impl LockTable {
    /// Applies [`Command::Sequenced`]; the owner was admitted already.
    pub(super) fn sequenced(
        &mut self,
        seq: u64,
        done: u64,
        cmd: Command,
        now: Time,
        out: &mut Output,
    ) {
        if !self.sessions.required {
            out.reply = Reply::UnknownSession;
            return;
        }
        let owner = match &cmd {
            Command::Lock { owner, .. }
            | Command::Unlock { owner, .. }
            | Command::Renew { owner, .. } => *owner,
            // Nothing else is numbered; a log cannot be refused, so it is
            // a command without effect.
            _ => return,
        };
        if seq == 0 {
            // Not numbered: as if sent bare.
            self.run(cmd, now, out);
            return;
        }
        let Some(answers) = self.sessions.answers_mut(owner) else {
            out.reply = Reply::UnknownSession;
            return;
        };
        answers.trim(done);
        match answers.seen(seq) {
            Seen::Again(reply) => out.reply = reply,
            Seen::Forgotten => out.reply = Reply::Forgotten,
            Seen::New => {
                self.run(cmd, now, out);
                // Lock, Unlock and Renew never end a session.
                if let Some(answers) = self.sessions.answers_mut(owner) {
                    answers.record(seq, done, &out.reply);
                }
            }
        }
    }

    /// Turns the remembered waiting Locks among `woken` into their outcomes.
    pub(super) fn note_outcomes(&mut self, out: &Output) {
        for w in &out.woken {
            if let Some(answers) = self.sessions.answers_mut(w.owner) {
                answers.decided(w.req, &w.wake);
            }
        }
    }

    /// Close withdrew every waiting request.
    pub(super) fn note_shut_down(&mut self) {
        self.sessions.for_each_answers(Answers::shut_down);
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_REMEMBERED, MAX_REMEMBERED_KEYS};
    use crate::table::{
        Command, Key, LockResult, LockTable, OwnerId, Reply, Sharing, TableLimits, Time, WaitLimit,
        WaitOutcome,
    };
    use std::time::Duration;

    const TTL: Duration = Duration::from_secs(10);

    fn table() -> LockTable {
        LockTable::with_sessions(
            TableLimits {
                max_waiters: 100,
                max_held_keys: 100,
            },
            1,
        )
    }

    fn at(ms: u64) -> Time {
        Time::from_micros(ms * 1000)
    }

    fn open(t: &mut LockTable) -> OwnerId {
        match t
            .apply(
                Command::OpenSession {
                    ttl: TTL,
                    identity: String::new(),
                },
                at(0),
            )
            .reply
        {
            Reply::Session { id, .. } => id,
            other => panic!("OpenSession answered {other:?}"),
        }
    }

    fn lock(owner: OwnerId, key: &str) -> Command {
        Command::Lock {
            owner,
            keys: vec![Key::from(key)],
            sharing: Sharing::exclusive(),
            wait: WaitLimit::Forever,
            lease: None,
            value: Vec::new(),
        }
    }

    fn unlock(owner: OwnerId, key: &str) -> Command {
        Command::Unlock {
            owner,
            keys: vec![Key::from(key)],
            fence: None,
        }
    }

    fn seq(seq: u64, done: u64, cmd: Command) -> Command {
        Command::Sequenced {
            seq,
            done,
            cmd: Box::new(cmd),
        }
    }

    fn granted(reply: Reply) -> u64 {
        match reply {
            Reply::Lock(LockResult::Granted { fence }) => fence,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[test]
    fn an_unlock_sent_again_after_a_new_lock_does_not_release_it() {
        let mut t = table();
        let s = open(&mut t);
        granted(t.apply(seq(1, 0, lock(s, "k")), at(1)).reply);
        let first = t.apply(seq(2, 0, unlock(s, "k")), at(2));
        assert_eq!(first.reply, Reply::NotHeld(vec![]));
        let again = granted(t.apply(seq(3, 0, lock(s, "k")), at(3)).reply);
        // The answer to 2 was lost; the client sends it again.
        let resent = t.apply(seq(2, 0, unlock(s, "k")), at(4));
        assert_eq!(resent.reply, first.reply, "answered as the first time");
        assert_eq!(
            t.inspect("k", at(4)).holder,
            Some((s, again)),
            "not released"
        );
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_lock_sent_again_gets_the_same_fence_and_no_new_one() {
        let mut t = table();
        let s = open(&mut t);
        let fence = granted(t.apply(seq(1, 0, lock(s, "k")), at(1)).reply);
        let next = t.next_fence();
        assert_eq!(
            granted(t.apply(seq(1, 0, lock(s, "k")), at(2)).reply),
            fence
        );
        assert_eq!(t.next_fence(), next, "no token issued");
        assert_eq!(t.inspect("k", at(2)).holder, Some((s, fence)));
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_waiting_lock_sent_again_waits_on_the_same_request_then_gets_its_grant() {
        let mut t = table();
        let (holder, s) = (open(&mut t), open(&mut t));
        t.apply(lock(holder, "k"), at(1));
        let first = t.apply(seq(1, 0, lock(s, "k")), at(2)).reply;
        let Reply::Lock(LockResult::Waiting(req)) = first else {
            panic!("{first:?}");
        };
        assert_eq!(t.apply(seq(1, 0, lock(s, "k")), at(3)).reply, first);
        assert_eq!(t.waiting(), 1, "still one wait");
        let out = t.apply(unlock(holder, "k"), at(4));
        let fence = match &out.woken[..] {
            [w] if w.req == req => match w.wake {
                WaitOutcome::Granted { fence } => fence,
                ref other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        let resent = t.apply(seq(1, 0, lock(s, "k")), at(5)).reply;
        let outcome = WaitOutcome::Granted { fence };
        assert_eq!(resent, Reply::Waited { req, outcome });
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_lock_sent_again_after_its_wait_ran_out_or_the_table_closed_is_answered_so() {
        let mut t = table();
        let (holder, s) = (open(&mut t), open(&mut t));
        t.apply(lock(holder, "k"), at(0));
        let timed = Command::Lock {
            owner: s,
            keys: vec![Key::from("k")],
            sharing: Sharing::exclusive(),
            wait: WaitLimit::For(Duration::from_millis(5)),
            lease: None,
            value: Vec::new(),
        };
        let Reply::Lock(LockResult::Waiting(req)) = t.apply(seq(1, 0, timed.clone()), at(1)).reply
        else {
            panic!("not waiting");
        };
        assert_eq!(t.apply(Command::Advance, at(6)).woken.len(), 1);
        let outcome = WaitOutcome::TimedOut(vec![Key::from("k")]);
        let resent = t.apply(seq(1, 0, timed), at(7)).reply;
        assert_eq!(resent, Reply::Waited { req, outcome });
        assert_eq!(t.waiting(), 0, "not queued again");

        t.apply(seq(2, 0, lock(s, "k")), at(8));
        let out = t.apply(Command::Close, at(9));
        assert_eq!(out.withdrawn.len(), 1);
        let resent = t.apply(seq(2, 0, lock(s, "k")), at(10)).reply;
        assert_eq!(resent, Reply::Lock(LockResult::ShuttingDown));
        t.check_invariants().unwrap();
    }

    #[test]
    fn done_forgets_and_a_forgotten_number_acts_no_more() {
        let mut t = table();
        let s = open(&mut t);
        t.apply(seq(1, 0, lock(s, "a")), at(1));
        t.apply(seq(2, 0, lock(s, "b")), at(1));
        // 3 says the client has the answers to 1 and 2.
        let out = t.apply(seq(3, 2, unlock(s, "a")), at(2));
        assert_eq!(out.reply, Reply::NotHeld(vec![]));
        let out = t.apply(seq(1, 2, lock(s, "a")), at(3));
        assert_eq!(out.reply, Reply::Forgotten);
        assert_eq!(t.inspect("a", at(3)).holder, None, "not locked again");
        // 3 is still remembered.
        let out = t.apply(seq(3, 2, unlock(s, "a")), at(3));
        assert_eq!(out.reply, Reply::NotHeld(vec![]));
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_session_remembers_a_bounded_number_of_replies() {
        let mut t = table();
        let (holder, s) = (open(&mut t), open(&mut t));
        t.apply(lock(holder, "busy"), at(0));
        // The first one waits: its entry goes with the oldest.
        t.apply(seq(1, 0, lock(s, "busy")), at(0));
        let total = MAX_REMEMBERED as u64 + 10;
        for n in 2..=total {
            t.apply(seq(n, 0, unlock(s, "x")), at(0));
            t.check_invariants().unwrap();
        }
        for n in 1..=10 {
            assert_eq!(
                t.apply(seq(n, 0, lock(s, "a")), at(1)).reply,
                Reply::Forgotten
            );
        }
        let out = t.apply(seq(11, 0, unlock(s, "x")), at(1));
        assert_eq!(out.reply, Reply::NotHeld(vec![Key::from("x")]));
        // The forgotten wait still waits and is still granted in turn.
        let out = t.apply(unlock(holder, "busy"), at(2));
        assert_eq!(out.woken.len(), 1);
        t.check_invariants().unwrap();
    }

    #[test]
    fn replies_with_long_key_lists_are_forgotten_by_their_key_count() {
        let mut t = table();
        let s = open(&mut t);
        let keys: Vec<Key> = (0..100)
            .map(|i| Key::from(format!("k{i}").as_str()))
            .collect();
        let wide = || Command::Unlock {
            owner: s,
            keys: keys.clone(),
            fence: None,
        };
        // 50 replies naming 100 keys each: only the latest 40 fit in 4096.
        for n in 1..=50 {
            let out = t.apply(seq(n, 0, wide()), at(0));
            assert!(matches!(out.reply, Reply::NotHeld(ref k) if k.len() == 100));
            t.check_invariants().unwrap();
        }
        let kept = MAX_REMEMBERED_KEYS / 100;
        for n in 1..=(50 - kept as u64) {
            assert_eq!(t.apply(seq(n, 0, wide()), at(1)).reply, Reply::Forgotten);
        }
        for n in (50 - kept as u64 + 1)..=50 {
            assert!(matches!(
                t.apply(seq(n, 0, wide()), at(1)).reply,
                Reply::NotHeld(_)
            ));
        }
        t.check_invariants().unwrap();
    }

    #[test]
    fn remembered_replies_survive_a_snapshot_and_replay_the_same() {
        let mut t = table();
        let (holder, s) = (open(&mut t), open(&mut t));
        t.apply(lock(holder, "k"), at(0));
        t.apply(seq(1, 0, lock(s, "a")), at(1));
        t.apply(seq(2, 0, lock(s, "k")), at(1));
        t.apply(seq(3, 1, unlock(s, "a")), at(1));
        let json = serde_json::to_string(&t.snapshot()).unwrap();
        let mut r = LockTable::restore(serde_json::from_str(&json).unwrap()).unwrap();
        assert!(r.snapshot() == t.snapshot());
        for cmd in [
            seq(1, 1, lock(s, "a")),
            seq(2, 1, lock(s, "k")),
            seq(3, 1, unlock(s, "a")),
            unlock(holder, "k"),
            seq(2, 1, lock(s, "k")),
            seq(4, 3, unlock(s, "k")),
        ] {
            assert_eq!(t.apply(cmd.clone(), at(2)), r.apply(cmd, at(2)));
        }
        assert!(r.snapshot() == t.snapshot());
        r.check_invariants().unwrap();
    }

    #[test]
    fn an_unknown_or_ended_session_is_refused_and_nothing_happens() {
        let mut t = table();
        let out = t.apply(seq(1, 0, lock(42, "k")), at(0));
        assert_eq!(out.reply, Reply::UnknownSession);
        let s = open(&mut t);
        granted(t.apply(seq(1, 0, lock(s, "k")), at(0)).reply);
        t.apply(Command::Disconnect { owner: s }, at(1));
        let out = t.apply(seq(1, 0, lock(s, "k")), at(2));
        assert_eq!(out.reply, Reply::UnknownSession);
        assert_eq!(t.held_keys(), 0);
        // A table without sessions numbers nothing.
        let mut plain = LockTable::new(
            TableLimits {
                max_waiters: 1,
                max_held_keys: 1,
            },
            1,
        );
        let out = plain.apply(seq(1, 0, lock(1, "k")), at(0));
        assert_eq!(out.reply, Reply::UnknownSession);
        assert_eq!(plain.held_keys(), 0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn only_lock_unlock_and_renew_are_numbered() {
        let mut t = table();
        let s = open(&mut t);
        for inner in [
            Command::Advance,
            Command::KeepAlive { owner: s },
            seq(1, 0, lock(s, "k")),
        ] {
            let out = t.apply(seq(1, 0, inner), at(0));
            assert_eq!(out.reply, Reply::None);
        }
        assert_eq!(t.held_keys(), 0);
        // Number 1 is still new.
        granted(t.apply(seq(1, 0, lock(s, "k")), at(0)).reply);
        t.check_invariants().unwrap();
    }
}
