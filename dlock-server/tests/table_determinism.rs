//! The lock table as a replicated state machine: the same commands at the
//! same times give the same outputs and the same state, in any table,
//! including one restored from a snapshot taken part way (see the
//! determinism contract in `dlock_server::table`).

use dlock_server::table::{
    Command, Key, LoadedSnapshot, LockResult, LockTable, Output, Reply, Sharing, Snapshot,
    TableLimits, Time, WaitLimit, WaitOutcome,
};
use proptest::prelude::*;
use std::time::Duration;

const KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// Small, so that both limits are reached now and then.
fn limits() -> TableLimits {
    TableLimits {
        max_waiters: 6,
        max_held_keys: 8,
    }
}

fn keys() -> impl Strategy<Value = Vec<Key>> {
    prop::collection::vec(prop::sample::select(&KEYS[..]), 1..4)
        .prop_map(|ks| ks.into_iter().map(Key::from).collect())
}

fn millis(max: u64) -> impl Strategy<Value = Duration> {
    (1..max).prop_map(Duration::from_millis)
}

/// A Lock, Unlock or Renew: the commands a session numbers.
fn owned_command() -> impl Strategy<Value = Command> {
    let owner = 1u64..6;
    // Tokens start at 1 and the streams are short: most of these were issued.
    let fence = 1u64..40;
    let wait = prop_oneof![
        Just(WaitLimit::No),
        Just(WaitLimit::Forever),
        millis(3_000).prop_map(WaitLimit::For),
        Just(WaitLimit::For(Duration::ZERO)),
        Just(WaitLimit::For(Duration::MAX)),
    ];
    prop_oneof![
        6 => (owner.clone(), keys(), any::<u8>(), 0u32..3, wait, prop::option::of(millis(4_000)), value())
            .prop_map(|(owner, keys, mask, limit, wait, lease, value)| {
                // Some keys shared, under a limit from a small range so
                // that requests disagree on it now and then.
                let sharing = Sharing {
                    keys: keys
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask & (1 << (i % 8)) != 0)
                        .map(|(_, k)| k.clone())
                        .collect(),
                    limit,
                };
                Command::Lock { owner, keys, sharing, wait, lease, value }
            }),
        2 => (owner.clone(), keys(), prop::option::of(fence.clone()), value())
            .prop_map(|(owner, keys, fence, value)| Command::Proclaim { owner, keys, fence, value }),
        3 => (owner.clone(), keys(), prop::option::of(fence.clone()))
            .prop_map(|(owner, keys, fence)| Command::Unlock { owner, keys, fence }),
        2 => (owner, keys(), prop::option::of(fence), millis(4_000))
            .prop_map(|(owner, keys, fence, lease)| Command::Renew { owner, keys, fence, lease }),
    ]
}

/// A hold's value: often none, else one of a few, so that Proclaim both
/// changes and repeats values.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..3, 0..2)
}

fn command() -> impl Strategy<Value = Command> {
    let owner = 1u64..6;
    prop_oneof![
        11 => owned_command(),
        // Numbers from a small range, so that many are sent again, some
        // after they were forgotten; now and then an unnumbered one (0) or
        // a command that is never numbered.
        5 => (0u64..10, 0u64..6, owned_command())
            .prop_map(|(seq, done, cmd)| Command::Sequenced { seq, done, cmd: Box::new(cmd) }),
        1 => (1u64..10, Just(Command::Advance))
            .prop_map(|(seq, cmd)| Command::Sequenced { seq, done: 0, cmd: Box::new(cmd) }),
        1 => (keys(), 1u64..40).prop_map(|(keys, fence)| Command::Undelivered { keys, fence }),
        2 => owner.clone().prop_map(|owner| Command::Disconnect { owner }),
        3 => Just(Command::Advance),
        // Meaningful to a table with sessions, refused by one without.
        1 => (millis(5_000), 0..2u8).prop_map(|(ttl, who)| Command::OpenSession {
            ttl,
            identity: format!("id{who}"),
        }),
        1 => owner.clone().prop_map(|owner| Command::KeepAlive { owner }),
        1 => (owner, 0..2u8).prop_map(|(owner, who)| Command::Resume {
            owner,
            identity: format!("id{who}"),
        }),
    ]
}

