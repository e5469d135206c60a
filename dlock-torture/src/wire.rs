//! A raw dlock connection that checks what the server owes every request:
//! an answer, in request order, or a closed connection.

use bytes::BytesMut;
use dlock::codec::{encode_frame, FrameCodec};
use dlock::proto::{Request, RequestLock, RequestType, Response};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::codec::Decoder;

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
    pub stream: TcpStream,
    codec: FrameCodec,
    rbuf: BytesMut,
    next_id: u64,
    outstanding: VecDeque<u64>,
}

impl Wire {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Wire> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Wire {
            stream,
            codec: FrameCodec::new(dlock::MAX_RESPONSE_FRAME),
            rbuf: BytesMut::with_capacity(1024),
            next_id: 1,
            outstanding: VecDeque::new(),
        })
    }

    pub fn request(&mut self, kind: RequestType, keys: &[String]) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        Request {
            version: dlock::PROTOCOL_VERSION,
            id,
            r#type: kind as i32,
            lock: (!keys.is_empty()).then(|| RequestLock {
                keys: keys.to_vec(),
                ..RequestLock::default()
            }),
            ..Request::default()
        }
    }

    async fn send(&mut self, req: &Request) -> Result<(), CallError> {
        let mut out = BytesMut::new();
        encode_frame(req, &mut out);
        self.stream
            .write_all(&out)
            .await
            .map_err(|_| CallError::Closed)?;
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
    /// Cancel-safe: bytes read stay in the buffer.
    async fn next_response(&mut self) -> Result<Response, CallError> {
        loop {
            match self.codec.decode(&mut self.rbuf) {
                Ok(Some(body)) => {
                    let r: Response =
                        prost::Message::decode(body).map_err(|_| CallError::Malformed)?;
                    let expected = self.outstanding.pop_front().unwrap_or(0);
                    if r.request_id != expected {
                        return Err(CallError::OutOfOrder {
                            expected,
                            got: r.request_id,
                        });
                    }
                    return Ok(r);
                }
                Ok(None) => {}
                Err(_) => return Err(CallError::Malformed),
            }
            match self.stream.read_buf(&mut self.rbuf).await {
                Ok(0) | Err(_) => return Err(CallError::Closed),
                Ok(_) => {}
            }
        }
    }

    /// Reads and discards until the server closes the connection or
    /// `patience` runs out; returns whether it closed.
    pub async fn await_close(&mut self, patience: Duration) -> bool {
        let mut sink = [0u8; 4096];
        tokio::time::timeout(patience, async {
            loop {
                match self.stream.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}
