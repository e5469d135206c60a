//! One `Client` shared by many tasks: each lock is its own owner, so the
//! tasks take turns on the shared key exactly as separate processes would.
//!
//! `cargo run --example shared_client -- [ADDR]` (default 127.0.0.1:7436).

use dlock::{Client, Error, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| dlock::DEFAULT_ADDR.into());
    let client = Client::connect(&addr).await?;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                let guard = client.lock(["shared/counter"], LockOptions::new()).await?;
                println!("worker {worker} round {round}: fence {}", guard.fence());
                guard.unlock().await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| Error::Protocol(e.to_string()))??;
    }
    Ok(())
}
