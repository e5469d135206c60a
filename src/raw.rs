//! A client that speaks raw frames, for tests and load tools (feature `raw`).
//!
//! [`RawClient`] writes exactly the requests it is given and hands back every
//! response as it arrives: no Hello, no heartbeats, no pipelining limit, no
//! mapping of statuses to errors. That is what protocol conformance tests,
//! a benchmark measuring the server rather than a client library, and a
//! torture run checking what the server owes each request need. Programs
//! that want locks use [`crate::Client`].
//!
//! Reads are cancel-safe: bytes read stay in the client's buffer, so
//! [`RawClient::recv`] can sit in a `select!` beside a heartbeat or timer.
//! The read loop is written out rather than taken from `FramedRead` because
//! callers must tell a clean close (between frames) from one inside a
//! frame, and read what is already buffered without touching the socket.

use crate::codec::{encode_frame, FrameCodec, FrameError};
use crate::proto::{Request, RequestLock, RequestType, Response};
use bytes::BytesMut;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio_util::codec::Decoder;

/// What can go wrong reading a response. New kinds may be added in a minor release, so a `match`
/// needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RawError {
    /// Reading or writing the socket failed.
    #[error("connection failed")]
    Io(#[from] io::Error),
    /// The server announced a frame over this client's limit.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// What came back shows the other end is no dlock client port: it
    /// speaks TLS to a client without, or another protocol altogether (an
    /// HTTP metrics port). The same error the library's client gives.
    #[error(transparent)]
    Foreign(Box<crate::Error>),
    /// A frame whose body is not a `Response`.
    #[error("undecodable response")]
    Decode(#[from] prost::DecodeError),
    /// The server closed the connection before the answer (between frames).
    #[error("the server closed the connection")]
    Closed,
    /// The server closed the connection in the middle of a frame.
    #[error("the server closed the connection inside a frame ({buffered} bytes of it read)")]
    Truncated {
        /// Bytes of the incomplete frame that arrived.
        buffered: usize,
    },
    /// The answer that arrived is not for the request sent.
    #[error("response to request {got} while waiting for {expected}")]
    OutOfOrder {
        /// The request id waited for.
        expected: u64,
        /// The request id answered.
        got: u64,
    },
}

impl From<RawError> for io::Error {
    /// For tools that report every failure as an `io::Error`: a closed
    /// connection is `UnexpectedEof`, a bad frame or answer `InvalidData`.
    fn from(e: RawError) -> io::Error {
        match e {
            RawError::Io(e) => e,
            e @ (RawError::Closed | RawError::Truncated { .. }) => {
                io::Error::new(io::ErrorKind::UnexpectedEof, e)
            }
            e => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// One connection speaking raw frames; generic over the stream so a test
/// can read one half of a split socket. Its `Debug` leaves out the token
/// and the buffered frames, which carry it.
pub struct RawClient<S = TcpStream> {
    stream: S,
    codec: FrameCodec,
    /// Bytes read and not yet decoded.
    rbuf: BytesMut,
    /// Frames queued by [`RawClient::queue`] for the next flush.
    wbuf: BytesMut,
    next_id: u64,
    token: String,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RawClient<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawClient")
            .field("stream", &self.stream)
            .field("next_id", &self.next_id)
            .field("token_set", &!self.token.is_empty())
            .finish_non_exhaustive()
    }
}

impl RawClient<TcpStream> {
    /// Connects with TCP_NODELAY, as every latency-minded client does.
    ///
    /// # Errors
    /// When the connection cannot be made.
    pub async fn connect(addr: impl ToSocketAddrs) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawClient::new(stream))
    }
}

/// The stream of [`RawClient::connect_with`]: TCP, or TLS over it.
pub use crate::transport::Stream;

/// What a failed [`RawClient::connect_with`] (or the first read after it)
/// says of the user's TLS setup, as the library's client says it.
pub use crate::transport::tls_setup_error;

impl RawClient<Stream> {
    /// Connects as the library's client does with `options`: TCP_NODELAY,
    /// and TLS when [`ClientOptions::tls`](crate::ClientOptions::tls) is set
    /// (the server's certificate checked against the host of `addr`).
    ///
    /// # Errors
    /// When the connection or the TLS handshake fails.
    pub async fn connect_with(addr: &str, options: &crate::ClientOptions) -> io::Result<Self> {
        let stream = crate::transport::connect(addr, options, |s| {
            let _ = s.set_nodelay(true);
        })
        .await?;
        Ok(RawClient::new(stream))
    }
}

impl<S> RawClient<S> {
    /// A client on `stream` that accepts response frames up to
    /// [`crate::MAX_RESPONSE_FRAME`] and sends no access token.
    pub fn new(stream: S) -> Self {
        RawClient {
            stream,
            codec: FrameCodec::new(crate::MAX_RESPONSE_FRAME),
            rbuf: BytesMut::with_capacity(4096),
            wbuf: BytesMut::with_capacity(4096),
            next_id: 1,
            token: String::new(),
        }
    }

    /// Accepts response frames of up to `max_frame` bytes.
    pub fn with_max_frame(mut self, max_frame: usize) -> Self {
        self.codec = FrameCodec::new(max_frame);
        self
    }

    /// Puts `token` on every request built by [`RawClient::request`].
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }

    /// A fresh request id: 1, 2, 3, …
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A request of `kind` with a fresh id, this client's token and, when
    /// there are keys, a lock body naming them.
    pub fn request(&mut self, kind: RequestType, keys: &[String]) -> Request {
        Request {
            version: crate::PROTOCOL_VERSION,
            id: self.next_id(),
            access_token: self.token.clone(),
            r#type: kind as i32,
            lock: (!keys.is_empty()).then(|| RequestLock {
                keys: keys.to_vec(),
                ..RequestLock::default()
            }),
            ..Request::default()
        }
    }

    /// Queues `req` for the next [`RawClient::flush`]: many requests, one write.
    pub fn queue(&mut self, req: &Request) {
        encode_frame(req, &mut self.wbuf);
    }

    /// The stream, for what frames cannot express: raw socket options,
    /// shutdown, a peer address.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The stream, mutably: for writing bytes that are not frames while
    /// nothing is queued.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The stream; bytes read or queued and not yet used are dropped.
    pub fn into_stream(self) -> S {
        self.stream
    }
}

