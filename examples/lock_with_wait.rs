//! Take a lock, waiting at most 10 s for it, do the work while watching
//! for its loss, release it.
//!
//! `cargo run --example lock_with_wait -- [ADDR]` (default 127.0.0.1:7436).

use dlock::{Client, Error, LockOptions};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| dlock::DEFAULT_ADDR.into());
    let client = Client::connect(&addr).await?;
    let guard = match client
        .lock(
            ["reports/daily"],
            LockOptions::new().wait(Duration::from_secs(10)),
        )
        .await
    {
        Ok(g) => g,
        Err(Error::Timeout { busy }) => {
            eprintln!("still busy after 10 s: {busy:?}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("holding with fencing token {}", guard.fence());
    tokio::select! {
        // The work: pass guard.fence() to what it writes.
        _ = tokio::time::sleep(Duration::from_secs(1)) => guard.unlock().await?,
        lost = guard.lost() => eprintln!("lock lost, work abandoned: {lost}"),
    }
    Ok(())
}
