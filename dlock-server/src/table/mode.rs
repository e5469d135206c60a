//! Shared holds and semaphores: how a request takes each key ([`Mode`],
//! [`Sharing`]) and who holds a key (`Holds`).
//!
//! One mechanism serves both: a key is held either by one exclusive holder
//! or by a set of shared holders under a limit, 0 meaning no limit (a
//! reader lock) and N meaning at most N holders (a semaphore). All shared
//! holders and shared waiters of a key agree on its limit; the table refuses
//! a request that names another ([`super::LockResult::LimitMismatch`]). An
//! exclusive request on a key held shared waits until every holder is gone,
//! whatever the limit.
//!
//! An owner holds a key at most once, and never holds or waits for one key
//! in two modes at once: a request that would is refused
//! ([`super::LockResult::ModeConflict`]). That keeps the rule that an
//! owner's own keys count as free: re-granting a key in the mode it is held
//! in changes nobody else's view of it, while an upgrade from shared to
//! exclusive by two readers at once would deadlock.

use super::{Hold, Key, OwnerId, Time};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a request takes one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Alone: no other holder at the same time.
    Exclusive,
    /// Alongside other shared holders, at most `limit` of them at once
    /// (0: no limit).
    Shared {
        /// Most holders at once; 0 is no limit.
        limit: u32,
    },
}

/// Which keys of a Lock are taken shared, and under which limit. The
/// default takes every key exclusively, as every older request does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharing {
    /// The keys taken shared. The table sorts them, folds duplicates and
    /// ignores any the request does not name among its keys.
    pub keys: Vec<Key>,
    /// Most holders of each shared key at once; 0 is no limit (a reader
    /// lock), N a semaphore of N.
    pub limit: u32,
}

impl Sharing {
    /// Every key exclusive.
    pub fn exclusive() -> Sharing {
        Sharing::default()
    }

    /// Every one of `keys` shared under `limit` (0: no limit).
    pub fn all(keys: &[Key], limit: u32) -> Sharing {
        Sharing {
            keys: keys.to_vec(),
            limit,
        }
    }

    /// No key is shared.
    pub fn is_exclusive(&self) -> bool {
        self.keys.is_empty()
    }

    /// How `key` is taken. The keys must be sorted (see `normalise`).
    pub fn mode(&self, key: &str) -> Mode {
        match self.keys.binary_search_by(|k| (**k).cmp(key)) {
            Ok(_) => Mode::Shared { limit: self.limit },
            Err(_) => Mode::Exclusive,
        }
    }

    /// Sorted, without duplicates, only keys among `requested` (sorted).
    pub(super) fn normalise(mut self, requested: &[Key]) -> Sharing {
        self.keys.sort_unstable();
        self.keys.dedup();
        self.keys.retain(|k| requested.binary_search(k).is_ok());
        if self.keys.is_empty() {
            self.limit = 0;
        }
        self
    }
}

/// Whether two modes are of the same kind (both exclusive, or both shared
/// whatever their limits).
pub(super) fn same_kind(a: Mode, b: Mode) -> bool {
    matches!(
        (a, b),
        (Mode::Exclusive, Mode::Exclusive) | (Mode::Shared { .. }, Mode::Shared { .. })
    )
}

/// The holders of a key under a shared mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SharedHolds {
    /// Most holders at once; 0 is no limit.
    pub(super) limit: u32,
    /// By owner; never empty.
    pub(super) holders: BTreeMap<OwnerId, Hold>,
    /// The same holders by fence, so that a lease entry or an Unlock by
    /// token finds its hold in O(log n) among thousands of readers. Not
    /// stored: rebuilt from `holders` when a snapshot is read.
    #[serde(skip)]
    pub(super) fences: BTreeMap<u64, OwnerId>,
}

