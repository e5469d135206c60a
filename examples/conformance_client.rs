//! The Rust library's program for the client conformance kit
//! (clients/conformance/kit.py, docs/CLIENTS.md "Conformance kit").
//!
//! `DLOCK_SERVER=HOST:PORT[,HOST:PORT...] conformance_client KEY` takes KEY
//! exclusively without a lease, waiting as long as it takes; prints
//! `held FENCE`; keeps the lock until a line arrives on stdin (or stdin
//! closes); then releases it, prints `released` and exits 0. If the lock is
//! lost meanwhile it prints `lost REASON` and exits 1. Any other error: a
//! message on stderr, exit 2.
//!
//! `conformance_client --turns N KEY`: two tasks share one `Client`; each, N
//! times, locks KEY, prints `enter W FENCE`, holds it 20 ms, prints
//! `leave W FENCE` and unlocks (`error TEXT` and exit 1 on an error).

use dlock::{Client, LockOptions};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// How long each turn holds the key: long enough that a second holder
/// would have time to enter.
const HOLD: Duration = Duration::from_millis(20);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let servers = std::env::var("DLOCK_SERVER").unwrap_or_else(|_| dlock::DEFAULT_ADDR.into());
    let client = match Client::connect(servers.as_str()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("conformance_client: cannot connect: {e}");
            return ExitCode::from(2);
        }
    };
    match args.as_slice() {
        [flag, n, key] if flag == "--turns" => match n.parse::<u32>() {
            Ok(n) => turns(client, n, key).await,
            Err(e) => usage(&format!("--turns {n}: {e}")),
        },
        [key] if !key.is_empty() && !key.starts_with('-') => hold(client, key).await,
        _ => usage("expected KEY or --turns N KEY"),
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("conformance_client: {why}\nusage: conformance_client [--turns N] KEY   (DLOCK_SERVER names the nodes)");
    ExitCode::from(2)
}

/// One line on stdout, written whole: the kit reads the lines of two tasks.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn hold(client: Client, key: &str) -> ExitCode {
    let guard = match client.lock([key], LockOptions::new()).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("conformance_client: cannot take {key:?}: {e}");
            return ExitCode::from(2);
        }
    };
    say(&format!("held {}", guard.fence()));
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    tokio::select! {
        lost = guard.lost() => {
            say(&format!("lost {}", lost.to_string().split_whitespace().collect::<Vec<_>>().join(" ")));
            return ExitCode::from(1);
        }
        // A line, or stdin closed (or unreadable): release either way.
        _ = stdin.read_line(&mut line) => {}
    }
    if guard.is_lost() {
        say("lost the lock's deadline passed before its release");
        return ExitCode::from(1);
    }
    match guard.unlock().await {
        Ok(()) => {
            say("released");
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(&format!("lost not held any more when released ({e})"));
            ExitCode::from(1)
        }
    }
}

async fn turns(client: Client, n: u32, key: &str) -> ExitCode {
    let mut workers = Vec::new();
    for w in 1..=2 {
        let (client, key) = (client.clone(), key.to_string());
        workers.push(tokio::spawn(async move {
            for _ in 0..n {
                let guard = client.lock([key.as_str()], LockOptions::new()).await?;
                say(&format!("enter {w} {}", guard.fence()));
                tokio::time::sleep(HOLD).await;
                say(&format!("leave {w} {}", guard.fence()));
                guard.unlock().await?;
            }
            Ok::<(), dlock::Error>(())
        }));
    }
    let mut code = ExitCode::SUCCESS;
    for (w, worker) in workers.into_iter().enumerate() {
        match worker.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                say(&format!("error worker {}: {e}", w + 1));
                code = ExitCode::from(1);
            }
            Err(e) => {
                say(&format!("error worker {}: {e}", w + 1));
                code = ExitCode::from(1);
            }
        }
    }
    code
}
