//! The accept loop: connection limit, socket options, graceful shutdown.

use crate::engine::raft::ClusterStatus;
use crate::engine::{fence, raft, Engine};
use crate::net::connection;
use crate::net::shared::Shared;
use crate::net::tls::{self, Tls};
use crate::ops::acl::Access;
use crate::ops::config::Config;
use crate::ops::metrics::{self, CloseReason, Gauges, RaftGauges};
use crate::ops::metrics_http::{self, Health};
use crate::ops::reload::{self, Reloadable};
use crate::service::{reply, Service};
use anyhow::Context;
use dlock_proto::codec::encode_frame;
use dlock_proto::proto::ResponseStatus;
use socket2::{SockRef, TcpKeepalive};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Longest pause between accept attempts after errors such as running out of
/// file descriptors: long enough not to spin a core, short enough to recover
/// quickly once descriptors free up.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves `listener` until `shutdown` completes, then stops accepting,
/// answers waiting requests with ShuttingDown, closes every connection and
/// returns within `--shutdown-timeout`.
///
/// # Errors
/// The token file or fence file named in `config` cannot be used, or the
/// cluster node (`--data-dir`) cannot start; or, after draining the same
/// way, the server can no longer serve: its cluster node stopped on its own
/// (a storage error) or the expiry task ended. The process should then
/// exit non-zero, so that a supervisor (systemd's `Restart=on-failure`)
/// starts it again; a node that stays up answering "shutting down" helps
/// nobody, and two such nodes leave a cluster without a leader. A cluster
/// node removed from its cluster drains and returns `Ok`, as at shutdown.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut server = Server::setup(listener, config).await?;
    let cluster = server.shared.service.engine().cluster().cloned();
    let mut expiry = server.expiry.1.take();
    let failed = async {
        let node = async {
            match &cluster {
                Some(c) => {
                    c.stopped().await;
                    c.failure()
                        .unwrap_or_else(|| "the cluster node stopped".into())
                }
                None => std::future::pending().await,
            }
        };
        let expiry_ended = async {
            match expiry.as_mut() {
                Some(handle) => match handle.await {
                    Err(e) if e.is_panic() => "the lease expiry task panicked".to_string(),
                    _ => "the lease expiry task stopped".to_string(),
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            why = node => (why, false),
            why = expiry_ended => (why, true),
        }
    };
    let failure = tokio::select! {
        () = server.accept_until(shutdown) => None,
        failed = failed => Some(failed),
    };
    if let Some((_, true)) = &failure {
        // The expiry task was awaited to its end: there is nothing left to
        // stop, and its handle must not be awaited again.
        expiry = None;
    }
    // A node removed from the cluster stops as if asked to: a supervisor
    // must not start it again.
    let removed = cluster.as_ref().and_then(|c| c.removed());
    let failure = failure.filter(|_| removed.is_none());
    if removed.is_some() {
        server.health.set_accepting(false);
        tracing::warn!("this node was removed from the cluster; draining, then exiting");
    }
    let failure = failure.map(|(why, _)| {
        // Before anything else: a probe must not find this node ready
        // while it drains.
        server.health.set_accepting(false);
        tracing::error!(error = %why, "this server cannot serve any more; draining, then exiting with an error");
        why
    });
    server.expiry.1 = expiry;
    server.drain().await;
    match failure {
        Some(why) => Err(anyhow::anyhow!(
            "stopped serving: {why}; exiting so that a supervisor restarts the server"
        )),
        None => Ok(()),
    }
}

/// A running server: what the accept loop hands each connection and what
/// shutdown waits for.
struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
    /// One permit per connection: --max-connections.
    limit: Arc<Semaphore>,
    /// Connections and background tasks.
    tracker: TaskTracker,
    /// Cancelled at shutdown: connections answer and close.
    cancel: CancellationToken,
    /// What /healthz and /readyz report.
    health: Arc<Health>,
    /// The operator's HTTP port, with --metrics-listen.
    metrics: Option<metrics_http::MetricsServer>,
    /// Stops the expiry task, and its handle (gone once awaited).
    expiry: (CancellationToken, Option<tokio::task::JoinHandle<()>>),
    /// The fence file's lock, kept until the server has drained: the
    /// keeper task, which owns the file, stops when draining starts.
    _fence_lock: Option<Arc<std::fs::File>>,
}

