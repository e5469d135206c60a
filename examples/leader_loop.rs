//! A leader-style loop: campaign for a key, act as leader while holding it,
//! step down on loss, and campaign again. Bounded to a few terms.
//!
//! `cargo run --example leader_loop -- [ADDR] [NAME]` (default
//! 127.0.0.1:7436). Run two with different names and stop one.

use dlock::{Client, Error, LockOptions};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| dlock::DEFAULT_ADDR.into());
    let name = args
        .next()
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let client = Client::connect(&addr).await?;
    for term in 0..3 {
        // Campaign: wait in line for leadership.
        let guard = client
            .lock(
                ["leader/reports"],
                LockOptions::new().lease(Duration::from_secs(10)),
            )
            .await?;
        println!("{name}: leader, term {term}, fence {}", guard.fence());
        tokio::select! {
            // Lead for a while, then hand over in turn.
            _ = tokio::time::sleep(Duration::from_secs(5)) => guard.unlock().await?,
            lost = guard.keep_alive() => println!("{name}: no longer leader: {lost}"),
        }
    }
    Ok(())
}
