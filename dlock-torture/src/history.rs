//! What the clients did while they believed they held a key, and the checks
//! over it: the fenced register and the interval history.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// An in-process stand-in for a storage system guarded by fencing tokens,
/// with the rule docs/PROTOCOL.md gives for shared holds: per key it keeps
/// the highest token seen on any access and the highest seen on a write; a
/// write needs a token at least the first, a read one at least the second.
/// A correct lock service never makes it refuse a current holder.
#[derive(Debug, Default)]
pub struct Register {
    highest: Mutex<HashMap<String, Seen>>,
}

/// The highest tokens a key of the register has seen.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    any: u64,
    write: u64,
}

impl Register {
    /// Writes under `fence` (an exclusive holder); false when a newer token
    /// was already used, by a reader or a writer.
    pub fn write(&self, key: &str, fence: u64) -> bool {
        self.access(key, |seen| {
            if fence < seen.any {
                return false;
            }
            *seen = Seen {
                any: fence,
                write: fence,
            };
            true
        })
    }

    /// Reads under `fence` (a shared holder); false when a newer token was
    /// already used for a write. Readers do not refuse each other.
    pub fn read(&self, key: &str, fence: u64) -> bool {
        self.access(key, |seen| {
            if fence < seen.write {
                return false;
            }
            seen.any = seen.any.max(fence);
            true
        })
    }

    /// Uses `key` as `shared` says: a read for a shared holder, a write for
    /// an exclusive one.
    pub fn touch(&self, key: &str, fence: u64, shared: bool) -> bool {
        if shared {
            self.read(key, fence)
        } else {
            self.write(key, fence)
        }
    }

    fn access(&self, key: &str, f: impl FnOnce(&mut Seen) -> bool) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        // The pool is small: after the first use of a key, no allocation.
        match highest.get_mut(key) {
            Some(seen) => f(seen),
            None => f(highest.entry(key.to_string()).or_default()),
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
    /// Held shared: other shared holds of the key may overlap it.
    pub shared: bool,
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

    /// Checks, per key, that an exclusive hold overlaps no other hold (shared
    /// holds may overlap each other), and that fencing tokens follow the
    /// holds in time: a hold that starts after an exclusive one, or an
    /// exclusive hold that starts after any other, has a higher token. (Two
    /// shared holds may see their grants arrive in either order.) Returns a
    /// description of every violation (capped) and their count.
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
            // The holds seen so far that end last and have the highest
            // token: among all of them, and among the exclusive ones.
            let mut last_any: Option<Bookmark> = None;
            let mut last_exclusive: Option<Bookmark> = None;
            for b in hs {
                let against = if b.shared { last_exclusive } else { last_any };
                if let Some(a) = against {
                    let problem = if b.start < a.end.end {
                        Some((a.end, "overlapping holders"))
                    } else if b.fence <= a.top.fence {
                        Some((a.top, "fencing token did not increase"))
                    } else {
                        None
                    };
                    if let Some((a, what)) = problem {
                        count += 1;
                        if examples.len() < 10 {
                            examples.push(format!(
                                "{what} on {key:?}: client {} fence {}{} ({:?}..{:?}) then client {} fence {}{} from {:?}",
                                a.client,
                                a.fence,
                                mode(a),
                                a.start,
                                a.end,
                                b.client,
                                b.fence,
                                mode(b),
                                b.start
                            ));
                        }
                    }
                }
                Bookmark::note(&mut last_any, b);
                if !b.shared {
                    Bookmark::note(&mut last_exclusive, b);
                }
            }
        }
        (count, examples)
    }
}

fn mode(h: &Hold) -> &'static str {
    if h.shared {
        " (shared)"
    } else {
        ""
    }
}

/// Of a set of holds, the one that ends last and the one with the highest
/// token.
#[derive(Clone, Copy)]
struct Bookmark<'a> {
    end: &'a Hold,
    top: &'a Hold,
}

impl<'a> Bookmark<'a> {
    fn note(slot: &mut Option<Bookmark<'a>>, h: &'a Hold) {
        let m = slot.get_or_insert(Bookmark { end: h, top: h });
        if h.end > m.end.end {
            m.end = h;
        }
        if h.fence > m.top.fence {
            m.top = h;
        }
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
            shared: false,
            start: base + Duration::from_millis(start),
            end: base + Duration::from_millis(end),
        }
    }

    fn shared(key: &str, fence: u64, start: u64, end: u64, base: Instant) -> Hold {
        Hold {
            shared: true,
            ..hold(key, fence, start, end, base)
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
    fn register_lets_readers_overlap_but_refuses_whoever_a_newer_token_outran() {
        let r = Register::default();
        assert!(r.write("k", 5));
        // Two readers granted together, using the key in either order.
        assert!(r.read("k", 7));
        assert!(r.read("k", 6));
        // A writer that paused past its lease: a later reader used the key.
        assert!(!r.write("k", 5));
        assert!(r.write("k", 8));
        // A reader that paused past its lease: a later writer wrote.
        assert!(!r.read("k", 7));
        assert!(r.read("k", 9));
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

    #[test]
    fn shared_holds_may_overlap_each_other_but_never_an_exclusive_one() {
        let base = Instant::now();
        let h = History::default();
        h.record(hold("a", 1, 0, 10, base));
        // Readers granted together, their answers arriving out of order.
        h.record(shared("a", 3, 10, 30, base));
        h.record(shared("a", 2, 12, 20, base));
        h.record(hold("a", 4, 30, 40, base));
        assert_eq!(h.check(), (0, vec![]));

        // A writer inside a reader's hold, and a reader inside a writer's.
        h.record(hold("b", 1, 0, 10, base));
        h.record(shared("b", 2, 5, 20, base));
        h.record(hold("c", 1, 0, 20, base));
        h.record(shared("c", 2, 15, 25, base));
        h.record(hold("c", 3, 22, 30, base));
        let (n, ex) = h.check();
        assert_eq!(n, 3, "{ex:?}");

        // A reader after a writer with a lower token.
        let h = History::default();
        h.record(hold("d", 5, 0, 10, base));
        h.record(shared("d", 4, 11, 20, base));
        let (n, ex) = h.check();
        assert_eq!(n, 1, "{ex:?}");
        assert!(ex[0].contains("did not increase"), "{ex:?}");
    }
}
