//! The client's byte stream: plain TCP, or TLS over it when
//! [`ClientOptions::tls`](crate::ClientOptions::tls) is set.

use crate::options::ClientOptions;
use rustls_pki_types::ServerName;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection to the server, TLS or not.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    // Boxed: a TLS session is about 1 KB, a TcpStream a few words.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Drops the connection with a reset rather than a clean close: for a
    /// cluster node, a clean close means the client is done with its
    /// session; a reset means the path broke and the session is to be
    /// resumed.
    pub(crate) fn abort(self) {
        self.reset_on_close(true);
    }

    /// Whether dropping the stream sends a reset (linger 0) or, as by
    /// default, a clean close.
    pub(crate) fn reset_on_close(&self, reset: bool) {
        let tcp = match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        };
        let linger = reset.then_some(std::time::Duration::ZERO);
        let _ = socket2::SockRef::from(tcp).set_linger(linger);
    }
}

/// Connects to `addr` and, with TLS configured, completes the handshake,
/// checking the server's certificate against the host part of `addr`.
/// `configure` sets socket options on the TCP connection first.
pub(crate) async fn connect(
    addr: &str,
    options: &ClientOptions,
    configure: impl FnOnce(&TcpStream),
) -> io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    configure(&tcp);
    let Some(tls) = &options.tls else {
        return Ok(Stream::Tcp(tcp));
    };
    let name = ServerName::try_from(host(addr).to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr:?} has no host name TLS can check: {e}"),
        )
    })?;
    let tls = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await?;
    Ok(Stream::Tls(Box::new(tls)))
}

/// How a TLS handshake failed, when the fix is the user's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsFailure {
    /// The other end does not speak TLS: what came back is no TLS record.
    NotTls,
    /// The server presented a CA certificate as its own.
    CaAsEndEntity,
    /// The server wants a client certificate and got none. With TLS 1.3
    /// its alert comes after the client's handshake, on the first read.
    ClientCertRequired,
    /// The server refused the client's certificate.
    ClientCertRefused,
    /// The server refused the protocol name the client offered
    /// ([`dlock_proto::tls::CLIENT_ALPN`]): a dlock-server's client port
    /// names none and takes any, its cluster's peer port refuses it.
    NotAClientPort,
}

impl TlsFailure {
    /// Whether the server refused the client's certificate, or its lack
    /// of one.
    pub(crate) fn is_the_clients(self) -> bool {
        matches!(
            self,
            TlsFailure::ClientCertRequired | TlsFailure::ClientCertRefused
        )
    }
}

/// What `e`, from [`connect`] or the first read after it, says of the
/// TLS setup.
pub(crate) fn tls_failure(e: &io::Error) -> Option<TlsFailure> {
    use rustls::AlertDescription as Alert;
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    match tls {
        rustls::Error::InvalidMessage(_) => Some(TlsFailure::NotTls),
        rustls::Error::AlertReceived(Alert::CertificateRequired) => {
            Some(TlsFailure::ClientCertRequired)
        }
        rustls::Error::AlertReceived(Alert::NoApplicationProtocol) => {
            Some(TlsFailure::NotAClientPort)
        }
        // What a server sends for a client certificate it does not accept
        // (rustls answers one of another CA with DecryptError: its
        // signature does not check against the trusted CA's key).
        rustls::Error::AlertReceived(
            Alert::BadCertificate
            | Alert::UnsupportedCertificate
            | Alert::CertificateRevoked
            | Alert::CertificateExpired
            | Alert::CertificateUnknown
            | Alert::UnknownCA
            | Alert::DecryptError,
        ) => Some(TlsFailure::ClientCertRefused),
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            Some(TlsFailure::CaAsEndEntity)
        }
        _ => None,
    }
}

