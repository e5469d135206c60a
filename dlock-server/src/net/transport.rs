//! What a connection needs of its byte stream, so one connection task
//! serves plain TCP and TLS alike.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A client's byte stream: a `TcpStream`, or TLS over one
/// ([`crate::net::tls`]).
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

    /// Makes the coming close a reset (RST) instead of a FIN: the client
    /// learns at once, even with answers unsent, that it must go elsewhere.
    fn reset_on_close(&self);
}

impl Transport for TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        TcpStream::peer_addr(self)
    }

    fn reset_on_close(&self) {
        reset_on_close(self);
    }
}

/// Linger 0: closing the socket sends an RST and drops what is unsent.
pub(crate) fn reset_on_close(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_linger(Some(std::time::Duration::ZERO));
}
