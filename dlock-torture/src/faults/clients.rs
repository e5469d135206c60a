//! Hostile and broken clients. Each fault runs on its own connection and
//! checks that the server deals with it: drops it within its timeouts and
//! passes its locks on.

use crate::history::Hold;
use crate::honest::wire::status;
use crate::report::add;
use crate::target::IDLE_TIMEOUT;
use crate::wire::Wire;
use crate::workload::Workload;
use dlock::proto::{RequestType, ResponseStatus};
use dlock::{Client, Error, LockOptions, Lost};
use dlock_server::testing::proxy::FreezableProxy;
use socket2::SockRef;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long past its idle or write timeout the server may take to drop a
/// misbehaving client before that counts as a violation.
const SLACK: Duration = Duration::from_secs(10);

/// Connections opened at once by one storm.
const STORM: usize = 100;

/// The kinds, in the order the scheduler cycles through them.
pub const KINDS: [&str; 7] = [
    "rst while holding",
    "silent while holding",
    "stops reading",
    "half a frame",
    "garbage",
    "connection storm",
    "frozen path holding",
];

pub async fn run(kind: usize, id: u64, sh: Arc<Workload>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let name = KINDS[kind % KINDS.len()];
    sh.report.fault(name);
    let outcome = match kind % KINDS.len() {
        0 => rst(id, &sh, &mut rng).await,
        1 => silent(id, &sh, &mut rng).await,
        2 => stops_reading(id, &sh, &mut rng).await,
        3 => half_frame(&sh).await,
        4 => garbage(&sh, &mut rng).await,
        5 => storm(&sh, &mut rng).await,
        _ => frozen_path(id, &sh, &mut rng).await,
    };
    if let Err(what) = outcome {
        sh.report
            .violation("faulty client mishandled", format!("{name}: {what}"));
    }
}

/// Locks one or two pool keys (with a short wait), writes under the fence
/// and records the hold; returns the keys and fence when granted.
async fn take(
    id: u64,
    w: &mut Wire,
    sh: &Workload,
    rng: &mut fastrand::Rng,
) -> Result<Option<(Vec<String>, u64)>, String> {
    let n = rng.usize(1..=2.min(sh.keys.len()));
    let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), n);
    let mut req = w.request(RequestType::Lock, &keys);
    req.lock.get_or_insert_with(Default::default).wait_micro = 1_000_000;
    add(&sh.report.ops.requests, 1);
    let r = w
        .call(req, Duration::from_secs(10))
        .await
        .map_err(|e| format!("Lock: {e}"))?;
    if status(&r) != ResponseStatus::Ok {
        add(&sh.report.ops.busy, 1);
        return Ok(None);
    }
    add(&sh.report.ops.grants, 1);
    let start = Instant::now();
    for k in &keys {
        add(&sh.report.ops.register_writes, 1);
        if !sh.register.write(k, r.fence) {
            sh.report.violation(
                "register rejected a holder",
                format!("faulty client {id} key {k:?} fence {}", r.fence),
            );
        }
    }
    let end = Instant::now();
    for k in &keys {
        sh.history.record(Hold {
            key: k.clone(),
            fence: r.fence,
            client: id,
            shared: false,
            start: start.into_std(),
            end: end.into_std(),
        });
    }
    Ok(Some((keys, r.fence)))
}

/// Holds keys, then resets the connection: the server must release them.
async fn rst(id: u64, sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let mut w = Wire::connect(sh.addr).await.map_err(|e| e.to_string())?;
    take(id, &mut w, sh, rng).await?;
    if rng.bool() {
        // Leave a waiting Lock behind as well.
        let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), 1);
        let req = w.request(RequestType::Lock, &keys);
        let _ = w.raw.send(&req).await;
    }
    let _ = SockRef::from(w.raw.stream()).set_linger(Some(Duration::ZERO));
    Ok(())
}

/// Holds keys, then sends nothing: the server must drop the connection
/// after its idle timeout. A write with the old token afterwards is stale
/// and, once someone else has written, rejected.
async fn silent(id: u64, sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let mut w = Wire::connect(sh.addr).await.map_err(|e| e.to_string())?;
    let held = take(id, &mut w, sh, rng).await?;
    if !w.await_close(IDLE_TIMEOUT + SLACK).await {
        return Err("silent connection not dropped after the idle timeout".into());
    }
    if let Some((keys, fence)) = held {
        // Like a process resuming from a long pause: by now the next holder
        // has written under a newer token.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for k in &keys {
            if !sh.register.write(k, fence) {
                add(&sh.report.ops.stale_writes_rejected, 1);
            }
        }
    }
    Ok(())
}

/// Holds a key, then pipelines Inspects of many keys without reading the
/// answers, which are larger than the requests: once the socket buffers
/// are full the server must drop it after its write timeout.
async fn stops_reading(id: u64, sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let mut w = Wire::connect(sh.addr).await.map_err(|e| e.to_string())?;
    take(id, &mut w, sh, rng).await?;
    let keys: Vec<String> = (0..64).map(|i| format!("unread-{i}")).collect();
    let mut batch = bytes::BytesMut::new();
    for _ in 0..64 {
        let req = w.request(RequestType::Inspect, &keys);
        dlock::codec::encode_frame(&req, &mut batch);
    }
    let dropped = tokio::time::timeout(IDLE_TIMEOUT + SLACK, async {
        // Bounded: at most 100 MB of requests however the server behaves.
        for _ in 0..(100 << 20) / batch.len() {
            if w.raw.send_bytes(&batch).await.is_err() {
                return true;
            }
        }
        false
    })
    .await;
    match dropped {
        Ok(true) => Ok(()),
        Ok(false) => Err("server read 100 MB from a client that never reads".into()),
        Err(_) => Err("client that stops reading not dropped after the write timeout".into()),
    }
}

