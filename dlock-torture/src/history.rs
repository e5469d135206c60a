//! What the clients did while they believed they held a key, and the checks
//! over it: the fenced register and the interval history.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// An in-process stand-in for a storage system guarded by fencing tokens:
/// per key, it rejects any write whose token is below the highest it has
/// accepted. A correct lock service never makes it reject a current holder.
#[derive(Debug, Default)]
pub struct Register {
    highest: Mutex<HashMap<String, u64>>,
}

impl Register {
    /// Writes under `fence`; false when a newer token was already accepted.
    pub fn write(&self, key: &str, fence: u64) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        // The pool is small: after the first write of a key, no allocation.
        match highest.get_mut(key) {
            Some(top) if fence < *top => false,
            Some(top) => {
                *top = fence;
                true
            }
            None => {
                highest.insert(key.to_string(), fence);
                true
            }
        }
    }
}

/// One holder's time with a key, as seen by the holder: from the grant's
/// arrival to its last write before letting go.
#[derive(Debug, Clone)]
pub struct Hold {
    pub key: String,
    pub fence: u64,
    pub client: u64,
    pub start: Instant,
    pub end: Instant,
}

/// Every hold of the run.
#[derive(Debug, Default)]
pub struct History {
    holds: Mutex<Vec<Hold>>,
}

impl History {
    pub fn record(&self, hold: Hold) {
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hold);
    }

    pub fn len(&self) -> usize {
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Checks that, per key, holds do not overlap in time and fencing
    /// tokens increase from one hold to the next. Returns a description of
    /// every violation (capped) and their count.
    pub fn check(&self) -> (u64, Vec<String>) {
        let holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_key: HashMap<&str, Vec<&Hold>> = HashMap::new();
        for h in holds.iter() {
            by_key.entry(&h.key).or_default().push(h);
        }
        let mut count = 0;
        let mut examples = Vec::new();
        for (key, mut hs) in by_key {
            hs.sort_by_key(|h| h.start);
            for pair in hs.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let problem = if b.start < a.end {
                    Some("overlapping holders")
                } else if b.fence <= a.fence {
                    Some("fencing token did not increase")
                } else {
                    None
                };
                if let Some(what) = problem {
                    count += 1;
                    if examples.len() < 10 {
                        examples.push(format!(
                            "{what} on {key:?}: client {} fence {} ({:?}..{:?}) then client {} fence {} from {:?}",
                            a.client,
                            a.fence,
                            a.start,
                            a.end,
                            b.client,
                            b.fence,
                            b.start
                        ));
                    }
                }
            }
        }
        (count, examples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hold(key: &str, fence: u64, start: u64, end: u64, base: Instant) -> Hold {
        Hold {
            key: key.into(),
            fence,
            client: fence,
            start: base + Duration::from_millis(start),
            end: base + Duration::from_millis(end),
        }
    }

    #[test]
    fn register_rejects_only_older_tokens() {
        let r = Register::default();
        assert!(r.write("k", 5));
        assert!(r.write("k", 5));
        assert!(r.write("k", 7));
        assert!(!r.write("k", 6));
        assert!(r.write("other", 1));
    }

    #[test]
    fn history_finds_overlaps_and_fence_regressions() {
        let base = Instant::now();
        let h = History::default();
        h.record(hold("a", 1, 0, 10, base));
        h.record(hold("a", 2, 10, 20, base));
        h.record(hold("b", 1, 0, 10, base));
        assert_eq!(h.check().0, 0);
        h.record(hold("a", 3, 15, 30, base));
        h.record(hold("b", 1, 20, 30, base));
        let (n, ex) = h.check();
        assert_eq!(n, 2, "{ex:?}");
    }
}
