//! Lock+unlock cycles/s of 100 tasks sharing one `Client`, beside 100 tasks
//! with a `Client` each, against the same server in the same run.
//!
//! ```sh
//! cargo run --release -p dlock-server -- --threads 1 &
//! cargo run --release --example shared_client_bench -- 127.0.0.1:7436 5
//! ```
//! Arguments: server address (loopback), seconds per mode (default 5). Every
//! loop stops by itself after that time.

use dlock::{Client, LockOptions};
use std::time::{Duration, Instant};

const TASKS: usize = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), dlock::Error> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .unwrap_or_else(|| dlock::DEFAULT_ADDR.to_string());
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let run_for = Duration::from_secs(secs.clamp(1, 600));

    let shared = Client::connect(&addr).await?;
    let clients = vec![shared; TASKS];
    let a = cycles(clients, "shared", run_for).await?;

    let mut own = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        own.push(Client::connect(&addr).await?);
    }
    let b = cycles(own, "own", run_for).await?;
    println!("{TASKS} tasks sharing one Client : {a:>9.0} lock+unlock cycles/s");
    println!("{TASKS} tasks, one Client each   : {b:>9.0} lock+unlock cycles/s");
    println!("ratio shared/own              : {:>9.2}", a / b);
    Ok(())
}

/// Each task locks and unlocks a key of its own until `run_for` has passed;
/// returns cycles per second over all tasks.
async fn cycles(clients: Vec<Client>, label: &str, run_for: Duration) -> Result<f64, dlock::Error> {
    let start = Instant::now();
    let stop = start + run_for;
    let mut tasks = Vec::new();
    for (t, c) in clients.into_iter().enumerate() {
        let key = format!("bench/{label}/{t}");
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                let g = c.lock([key.as_str()], LockOptions::new()).await?;
                g.unlock().await?;
                n += 1;
            }
            Ok::<u64, dlock::Error>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t
            .await
            .map_err(|e| dlock::Error::Protocol(e.to_string()))??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}
