//! One client connection: reads frames, executes requests in order, writes
//! responses in order.
//!
//! Requests take effect in the order they arrive. When a Lock has to wait,
//! the requests behind it are read and parked (so the connection keeps being
//! read, a disconnect is noticed at once and Pings still count as activity)
//! but run only after the Lock is answered. Parked and unanswered requests
//! together are capped by `--max-pipeline`; at the cap the server stops
//! reading until the client catches up, and a client that stops reading its
//! responses is dropped after `--write-timeout`.

use crate::config::Config;
use crate::handler::{self, Ctx, Step};
use crate::server::Shared;
use crate::table::{OwnerId, Woken};
use bytes::{Bytes, BytesMut};
use dlock::codec::{encode_frame, FrameCodec, FrameError};
use dlock::proto::{Request, Response, ResponseStatus};
use futures_util::{FutureExt, StreamExt};
use prost::Message;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// Read buffer a connection starts with; it grows to the frame size only when
/// a client sends large frames, so idle connections stay small.
const INITIAL_READ_BUFFER: usize = 512;

/// Parked requests may add up to this many maximum-size frames: enough for
/// deep pipelines of ordinary requests, while a connection's memory stays a
/// small multiple of `--max-frame` however large its requests are.
pub const QUEUED_FRAMES: usize = 4;

/// Something read from the client, in arrival order.
enum Item {
    /// A request frame, still encoded: parked bytes cost what they weigh on
    /// the wire, and a body that does not decode is answered in its turn.
    Frame(Bytes),
    /// An answer already known.
    Reply(Response),
}

/// Withdraws the connection's waiters and releases its locks however the
/// connection task ends, error paths and panics included.
struct Registration<'a> {
    shared: &'a Shared,
    owner: OwnerId,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shared.db.disconnect(self.owner);
    }
}

/// Why a connection ended, for the log.
#[derive(Debug)]
enum End {
    ClientClosed,
    Idle,
    Shutdown,
    FrameTooLarge,
    Io(std::io::Error),
    WriteTimeout,
}

/// Serves one connection until the client leaves, misbehaves or the server
/// shuts down.
pub async fn serve(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "connection gone before it was served");
            return;
        }
    };
    let owner = shared.db.connect(peer);
    tracing::debug!(owner, "connection opened");
    let registration = Registration {
        shared: &shared,
        owner,
    };
    let end = Session::new(stream, &shared, owner).run(&shutdown).await;
    drop(registration);
    match end {
        End::Io(e) => tracing::debug!(error = %e, "connection closed"),
        End::WriteTimeout => {
            tracing::info!("client stopped reading responses; dropped after write timeout")
        }
        End::FrameTooLarge => tracing::info!("frame over the size limit; connection closed"),
        End::Idle => tracing::debug!("idle timeout; connection closed"),
        other => tracing::debug!(reason = ?other, "connection closed"),
    }
}

struct Session<'a> {
    reader: FramedRead<tokio::net::tcp::OwnedReadHalf, FrameCodec>,
    writer: OwnedWriteHalf,
    out: BytesMut,
    queue: VecDeque<Item>,
    /// Frame bytes of the parked requests in `queue`.
    queued_bytes: usize,
    waiting: Option<(u64, oneshot::Receiver<Woken>)>,
    config: &'a Config,
    ctx: Ctx<'a>,
}

impl Drop for Session<'_> {
    /// A Lock granted after the session stopped listening is released, so
    /// no lease outlives a client that never learned its fencing token.
    fn drop(&mut self) {
        if let Some((_, rx)) = self.waiting.take() {
            self.ctx.db.abandon(rx);
        }
    }
}

impl<'a> Session<'a> {
    fn new(stream: TcpStream, shared: &'a Shared, owner: OwnerId) -> Self {
        let (rd, writer) = stream.into_split();
        Session {
            reader: FramedRead::with_capacity(
                rd,
                FrameCodec::new(shared.config.max_frame),
                INITIAL_READ_BUFFER,
            ),
            writer,
            out: BytesMut::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            waiting: None,
            config: &shared.config,
            ctx: Ctx {
                db: &shared.db,
                config: &shared.config,
                tokens: &shared.tokens,
                owner,
            },
        }
    }

    fn unanswered(&self) -> usize {
        self.queue.len() + usize::from(self.waiting.is_some())
    }

    /// Whether another request may be read now.
    fn can_read(&self) -> bool {
        self.unanswered() < self.config.max_pipeline
            && self.queued_bytes < QUEUED_FRAMES * self.config.max_frame
    }

