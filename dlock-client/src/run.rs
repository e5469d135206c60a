//! What `dlock` does: take the lock, run the command, watch both, and end
//! within a bounded time whatever the server does.

use crate::child::{exit_code, Child};
use crate::cli::{Args, OnLost};
use crate::exit::{self, Failure};
use crate::guardian::Guardian;
use crate::keeper::Keeper;
use crate::say;
use crate::signals::{self, Signals};
use dlock::{Client, ClientOptions, Enqueued, Error, LockGuard, LockOptions, Lost};
use std::io::IsTerminal;
use std::time::Duration;
use tokio::time::Instant;

/// Runs dlock; returns the exit code.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(args: Args) -> Result<u8, Failure> {
    let options = crate::connect::client_options(&args)?;
    if args.ping {
        return ping(&args, options).await;
    }
    let keys = args.all_keys();
    if args.inspect {
        return crate::inspect::run(&args, options, keys).await;
    }
    let argv = command_line(&args, &keys)?;
    let mut signals = install_signals()?;
    // Kept open until dlock ends, as the connection it first made.
    let client = crate::connect::connect(&args.server, options.clone()).await?;
    run_locked(&args, options, client, &keys, &argv, &[], &mut signals).await
}

/// The signal handlers of a run: installed before anything waits, and
/// kept across `dlock elect`'s campaigns so no signal falls between two.
/// Without a terminal the command leads a process group of its own, and
/// job-control stops are dlock's to pass on.
pub fn install_signals() -> Result<Signals, Failure> {
    Signals::install(!std::io::stdin().is_terminal())
}

/// The command to run, once there are keys to lock and a command.
pub fn command_line(args: &Args, keys: &[String]) -> Result<Vec<String>, Failure> {
    let argv = args.argv();
    if keys.is_empty() {
        // `dlock --lease 5s elect -k K -- cmd`: the subcommand came after
        // an option of the lock form, which took it for COMMAND.
        if let Some(sub) = argv.first().filter(|w| crate::subcommand::is_name(w)) {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "`{sub}` is a subcommand: name it before its options \
                     (dlock {sub} [OPTIONS] ...; see dlock {sub} --help)"
                ),
            ));
        }
        return Err(Failure::new(
            exit::USAGE,
            "no key given: use -k KEY or --auto-key (see --help)",
        ));
    }
    if argv.is_empty() {
        return Err(no_command(args));
    }
    warn_without_separator(args);
    Ok(argv)
}

/// dlock's main path: wait for the lock through `client`, run COMMAND
/// under it while keeping the lock, then release it and give COMMAND's
/// exit code. `value` goes with the hold (`dlock elect`'s identity); empty
/// for none.
pub async fn run_locked(
    args: &Args,
    options: ClientOptions,
    client: Client,
    keys: &[String],
    argv: &[String],
    value: &[u8],
    signals: &mut Signals,
) -> Result<u8, Failure> {
    // As `install_signals` decided.
    let own_group = !std::io::stdin().is_terminal();
    if args.verbose {
        report_reconnects(&client);
    }
    check_limits(args, &client, keys)?;
    let guard = match wait_for_lock(args, &client, keys, value, signals).await? {
        Waited::Locked(guard) => guard,
        Waited::Interrupted(sig) => {
            say!(
                "interrupted by {} while waiting for the lock; command not run",
                signals::name(sig)
            );
            // The server may have granted the Lock as it was given up, and
            // a lease outlives the connection: the library releases such a
            // grant in the background, which must be done before dlock
            // exits (10 s at most). A second signal does not wait.
            tokio::select! {
                () = client.close() => {}
                _ = interrupt(signals) => {}
            }
            return Ok(128 + sig as u8);
        }
    };
    let acquired = Instant::now();
    let fence = guard.fence();
    let mut keeper = start_keeper(args, guard)?;
    let mut child = match Child::spawn(argv, keys, fence, own_group, keeper.guardian_fd()) {
        Ok(c) => c,
        Err(f) => {
            release(args, &options, keeper.into_guard(), acquired).await;
            return Err(f);
        }
    };
    let outcome = supervise(args, &mut child, &mut keeper, signals, acquired).await;
    conclude(args, &options, keeper.into_guard(), outcome, acquired).await
}

