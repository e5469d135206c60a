//! Throughput and latency workloads: ping, lock-unlock, pipeline, churn.

use crate::stats::{Control, Recorder};
use dlock::proto::{RequestType, ResponseStatus};
use dlock::raw::{RawClient, Stream};
use dlock::ClientOptions;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::time::Instant;

/// Everything a worker needs to reach the server.
#[derive(Clone)]
pub struct Target {
    pub addr: String,
    pub token: String,
    /// TLS settings (--tls-ca) in `tls`; plain TCP without.
    pub options: ClientOptions,
}

impl Target {
    pub async fn connect(&self) -> io::Result<RawClient<Stream>> {
        Ok(RawClient::connect_with(&self.addr, &self.options)
            .await?
            .with_token(self.token.as_str()))
    }
}

/// Opens `n` connections that each send one `first` request (a Ping, an
/// OpenSession) and got Ok for it, 256 at a time: a connection storm is
/// not what the idle workloads measure. Returns them and how many failed.
pub async fn open_many(t: &Target, n: usize, first: RequestType) -> (Vec<RawClient<Stream>>, u64) {
    let mut open = Vec::with_capacity(n);
    let mut failed = 0u64;
    for batch in (0..n).collect::<Vec<_>>().chunks(256) {
        let tasks: Vec<_> = batch
            .iter()
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move {
                    let mut c = t.connect().await?;
                    let req = c.request(first, &[]);
                    let r = c.call(&req).await?;
                    match ResponseStatus::try_from(r.status) {
                        Ok(ResponseStatus::Ok) => Ok(c),
                        _ => Err(io::Error::other(format!(
                            "{} answered {}: {}",
                            first.as_str_name(),
                            r.status,
                            r.error_text
                        ))),
                    }
                })
            })
            .collect();
        for task in tasks {
            match task.await {
                Ok(Ok(c)) => open.push(c),
                _ => failed += 1,
            }
        }
    }
    (open, failed)
}

/// Runs `n` workers to completion and merges their figures. A worker that
/// fails counts one error and stops; the others go on.
pub async fn run_workers<F, Fut>(n: usize, worker: F) -> Recorder
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = (Recorder, io::Result<()>)> + Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(worker(i))).collect();
    let mut total = Recorder::default();
    // Each different reason once, with how many workers it stopped: fifty
    // workers that cannot connect said the same line fifty times.
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for h in handles {
        let why = match h.await {
            Ok((rec, result)) => {
                total.merge(&rec);
                match result {
                    Ok(()) => continue,
                    Err(e) => format!("worker stopped: {e}"),
                }
            }
            Err(e) => format!("worker panicked: {e}"),
        };
        total.errors += 1;
        match reasons.iter_mut().find(|(r, _)| *r == why) {
            Some((_, count)) => *count += 1,
            None => reasons.push((why, 1)),
        }
    }
    for (why, count) in reasons {
        match count {
            1 => eprintln!("dlock-bench: {why}"),
            n => eprintln!("dlock-bench: {why} ({n} workers)"),
        }
    }
    total
}

fn ok(status: i32) -> bool {
    status == ResponseStatus::Ok as i32
}

/// One Ping in flight per connection.
pub async fn ping(t: Target, ctl: Control, conns: usize) -> Recorder {
    run_workers(conns, move |_| {
        let (t, ctl) = (t.clone(), ctl.clone());
        async move {
            let mut rec = Recorder::default();
            let result = async {
                let mut c = t.connect().await?;
                while ctl.next() {
                    let req = c.request(RequestType::Ping, &[]);
                    let start = Instant::now();
                    let r = c.call(&req).await?;
                    rec.outcome(ok(r.status), start);
                }
                Ok(())
            }
            .await;
            (rec, result)
        }
    })
    .await
}

/// Lock then Unlock of a key of the connection's own, two round trips.
pub async fn lock_unlock(t: Target, ctl: Control, conns: usize, prefix: &str) -> Recorder {
    let prefix = prefix.to_string();
    run_workers(conns, move |i| {
        let (t, ctl) = (t.clone(), ctl.clone());
        let key = vec![format!("{prefix}/{i}")];
        async move {
            let mut rec = Recorder::default();
            let result = async {
                let mut c = t.connect().await?;
                while ctl.next() {
                    let start = Instant::now();
                    let lock = c.request(RequestType::Lock, &key);
                    let locked = c.call(&lock).await?;
                    let unlock = c.request(RequestType::Unlock, &key);
                    let unlocked = c.call(&unlock).await?;
                    rec.outcome(ok(locked.status) && ok(unlocked.status), start);
                }
                Ok(())
            }
            .await;
            (rec, result)
        }
    })
    .await
}

/// `depth` requests (or lock+unlock pairs) in flight per connection; the
/// latency of each is from its write to its answer.
pub async fn pipeline(
    t: Target,
    ctl: Control,
    conns: usize,
    depth: usize,
    pairs: bool,
) -> Recorder {
    run_workers(conns, move |i| {
        let (t, ctl) = (t.clone(), ctl.clone());
        let key = vec![format!("bench/pipe/{i}")];
        async move {
            let mut rec = Recorder::default();
            let result = async {
                let mut c = t.connect().await?;
                // Send time of each op in flight; a pair's op ends with its Unlock.
                let mut in_flight: VecDeque<Instant> = VecDeque::with_capacity(depth);
                let per_op = if pairs { 2 } else { 1 };
                loop {
                    while in_flight.len() < depth && ctl.next() {
                        if pairs {
                            let lock = c.request(RequestType::Lock, &key);
                            let unlock = c.request(RequestType::Unlock, &key);
                            c.queue(&lock);
                            c.queue(&unlock);
                        } else {
                            let ping = c.request(RequestType::Ping, &[]);
                            c.queue(&ping);
                        }
                        in_flight.push_back(Instant::now());
                    }
                    if in_flight.is_empty() {
                        return Ok(());
                    }
                    c.flush().await?;
                    // Wait for one answer, then take every answer already
                    // received, and top the window up in one write: like a
                    // real pipelining client, not one syscall per request.
                    let mut answers = vec![c.recv().await?];
                    while answers.len() < in_flight.len() * per_op {
                        match c.buffered()? {
                            Some(r) => answers.push(r),
                            None => break,
                        }
                    }
                    // A pair whose second answer is not here yet waits for it.
                    if answers.len() % per_op != 0 {
                        answers.push(c.recv().await?);
                    }
                    for op in answers.chunks(per_op) {
                        let sent = in_flight.pop_front().unwrap_or_else(Instant::now);
                        rec.outcome(op.iter().all(|r| ok(r.status)), sent);
                    }
                }
            }
            .await;
            (rec, result)
        }
    })
    .await
}

/// Connect, lock a key, disconnect: the server must release it each time.
pub async fn churn(t: Target, ctl: Control, conns: usize) -> Recorder {
    run_workers(conns, move |i| {
        let (t, ctl) = (t.clone(), ctl.clone());
        let key = vec![format!("bench/churn/{i}")];
        async move {
            let mut rec = Recorder::default();
            let result = async {
                while ctl.next() {
                    let start = Instant::now();
                    let mut c = t.connect().await?;
                    let lock = c.request(RequestType::Lock, &key);
                    // Waits if the previous connection's release is still in
                    // flight: that is part of what churn measures.
                    let r = c.call(&lock).await?;
                    drop(c);
                    rec.outcome(ok(r.status), start);
                }
                Ok(())
            }
            .await;
            (rec, result)
        }
    })
    .await
}
