//! The lock table against a small reference model.
//!
//! The model keeps the rules in their plainest form: a list of waiting
//! requests in arrival order, and a request may take a key when the key is its
//! owner's already, or free and wanted by no earlier waiting request; when a
//! change lets several waiters in, the earliest goes first. The model hands
//! out fencing tokens itself. Keys may be taken shared, under a limit: a
//! key's holders are then a list, a request may take a key when the holders
//! admit its mode, and requests that disagree on a key's mode (the same
//! owner) or limit (anyone) are refused. After every step of a random history the table
//! must agree with the model on who holds what, who waits, and exactly which
//! requests were granted or timed out, in which order, under which token;
//! and the table's own invariants must hold.

use dlock_server::table::{
    Command, Key, LockResult, LockTable, Mode, Output, OwnerId, Reply, ReqId, Sharing, TableLimits,
    Time, WaitLimit, WaitOutcome, Woken,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];

fn limits() -> TableLimits {
    TableLimits {
        max_waiters: 1_000,
        max_held_keys: 1_000,
    }
}

fn keys(names: &[&str]) -> Vec<Key> {
    names.iter().map(|k| Key::from(*k)).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Lock {
        slot: u64,
        keys: Vec<usize>,
        /// A bit per position in `keys`: taken shared.
        shared: u8,
        /// The limit of the shared keys; 0 is none.
        limit: u32,
        wait: Option<u64>,
        no_wait: bool,
        lease: Option<u64>,
    },
    Unlock {
        slot: u64,
        keys: Vec<usize>,
        by_fence: Option<usize>,
    },
    Renew {
        slot: u64,
        keys: Vec<usize>,
        by_fence: Option<usize>,
        lease: u64,
    },
    Proclaim {
        slot: u64,
        keys: Vec<usize>,
        by_fence: Option<usize>,
        value: u8,
    },
    Disconnect {
        slot: u64,
    },
    Advance {
        ticks: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0u64..4;
    let ks = prop::collection::vec(0usize..KEYS.len(), 1..4);
    prop_oneof![
        4 => (slot.clone(), ks.clone(), prop_oneof![2 => Just(0u8), 1 => any::<u8>()], 0u32..3, prop::option::of(1u64..6), any::<bool>(), prop::option::of(1u64..6))
            .prop_map(|(slot, keys, shared, limit, wait, no_wait, lease)| Op::Lock { slot, keys, shared, limit, wait, no_wait: no_wait && wait.is_none(), lease }),
        2 => (slot.clone(), ks.clone(), prop::option::of(0usize..8))
            .prop_map(|(slot, keys, by_fence)| Op::Unlock { slot, keys, by_fence }),
        1 => (slot.clone(), ks, prop::option::of(0usize..8), 1u64..6)
            .prop_map(|(slot, keys, by_fence, lease)| Op::Renew { slot, keys, by_fence, lease }),
        1 => (slot.clone(), prop::collection::vec(0usize..KEYS.len(), 1..3), prop::option::of(0usize..8), 0u8..3)
            .prop_map(|(slot, keys, by_fence, value)| Op::Proclaim { slot, keys, by_fence, value }),
        1 => slot.prop_map(|slot| Op::Disconnect { slot }),
        2 => (0u64..4).prop_map(|ticks| Op::Advance { ticks }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct Holder {
    owner: OwnerId,
    fence: u64,
    lease: Option<Time>,
    mode: Mode,
    /// Its value: its Lock's, or the latest Proclaim's.
    value: Vec<u8>,
    /// When it was granted.
    since: Time,
}

fn is_shared(m: Mode) -> bool {
    matches!(m, Mode::Shared { .. })
}

/// Whether `holders` (all in one mode) let one more holder in, in `mode`.
fn admits(holders: &[Holder], mode: Mode) -> bool {
    match (holders.first().map(|h| h.mode), mode) {
        (None, _) => true,
        (Some(Mode::Shared { limit }), Mode::Shared { .. }) => {
            limit == 0 || holders.len() < limit as usize
        }
        _ => false,
    }
}

#[derive(Debug, Clone)]
struct Waiting {
    req: ReqId,
    owner: OwnerId,
    keys: BTreeSet<Key>,
    shared: BTreeMap<Key, Mode>,
    deadline: Option<Time>,
    lease: Option<Duration>,
    value: Vec<u8>,
}

impl Waiting {
    fn mode(&self, key: &Key) -> Mode {
        self.shared.get(key).copied().unwrap_or(Mode::Exclusive)
    }
}

/// What the model expects a waiting request to come to, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Granted(ReqId, u64),
    TimedOut(ReqId, Vec<Key>),
}

struct Model {
    /// Every key's holders; a key without holders is absent.
    holders: BTreeMap<Key, Vec<Holder>>,
    waiting: Vec<Waiting>,
    next_fence: u64,
}

impl Model {
    fn held(&self, key: &Key) -> &[Holder] {
        self.holders.get(key).map_or(&[], |h| &h[..])
    }

    /// Whether the waiter at `idx` (or a newcomer, at `waiting.len()`) may
    /// take `key` in `mode`. A newcomer may pass waiters that `owner`'s
    /// holds keep waiting: they cannot go first anyway.
    fn may_take(&self, idx: usize, key: &Key, owner: OwnerId, mode: Mode) -> bool {
        let newcomer = idx == self.waiting.len();
        let held = self.held(key);
        if held.iter().any(|h| h.owner == owner) {
            return true;
        }
        admits(held, mode)
            && self.waiting[..idx]
                .iter()
                .filter(|w| w.keys.contains(key))
                .all(|w| newcomer && w.owner != owner && self.kept_waiting_by(w, owner))
    }

    fn kept_waiting_by(&self, w: &Waiting, owner: OwnerId) -> bool {
        w.keys.iter().any(|k| {
            let held = self.held(k);
            held.iter().any(|h| h.owner == owner)
                && !held.iter().any(|h| h.owner == w.owner)
                && !admits(held, w.mode(k))
        })
    }

    /// The refusal a new Lock gets, if any: a key its owner holds or waits
    /// for in the other mode, or shares under another limit than others.
    fn refusal(
        &self,
        owner: OwnerId,
        keys: &BTreeSet<Key>,
        modes: &BTreeMap<Key, Mode>,
    ) -> Option<LockResult> {
        let mode = |k: &Key| modes.get(k).copied().unwrap_or(Mode::Exclusive);
        // Every mode `k` is held or waited for in, by `who` or by anyone.
        let modes_of = |k: &Key, who: Option<OwnerId>| -> Vec<Mode> {
            let mine = |o: OwnerId| who.is_none_or(|w| w == o);
            self.held(k)
                .iter()
                .filter(|h| mine(h.owner))
                .map(|h| h.mode)
                .chain(
                    self.waiting
                        .iter()
                        .filter(|w| mine(w.owner) && w.keys.contains(k))
                        .map(|w| w.mode(k)),
                )
                .collect()
        };
        let conflicts: Vec<Key> = keys
            .iter()
            .filter(|k| {
                modes_of(k, Some(owner))
                    .into_iter()
                    .any(|m| is_shared(m) != is_shared(mode(k)))
            })
            .cloned()
            .collect();
        if !conflicts.is_empty() {
            return Some(LockResult::ModeConflict(conflicts));
        }
        let mismatches: Vec<Key> = keys
            .iter()
            .filter(|k| {
                is_shared(mode(k))
                    && modes_of(k, None)
                        .into_iter()
                        .any(|m| is_shared(m) && m != mode(k))
            })
            .cloned()
            .collect();
        (!mismatches.is_empty()).then_some(LockResult::LimitMismatch(mismatches))
    }

    /// Gives `keys` to `owner` under the next token; returns the token.
    fn grant(
        &mut self,
        owner: OwnerId,
        keys: &BTreeSet<Key>,
        modes: &BTreeMap<Key, Mode>,
        lease: Option<Time>,
        value: &[u8],
        now: Time,
    ) -> u64 {
        let fence = self.next_fence;
        self.next_fence += 1;
        for k in keys {
            let held = self.holders.entry(k.clone()).or_default();
            held.retain(|h| h.owner != owner);
            held.push(Holder {
                owner,
                fence,
                lease,
                mode: modes.get(k).copied().unwrap_or(Mode::Exclusive),
                value: value.to_vec(),
                since: now,
            });
        }
        fence
    }

    /// Removes the holders `gone` picks; returns how many.
    fn drop_holders(&mut self, mut gone: impl FnMut(&Key, &Holder) -> bool) -> usize {
        let mut n = 0;
        for (k, held) in self.holders.iter_mut() {
            let before = held.len();
            held.retain(|h| !gone(k, h));
            n += before - held.len();
        }
        self.holders.retain(|_, h| !h.is_empty());
        n
    }

    /// Grants the earliest waiter that may go, again and again until none
    /// can; appends the grants to `events` in order.
    fn settle(&mut self, now: Time, events: &mut Vec<Event>) {
        while let Some(i) = (0..self.waiting.len()).find(|&i| {
            let w = &self.waiting[i];
            w.keys
                .iter()
                .all(|k| self.may_take(i, k, w.owner, w.mode(k)))
        }) {
            let w = self.waiting.remove(i);
            let lease = w.lease.map(|d| at(now, d));
            let fence = self.grant(w.owner, &w.keys, &w.shared, lease, &w.value, now);
            events.push(Event::Granted(w.req, fence));
        }
    }
}

/// The value every Lock of `owner` carries: one byte, so that a re-grant
/// resets a proclaimed value to it.
fn lock_value(owner: OwnerId) -> Vec<u8> {
    vec![(owner % 100) as u8]
}

fn at(now: Time, d: Duration) -> Time {
    now.checked_add(d).expect("model times stay small")
}

/// The table's wake-ups as the model's events. The model's limits are never
/// reached.
fn events(woken: &[Woken]) -> Vec<Event> {
    woken
        .iter()
        .map(|w| match &w.wake {
            WaitOutcome::Granted { fence } => Event::Granted(w.req, *fence),
            WaitOutcome::TimedOut(busy) => Event::TimedOut(w.req, busy.clone()),
            WaitOutcome::LimitReached => panic!("the model's limits are never reached"),
        })
        .collect()
}

/// Applies a Lock; it wakes nobody.
fn lock(
    t: &mut LockTable,
    owner: OwnerId,
    keys: Vec<Key>,
    wait: WaitLimit,
    lease: Option<Duration>,
    now: Time,
) -> LockResult {
    let value = Vec::new();
    lock_shared(
        t,
        owner,
        keys,
        Sharing::exclusive(),
        (wait, lease, value),
        now,
    )
}

/// Applies a Lock that may share keys; it wakes nobody.
fn lock_shared(
    t: &mut LockTable,
    owner: OwnerId,
    keys: Vec<Key>,
    sharing: Sharing,
    (wait, lease, value): (WaitLimit, Option<Duration>, Vec<u8>),
    now: Time,
) -> LockResult {
    let cmd = Command::Lock {
        owner,
        keys,
        sharing,
        wait,
        lease,
        value,
    };
    match t.apply(cmd, now) {
        Output {
            reply: Reply::Lock(r),
            woken,
            withdrawn,
            expired_leases: 0,
            ended_sessions,
        } if woken.is_empty() && withdrawn.is_empty() && ended_sessions.is_empty() => r,
        out => panic!("a Lock returned {out:?}"),
    }
}

/// Applies an Unlock or Renew; returns the keys not held and the wake-ups.
fn release(t: &mut LockTable, cmd: Command, now: Time) -> (Vec<Key>, Vec<Woken>) {
    match t.apply(cmd, now) {
        Output {
            reply: Reply::NotHeld(keys),
            woken,
            withdrawn,
            expired_leases: 0,
            ended_sessions,
        } if withdrawn.is_empty() && ended_sessions.is_empty() => (keys, woken),
        out => panic!("an Unlock or Renew returned {out:?}"),
    }
}

fn disconnect(t: &mut LockTable, owner: OwnerId, now: Time) -> Output {
    t.apply(Command::Disconnect { owner }, now)
}

fn advance(t: &mut LockTable, now: Time) -> Output {
    t.apply(Command::Advance, now)
}

struct Harness {
    table: LockTable,
    model: Model,
    now: Time,
    generation: [u64; 4],
    fences: Vec<u64>,
}

impl Harness {
    fn owner(&self, slot: u64) -> OwnerId {
        slot * 1_000 + self.generation[slot as usize]
    }

    fn tick(&self, n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Records the tokens the table handed out, for Unlock and Renew by
    /// fence, and checks them against the model's events.
    fn check_events(&mut self, woken: &[Woken], expected: Vec<Event>) {
        let actual = events(woken);
        assert_eq!(actual, expected, "wake-ups differ from the model's");
        for e in actual {
            if let Event::Granted(_, fence) = e {
                self.fences.push(fence);
            }
        }
    }

    fn step(&mut self, op: &Op) {
        let now = self.now;
        match op.clone() {
            Op::Lock {
                slot,
                keys: ks,
                shared,
                limit,
                wait,
                no_wait,
                lease,
            } => {
                let owner = self.owner(slot);
                let names: Vec<&str> = ks.iter().map(|i| KEYS[*i]).collect();
                let set: BTreeSet<Key> = keys(&names).into_iter().collect();
                // A key named twice is shared if either naming says so.
                let shared_names: Vec<&str> = names
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| shared & (1 << i) != 0)
                    .map(|(_, n)| *n)
                    .collect();
                let modes: BTreeMap<Key, Mode> = keys(&shared_names)
                    .into_iter()
                    .map(|k| (k, Mode::Shared { limit }))
                    .collect();
                let sharing = Sharing {
                    keys: keys(&shared_names),
                    limit,
                };
                let mode = |k: &Key| modes.get(k).copied().unwrap_or(Mode::Exclusive);
                let wait_mode = match (no_wait, wait) {
                    (true, _) => WaitLimit::No,
                    (false, Some(t)) => WaitLimit::For(self.tick(t)),
                    (false, None) => WaitLimit::Forever,
                };
                let lease = lease.map(|t| self.tick(t));
                let refusal = self.model.refusal(owner, &set, &modes);
                let immediate = set.iter().all(|k| {
                    self.model
                        .may_take(self.model.waiting.len(), k, owner, mode(k))
                });
                let result = lock_shared(
                    &mut self.table,
                    owner,
                    keys(&names),
                    sharing,
                    (wait_mode, lease, lock_value(owner)),
                    now,
                );
                if let Some(refused) = refusal {
                    assert_eq!(
                        result, refused,
                        "refusal of {names:?} shared {shared_names:?}"
                    );
                    self.compare();
                    return;
                }
                match result {
                    LockResult::Granted { fence } => {
                        assert!(immediate, "granted {names:?} to {owner}, model says wait");
                        let lease = lease.map(|d| at(now, d));
                        let value = lock_value(owner);
                        let expected = self.model.grant(owner, &set, &modes, lease, &value, now);
                        assert_eq!(fence, expected, "token of an immediate grant");
                        self.fences.push(fence);
                    }
                    LockResult::Waiting(req) => {
                        assert!(!immediate, "request for {names:?} waits, model says grant");
                        assert!(!no_wait);
                        self.model.waiting.push(Waiting {
                            req,
                            owner,
                            keys: set,
                            shared: modes.clone(),
                            deadline: wait.map(|t| at(now, self.tick(t))),
                            lease,
                            value: lock_value(owner),
                        });
                    }
                    LockResult::Busy(busy) => {
                        assert!(!immediate && no_wait, "busy {busy:?} for {names:?}");
                        let expect: Vec<Key> = set
                            .iter()
                            .filter(|k| {
                                !self
                                    .model
                                    .may_take(self.model.waiting.len(), k, owner, mode(k))
                            })
                            .cloned()
                            .collect();
                        assert_eq!(busy, expect);
                    }
                    other => panic!("{other:?}"),
                }
            }
            Op::Unlock {
                slot,
                keys: ks,
                by_fence,
            } => {
                let owner = self.owner(slot);
                let fence = by_fence.and_then(|i| self.fences.get(i).copied());
                let names: Vec<&str> = ks.iter().map(|i| KEYS[*i]).collect();
                let cmd = Command::Unlock {
                    owner,
                    keys: keys(&names),
                    fence,
                };
                let (not_held, woken) = release(&mut self.table, cmd, now);
                let mut expect_not_held = Vec::new();
                for k in keys(&names).into_iter().collect::<BTreeSet<_>>() {
                    let this = |h: &Holder| match fence {
                        Some(f) => h.fence == f,
                        None => h.owner == owner,
                    };
                    if self.model.held(&k).iter().any(this) {
                        self.model.drop_holders(|key, h| *key == k && this(h));
                    } else {
                        expect_not_held.push(k);
                    }
                }
                assert_eq!(not_held, expect_not_held);
                let mut expected = Vec::new();
                self.model.settle(now, &mut expected);
                self.check_events(&woken, expected);
            }
            Op::Renew {
                slot,
                keys: ks,
                by_fence,
                lease,
            } => {
                let owner = self.owner(slot);
                let fence = by_fence.and_then(|i| self.fences.get(i).copied());
                let names: Vec<&str> = ks.iter().map(|i| KEYS[*i]).collect();
                let cmd = Command::Renew {
                    owner,
                    keys: keys(&names),
                    fence,
                    lease: self.tick(lease),
                };
                let (not_held, woken) = release(&mut self.table, cmd, now);
                let mut expect_not_held = Vec::new();
                for k in keys(&names).into_iter().collect::<BTreeSet<_>>() {
                    let held = self.model.holders.get_mut(&k).and_then(|hs| {
                        hs.iter_mut()
                            .find(|h| fence.map_or(h.owner == owner, |f| h.fence == f))
                    });
                    match held {
                        Some(h) => h.lease = Some(at(now, Duration::from_secs(lease))),
                        None => expect_not_held.push(k),
                    }
                }
                assert_eq!(not_held, expect_not_held);
                assert!(woken.is_empty());
            }
            Op::Proclaim {
                slot,
                keys: ks,
                by_fence,
                value,
            } => {
                let owner = self.owner(slot);
                let fence = by_fence.and_then(|i| self.fences.get(i).copied());
                let names: Vec<&str> = ks.iter().map(|i| KEYS[*i]).collect();
                let value = vec![100 + value];
                let cmd = Command::Proclaim {
                    owner,
                    keys: keys(&names),
                    fence,
                    value: value.clone(),
                };
                let (not_held, woken) = release(&mut self.table, cmd, now);
                let mut expect_not_held = Vec::new();
                for k in keys(&names).into_iter().collect::<BTreeSet<_>>() {
                    let held = self.model.holders.get_mut(&k).and_then(|hs| {
                        hs.iter_mut()
                            .find(|h| fence.map_or(h.owner == owner, |f| h.fence == f))
                    });
                    match held {
                        Some(h) => h.value = value.clone(),
                        None => expect_not_held.push(k),
                    }
                }
                assert_eq!(not_held, expect_not_held);
                assert!(woken.is_empty());
            }
            Op::Disconnect { slot } => {
                let owner = self.owner(slot);
                self.generation[slot as usize] += 1;
                let out = disconnect(&mut self.table, owner, now);
                let withdrawn: Vec<ReqId> = self
                    .model
                    .waiting
                    .iter()
                    .filter(|w| w.owner == owner)
                    .map(|w| w.req)
                    .collect();
                assert_eq!(out.withdrawn, withdrawn, "withdrawn requests");
                self.model.waiting.retain(|w| w.owner != owner);
                self.model
                    .drop_holders(|_, h| h.owner == owner && h.lease.is_none());
                let mut expected = Vec::new();
                self.model.settle(now, &mut expected);
                self.check_events(&out.woken, expected);
            }
            Op::Advance { ticks } => {
                self.now = at(self.now, self.tick(ticks));
                let now = self.now;
                let adv = advance(&mut self.table, now);
                // Leases first, then wait limits in deadline order, each
                // followed by the grants it lets in.
                let expired = self
                    .model
                    .drop_holders(|_, h| h.lease.is_some_and(|t| t <= now));
                assert_eq!(adv.expired_leases, expired);
                let mut expected = Vec::new();
                self.model.settle(now, &mut expected);
                loop {
                    let due = self
                        .model
                        .waiting
                        .iter()
                        .enumerate()
                        .filter(|(_, w)| w.deadline.is_some_and(|t| t <= now))
                        .min_by_key(|(_, w)| (w.deadline, w.req))
                        .map(|(i, _)| i);
                    let Some(i) = due else { break };
                    let w = &self.model.waiting[i];
                    let busy: Vec<Key> = w
                        .keys
                        .iter()
                        .filter(|k| !self.model.may_take(i, k, w.owner, w.mode(k)))
                        .cloned()
                        .collect();
                    expected.push(Event::TimedOut(w.req, busy));
                    self.model.waiting.remove(i);
                    self.model.settle(now, &mut expected);
                }
                self.check_events(&adv.woken, expected);
            }
        }
        self.compare();
    }

    fn compare(&self) {
        if let Err(e) = self.table.check_invariants() {
            panic!("invariant broken: {e}");
        }
        for name in KEYS {
            let view = self.table.inspect(name, self.now);
            let mut model = self.model.held(&Key::from(name)).to_vec();
            model.sort_by_key(|h| h.fence);
            type Seen = (OwnerId, u64, Option<Duration>, Vec<u8>, Duration);
            let holders: Vec<Seen> = view
                .holders
                .iter()
                .map(|h| {
                    let (value, held) = (h.value.clone(), h.held_for);
                    (h.owner, h.fence, h.lease_remaining, value, held)
                })
                .collect();
            let expected: Vec<Seen> = model
                .iter()
                .map(|h| {
                    let left = h.lease.map(|t| t.saturating_duration_since(self.now));
                    let held = self.now.saturating_duration_since(h.since);
                    (h.owner, h.fence, left, h.value.clone(), held)
                })
                .collect();
            assert_eq!(holders, expected, "holders of {name}");
            let first = self.table.first_holder(name).map(|f| (f.fence, f.value));
            let expected_first = model.first().map(|h| (h.fence, h.value.clone()));
            assert_eq!(first, expected_first, "first holder of {name}");
            assert_eq!(view.mode, model.first().map(|h| h.mode), "mode of {name}");
            assert_eq!(
                view.holder,
                model.last().map(|h| (h.owner, h.fence)),
                "holder of {name}"
            );
            let waiters = self
                .model
                .waiting
                .iter()
                .filter(|w| w.keys.contains(name))
                .count();
            assert_eq!(view.waiters, waiters, "waiters of {name}");
        }
        assert_eq!(self.table.waiting(), self.model.waiting.len());
        let holds: usize = self.model.holders.values().map(Vec::len).sum();
        assert_eq!(self.table.held_keys(), holds);
        assert_eq!(self.table.next_fence(), self.model.next_fence);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES runs more (docs/RELIABILITY.md).
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn table_agrees_with_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut h = Harness {
            table: LockTable::new(limits(), 100),
            model: Model {
                holders: BTreeMap::new(),
                waiting: Vec::new(),
                next_fence: 100,
            },
            now: Time::from_micros(5_000_000),
            generation: [0; 4],
            fences: Vec::new(),
        };
        for op in &ops {
            h.step(op);
        }
        // Everyone leaves and every lease runs out: nothing may remain.
        for slot in 0..4 {
            h.step(&Op::Disconnect { slot });
        }
        h.step(&Op::Advance { ticks: 100 });
        prop_assert_eq!(h.table.tracked_keys(), 0);
        prop_assert_eq!(h.table.waiting(), 0);
        prop_assert_eq!(h.table.next_deadline(), None);
    }
}

fn table() -> LockTable {
    LockTable::new(limits(), 1)
}

fn unlock(owner: OwnerId, names: &[&str]) -> Command {
    Command::Unlock {
        owner,
        keys: keys(names),
        fence: None,
    }
}

#[test]
fn multi_key_request_is_not_starved_by_single_key_stream() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    assert!(matches!(
        lock(&mut t, 1, keys(&["a"]), WaitLimit::Forever, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(multi) =
        lock(&mut t, 2, keys(&["a", "b"]), WaitLimit::Forever, None, now)
    else {
        panic!("multi-key request should wait")
    };
    // "b" is free, but the multi-key request queued for it first.
    assert!(matches!(
        lock(&mut t, 3, keys(&["b"]), WaitLimit::Forever, None, now),
        LockResult::Waiting(_)
    ));
    let (_, woken) = release(&mut t, unlock(1, &["a"]), now);
    assert_eq!(woken.len(), 1);
    assert_eq!(woken[0].req, multi);
    t.check_invariants().unwrap();
}

#[test]
fn overlapping_waiters_do_not_deadlock() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    assert!(matches!(
        lock(&mut t, 1, keys(&["a", "b"]), WaitLimit::Forever, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r1) = lock(&mut t, 2, keys(&["a", "b"]), WaitLimit::Forever, None, now)
    else {
        panic!()
    };
    let LockResult::Waiting(r2) = lock(&mut t, 3, keys(&["b", "a"]), WaitLimit::Forever, None, now)
    else {
        panic!()
    };
    let woken = disconnect(&mut t, 1, now).woken;
    assert_eq!(woken.iter().map(|w| w.req).collect::<Vec<_>>(), vec![r1]);
    let woken = disconnect(&mut t, 2, now).woken;
    assert_eq!(woken.iter().map(|w| w.req).collect::<Vec<_>>(), vec![r2]);
    disconnect(&mut t, 3, now);
    assert_eq!(t.tracked_keys(), 0);
}

#[test]
fn relocking_own_key_succeeds_at_once_with_new_fence() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    let LockResult::Granted { fence: f1 } = lock(&mut t, 1, keys(&["a"]), WaitLimit::No, None, now)
    else {
        panic!()
    };
    assert!(matches!(
        lock(&mut t, 2, keys(&["a"]), WaitLimit::Forever, None, now),
        LockResult::Waiting(_)
    ));
    let LockResult::Granted { fence: f2 } =
        lock(&mut t, 1, keys(&["a", "a"]), WaitLimit::No, None, now)
    else {
        panic!()
    };
    assert!(f2 > f1);
    assert_eq!(t.held_keys(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn limits_are_enforced_without_side_effects() {
    let mut t = LockTable::new(
        TableLimits {
            max_waiters: 1,
            max_held_keys: 2,
        },
        1,
    );
    let now = Time::from_micros(1_000_000);
    assert_eq!(
        lock(
            &mut t,
            1,
            keys(&["a", "b", "c"]),
            WaitLimit::Forever,
            None,
            now
        ),
        LockResult::LimitReached("held keys")
    );
    assert!(matches!(
        lock(&mut t, 1, keys(&["a", "b"]), WaitLimit::Forever, None, now),
        LockResult::Granted { .. }
    ));
    assert!(matches!(
        lock(&mut t, 2, keys(&["a"]), WaitLimit::Forever, None, now),
        LockResult::Waiting(_)
    ));
    assert_eq!(
        lock(&mut t, 3, keys(&["b"]), WaitLimit::Forever, None, now),
        LockResult::LimitReached("waiters")
    );
    assert_eq!(t.waiting(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn lease_expiry_hands_key_to_waiter_before_its_limit() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    let s = Duration::from_secs(1);
    assert!(matches!(
        lock(&mut t, 1, keys(&["a"]), WaitLimit::No, Some(2 * s), now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r) = lock(&mut t, 2, keys(&["a"]), WaitLimit::For(2 * s), None, now)
    else {
        panic!()
    };
    assert_eq!(t.next_deadline(), Some(at(now, 2 * s)));
    assert!(advance(&mut t, at(now, s)).woken.is_empty());
    let adv = advance(&mut t, at(now, 2 * s));
    assert_eq!(adv.expired_leases, 1);
    assert!(
        matches!(adv.woken.as_slice(), [w] if w.req == r && matches!(w.wake, WaitOutcome::Granted { .. }))
    );
}

#[test]
fn renewing_often_keeps_heap_bounded() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    assert!(matches!(
        lock(
            &mut t,
            1,
            keys(&["a"]),
            WaitLimit::No,
            Some(Duration::from_secs(10)),
            now
        ),
        LockResult::Granted { .. }
    ));
    for i in 0..10_000u64 {
        let renew = Command::Renew {
            owner: 1,
            keys: keys(&["a"]),
            fence: None,
            lease: Duration::from_secs(10),
        };
        let (not_held, _) = release(&mut t, renew, at(now, Duration::from_millis(i)));
        assert!(not_held.is_empty());
        assert!(
            t.deadline_entries() <= 2 + 64,
            "stale deadlines pile up: {}",
            t.deadline_entries()
        );
    }
    // Only the newest deadline is live; the stale ones were compacted away.
    let adv = advance(&mut t, at(now, Duration::from_secs(10)));
    assert_eq!(adv.expired_leases, 0);
    let adv = advance(&mut t, at(now, Duration::from_secs(20)));
    assert_eq!(adv.expired_leases, 1);
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn holder_asking_for_one_more_key_passes_a_waiter_blocked_on_it() {
    let mut t = table();
    let now = Time::from_micros(1_000_000);
    assert!(matches!(
        lock(&mut t, 1, keys(&["x"]), WaitLimit::No, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(both) =
        lock(&mut t, 2, keys(&["x", "y"]), WaitLimit::Forever, None, now)
    else {
        panic!("waits for x")
    };
    // Strict FIFO would queue owner 1 behind owner 2 on y while owner 2 waits
    // for owner 1's x: a deadlock. Owner 2 cannot go first anyway.
    assert!(matches!(
        lock(&mut t, 1, keys(&["y"]), WaitLimit::No, None, now),
        LockResult::Granted { .. }
    ));
    // Someone holding nothing still queues behind the waiter.
    assert!(matches!(
        lock(&mut t, 3, keys(&["y"]), WaitLimit::No, None, now),
        LockResult::Busy(_)
    ));
    let woken = disconnect(&mut t, 1, now).woken;
    assert_eq!(woken.iter().map(|w| w.req).collect::<Vec<_>>(), vec![both]);
    t.check_invariants().unwrap();
}

#[test]
fn waiter_that_would_exceed_held_keys_limit_is_withdrawn() {
    let mut t = LockTable::new(
        TableLimits {
            max_waiters: 10,
            max_held_keys: 2,
        },
        1,
    );
    let now = Time::from_micros(1_000_000);
    assert!(matches!(
        lock(&mut t, 1, keys(&["a"]), WaitLimit::No, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r) = lock(
        &mut t,
        2,
        keys(&["a", "b", "c"]),
        WaitLimit::Forever,
        None,
        now,
    ) else {
        panic!()
    };
    let (_, woken) = release(&mut t, unlock(1, &["a"]), now);
    assert!(matches!(woken.as_slice(), [w] if w.req == r && w.wake == WaitOutcome::LimitReached));
    assert_eq!((t.held_keys(), t.waiting(), t.tracked_keys()), (0, 0, 0));
    t.check_invariants().unwrap();
}
