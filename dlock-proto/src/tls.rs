//! TLS settings shared by the client library, the `dlock` command and the
//! server: rustls with the ring provider, certificates and keys read from
//! PEM files.

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;

/// A TLS file that cannot be used, or settings rustls refuses.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read or parsed.
    // The cause is in the message and not linked as the error's source:
    // a chain printed whole (`{:#}`) would show it twice.
    #[error("cannot read {what} from {path}: {cause}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        cause: rustls_pki_types::pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{path} holds no certificate")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// rustls refuses the certificates or key (for example a key that does
    /// not match its certificate).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// rustls refuses a certificate with its key: most often a key that is
    /// not the certificate's own (another node's .key).
    #[error("cannot use {} with {}: {}", cert.display(), key.display(), pair_trouble(source))]
    Pair {
        /// The certificate chain's file.
        cert: PathBuf,
        /// The key's file.
        key: PathBuf,
        /// What rustls said. Not a `#[source]`: the message holds it, and a
        /// chain printed with `{:#}` would say it twice.
        source: rustls::Error,
    },
    /// A certificate authority cannot be used.
    #[error("cannot use CA certificate from {path}: {source}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
}

/// What rustls's refusal of a certificate with a key means to the one who
/// gave the two files.
fn pair_trouble(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InconsistentKeys(_) => "the key is not the certificate's own: give \
             the .key file written beside that .pem (dlock-server cert writes NAME.pem and \
             NAME.key together)"
            .into(),
        e => e.to_string(),
    }
}

/// [`TlsError::Pair`] for `cert` and `key`, which rustls refused together.
pub fn pair_error(source: rustls::Error, cert: &Path, key: &Path) -> TlsError {
    TlsError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    }
}

/// The crypto provider every dlock program uses: ring, which builds with a
/// C compiler alone.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in order (a chain starts with the
/// leaf).
///
/// # Errors
/// The file cannot be read or parsed, or holds no certificate.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |cause| TlsError::Pem {
        what: "certificates",
        path: path.to_owned(),
        cause,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// The file cannot be read, or holds no key.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|cause| TlsError::Pem {
        what: "a private key",
        path: path.to_owned(),
        cause,
    })
}

/// Trust anchors from a PEM file of CA certificates.
///
/// # Errors
/// The file cannot be read or a certificate in it cannot be used.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::Ca {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(roots)
}

/// The TLS protocol name (ALPN) dlock's clients offer. A dlock-server's
/// client port names none, and so takes any client; a cluster node's peer
/// port takes only its own and refuses this one with an alert
/// (`no_application_protocol`), by which a client given a peer port by
/// mistake can say so rather than ask for a client certificate.
pub const CLIENT_ALPN: &[u8] = b"dlock";

/// A client configuration that trusts the CAs in `ca` and, for servers that
/// ask for one (`--tls-client-ca`), presents the certificate chain and key
/// in `identity`. The server's name is checked against its certificate; it
/// offers the protocol name [`CLIENT_ALPN`].
///
/// # Errors
/// A file cannot be read or parsed, or rustls refuses the key.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(read_roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| pair_error(e, cert, key))?,
        None => builder.with_no_client_auth(),
    };
    let mut config = config;
    config.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    Ok(Arc::new(config))
}
