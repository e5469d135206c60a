//! A minimal dlock connection speaking raw frames: no client library in
//! between, so the figures are the server's and the wire's, and the tool
//! works against any dlock-compatible server.

use bytes::BytesMut;
use dlock::codec::{encode_frame, FrameCodec};
use dlock::proto::{Request, RequestLock, RequestType, Response};
use dlock::tls::rustls::{pki_types::ServerName, ClientConfig};
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

/// A byte stream to the server: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send> Stream for S {}

/// One connection to the server under test.
pub struct Conn {
    stream: Box<dyn Stream>,
    codec: FrameCodec,
    rbuf: BytesMut,
    wbuf: BytesMut,
    next_id: u64,
    token: String,
}

impl Conn {
    /// Connects with TCP_NODELAY, as every sensible client does, and with
    /// `tls` completes a TLS handshake that checks the server's name (the
    /// host of `addr`).
    pub async fn connect(
        addr: &str,
        token: &str,
        tls: Option<&Arc<ClientConfig>>,
    ) -> io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match tls {
            None => Box::new(tcp),
            Some(config) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                Box::new(connector.connect(name, tcp).await?)
            }
        };
        Ok(Conn {
            stream,
            codec: FrameCodec::new(dlock::MAX_RESPONSE_FRAME),
            rbuf: BytesMut::with_capacity(4096),
            wbuf: BytesMut::with_capacity(4096),
            next_id: 1,
            token: token.to_string(),
        })
    }

    /// Builds a request with a fresh id.
    pub fn request(&mut self, kind: RequestType, keys: &[String], release_micro: u64) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        Request {
            version: dlock::PROTOCOL_VERSION,
            id,
            access_token: self.token.clone(),
            r#type: kind as i32,
            lock: (!keys.is_empty()).then(|| RequestLock {
                keys: keys.to_vec(),
                release_micro,
                ..RequestLock::default()
            }),
        }
    }

    /// Queues a request for the next [`Conn::flush`].
    pub fn push(&mut self, req: &Request) {
        encode_frame(req, &mut self.wbuf);
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.wbuf).await?;
        // TLS may keep written records until a flush; free for TCP.
        self.stream.flush().await?;
        self.wbuf.clear();
        Ok(())
    }

    /// Reads the next response.
    pub async fn recv(&mut self) -> io::Result<Response> {
        loop {
            if let Some(body) = self
                .codec
                .decode(&mut self.rbuf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
            {
                return prost::Message::decode(body)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
        }
    }

    /// A response already received, without reading the socket.
    pub fn buffered(&mut self) -> io::Result<Option<Response>> {
        match self.codec.decode(&mut self.rbuf) {
            Ok(Some(body)) => prost::Message::decode(body)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Ok(None) => Ok(None),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
    }

    /// Sends one request and reads its response.
    pub async fn call(&mut self, req: &Request) -> io::Result<Response> {
        self.push(req);
        self.flush().await?;
        let resp = self.recv().await?;
        if resp.request_id != req.id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "response to {} while waiting for {}",
                    resp.request_id, req.id
                ),
            ));
        }
        Ok(resp)
    }
}

/// A small, fast, seedable generator for picking keys: statistical quality
/// is all a benchmark needs, and it keeps runs reproducible.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value; 0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
