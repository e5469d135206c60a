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
pub const MAX_VALUE_LEN: usize = dlock::MAX_VALUE_LEN;

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
