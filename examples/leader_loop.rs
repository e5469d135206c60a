//! A leader-style loop with [`dlock::Election`]: campaign for a key with a
//! name, act as leader while leading, step down on loss, and campaign
//! again; an observer task prints every change of leader. Bounded to a few
//! terms.
//!
//! `cargo run --example leader_loop -- [ADDR] [NAME]` (default
//! 127.0.0.1:7436). Run two with different names and stop one.

use dlock::{Client, Election, Error};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| dlock::DEFAULT_ADDR.into());
    let name = args
        .next()
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let client = Client::connect(&addr).await?;
    let election = Election::new(&client, "leader/reports");

    // Follow the leadership, pushed by the server (no polling).
    let mut leaders = election.observe().await?;
    let me = name.clone();
    tokio::spawn(async move {
        while leaders.changed().await.is_ok() {
            match leaders.borrow_and_update().as_ref() {
                Some(l) => println!(
                    "{me} sees: leader {} (fence {})",
                    String::from_utf8_lossy(&l.value),
                    l.fence
                ),
                None => println!("{me} sees: no leader"),
            }
        }
    });

    for term in 0..3 {
        // Campaign: wait in line for leadership.
        let leadership = election.campaign(name.as_bytes()).await?;
        println!("{name}: leader, term {term}, fence {}", leadership.fence());
        tokio::select! {
            // Lead for a while, then hand over in turn.
            _ = tokio::time::sleep(Duration::from_secs(5)) => leadership.resign().await?,
            lost = leadership.lost() => println!("{name}: no longer leader: {lost}"),
        }
    }
    Ok(())
}
