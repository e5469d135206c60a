//! TLS on the client port (`--tls-cert`, `--tls-key`, optionally
//! `--tls-client-ca` for mutual TLS): the server configuration, swapped
//! whole on SIGHUP so new connections get new certificates while open ones
//! keep theirs; the handshake; and the names a client certificate gives
//! access control (its subject CN and DNS names).

use crate::net::transport::Transport;
use crate::ops::config::Config;
use crate::ops::metrics::{self, CloseReason};
use anyhow::Context as _;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The TLS settings in force and the files they come from.
#[derive(Debug)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    server: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// The TLS settings of `config`; `None` when TLS is off.
    ///
    /// # Errors
    /// A file cannot be read or parsed, or the key does not fit the
    /// certificate.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<Tls>> {
        let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
            return Ok(None);
        };
        let server = server_config(cert, key, config.tls_client_ca.as_deref())?;
        Ok(Some(Tls {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: config.tls_client_ca.clone(),
            server: RwLock::new(server),
        }))
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.client_ca.is_some()
    }

    /// Re-reads the files; the settings in force stay if they cannot be
    /// used. Open connections keep the certificates they started with.
    ///
    /// # Errors
    /// As [`Tls::from_config`].
    pub fn reload(&self) -> anyhow::Result<()> {
        let server = server_config(&self.cert, &self.key, self.client_ca.as_deref())?;
        *self.server.write().unwrap_or_else(|p| p.into_inner()) = server;
        Ok(())
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        let server = self.server.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(server.clone())
    }
}

fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = dlock_proto::tls::provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        Some(ca) => {
            let roots = dlock_proto::tls::read_roots(ca)?;
            // Every client must present a certificate from this CA.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("cannot verify clients with {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = dlock_proto::tls::read_certs(cert)?;
    crate::ops::cert::refuse_unfit_as_own(cert, &chain, OWN_FLAGS)?;
    let config = builder
        .with_single_cert(chain, dlock_proto::tls::read_key(key)?)
        .map_err(|e| dlock_proto::tls::pair_error(e, cert, key))?;
    Ok(Arc::new(config))
}

/// The client port's flags, for [`crate::ops::cert::refuse_unfit_as_own`].
const OWN_FLAGS: crate::ops::cert::OwnFlags = crate::ops::cert::OwnFlags {
    cert: "--tls-cert",
    ca: "the clients (--tls-ca)",
    dials: false,
};

/// Completes the server side of the handshake within `timeout`, or before
/// `shutdown`. A failure is logged and counted, and ends the connection.
pub async fn handshake(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    timeout: std::time::Duration,
    shutdown: &CancellationToken,
) -> Option<TlsStream<TcpStream>> {
    let result = tokio::select! {
        _ = shutdown.cancelled() => return None,
        r = tokio::time::timeout(timeout, acceptor.accept(stream)) => r,
    };
    let error = match result {
        Ok(Ok(tls)) => return Some(tls),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "no handshake within {}",
            humantime::format_duration(timeout)
        ),
    };
    metrics::connection_closed(CloseReason::TlsHandshake);
    tracing::info!(reason = "tls handshake", %error, "client dropped");
    None
}

/// The names a client certificate gives its holder: the subject's common
/// names, then its DNS names. Empty without a certificate, or for one that
/// does not parse (the handshake has verified its signature, not its
/// contents' shape).
pub fn peer_names(stream: &TlsStream<TcpStream>) -> Vec<String> {
    let Some(leaf) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push((*dns).to_owned());
            }
        }
    }
    names
}

impl Transport for TlsStream<TcpStream> {
    fn poll_read_ready(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // rustls may hold decrypted bytes the socket no longer signals:
        // always try the read, which registers for wake-up when it finds
        // nothing.
        Poll::Ready(Ok(()))
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.get_ref().0.peer_addr()
    }

    fn peer_names(&self) -> Vec<String> {
        peer_names(self)
    }

    fn reset_on_close(&self) {
        crate::net::transport::reset_on_close(self.get_ref().0);
    }
}
