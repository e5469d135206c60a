//! An honest client through the library, on either target: it locks
//! random keys (some as leases), writes to the fenced register while it
//! holds them and its guard does not say the lock may be lost, and checks
//! every answer: a lock refused or lost while its session (on a single
//! server, its connection) lives and its lease runs is a violation, as is
//! a request without an answer. What the cluster cost it (a hold cut
//! short, a place in line lost, a request failed) goes to the availability
//! count (`availability.rs`), which judges it against the faults.

use crate::availability::Loss;
use crate::history::Hold;
use crate::report::add;
use crate::workload::Workload;
use dlock::{Client, ClientOptions, Error, Event, LockGuard, LockOptions, Lost};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Past its own wait, how long a request may go unanswered: through a
/// failover, a fault's heal and a session's TTL. Longer is a hang.
const ANSWER_BOUND: Duration = Duration::from_secs(60);

/// The longest lease these clients take.
pub const MAX_LEASE: Duration = Duration::from_secs(3);

/// How long before its guard's alarm a lease held to the edge is used
/// for the last time and unlocked: timer slack on a loaded machine.
const EDGE: Duration = Duration::from_millis(20);

/// A grant later than this past its Lock's wait was held up by the
/// cluster (cluster time stands still between two leaders, so a failover
/// stretches every wait), not handed on at the wait's last moment: that
/// takes a commit and a round trip, well under a second even on a loaded
/// machine.
const LATE: Duration = Duration::from_secs(1);

