//! A paused server (SIGSTOP: it answers nothing, closes nothing) must not
//! leave a client believing it still holds a lock: the client library gives
//! the lock up on its own clock before the server, once resumed, can hand
//! it on.

mod common;

use common::process::Process;
use dlock::{Client, LockOptions, Lost};
use std::time::Duration;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_client_gives_up_its_lock_while_the_server_is_paused() {
    let server = Process::start(&["--idle-timeout", "2s"]);
    let addr = server.addr.to_string();
    let holder = Client::connect(&addr).await.unwrap();
    let bound = holder.lock(["bound"], LockOptions::new()).await.unwrap();
    let lease = holder
        .lock(["leased"], LockOptions::new().lease(Duration::from_secs(2)))
        .await
        .unwrap();
    server.signal("STOP");
    let (lost_bound, lost_lease) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(bound.lost(), lease.keep_alive())
    })
    .await
    .expect("loss reported while the server is paused");
    assert!(
        matches!(lost_bound, Lost::Jeopardy { lease: false, .. }),
        "{lost_bound}"
    );
    assert!(
        matches!(lost_lease, Lost::Jeopardy { lease: true, .. }),
        "{lost_lease}"
    );
    // Both were given up before their deadlines, which the server, once
    // resumed, can only act on after.
    assert!(Instant::now() < bound.deadline().max(lease.deadline()));
    server.signal("CONT");
    // Resumed, the server lets the lease run out: a second client gets it.
    let other = Client::connect(&addr).await.unwrap();
    let g = tokio::time::timeout(PATIENCE, other.lock(["leased"], LockOptions::new()))
        .await
        .expect("the lease ran out after the resume")
        .unwrap();
    assert!(g.fence() > lease.fence());
    // The connection-bound lock is only reported in jeopardy: the holder's
    // connection lives on after the resume, so it is still held until the
    // holder lets it go.
    assert_eq!(
        other.inspect(["bound"]).await.unwrap()[0].fence(),
        Some(bound.fence())
    );
    let _ = lease.into_parts();
    drop(bound);
    server.signal("TERM");
    assert!(server.wait().success());
}
