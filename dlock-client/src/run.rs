//! What `dlock` does: take the lock, run the command, watch both.

use crate::child::{exit_code, Child};
use crate::cli::{Args, OnLost};
use crate::exit::{self, Failure};
use crate::keeper::{self, Keeper, Reconnect};
use crate::signals::Signals;
use dlock::{Client, ClientOptions, Error, LockGuard, LockOptions};
use std::time::Duration;
use tokio::time::Instant;

/// Runs dlock; returns the exit code.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(args: Args) -> Result<u8, Failure> {
    let options = ClientOptions {
        connect_timeout: args.connect_timeout,
        access_token: token(&args)?,
        ..ClientOptions::default()
    };
    if args.ping {
        return ping(&args, options).await;
    }
    let keys = args.all_keys();
    if keys.is_empty() {
        return Err(Failure::new(
            exit::USAGE,
            "no key given: use -k KEY or --auto-key (see --help)",
        ));
    }
    if args.inspect {
        return inspect(&args, options, keys).await;
    }
    let argv = args.argv();
    if argv.is_empty() {
        return Err(Failure::new(
            exit::USAGE,
            "no command given: put it after -- or use -c STRING (see --help)",
        ));
    }

    let mut signals = Signals::install()?;
    let client = keeper::connect(&args.server, options.clone()).await?;
    let sent = Instant::now();
    let guard = tokio::select! {
        guard = acquire(&args, &client, &keys) => guard?,
        sig = signals.recv() => {
            if args.verbose {
                eprintln!("dlock: interrupted while waiting for the lock; command not run");
            }
            return Ok(128 + sig as u8);
        }
    };
    let acquired = Instant::now();
    let lease = guard.lease();
    // From here on the keys are managed by hand: at the end they are either
    // released or, with --hold, left behind as a lease.
    let (keys, fence) = guard.into_parts();
    let reconnect = Reconnect {
        server: args.server.clone(),
        options,
        verbose: args.verbose,
    };
    let mut keeper = Keeper::start(client, keys.clone(), fence, lease, sent, reconnect.clone());

    let mut child = match Child::spawn(&argv, &keys, fence) {
        Ok(c) => c,
        Err(f) => {
            let _ = keeper.client().unlock_fence(&keys, fence).await;
            return Err(f);
        }
    };
    let outcome = supervise(
        &args,
        &mut child,
        &mut keeper,
        &mut signals,
        acquired,
        &keys,
    )
    .await;
    keeper.stop();
    let status = outcome
        .status
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("lost track of the command: {e}")))?;

    if outcome.lost.is_none() {
        let client = keeper.final_client(&reconnect).await;
        release(&args, &client, &keys, fence, acquired).await;
    }
    if outcome.max_time_hit {
        return Ok(exit::MAX_TIME);
    }
    if outcome.lost.is_some() && args.on_lost != OnLost::Ignore {
        return Ok(exit::LOCK_LOST);
    }
    Ok(exit_code(status))
}

struct Outcome {
    status: std::io::Result<std::process::ExitStatus>,
    lost: Option<String>,
    max_time_hit: bool,
}

