//! A lease kept alive while the work runs: it survives a dropped connection
//! (another connection can take it over by its fence), and `keep_alive`
//! says when it can no longer be counted on.
//!
//! `cargo run --example lease_keeper -- [ADDR]` (default 127.0.0.1:7436).

use dlock::{Client, Error, LockOptions};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| dlock::DEFAULT_ADDR.into());
    let client = Client::connect(&addr).await?;
    let guard = client
        .lock(
            ["jobs/nightly"],
            LockOptions::new().lease(Duration::from_secs(15)),
        )
        .await?;
    println!(
        "lease taken, fence {}, deadline in {:?}",
        guard.fence(),
        guard.deadline() - tokio::time::Instant::now()
    );
    tokio::select! {
        // Work three lease lengths long: renewed every 5 s meanwhile.
        _ = tokio::time::sleep(Duration::from_secs(45)) => {
            guard.unlock().await?;
            println!("done, released");
        }
        lost = guard.keep_alive() => eprintln!("stop: {lost}"),
    }
    Ok(())
}
