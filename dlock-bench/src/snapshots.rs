//! Lock and Unlock latency on a cluster while its nodes write snapshots
//! (issue 44): the same load in three phases, none of them snapshotting,
//! then the leader asked for a snapshot again and again (SIGUSR1), then a
//! follower, so each phase's p99.9 can be set beside the quiet one's.
//!
//! The nodes are meant to run with a `--snapshot-every` too large to reach
//! during the run, so that the quiet phase has no snapshot of its own; the
//! script (bench/snapshot_stall.sh) checks the nodes' logs for that.

use crate::stats::{Control, Latency, Recorder, Report};
use crate::workloads::Target;
use dlock::proto::{RequestType, ResponseStatus};
use std::io;
use std::time::{Duration, Instant};

/// Which nodes to ask for snapshots, and how often.
#[derive(Debug, Clone, Copy)]
pub struct Nodes {
    /// The leader's process id.
    pub leader: u32,
    /// A follower's process id.
    pub follower: u32,
    /// How often a snapshot is asked for; one asked for while the last is
    /// still being written is the same snapshot.
    pub every: Duration,
}

/// One phase's latencies, Lock and Unlock apart.
#[derive(Default)]
struct Phase {
    lock: Recorder,
    unlock: Recorder,
    /// Snapshots asked for.
    asked: u64,
}

impl Phase {
    fn merge(&mut self, other: &Phase) {
        self.lock.merge(&other.lock);
        self.unlock.merge(&other.unlock);
        self.asked += other.asked;
    }
}

/// Runs the three phases `rounds` times, `duration` each, with `conns`
/// connections locking and unlocking a key of their own.
pub async fn stall(
    t: Target,
    duration: Duration,
    conns: usize,
    nodes: Nodes,
    rounds: u32,
) -> Report {
    let names = ["quiet", "leader", "follower"];
    let mut phases: [Phase; 3] = Default::default();
    let started = Instant::now();
    for _ in 0..rounds.max(1) {
        for (i, pid) in [None, Some(nodes.leader), Some(nodes.follower)]
            .into_iter()
            .enumerate()
        {
            let phase = run_phase(&t, duration, conns, pid, nodes.every).await;
            phases[i].merge(&phase);
        }
    }
    let all = phases.iter().fold(Recorder::default(), |mut all, p| {
        all.merge(&p.lock);
        all.merge(&p.unlock);
        all
    });
    let mut report = Report::new("snapshot-stall", conns, started.elapsed(), &all, None, None)
        .with("rounds", u64::from(rounds.max(1)))
        .with("phase_s", duration.as_secs_f64());
    let quiet = (
        Latency::of(&phases[0].lock.hist),
        Latency::of(&phases[0].unlock.hist),
    );
    for (name, p) in names.iter().zip(&phases) {
        let (lock, unlock) = (Latency::of(&p.lock.hist), Latency::of(&p.unlock.hist));
        report = report
            .with(&format!("{name}_ops"), p.lock.ops + p.unlock.ops)
            .with(&format!("{name}_snapshots_asked"), p.asked)
            .with(&format!("{name}_lock_p99_us"), lock.p99_us)
            .with(&format!("{name}_lock_p999_us"), lock.p999_us)
            .with(&format!("{name}_lock_max_us"), lock.max_us)
            .with(&format!("{name}_unlock_p99_us"), unlock.p99_us)
            .with(&format!("{name}_unlock_p999_us"), unlock.p999_us)
            .with(&format!("{name}_unlock_max_us"), unlock.max_us);
        if *name != "quiet" {
            report = report
                .with(
                    &format!("{name}_lock_p999_ratio"),
                    ratio(lock.p999_us, quiet.0.p999_us),
                )
                .with(
                    &format!("{name}_unlock_p999_ratio"),
                    ratio(unlock.p999_us, quiet.1.p999_us),
                );
        }
    }
    report
}

fn ratio(a: u64, b: u64) -> f64 {
    (a as f64 / b.max(1) as f64 * 100.0).round() / 100.0
}

/// One phase: the load for `duration`, and a snapshot asked of `pid`
/// every `every` meanwhile (none without a pid).
async fn run_phase(
    t: &Target,
    duration: Duration,
    conns: usize,
    pid: Option<u32>,
    every: Duration,
) -> Phase {
    let ctl = Control::new(duration, None);
    let asker = pid.map(|pid| tokio::spawn(ask_for_snapshots(pid, every, ctl.deadline())));
    let workers: Vec<_> = (0..conns)
        .map(|i| {
            let (t, ctl) = (t.clone(), ctl.clone());
            tokio::spawn(async move { worker(t, ctl, i).await })
        })
        .collect();
    let mut phase = Phase::default();
    for w in workers {
        match w.await {
            Ok((p, result)) => {
                phase.merge(&p);
                if let Err(e) = result {
                    phase.lock.errors += 1;
                    eprintln!("dlock-bench: worker stopped: {e}");
                }
            }
            Err(e) => {
                phase.lock.errors += 1;
                eprintln!("dlock-bench: worker panicked: {e}");
            }
        }
    }
    if let Some(a) = asker {
        phase.asked = a.await.unwrap_or(0);
    }
    phase
}

/// Sends SIGUSR1 to `pid` every `every` until `until`; how many were sent.
async fn ask_for_snapshots(pid: u32, every: Duration, until: Instant) -> u64 {
    let mut asked = 0;
    let Some(target) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        eprintln!("dlock-bench: {pid} is not a process id");
        return 0;
    };
    // The first one a moment in, so the phase starts quiet for its workers
    // to connect.
    let mut next = Instant::now() + every / 4;
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        match rustix::process::kill_process(target, rustix::process::Signal::USR1) {
            Ok(()) => asked += 1,
            Err(e) => eprintln!("dlock-bench: SIGUSR1 to {pid}: {e}"),
        }
        next += every;
    }
    asked
}

/// One connection: Lock, then Unlock, of a key of its own, each timed.
async fn worker(t: Target, ctl: Control, i: usize) -> (Phase, io::Result<()>) {
    let key = vec![format!("bench/stall/{i}")];
    let mut p = Phase::default();
    let result = async {
        let mut c = t.connect().await?;
        while ctl.next() {
            let lock = c.request(RequestType::Lock, &key);
            let start = Instant::now();
            let locked = c.call(&lock).await?;
            p.lock.outcome(ok(locked.status), start);
            let unlock = c.request(RequestType::Unlock, &key);
            let start = Instant::now();
            let unlocked = c.call(&unlock).await?;
            p.unlock.outcome(ok(unlocked.status), start);
        }
        Ok(())
    }
    .await;
    (p, result)
}

fn ok(status: i32) -> bool {
    status == ResponseStatus::Ok as i32
}