/// Commands with the time each is applied at: mostly forward, sometimes
/// standing still, sometimes a stamp from behind (the table keeps its time).
/// One command in a hundred is a Close, after which Locks are refused.
fn stream() -> impl Strategy<Value = Vec<(Command, Time)>> {
    let step = (
        command(),
        prop_oneof![4 => 0u64..1_500_000, 1 => Just(0u64)],
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.01),
    );
    prop::collection::vec(step, 1..150).prop_map(|steps| {
        let mut now = 1_000_000u64;
        steps
            .into_iter()
            .map(|(cmd, dt, behind, close)| {
                now += dt;
                let at = if behind { now - 500_000 } else { now };
                let cmd = if close { Command::Close } else { cmd };
                (cmd, Time::from_micros(at))
            })
            .collect()
    })
}

/// A snapshot through MessagePack (fields by name, as the cluster writes
/// it) and back, as a replica would receive it.
fn through_the_wire(s: &Snapshot) -> Snapshot {
    let bytes = rmp_serde::to_vec_named(s).expect("a snapshot serialises");
    rmp_serde::from_slice(&bytes).expect("a snapshot deserialises")
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES runs more (docs/RELIABILITY.md).
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn same_commands_give_same_outputs_and_state(
        stream in stream(),
        cut in any::<prop::sample::Index>(),
        sessions in any::<bool>(),
    ) {
        // A cluster's table (owners are sessions with a TTL) or a single
        // server's (owners are connections).
        let new = if sessions { LockTable::with_sessions } else { LockTable::new };
        let mut a = new(limits(), 1);
        let mut b = new(limits(), 1);
        let cut = cut.index(stream.len());
        let mut c = None;
        for (i, (cmd, at)) in stream.iter().enumerate() {
            if i == cut {
                let snapshot = a.snapshot();
                let received = through_the_wire(&snapshot);
                prop_assert_eq!(&received, &snapshot);
                let restored = LockTable::restore(received).expect("a table's snapshot restores");
                prop_assert_eq!(restored.snapshot(), snapshot.clone());
                // Written straight from the table, as the cluster streams
                // it to its snapshot file; the copy goes on from there.
                let streamed = rmp_serde::to_vec_named(&a.snapshot_view()).expect("a view serialises");
                let read: Snapshot = rmp_serde::from_slice(&streamed).expect("a view reads as a snapshot");
                let restored = LockTable::restore(read).expect("a streamed snapshot restores");
                prop_assert_eq!(restored.snapshot(), snapshot.clone());
                // Loaded straight into the table's structures, as a node
                // reads its snapshot file.
                let loaded: LoadedSnapshot = rmp_serde::from_slice(&streamed).expect("a view loads");
                let restored = LockTable::restore_loaded(loaded).expect("a loaded snapshot restores");
                prop_assert_eq!(restored.snapshot(), snapshot);
                c = Some(restored);
            }
            let out = a.apply(cmd.clone(), *at);
            prop_assert_eq!(&b.apply(cmd.clone(), *at), &out, "step {}: {:?}", i, cmd);
            if let Some(c) = &mut c {
                prop_assert_eq!(&c.apply(cmd.clone(), *at), &out, "restored, step {}", i);
            }
            if let Err(e) = a.check_invariants() {
                panic!("invariant broken after {cmd:?}: {e}");
            }
            if let Command::Sequenced { seq: seq @ 1.., done, .. } = cmd {
                // The same numbered command at once again, as a client
                // sends it after a reconnect: answered as the first time,
                // and nothing held, waiting or issued changes.
                let before = (a.held_keys(), a.waiting(), a.next_fence());
                let again = a.apply(cmd.clone(), *at);
                prop_assert_eq!(&b.apply(cmd.clone(), *at), &again);
                if let Some(c) = &mut c {
                    prop_assert_eq!(&c.apply(cmd.clone(), *at), &again);
                }
                prop_assert_eq!((a.held_keys(), a.waiting(), a.next_fence()), before);
                prop_assert!(again.woken.is_empty() && again.withdrawn.is_empty());
                if seq > done {
                    prop_assert_eq!(&again.reply, &out.reply, "step {}: {:?}", i, cmd);
                }
            }
        }
        let end = a.snapshot();
        prop_assert_eq!(&b.snapshot(), &end);
        prop_assert_eq!(&c.expect("cut is within the stream").snapshot(), &end);
    }
}

fn lock(t: &mut LockTable, owner: u64, names: &[&str], wait: WaitLimit) -> LockResult {
    let cmd = Command::Lock {
        owner,
        keys: names.iter().map(|k| Key::from(*k)).collect(),
        sharing: Sharing::exclusive(),
        wait,
        lease: None,
        value: Vec::new(),
    };
    match t.apply(cmd, Time::ZERO).reply {
        Reply::Lock(r) => r,
        other => panic!("{other:?}"),
    }
}

