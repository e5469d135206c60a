//! What a connection needs of its byte stream, so one connection task
//! serves plain TCP and TLS alike.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A client's byte stream: a `TcpStream`, or TLS over one
/// ([`crate::tls`]).
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Ready when a read may find bytes. The connection checks this before
    /// it reserves a read buffer, so idle connections hold none; a stream
    /// that cannot tell answers Ready.
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// The client's address.
    fn peer_addr(&self) -> io::Result<SocketAddr>;

    /// Names a client certificate gives access control; none for TCP.
    fn peer_names(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Transport for TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        TcpStream::peer_addr(self)
    }
}
