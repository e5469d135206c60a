//! One client connection: the socket, its timeouts, and the server's
//! shutdown. What the client sends goes into the connection's
//! [`Pipeline`], which executes requests in order and parks the ones behind
//! a waiting Lock; this task moves bytes in and out of it.
//!
//! The connection keeps being read while a Lock waits (a disconnect is
//! noticed at once and Pings still count as activity), until the pipeline's
//! limits are reached: `--max-pipeline` unanswered requests or four
//! maximum-size frames of parked bytes. A client that stops reading its
//! responses is dropped after `--write-timeout`; one that sends no whole
//! request for `--idle-timeout` is closed.

use crate::net::pipeline::{Next, Pipeline, Received};
use crate::net::shared::Shared;
use crate::net::transport::Transport;
use crate::ops::config::Config;
use crate::ops::metrics::{self, CloseReason};
use crate::service::pending::{Arrived, Dropped};
use crate::service::{Conn, Service};
use dlock_proto::proto::ResponseStatus;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::io::poll_read_buf;
use tokio_util::sync::CancellationToken;

/// What the connection task woke up for, besides shutdown and the idle timer.
// One value per wake-up, never stored: its size costs nothing, and boxing
// a cluster node's answer would allocate per request.
#[allow(clippy::large_enum_variant)]
enum Event {
    /// The pending request's answer, or its delivery dropped at shutdown.
    Outcome(Result<Arrived, Dropped>),
    /// A read finished; 0 bytes means the client closed its side.
    Read(io::Result<Received>),
}

/// Why a connection ended, for the log.
#[derive(Debug)]
enum End {
    ClientClosed,
    /// This cluster node stopped leading while keeping the connection's
    /// sessions; the connection was reset.
    Deposed,
    Idle,
    Shutdown,
    FrameTooLarge,
    Io(std::io::Error),
    WriteTimeout,
}

/// Serves one connection until the client leaves, misbehaves or the server
/// shuts down.
pub async fn serve<S: Transport>(stream: S, shared: Arc<Shared>, shutdown: CancellationToken) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "connection gone before it was served");
            return;
        }
    };
    let service = shared.service.clone();
    // Declared before the session, so it is dropped after it: the session's
    // waiting request is abandoned (its Drop) before the connection's
    // sessions end, whatever ends this task.
    let mut connected = service.connect(peer, stream.peer_names());
    let conn = connected.conn().clone();
    let keeper = CancellationToken::new();
    if service.engine().sessions_outlive_connections() {
        tokio::spawn(
            service
                .clone()
                .keep_connection_alive(conn.clone(), keeper.clone()),
        );
    }
    // However this task ends, the keeper stops with it.
    let _keeper = keeper.drop_guard();
    tracing::debug!("connection opened");
    let end = Session::new(stream, &shared, &conn).run(&shutdown).await;
    if matches!(end, End::ClientClosed) {
        connected.closed_by_client();
    }
    drop(connected);
    metrics::connection_closed(end.reason());
    // The server's own decisions to drop a client are worth an operator's
    // line (one per connection, never per request); a client leaving, a
    // broken socket or shutdown are routine.
    match end {
        End::Idle => tracing::info!(
            reason = "idle",
            after = %humantime::format_duration(shared.config().idle_timeout),
            "client dropped"
        ),
        End::WriteTimeout => tracing::info!(
            reason = "write timeout",
            after = %humantime::format_duration(shared.config().write_timeout),
            "client dropped: it stopped reading responses"
        ),
        End::FrameTooLarge => tracing::info!(
            reason = "frame too large",
            max_frame = shared.config().max_frame,
            "client dropped"
        ),
        End::Io(e) => tracing::debug!(error = %e, "connection closed"),
        other => tracing::debug!(reason = ?other, "connection closed"),
    }
}

impl End {
    fn reason(&self) -> CloseReason {
        match self {
            End::ClientClosed => CloseReason::ClientClosed,
            End::Deposed => CloseReason::Deposed,
            End::Idle => CloseReason::Idle,
            End::Shutdown => CloseReason::Shutdown,
            End::FrameTooLarge => CloseReason::FrameTooLarge,
            End::Io(_) => CloseReason::Io,
            End::WriteTimeout => CloseReason::WriteTimeout,
        }
    }
}

struct Session<'a, S> {
    stream: S,
    pipeline: Pipeline,
    /// When a request here wakes a waiting connection (a release grants
    /// its Lock), yield once before writing our own answer: the grant is
    /// what the next holder waits for, our answer only confirms the
    /// release. On the current-thread runtime the woken task can write only
    /// after this one yields, and this ordering raised contended hand-offs
    /// from 22.8k/s to 29.4k/s. On the multi-thread runtime the yielded
    /// task is taken over by another worker, and the wake-up that costs
    /// made hand-offs slower (22.5k/s to 17.3k/s), so it is not done there.
    grant_first: bool,
    config: &'a Config,
    service: &'a Arc<Service>,
    conn: &'a Arc<Conn>,
}

impl<S> Drop for Session<'_, S> {
    /// A Lock granted after the session stopped listening is released, so
    /// no lease outlives a client that never learned its fencing token.
    fn drop(&mut self) {
        if let Some(pending) = self.pipeline.take_waiting() {
            self.service.abandon(pending);
        }
    }
}

impl<'a, S: Transport> Session<'a, S> {
    fn new(stream: S, shared: &'a Shared, conn: &'a Arc<Conn>) -> Self {
        Session {
            stream,
            pipeline: Pipeline::new(shared.config().max_frame, shared.config().max_pipeline),
            grant_first: tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::CurrentThread,
            config: shared.config(),
            service: &shared.service,
            conn,
        }
    }

