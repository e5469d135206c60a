//! The whole table as plain data, and the table rebuilt from it.
//!
//! A [`Snapshot`] is what a replica needs to continue from where the table
//! stood: a restored table given the same commands returns the same outputs
//! and reaches the same next snapshot. It therefore keeps what outputs can
//! depend on, beyond who holds and waits for what: the key slots (holes and
//! free list included), since lease deadlines name keys by slot and ties
//! between equal deadlines break by slot; the deadline heaps' entries, stale
//! ones included, since their number decides when a heap is compacted; the
//! next fencing token and request id; the latest time seen; the limits; and
//! whether the table is closed. Shared holds and the sharing of waiting
//! requests are fields that older snapshots lack and load as none. Every collection is written in a fixed
//! order, so equal tables give equal snapshots.

use super::chunks::Chunks;
use super::deadlines::{Deadlines, LeaseEntry, TimeoutEntry};
use super::mode::{Holds, SharedHolds};
use super::sessions::Sessions;
use super::takers::Takers;
use super::{
    Hold, Key, KeyState, LockTable, Mode, OwnerId, OwnerState, ReqId, TableLimits, Time, Waiter,
};
use crate::table::keymap::{FrozenSlots, KeyMap, Slot};
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::{Error as _, SerializeSeq, SerializeStruct};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::Cell;
use std::collections::BTreeMap;

/// The state of a [`LockTable`], serialisable with serde. See the module
/// documentation for what it keeps and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    limits: TableLimits,
    now: Time,
    closed: bool,
    next_fence: u64,
    next_req: ReqId,
    /// Key slots in slot order; `None` for a free slot.
    slots: Vec<Option<KeySnapshot>>,
    /// Free slots in the order they will be reused (last first).
    free_slots: Vec<Slot>,
    /// Waiting requests in request order.
    waiters: Vec<(ReqId, Waiter)>,
    /// Owners with state, in id order.
    owners: Vec<(OwnerId, OwnerState)>,
    /// Lease deadline entries, sorted.
    leases: Vec<LeaseEntry>,
    /// Wait-limit entries, sorted.
    timeouts: Vec<TimeoutEntry>,
    /// Sessions, when the table has them.
    #[serde(default)]
    sessions: Sessions,
    /// Who took each grant (access control by fence); absent from older
    /// snapshots and from tables without access control.
    #[serde(default, skip_serializing_if = "Takers::is_empty")]
    takers: Takers,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KeySnapshot {
    key: Key,
    /// The exclusive holder.
    hold: Option<Hold>,
    /// The shared holders; absent from older snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shared: Option<SharedHolds>,
    /// Waiting requests, earliest first.
    queue: Vec<ReqId>,
}

/// The table's state written as a [`Snapshot`] is, straight from the
/// table or from a [`FrozenTable`]: a [`Snapshot`] deserialises from what
/// it serialises. It copies nothing, so a large table can be streamed to a
/// file without a second copy of it in memory. Deadline entries come in the
/// heaps' own order rather than sorted, which restores the same table
/// (entries surface by value, see `deadlines`).
pub struct SnapshotView<'a> {
    limits: TableLimits,
    now: Time,
    closed: bool,
    next_fence: u64,
    next_req: ReqId,
    slots: &'a Chunks<Option<(Key, KeyState)>>,
    free_slots: &'a Chunks<Slot>,
    waiters: &'a BTreeMap<ReqId, Waiter>,
    owners: &'a BTreeMap<OwnerId, OwnerState>,
    deadlines: &'a Deadlines,
    sessions: &'a Sessions,
    takers: &'a Takers,
}

/// The view of a table or a frozen copy of one: both keep the same fields
/// under the same names, and only the key slots' type differs.
macro_rules! view_of {
    ($t:expr) => {
        SnapshotView {
            limits: $t.limits,
            now: $t.now,
            closed: $t.closed,
            next_fence: $t.next_fence,
            next_req: $t.next_req,
            slots: $t.keys.slots(),
            free_slots: $t.keys.free_slots(),
            waiters: &$t.waiters,
            owners: &$t.owners,
            deadlines: &$t.deadlines,
            sessions: &$t.sessions,
            takers: &$t.takers,
        }
    };
}