impl SharedHolds {
    fn insert(&mut self, hold: Hold) -> Option<Hold> {
        self.fences.insert(hold.fence, hold.owner);
        let previous = self.holders.insert(hold.owner, hold);
        if let Some(p) = &previous {
            self.fences.remove(&p.fence);
        }
        previous
    }

    fn remove(&mut self, owner: OwnerId) -> Option<Hold> {
        let taken = self.holders.remove(&owner);
        if let Some(h) = &taken {
            self.fences.remove(&h.fence);
        }
        taken
    }

    /// Whether `fences` indexes exactly `holders`.
    pub(super) fn indexed(&self) -> bool {
        self.fences.len() == self.holders.len()
            && self
                .fences
                .iter()
                .all(|(f, o)| self.holders.get(o).is_some_and(|h| h.fence == *f))
    }
}

/// Who holds a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Holds {
    /// Nobody.
    #[default]
    Free,
    /// One owner, alone.
    Exclusive(Hold),
    /// Shared holders: boxed, as most keys are held exclusively and the
    /// inline map would add to every key's size.
    Shared(Box<SharedHolds>),
}

impl Holds {
    pub(super) fn is_free(&self) -> bool {
        matches!(self, Holds::Free)
    }

    /// Holds on the key: one per holder.
    pub(super) fn count(&self) -> usize {
        match self {
            Holds::Free => 0,
            Holds::Exclusive(_) => 1,
            Holds::Shared(s) => s.holders.len(),
        }
    }

    /// How the key is held, if it is.
    pub(super) fn mode(&self) -> Option<Mode> {
        match self {
            Holds::Free => None,
            Holds::Exclusive(_) => Some(Mode::Exclusive),
            Holds::Shared(s) => Some(Mode::Shared { limit: s.limit }),
        }
    }

    /// Every hold, lowest token first.
    pub(super) fn by_fence(&self) -> impl DoubleEndedIterator<Item = &Hold> {
        let (one, shared) = match self {
            Holds::Free => (None, None),
            Holds::Exclusive(h) => (Some(h), None),
            Holds::Shared(s) => (None, Some(s)),
        };
        let shared = shared.into_iter().flat_map(|s| {
            s.fences
                .values()
                .filter_map(move |owner| s.holders.get(owner))
        });
        one.into_iter().chain(shared)
    }

    /// `owner`'s hold on the key.
    pub(super) fn of(&self, owner: OwnerId) -> Option<&Hold> {
        match self {
            Holds::Free => None,
            Holds::Exclusive(h) => (h.owner == owner).then_some(h),
            Holds::Shared(s) => s.holders.get(&owner),
        }
    }

    /// Moves `owner`'s lease to `deadline`; returns its hold as it is now.
    /// (The fence stays, so the fence index needs no change; nothing else
    /// of a hold may change in place.)
    pub(super) fn set_lease(&mut self, owner: OwnerId, deadline: Time) -> Option<&Hold> {
        let hold = match self {
            Holds::Free => None,
            Holds::Exclusive(h) => (h.owner == owner).then_some(h),
            Holds::Shared(s) => s.holders.get_mut(&owner),
        }?;
        hold.lease = Some(deadline);
        Some(hold)
    }

    /// Sets `owner`'s value (see `value`); returns whether it holds the
    /// key. Nothing else of the hold changes, so no index needs updating.
    pub(super) fn set_value(&mut self, owner: OwnerId, value: &[u8]) -> bool {
        let hold = match self {
            Holds::Free => None,
            Holds::Exclusive(h) => (h.owner == owner).then_some(h),
            Holds::Shared(s) => s.holders.get_mut(&owner),
        };
        match hold {
            Some(h) => {
                h.value = value.into();
                true
            }
            None => false,
        }
    }

    /// The first holder: the one with the lowest token, which has held the
    /// key longest (the only one of a key held exclusively).
    pub(super) fn first(&self) -> Option<&Hold> {
        match self {
            Holds::Free => None,
            Holds::Exclusive(h) => Some(h),
            Holds::Shared(s) => s
                .fences
                .first_key_value()
                .and_then(|(_, o)| s.holders.get(o)),
        }
    }