impl Server {
    /// Reads the token and fence files, builds the lock state (or starts
    /// the cluster node) and its background tasks, and logs the start line.
    async fn setup(listener: TcpListener, config: Config) -> anyhow::Result<Server> {
        let access = match &config.token_file {
            Some(path) => Access::from_file(path)?,
            None => Access::default(),
        };
        let tls = Tls::from_config(&config).context("cannot set up TLS")?;
        let (first_fence, fence_file) =
            fence::start(config.fence_file.as_deref(), SystemTime::now())
                .context("cannot set up fencing tokens")?;
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let limit = Arc::new(Semaphore::new(config.max_connections));
        let service = match config.data_dir {
            None => Service::local(config, access, first_fence),
            Some(_) => {
                let addr = listener.local_addr()?;
                let stop = CancellationToken::new();
                Service::raft(config, access, addr, stop).await?
            }
        };
        // Not tracked, and stopped only once the connections are drained:
        // a draining single server still expires leases. (A cluster leader
        // steps aside as it starts draining; the next leader expires them.)
        let expiry_stop = CancellationToken::new();
        let expiry = tokio::spawn(service.clone().run_expiry(expiry_stop.clone()));
        let fence_lock = fence_file.as_ref().and_then(fence::FenceFile::lock);
        if let (Engine::Local(local), Some(file)) = (service.engine(), fence_file) {
            tracker.spawn(fence::run_keeper(local.clone(), file, cancel.clone()));
        }
        let health = Arc::new(Health::default());
        if let Some(c) = service.engine().cluster() {
            let c = c.clone();
            // A node that failed is not ready from the moment it knows,
            // though it may still name a leader while it drains.
            health.set_leader_check(move || c.leader().is_some() && c.failure().is_none());
        }
        let metrics = match service.config().metrics_listen {
            Some(addr) => {
                let svc = service.clone();
                let gauges = Arc::new(move || Gauges {
                    stats: svc.stats(),
                    raft: svc.engine().cluster().map(|c| raft_gauges(&c.status())),
                });
                Some(
                    metrics_http::start(addr, gauges, health.clone())
                        .await
                        .with_context(|| format!("cannot serve metrics on {addr}"))?,
                )
            }
            None => None,
        };
        let shared = Arc::new(Shared::new(service).with_tls(tls));
        tracker.spawn(reload::on_sighup(reloadable(&shared), cancel.clone()));
        // On every server, so that a backup script signalling each one
        // never ends a single server (SIGUSR1's default action).
        tracker.spawn(snapshot_on_sigusr1(
            shared.service.engine().cluster().cloned(),
            cancel.clone(),
        ));
        let server = Server {
            listener,
            shared,
            limit,
            tracker,
            cancel,
            health,
            metrics,
            expiry: (expiry_stop, Some(expiry)),
            _fence_lock: fence_lock,
        };
        // Before the line that tells tests (and operators) the server is up:
        // a probe right after it must find the server ready. The listener is
        // bound, so connections made now wait in its backlog.
        server.health.set_accepting(true);
        server.log_start(first_fence);
        Ok(server)
    }

    /// One line an operator can check the running limits against; `addr`
    /// is also how tests find the ephemeral port.
    fn log_start(&self, first_fence: u64) {
        let c = self.shared.config();
        let node = self.shared.service.engine().cluster().map(|c| c.node_id());
        tracing::info!(
            addr = %self.listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
            version = env!("CARGO_PKG_VERSION"),
            access_tokens = self.shared.service.access().enabled(),
            tls = self.shared.tls.as_ref().map_or("off", |t| if t.mutual() { "mutual" } else { "on" }),
            fence_file = c.fence_file.is_some(),
            first_fence = if node.is_some() { raft::CLUSTER_FIRST_FENCE } else { first_fence },
            max_connections = c.max_connections,
            max_frame = c.max_frame,
            max_keys = c.max_keys,
            max_key_len = c.max_key_len,
            max_pipeline = c.max_pipeline,
            max_waiters = c.max_waiters,
            max_held_keys = c.max_held_keys,
            max_lease = %humantime::format_duration(c.max_lease),
            idle_timeout = %humantime::format_duration(c.idle_timeout),
            write_timeout = %humantime::format_duration(c.write_timeout),
            threads = c.threads,
            node_id = node,
            data_dir = c.data_dir.as_ref().map(|d| d.display().to_string()),
            "dlock-server listening"
        );
    }

    /// Accepts connections until `shutdown` completes, backing off after
    /// accept errors such as running out of file descriptors.
    async fn accept_until(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Duration::from_millis(5);
        loop {
            let accepted = tokio::select! {
                _ = &mut shutdown => return,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(5);
                    self.serve(stream, peer);
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                }
            }
        }
    }

    /// Serves one accepted connection on a task of its own, or turns it
    /// away over --max-connections.
    fn serve(&self, stream: TcpStream, peer: std::net::SocketAddr) {
        metrics::connection_accepted();
        let Ok(permit) = self.limit.clone().try_acquire_owned() else {
            reject(&stream, self.shared.config().max_connections);
            return;
        };
        configure(&stream, self.shared.config());
        let span = tracing::info_span!("conn", %peer);
        let tls = self.shared.tls.as_ref().map(Tls::acceptor);
        let shared = self.shared.clone();
        let cancel = self.cancel.clone();
        self.tracker.spawn(
            async move {
                match tls {
                    None => connection::serve(stream, shared, cancel).await,
                    Some(acceptor) => {
                        // In the connection's own task, so a slow handshake
                        // holds up nobody else.
                        let timeout = shared.config().idle_timeout;
                        if let Some(tls) = tls::handshake(acceptor, stream, timeout, &cancel).await
                        {
                            connection::serve(tls, shared, cancel).await;
                        }
                    }
                }
                drop(permit);
            }
            .instrument(span),
        );
    }

    /// Stops accepting, answers and closes every connection (within
    /// --shutdown-timeout), then stops the cluster node if there is one.
    async fn drain(self) {
        drop(self.listener);
        self.health.set_accepting(false);
        tracing::info!("shutting down");
        if let Some(cluster) = self.shared.service.engine().cluster() {
            // A leader hands on what it can: its sessions' clients move to
            // the next leader, which the others elect sooner without its
            // heartbeats.
            cluster.step_aside();
        }
        // Before any connection closes: a holder's release must not hand
        // its keys to a waiter whose connection is about to close too. (A
        // cluster node keeps its sessions' waits: their clients resume them
        // elsewhere.)
        self.shared.service.engine().close();
        self.cancel.cancel();
        self.tracker.close();
        if tokio::time::timeout(self.shared.config().shutdown_timeout, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the shutdown timeout; leaving them");
        }
        let (expiry_stop, expiry) = self.expiry;
        expiry_stop.cancel();
        if let Some(expiry) = expiry {
            let _ = expiry.await;
        }
        if let Some(cluster) = self.shared.service.engine().cluster() {
            cluster.shutdown().await;
        }
        if let Some(m) = self.metrics {
            m.stop().await;
        }
        tracing::info!("dlock-server stopped");
    }
}

