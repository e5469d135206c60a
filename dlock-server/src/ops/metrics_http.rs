//! The operator's HTTP port (`--metrics-listen`): `/metrics` for
//! Prometheus, `/healthz` (the process answers) and `/readyz` (it should get
//! traffic). A deliberately small HTTP/1 server on hyper: GET only, a few
//! connections at once, headers within a timeout, nothing read from a
//! request body.

use crate::ops::metrics;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Scrapers and probes at once; more wait in the listen backlog. A handful
/// of Prometheus servers and a kubelet need far fewer.
const MAX_CONNECTIONS: usize = 16;

/// A client must send its request headers within this long, so a stalled
/// connection does not hold one of the few slots.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the probes report. Shared between the server, which says when it
/// accepts connections, and the HTTP handlers.
#[derive(Default)]
pub struct Health {
    accepting: AtomicBool,
    /// On a cluster node: ready only while this says a leader is known.
    leader_known: std::sync::OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("accepting", &self.accepting)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// The server accepts client connections (or, with `false`, no longer
    /// does: it is shutting down).
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::Relaxed);
    }

    /// Whether this node should get client traffic, and if not, why. The
    /// one place readiness is decided: a cluster adds its own conditions
    /// (a known leader) here.
    pub fn ready(&self) -> Result<(), &'static str> {
        if !self.accepting.load(Ordering::Relaxed) {
            return Err("not accepting client connections");
        }
        if let Some(leader_known) = self.leader_known.get() {
            if !leader_known() {
                return Err("no leader known: this cluster node cannot serve locks");
            }
        }
        Ok(())
    }

    /// Makes readiness depend on a cluster node knowing a leader, as
    /// `leader_known` says.
    pub fn set_leader_check(&self, leader_known: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.leader_known.set(Box::new(leader_known));
    }
}

struct State {
    registry: Registry,
    health: Arc<Health>,
}

/// The running HTTP server.
#[derive(Debug)]
pub struct MetricsServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// Binds `addr` and serves the metrics `gauges` reads and the probes of `health`
/// there until [`MetricsServer::stop`].
///
/// # Errors
/// The address cannot be bound.
pub async fn start(
    addr: SocketAddr,
    gauges: crate::ops::metrics::ReadGauges,
    health: Arc<Health>,
) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(State {
        registry: crate::ops::metrics::registry(gauges),
        health,
    });
    // How an operator (and a test) learns the port of 127.0.0.1:0.
    tracing::info!(addr = %addr, "serving metrics");
    let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
    tasks.spawn(accept_loop(listener, state, tasks.clone(), stop.clone()));
    Ok(MetricsServer { addr, stop, tasks })
}

impl MetricsServer {
    /// Stops serving. It is stopped after the client connections are
    /// drained, so `/readyz` says "not ready" while they drain.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        // Every task ends at the cancellation without waiting on a peer.
        self.tasks.wait().await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // The permit comes before accept, so excess scrapers wait in the
        // backlog instead of being accepted and starved.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics accept failed");
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&state, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "metrics connection failed");
                    }
                }
                _ = shutdown.cancelled() => {}
            }
            drop(permit);
        });
    }
}

fn respond(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            // OpenMetrics for Prometheus, which asks for it; the older text
            // format for curl and promtool, which do not.
            let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = metrics::Format::negotiate(accept);
            let body = match metrics::encode(&state.registry, format) {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot encode metrics");
                    return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n");
                }
            };
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match state.health.ready() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("not ready: {why}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::Health;

    #[test]
    fn ready_only_while_accepting() {
        let h = Health::default();
        assert!(h.ready().is_err(), "not before the accept loop starts");
        h.set_accepting(true);
        assert!(h.ready().is_ok());
        h.set_accepting(false);
        assert_eq!(h.ready(), Err("not accepting client connections"));
    }
}
