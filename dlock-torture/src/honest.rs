//! An honest client: locks random sets of keys with random waits, leases
//! and hold times, writes to the fenced register while it holds them, and
//! checks every answer it gets.

use crate::history::Hold;
use crate::report::add;
use crate::run::Workload;
use crate::wire::{CallError, Wire};
use dlock::proto::{RequestType, Response, ResponseStatus};
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
        match round(client, w, &sh, &mut rng).await {
            Ok(Next::Keep) => {}
            Ok(Next::Reconnect) => wire = None,
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

async fn round(
    client: u64,
    w: &mut Wire,
    sh: &Workload,
    rng: &mut fastrand::Rng,
) -> Result<Next, CallError> {
    let n = rng.usize(1..=4.min(sh.keys.len()));
    let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), n);
    let mut req = w.request(RequestType::Lock, &keys);
    let body = req.lock.get_or_insert_with(Default::default);
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
    let sent = Instant::now();
    add(&sh.report.ops.requests, 1);
    let r = w.call(req, patience).await?;
    match status(&r) {
        ResponseStatus::Ok if r.fence > 0 => {}
        ResponseStatus::AcquireTimeout => {
            add(&sh.report.ops.busy, 1);
            return Ok(Next::Keep);
        }
        other => {
            sh.report.violation(
                "unexpected answer to Lock",
                format!("client {client}: {other:?} {r:?}"),
            );
            return Ok(Next::Keep);
        }
    }
    add(&sh.report.ops.grants, 1);
    let fence = r.fence;
    let start = Instant::now();
    // The server's lease runs from its grant, which came after `sent`: the
    // only safe bound the client has. A long wait may use it all up.
    let mut valid_until = lease.map(|l| sent + l - LEASE_MARGIN);
    if valid_until.is_some_and(|v| start >= v) {
        return release(client, w, sh, &keys, valid_until).await;
    }
    write_all(client, sh, &keys, fence);
    let hold = Duration::from_millis(rng.u64(0..20));
    if let (Some(l), true) = (lease, rng.bool()) {
        // Renew halfway: the lease then runs from the Renew.
        tokio::time::sleep(hold / 2).await;
        let mut renew = w.request(RequestType::Renew, &keys);
        let b = renew.lock.get_or_insert_with(Default::default);
        b.release_micro = l.as_micros() as u64;
        let renew_sent = Instant::now();
        add(&sh.report.ops.requests, 1);
        let r = w.call(renew, PATIENCE).await?;
        if status(&r) == ResponseStatus::Ok {
            valid_until = Some(renew_sent + l - LEASE_MARGIN);
        } else if valid_until.is_some_and(|v| renew_sent < v) {
            sh.report.violation(
                "lock lost while held",
                format!("client {client}: Renew of a live lease: {r:?}"),
            );
        }
    }
    let hold_until = start + hold;
    tokio::time::sleep_until(valid_until.map_or(hold_until, |v| v.min(hold_until))).await;
    if valid_until.is_none_or(|v| Instant::now() < v) {
        write_all(client, sh, &keys, fence);
    }
    let end = Instant::now();
    for k in &keys {
        sh.history.record(Hold {
            key: k.clone(),
            fence,
            client,
            start: start.into_std(),
            end: end.into_std(),
        });
    }
    match rng.u8(0..20) {
        0 if lease.is_some() => {
            add(&sh.report.ops.lease_expiries, 1);
            Ok(Next::Keep)
        }
        1 => Ok(Next::Reconnect), // Disconnecting releases what has no lease.
        _ => release(client, w, sh, &keys, valid_until).await,
    }
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

/// Writes under `fence` to every key; the register must accept, since the
/// client holds the keys.
fn write_all(client: u64, sh: &Workload, keys: &[String], fence: u64) {
    for k in keys {
        add(&sh.report.ops.register_writes, 1);
        if !sh.register.write(k, fence) {
            sh.report.violation(
                "register rejected a holder",
                format!("client {client} key {k:?} fence {fence}"),
            );
        }
    }
}

pub fn status(r: &Response) -> ResponseStatus {
    ResponseStatus::try_from(r.status).unwrap_or(ResponseStatus::General)
}