    async fn run(mut self, shutdown: &CancellationToken) -> End {
        let idle_timeout = self.config.idle_timeout;
        let mut last_frame = Instant::now();
        let idle = tokio::time::sleep(idle_timeout);
        tokio::pin!(idle);
        let mut closing: Option<End> = None;
        // Only a cluster node deposes: a single server's connection does not
        // pay for waiting on a token that never fires.
        let deposed = self
            .service
            .engine()
            .sessions_outlive_connections()
            .then(|| self.conn.deposed.clone());
        loop {
            let outcomes = self.service.outcomes();
            let deliveries = self.grant_first.then(|| outcomes.deliveries());
            self.pipeline.execute(self.service, self.conn);
            if deliveries.is_some_and(|d| d != outcomes.deliveries()) {
                tokio::task::yield_now().await;
            }
            if let Err(end) = self.flush().await {
                return end;
            }
            match self.pipeline.next_step() {
                Next::Execute => continue,
                Next::Close => {
                    return self
                        .end_with(
                            ResponseStatus::FrameTooLarge,
                            "not executed: the connection is closing after an oversize frame",
                            End::FrameTooLarge,
                        )
                        .await;
                }
                Next::Wait => {}
            }
            if let Some(end) = closing {
                return end;
            }
            self.pipeline.trim();
            let can_read = self.pipeline.can_read();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    if deposed.is_some() && self.conn.has_named_sessions() {
                        // A cluster node's sessions outlive it: their
                        // client resumes them on the next leader and sends
                        // again what is unanswered, so nothing is answered
                        // here (a ShuttingDown would read as a failure).
                        self.stream.reset_on_close();
                        return End::Shutdown;
                    }
                    return self.end_with_shutdown().await;
                }
                _ = cancelled(deposed.as_ref()) => {
                    // No answer goes out: what is unanswered is sent again
                    // to the new leader, which answers it from the log.
                    self.stream.reset_on_close();
                    return End::Deposed;
                }
                event = std::future::poll_fn(|cx| self.poll_event(cx, can_read)) => match event {
                    Event::Outcome(Ok(outcome)) => self.pipeline.answer(outcome),
                    Event::Outcome(Err(_)) => {
                        // Only the engine's close drops a delivery: the server is
                        // stopping, and on another worker the cancellation
                        // may not have reached this task yet. The requests
                        // parked behind the Lock must not run now.
                        return self.end_with_shutdown().await;
                    }
                    Event::Read(Ok(got)) if got.bytes == 0 => closing = Some(End::ClientClosed),
                    Event::Read(Ok(got)) => {
                        metrics::bytes_in(got.bytes);
                        if got.request {
                            last_frame = Instant::now();
                        }
                    }
                    Event::Read(Err(e)) => closing = Some(End::Io(e)),
                },
                _ = &mut idle => {
                    if !can_read || last_frame.elapsed() < idle_timeout {
                        // A client held back by --max-pipeline is sending,
                        // just faster than it reads: that is not idleness.
                        if !can_read {
                            last_frame = Instant::now();
                        }
                        idle.as_mut().reset(last_frame + idle_timeout);
                    } else {
                        return End::Idle;
                    }
                }
            }
        }
    }

    /// Waits for the waiting Lock's outcome or, when `can_read`, for bytes
    /// from the client, whichever comes first. Both touch the pipeline, so
    /// one poll function serves both. Readiness is checked before a buffer
    /// is reserved, so an idle connection holds none; the read goes through
    /// `AsyncRead`, which notes a short read as "drained" and so saves the
    /// read that would only return EAGAIN.
    fn poll_event(&mut self, cx: &mut Context<'_>, can_read: bool) -> Poll<Event> {
        if let Some(pending) = self.pipeline.waiting() {
            if let Poll::Ready(outcome) = pending.poll_arrived(cx) {
                return Poll::Ready(Event::Outcome(outcome));
            }
        }
        if !can_read {
            return Poll::Pending;
        }
        if let Err(e) = ready!(self.stream.poll_read_ready(cx)) {
            return Poll::Ready(Event::Read(Err(e)));
        }
        let stream = Pin::new(&mut self.stream);
        let read = self
            .pipeline
            .read_with(|buf| match poll_read_buf(stream, cx, buf) {
                Poll::Ready(result) => result,
                Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
            });
        match read {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            other => Poll::Ready(Event::Read(other)),
        }
    }

    /// Answers everything unanswered with `status` (see
    /// [`Pipeline::abandon`]), writes it as far as the client takes it, and
    /// returns `end` for the log.
    async fn end_with(&mut self, status: ResponseStatus, text: &str, end: End) -> End {
        self.pipeline.abandon(status, text);
        let _ = self.flush().await;
        end
    }

    async fn end_with_shutdown(&mut self) -> End {
        self.end_with(
            ResponseStatus::ShuttingDown,
            "server is shutting down",
            End::Shutdown,
        )
        .await
    }

    async fn flush(&mut self) -> Result<(), End> {
        if self.pipeline.output().is_empty() {
            return Ok(());
        }
        let (stream, output) = (&mut self.stream, self.pipeline.output());
        // The flush sends what TLS keeps back; for TCP it costs nothing.
        let write = async move {
            stream.write_all(output).await?;
            stream.flush().await
        };
        match tokio::time::timeout(self.config.write_timeout, write).await {
            Ok(Ok(())) => {
                metrics::bytes_out(self.pipeline.output().len());
                self.pipeline.written();
                Ok(())
            }
            Ok(Err(e)) => Err(End::Io(e)),
            Err(_) => Err(End::WriteTimeout),
        }
    }
}

/// Resolves when `token` is cancelled; never without one.
async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}
