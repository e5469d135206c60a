//! The lock table against a small reference model.
//!
//! The model keeps the rules in their plainest form: a list of waiting
//! requests in arrival order, and a request may take a key when the key is its
//! owner's already, or free and wanted by no earlier waiting request. After
//! every step of a random history the table must agree with the model on who
//! holds what, who waits, who was granted or timed out, and the table's own
//! invariants must hold.

use dlock_server::table::{Key, LockResult, LockTable, OwnerId, ReqId, TableLimits, Wait, Wake};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

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
        4 => (slot.clone(), ks.clone(), prop::option::of(1u64..6), any::<bool>(), prop::option::of(1u64..6))
            .prop_map(|(slot, keys, wait, no_wait, lease)| Op::Lock { slot, keys, wait, no_wait: no_wait && wait.is_none(), lease }),
        2 => (slot.clone(), ks.clone(), prop::option::of(0usize..8))
            .prop_map(|(slot, keys, by_fence)| Op::Unlock { slot, keys, by_fence }),
        1 => (slot.clone(), ks, prop::option::of(0usize..8), 1u64..6)
            .prop_map(|(slot, keys, by_fence, lease)| Op::Renew { slot, keys, by_fence, lease }),
        1 => slot.prop_map(|slot| Op::Disconnect { slot }),
        2 => (0u64..4).prop_map(|ticks| Op::Advance { ticks }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct Holder {
    owner: OwnerId,
    fence: u64,
    lease: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Waiting {
    req: ReqId,
    owner: OwnerId,
    keys: BTreeSet<Key>,
    deadline: Option<Instant>,
    lease: Option<Duration>,
}

#[derive(Default)]
struct Model {
    holders: BTreeMap<Key, Holder>,
    waiting: Vec<Waiting>,
}

impl Model {
    /// Whether the waiter at `idx` (or a newcomer, at `waiting.len()`) may
    /// take `key`. A newcomer may pass waiters that wait for one of its
    /// owner's keys: they cannot go first anyway.
    fn may_take(&self, idx: usize, key: &Key, owner: OwnerId) -> bool {
        let newcomer = idx == self.waiting.len();
        match self.holders.get(key) {
            Some(h) => h.owner == owner,
            None => self.waiting[..idx]
                .iter()
                .filter(|w| w.keys.contains(key))
                .all(|w| newcomer && w.owner != owner && self.needs_key_of(w, owner)),
        }
    }

    fn needs_key_of(&self, w: &Waiting, owner: OwnerId) -> bool {
        w.keys
            .iter()
            .any(|k| self.holders.get(k).is_some_and(|h| h.owner == owner))
    }

    fn grant(&mut self, owner: OwnerId, keys: &BTreeSet<Key>, fence: u64, lease: Option<Instant>) {
        for k in keys {
            // Several waiters of one owner may be granted in one step, in an
            // order the model does not fix; the key carries the newest grant.
            if self
                .holders
                .get(k)
                .is_some_and(|h| h.owner == owner && h.fence > fence)
            {
                continue;
            }
            self.holders.insert(
                k.clone(),
                Holder {
                    owner,
                    fence,
                    lease,
                },
            );
        }
    }

    /// Grants waiters in arrival order until none can be; returns who was granted.
    fn settle(&mut self, now: Instant, fences: &BTreeMap<ReqId, u64>) -> BTreeSet<ReqId> {
        let mut granted = BTreeSet::new();
        while let Some(i) = (0..self.waiting.len()).find(|&i| {
            let w = &self.waiting[i];
            w.keys.iter().all(|k| self.may_take(i, k, w.owner))
        }) {
            let w = self.waiting.remove(i);
            let fence = fences.get(&w.req).copied().unwrap_or(0);
            self.grant(w.owner, &w.keys, fence, w.lease.map(|d| now + d));
            granted.insert(w.req);
        }
        granted
    }
}

struct Harness {
    table: LockTable,
    model: Model,
    now: Instant,
    generation: [u64; 4],
    fences: Vec<u64>,
    last_fence: u64,
}

impl Harness {
    fn owner(&self, slot: u64) -> OwnerId {
        slot * 1_000 + self.generation[slot as usize]
    }

    fn tick(&self, n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Applies the table's wake-ups to the model and checks they are exactly
    /// what the model predicts.
    fn check_woken(
        &mut self,
        woken: Vec<dlock_server::table::Woken>,
        expect_granted: impl FnOnce(&mut Model, &BTreeMap<ReqId, u64>) -> BTreeSet<ReqId>,
    ) {
        let mut fences = BTreeMap::new();
        for w in &woken {
            if let Wake::Granted { fence } = w.wake {
                assert!(
                    fence > self.last_fence,
                    "fence {fence} not above {}",
                    self.last_fence
                );
                self.last_fence = fence;
                self.fences.push(fence);
                fences.insert(w.req, fence);
            }
        }
        let predicted = expect_granted(&mut self.model, &fences);
        let actual: BTreeSet<ReqId> = fences.keys().copied().collect();
        assert_eq!(actual, predicted, "granted set differs from the model");
    }

    fn step(&mut self, op: &Op) {
        let now = self.now;
        match op.clone() {
            Op::Lock {
                slot,
                keys: ks,
                wait,
                no_wait,
                lease,
            } => {
                let owner = self.owner(slot);
                let names: Vec<&str> = ks.iter().map(|i| KEYS[*i]).collect();
                let set: BTreeSet<Key> = keys(&names).into_iter().collect();
                let wait_mode = match (no_wait, wait) {
                    (true, _) => Wait::No,
                    (false, Some(t)) => Wait::Until(now + self.tick(t)),
                    (false, None) => Wait::Forever,
                };
                let lease = lease.map(|t| self.tick(t));
                let immediate = set
                    .iter()
                    .all(|k| self.model.may_take(self.model.waiting.len(), k, owner));
                match self.table.lock(owner, keys(&names), wait_mode, lease, now) {
                    LockResult::Granted { fence } => {
                        assert!(immediate, "granted {names:?} to {owner}, model says wait");
                        assert!(fence > self.last_fence);
                        self.last_fence = fence;
                        self.fences.push(fence);
                        self.model.grant(owner, &set, fence, lease.map(|d| now + d));
                    }
                    LockResult::Waiting(req) => {
                        assert!(!immediate, "request for {names:?} waits, model says grant");
                        assert!(!no_wait);
                        self.model.waiting.push(Waiting {
                            req,
                            owner,
                            keys: set,
                            deadline: match wait_mode {
                                Wait::Until(t) => Some(t),
                                _ => None,
                            },
                            lease,
                        });
                    }
                    LockResult::Busy(busy) => {
                        assert!(!immediate && no_wait, "busy {busy:?} for {names:?}");
                        let expect: Vec<Key> = set
                            .iter()
                            .filter(|k| !self.model.may_take(self.model.waiting.len(), k, owner))
                            .cloned()
                            .collect();
                        assert_eq!(busy, expect);
                    }
                    LockResult::LimitReached(what) => panic!("limit {what} reached"),
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
                let res = self.table.unlock(owner, keys(&names), fence, now);
                let mut expect_not_held = Vec::new();
                for k in keys(&names).into_iter().collect::<BTreeSet<_>>() {
                    let held = self.model.holders.get(&k).is_some_and(|h| match fence {
                        Some(f) => h.fence == f,
                        None => h.owner == owner,
                    });
                    if held {
                        self.model.holders.remove(&k);
                    } else {
                        expect_not_held.push(k);
                    }
                }
                assert_eq!(res.not_held, expect_not_held);
                self.check_woken(res.woken, |m, f| m.settle(now, f));
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
                let res = self
                    .table
                    .renew(owner, keys(&names), fence, self.tick(lease), now);
                let mut expect_not_held = Vec::new();
                for k in keys(&names).into_iter().collect::<BTreeSet<_>>() {
                    match self.model.holders.get_mut(&k) {
                        Some(h) if fence.map_or(h.owner == owner, |f| h.fence == f) => {
                            h.lease = Some(now + Duration::from_secs(lease));
                        }
                        _ => expect_not_held.push(k),
                    }
                }
                assert_eq!(res.not_held, expect_not_held);
                assert!(res.woken.is_empty());
            }
            Op::Disconnect { slot } => {
                let owner = self.owner(slot);
                self.generation[slot as usize] += 1;
                let woken = self.table.disconnect(owner, now).woken;
                self.model.waiting.retain(|w| w.owner != owner);
                self.model
                    .holders
                    .retain(|_, h| h.owner != owner || h.lease.is_some());
                self.check_woken(woken, |m, f| m.settle(now, f));
            }
            Op::Advance { ticks } => {
                self.now += self.tick(ticks);
                let now = self.now;
                let adv = self.table.advance(now);
                let mut fences = BTreeMap::new();
                let mut timed_out = Vec::new();
                for w in &adv.woken {
                    match &w.wake {
                        Wake::Granted { fence } => {
                            assert!(*fence > self.last_fence);
                            self.last_fence = *fence;
                            self.fences.push(*fence);
                            fences.insert(w.req, *fence);
                        }
                        Wake::TimedOut(busy) => timed_out.push((w.req, busy.clone())),
                        Wake::LimitReached => panic!("the model's limits are never reached"),
                    }
                }
                // Leases first, then wait limits in deadline order.
                let before = self.model.holders.len();
                self.model
                    .holders
                    .retain(|_, h| h.lease.is_none_or(|t| t > now));
                assert_eq!(adv.expired_leases, before - self.model.holders.len());
                let mut granted = self.model.settle(now, &fences);
                let mut expected_timeouts = Vec::new();
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
                        .filter(|k| !self.model.may_take(i, k, w.owner))
                        .cloned()
                        .collect();
                    expected_timeouts.push((w.req, busy));
                    self.model.waiting.remove(i);
                    granted.extend(self.model.settle(now, &fences));
                }
                assert_eq!(timed_out, expected_timeouts);
                assert_eq!(fences.keys().copied().collect::<BTreeSet<_>>(), granted);
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
            let model = self.model.holders.get(&Key::from(name));
            assert_eq!(
                view.holder,
                model.map(|h| (h.owner, h.fence)),
                "holder of {name}"
            );
            assert_eq!(
                view.lease_remaining,
                model.and_then(|h| h.lease).map(|t| t - self.now),
                "lease of {name}"
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
        assert_eq!(self.table.held_keys(), self.model.holders.len());
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
        let start = Instant::now();
        let mut h = Harness {
            table: LockTable::new(limits(), 100),
            model: Model::default(),
            now: start,
            generation: [0; 4],
            fences: Vec::new(),
            last_fence: 0,
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

#[test]
fn multi_key_request_is_not_starved_by_single_key_stream() {
    let mut t = table();
    let now = Instant::now();
    assert!(matches!(
        t.lock(1, keys(&["a"]), Wait::Forever, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(multi) = t.lock(2, keys(&["a", "b"]), Wait::Forever, None, now) else {
        panic!("multi-key request should wait")
    };
    // "b" is free, but the multi-key request queued for it first.
    assert!(matches!(
        t.lock(3, keys(&["b"]), Wait::Forever, None, now),
        LockResult::Waiting(_)
    ));
    let res = t.unlock(1, keys(&["a"]), None, now);
    assert_eq!(res.woken.len(), 1);
    assert_eq!(res.woken[0].req, multi);
    t.check_invariants().unwrap();
}

#[test]
fn overlapping_waiters_do_not_deadlock() {
    let mut t = table();
    let now = Instant::now();
    assert!(matches!(
        t.lock(1, keys(&["a", "b"]), Wait::Forever, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r1) = t.lock(2, keys(&["a", "b"]), Wait::Forever, None, now) else {
        panic!()
    };
    let LockResult::Waiting(r2) = t.lock(3, keys(&["b", "a"]), Wait::Forever, None, now) else {
        panic!()
    };
    let woken = t.disconnect(1, now).woken;
    assert_eq!(woken.iter().map(|w| w.req).collect::<Vec<_>>(), vec![r1]);
    let woken = t.disconnect(2, now).woken;
    assert_eq!(woken.iter().map(|w| w.req).collect::<Vec<_>>(), vec![r2]);
    t.disconnect(3, now);
    assert_eq!(t.tracked_keys(), 0);
}

#[test]
fn relocking_own_key_succeeds_at_once_with_new_fence() {
    let mut t = table();
    let now = Instant::now();
    let LockResult::Granted { fence: f1 } = t.lock(1, keys(&["a"]), Wait::No, None, now) else {
        panic!()
    };
    assert!(matches!(
        t.lock(2, keys(&["a"]), Wait::Forever, None, now),
        LockResult::Waiting(_)
    ));
    let LockResult::Granted { fence: f2 } = t.lock(1, keys(&["a", "a"]), Wait::No, None, now)
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
    let now = Instant::now();
    assert_eq!(
        t.lock(1, keys(&["a", "b", "c"]), Wait::Forever, None, now),
        LockResult::LimitReached("held keys")
    );
    assert!(matches!(
        t.lock(1, keys(&["a", "b"]), Wait::Forever, None, now),
        LockResult::Granted { .. }
    ));
    assert!(matches!(
        t.lock(2, keys(&["a"]), Wait::Forever, None, now),
        LockResult::Waiting(_)
    ));
    assert_eq!(
        t.lock(3, keys(&["b"]), Wait::Forever, None, now),
        LockResult::LimitReached("waiters")
    );
    assert_eq!(t.waiting(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn lease_expiry_hands_key_to_waiter_before_its_limit() {
    let mut t = table();
    let now = Instant::now();
    let s = Duration::from_secs(1);
    assert!(matches!(
        t.lock(1, keys(&["a"]), Wait::No, Some(2 * s), now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r) = t.lock(2, keys(&["a"]), Wait::Until(now + 2 * s), None, now)
    else {
        panic!()
    };
    assert_eq!(t.next_deadline(), Some(now + 2 * s));
    assert!(t.advance(now + s).woken.is_empty());
    let adv = t.advance(now + 2 * s);
    assert_eq!(adv.expired_leases, 1);
    assert!(
        matches!(adv.woken.as_slice(), [w] if w.req == r && matches!(w.wake, Wake::Granted { .. }))
    );
}

#[test]
fn renewing_often_keeps_heap_bounded() {
    let mut t = table();
    let now = Instant::now();
    assert!(matches!(
        t.lock(
            1,
            keys(&["a"]),
            Wait::No,
            Some(Duration::from_secs(10)),
            now
        ),
        LockResult::Granted { .. }
    ));
    for i in 0..10_000u64 {
        let res = t.renew(
            1,
            keys(&["a"]),
            None,
            Duration::from_secs(10),
            now + Duration::from_millis(i),
        );
        assert!(res.not_held.is_empty());
        assert!(
            t.deadline_entries() <= 2 + 64,
            "stale deadlines pile up: {}",
            t.deadline_entries()
        );
    }
    // Only the newest deadline is live; the stale ones were compacted away.
    let adv = t.advance(now + Duration::from_secs(10));
    assert_eq!(adv.expired_leases, 0);
    let adv = t.advance(now + Duration::from_secs(20));
    assert_eq!(adv.expired_leases, 1);
    assert_eq!(t.next_deadline(), None);
}

#[test]
fn holder_asking_for_one_more_key_passes_a_waiter_blocked_on_it() {
    let mut t = table();
    let now = Instant::now();
    assert!(matches!(
        t.lock(1, keys(&["x"]), Wait::No, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(both) = t.lock(2, keys(&["x", "y"]), Wait::Forever, None, now) else {
        panic!("waits for x")
    };
    // Strict FIFO would queue owner 1 behind owner 2 on y while owner 2 waits
    // for owner 1's x: a deadlock. Owner 2 cannot go first anyway.
    assert!(matches!(
        t.lock(1, keys(&["y"]), Wait::No, None, now),
        LockResult::Granted { .. }
    ));
    // Someone holding nothing still queues behind the waiter.
    assert!(matches!(
        t.lock(3, keys(&["y"]), Wait::No, None, now),
        LockResult::Busy(_)
    ));
    let woken = t.disconnect(1, now).woken;
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
    let now = Instant::now();
    assert!(matches!(
        t.lock(1, keys(&["a"]), Wait::No, None, now),
        LockResult::Granted { .. }
    ));
    let LockResult::Waiting(r) = t.lock(2, keys(&["a", "b", "c"]), Wait::Forever, None, now) else {
        panic!()
    };
    let woken = t.unlock(1, keys(&["a"]), None, now).woken;
    assert!(matches!(woken.as_slice(), [w] if w.req == r && w.wake == Wake::LimitReached));
    assert_eq!((t.held_keys(), t.waiting(), t.tracked_keys()), (0, 0, 0));
    t.check_invariants().unwrap();
}
