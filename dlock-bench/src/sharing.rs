//! Shared holds under load: readers beside writers on a few hot keys, or a
//! semaphore of N on one; checks while it measures that no writer ever
//! shares a key and a semaphore never has more than N holders.

use crate::rng::Rng;
use crate::stats::{Control, Recorder};
use crate::workloads::{run_workers, Target};
use dlock::proto::{RequestType, ResponseStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the shared workload found.
pub struct Sharing {
    pub rec: Recorder,
    /// Grants taken shared and exclusively.
    pub reads: u64,
    pub writes: u64,
    /// Most holders of one key seen at once by the clients.
    pub most_holders: u64,
    /// A writer beside anyone, or more holders than the limit.
    pub violations: u64,
}

/// Who holds a key, as the clients see it between grant and Unlock.
#[derive(Default, Clone, Copy)]
struct Seen {
    readers: u64,
    writer: bool,
}

/// How the workload takes its keys.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Percent of the requests that read (take their key shared).
    pub readers_pct: u8,
    /// Hot keys the connections pick from.
    pub keys: usize,
    /// Above 0: every request takes its key shared under this limit (a
    /// semaphore), and `readers_pct` is not used.
    pub limit: u32,
    /// How long a holder keeps the key; zero yields once instead.
    pub hold: Duration,
}

/// N connections each lock one of `mix.keys` keys (shared with probability
/// `readers_pct`, or under the semaphore's limit), mark it, yield, unmark
/// and unlock, waiting without limit.
pub async fn shared(t: Target, ctl: Control, conns: usize, mix: Mix) -> Sharing {
    let keys = mix.keys.max(1);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::new(Mutex::new(vec![Seen::default(); keys]));
    let counts = Arc::new([
        AtomicU64::new(0), // reads
        AtomicU64::new(0), // writes
        AtomicU64::new(0), // most holders
        AtomicU64::new(0), // violations
    ]);
    let (s, n) = (seen.clone(), counts.clone());
    let rec = run_workers(conns, move |i| {
        let (t, ctl, seen, counts) = (t.clone(), ctl.clone(), s.clone(), n.clone());
        async move {
            let mut rec = Recorder::default();
            let mut rng = Rng::new(i as u64 + 7);
            let result = async {
                let mut c = t.connect().await?;
                while ctl.next() {
                    let k = rng.below(keys as u64) as usize;
                    let key = vec![format!("bench/shared/{k}")];
                    let read = mix.limit > 0 || rng.below(100) < u64::from(mix.readers_pct);
                    let start = Instant::now();
                    let mut lock = c.request(RequestType::Lock, &key);
                    if read {
                        let body = lock.lock.get_or_insert_with(Default::default);
                        body.shared_keys = key.clone();
                        body.limit = mix.limit;
                    }
                    let r = c.call(&lock).await?;
                    if r.status != ResponseStatus::Ok as i32 {
                        rec.errors += 1;
                        continue;
                    }
                    counts[usize::from(!read)].fetch_add(1, Ordering::Relaxed);
                    mark(&seen, &counts, k, read, mix.limit);
                    // Hold across a scheduling point, so another worker
                    // granted the key now would find this mark.
                    if mix.hold.is_zero() {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(mix.hold).await;
                    }
                    unmark(&seen, k, read);
                    let unlock = c.request(RequestType::Unlock, &key);
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
    let get = |i: usize| counts[i].load(Ordering::Relaxed);
    Sharing {
        rec,
        reads: get(0),
        writes: get(1),
        most_holders: get(2),
        violations: get(3),
    }
}

fn mark(seen: &Mutex<Vec<Seen>>, counts: &[AtomicU64; 4], k: usize, read: bool, limit: u32) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let s = &mut seen[k];
    let wrong = if read {
        s.readers += 1;
        s.writer || (limit > 0 && s.readers > u64::from(limit))
    } else {
        let busy = s.writer || s.readers > 0;
        s.writer = true;
        busy
    };
    if wrong {
        counts[3].fetch_add(1, Ordering::Relaxed);
    }
    counts[2].fetch_max(s.readers.max(u64::from(s.writer)), Ordering::Relaxed);
}

/// Unmarked before the Unlock is sent, so the next holder never finds a
/// stale mark.
fn unmark(seen: &Mutex<Vec<Seen>>, k: usize, read: bool) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    let s = &mut seen[k];
    if read {
        s.readers = s.readers.saturating_sub(1);
    } else {
        s.writer = false;
    }
}