/// The error that names the fix, when `source`, from connecting or the
/// first read after it, shows a TLS setup that does not match the
/// server's; else `source` back. What the library's client and the raw
/// one (`dlock cluster`) both tell their user.
///
/// # Errors
/// `source` itself when it says nothing of the TLS setup.
pub fn tls_setup_error(addr: &str, source: io::Error) -> Result<crate::Error, io::Error> {
    use crate::Error;
    let Some(failure) = tls_failure(&source) else {
        return Err(with_certificate_hint(addr, source));
    };
    let addr = addr.to_string();
    Ok(match failure {
        TlsFailure::NotTls => Error::ServerSpeaksNoTls { addr, source },
        TlsFailure::CaAsEndEntity => Error::CaUsedAsServerCertificate { addr, source },
        TlsFailure::ClientCertRequired => Error::ClientCertificateRequired { addr, source },
        TlsFailure::ClientCertRefused => Error::ClientCertificateRefused { addr, source },
        TlsFailure::NotAClientPort => Error::NotAClientPort { addr, source },
    })
}

/// `e` with what to change when it is the server's certificate that this
/// client does not accept: rustls names the check that failed
/// (`UnknownIssuer`), not the flag that decides it.
fn with_certificate_hint(addr: &str, e: io::Error) -> io::Error {
    use rustls::CertificateError as C;
    let Some(rustls::Error::InvalidCertificate(cert)) =
        e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>())
    else {
        return e;
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let hint = match cert {
        C::UnknownIssuer | C::BadSignature => "the server's certificate is not signed by the CA \
             this client trusts: give --tls-ca (DLOCK_TLS_CA) the CA file that signed it, the \
             ca.pem of `dlock-server cert`"
            .to_string(),
        C::NotValidForName | C::NotValidForNameContext { .. } => format!(
            "the server's certificate does not name {host}: dial a name or address it holds, or \
             give the server a certificate for {host} (dlock-server cert create-node NAME --addr \
             {host})"
        ),
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            "the server's certificate is not valid now (expired, or the clocks disagree): renew \
             it (dlock-server cert create-node) and send the server SIGHUP"
                .to_string()
        }
        _ => return e,
    };
    io::Error::new(e.kind(), format!("{e} ({hint})"))
}

/// Whether the first bytes a plain connection read are a TLS record (an
/// alert or a handshake, versions 3.x): the server speaks TLS, and its
/// answer must not be read as a frame length (0x15030300 would claim a
/// frame of 352 MB).
pub(crate) fn looks_like_tls(read: &[u8]) -> bool {
    matches!(read, [0x15 | 0x16, 0x03, minor, ..] if *minor <= 0x04)
}

/// Whether `read`, the start of what came back where a dlock answer was
/// expected, shows that the other end is no dlock client port: a TLS
/// record ([`Error::ServerSpeaksTls`](crate::Error::ServerSpeaksTls)), or
/// a frame longer than any dlock answer (an
/// [`Error::Protocol`](crate::Error::Protocol) saying so). Every reader of
/// answers asks this one function, so that the library's client and the
/// raw one (`dlock cluster`) name a wrong port alike.
pub(crate) fn foreign_answer(read: &[u8]) -> Option<crate::Error> {
    if looks_like_tls(read) {
        return Some(crate::Error::ServerSpeaksTls);
    }
    match crate::codec::frame_len(read, crate::MAX_RESPONSE_FRAME) {
        Err(_) => Some(crate::Error::Protocol(not_dlock(read))),
        Ok(_) => None,
    }
}

/// What a client tells its user when the first answer it read announces
/// a frame longer than any dlock answer: the other end is another service
/// (an HTTP metrics port, SSH), and `read`'s start, shown as text, usually
/// names it ("HTTP/1.1 400").
fn not_dlock(read: &[u8]) -> String {
    let start: String = read
        .iter()
        .take(24)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    format!(
        "the other end does not speak dlock's protocol (it answered \"{start}\"): \
         give the client port of a dlock-server (its --listen), not its metrics \
         port or another service's"
    )
}

/// The host of `host:port`, without the brackets of an IPv6 address.
fn host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_is_what_the_certificate_must_name() {
        assert_eq!(super::host("localhost:7436"), "localhost");
        assert_eq!(super::host("127.0.0.1:7436"), "127.0.0.1");
        assert_eq!(super::host("[::1]:7436"), "::1");
        assert_eq!(super::host("dlock.internal"), "dlock.internal");
    }
}
