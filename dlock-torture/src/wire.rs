//! A raw dlock connection that checks what the server owes every request:
//! an answer, in request order, or a closed connection. The framing is
//! [`RawClient`]'s; this adds the ordering check and the heartbeat.

use dlock::proto::{Request, RequestType, Response};
use dlock::raw::{RawClient, RawError};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// How often a client waiting on a Lock pings, well inside the server's
/// idle timeout.
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// What can go wrong with one call.
#[derive(Debug)]
pub enum CallError {
    /// The server closed the connection (or it broke) before answering.
    Closed,
    /// No answer in time on a connection that stayed open.
    NoAnswer,
    /// An answer for another request arrived first.
    OutOfOrder { expected: u64, got: u64 },
    /// Bytes that are not a valid frame or Response.
    Malformed,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Closed => write!(f, "connection closed before the answer"),
            CallError::NoAnswer => write!(f, "no answer in time"),
            CallError::OutOfOrder { expected, got } => {
                write!(f, "answer to request {got} while {expected} was due")
            }
            CallError::Malformed => write!(f, "malformed frame or response"),
        }
    }
}

/// One connection and the ids of its unanswered requests.
pub struct Wire {
    /// The connection; faults write broken bytes and set socket options
    /// through it.
    pub raw: RawClient,
    outstanding: VecDeque<u64>,
}

impl Wire {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Wire> {
        Ok(Wire {
            raw: RawClient::connect(addr).await?,
            outstanding: VecDeque::new(),
        })
    }

    pub fn request(&mut self, kind: RequestType, keys: &[String]) -> Request {
        self.raw.request(kind, keys)
    }

    async fn send(&mut self, req: &Request) -> Result<(), CallError> {
        self.raw.send(req).await.map_err(|_| CallError::Closed)?;
        self.outstanding.push_back(req.id);
        Ok(())
    }

    /// Sends `req` and waits for its answer, at most `patience` past any
    /// wait the request itself asks for, pinging meanwhile so the server
    /// never sees the connection as idle.
    pub async fn call(&mut self, req: Request, patience: Duration) -> Result<Response, CallError> {
        let id = req.id;
        self.send(&req).await?;
        let deadline = Instant::now() + patience;
        let mut beat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
        loop {
            tokio::select! {
                r = self.next_response() => {
                    let r = r?;
                    if r.request_id == id {
                        return Ok(r);
                    }
                }
                _ = beat.tick() => {
                    let ping = self.request(RequestType::Ping, &[]);
                    self.send(&ping).await?;
                }
                _ = tokio::time::sleep_until(deadline) => return Err(CallError::NoAnswer),
            }
        }
    }

    /// The next response, which must answer the oldest outstanding request.
    /// Cancel-safe, as [`RawClient::recv`] is.
    async fn next_response(&mut self) -> Result<Response, CallError> {
        let r = self.raw.recv().await.map_err(|e| match e {
            RawError::Frame(_) | RawError::Decode(_) | RawError::Foreign(_) => CallError::Malformed,
            _ => CallError::Closed,
        })?;
        let expected = self.outstanding.pop_front().unwrap_or(0);
        if r.request_id != expected {
            return Err(CallError::OutOfOrder {
                expected,
                got: r.request_id,
            });
        }
        Ok(r)
    }

    /// Reads and discards until the server closes the connection or
    /// `patience` runs out; returns whether it closed.
    pub async fn await_close(&mut self, patience: Duration) -> bool {
        self.raw.await_close(patience).await
    }
}
