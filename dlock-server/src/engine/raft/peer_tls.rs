//! Mutual TLS on the peer port (`--peer-tls-cert`, `--peer-tls-key`,
//! `--peer-tls-ca`): every node presents its certificate and accepts, and
//! dials, only nodes whose certificate chains to the cluster's CA. Without
//! it the peer port is plain TCP, for a private network only: anyone who
//! reaches it could take part in elections.
//!
//! The dialling node checks the other's certificate against the host of
//! the peer address it dials, so each certificate must name its node's peer
//! host (an IP or DNS subject alternative name).
//!
//! SIGHUP re-reads the three files: connections already open keep the
//! session they have, and every handshake after it uses the new
//! certificates; files that cannot be used leave the old ones in force.

use anyhow::Context as _;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::ServerName;
use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tokio_util::either::Either;

/// Both halves of the peer port's TLS; clones share one set of
/// certificates, which [`PeerTls::reload`] swaps.
#[derive(Clone)]
pub struct PeerTls {
    inner: Arc<Inner>,
}

struct Inner {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    halves: RwLock<Halves>,
}

#[derive(Clone)]
struct Halves {
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
        let halves = Halves::read(cert, key, ca)?;
        Ok(PeerTls {
            inner: Arc::new(Inner {
                cert: cert.to_owned(),
                key: key.to_owned(),
                ca: ca.to_owned(),
                halves: RwLock::new(halves),
            }),
        })
    }

    /// Re-reads the files given at start; the next handshakes use them.
    ///
    /// # Errors
    /// As [`PeerTls::from_files`]; the certificates in force stay then.
    pub fn reload(&self) -> anyhow::Result<()> {
        let i = &self.inner;
        let fresh = Halves::read(&i.cert, &i.key, &i.ca)?;
        *i.halves.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// The halves in force, cloned out so no guard is held across a
    /// handshake.
    fn halves(&self) -> Halves {
        self.inner
            .halves
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The peer port's flags, for [`crate::ops::cert::refuse_unfit_as_own`].
const OWN_FLAGS: crate::ops::cert::OwnFlags = crate::ops::cert::OwnFlags {
    cert: "--peer-tls-cert",
    ca: "every node (--peer-tls-ca)",
    dials: true,
};

/// The TLS protocol name (ALPN) of the peer port.
const PEER_ALPN: &[u8] = b"dlock-peer";

impl Halves {
    fn read(cert: &Path, key: &Path, ca: &Path) -> anyhow::Result<Halves> {
        let provider = dlock_proto::tls::provider();
        let roots = Arc::new(dlock_proto::tls::read_roots(ca)?);
        let chain = dlock_proto::tls::read_certs(cert)?;
        crate::ops::cert::refuse_unfit_as_own(cert, &chain, OWN_FLAGS)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .with_context(|| format!("cannot verify peers with {}", ca.display()))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), dlock_proto::tls::read_key(key)?)
            .map_err(|e| dlock_proto::tls::pair_error(e, cert, key))?;
        // A name of its own, so that a TLS client offering dlock's
        // (dlock_proto::tls::CLIENT_ALPN) is refused with an alert that
        // tells it this is a peer port, before it is asked for a peer
        // certificate it cannot have. Nodes offer no name, old or new: a
        // server accepts any client that offers none.
        server.alpn_protocols = vec![PEER_ALPN.to_vec()];
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, dlock_proto::tls::read_key(key)?)
            .map_err(|e| dlock_proto::tls::pair_error(e, cert, key))?;
        Ok(Halves {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
}

impl PeerTls {
    /// The accepting side's handshake.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> io::Result<PeerStream> {
        let acceptor = self.halves().acceptor;
        let tls = acceptor.accept(tcp).await?;
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
        let connector = self.halves().connector;
        let tls = connector.connect(name, tcp).await.map_err(|e| {
            // A plain peer port reads the handshake as an oversized frame
            // and closes (with the rest unread, so a reset): all this side
            // sees is the close.
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ) {
                io::Error::new(
                    e.kind(),
                    format!(
                        "TLS handshake cut off ({e}): does the node at {addr} have no \
                         --peer-tls-* files? give every node the same peer TLS setting"
                    ),
                )
            } else {
                e
            }
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};
    use tokio::io::AsyncReadExt;

    /// `dlock-server cert ARGS`, as an operator runs it.
    fn cert(args: &[&str]) {
        let command = crate::ops::cert::Cert::augment_args(clap::Command::new("cert"));
        let matches = command
            .try_get_matches_from(std::iter::once("cert").chain(args.iter().copied()))
            .expect("cert arguments");
        crate::ops::cert::Cert::from_arg_matches(&matches)
            .expect("cert arguments")
            .run()
            .expect("certificates written");
    }

    /// A node with peer TLS dialling a node without it saw only a closed
    /// connection.
    #[tokio::test]
    async fn a_handshake_cut_off_by_a_plain_peer_port_says_what_to_check() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("certs");
        let d = d.to_str().unwrap();
        cert(&["create-ca", "--dir", d]);
        cert(&["create-node", "n", "--addr", "127.0.0.1", "--dir", d]);
        let path = |f: &str| Path::new(d).join(f);
        let tls = PeerTls::from_files(&path("n.pem"), &path("n.key"), &path("ca.pem")).unwrap();
        // A plain peer port: reads the handshake as a frame too long and
        // closes the connection.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = plain.local_addr().unwrap().to_string();
        let closer = tokio::spawn(async move {
            let (mut s, _) = plain.accept().await.unwrap();
            let mut head = [0u8; 4];
            s.read_exact(&mut head).await.unwrap();
            head
        });
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let err = tls.connect(&addr, tcp).await.map(|_| ()).unwrap_err();
        assert_eq!(closer.await.unwrap()[0], 0x16, "a handshake record");
        let text = err.to_string();
        assert!(text.contains("TLS handshake cut off"), "{text}");
        assert!(text.contains("--peer-tls-*"), "{text}");
    }
}