/// What SIGHUP re-reads: the access rules, and the certificates of the
/// client and peer ports.
fn reloadable(shared: &Arc<Shared>) -> Arc<Vec<Reloadable>> {
    let (a, t, p) = (shared.clone(), shared.clone(), shared.clone());
    Arc::new(vec![
        Reloadable {
            what: "access rules",
            reload: Box::new(move || {
                let access = a.service.access();
                access.enabled().then(|| access.reload())
            }),
        },
        Reloadable {
            what: "TLS certificates",
            reload: Box::new(move || t.tls.as_ref().map(|t| t.reload())),
        },
        Reloadable {
            what: "peer TLS certificates",
            reload: Box::new(move || {
                p.service
                    .engine()
                    .cluster()
                    .and_then(|c| c.reload_peer_tls())
            }),
        },
    ])
}

/// Takes a snapshot on every SIGUSR1 until `shutdown`: before a backup is
/// copied, or to measure a node while it writes one (bench/snapshot_stall.sh).
/// One being written when the signal comes is waited for, then another is
/// taken if it does not cover what was applied ([`raft::Cluster::snapshot`]).
/// A server without a cluster (`None`) keeps no snapshots: it logs that the
/// signal changed nothing.
async fn snapshot_on_sigusr1(cluster: Option<raft::Cluster>, shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut usr1 = match signal(SignalKind::user_defined1()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGUSR1; no snapshots on demand");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = usr1.recv() => {
                    if got.is_none() {
                        return;
                    }
                    let Some(cluster) = &cluster else {
                        tracing::info!("SIGUSR1: a server without a cluster keeps no snapshots; nothing to do");
                        continue;
                    };
                    match cluster.snapshot().await {
                        Ok(index) => tracing::info!(?index, "snapshot taken on SIGUSR1"),
                        Err(e) => tracing::warn!(error = %e, "SIGUSR1: no snapshot taken"),
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = cluster;
        shutdown.cancelled().await;
    }
}

/// The gauges of a cluster node's Raft state.
fn raft_gauges(s: &ClusterStatus) -> RaftGauges {
    RaftGauges {
        term: s.term,
        role: s.role.label().to_owned(),
        leader_known: s.leader.is_some(),
        committed_index: s.committed_index.unwrap_or(0),
        applied_index: s.last_applied_index.unwrap_or(0),
        lags: s
            .members
            .iter()
            .filter_map(|m| m.lag.map(|lag| (m.id, lag)))
            .collect(),
    }
}

/// TCP_NODELAY because every frame is a small request or response that
/// should leave at once; keepalive so a peer that vanished without a FIN or
/// RST (power loss, partition) is noticed even while it holds locks quietly.
/// tokio does not expose keepalive timing, hence socket2.
fn configure(stream: &TcpStream, config: &Config) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let keepalive = TcpKeepalive::new()
        .with_time(config.keepalive_time)
        .with_interval(config.keepalive_interval)
        .with_retries(config.keepalive_retries);
    if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// Tells a client over the connection limit why it is turned away. The
/// socket is fresh, so the short frame fits its send buffer without waiting.
fn reject(stream: &TcpStream, max: usize) {
    let mut buf = bytes::BytesMut::new();
    encode_frame(
        &reply::error(
            0,
            ResponseStatus::LimitReached,
            format!("too many connections (limit {max}); try again later"),
        ),
        &mut buf,
    );
    let _ = stream.try_write(&buf);
    crate::ops::limit_log::CONNECTIONS.hit(max);
    metrics::connection_closed(CloseReason::Limit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[tokio::test]
    async fn accepted_sockets_get_nodelay_and_configured_keepalive() {
        let config = Config::parse_from([
            "dlock-server",
            "--keepalive-time",
            "7s",
            "--keepalive-interval",
            "3s",
            "--keepalive-retries",
            "4",
        ]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        configure(&stream, &config);
        let sock = SockRef::from(&stream);
        assert!(stream.nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(7));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), 4);
    }
}