pub async fn run(client: u64, sh: Arc<Workload>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let options = ClientOptions {
        session_ttl: Some(sh.session_ttl),
        connect_timeout: Duration::from_secs(2),
        // A connection to a paused node is given up within the TTL.
        keepalive: sh.session_ttl / 2,
        ..ClientOptions::default()
    };
    let mut conn: Option<Client> = None;
    while Instant::now() < sh.stop_at {
        let c = match conn.as_ref().filter(|c| !c.is_closed()) {
            Some(c) => c.clone(),
            None => match Client::connect_with(sh.servers.as_str(), options.clone()).await {
                Ok(c) => {
                    tokio::spawn(watch_events(c.clone(), sh.clone()));
                    conn.insert(c).clone()
                }
                Err(_) => {
                    sh.counts.bump("connect failed (no leader)");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        round(client, &c, &sh, &mut rng).await;
    }
}

/// Counts resumed sessions and how long each was without a connection.
async fn watch_events(c: Client, sh: Arc<Workload>) {
    let mut events = c.events();
    drop(c);
    loop {
        let e = tokio::select! {
            e = events.recv() => e,
            _ = tokio::time::sleep_until(sh.stop_at) => return,
        };
        match e {
            Ok(Event::Resumed { after, .. }) => {
                sh.counts.bump("sessions resumed");
                sh.resumes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(after);
            }
            Ok(Event::Reconnecting { .. }) => sh.counts.bump("reconnects"),
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// One lock's life: ask, hold, leave by Unlock or by letting a lease run
/// out.
async fn round(client: u64, c: &Client, sh: &Workload, rng: &mut fastrand::Rng) {
    let n = rng.usize(1..=3.min(sh.keys.len()));
    let keys: Vec<String> = rng.choose_multiple(sh.keys.iter().cloned(), n);
    let mut options = LockOptions::new();
    let wait = match rng.u8(0..3) {
        0 => {
            options = options.no_wait();
            Duration::ZERO
        }
        1 => Duration::from_millis(rng.u64(10..500)),
        _ => Duration::from_secs(3),
    };
    if !wait.is_zero() {
        options = options.wait(wait);
    }
    let lease = (rng.u8(0..3) == 0)
        .then(|| Duration::from_millis(rng.u64(500..MAX_LEASE.as_millis() as u64)));
    if let Some(l) = lease {
        options = options.lease(l);
    }
    // A third of the locks read: every key shared.
    let shared = rng.u8(0..3) == 0;
    if shared {
        options = options.shared();
    }
    add(&sh.report.ops.requests, 1);
    let sent = Instant::now();
    let answer = tokio::time::timeout(ANSWER_BOUND + wait, c.lock(keys.clone(), options)).await;
    let guard = match answer {
        Ok(Ok(g)) => g,
        Ok(Err(Error::Busy { .. } | Error::Timeout { .. })) => {
            add(&sh.report.ops.busy, 1);
            return;
        }
        Ok(Err(Error::NotHeld { .. }))
            if lease.is_some_and(|l| sent.elapsed() >= l.mul_f64(0.9)) =>
        {
            // A grant that came after most of its lease (a failover in the
            // wait): the library's renewal found the lease run out. Sooner
            // than that, the cluster dropped a live lease.
            sh.counts.bump("lease ran out before its grant arrived");
            if let (true, Some(l)) = (sent.elapsed() > wait + LATE, lease) {
                // Its wait allowed a usable grant: the cluster held it up.
                sh.lost(Loss::Lock, lease_room(l), || {
                    format!("client {client}: Lock {keys:?} granted after its lease ran out")
                });
            }
            return;
        }
        Ok(Err(e)) => {
            let unreachable = matches!(
                e,
                Error::Connect { .. } | Error::ConnectTimeout { .. } | Error::Unreachable { .. }
            );
            // A Lock that waited in line lost its place; one that would not
            // wait had none, and merely failed.
            let what = if wait.is_zero() {
                Loss::Request
            } else {
                Loss::Place
            };
            sh.lost(what, sh.session_room(), || {
                format!("client {client}: Lock {keys:?} waiting up to {wait:?}: {e}")
            });
            session_or_violation(client, sh, "Lock", e);
            if unreachable {
                // No leader now: try again later, not in a tight loop.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            return;
        }
        Err(_) => {
            sh.report.violation(
                "request not answered",
                format!("client {client}: Lock {keys:?}"),
            );
            sh.lost(Loss::Place, sh.session_room(), || {
                format!("client {client}: Lock {keys:?}: no answer")
            });
            return;
        }
    };
    add(&sh.report.ops.grants, 1);
    if shared {
        add(&sh.report.ops.shared_grants, 1);
    }
    let late = sent.elapsed() > wait + LATE;
    hold(client, guard, shared, late, sh, rng).await;
}

/// An error of a request: the end of its session (counted: faults end
/// sessions), or a violation.
fn session_or_violation(client: u64, sh: &Workload, what: &str, e: Error) {
    match e {
        Error::ConnectionLost(e) if sh.sessions_owed() => {
            sh.session_lost_while_owed(format!("client {client}: {what}: {e}"))
        }
        Error::ConnectionLost(_) => sh.counts.bump("sessions lost"),
        Error::Connect { .. } | Error::ConnectTimeout { .. } | Error::Unreachable { .. } => {
            sh.counts.bump("connect failed (no leader)")
        }
        // An answer, if not a useful one: the leader could not commit in
        // time. Counted; see "Not covered" in docs/RELIABILITY.md for the
        // lock such a Lock may leave held.
        Error::Server {
            status: dlock::proto::ResponseStatus::Unavailable,
            ..
        } => sh.counts.bump("answered Unavailable (outcome unknown)"),
        e => sh
            .report
            .violation("unexpected answer", format!("client {client}: {what}: {e}")),
    }
}

/// Holds the lock for a random time, writing the register at the start and
/// the end while the guard does not say it may be lost, perhaps renewing a
/// lease halfway; records the hold, then lets go. `late`: the grant came
/// later than its Lock's wait allowed.
async fn hold(
    client: u64,
    mut guard: LockGuard,
    shared: bool,
    late: bool,
    sh: &Workload,
    rng: &mut fastrand::Rng,
) {
    let start = Instant::now();
    if guard.is_lost() {
        // A long wait may use up a lease before the grant arrives: the
        // client's choice, unless the grant came after the wait allowed.
        sh.counts.bump("granted already in jeopardy");
        if late {
            sh.lost(Loss::Lock, lock_room(&guard, sh), || {
                format!(
                    "client {client}: fence {} granted in jeopardy, after its wait",
                    guard.fence()
                )
            });
        }
        return;
    }
    write_register(client, sh, &guard, shared);
    // Now and then a lease is held to the edge of what the client may
    // assume, just before its guard's alarm: a node whose clock runs
    // faster than the clients allow for would have handed the keys on by
    // then, which the register and the Unlock's answer show.
    let to_the_edge = guard.lease().is_some() && rng.u8(0..6) == 0;
    let hold_for = if to_the_edge {
        sh.counts.bump("leases held to the edge");
        let alarm = guard
            .deadline()
            .checked_sub(guard.margin())
            .unwrap_or(start);
        alarm
            .saturating_duration_since(Instant::now())
            .saturating_sub(EDGE)
    } else {
        Duration::from_millis(rng.u64(0..50))
    };
    let mut lost = None;
    // Whether a Renew was sent, and why it failed if it did.
    let mut renewed = false;
    let mut renew_failed = None;
    if to_the_edge {
        lost = wait_or_lost(&guard, hold_for).await;
    } else if let (Some(l), true) = (guard.lease(), rng.bool()) {
        lost = wait_or_lost(&guard, hold_for / 2).await;
        if lost.is_none() {
            let deadline = guard.deadline();
            renewed = true;
            match guard.renew(l).await {
                Ok(()) => {}
                Err(Error::NotHeld { .. }) if Instant::now() < deadline => {
                    sh.report.violation(
                        "lock lost while held",
                        format!("client {client}: Renew of a live lease {}", guard.fence()),
                    );
                    renew_failed = Some("not held".to_string());
                }
                Err(e) => renew_failed = Some(e.to_string()),
            }
        }
    }
    if lost.is_none() && !to_the_edge {
        lost = wait_or_lost(&guard, hold_for - hold_for / 2).await;
    }
    if lost.is_none() && !guard.is_lost() {
        write_register(client, sh, &guard, shared);
    }
    let mut end = Instant::now();
    if let Some(Lost::Jeopardy { deadline, .. }) = &lost {
        // An honest client stops using the lock when its guard says so,
        // even while a call is still out (a Renew held up by a failover):
        // the hold ends at the guard's alarm, not when this task next
        // looked. Whether the cluster kept the keys until then is what the
        // history checks.
        let alarm = deadline.checked_sub(guard.margin()).unwrap_or(start);
        end = end.min(alarm.max(start));
    }
    // Whether the cluster cut the hold short, not the client's own
    // choices: a lease falls into jeopardy by running its course (a wait
    // that used most of it, a hold to its edge) unless a Renew was sent,
    // so only a Renew that failed or came too late to keep it counts; a
    // lock without a lease is kept by the session, so any loss counts.
    let cut_short = renew_failed.is_some()
        || match &lost {
            Some(Lost::Jeopardy { lease: true, .. }) => renewed,
            Some(_) => true,
            None => false,
        };
    if cut_short {
        sh.lost(Loss::Lock, lock_room(&guard, sh), || {
            let why = match (&renew_failed, &lost) {
                (Some(e), _) => format!("Renew failed: {e}"),
                (None, Some(why)) => why.to_string(),
                (None, None) => String::new(),
            };
            format!("client {client}: fence {}: {why}", guard.fence())
        });
    }
    for k in guard.keys() {
        sh.history.record(Hold {
            key: k.clone(),
            fence: guard.fence(),
            client,
            shared,
            start: start.into_std(),
            end: end.into_std(),
        });
    }
    if let Some(why) = lost {
        // A session that ends while the cluster is whole is a failure; a
        // guard in jeopardy is the client's caution on a slow machine, and
        // counted.
        if matches!(why, Lost::ConnectionLost(_)) && sh.sessions_owed() {
            sh.session_lost_while_owed(format!(
                "client {client}: fence {}: {why:?}",
                guard.fence()
            ));
        }
        sh.counts.bump(match why {
            Lost::ConnectionLost(_) => "locks lost: session ended",
            Lost::Jeopardy { .. } => "locks lost: jeopardy",
            _ => "locks lost: refused",
        });
        return;
    }
    release(client, guard, cut_short, sh, rng).await;
}

/// The room a lock had to ride through a failover: its window (its
/// lease, or its session's TTL) less the guard's safety margin.
fn lock_room(guard: &LockGuard, sh: &Workload) -> Duration {
    match guard.lease() {
        Some(l) => l.saturating_sub(guard.margin()),
        None => sh.session_room(),
    }
}

/// The room a lease of `l` gives, by the margin a guard would keep.
fn lease_room(l: Duration) -> Duration {
    l.saturating_sub(dlock::safety::margin(
        dlock::safety::DEFAULT_SAFETY_MARGIN,
        l,
    ))
}

/// Sleeps `d`, or less if the guard says the lock may be lost.
async fn wait_or_lost(guard: &LockGuard, d: Duration) -> Option<Lost> {
    tokio::select! {
        _ = tokio::time::sleep(d) => None,
        why = guard.lost() => Some(why),
    }
}

/// Unlocks, or now and then lets a lease run out. The cluster must still
/// hold the keys for this client unless the guard's deadline passed or its
/// session ended. `counted`: the hold was already counted as cut short.
async fn release(
    client: u64,
    guard: LockGuard,
    counted: bool,
    sh: &Workload,
    rng: &mut fastrand::Rng,
) {
    if guard.lease().is_some() && rng.u8(0..10) == 0 {
        add(&sh.report.ops.lease_expiries, 1);
        let _ = guard.into_parts();
        return;
    }
    // A lock without a lease is gone when its session is; a lease outlives
    // it, and past its deadline it merely ran its course.
    let session_bound = guard.lease().is_none();
    let room = lock_room(&guard, sh);
    let conn = guard.client();
    let deadline = guard.deadline();
    let fence = guard.fence();
    add(&sh.report.ops.requests, 1);
    match tokio::time::timeout(ANSWER_BOUND, guard.unlock()).await {
        Ok(Ok(())) => add(&sh.report.ops.unlocks, 1),
        Ok(Err(Error::NotHeld { .. })) => {
            // Answered on a live session before the deadline: the cluster
            // dropped a lock it had to keep.
            if Instant::now() < deadline && !conn.is_closed() {
                sh.report.violation(
                    "lock lost while held",
                    format!("client {client}: Unlock of fence {fence}: not held"),
                );
            } else {
                sh.counts.bump("unlock after the deadline: not held");
                if session_bound && !counted {
                    sh.lost(Loss::Lock, room, || {
                        format!(
                            "client {client}: Unlock of fence {fence}: not held, its session gone"
                        )
                    });
                }
            }
        }
        Ok(Err(e)) => {
            let what = match e {
                Error::ConnectionLost(_) if session_bound && !counted => Loss::Lock,
                _ => Loss::Request,
            };
            sh.lost(what, room, || {
                format!("client {client}: Unlock of fence {fence}: {e}")
            });
            session_or_violation(client, sh, "Unlock", e);
        }
        Err(_) => {
            sh.report.violation(
                "request not answered",
                format!("client {client}: Unlock of fence {fence}"),
            );
            sh.lost(Loss::Request, room, || {
                format!("client {client}: Unlock of fence {fence}: no answer")
            });
        }
    }
}

/// Uses every key the guard holds under its fence, reading when held
/// shared and writing otherwise; the register must accept, since the client
/// holds them.
fn write_register(client: u64, sh: &Workload, guard: &LockGuard, shared: bool) {
    for k in guard.keys() {
        add(&sh.report.ops.register_writes, 1);
        if !sh.register.touch(k, guard.fence(), shared) {
            sh.report.violation(
                "register rejected a holder",
                format!(
                    "client {client} key {k:?} fence {} shared {shared}",
                    guard.fence()
                ),
            );
        }
    }
}
