//! The lock table's map from key names to their state, laid out for
//! millions of held keys.
//!
//! Entries live in a dense vector of slots whose indices never change while
//! the key exists, and a hash index maps names to slot numbers (4 bytes a
//! bucket). A `HashMap<Key, State>` would size its buckets for the whole
//! entry and round up to a power of two, so at a million keys most of its
//! memory would be empty buckets. Stable slot numbers also let the lease
//! heap name a key with 4 bytes instead of a pointer to its name.
//!
//! The slots are kept in shared chunks (`chunks::Chunks`), so a snapshot copies
//! them in microseconds under the lock and encodes them after it; the hash
//! index is never copied (a snapshot has no use for it).

use super::chunks::Chunks;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// A lock name. Names of up to 23 bytes (most: paths, host names, job
/// ids) live inline, without an allocation; longer ones behind a shared
/// pointer, so a copy in a queue or a waiter is a reference count, not a
/// new string. It lives here, with the map that owns the names, so the
/// table depends on the map and not both ways.
pub type Key = smol_str::SmolStr;

/// A slot number: where a key's entry lives for as long as the key does.
pub type Slot = u32;

/// Key names to values; see the module documentation.
#[derive(Debug)]
pub struct KeyMap<V> {
    slots: Chunks<Option<(Key, V)>>,
    /// Empty slots, reused before the vector grows.
    free: Chunks<Slot>,
    index: HashTable<Slot>,
    /// SipHash with a random key: names come from clients, so collisions
    /// must not be something they can choose.
    hasher: std::collections::hash_map::RandomState,
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            slots: Chunks::default(),
            free: Chunks::default(),
            index: HashTable::new(),
            hasher: Default::default(),
        }
    }
}

/// The slots of a [`KeyMap`] at one instant, apart from the map: what a
/// snapshot encodes once the map has moved on. Taking them copies a pointer
/// per chunk of slots; see [`KeyMap::frozen`].
#[derive(Debug)]
pub struct FrozenSlots<V> {
    slots: Chunks<Option<(Key, V)>>,
    free: Chunks<Slot>,
}

impl<V> FrozenSlots<V> {
    /// Every slot, empty ones included, in slot order.
    pub fn slots(&self) -> &Chunks<Option<(Key, V)>> {
        &self.slots
    }

    /// Empty slots, in the reverse of the order they will be reused.
    pub fn free_slots(&self) -> &Chunks<Slot> {
        &self.free
    }
}

impl<V> KeyMap<V> {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn find(&self, key: &str) -> Option<Slot> {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        self.index
            .find(hash, |&s| {
                slots
                    .get(s as usize)
                    .and_then(|e| e.as_ref())
                    .is_some_and(|(k, _)| &**k == key)
            })
            .copied()
    }

    /// The slot of `key`, if present.
    pub fn slot(&self, key: &str) -> Option<Slot> {
        self.find(key)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.find(key).and_then(|s| self.at(s)).map(|(_, v)| v)
    }

    /// The value of `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V>
    where
        V: Clone,
    {
        let s = self.find(key)?;
        self.at_mut(s)
    }

    /// The entry in `slot`, if one is there.
    pub fn at(&self, slot: Slot) -> Option<(&Key, &V)> {
        self.slots
            .get(slot as usize)
            .and_then(|e| e.as_ref())
            .map(|(k, v)| (k, v))
    }

    /// The value in `slot`, mutably.
    pub fn at_mut(&mut self, slot: Slot) -> Option<&mut V>
    where
        V: Clone,
    {
        self.slots
            .get_mut(slot as usize)
            .and_then(|e| e.as_mut())
            .map(|(_, v)| v)
    }