    /// The hold under token `fence`.
    pub(super) fn with_fence(&self, fence: u64) -> Option<&Hold> {
        match self {
            Holds::Free => None,
            Holds::Exclusive(h) => (h.fence == fence).then_some(h),
            Holds::Shared(s) => s.fences.get(&fence).and_then(|o| s.holders.get(o)),
        }
    }

    /// Every hold, by owner.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Hold> {
        let (one, many) = match self {
            Holds::Free => (None, None),
            Holds::Exclusive(h) => (Some(h), None),
            Holds::Shared(s) => (None, Some(s.holders.values())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Whether one more holder, in `mode`, may join those there are now
    /// (the limits having been agreed on already).
    pub(super) fn admits(&self, mode: Mode) -> bool {
        match (self, mode) {
            (Holds::Free, _) => true,
            (Holds::Exclusive(_), _) | (Holds::Shared(_), Mode::Exclusive) => false,
            (Holds::Shared(s), Mode::Shared { .. }) => {
                s.limit == 0 || s.holders.len() < s.limit as usize
            }
        }
    }

    /// Sets `hold` as its owner's, in `mode`; returns the owner's previous
    /// hold. The caller made sure the mode agrees with the other holders.
    pub(super) fn put(&mut self, hold: Hold, mode: Mode) -> Option<Hold> {
        match (mode, &mut *self) {
            (Mode::Shared { .. }, Holds::Shared(s)) => s.insert(hold),
            (Mode::Shared { limit }, _) => {
                let previous = self.take(hold.owner);
                let mut shared = SharedHolds {
                    limit,
                    holders: BTreeMap::new(),
                    fences: BTreeMap::new(),
                };
                shared.insert(hold);
                *self = Holds::Shared(Box::new(shared));
                previous
            }
            (Mode::Exclusive, _) => {
                let previous = self.take(hold.owner);
                *self = Holds::Exclusive(hold);
                previous
            }
        }
    }

    /// Removes `owner`'s hold.
    pub(super) fn take(&mut self, owner: OwnerId) -> Option<Hold> {
        match self {
            Holds::Free => None,
            Holds::Exclusive(h) if h.owner == owner => match std::mem::take(self) {
                Holds::Exclusive(h) => Some(h),
                _ => None,
            },
            Holds::Exclusive(_) => None,
            Holds::Shared(s) => {
                let taken = s.remove(owner);
                if s.holders.is_empty() {
                    *self = Holds::Free;
                }
                taken
            }
        }
    }

    /// As stored in a snapshot: the exclusive hold, or the shared holds.
    pub(super) fn to_parts(&self) -> (Option<Hold>, Option<SharedHolds>) {
        match self {
            Holds::Free => (None, None),
            Holds::Exclusive(h) => (Some(h.clone()), None),
            // Without the fence index, so that a snapshot equals itself
            // read back.
            Holds::Shared(s) => (
                None,
                Some(SharedHolds {
                    limit: s.limit,
                    holders: s.holders.clone(),
                    fences: BTreeMap::new(),
                }),
            ),
        }
    }

    /// From a snapshot's parts.
    pub(super) fn from_parts(
        hold: Option<Hold>,
        shared: Option<SharedHolds>,
    ) -> Result<Holds, String> {
        match (hold, shared) {
            (None, None) => Ok(Holds::Free),
            (Some(h), None) => Ok(Holds::Exclusive(h)),
            (None, Some(s)) if s.holders.is_empty() => Err("shared holds without holders".into()),
            (None, Some(mut s)) => {
                s.fences = s.holders.iter().map(|(o, h)| (h.fence, *o)).collect();
                if s.fences.len() != s.holders.len() {
                    return Err("two shared holds under one fence".into());
                }
                Ok(Holds::Shared(Box::new(s)))
            }
            (Some(_), Some(_)) => Err("a key held both exclusively and shared".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::table::{
        Command, Key, LockResult, LockTable, Output, OwnerId, Reply, Sharing, TableLimits, Time,
        WaitLimit, WaitOutcome,
    };
    use std::time::Duration;

    fn table() -> LockTable {
        LockTable::new(
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

    /// A Lock of `exclusive` and `shared` keys, waiting without limit.
    fn lock(owner: OwnerId, exclusive: &[&str], shared: &[&str], limit: u32) -> Command {
        let shared: Vec<Key> = shared.iter().map(|k| Key::from(*k)).collect();
        let mut keys: Vec<Key> = exclusive.iter().map(|k| Key::from(*k)).collect();
        keys.extend(shared.iter().cloned());
        Command::Lock {
            owner,
            keys,
            sharing: Sharing {
                keys: shared,
                limit,
            },
            wait: WaitLimit::Forever,
            lease: None,
            value: Vec::new(),
        }
    }

    fn read(owner: OwnerId, key: &str) -> Command {
        lock(owner, &[], &[key], 0)
    }

    fn write(owner: OwnerId, key: &str) -> Command {
        lock(owner, &[key], &[], 0)
    }

    fn apply(t: &mut LockTable, cmd: Command, ms: u64) -> Output {
        let out = t.apply(cmd, at(ms));
        t.check_invariants().expect("invariants hold");
        let restored = LockTable::restore(t.snapshot()).expect("restores");
        assert_eq!(restored.snapshot(), t.snapshot());
        out
    }

    fn granted(out: &Output) -> u64 {
        match out.reply {
            Reply::Lock(LockResult::Granted { fence }) => fence,
            ref other => panic!("not granted: {other:?}"),
        }
    }

    fn waiting(out: &Output) -> u64 {
        match out.reply {
            Reply::Lock(LockResult::Waiting(req)) => req,
            ref other => panic!("not waiting: {other:?}"),
        }
    }

    /// The requests `out` granted, in order.
    fn woken_granted(out: &Output) -> Vec<u64> {
        out.woken
            .iter()
            .filter(|w| matches!(w.wake, WaitOutcome::Granted { .. }))
            .map(|w| w.req)
            .collect()
    }

    fn unlock(owner: OwnerId, key: &str) -> Command {
        Command::Unlock {
            owner,
            keys: vec![Key::from(key)],
            fence: None,
        }
    }

    #[test]
    fn readers_share_a_key_each_under_a_token_of_its_own() {
        let mut t = table();
        let a = granted(&apply(&mut t, read(1, "k"), 0));
        let b = granted(&apply(&mut t, read(2, "k"), 0));
        assert_ne!(a, b);
        let view = t.inspect("k", at(0));
        assert_eq!(view.holders.len(), 2);
        assert_eq!(view.holder, Some((2, b)), "the latest grant stands for all");
        assert_eq!(t.held_keys(), 2, "each shared hold counts");
    }

    #[test]
    fn a_writer_waits_for_every_reader_and_a_later_reader_waits_behind_it() {
        let mut t = table();
        granted(&apply(&mut t, read(1, "k"), 0));
        granted(&apply(&mut t, read(2, "k"), 0));
        let w = waiting(&apply(&mut t, write(3, "k"), 1));
        // No writer starvation: the key has room for readers, but one waits.
        let r = waiting(&apply(&mut t, read(4, "k"), 2));
        assert!(apply(&mut t, unlock(1, "k"), 3).woken.is_empty());
        let out = apply(&mut t, unlock(2, "k"), 4);
        assert_eq!(woken_granted(&out), vec![w]);
        let out = apply(&mut t, unlock(3, "k"), 5);
        assert_eq!(woken_granted(&out), vec![r]);
    }

    #[test]
    fn readers_at_the_head_of_a_queue_are_granted_together_up_to_the_next_writer() {
        let mut t = table();
        granted(&apply(&mut t, write(1, "k"), 0));
        let r1 = waiting(&apply(&mut t, read(2, "k"), 1));
        let r2 = waiting(&apply(&mut t, read(3, "k"), 2));
        let w = waiting(&apply(&mut t, write(4, "k"), 3));
        let r3 = waiting(&apply(&mut t, read(5, "k"), 4));
        let out = apply(&mut t, unlock(1, "k"), 5);
        assert_eq!(
            woken_granted(&out),
            vec![r1, r2],
            "not the writer, nor past it"
        );
        apply(&mut t, unlock(2, "k"), 6);
        let out = apply(&mut t, unlock(3, "k"), 7);
        assert_eq!(woken_granted(&out), vec![w]);
        let out = apply(&mut t, unlock(4, "k"), 8);
        assert_eq!(woken_granted(&out), vec![r3]);
    }

    #[test]
    fn inspect_within_a_budget_lists_the_oldest_and_the_latest_and_counts_the_rest() {
        let mut t = table();
        let fences: Vec<u64> = (1..=5)
            .map(|owner| granted(&apply(&mut t, read(owner, "k"), owner)))
            .collect();
        let listed = |budget| {
            let v = t.inspect_within("k", at(9), budget, None);
            let f: Vec<u64> = v.holders.iter().map(|h| h.fence).collect();
            (f, v.holders_omitted)
        };
        let all = t.inspect("k", at(9));
        assert_eq!(all.holders.len(), 5);
        assert_eq!(all.holders_omitted, 0);
        // Room for three holders: the oldest two and the latest.
        let three = 3 * crate::table::HOLDER_COST;
        assert_eq!(listed(three), (vec![fences[0], fences[1], fences[4]], 2));
        let ends = (vec![fences[0], fences[4]], 3);
        assert_eq!(listed(0), ends, "the oldest and the latest always");
        assert_eq!(listed(usize::MAX).0, fences);
        let v = t.inspect_within("k", at(9), 0, None);
        assert_eq!(v.holder.map(|h| h.1), Some(fences[4]));
        // The caller's own hold is listed too (owner 3 took fences[2]).
        let v = t.inspect_within("k", at(9), 0, Some(3));
        let f: Vec<u64> = v.holders.iter().map(|h| h.fence).collect();
        assert_eq!(f, vec![fences[0], fences[2], fences[4]]);
        assert_eq!(v.holders_omitted, 2);
    }

    #[test]
    fn a_mixed_request_takes_all_its_keys_or_none_and_is_not_overtaken() {
        let mut t = table();
        granted(&apply(&mut t, write(1, "deploy"), 0));
        granted(&apply(&mut t, read(2, "config"), 0));
        // Exclusive on deploy, shared on config: waits for deploy, holds nothing.
        let mixed = waiting(&apply(&mut t, lock(3, &["deploy"], &["config"], 0), 1));
        assert_eq!(t.inspect("config", at(1)).holders.len(), 1);
        // A writer on config queues behind the mixed request, a reader too.
        let w = waiting(&apply(&mut t, write(4, "config"), 2));
        let r = waiting(&apply(&mut t, read(5, "config"), 3));
        let out = apply(&mut t, unlock(1, "deploy"), 4);
        assert_eq!(woken_granted(&out), vec![mixed]);
        assert_eq!(t.inspect("config", at(4)).holders.len(), 2);
        apply(&mut t, unlock(2, "config"), 5);
        let out = apply(&mut t, unlock(3, "config"), 6);
        assert_eq!(woken_granted(&out), vec![w]);
        let out = apply(&mut t, unlock(4, "config"), 7);
        assert_eq!(woken_granted(&out), vec![r]);
    }

    #[test]
    fn an_upgrade_or_downgrade_is_refused_and_changes_nothing() {
        let mut t = table();
        let fence = granted(&apply(&mut t, read(1, "k"), 0));
        let next = t.next_fence();
        let out = apply(&mut t, write(1, "k"), 1);
        assert_eq!(
            out.reply,
            Reply::Lock(LockResult::ModeConflict(vec![Key::from("k")]))
        );
        assert_eq!(t.next_fence(), next);
        assert_eq!(t.inspect("k", at(1)).holder, Some((1, fence)));
        granted(&apply(&mut t, write(2, "x"), 1));
        let out = apply(&mut t, read(2, "x"), 2);
        assert_eq!(
            out.reply,
            Reply::Lock(LockResult::ModeConflict(vec![Key::from("x")]))
        );
        // Nor may an owner wait for a key in two modes.
        granted(&apply(&mut t, write(3, "y"), 2));
        waiting(&apply(&mut t, read(4, "y"), 3));
        let out = apply(&mut t, write(4, "y"), 4);
        assert!(matches!(
            out.reply,
            Reply::Lock(LockResult::ModeConflict(_))
        ));
        // The same mode again is a re-grant under a new token.
        let again = granted(&apply(&mut t, read(1, "k"), 5));
        assert!(again > fence);
        assert_eq!(t.inspect("k", at(5)).holders.len(), 1);
    }

    #[test]
    fn a_semaphore_admits_its_limit_and_queues_the_next() {
        let mut t = table();
        granted(&apply(&mut t, lock(1, &[], &["s"], 2), 0));
        granted(&apply(&mut t, lock(2, &[], &["s"], 2), 0));
        let third = waiting(&apply(&mut t, lock(3, &[], &["s"], 2), 1));
        assert_eq!(t.inspect("s", at(1)).holders.len(), 2);
        let out = apply(&mut t, unlock(1, "s"), 2);
        assert_eq!(woken_granted(&out), vec![third]);
    }

    #[test]
    fn a_semaphore_refuses_another_limit_from_holders_or_waiters() {
        let mut t = table();
        granted(&apply(&mut t, lock(1, &[], &["s"], 2), 0));
        let out = apply(&mut t, lock(2, &[], &["s"], 3), 0);
        assert_eq!(
            out.reply,
            Reply::Lock(LockResult::LimitMismatch(vec![Key::from("s")]))
        );
        let out = apply(&mut t, read(2, "s"), 0);
        assert!(matches!(
            out.reply,
            Reply::Lock(LockResult::LimitMismatch(_))
        ));
        // Held exclusively, waited for under limit 2: a limit of 3 disagrees.
        granted(&apply(&mut t, write(1, "w"), 0));
        waiting(&apply(&mut t, lock(2, &[], &["w"], 2), 1));
        let out = apply(&mut t, lock(3, &[], &["w"], 3), 2);
        assert!(matches!(
            out.reply,
            Reply::Lock(LockResult::LimitMismatch(_))
        ));
        // Once nobody shares it, any limit goes.
        apply(&mut t, Command::Disconnect { owner: 2 }, 3);
        waiting(&apply(&mut t, lock(3, &[], &["w"], 3), 4));
    }

    #[test]
    fn a_writer_on_a_semaphore_waits_for_every_holder() {
        let mut t = table();
        granted(&apply(&mut t, lock(1, &[], &["s"], 3), 0));
        let w = waiting(&apply(&mut t, write(2, "s"), 1));
        let behind = waiting(&apply(&mut t, lock(3, &[], &["s"], 3), 2));
        let out = apply(&mut t, unlock(1, "s"), 3);
        assert_eq!(woken_granted(&out), vec![w]);
        let out = apply(&mut t, unlock(2, "s"), 4);
        assert_eq!(woken_granted(&out), vec![behind]);
    }

    #[test]
    fn disconnect_lease_expiry_and_fence_unlock_release_one_shared_hold_each() {
        let mut t = table();
        granted(&apply(&mut t, lock(1, &[], &["s"], 2), 0));
        let leased = Command::Lock {
            owner: 2,
            keys: vec![Key::from("s")],
            sharing: Sharing::all(&[Key::from("s")], 2),
            wait: WaitLimit::Forever,
            lease: Some(Duration::from_millis(10)),
            value: Vec::new(),
        };
        let f2 = granted(&apply(&mut t, leased, 0));
        let third = waiting(&apply(&mut t, lock(3, &[], &["s"], 2), 1));
        let fourth = waiting(&apply(&mut t, lock(4, &[], &["s"], 2), 1));
        let out = apply(&mut t, Command::Disconnect { owner: 1 }, 2);
        assert_eq!(woken_granted(&out), vec![third]);
        let out = apply(&mut t, Command::Advance, 10);
        assert_eq!(out.expired_leases, 1);
        assert_eq!(woken_granted(&out), vec![fourth]);
        // The expired token names nothing any more.
        let by_fence = Command::Unlock {
            owner: 9,
            keys: vec![Key::from("s")],
            fence: Some(f2),
        };
        assert_eq!(
            apply(&mut t, by_fence, 11).reply,
            Reply::NotHeld(vec![Key::from("s")])
        );
        let view = t.inspect("s", at(11));
        let f3 = view.holders[0].fence;
        let by_fence = Command::Unlock {
            owner: 9,
            keys: vec![Key::from("s")],
            fence: Some(f3),
        };
        assert_eq!(apply(&mut t, by_fence, 12).reply, Reply::NotHeld(vec![]));
        assert_eq!(t.inspect("s", at(12)).holders.len(), 1);
    }

    #[test]
    fn a_reader_holding_a_key_may_take_one_more_past_a_writer_waiting_for_it() {
        // The newcomer exception, shared: the writer waits for the reader's
        // hold anyway, so the reader's next key must not wait behind it.
        let mut t = table();
        granted(&apply(&mut t, read(1, "a"), 0));
        waiting(&apply(&mut t, lock(2, &["a", "b"], &[], 0), 1));
        granted(&apply(&mut t, read(1, "b"), 2));
        // A reader that a waiter sharing the key does not wait for gets
        // no exception: it must not pass that waiter on another key.
        granted(&apply(&mut t, read(3, "c"), 3));
        granted(&apply(&mut t, write(5, "d"), 3));
        let w = waiting(&apply(&mut t, lock(4, &["d", "f"], &["c"], 0), 4));
        let r = waiting(&apply(&mut t, write(3, "f"), 5));
        let out = apply(&mut t, unlock(5, "d"), 6);
        assert_eq!(woken_granted(&out), vec![w]);
        let out = apply(&mut t, unlock(4, "f"), 7);
        assert_eq!(woken_granted(&out), vec![r]);
    }

    #[test]
    fn a_snapshot_keeps_shared_holds_and_sharing_waiters() {
        let mut t = table();
        granted(&apply(&mut t, lock(1, &[], &["s"], 2), 0));
        granted(&apply(&mut t, lock(2, &[], &["s"], 2), 0));
        waiting(&apply(&mut t, lock(3, &["x"], &["s"], 2), 1));
        let restored = LockTable::restore(t.snapshot()).expect("restores");
        assert_eq!(restored.snapshot(), t.snapshot());
        assert_eq!(restored.inspect("s", at(1)), t.inspect("s", at(1)));
    }

    #[test]
    fn an_older_snapshot_without_sharing_loads() {
        let mut t = table();
        granted(&apply(&mut t, write(1, "k"), 0));
        waiting(&apply(&mut t, write(2, "k"), 0));
        let json = serde_json::to_string(&t.snapshot()).expect("encodes");
        assert!(!json.contains("shared") && !json.contains("sharing"));
        let back = serde_json::from_str(&json).expect("decodes");
        LockTable::restore(back).expect("restores");
        // An exclusive Lock is encoded as it was before sharing existed.
        let cmd = serde_json::to_string(&write(1, "k")).expect("encodes");
        assert!(!cmd.contains("sharing"), "{cmd}");
    }
}