/// The table's state at one instant, kept apart from the table, which may
/// change meanwhile: what a node encodes into a snapshot after releasing
/// the table's lock. Taking it ([`LockTable::freeze`]) copies a pointer per
/// chunk of key slots and of lease entries (about a thousand at 1,000,000
/// keys) and clones the maps that grow with waiters, owners and sessions,
/// not with held keys: of a key held without a lease its owner keeps the
/// name, and with access control the fence's taker keeps the names too.
/// Writes to the table after it copy the chunks they land in, once.
#[derive(Debug)]
pub struct FrozenTable {
    limits: TableLimits,
    now: Time,
    closed: bool,
    next_fence: u64,
    next_req: ReqId,
    keys: FrozenSlots<KeyState>,
    waiters: BTreeMap<ReqId, Waiter>,
    owners: BTreeMap<OwnerId, OwnerState>,
    deadlines: Deadlines,
    sessions: Sessions,
    takers: Takers,
}

impl FrozenTable {
    /// The state as a snapshot writes it.
    pub fn view(&self) -> SnapshotView<'_> {
        view_of!(self)
    }
}

/// One key slot as [`KeySnapshot`] writes it.
#[derive(Serialize)]
#[serde(bound(serialize = ""))]
struct KeyView<'a, Q: Iterator<Item = &'a ReqId>> {
    key: &'a Key,
    hold: Option<Hold>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shared: Option<SharedHolds>,
    queue: Seq<Q>,
}

/// A sequence written from an iterator of known length, once.
struct Seq<I>(Cell<Option<(usize, I)>>);

impl<I> Seq<I> {
    fn new(len: usize, items: I) -> Self {
        Seq(Cell::new(Some((len, items))))
    }
}

impl<I> Serialize for Seq<I>
where
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (len, items) = self
            .0
            .take()
            .ok_or_else(|| S::Error::custom("a snapshot sequence written twice"))?;
        // The length up front: a writer that does not know it (MessagePack)
        // would otherwise buffer the whole sequence.
        let mut seq = s.serialize_seq(Some(len))?;
        let mut written = 0;
        for item in items {
            seq.serialize_element(&item)?;
            written += 1;
        }
        if written != len {
            return Err(S::Error::custom("a snapshot sequence changed length"));
        }
        seq.end()
    }
}

impl Serialize for SnapshotView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self;
        let slots = t.slots;
        let (leases, timeouts) = t.deadlines.iter();
        let (lease_count, timeout_count) = t.deadlines.counts();
        let takers = !t.takers.is_empty();
        // Field for field as `Snapshot` derives it, names and order alike.
        let mut st = s.serialize_struct("Snapshot", 12 + usize::from(takers))?;
        st.serialize_field("limits", &t.limits)?;
        st.serialize_field("now", &t.now)?;
        st.serialize_field("closed", &t.closed)?;
        st.serialize_field("next_fence", &t.next_fence)?;
        st.serialize_field("next_req", &t.next_req)?;
        let keys = slots.iter().map(|e| {
            e.as_ref().map(|(key, state)| {
                let (hold, shared) = state.holds.to_parts();
                KeyView {
                    key,
                    hold,
                    shared,
                    queue: Seq::new(state.queue.len(), state.queue.iter()),
                }
            })
        });
        st.serialize_field("slots", &Seq::new(slots.len(), keys))?;
        // As a slice would be: a sequence of known length.
        let free = t.free_slots;
        st.serialize_field("free_slots", &Seq::new(free.len(), free.iter()))?;
        st.serialize_field("waiters", &Seq::new(t.waiters.len(), t.waiters.iter()))?;
        st.serialize_field("owners", &Seq::new(t.owners.len(), t.owners.iter()))?;
        st.serialize_field("leases", &Seq::new(lease_count, leases))?;
        st.serialize_field("timeouts", &Seq::new(timeout_count, timeouts))?;
        st.serialize_field("sessions", &t.sessions)?;
        if takers {
            st.serialize_field("takers", &t.takers)?;
        } else {
            st.skip_field("takers")?;
        }
        st.end()
    }
}