    /// The value of `key`, inserted with `V::default()` if absent, and its
    /// slot.
    pub fn get_or_default(&mut self, key: &Key) -> (Slot, &mut V)
    where
        V: Default + Clone,
    {
        let slot = match self.find(key) {
            Some(s) => s,
            None => {
                let slot = self.free.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    // Slot::MAX would alias a live entry and corrupt the
                    // table, so running out of slot numbers must stop here.
                    Slot::try_from(self.slots.len() - 1).expect(
                        "the table's limits on held keys and waiters keep slots far below 2^32",
                    )
                });
                // Indexed before it is filled: growing the index rehashes
                // only the entries already in it.
                let hash = self.hasher.hash_one(&**key);
                let (slots, hasher) = (&self.slots, &self.hasher);
                self.index.insert_unique(hash, slot, |&s| {
                    slots
                        .get(s as usize)
                        .and_then(|e| e.as_ref())
                        .map_or(0, |(k, _)| hasher.hash_one(&**k))
                });
                slot
            }
        };
        let (_, value) =
            self.slots[slot as usize].get_or_insert_with(|| (key.clone(), V::default()));
        (slot, value)
    }

    /// Removes `key` and frees its slot.
    pub fn remove(&mut self, key: &str) -> Option<V>
    where
        V: Clone,
    {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        let found = self.index.find_entry(hash, |&s| {
            slots
                .get(s as usize)
                .and_then(|e| e.as_ref())
                .is_some_and(|(k, _)| &**k == key)
        });
        let slot = match found {
            Ok(entry) => entry.remove().0,
            Err(_) => return None,
        };
        let (_, v) = self.slots[slot as usize].take()?;
        if slot as usize + 1 == self.slots.len() {
            self.slots.pop();
        } else {
            self.free.push(slot);
        }
        if self.index.is_empty() {
            // Give back the memory of a burst once it is over.
            self.slots = Chunks::default();
            self.free = Chunks::default();
            self.index = HashTable::new();
        }
        Some(v)
    }

    /// Every entry with its slot, in slot order. Slot order depends only on
    /// the sequence of inserts and removes, never on hashing, so walking it
    /// is deterministic.
    pub fn iter_slots(&self) -> impl Iterator<Item = (Slot, &Key, &V)> {
        (0..)
            .zip(self.slots.iter())
            .filter_map(|(s, e)| e.as_ref().map(|(k, v)| (s, k, v)))
    }

    /// Every slot, empty ones included, in slot order.
    pub fn slots(&self) -> &Chunks<Option<(Key, V)>> {
        &self.slots
    }

    /// Empty slots, in the reverse of the order they will be reused.
    pub fn free_slots(&self) -> &Chunks<Slot> {
        &self.free
    }

    /// The slots as they are now, for a snapshot to encode while the map
    /// goes on changing: a pointer per chunk is copied, and a later write
    /// copies the chunk it lands in, once.
    pub fn frozen(&self) -> FrozenSlots<V> {
        FrozenSlots {
            slots: self.slots.clone(),
            free: self.free.clone(),
        }
    }

    /// The map whose [`KeyMap::slots`] and [`KeyMap::free_slots`] these are,
    /// with a fresh hash key: slot numbers are kept, so whatever names keys
    /// by slot stays valid.
    ///
    /// # Errors
    /// A key appears twice, or the free list is not exactly the empty slots.
    pub fn from_parts(slots: Chunks<Option<(Key, V)>>, free: Vec<Slot>) -> Result<Self, String>
    where
        V: Clone,
    {
        if Slot::try_from(slots.len()).is_err() {
            return Err(format!(
                "{} slots, more than a slot number can name",
                slots.len()
            ));
        }
        let mut empty: Vec<Slot> = (0..)
            .zip(slots.iter())
            .filter_map(|(s, e)| e.is_none().then_some(s))
            .collect();
        let mut listed = free.clone();
        listed.sort_unstable();
        empty.sort_unstable();
        if listed != empty {
            return Err("the free slot list is not the set of empty slots".into());
        }
        let mut map = KeyMap {
            // Taken as read, in chunks: a second copy of a million slots
            // beside the first would raise a restart's peak.
            slots,
            free: free.into_iter().collect(),
            ..KeyMap::default()
        };
        for slot in 0..map.slots.len() {
            let Some((key, _)) = &map.slots[slot] else {
                continue;
            };
            if map.find(key).is_some() {
                return Err(format!("key {key:?} is in two slots"));
            }
            let hash = map.hasher.hash_one(&**key);
            let (slots, hasher) = (&map.slots, &map.hasher);
            map.index.insert_unique(hash, slot as Slot, |&s| {
                slots
                    .get(s as usize)
                    .and_then(|e| e.as_ref())
                    .map_or(0, |(k, _)| hasher.hash_one(&**k))
            });
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_and_reused() {
        let mut m: KeyMap<u32> = KeyMap::default();
        let (a, va) = m.get_or_default(&Key::from("a"));
        *va = 1;
        let (b, _) = m.get_or_default(&Key::from("b"));
        let (c, _) = m.get_or_default(&Key::from("c"));
        assert_eq!(m.get_or_default(&Key::from("a")).0, a);
        assert_eq!(m.remove("b"), Some(0));
        assert_eq!(m.slot("c"), Some(c));
        assert_eq!(m.get("a"), Some(&1));
        assert!(m.get("b").is_none());
        assert_eq!(m.get_or_default(&Key::from("d")).0, b, "freed slot reused");
        assert_eq!(m.len(), 3);
        assert_eq!(m.iter_slots().count(), 3);
        for k in ["a", "c", "d"] {
            assert!(m.remove(k).is_some());
        }
        assert!(m.is_empty());
        assert_eq!(m.remove("a"), None);
    }

    #[test]
    fn parts_rebuild_the_same_slots() {
        let mut m: KeyMap<u32> = KeyMap::default();
        for (i, k) in ["a", "b", "c", "d"].into_iter().enumerate() {
            *m.get_or_default(&Key::from(k)).1 = i as u32;
        }
        m.remove("b");
        m.remove("a");
        let parts = (
            m.slots().iter().cloned().collect(),
            m.free_slots().iter().copied().collect(),
        );
        let copy = KeyMap::from_parts(parts.0, parts.1).unwrap();
        assert_eq!(copy.slot("c"), m.slot("c"));
        assert_eq!(copy.get("d"), Some(&3));
        let free: Vec<Slot> = copy.free_slots().iter().copied().collect();
        assert_eq!(free, [1, 0], "reused in the same order");
        let twice = [Some((Key::from("x"), 1)), Some((Key::from("x"), 2))];
        assert!(KeyMap::from_parts(twice.into_iter().collect(), vec![]).is_err());
        let unlisted = [None, Some((Key::from("x"), 1))];
        assert!(KeyMap::from_parts(unlisted.into_iter().collect(), vec![]).is_err());
    }
}
