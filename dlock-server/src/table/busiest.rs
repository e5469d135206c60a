//! The busiest keys, for a live view (`dlock top`): the keys with the most
//! waiters, and among equals the one held longest.
//!
//! The table may hold a million keys, and whoever reads it holds the
//! engine's mutex. So the walk goes a slice of slots at a time
//! ([`LockTable::rank_busy`]), and the caller lets go of the table between
//! slices: a grant waits for one slice, never for the whole walk. The
//! ranking is then of keys seen at slightly different moments, which is
//! what a view refreshed every second needs.

use super::{Key, LockTable, Time};
use std::cmp::Reverse;
use std::time::Duration;

/// One key's place in the ranking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The key.
    pub key: Key,
    /// Requests waiting for it.
    pub waiters: usize,
    /// How long its earliest holder has held it (zero when free).
    pub held_for: Duration,
}

impl Busy {
    /// Busier first: more waiters, then held longer, then by key, so that
    /// equal keys rank the same on every call.
    fn rank(&self) -> (Reverse<usize>, Reverse<Duration>, &str) {
        (Reverse(self.waiters), Reverse(self.held_for), &self.key)
    }
}

impl LockTable {
    /// Ranks the keys in at most `budget` slots from slot `from` into
    /// `top`, which keeps the `n` busiest seen so far, busiest first.
    /// Returns the slot to go on from, or `None` once every slot is seen.
    pub fn rank_busy(
        &self,
        now: Time,
        from: usize,
        budget: usize,
        n: usize,
        top: &mut Vec<Busy>,
    ) -> Option<usize> {
        let slots = self.keys.slots();
        let end = from.saturating_add(budget.max(1)).min(slots.len());
        // Once `top` is full (it is sorted between slices), a key that ranks
        // below its last on waiters and hold time cannot get in: it is
        // passed over without taking a reference to its name.
        let bar = match top.len() >= n {
            true => top
                .last()
                .map(|b| (Reverse(b.waiters), Reverse(b.held_for))),
            false => None,
        };
        for (key, state) in slots.range(from, end).flatten() {
            let waiters = state.queue.len();
            let since = state.holds.iter().map(|h| h.since).min();
            let held_for = since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
            if bar.is_some_and(|bar| (Reverse(waiters), Reverse(held_for)) > bar) {
                continue;
            }
            top.push(Busy {
                key: key.clone(),
                waiters,
                held_for,
            });
        }
        top.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
        top.truncate(n);
        (end < slots.len()).then_some(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Command, Sharing, TableLimits, WaitLimit};

    fn table() -> LockTable {
        LockTable::new(
            TableLimits {
                max_waiters: 100,
                max_held_keys: 100,
            },
            1,
        )
    }

    fn lock(t: &mut LockTable, owner: u64, key: &str, at: u64) {
        t.apply(
            Command::Lock {
                owner,
                keys: vec![key.into()],
                sharing: Sharing::exclusive(),
                wait: WaitLimit::Forever,
                lease: None,
                value: Vec::new(),
            },
            Time::from_micros(at),
        );
    }

    /// The whole table, a slice of `budget` slots at a time.
    fn ranked(t: &LockTable, now: u64, budget: usize, n: usize) -> Vec<(String, usize)> {
        let mut top = Vec::new();
        let mut from = Some(0);
        while let Some(f) = from {
            from = t.rank_busy(Time::from_micros(now), f, budget, n, &mut top);
        }
        top.iter().map(|b| (b.key.to_string(), b.waiters)).collect()
    }

    #[test]
    fn most_waiters_first_then_longest_held_whatever_the_slice() {
        let mut t = table();
        // The table's time only moves forward, so each key is taken later
        // than the one before; the oldest quiet key is not in the first
        // slot, so a slice that ends early cannot stumble on the answer.
        lock(&mut t, 1, "two-waiters", 100);
        lock(&mut t, 2, "quiet-old", 110);
        lock(&mut t, 3, "two-waiters", 120);
        lock(&mut t, 4, "one-waiter", 130);
        lock(&mut t, 5, "one-waiter", 140);
        lock(&mut t, 6, "two-waiters", 150);
        lock(&mut t, 7, "quiet-new", 300);
        let want = vec![
            ("two-waiters".to_string(), 2),
            ("one-waiter".to_string(), 1),
            ("quiet-old".to_string(), 0),
        ];
        for budget in [1, 2, 3, 100] {
            assert_eq!(ranked(&t, 1_000, budget, 3), want, "budget {budget}");
        }
        assert_eq!(ranked(&t, 1_000, 100, 10).len(), 4);
        assert!(ranked(&t, 1_000, 100, 0).is_empty());
    }

    #[test]
    fn an_empty_table_or_a_slot_past_the_end_ranks_nothing() {
        let t = table();
        let mut top = Vec::new();
        assert_eq!(t.rank_busy(Time::ZERO, 0, 10, 5, &mut top), None);
        assert_eq!(t.rank_busy(Time::ZERO, 99, 10, 5, &mut top), None);
        assert!(top.is_empty());
    }
}