/// The bug this file was written for: an owner's keys held without a lease
/// were released on disconnect in hash order, so which waiter got which
/// token changed from one table to the next.
#[test]
fn a_disconnect_hands_tokens_to_waiters_the_same_way_every_time() {
    let names = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let mut first: Option<Output> = None;
    for _ in 0..50 {
        let mut t = LockTable::new(limits_for(names.len()), 1);
        assert!(matches!(
            lock(&mut t, 1, &names, WaitLimit::No),
            LockResult::Granted { .. }
        ));
        // Waiters arrive in the reverse of key order, one key each.
        for (i, k) in names.iter().rev().enumerate() {
            let owner = 10 + i as u64;
            assert!(matches!(
                lock(&mut t, owner, &[k], WaitLimit::Forever),
                LockResult::Waiting(_)
            ));
        }
        let out = t.apply(Command::Disconnect { owner: 1 }, Time::ZERO);
        let granted: Vec<(u64, u64)> = out
            .woken
            .iter()
            .map(|w| match w.wake {
                WaitOutcome::Granted { fence } => (w.owner, fence),
                ref other => panic!("{other:?}"),
            })
            .collect();
        // Arrival order: the first waiter gets the lowest token.
        let expect: Vec<(u64, u64)> = (0..names.len() as u64).map(|i| (10 + i, 2 + i)).collect();
        assert_eq!(granted, expect);
        match &first {
            None => first = Some(out),
            Some(f) => assert_eq!(&out, f),
        }
    }
}

fn limits_for(n: usize) -> TableLimits {
    TableLimits {
        max_waiters: n,
        max_held_keys: n,
    }
}

#[test]
fn a_snapshot_keeps_stale_deadlines_and_the_time() {
    let mut t = LockTable::new(limits(), 5);
    let lease = Duration::from_secs(10);
    let cmd = Command::Lock {
        owner: 1,
        keys: vec![Key::from("a"), Key::from("b")],
        sharing: Sharing::exclusive(),
        wait: WaitLimit::No,
        lease: Some(lease),
        value: Vec::new(),
    };
    t.apply(cmd, Time::from_micros(1));
    for i in 0..100 {
        let renew = Command::Renew {
            owner: 1,
            keys: vec![Key::from("a")],
            fence: None,
            lease,
        };
        t.apply(renew, Time::from_micros(2 + i));
    }
    let entries = t.deadline_entries();
    assert!(entries > 2, "stale entries are kept until compaction");
    let mut r = LockTable::restore(through_the_wire(&t.snapshot())).unwrap();
    assert_eq!(r.deadline_entries(), entries);
    assert_eq!(r.next_fence(), 6);
    // A command stamped before the snapshot's time runs at that time.
    let late = Time::from_micros(2 + 99);
    let out = r.apply(Command::Advance, Time::ZERO);
    assert_eq!(out, t.apply(Command::Advance, Time::ZERO));
    assert_eq!(r.snapshot(), t.snapshot());
    let view = r.inspect("a", late);
    assert_eq!(view.lease_remaining, Some(lease));
}

#[test]
fn a_damaged_snapshot_is_refused() {
    let mut t = LockTable::new(limits(), 1);
    lock(&mut t, 1, &["a"], WaitLimit::No);
    lock(&mut t, 2, &["a"], WaitLimit::Forever);
    let good = serde_json::to_value(t.snapshot()).unwrap();
    let mut no_owner = good.clone();
    no_owner["owners"] = serde_json::json!([]);
    let mut no_fence = good.clone();
    no_fence["next_fence"] = serde_json::json!(0);
    let mut old_fence = good.clone();
    old_fence["next_fence"] = serde_json::json!(1);
    for bad in [no_owner, no_fence, old_fence] {
        let s: Snapshot = serde_json::from_value(bad.clone()).unwrap();
        assert!(LockTable::restore(s).is_err());
        let loaded: LoadedSnapshot = serde_json::from_value(bad).unwrap();
        assert!(LockTable::restore_loaded(loaded).is_err());
    }
    // A key both held and shared is refused while it is being read.
    let mut both = good;
    both["slots"][0]["shared"] =
        serde_json::json!({"limit": 0, "holders": {"9": both["slots"][0]["hold"]}});
    let refused = serde_json::from_value::<LoadedSnapshot>(both).err();
    assert!(
        refused.is_some_and(|e| e.to_string().contains("both exclusively and shared")),
        "a key held both ways loaded"
    );
}