/// A snapshot that no table could have produced.
#[derive(Debug, thiserror::Error)]
#[error("inconsistent lock table snapshot: {0}")]
pub struct BadSnapshot(String);

impl LockTable {
    /// The table's whole state, ready to serialise without a copy; see
    /// [`SnapshotView`].
    pub fn snapshot_view(&self) -> SnapshotView<'_> {
        view_of!(self)
    }

    /// The table's state now, to encode while the table goes on changing;
    /// see [`FrozenTable`] for what that costs.
    pub fn freeze(&self) -> FrozenTable {
        FrozenTable {
            limits: self.limits,
            now: self.now,
            closed: self.closed,
            next_fence: self.next_fence,
            next_req: self.next_req,
            keys: self.keys.frozen(),
            waiters: self.waiters.clone(),
            owners: self.owners.clone(),
            deadlines: self.deadlines.clone(),
            sessions: self.sessions.clone(),
            takers: self.takers.clone(),
        }
    }

    /// The table's whole state as data.
    pub fn snapshot(&self) -> Snapshot {
        let (leases, timeouts) = self.deadlines.entries();
        Snapshot {
            limits: self.limits,
            now: self.now,
            closed: self.closed,
            next_fence: self.next_fence,
            next_req: self.next_req,
            slots: self
                .keys
                .slots()
                .iter()
                .map(|e: &Option<(Key, KeyState)>| {
                    e.as_ref().map(|(key, s)| {
                        let (hold, shared) = s.holds.to_parts();
                        KeySnapshot {
                            key: key.clone(),
                            hold,
                            shared,
                            queue: s.queue.iter().copied().collect(),
                        }
                    })
                })
                .collect(),
            free_slots: self.keys.free_slots().iter().copied().collect(),
            waiters: self.waiters.iter().map(|(r, w)| (*r, w.clone())).collect(),
            owners: self.owners.iter().map(|(o, s)| (*o, s.clone())).collect(),
            leases,
            timeouts,
            sessions: self.sessions.clone(),
            takers: self.takers.clone(),
        }
    }

    /// The table a snapshot was taken of.
    ///
    /// # Errors
    /// The snapshot breaks one of the table's invariants (it was not taken
    /// from a table, or was damaged on the way); the message names it.
    pub fn restore(snapshot: Snapshot) -> Result<LockTable, BadSnapshot> {
        let Snapshot {
            limits,
            now,
            closed,
            next_fence,
            next_req,
            slots,
            free_slots,
            waiters,
            owners,
            leases,
            timeouts,
            sessions,
            takers,
        } = snapshot;
        let slots = slots
            .into_iter()
            .map(|e| e.map(load_slot).transpose())
            .collect::<Result<_, String>>()
            .map_err(BadSnapshot)?;
        LockTable::restore_loaded(LoadedSnapshot {
            limits,
            now,
            closed,
            next_fence,
            next_req,
            slots: LoadedSlots(slots),
            free_slots,
            waiters,
            owners,
            leases,
            timeouts,
            sessions,
            takers,
        })
    }

    /// The table a snapshot read as a [`LoadedSnapshot`] was taken of.
    ///
    /// # Errors
    /// As [`LockTable::restore`].
    pub fn restore_loaded(snapshot: LoadedSnapshot) -> Result<LockTable, BadSnapshot> {
        let LoadedSnapshot {
            limits,
            now,
            closed,
            next_fence,
            next_req,
            slots: LoadedSlots(mut slots),
            free_slots,
            waiters,
            owners,
            leases,
            timeouts,
            sessions,
            takers,
        } = snapshot;
        if next_fence == 0 {
            return Err(BadSnapshot("next fence is 0, which means no token".into()));
        }
        // No table starts past it (a fence file there is refused too), so a
        // higher one is damage, and going on from it could wrap.
        if next_fence > super::MAX_NEXT_FENCE {
            return Err(BadSnapshot(format!(
                "next fence {next_fence} is past the lower half of the token range"
            )));
        }
        let (waiter_count, owner_count) = (waiters.len(), owners.len());
        let waiters: BTreeMap<_, _> = waiters.into_iter().collect();
        let owners: BTreeMap<_, _> = owners.into_iter().collect();
        if waiters.len() != waiter_count || owners.len() != owner_count {
            return Err(BadSnapshot("a request or owner is listed twice".into()));
        }
        let mut held_keys = 0;
        let mut live_leases = 0;
        for slot in 0..slots.len() {
            let Some(Some((key, state))) = slots.get_mut(slot) else {
                continue;
            };
            held_keys += state.holds.count();
            live_leases += state.holds.iter().filter(|h| h.lease.is_some()).count();
            if !state.queue.is_empty() {
                // The waiters come after the slots, so the modes are set
                // now. A request missing from the waiters fails the
                // invariants below; its mode here does not matter.
                state.queue = state
                    .queue
                    .iter()
                    .map(|r| (*r, waiters.get(r).map_or(Mode::Exclusive, |w| w.mode(key))))
                    .collect();
            }
        }
        let keys = KeyMap::from_parts(slots, free_slots).map_err(BadSnapshot)?;
        let table = LockTable {
            limits,
            now,
            closed,
            keys,
            waiters,
            owners,
            deadlines: Deadlines::from_entries(leases, timeouts),
            live_leases,
            held_keys,
            next_fence,
            next_req,
            sessions,
            takers,
        };
        table.check_invariants().map_err(BadSnapshot)?;
        Ok(table)
    }
}