/// Says on stderr when a connection to a cluster breaks and when its
/// session is resumed, and on which node, for as long as `client` lives.
fn report_reconnects(client: &Client) {
    let mut events = client.events();
    tokio::spawn(async move {
        let mut report = crate::reconnects::Reconnects::default();
        loop {
            match events.recv().await {
                Ok(e) => {
                    if let Some(line) = report.line(&e) {
                        say!("{line}");
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    say!("({n} connection events not shown)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// How the wait for the lock ended.
enum Waited {
    Locked(LockGuard),
    /// A signal came first: its number.
    Interrupted(i32),
}

/// Waits for the lock, or for a signal that ends the wait.
async fn wait_for_lock(
    args: &Args,
    client: &Client,
    keys: &[String],
    value: &[u8],
    signals: &mut Signals,
) -> Result<Waited, Failure> {
    tokio::select! {
        guard = acquire(args, client, keys, value) => Ok(Waited::Locked(guard?)),
        sig = interrupt(signals) => Ok(Waited::Interrupted(sig)),
    }
}

/// Starts keeping the lock, with the guardian that outlives dlock beside
/// it; refuses to go on with a lock already lost.
fn start_keeper(args: &Args, guard: LockGuard) -> Result<Keeper, Failure> {
    let enforce = args.on_lost != OnLost::Ignore;
    // Started before COMMAND, so no moment of COMMAND's life is unguarded.
    let guardian = Guardian::start("the command");
    if guardian.is_none() {
        say!("warning: cannot start the guardian: if dlock dies, processes the command started are not stopped");
    }
    let keeper = Keeper::new(guard, guardian, enforce);
    if keeper.guard().is_lost() {
        // A deadline already past leaves COMMAND's first steps unguarded:
        // do not start it.
        let _ = keeper.into_guard().into_parts();
        // Nothing ran: `dlock elect` campaigns again, as after any loss
        // before it led.
        return Err(Failure {
            transient: true,
            ..Failure::new(
                exit::LOCK_LOST,
                "the lock was lost before the command could start",
            )
        });
    }
    Ok(keeper)
}

/// After COMMAND: release the lock unless it was lost, and choose the exit
/// code.
async fn conclude(
    args: &Args,
    options: &ClientOptions,
    guard: LockGuard,
    outcome: Outcome,
    acquired: Instant,
) -> Result<u8, Failure> {
    let status = outcome
        .status
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("lost track of the command: {e}")))?;

    // Killed by the guardian but not lost: dlock was only too slow to move
    // the guardian's deadline, and the lock may well still be held.
    if outcome.lost.is_none() {
        release(args, options, guard, acquired).await;
    } else {
        // Lost: nothing to release, and the drop must not try.
        let _ = guard.into_parts();
    }
    if outcome.max_time_hit {
        return Ok(exit::MAX_TIME);
    }
    if outcome.lost.is_some() || outcome.guardian_killed {
        return Ok(exit::LOCK_LOST);
    }
    Ok(exit_code(status))
}

/// The next signal that ends a wait for the lock; job-control signals are
/// not among them (there is no command to stop yet).
pub async fn interrupt(signals: &mut Signals) -> i32 {
    loop {
        let sig = signals.recv().await;
        if sig != libc::SIGTSTP && sig != libc::SIGCONT {
            return sig;
        }
    }
}

fn no_command(args: &Args) -> Failure {
    let message = match args.auto_key.as_deref() {
        // `dlock --auto-key /opt/job.sh` reads the command as the PREFIX.
        Some(prefix) if prefix != "auto:" => format!(
            "no command given: --auto-key took '{prefix}' as its PREFIX; \
             put the command after --, as in: dlock --auto-key -- {prefix}"
        ),
        _ => "no command given: put it after -- or use -c STRING (see --help)".into(),
    };
    Failure::new(exit::USAGE, message)
}

/// `dlock -k a b` runs `b` with the lock on `a`, which may be a typo for
/// `-k a -k b`: say so, unless `--` made the intent plain.
fn warn_without_separator(args: &Args) {
    if args.command.is_some() || std::env::args_os().any(|a| a == "--") {
        return;
    }
    if let Some(program) = args.command_args.first() {
        say!(
            "warning: running '{program}' as the command; put the command after -- \
             (several keys are given as -k a -k b)"
        );
    }
}

/// Checks what the server would refuse before anything runs, so a job
/// does not find out after COMMAND ran that its `--hold` was never kept.
fn check_limits(args: &Args, client: &Client, keys: &[String]) -> Result<(), Failure> {
    let Some(limits) = client.limits() else {
        return Ok(());
    };
    limits
        .check_keys(keys)
        .map_err(|e| Failure::new(exit::USAGE, format!("bad key: {e}")))?;
    for (flag, value) in [("--hold", args.hold), ("--lease", args.lease)] {
        if let Some(d) = value {
            limits.check_lease(d).map_err(|e| {
                Failure::new(
                    exit::USAGE,
                    format!("{flag} {} {e}", dlock::duration::format(d)),
                )
            })?;
        }
    }
    Ok(())
}

struct Outcome {
    status: std::io::Result<std::process::ExitStatus>,
    lost: Option<Lost>,
    max_time_hit: bool,
    /// The guardian killed COMMAND: its deadline passed before dlock moved it.
    guardian_killed: bool,
}

/// Waits for the command while forwarding signals, keeping the lock (and
/// through the keeper, the guardian's deadline), and stopping the command
/// when the lock is lost (or about to be) or --max-time passes.
async fn supervise(
    args: &Args,
    child: &mut Child,
    keeper: &mut Keeper,
    signals: &mut Signals,
    acquired: Instant,
) -> Outcome {
    let keys = crate::say::keys(keeper.guard().keys());
    let mut lost = None;
    let mut max_time_hit = false;
    let mut kill_at: Option<Instant> = None;
    let max_deadline = args.max_time.map(|d| acquired + d);
    let status = {
        // One future for the whole run: a renewal or reconnection in flight
        // must not be restarted by a signal or a timer.
        let watch = keeper.lost();
        tokio::pin!(watch);
        loop {
            tokio::select! {
                status = child.wait() => break status,
                sig = signals.recv() => match sig {
                    libc::SIGTSTP => {
                        say!("SIGTSTP: stopping the command; dlock keeps the lock meanwhile (SIGCONT resumes it)");
                        child.signal(libc::SIGTSTP);
                    }
                    sig if child.should_forward(sig) => child.signal(sig),
                    _ => {}
                },
                (reason, stop_by) = &mut watch, if lost.is_none() => {
                    say!("lock on {keys} lost: {reason}");
                    // The command must be gone before the server could
                    // hand the lock on, grace or not (at once if it has).
                    let at = (Instant::now() + args.grace).min(stop_by);
                    match args.on_lost {
                        OnLost::Term => {
                            say!(
                                "stopping the command (SIGTERM, SIGKILL in {:.1}s)",
                                at.saturating_duration_since(Instant::now()).as_secs_f64()
                            );
                            child.signal(libc::SIGTERM);
                            kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                        }
                        OnLost::Kill => {
                            say!("killing the command");
                            child.signal(libc::SIGKILL);
                        }
                        OnLost::Ignore => say!("--on-lost ignore: the command keeps running"),
                    }
                    lost = Some(reason);
                }
                _ = sleep_until(max_deadline), if max_deadline.is_some() && !max_time_hit => {
                    say!(
                        "--max-time {} exceeded; stopping the command (SIGTERM, SIGKILL after {})",
                        dlock::duration::format(args.max_time.unwrap_or_default()),
                        dlock::duration::format(args.grace)
                    );
                    max_time_hit = true;
                    child.signal(libc::SIGTERM);
                    let at = Instant::now() + args.grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
                _ = sleep_until(kill_at), if kill_at.is_some() => {
                    child.signal(libc::SIGKILL);
                    kill_at = None;
                }
            }
        }
    };
    // COMMAND may have ended because the lock was lost (its guardian
    // killed it while dlock was paused): that is a loss, not COMMAND's code.
    let guard = keeper.guard();
    if lost.is_none() && guard.is_lost() {
        let reason = Lost::Jeopardy {
            lease: guard.lease().is_some(),
            deadline: guard.deadline(),
        };
        say!("lock on {keys} lost while the command ran: {reason}");
        lost = Some(reason);
    }
    // Or the guardian killed it, its deadline passed before dlock (paused,
    // or slow to renew) moved it: the lock was given up, as documented for
    // 75, though the server may not have let it go.
    drop(guard);
    let guardian_killed = lost.is_none() && keeper.guardian_killed();
    if guardian_killed {
        say!("lock on {keys} given up while the command ran: its guardian killed the command, as dlock had not renewed the deadline in time");
    }
    Outcome {
        status,
        lost,
        max_time_hit,
        guardian_killed,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Releases the keys, or with --hold leaves them as a lease for what is left
/// of the hold time, so dlock can exit at once. Bounded by
/// --release-timeout: a server that does not answer cannot hold dlock (and
/// the cron runs behind it) up.
async fn release(args: &Args, options: &ClientOptions, guard: LockGuard, acquired: Instant) {
    let keys = crate::say::keys(guard.keys());
    let lease = guard.lease();
    let work = async {
        // A lease outlives its connection: release it from a new one.
        let mut guard = guard;
        if lease.is_some() && guard.client().is_closed() {
            let parts = guard.into_parts();
            let client = Client::connect_with(&args.server, options.clone()).await?;
            return client.unlock_fence(&parts.keys, parts.fence).await;
        }
        let remaining = args
            .hold
            .map_or(Duration::ZERO, |h| h.saturating_sub(acquired.elapsed()));
        if !remaining.is_zero() {
            match guard.renew(remaining).await {
                Ok(()) => {
                    if args.verbose {
                        say!("keeping {keys} for another {remaining:.1?} (--hold)");
                    }
                    let _ = guard.into_parts();
                    return Ok(());
                }
                Err(e) => say!("cannot keep the lock for --hold: {e}"),
            }
        }
        guard.unlock().await
    };
    match tokio::time::timeout(args.release_timeout, work).await {
        Ok(Ok(()) | Err(Error::NotHeld { .. })) => {}
        Ok(Err(e)) => say!("release of {keys} failed: {e}; {}", left_to_server(lease)),
        Err(_) => say!(
            "the server did not answer the release of {keys} within {} (--release-timeout); {}",
            dlock::duration::format(args.release_timeout),
            left_to_server(lease)
        ),
    }
}

fn left_to_server(lease: Option<Duration>) -> String {
    match lease {
        Some(l) => format!(
            "the lease ends on its own at most {} after its last renewal",
            dlock::duration::format(l)
        ),
        None => "the server releases the lock when the connection closes, as dlock exits".into(),
    }
}

async fn acquire(
    args: &Args,
    client: &Client,
    keys: &[String],
    value: &[u8],
) -> Result<LockGuard, Failure> {
    let mut options = LockOptions {
        lease: args.lease,
        ..LockOptions::default()
    };
    if args.shared {
        options = options.shared();
    }
    if let Some(n) = args.limit {
        options = options.limit(n);
    }
    if args.nonblock {
        options = options.no_wait();
    } else if let Some(w) = args.wait {
        options = options.wait(w);
    }
    let start = Instant::now();
    let locked = match &args.on_queued {
        Some(hook) => enqueue_then_wait(args, client, keys, options, hook).await,
        None => {
            if args.verbose && !args.nonblock {
                // Try first, so the wait can be explained before it starts.
                match client
                    .lock_with_value(keys.to_vec(), options.no_wait(), value)
                    .await
                {
                    Ok(g) => {
                        say!(
                            "acquired {} (fence {}) at once",
                            crate::say::keys(keys),
                            g.fence()
                        );
                        return Ok(g);
                    }
                    Err(Error::Busy { busy }) => {
                        describe_holders(client, &busy, "waiting for").await
                    }
                    Err(e) => return Err(exit::from_client_error(e, &args.server)),
                }
            }
            client.lock_with_value(keys.to_vec(), options, value).await
        }
    };
    match locked {
        Ok(g) => {
            if args.verbose {
                say!(
                    "acquired {} (fence {}) after {:.3}s",
                    crate::say::keys(keys),
                    g.fence(),
                    start.elapsed().as_secs_f64()
                );
            }
            Ok(g)
        }
        Err(Error::Timeout { busy } | Error::Busy { busy }) => {
            let message = if args.verbose {
                if args.nonblock {
                    describe_holders(client, &busy, "busy:").await;
                }
                format!(
                    "lock busy: {} (gave up after {:.3}s)",
                    crate::say::keys(&busy),
                    start.elapsed().as_secs_f64()
                )
            } else {
                String::new()
            };
            Err(Failure::new(args.conflict_exit_code, message))
        }
        Err(e) => Err(exit::from_client_error(e, &args.server)),
    }
}

/// `--on-queued`: the lock in two steps, with `hook` run in between when
/// the request has to wait in line.
async fn enqueue_then_wait(
    args: &Args,
    client: &Client,
    keys: &[String],
    options: LockOptions,
    hook: &str,
) -> Result<LockGuard, Error> {
    match client.enqueue(keys.to_vec(), options).await? {
        Enqueued::Granted(g) => Ok(g),
        Enqueued::Queued(q) => {
            if args.verbose {
                say!(
                    "queued for {} with {} ahead",
                    crate::say::keys(keys),
                    q.place()
                );
                describe_holders(client, keys, "waiting for").await;
            }
            // The wait runs beside the hook: the wait limit (-w) counts
            // from the Enqueue, and a request that runs out meanwhile is
            // reported then, the hook killed, not once a slow hook ends.
            // A grant that comes first waits for the hook, which runs
            // before COMMAND.
            let place = q.place();
            let hook = crate::hook::on_queued(hook, keys, place);
            let waited = q.wait();
            tokio::pin!(hook, waited);
            tokio::select! {
                () = &mut hook => waited.await,
                outcome = &mut waited => {
                    if outcome.is_ok() {
                        hook.await;
                    }
                    outcome
                }
            }
        }
    }
}

/// Says who holds each of `busy`, one line per key.
async fn describe_holders(client: &Client, busy: &[String], what: &str) {
    let Ok(infos) = client.inspect(busy.to_vec()).await else {
        say!("{what} {}", crate::say::keys(busy));
        return;
    };
    for info in infos {
        let holder = match info.holders.last() {
            None => "free, earlier waiters first".to_string(),
            Some(_) if info.shared => {
                let limit = match info.limit {
                    0 => String::new(),
                    n => format!(" of at most {n}"),
                };
                let holders = info.holders.len() + info.holders_omitted as usize;
                format!("held shared by {holders} holders{limit}")
            }
            Some(h) => match h.holder_addr {
                None => format!("held by a lease (fence {})", h.fence),
                Some(addr) => format!("held by {addr} (fence {})", h.fence),
            },
        };
        say!("{what} {:?}: {holder}, {} waiting", info.key, info.waiters);
    }
}

async fn ping(args: &Args, options: ClientOptions) -> Result<u8, Failure> {
    let client = crate::connect::connect(&args.server, options).await?;
    let rtt = client
        .ping()
        .await
        .map_err(|e| exit::from_client_error(e, &args.server))?;
    let ms = rtt.as_secs_f64() * 1e3;
    let leader = client.session().is_some();
    let addr = if leader {
        client.addr()
    } else {
        args.server.clone()
    };
    crate::stdout::print(match args.output {
        crate::cli::Output::Json => format!(
            "{}\n",
            serde_json::json!({ "server": addr, "ok": true, "rtt_ms": ms, "cluster_leader": leader })
        ),
        crate::cli::Output::Text if leader => format!("{addr} ok {ms:.3} ms (cluster leader)\n"),
        crate::cli::Output::Text => format!("{addr} ok {ms:.3} ms\n"),
    })?;
    Ok(0)
}