/// Waits for the command while forwarding signals and stopping it when the
/// lock is lost or --max-time passes.
async fn supervise(
    args: &Args,
    child: &mut Child,
    keeper: &mut Keeper,
    signals: &mut Signals,
    acquired: Instant,
    keys: &[String],
) -> Outcome {
    let mut lost = None;
    let mut max_time_hit = false;
    let mut kill_at: Option<Instant> = None;
    let max_deadline = args.max_time.map(|d| acquired + d);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.recv() => {
                if child.should_forward(sig) {
                    child.signal(sig);
                }
            }
            reason = keeper.lost(), if lost.is_none() => {
                eprintln!("dlock: lock on {} lost ({reason})", keys.join(","));
                match args.on_lost {
                    OnLost::Term => {
                        eprintln!("dlock: stopping the command (SIGTERM, SIGKILL after {:?})", args.grace);
                        child.signal(libc::SIGTERM);
                        kill_at.get_or_insert(Instant::now() + args.grace);
                    }
                    OnLost::Kill => {
                        eprintln!("dlock: killing the command");
                        child.signal(libc::SIGKILL);
                    }
                    OnLost::Ignore => eprintln!("dlock: --on-lost ignore: the command keeps running"),
                }
                lost = Some(reason);
            }
            _ = sleep_until(max_deadline), if max_deadline.is_some() && !max_time_hit => {
                eprintln!(
                    "dlock: --max-time {:?} exceeded; stopping the command (SIGTERM, SIGKILL after {:?})",
                    args.max_time.unwrap_or_default(),
                    args.grace
                );
                max_time_hit = true;
                child.signal(libc::SIGTERM);
                kill_at.get_or_insert(Instant::now() + args.grace);
            }
            _ = sleep_until(kill_at), if kill_at.is_some() => {
                child.signal(libc::SIGKILL);
                kill_at = None;
            }
        }
    };
    Outcome {
        status,
        lost,
        max_time_hit,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Releases the keys, or with --hold leaves them as a lease for what is left
/// of the hold time, so dlock can exit at once.
async fn release(args: &Args, client: &Client, keys: &[String], fence: u64, acquired: Instant) {
    let remaining = args
        .hold
        .map_or(Duration::ZERO, |h| h.saturating_sub(acquired.elapsed()));
    if !remaining.is_zero() {
        match client.renew_fence(keys, fence, remaining).await {
            Ok(()) => {
                if args.verbose {
                    eprintln!(
                        "dlock: keeping {} for another {remaining:.1?} (--hold)",
                        keys.join(",")
                    );
                }
                return;
            }
            Err(e) => eprintln!("dlock: cannot keep the lock for --hold: {e}"),
        }
    }
    match client.unlock_fence(keys, fence).await {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        // The connection closing releases a lock without a lease anyway.
        Err(e) if args.verbose => eprintln!("dlock: release: {e}"),
        Err(_) => {}
    }
}

async fn acquire(args: &Args, client: &Client, keys: &[String]) -> Result<LockGuard, Failure> {
    let mut options = LockOptions {
        lease: args.lease,
        ..LockOptions::default()
    };
    if args.nonblock {
        options = options.no_wait();
    } else if let Some(w) = args.wait {
        options = options.wait(w);
    }
    let start = Instant::now();
    if args.verbose && !args.nonblock {
        // Try first, so the wait can be explained before it starts.
        match client
            .lock(keys.to_vec(), LockOptions { ..options }.no_wait())
            .await
        {
            Ok(g) => {
                eprintln!(
                    "dlock: acquired {} (fence {}) at once",
                    keys.join(","),
                    g.fence()
                );
                return Ok(g);
            }
            Err(Error::Timeout { busy }) => describe_wait(client, &busy).await,
            Err(e) => return Err(exit::from_client_error(e, &args.server)),
        }
    }
    match client.lock(keys.to_vec(), options).await {
        Ok(g) => {
            if args.verbose {
                eprintln!(
                    "dlock: acquired {} (fence {}) after {:.3}s",
                    keys.join(","),
                    g.fence(),
                    start.elapsed().as_secs_f64()
                );
            }
            Ok(g)
        }
        Err(Error::Timeout { busy }) => {
            let message = if args.verbose {
                format!(
                    "lock busy: {} (gave up after {:.3}s)",
                    busy.join(","),
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

async fn describe_wait(client: &Client, busy: &[String]) {
    let Ok(infos) = client.inspect(busy.to_vec()).await else {
        eprintln!("dlock: waiting for {}", busy.join(","));
        return;
    };
    for info in infos {
        let holder = if info.fence == 0 {
            "free, earlier waiters first".to_string()
        } else if info.holder_addr.is_empty() {
            format!("held by a lease (fence {})", info.fence)
        } else {
            format!("held by {} (fence {})", info.holder_addr, info.fence)
        };
        eprintln!(
            "dlock: waiting for {}: {holder}, {} waiting",
            info.key, info.waiters
        );
    }
}

async fn ping(args: &Args, options: ClientOptions) -> Result<u8, Failure> {
    let client = keeper::connect(&args.server, options).await?;
    let rtt = client
        .ping()
        .await
        .map_err(|e| exit::from_client_error(e, &args.server))?;
    println!("{} ok {:.3} ms", args.server, rtt.as_secs_f64() * 1e3);
    Ok(0)
}

async fn inspect(args: &Args, options: ClientOptions, keys: Vec<String>) -> Result<u8, Failure> {
    let client = keeper::connect(&args.server, options).await?;
    let infos = client
        .inspect(keys)
        .await
        .map_err(|e| exit::from_client_error(e, &args.server))?;
    println!(
        "{:<24} {:<8} {:<22} {:<20} {:>10} {:>7}",
        "KEY", "STATE", "HOLDER", "FENCE", "LEASE", "WAITERS"
    );
    for i in infos {
        let state = if i.fence == 0 { "free" } else { "held" };
        let holder = match (i.fence, i.holder_addr.as_str()) {
            (0, _) => "-",
            (_, "") => "(disconnected)",
            (_, addr) => addr,
        };
        let fence = if i.fence == 0 {
            "-".to_string()
        } else {
            i.fence.to_string()
        };
        let lease = if i.lease_remaining_micro == 0 {
            "-".to_string()
        } else {
            format!("{:.1}s", i.lease_remaining_micro as f64 / 1e6)
        };
        println!(
            "{:<24} {:<8} {:<22} {:<20} {:>10} {:>7}",
            i.key, state, holder, fence, lease, i.waiters
        );
    }
    Ok(0)
}

/// The access token: from --token-file (first line), else DLOCK_TOKEN.
fn token(args: &Args) -> Result<Option<String>, Failure> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::new(
                exit::USAGE,
                format!("cannot read token file {}: {e}", path.display()),
            )
        })?;
        let token = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or_default();
        if token.is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                format!("token file {} is empty", path.display()),
            ));
        }
        return Ok(Some(token.to_string()));
    }
    Ok(std::env::var("DLOCK_TOKEN").ok().filter(|t| !t.is_empty()))
}