    async fn run(mut self, shutdown: &CancellationToken) -> End {
        let idle_timeout = self.config.idle_timeout;
        let mut last_frame = Instant::now();
        let idle = tokio::time::sleep(idle_timeout);
        tokio::pin!(idle);
        let mut closing: Option<End> = None;
        loop {
            self.execute_ready();
            if let Err(end) = self.flush().await {
                return end;
            }
            if let Some(end) = closing {
                if matches!(end, End::FrameTooLarge) {
                    // Nothing after the bad length can be read; what came
                    // before it and still waits is answered, not dropped.
                    self.abandon(
                        ResponseStatus::FrameTooLarge,
                        "not executed: the connection is closing after an oversize frame",
                    );
                    let _ = self.flush().await;
                }
                return end;
            }
            let can_read = self.can_read();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    self.abandon(ResponseStatus::ShuttingDown, "server is shutting down");
                    let _ = self.flush().await;
                    return End::Shutdown;
                }
                wake = async {
                    match self.waiting.as_mut() {
                        Some((_, rx)) => rx.await,
                        None => std::future::pending().await,
                    }
                }, if self.waiting.is_some() => {
                    if let Some((id, _)) = self.waiting.take() {
                        let response = match wake {
                            Ok(w) => handler::woken(id, w),
                            Err(_) => handler::error(id, ResponseStatus::ShuttingDown, "server is shutting down"),
                        };
                        encode_frame(&response, &mut self.out);
                    }
                }
                frame = self.reader.next(), if can_read => {
                    last_frame = Instant::now();
                    closing = self.accept(frame);
                    // Take every frame already buffered before writing, so a
                    // pipelined burst is answered with one write.
                    while closing.is_none() && self.can_read() {
                        match self.reader.next().now_or_never() {
                            Some(frame) => closing = self.accept(frame),
                            None => break,
                        }
                    }
                }
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

    /// Takes one result of the frame reader; returns why to close, if so.
    fn accept(&mut self, frame: Option<Result<Bytes, FrameError>>) -> Option<End> {
        match frame {
            Some(Ok(body)) => {
                self.queued_bytes += body.len();
                self.queue.push_back(Item::Frame(body));
                None
            }
            Some(Err(FrameError::TooLarge { len, max })) => {
                // The stream cannot be resynchronised after a bad length:
                // answer what came before, say why, and close.
                self.queue.push_back(Item::Reply(handler::error(
                    0,
                    ResponseStatus::FrameTooLarge,
                    format!("frame of {len} bytes exceeds the limit of {max} bytes; closing"),
                )));
                Some(End::FrameTooLarge)
            }
            Some(Err(FrameError::Io(e))) => Some(End::Io(e)),
            None => Some(End::ClientClosed),
        }
    }

    /// Runs queued requests in order until one has to wait.
    fn execute_ready(&mut self) {
        while self.waiting.is_none() {
            let Some(item) = self.queue.pop_front() else {
                return;
            };
            match item {
                Item::Reply(r) => encode_frame(&r, &mut self.out),
                Item::Frame(body) => {
                    self.queued_bytes -= body.len();
                    match Request::decode(body) {
                        Ok(req) => match handler::execute(self.ctx, req) {
                            Step::Reply(r) => encode_frame(&r, &mut self.out),
                            Step::Wait { request_id, rx } => self.waiting = Some((request_id, rx)),
                        },
                        Err(e) => encode_frame(&handler::undecodable(&e), &mut self.out),
                    }
                }
            }
        }
    }

    /// Answers everything still unanswered without executing it: the
    /// waiting Lock gets its outcome if one already arrived, else `status`;
    /// parked requests get `status`, bodies that do not decode get General.
    fn abandon(&mut self, status: ResponseStatus, text: &str) {
        if let Some((id, mut rx)) = self.waiting.take() {
            rx.close();
            let response = match rx.try_recv() {
                Ok(w) => handler::woken(id, w),
                Err(_) => handler::error(id, status, text),
            };
            encode_frame(&response, &mut self.out);
        }
        for item in std::mem::take(&mut self.queue) {
            let response = match item {
                Item::Reply(r) => r,
                Item::Frame(body) => match Request::decode(body) {
                    Ok(req) => handler::error(req.id, status, text),
                    Err(e) => handler::undecodable(&e),
                },
            };
            encode_frame(&response, &mut self.out);
        }
        self.queued_bytes = 0;
    }

    async fn flush(&mut self) -> Result<(), End> {
        if self.out.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout(self.config.write_timeout, self.writer.write_all(&self.out))
            .await
        {
            Ok(Ok(())) => {
                self.out.clear();
                Ok(())
            }
            Ok(Err(e)) => Err(End::Io(e)),
            Err(_) => Err(End::WriteTimeout),
        }
    }
}
