//! A value per hold: what a holder says about itself (a leader's address,
//! its identity), set by the Lock that took the key and replaced by
//! Proclaim, and how long it has held. The table only stores and reports
//! it; its size is checked before a command is made (see `MAX_VALUE_LEN`).
//!
//! Observers of a key compare its [`FirstHolder`]: the holder with the
//! lowest token, the one that has held it longest (the only one of a key
//! held exclusively, such as an election's).

use super::{Key, LockTable, OwnerId};

/// Largest value, in bytes: a holder's identity or address, not data. A
/// Lock or Proclaim with a longer one is refused before it reaches the
/// table, so the table's memory per hold stays bounded.
pub const MAX_VALUE_LEN: usize = dlock_proto::MAX_VALUE_LEN;

/// The first holder of a key as an observer compares it: its token and its
/// value. `None` stands for a free key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstHolder {
    /// The token of its grant.
    pub fence: u64,
    /// Its value.
    pub value: Vec<u8>,
}

pub(super) fn is_empty(value: &[u8]) -> bool {
    value.is_empty()
}

/// A hold's value in the table. Most holds have none, and a million held
/// keys each pay for this field: one pointer, null when empty, instead of a
/// boxed slice's pointer and length. It encodes as the boxed slice it
/// replaced, so snapshots and log entries read the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct HoldValue(Option<Box<Box<[u8]>>>);

impl HoldValue {
    pub(super) fn as_slice(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], |b| &**b)
    }
}

impl std::ops::Deref for HoldValue {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<&[u8]> for HoldValue {
    fn from(value: &[u8]) -> Self {
        HoldValue((!value.is_empty()).then(|| Box::new(value.into())))
    }
}

impl From<Box<[u8]>> for HoldValue {
    fn from(value: Box<[u8]>) -> Self {
        HoldValue((!value.is_empty()).then(|| Box::new(value)))
    }
}

impl serde::Serialize for HoldValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for HoldValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<[u8]>::deserialize(d).map(HoldValue::from)
    }
}

impl FirstHolder {
    /// Whether this (or a free key, `None`) is what an observer says it
    /// knows: `fence` 0 and an empty value stand for a free key.
    pub fn is_known(this: Option<&FirstHolder>, fence: u64, value: &[u8]) -> bool {
        match this {
            None => fence == 0 && value.is_empty(),
            Some(h) => h.fence == fence && h.value == value,
        }
    }
}

impl LockTable {
    /// The first holder of `key`, if it is held: cheap enough to call for
    /// every watched key after every command (a lookup and, for a key held
    /// shared, the first entry of its token index).
    pub fn first_holder(&self, key: &str) -> Option<FirstHolder> {
        let hold = self.keys.get(key)?.holds.first()?;
        Some(FirstHolder {
            fence: hold.fence,
            value: hold.value.to_vec(),
        })
    }

    /// Sets the value of the named keys held by `owner` (or under `fence`);
    /// returns those not held, sorted.
    pub(super) fn proclaim(
        &mut self,
        owner: OwnerId,
        keys: Vec<Key>,
        fence: Option<u64>,
        value: &[u8],
    ) -> Vec<Key> {
        let mut not_held = Vec::new();
        for k in super::dedup(keys) {
            let holder = self.holding(&k, owner, fence);
            let set = match (holder, self.keys.get_mut(&k)) {
                (Some(holder), Some(state)) => state.holds.set_value(holder, value),
                _ => false,
            };
            if !set {
                not_held.push(k);
            }
        }
        not_held
    }
}

#[cfg(test)]
mod tests {
    use crate::table::{
        Command, Key, LockTable, Reply, Sharing, Snapshot, TableLimits, Time, WaitLimit,
    };
    use std::time::Duration;

    fn lock(owner: u64, key: &str, value: &[u8]) -> Command {
        Command::Lock {
            owner,
            keys: vec![Key::from(key)],
            sharing: Sharing::exclusive(),
            wait: WaitLimit::Forever,
            lease: Some(Duration::from_secs(5)),
            value: value.to_vec(),
        }
    }

    /// Removes every `"value"` and `"since"` member from a JSON tree: the
    /// encoding of a table written before holds had them.
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("value");
                m.remove("since");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }

    #[test]
    fn older_snapshots_and_commands_without_values_still_decode() {
        let limits = TableLimits {
            max_waiters: 10,
            max_held_keys: 10,
        };
        let mut t = LockTable::new(limits, 1);
        t.apply(lock(1, "a", b"v"), Time::from_micros(7));
        t.apply(lock(2, "a", b"w"), Time::from_micros(8));
        let mut json = serde_json::to_value(t.snapshot()).expect("encodes");
        strip(&mut json);
        let old: Snapshot = serde_json::from_value(json).expect("an older snapshot decodes");
        let restored = LockTable::restore(old).expect("restores");
        let first = restored.first_holder("a").expect("held");
        assert!(first.value.is_empty(), "an older hold has no value");
        assert_eq!(first.fence, t.first_holder("a").expect("held").fence);
        // A Lock without a value is encoded as before, and an older one
        // decodes to no value.
        let json = serde_json::to_string(&lock(3, "b", b"")).expect("encodes");
        assert!(!json.contains("value"), "{json}");
        let back: Command = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, lock(3, "b", b""));
        // The waiting Lock's value survives a snapshot round trip and is
        // given with the grant.
        let mut r = LockTable::restore(t.snapshot()).expect("restores");
        let out = r.apply(Command::Disconnect { owner: 1 }, Time::from_micros(9));
        assert!(out.woken.is_empty(), "a lease outlives its owner");
        let released = r.apply(
            Command::Unlock {
                owner: 0,
                keys: vec![Key::from("a")],
                fence: Some(first.fence),
            },
            Time::from_micros(10),
        );
        assert_eq!(released.reply, Reply::NotHeld(Vec::new()));
        assert_eq!(r.first_holder("a").expect("granted to 2").value, b"w");
    }
}
