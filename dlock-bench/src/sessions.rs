//! Idle sessions on a cluster: what keeping them alive costs the log.
//!
//! Each of N connections opens a session and then only Pings, once every
//! `every` (a client library's heartbeat: a quarter of the session TTL),
//! the connections' Pings spread evenly over that period. On a cluster a
//! Ping keeps its connection's sessions alive, which is a commit; the
//! leader puts the keep-alives that arrive during one commit into the
//! next entry. The report counts Pings and the log entries the leader
//! committed meanwhile (its ClusterStatus before and after), and so how
//! many keep-alives share an entry.

use crate::stats::{Recorder, Report};
use crate::workloads::{open_many, Target};
use dlock::proto::{RequestType, ResponseStatus};
use dlock_testkit::proc_sample::ProcSample;
use std::io;
use std::time::{Duration, Instant};

/// The leader's last committed index, from a ClusterStatus.
async fn committed(t: &Target) -> io::Result<u64> {
    let mut c = t.connect().await?;
    let req = c.request(RequestType::ClusterStatus, &[]);
    let r = c.call(&req).await?;
    match (ResponseStatus::try_from(r.status), r.cluster) {
        (Ok(ResponseStatus::Ok), Some(info)) => Ok(info.committed_index),
        _ => Err(io::Error::other(format!(
            "ClusterStatus answered {} ({}): is the server a cluster node?",
            r.status, r.error_text
        ))),
    }
}

/// Opens `n` sessions, keeps them alive with Pings every `every` for
/// `duration`, and reports Pings and committed entries per second.
pub async fn idle(
    t: Target,
    duration: Duration,
    n: usize,
    every: Duration,
    pid: Option<u32>,
) -> io::Result<Report> {
    let (open, failed) = open_many(&t, n, RequestType::OpenSession).await;
    let sessions = open.len();
    let first = committed(&t).await?;
    let before = pid.and_then(ProcSample::read);
    let start = Instant::now();
    let end = start + duration;
    let mut workers = Vec::with_capacity(sessions);
    for (i, mut c) in open.into_iter().enumerate() {
        // Evenly spread over one period, as independent clients would be.
        let offset = every.mul_f64(i as f64 / sessions.max(1) as f64);
        workers.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut next = tokio::time::Instant::now() + offset;
            loop {
                tokio::time::sleep_until(next).await;
                if Instant::now() >= end {
                    return rec;
                }
                let ping = c.request(RequestType::Ping, &[]);
                let started = Instant::now();
                let ok = c.call(&ping).await.is_ok_and(|r| r.status == 0);
                rec.outcome(ok, started);
                next += every;
            }
        }));
    }
    let mut rec = Recorder::default();
    for w in workers {
        if let Ok(r) = w.await {
            rec.merge(&r);
        }
    }
    let elapsed = start.elapsed();
    let after = pid.and_then(ProcSample::read);
    let entries = committed(&t).await?.saturating_sub(first);
    let secs = elapsed.as_secs_f64().max(1e-3);
    Ok(
        Report::new("idle-sessions", sessions, elapsed, &rec, before, after)
            .with("session_open_failures", failed)
            .with("ping_every_ms", every.as_millis() as u64)
            .with("entries", entries)
            .with("entries_per_sec", (entries as f64 / secs).round())
            .with(
                "pings_per_entry",
                ((rec.ops as f64 / entries.max(1) as f64) * 100.0).round() / 100.0,
            ),
    )
}