/// Two bytes of a length prefix, then nothing.
async fn half_frame(sh: &Workload) -> Result<(), String> {
    let mut w = Wire::connect(sh.addr).await.map_err(|e| e.to_string())?;
    w.raw.send_bytes(&[0, 0]).await.map_err(|e| e.to_string())?;
    if w.await_close(IDLE_TIMEOUT + SLACK).await {
        Ok(())
    } else {
        Err("half a frame kept the connection open".into())
    }
}

/// Random bytes, sometimes behind a plausible length prefix.
async fn garbage(sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let mut w = Wire::connect(sh.addr).await.map_err(|e| e.to_string())?;
    let len = rng.usize(1..2_000);
    let mut bytes: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(len).collect();
    if rng.bool() {
        let body = (len as u32).saturating_sub(4);
        bytes[..4.min(len)].copy_from_slice(&body.to_be_bytes()[..4.min(len)]);
    }
    // The server may answer, or close at once on an oversize length.
    let _ = w.raw.send_bytes(&bytes).await;
    if w.await_close(IDLE_TIMEOUT + SLACK).await {
        Ok(())
    } else {
        Err("garbage kept the connection open past the idle timeout".into())
    }
}

/// Many connections at once; half ping, all leave, some by reset.
async fn storm(sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..STORM {
        let addr = sh.addr;
        let ping = rng.bool();
        let reset = rng.bool();
        set.spawn(async move {
            let mut w = Wire::connect(addr).await.map_err(|e| e.to_string())?;
            if ping {
                let req = w.request(RequestType::Ping, &[]);
                let r = w
                    .call(req, Duration::from_secs(10))
                    .await
                    .map_err(|e| format!("ping in a storm: {e}"))?;
                if status(&r) != ResponseStatus::Ok {
                    return Err(format!("ping in a storm: {r:?}"));
                }
            }
            if reset {
                let _ = SockRef::from(w.raw.stream()).set_linger(Some(Duration::ZERO));
            }
            Ok::<(), String>(())
        });
    }
    let mut first_error = None;
    while let Some(r) = set.join_next().await {
        if let Ok(Err(e)) = r {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Holds keys (with or without a lease) through a forwarder that freezes
/// while the client writes under its fence: nothing passes, nothing closes.
/// The client library's own rule must make it stop writing before the
/// server can hand the keys on; its hold ends when the guard says so, and
/// the history checks that no later holder started before that.
async fn frozen_path(id: u64, sh: &Workload, rng: &mut fastrand::Rng) -> Result<(), String> {
    let proxy = FreezableProxy::start(sh.addr).await;
    let client = Client::connect(&proxy.addr_string())
        .await
        .map_err(|e| format!("connect through the forwarder: {e}"))?;
    let n = rng.usize(1..=2.min(sh.keys.len()));
    let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), n);
    let mut options = LockOptions::new().wait(Duration::from_secs(1));
    if rng.bool() {
        options = options.lease(Duration::from_millis(rng.u64(1_000..3_000)));
    }
    add(&sh.report.ops.requests, 1);
    let guard = match client.lock(keys.clone(), options).await {
        Ok(g) => g,
        Err(Error::Timeout { .. }) => {
            add(&sh.report.ops.busy, 1);
            return Ok(());
        }
        Err(e) => return Err(format!("Lock: {e}")),
    };
    add(&sh.report.ops.grants, 1);
    let start = Instant::now();
    let freeze_at = start + Duration::from_millis(rng.u64(0..500));
    let writer = async {
        loop {
            for k in &keys {
                add(&sh.report.ops.register_writes, 1);
                if !sh.register.write(k, guard.fence()) {
                    sh.report.violation(
                        "register rejected a holder",
                        format!("frozen-path client {id} key {k:?} fence {}", guard.fence()),
                    );
                }
            }
            if Instant::now() >= freeze_at {
                proxy.freeze();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The longest a loss may take: a session timeout or lease, and slack.
    let limit = IDLE_TIMEOUT + guard.lease().unwrap_or_default() + SLACK;
    let lost = tokio::select! {
        // Checked first at every wake-up, so no write follows the verdict.
        biased;
        lost = guard.keep_alive() => lost,
        _ = writer => unreachable!("the writer loops until dropped"),
        _ = tokio::time::sleep(limit) => {
            return Err(format!("holder behind a frozen path never gave up its lock within {limit:?}"));
        }
    };
    let end = Instant::now();
    for k in &keys {
        sh.history.record(Hold {
            key: k.clone(),
            fence: guard.fence(),
            client: id,
            shared: false,
            start: start.into_std(),
            end: end.into_std(),
        });
    }
    let _ = guard.into_parts();
    match lost {
        Lost::Jeopardy { .. } => Ok(()),
        other => Err(format!(
            "behind a frozen path the loss should be jeopardy, was: {other}"
        )),
    }
}