impl<S: AsyncWrite + Unpin> RawClient<S> {
    /// Writes every queued request.
    ///
    /// # Errors
    /// When the write fails; the queue is then left as it was.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.wbuf).await?;
        self.wbuf.clear();
        Ok(())
    }

    /// Writes `req` (after anything queued).
    ///
    /// # Errors
    /// When the write fails.
    pub async fn send(&mut self, req: &Request) -> io::Result<()> {
        self.queue(req);
        self.flush().await
    }

    /// Writes `bytes` as they are (after anything queued): broken frames,
    /// a frame split over writes, garbage.
    ///
    /// # Errors
    /// When the write fails.
    pub async fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.flush().await?;
        self.stream.write_all(bytes).await
    }
}

impl<S: AsyncRead + Unpin> RawClient<S> {
    /// The next response. Cancel-safe.
    ///
    /// # Errors
    /// [`RawError::Closed`] when the server closed the connection, and any
    /// error of [`RawClient::recv_or_closed`].
    pub async fn recv(&mut self) -> Result<Response, RawError> {
        self.recv_or_closed().await?.ok_or(RawError::Closed)
    }

    /// The next response, or `None` when the server closed the connection
    /// between frames. Cancel-safe.
    ///
    /// # Errors
    /// [`RawError::Truncated`] on a close inside a frame, [`RawError::Io`]
    /// when reading fails, and any error of [`RawClient::buffered`].
    pub async fn recv_or_closed(&mut self) -> Result<Option<Response>, RawError> {
        loop {
            if let Some(resp) = self.buffered()? {
                return Ok(Some(resp));
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return match self.rbuf.len() {
                    0 => Ok(None),
                    buffered => Err(RawError::Truncated { buffered }),
                };
            }
        }
    }

    /// A response already read, without touching the socket.
    ///
    /// # Errors
    /// [`RawError::Foreign`] for bytes from something other than a dlock
    /// server's client port, [`RawError::Frame`] or [`RawError::Decode`]
    /// for other bytes that are not a response.
    pub fn buffered(&mut self) -> Result<Option<Response>, RawError> {
        match self.codec.decode(&mut self.rbuf) {
            Ok(Some(body)) => Ok(Some(prost::Message::decode(body)?)),
            Ok(None) => Ok(None),
            // Only past this client's limit: a caller that raised it reads
            // longer frames than a dlock answer as frames.
            Err(e) => Err(match crate::transport::foreign_answer(&self.rbuf) {
                Some(foreign) => RawError::Foreign(Box::new(foreign)),
                None => RawError::Frame(e),
            }),
        }
    }

    /// Reads and discards until the server closes the connection (or it
    /// breaks) or `patience` runs out; returns whether it closed.
    pub async fn await_close(&mut self, patience: Duration) -> bool {
        self.rbuf.clear();
        let mut sink = [0u8; 4096];
        tokio::time::timeout(patience, async {
            while let Ok(1..) = self.stream.read(&mut sink).await {}
        })
        .await
        .is_ok()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawClient<S> {
    /// Sends `req` and reads the next response, which must answer it.
    ///
    /// # Errors
    /// [`RawError::Closed`] if the connection ends first,
    /// [`RawError::OutOfOrder`] for an answer to another request, and any
    /// error of [`RawClient::recv`].
    pub async fn call(&mut self, req: &Request) -> Result<Response, RawError> {
        self.send(req).await?;
        let resp = self.recv().await?;
        if resp.request_id != req.id {
            return Err(RawError::OutOfOrder {
                expected: req.id,
                got: resp.request_id,
            });
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_close_inside_a_frame_is_not_a_clean_close() {
        let (client, mut server) = tokio::io::duplex(64);
        let mut raw = RawClient::new(client);
        server.write_all(&[0, 0, 0, 9, 1]).await.unwrap();
        drop(server);
        assert!(matches!(
            raw.recv_or_closed().await,
            Err(RawError::Truncated { buffered: 5 })
        ));
    }

    #[tokio::test]
    async fn frames_come_back_in_order_then_a_clean_close() {
        let (client, mut server) = tokio::io::duplex(1024);
        let mut raw = RawClient::new(client);
        let mut wire = BytesMut::new();
        for id in [1, 2] {
            let resp = Response {
                request_id: id,
                ..Response::default()
            };
            encode_frame(&resp, &mut wire);
        }
        server.write_all(&wire).await.unwrap();
        drop(server);
        assert_eq!(raw.recv().await.unwrap().request_id, 1);
        assert_eq!(raw.buffered().unwrap().unwrap().request_id, 2);
        assert!(raw.recv_or_closed().await.unwrap().is_none());
        assert!(matches!(raw.recv().await, Err(RawError::Closed)));
    }
}
