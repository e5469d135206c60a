//! Mutual TLS on the peer port (`--peer-tls-cert`, `--peer-tls-key`,
//! `--peer-tls-ca`): every node presents its certificate and accepts, and
//! dials, only nodes whose certificate chains to the cluster's CA. Without
//! it the peer port is plain TCP, for a private network only: anyone who
//! reaches it could take part in elections.
//!
//! The dialling node checks the other's certificate against the host of
//! the peer address it dials, so each certificate must name its node's peer
//! host (an IP or DNS subject alternative name).

use anyhow::Context as _;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::ServerName;
use std::io;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tokio_util::either::Either;

/// Both halves of the peer port's TLS.
#[derive(Clone)]
pub struct PeerTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

impl PeerTls {
    /// Reads the node's certificate and key and the cluster's CA.
    ///
    /// # Errors
    /// A file cannot be read or parsed, or the key does not fit.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> anyhow::Result<PeerTls> {
        let provider = dlock::tls::provider();
        let roots = Arc::new(dlock::tls::read_roots(ca)?);
        let chain = dlock::tls::read_certs(cert)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .with_context(|| format!("cannot verify peers with {}", ca.display()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), dlock::tls::read_key(key)?)
            .with_context(|| format!("cannot use {} with {}", cert.display(), key.display()))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, dlock::tls::read_key(key)?)
            .with_context(|| format!("cannot use {} with {}", cert.display(), key.display()))?;
        Ok(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// The accepting side's handshake.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> io::Result<PeerStream> {
        let tls = self.acceptor.accept(tcp).await?;
        Ok(Either::Right(Box::new(TlsStream::Server(tls))))
    }

    /// The dialling side's handshake with the node at `addr`.
    pub(crate) async fn connect(&self, addr: &str, tcp: TcpStream) -> io::Result<PeerStream> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("peer address {addr:?} has no host TLS can check: {e}"),
            )
        })?;
        let tls = self.connector.connect(name, tcp).await?;
        Ok(Either::Right(Box::new(TlsStream::Client(tls))))
    }
}

/// A peer connection's byte stream: plain TCP (`Left`) or TLS (`Right`;
/// boxed, as a TLS session is about 1 KB and a TcpStream a few words).
/// tokio-util's `Either` passes reads and writes on to whichever it holds.
pub(crate) type PeerStream = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// A peer connection without TLS.
pub(crate) fn plain(tcp: TcpStream) -> PeerStream {
    Either::Left(tcp)
}
