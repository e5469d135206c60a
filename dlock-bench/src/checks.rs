//! Workloads that check correctness while they measure: one contended key
//! (hand-off rate, hand-off latency, FIFO order) and overlapping multi-key
//! locks (nobody ever sees a key held twice).

use crate::rng::Rng;
use crate::stats::{Control, Recorder};
use crate::workloads::{run_workers, Target};
use dlock::proto::{RequestType, ResponseStatus};
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A client's request counts as overtaken only if it was sent this much
/// earlier than the one granted first: requests sent closer together may
/// reach the server in either order, which is not the server's doing.
pub const FIFO_MARGIN: Duration = Duration::from_millis(2);

/// One grant of the contended key.
#[derive(Debug, Clone, Copy)]
struct Grant {
    fence: u64,
    lock_sent: Instant,
    granted: Instant,
    released: Instant,
}

/// What the contended workload found.
pub struct Contended {
    pub rec: Recorder,
    pub handoffs: u64,
    pub handoff_latency: Histogram<u64>,
    pub fifo_violations: u64,
}

/// N clients queue for one key; each takes it, releases it and queues again
/// in the same write.
pub async fn contended(t: Target, ctl: Control, conns: usize) -> Contended {
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::new(Mutex::new(Vec::new()));
    let key = vec!["bench/contended".to_string()];
    let log = grants.clone();
    let rec = run_workers(conns, move |_| {
        let (t, ctl, log, key) = (t.clone(), ctl.clone(), log.clone(), key.clone());
        async move {
            let mut rec = Recorder::default();
            let mut mine = Vec::new();
            let result = async {
                let mut c = t.connect().await?;
                let mut lock_sent = Instant::now();
                let lock = c.request(RequestType::Lock, &key);
                c.queue(&lock);
                c.flush().await?;
                loop {
                    let r = c.recv().await?;
                    let granted = Instant::now();
                    if r.status != ResponseStatus::Ok as i32 {
                        rec.errors += 1;
                        return Ok(());
                    }
                    let more = ctl.next();
                    let unlock = c.request(RequestType::Unlock, &key);
                    c.queue(&unlock);
                    if more {
                        let lock = c.request(RequestType::Lock, &key);
                        c.queue(&lock);
                    }
                    let released = Instant::now();
                    c.flush().await?;
                    rec.ok(granted - lock_sent);
                    mine.push(Grant {
                        fence: r.fence,
                        lock_sent,
                        granted,
                        released,
                    });
                    lock_sent = released;
                    c.recv().await?; // the Unlock's answer
                    if !more {
                        return Ok(());
                    }
                }
            }
            .await;
            log.lock().unwrap_or_else(|p| p.into_inner()).extend(mine);
            (rec, result)
        }
    })
    .await;
    let mut grants = std::mem::take(&mut *grants.lock().unwrap_or_else(|p| p.into_inner()));
    grants.sort_by_key(|g| g.fence);
    let mut handoff_latency =
        Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds");
    for w in grants.windows(2) {
        let micros = w[1]
            .granted
            .saturating_duration_since(w[0].released)
            .as_micros();
        handoff_latency.saturating_record(u64::try_from(micros).unwrap_or(u64::MAX).max(1));
    }
    // Walk from the last grant back, keeping the earliest send among later
    // grants: a later grant whose request left clearly earlier was overtaken.
    let mut fifo_violations = 0;
    let mut earliest_later: Option<Instant> = None;
    for g in grants.iter().rev() {
        if earliest_later.is_some_and(|e| e + FIFO_MARGIN < g.lock_sent) {
            fifo_violations += 1;
        }
        earliest_later = Some(earliest_later.map_or(g.lock_sent, |e| e.min(g.lock_sent)));
    }
    Contended {
        rec,
        handoffs: grants.len() as u64,
        handoff_latency,
        fifo_violations,
    }
}

/// What the multikey workload found.
pub struct Multikey {
    pub rec: Recorder,
    pub violations: u64,
}

/// N connections lock `k` random keys out of `pool` (wait without limit),
/// mark them in a shared table, unmark, unlock. A key found marked by
/// someone else is a violation of mutual exclusion.
pub async fn multikey(t: Target, ctl: Control, conns: usize, k: usize, pool: usize) -> Multikey {
    let held: Arc<Mutex<HashMap<u64, usize>>> = Arc::new(Mutex::new(HashMap::new()));
    let violations = Arc::new(AtomicU64::new(0));
    let (h, v) = (held.clone(), violations.clone());
    let k = k.clamp(1, pool.max(1));
    let rec = run_workers(conns, move |i| {
        let (t, ctl, held, violations) = (t.clone(), ctl.clone(), h.clone(), v.clone());
        async move {
            let mut rec = Recorder::default();
            let mut rng = Rng::new(i as u64 + 1);
            let result = async {
                let mut c = t.connect().await?;
                while ctl.next() {
                    let mut picked: Vec<u64> = Vec::with_capacity(k);
                    while picked.len() < k {
                        let idx = rng.below(pool as u64);
                        if !picked.contains(&idx) {
                            picked.push(idx);
                        }
                    }
                    let keys: Vec<String> =
                        picked.iter().map(|i| format!("bench/mk/{i}")).collect();
                    let start = Instant::now();
                    let lock = c.request(RequestType::Lock, &keys);
                    let r = c.call(&lock).await?;
                    if r.status != ResponseStatus::Ok as i32 {
                        rec.errors += 1;
                        continue;
                    }
                    {
                        let mut table = held.lock().unwrap_or_else(|p| p.into_inner());
                        for idx in &picked {
                            if table.insert(*idx, i).is_some() {
                                violations.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    // Hold the keys across a scheduling point, so another
                    // worker granted an overlapping key now would find our mark.
                    tokio::task::yield_now().await;
                    {
                        // Unmarked before the Unlock is sent, so the next
                        // holder can never find a stale mark of ours.
                        let mut table = held.lock().unwrap_or_else(|p| p.into_inner());
                        for idx in &picked {
                            if table.get(idx) == Some(&i) {
                                table.remove(idx);
                            }
                        }
                    }
                    let unlock = c.request(RequestType::Unlock, &keys);
                    let r = c.call(&unlock).await?;
                    rec.outcome(r.status == ResponseStatus::Ok as i32, start);
                }
                Ok(())
            }
            .await;
            (rec, result)
        }
    })
    .await;
    Multikey {
        rec,
        violations: violations.load(Ordering::Relaxed),
    }
}
