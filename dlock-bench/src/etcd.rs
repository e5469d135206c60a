//! etcd's own v3 lock, as a reference measured in the same run as a dlock
//! cluster (feature `etcd`, off by default; see `bench/cluster.sh`).
//!
//! Each client is what etcd's `concurrency` package does for a mutex, over
//! its own gRPC connection: one session lease granted once, then Lock (the
//! server puts a key under the name with the lease and waits until every
//! earlier key under the name is gone) and Unlock (deletes that key). Run
//! against etcd's leader, so no request takes a follower's extra hop.

use crate::stats::{Control, Recorder};
use crate::workloads::run_workers;
use etcd_client::{Client, LockOptions};
use std::io;
use std::time::Instant;

/// The session lease's TTL in seconds: far beyond any run, so it never
/// needs a keep-alive (a run is at most an hour).
const LEASE_TTL_S: i64 = 3_700;

/// `conns` clients locking and unlocking: each its own name, or all one
/// name (`contended`: every cycle is a hand-off, in etcd's revision order).
pub async fn lock_unlock(
    endpoints: Vec<String>,
    ctl: Control,
    conns: usize,
    contended: bool,
) -> Recorder {
    run_workers(conns, move |i| {
        let (endpoints, ctl) = (endpoints.clone(), ctl.clone());
        let name = if contended {
            "bench/etcd-contended".to_string()
        } else {
            format!("bench/etcd-lu/{i}")
        };
        async move {
            let mut rec = Recorder::default();
            let result = async {
                let mut c = Client::connect(&endpoints, None).await.map_err(io_err)?;
                let lease = c.lease_grant(LEASE_TTL_S, None).await.map_err(io_err)?;
                let options = LockOptions::new().with_lease(lease.id());
                while ctl.next() {
                    let start = Instant::now();
                    let locked = c
                        .lock(name.as_str(), Some(options.clone()))
                        .await
                        .map_err(io_err)?;
                    c.unlock(locked.key()).await.map_err(io_err)?;
                    rec.ok(start.elapsed());
                }
                // Leave nothing behind: the lease (and any key) goes now.
                let _ = c.lease_revoke(lease.id()).await;
                Ok(())
            }
            .await;
            (rec, result)
        }
    })
    .await
}

fn io_err(e: etcd_client::Error) -> io::Error {
    io::Error::other(format!("etcd: {e}"))
}