/// A key slot in the table's own form; its queue's modes are set once the
/// waiters are known (see [`LockTable::restore_loaded`]).
fn load_slot(k: KeySnapshot) -> Result<(Key, KeyState), String> {
    let holds = Holds::from_parts(k.hold, k.shared)?;
    let queue = k.queue.into_iter().map(|r| (r, Mode::Exclusive)).collect();
    Ok((k.key, KeyState { holds, queue }))
}

/// A [`Snapshot`] deserialised straight into the table's own structures,
/// each key converted as it is read: what [`LockTable::restore_loaded`]
/// takes. It reads what a [`Snapshot`] or a [`SnapshotView`] writes, and
/// spares the intermediate copy of every key that a [`Snapshot`] holds
/// (about 230 B a key), which is what loading a large snapshot would
/// otherwise cost beside the table being built.
#[derive(Deserialize)]
pub struct LoadedSnapshot {
    limits: TableLimits,
    now: Time,
    closed: bool,
    next_fence: u64,
    next_req: ReqId,
    slots: LoadedSlots,
    free_slots: Vec<Slot>,
    waiters: Vec<(ReqId, Waiter)>,
    owners: Vec<(OwnerId, OwnerState)>,
    leases: Vec<LeaseEntry>,
    timeouts: Vec<TimeoutEntry>,
    #[serde(default)]
    sessions: Sessions,
    #[serde(default)]
    takers: Takers,
}

/// Key slots as the table keeps them.
struct LoadedSlots(Chunks<Option<(Key, KeyState)>>);

