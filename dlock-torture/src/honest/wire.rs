//! An honest client on raw frames, against a single server: locks random
//! sets of keys with random waits, leases and hold times, writes to the
//! fenced register while it holds them, and checks every answer it gets.

use crate::history::Hold;
use crate::report::add;
use crate::wire::{CallError, Wire};
use crate::workload::Workload;
use dlock::proto::{Request, RequestType, Response, ResponseStatus};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Past any wait a request asks for, how long its answer may take.
const PATIENCE: Duration = Duration::from_secs(10);

/// A Lock without a wait limit may wait this long before the client calls
/// it a hang: far beyond any fair queue over this workload's hold times.
const FOREVER_PATIENCE: Duration = Duration::from_secs(60);

/// A holder stops writing this long before its lease ends by its own clock,
/// which starts before the server's.
const LEASE_MARGIN: Duration = Duration::from_millis(100);

pub async fn run(client: u64, sh: Arc<Workload>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut wire = None;
    // Until when this connection may still hold a lease it let run out:
    // a Lock naming such a key in the other mode is refused, rightly.
    let mut abandoned = Abandoned::default();
    while Instant::now() < sh.stop_at {
        let w = match wire.as_mut() {
            Some(w) => w,
            None => match Wire::connect(sh.addr).await {
                Ok(w) => wire.insert(w),
                Err(e) => {
                    sh.report
                        .violation("honest connect failed", format!("client {client}: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        match round(client, w, &sh, &mut rng, &mut abandoned).await {
            Ok(Next::Keep) => {}
            Ok(Next::Reconnect) => {
                wire = None;
                abandoned = Abandoned::default();
            }
            Err(e) => {
                let kind = match e {
                    CallError::Closed => "honest connection closed",
                    CallError::NoAnswer => "request not answered",
                    CallError::OutOfOrder { .. } => "answer out of order",
                    CallError::Malformed => "malformed answer",
                };
                sh.report.violation(kind, format!("client {client}: {e}"));
                wire = None;
            }
        }
    }
}

enum Next {
    Keep,
    Reconnect,
}

/// The leases a connection let run out and may hold still.
#[derive(Default)]
struct Abandoned {
    until: Option<Instant>,
}

impl Abandoned {
    fn add(&mut self, until: Instant) {
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    fn live(&self) -> bool {
        self.until.is_some_and(|u| Instant::now() < u)
    }
}

/// One lock's life: ask, hold (writing the register, perhaps renewing),
/// then leave by Unlock, by letting the lease run out, or by disconnecting.
async fn round(
    client: u64,
    w: &mut Wire,
    sh: &Workload,
    rng: &mut fastrand::Rng,
    abandoned: &mut Abandoned,
) -> Result<Next, CallError> {
    let plan = plan_lock(w, sh, rng);
    let sent = Instant::now();
    add(&sh.report.ops.requests, 1);
    let r = w.call(plan.req, plan.patience).await?;
    let Some(fence) = granted(client, sh, &r, abandoned) else {
        return Ok(Next::Keep);
    };
    add(&sh.report.ops.grants, 1);
    if !plan.shared.is_empty() {
        add(&sh.report.ops.shared_grants, 1);
    }
    let start = Instant::now();
    let mut held = Held {
        keys: plan.keys,
        shared: plan.shared,
        fence,
        lease: plan.lease,
        start,
        // The server's lease runs from its grant, which came after `sent`:
        // the only safe bound the client has. A long wait may use it all up.
        valid_until: plan.lease.map(|l| sent + l - LEASE_MARGIN),
    };
    if held.valid_until.is_some_and(|v| start >= v) {
        return release(client, w, sh, &held.keys, held.valid_until).await;
    }
    hold(client, w, sh, rng, &mut held).await?;
    match rng.u8(0..20) {
        0 if held.lease.is_some() => {
            add(&sh.report.ops.lease_expiries, 1);
            if let Some(l) = held.lease {
                // The server's lease ends before this, counted from the send.
                abandoned.add(Instant::now() + l + Duration::from_secs(1));
            }
            Ok(Next::Keep)
        }
        1 => Ok(Next::Reconnect), // Disconnecting releases what has no lease.
        _ => release(client, w, sh, &held.keys, held.valid_until).await,
    }
}

/// A random Lock: its keys, how long its answer may take, its lease.
struct LockPlan {
    req: Request,
    keys: Vec<String>,
    /// Those of `keys` taken shared.
    shared: Vec<String>,
    patience: Duration,
    lease: Option<Duration>,
}

fn plan_lock(w: &mut Wire, sh: &Workload, rng: &mut fastrand::Rng) -> LockPlan {
    let n = rng.usize(1..=4.min(sh.keys.len()));
    let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), n);
    let mut req = w.request(RequestType::Lock, &keys);
    let body = req.lock.get_or_insert_with(Default::default);
    // A third of the requests read: some keys, or all, taken shared.
    let shared: Vec<String> = if rng.u8(0..3) == 0 {
        keys.iter().filter(|_| rng.u8(0..4) != 0).cloned().collect()
    } else {
        Vec::new()
    };
    body.shared_keys = shared.clone();
    let patience = match rng.u8(0..4) {
        0 => {
            body.try_lock = true;
            PATIENCE
        }
        1 => FOREVER_PATIENCE,
        _ => {
            let wait = Duration::from_millis(rng.u64(1..300));
            body.wait_micro = wait.as_micros() as u64;
            PATIENCE + wait
        }
    };
    let lease = (rng.u8(0..5) < 2).then(|| Duration::from_millis(rng.u64(300..2_000)));
    body.release_micro = lease.map_or(0, |l| l.as_micros() as u64);
    LockPlan {
        req,
        keys,
        shared,
        patience,
        lease,
    }
}

/// The fence of a grant; `None` for busy keys (counted) or an answer a
/// Lock must not get (a violation).
fn granted(client: u64, sh: &Workload, r: &Response, abandoned: &Abandoned) -> Option<u64> {
    match status(r) {
        ResponseStatus::Ok if r.fence > 0 => Some(r.fence),
        ResponseStatus::AcquireTimeout => {
            add(&sh.report.ops.busy, 1);
            None
        }
        ResponseStatus::ModeConflict if abandoned.live() => {
            add(&sh.report.ops.busy, 1);
            None
        }
        other => {
            sh.report.violation(
                "unexpected answer to Lock",
                format!("client {client}: {other:?} {r:?}"),
            );
            None
        }
    }
}

/// A lock this client was granted, and its own bound on how long it holds.
struct Held {
    keys: Vec<String>,
    shared: Vec<String>,
    fence: u64,
    lease: Option<Duration>,
    start: Instant,
    valid_until: Option<Instant>,
}

/// Holds the lock for a random time: writes the register at the start and
/// the end (while the client's bound allows), perhaps renews the lease
/// halfway, and records the hold for the checker.
async fn hold(
    client: u64,
    w: &mut Wire,
    sh: &Workload,
    rng: &mut fastrand::Rng,
    held: &mut Held,
) -> Result<(), CallError> {
    write_register(client, sh, held);
    let hold = Duration::from_millis(rng.u64(0..20));
    if let (Some(l), true) = (held.lease, rng.bool()) {
        // Renew halfway: the lease then runs from the Renew.
        tokio::time::sleep(hold / 2).await;
        let mut renew = w.request(RequestType::Renew, &held.keys);
        let b = renew.lock.get_or_insert_with(Default::default);
        b.release_micro = l.as_micros() as u64;
        let renew_sent = Instant::now();
        add(&sh.report.ops.requests, 1);
        let r = w.call(renew, PATIENCE).await?;
        if status(&r) == ResponseStatus::Ok {
            held.valid_until = Some(renew_sent + l - LEASE_MARGIN);
        } else if held.valid_until.is_some_and(|v| renew_sent < v) {
            sh.report.violation(
                "lock lost while held",
                format!("client {client}: Renew of a live lease: {r:?}"),
            );
        }
    }
    let hold_until = held.start + hold;
    tokio::time::sleep_until(held.valid_until.map_or(hold_until, |v| v.min(hold_until))).await;
    if held.valid_until.is_none_or(|v| Instant::now() < v) {
        write_register(client, sh, held);
    }
    let end = Instant::now();
    for k in &held.keys {
        sh.history.record(Hold {
            key: k.clone(),
            fence: held.fence,
            client,
            shared: held.shared.contains(k),
            start: held.start.into_std(),
            end: end.into_std(),
        });
    }
    Ok(())
}

/// Unlocks `keys`; the server must still hold them for this client unless
/// the client's own bound on the lease has passed.
async fn release(
    client: u64,
    w: &mut Wire,
    sh: &Workload,
    keys: &[String],
    valid_until: Option<Instant>,
) -> Result<Next, CallError> {
    let unlock = w.request(RequestType::Unlock, keys);
    let unlock_sent = Instant::now();
    add(&sh.report.ops.requests, 1);
    let r = w.call(unlock, PATIENCE).await?;
    add(&sh.report.ops.unlocks, 1);
    let live = valid_until.is_none_or(|v| unlock_sent < v);
    if status(&r) != ResponseStatus::Ok && live {
        sh.report.violation(
            "lock lost while held",
            format!("client {client}: Unlock: {r:?}"),
        );
    }
    Ok(Next::Keep)
}

/// Uses every key under the grant's token, reading those held shared and
/// writing the others; the register must accept, since the client holds
/// the keys.
fn write_register(client: u64, sh: &Workload, held: &Held) {
    for k in &held.keys {
        add(&sh.report.ops.register_writes, 1);
        let shared = held.shared.contains(k);
        if !sh.register.touch(k, held.fence, shared) {
            sh.report.violation(
                "register rejected a holder",
                format!(
                    "client {client} key {k:?} fence {} shared {shared}",
                    held.fence
                ),
            );
        }
    }
}

pub fn status(r: &Response) -> ResponseStatus {
    ResponseStatus::try_from(r.status).unwrap_or(ResponseStatus::General)
}
