//! Memory workloads: many held keys, many idle connections.

use crate::stats::{mib, Control, Recorder, Report};
use crate::workloads::{lock_unlock, open_many, Target};
use dlock::proto::{RequestType, ResponseStatus};
use dlock::raw::{RawClient, Stream};
use dlock_testkit::proc_sample::ProcSample;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::time::{Duration, Instant};

/// Lease long enough to outlast any run; the keys are released explicitly.
const HOLD_LEASE_MICROS: u64 = 3_600_000_000;

/// Key `i` as a 16-byte name, like the bar's "16-byte names".
fn hold_key(i: u64) -> String {
    format!("hold/{i:011}")
}

/// How `hold` sends its requests.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Requests in flight per connection.
    pub depth: usize,
    /// Keys per request.
    pub batch: u64,
}

/// Sends `Lock` (or `Unlock`) for keys `from..to`, `pace.batch` keys a
/// request, `pace.depth` requests in flight.
async fn pipelined(
    c: &mut RawClient<Stream>,
    kind: RequestType,
    from: u64,
    to: u64,
    pace: Pace,
    rec: &mut Recorder,
) -> io::Result<()> {
    let mut in_flight: VecDeque<Instant> = VecDeque::new();
    let mut next = from;
    while next < to || !in_flight.is_empty() {
        while next < to && in_flight.len() < pace.depth {
            let last = (next + pace.batch.max(1)).min(to);
            let keys: Vec<String> = (next..last).map(hold_key).collect();
            let mut req = c.request(kind, &keys);
            if let (RequestType::Lock, Some(lock)) = (kind, req.lock.as_mut()) {
                lock.release_micro = HOLD_LEASE_MICROS;
            }
            c.queue(&req);
            in_flight.push_back(Instant::now());
            next = last;
        }
        c.flush().await?;
        let sent = in_flight.pop_front().unwrap_or_else(Instant::now);
        let r = c.recv().await?;
        let ok = r.status == ResponseStatus::Ok as i32;
        if !ok && rec.errors == 0 {
            // The first refusal says why; the rest are counted.
            eprintln!(
                "dlock-bench: {kind:?} refused: {:?}: {}",
                ResponseStatus::try_from(r.status),
                r.error_text
            );
        }
        rec.outcome(ok, sent);
    }
    Ok(())
}

/// When `hold` releases the keys it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Once they are all taken.
    AtOnce,
    /// After a line or the end of standard input (or the deadline).
    OnInput,
    /// Never: they stay held as leases after the run.
    Never,
}

/// Takes `count` keys as leases over `conns` connections, samples the
/// server, releases them all (see [`Release`]), samples again.
pub async fn hold(
    t: Target,
    ctl: Control,
    count: u64,
    conns: usize,
    pace: Pace,
    release: Release,
    pid: Option<u32>,
) -> Report {
    let before = pid.and_then(ProcSample::read);
    let start = Instant::now();
    let conns = conns.max(1) as u64;
    let per = count.div_ceil(conns);
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (t, ctl) = (t.clone(), ctl.clone());
        let (from, to) = (i * per, ((i + 1) * per).min(count));
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut c = t.connect().await?;
            // The deadline still bounds the run: stop taking keys at it.
            let mut end = from;
            while end < to && Instant::now() < ctl.deadline() {
                let chunk = (end + 10_000).min(to);
                pipelined(&mut c, RequestType::Lock, end, chunk, pace, &mut rec).await?;
                end = chunk;
            }
            Ok::<_, io::Error>((c, from, end, rec))
        }));
    }
    let mut held = Vec::new();
    let mut rec = Recorder::default();
    for task in tasks {
        match task.await {
            Ok(Ok((c, from, to, r))) => {
                rec.merge(&r);
                held.push((c, from, to));
            }
            Ok(Err(e)) => {
                rec.errors += 1;
                eprintln!("dlock-bench: hold worker stopped: {e}");
            }
            Err(e) => {
                rec.errors += 1;
                eprintln!("dlock-bench: hold worker panicked: {e}");
            }
        }
    }
    let elapsed = start.elapsed();
    let with_keys = pid.and_then(ProcSample::read);
    let taken: u64 = held.iter().map(|(_, f, t)| t - f).sum();
    if release == Release::OnInput {
        println!("holding {taken} keys");
        let line = tokio::task::spawn_blocking(|| {
            let _ = io::stdout().flush();
            io::stdin().read_line(&mut String::new())
        });
        let _ = tokio::time::timeout_at(ctl.deadline().into(), line).await;
    }
    let mut releases = Vec::new();
    for (mut c, from, to) in held {
        if release == Release::Never {
            continue;
        }
        releases.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let r = pipelined(&mut c, RequestType::Unlock, from, to, pace, &mut rec).await;
            (rec, r)
        }));
    }
    for r in releases {
        if let Ok((_, Err(e))) = r.await {
            eprintln!("dlock-bench: release failed: {e}");
        }
    }
    let released = pid.and_then(ProcSample::read);
    let mut report = Report::new("hold", conns as usize, elapsed, &rec, before, with_keys)
        .with("keys_held", taken);
    if let (Some(b), Some(h), Some(r)) = (before, with_keys, released) {
        report = report
            .with("rss_before_mib", round(mib(b.rss)))
            .with("rss_held_mib", round(mib(h.rss)))
            .with("rss_released_mib", round(mib(r.rss)))
            .with(
                "bytes_per_key",
                (h.rss.saturating_sub(b.rss)) / taken.max(1),
            );
    }
    report
}

/// p99 lock-unlock latency of `active` clients without and with `idle`
/// idle connections open, and the server's memory with them.
pub async fn conns(
    t: Target,
    duration: Duration,
    idle: usize,
    active: usize,
    pid: Option<u32>,
) -> Report {
    let half = duration / 2;
    let base = lock_unlock(t.clone(), Control::new(half, None), active, "bench/conns").await;
    let before = pid.and_then(ProcSample::read);
    let (open, failed) = open_many(&t, idle, RequestType::Ping).await;
    let with_idle = pid.and_then(ProcSample::read);
    let start = Instant::now();
    let loaded = lock_unlock(t.clone(), Control::new(half, None), active, "bench/conns").await;
    let after = pid.and_then(ProcSample::read);
    let base_p99 = base.hist.value_at_quantile(0.99);
    let loaded_p99 = loaded.hist.value_at_quantile(0.99);
    let mut report = Report::new("conns", active, start.elapsed(), &loaded, with_idle, after)
        .with("idle_connections", open.len() as u64)
        .with("idle_connect_failures", failed)
        .with("p99_us_without_idle", base_p99)
        .with("p99_us_with_idle", loaded_p99)
        .with(
            "p99_ratio",
            round(loaded_p99 as f64 / base_p99.max(1) as f64),
        );
    if let (Some(b), Some(w)) = (before, with_idle) {
        report = report
            .with("rss_before_idle_mib", round(mib(b.rss)))
            .with("rss_with_idle_mib", round(mib(w.rss)))
            .with(
                "bytes_per_idle_conn",
                w.rss.saturating_sub(b.rss) / (open.len() as u64).max(1),
            );
    }
    drop(open);
    report
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