impl<'de> Deserialize<'de> for LoadedSlots {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Slots;
        impl<'de> Visitor<'de> for Slots {
            type Value = LoadedSlots;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of key slots")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LoadedSlots, A::Error> {
                // Straight into the table's chunks, which grow a chunk at a
                // time: a damaged length reserves nothing, and no second
                // copy of the slots is made when the table takes them.
                let mut slots = Chunks::default();
                while let Some(slot) = seq.next_element::<Option<KeySnapshot>>()? {
                    slots.push(slot.map(load_slot).transpose().map_err(A::Error::custom)?);
                }
                Ok(LoadedSlots(slots))
            }
        }
        d.deserialize_seq(Slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Command, Sharing, TableLimits, WaitLimit};
    use std::time::Duration;

    fn at(micros: u64) -> Time {
        Time::from_micros(micros)
    }

    fn lock(owner: OwnerId, keys: &[String], lease: Option<u64>, wait: WaitLimit) -> Command {
        Command::Lock {
            owner,
            keys: keys.iter().map(|k| k.as_str().into()).collect(),
            sharing: Sharing::exclusive(),
            wait,
            lease: lease.map(Duration::from_secs),
            value: if owner.is_multiple_of(3) {
                b"v".to_vec()
            } else {
                Vec::new()
            },
        }
    }

    /// A table over several chunks of slots and lease entries (a chunk is
    /// 1,024), with holes in its slots, stale lease entries, keys held
    /// without a lease, shared holds and waiters with wait limits.
    fn busy_table() -> LockTable {
        let limits = TableLimits {
            max_waiters: 10_000,
            max_held_keys: 10_000,
        };
        let mut t = LockTable::new(limits, 7);
        let key = |i: u64| vec![format!("key/{i}")];
        for i in 0..3_000 {
            let lease = (i % 4 != 0).then_some(60 + i % 7);
            t.apply(lock(1 + i % 5, &key(i), lease, WaitLimit::No), at(i));
        }
        for i in (0..3_000).step_by(11) {
            let unlock = Command::Unlock {
                owner: 1 + i % 5,
                keys: key(i).iter().map(|k| k.as_str().into()).collect(),
                fence: None,
            };
            t.apply(unlock, at(3_000 + i));
        }
        for i in (1..3_000).step_by(13) {
            let renew = Command::Renew {
                owner: 1 + i % 5,
                keys: key(i).iter().map(|k| k.as_str().into()).collect(),
                fence: None,
                lease: Duration::from_secs(90),
            };
            t.apply(renew, at(6_000 + i));
        }
        for i in (2..600).step_by(17) {
            let wait = WaitLimit::For(Duration::from_secs(30));
            t.apply(lock(100 + i, &key(i), None, wait), at(9_000 + i));
        }
        for owner in [200, 201] {
            let shared = Command::Lock {
                owner,
                keys: vec!["shared".into()],
                sharing: Sharing::all(&["shared".into()], 0),
                wait: WaitLimit::No,
                lease: Some(Duration::from_secs(5)),
                value: Vec::new(),
            };
            t.apply(shared, at(10_000));
        }
        t.check_invariants().expect("a consistent table");
        t
    }

    /// Writes to the table that touch every chunk: unlocks, renewals (lease
    /// entries pushed), new keys (slots reused and added), expiries (lease
    /// entries popped), a disconnect.
    fn churn(t: &mut LockTable, from: u64) {
        let key = |i: u64| vec![format!("key/{i}")];
        for i in (0..3_000).step_by(3) {
            let unlock = Command::Unlock {
                owner: 1 + i % 5,
                keys: key(i).iter().map(|k| k.as_str().into()).collect(),
                fence: None,
            };
            t.apply(unlock, at(from + i));
        }
        for i in 3_000..4_500 {
            t.apply(
                lock(1 + i % 5, &key(i), Some(61), WaitLimit::No),
                at(from + i),
            );
        }
        t.apply(Command::Disconnect { owner: 2 }, at(from + 5_000));
        t.apply(Command::Advance, at(from + 70_000_000));
    }

    fn encoded(view: &SnapshotView) -> Vec<u8> {
        rmp_serde::to_vec_named(view).expect("a table encodes")
    }

    #[test]
    fn a_frozen_table_encodes_as_the_table_did_when_frozen_whatever_it_did_since() {
        let mut t = busy_table();
        let then = encoded(&t.snapshot_view());
        let then_data = t.snapshot();
        let frozen = t.freeze();
        assert_eq!(encoded(&frozen.view()), then, "the same bytes at once");
        churn(&mut t, 20_000);
        assert_ne!(t.snapshot(), then_data, "the table did change");
        assert_eq!(encoded(&frozen.view()), then, "and the frozen one did not");
        // What it encodes is the table as it was: it reads back to it.
        let loaded: LoadedSnapshot = rmp_serde::from_slice(&then).expect("decodes");
        let restored = LockTable::restore_loaded(loaded).expect("restores");
        assert_eq!(restored.snapshot(), then_data);
        // The table goes on as usual, and is the same as a table that never
        // had a frozen copy taken.
        t.check_invariants().expect("still consistent");
        let mut plain = busy_table();
        churn(&mut plain, 20_000);
        assert_eq!(t.snapshot(), plain.snapshot());
        drop(frozen);
        churn(&mut t, 100_000_000);
        churn(&mut plain, 100_000_000);
        assert_eq!(t.snapshot(), plain.snapshot());
    }

    #[test]
    fn writes_while_a_frozen_table_is_encoded_do_not_reach_the_snapshot() {
        let mut t = busy_table();
        let then = encoded(&t.snapshot_view());
        let frozen = t.freeze();
        // Encoded on another thread while this one writes, as a node does
        // once it has released the table's lock.
        let encoder = std::thread::spawn(move || {
            (0..20).map(|_| encoded(&frozen.view())).collect::<Vec<_>>()
        });
        for round in 0..5 {
            churn(&mut t, 20_000 + round * 200_000_000);
        }
        for bytes in encoder.join().expect("the encoder finished") {
            assert!(
                bytes == then,
                "an encoding saw a write made after the freeze"
            );
        }
    }

    #[test]
    fn the_view_writes_what_a_snapshot_writes() {
        // The streamed view and the plain `Snapshot` give the same data
        // (the view's deadline entries in the heaps' order, which restores
        // the same table), so files of either kind read alike.
        let t = busy_table();
        let from_view: Snapshot =
            rmp_serde::from_slice(&encoded(&t.snapshot_view())).expect("decodes");
        let restored = LockTable::restore(from_view).expect("restores");
        assert_eq!(restored.snapshot(), t.snapshot());
        let json_view = serde_json::to_value(t.freeze().view()).expect("encodes");
        let mut json_plain = serde_json::to_value(t.snapshot()).expect("encodes");
        for field in ["leases", "timeouts"] {
            let sort = |v: &mut serde_json::Value| {
                if let Some(a) = v.get_mut(field).and_then(|a| a.as_array_mut()) {
                    a.sort_by_key(|e| e.to_string());
                }
            };
            let mut view = json_view.clone();
            sort(&mut view);
            sort(&mut json_plain);
            assert_eq!(view.get(field), json_plain.get(field), "{field}");
        }
        let mut view = json_view;
        for field in ["leases", "timeouts"] {
            view[field] = serde_json::Value::Null;
            json_plain[field] = serde_json::Value::Null;
        }
        assert_eq!(view, json_plain);
    }

    #[test]
    fn a_next_fence_of_zero_or_past_half_the_range_is_damage() {
        let limits = TableLimits {
            max_waiters: 10,
            max_held_keys: 10,
        };
        let first = |fence| LockTable::new(limits, fence).snapshot();
        assert!(LockTable::restore(first(crate::table::MAX_NEXT_FENCE)).is_ok());
        let err = LockTable::restore(first(crate::table::MAX_NEXT_FENCE + 1)).expect_err("refused");
        assert!(err.to_string().contains("lower half"), "{err}");
        let mut zero = first(1);
        zero.next_fence = 0;
        assert!(LockTable::restore(zero).is_err());
    }
}
