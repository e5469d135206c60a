//! Counters shared by every client, and the summary printed at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most violation descriptions kept for the summary.
const EXAMPLES: usize = 20;

/// Descriptions kept of each kind even past [`EXAMPLES`], so that a rare
/// kind is not hidden behind a burst of another.
const EXAMPLES_OF_EACH: usize = 3;

/// Operation counts: how much work the run did.
#[derive(Debug, Default)]
pub struct Ops {
    pub requests: AtomicU64,
    pub grants: AtomicU64,
    pub busy: AtomicU64,
    pub unlocks: AtomicU64,
    pub lease_expiries: AtomicU64,
    /// Uses of the register: writes by exclusive holders, reads by shared.
    pub register_writes: AtomicU64,
    /// Grants with at least one key held shared.
    pub shared_grants: AtomicU64,
    /// Writes from a client whose lock was already taken over: rejected by
    /// the register, as fencing intends. Not violations.
    pub stale_writes_rejected: AtomicU64,
}

/// Everything counted during a run.
#[derive(Debug, Default)]
pub struct Report {
    pub ops: Ops,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    violations: Mutex<BTreeMap<&'static str, u64>>,
    examples: Mutex<Vec<(&'static str, String)>>,
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Report {
    pub fn fault(&self, kind: &'static str) {
        *self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub fn violation(&self, kind: &'static str, detail: String) {
        self.violations_n(kind, 1, [detail]);
    }

    pub fn violations_n(
        &self,
        kind: &'static str,
        n: u64,
        details: impl IntoIterator<Item = String>,
    ) {
        if n == 0 {
            return;
        }
        *self
            .violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind)
            .or_default() += n;
        let mut ex = self.examples.lock().unwrap_or_else(|p| p.into_inner());
        for d in details {
            // At once too, with the wall clock, to be matched with the
            // nodes' logs (DLOCK_TEST_NODE_LOG_DIR) of a long run.
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!(
                "dlock-torture: at {:.3} (unix s): {kind}: {d}",
                at.as_secs_f64()
            );
            let of_kind = ex.iter().filter(|(k, _)| *k == kind).count();
            if ex.len() < EXAMPLES || of_kind < EXAMPLES_OF_EACH {
                ex.push((kind, d));
            }
        }
    }

    pub fn violation_count(&self) -> u64 {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }

    /// The summary, as printed at the end of a run; `availability` is the
    /// section of that name (`Availability::lines`), printed after the
    /// faults.
    pub fn summary(&self, header: &[(&str, String)], availability: &[(String, u64)]) -> String {
        let mut out = String::from("dlock-torture summary\n");
        for (k, v) in header {
            out.push_str(&format!("  {k:<24} {v}\n"));
        }
        let o = &self.ops;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("operations\n");
        for (k, v) in [
            ("requests", get(&o.requests)),
            ("locks granted", get(&o.grants)),
            ("  of them reading", get(&o.shared_grants)),
            ("locks busy / timed out", get(&o.busy)),
            ("unlocks", get(&o.unlocks)),
            ("leases left to expire", get(&o.lease_expiries)),
            ("register uses", get(&o.register_writes)),
            ("stale writes rejected", get(&o.stale_writes_rejected)),
        ] {
            out.push_str(&format!("  {k:<24} {v}\n"));
        }
        out.push_str("faults\n");
        for (k, v) in self.faults.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.push_str(&format!("  {k:<24} {v}\n"));
        }
        out.push_str("availability (a majority up and reachable from the clients)\n");
        for (k, v) in availability {
            out.push_str(&format!("  {k:<24} {v}\n"));
        }
        let violations = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str(&format!(
            "violations                 {}\n",
            violations.values().sum::<u64>()
        ));
        for (k, v) in violations.iter() {
            out.push_str(&format!("  {k:<24} {v}\n"));
        }
        for (k, e) in self
            .examples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.push_str(&format!("  - {k}: {e}\n"));
        }
        out
    }
}
