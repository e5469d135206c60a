//! `dlock-server cert`: the certificates TLS, mutual TLS and peer TLS need,
//! in one command each, as CockroachDB's `cockroach cert` makes them.
//!
//! - `create-ca` makes a certificate authority (`ca.pem`, `ca.key`): the
//!   file every client gives as `--tls-ca`, every node as `--tls-client-ca`
//!   and `--peer-tls-ca`.
//! - `create-node NAME --addr HOST...` makes a node's certificate, signed by
//!   the CA, naming every address clients and peers reach it by (an IP
//!   address or a DNS name each), for both ends of TLS: the node serves
//!   with it (`--tls-cert`, `--peer-tls-cert`) and dials its peers with it.
//! - `create-client NAME` makes a client's certificate for mutual TLS: NAME
//!   is the identity the server's access rules name.
//!
//! Keys are written with mode 0600, and nothing is ever overwritten: an
//! operator who runs a command twice keeps the first files. The CA's own
//! certificate is never a server's (TLS refuses a CA certificate presented
//! as an end entity, which is what one self-signed certificate used as both
//! gives).

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `dlock-server cert`.
#[derive(Debug, clap::Args)]
pub struct Cert {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
// The subcommands' names, as `cockroach cert` has them.
#[allow(clippy::enum_variant_names)]
enum Action {
    /// Make a certificate authority: DIR/ca.pem (give it to clients as
    /// --tls-ca, to nodes as --tls-client-ca and --peer-tls-ca) and
    /// DIR/ca.key (keep it safe: it signs the others).
    CreateCa {
        #[command(flatten)]
        out: Out,
    },
    /// Make a node's certificate, signed by the CA: DIR/NAME.pem and
    /// DIR/NAME.key, for --tls-cert/--tls-key and
    /// --peer-tls-cert/--peer-tls-key.
    CreateNode {
        /// The node's name (the certificate's common name and file names).
        name: String,
        /// Every address clients and peers reach the node by: an IP address
        /// or a DNS name, with or without a port (the port is ignored).
        /// Repeat it, or separate them by commas.
        #[arg(
            long = "addr",
            required = true,
            value_delimiter = ',',
            value_name = "HOST[:PORT]"
        )]
        addrs: Vec<String>,
        #[command(flatten)]
        out: Out,
    },
    /// Make a client's certificate for mutual TLS, signed by the CA:
    /// DIR/NAME.pem and DIR/NAME.key, for dlock's --tls-cert/--tls-key.
    /// NAME is the identity the server's access rules (--token-file) name.
    CreateClient {
        /// The client's identity.
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, clap::Args)]
struct Out {
    /// Folder of the CA and the certificates (made if missing, mode 0700).
    #[arg(long, default_value = "dlock-certs", value_name = "DIR")]
    dir: PathBuf,
    /// How long the certificate is valid, in days.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..), value_name = "DAYS")]
    days: Option<u16>,
}

/// A CA's validity unless --days says otherwise: ten years.
const CA_DAYS: u16 = 3650;
/// A node's or client's: about two years, as public CAs used to allow.
const LEAF_DAYS: u16 = 825;

impl Cert {
    /// Runs the action and says what it wrote.
    ///
    /// # Errors
    /// A file exists already, the CA is missing or unreadable, a name or
    /// address is not one a certificate can hold, or a file cannot be
    /// written.
    pub fn run(&self) -> anyhow::Result<()> {
        match &self.action {
            Action::CreateCa { out } => create_ca(out),
            Action::CreateNode { name, addrs, out } => {
                let mut sans = Vec::new();
                for a in addrs {
                    sans.push(san_of(a)?);
                }
                create_leaf(out, name, sans, true)
            }
            Action::CreateClient { name, out } => {
                let sans = rcgen::string::Ia5String::try_from(name.as_str())
                    .ok()
                    .filter(|_| is_dns_name(name))
                    .map(SanType::DnsName)
                    .into_iter()
                    .collect();
                create_leaf(out, name, sans, false)
            }
        }
    }
}

fn create_ca(out: &Out) -> anyhow::Result<()> {
    let (cert_path, key_path) = paths(&out.dir, "ca")?;
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name = named("dlock CA");
    valid_for(&mut params, out.days.unwrap_or(CA_DAYS));
    let key = KeyPair::generate().context("cannot make a key")?;
    let cert = params.self_signed(&key).context("cannot sign the CA")?;
    write(
        &out.dir,
        &cert_path,
        &key_path,
        &cert.pem(),
        &key.serialize_pem(),
    )?;
    println!(
        "dlock-server: wrote the CA {} and its key {} (keep it safe: it signs the others)",
        cert_path.display(),
        key_path.display()
    );
    Ok(())
}

fn create_leaf(out: &Out, name: &str, sans: Vec<SanType>, node: bool) -> anyhow::Result<()> {
    if name.is_empty() || name.contains(['/', '\0']) || name == "ca" {
        bail!("{name:?} cannot name a certificate file: give a plain name such as node1 or alice");
    }
    let ca_pem = out.dir.join("ca.pem");
    let ca_key = out.dir.join("ca.key");
    let pem = std::fs::read_to_string(&ca_pem).with_context(|| {
        format!(
            "cannot read the CA {} (make it first: dlock-server cert create-ca --dir {})",
            ca_pem.display(),
            out.dir.display()
        )
    })?;
    let key = std::fs::read_to_string(&ca_key)
        .with_context(|| format!("cannot read the CA's key {}", ca_key.display()))?;
    let key = KeyPair::from_pem(&key)
        .with_context(|| format!("{} is not a private key in PEM", ca_key.display()))?;
    let issuer = Issuer::from_ca_cert_pem(&pem, key)
        .with_context(|| format!("{} is not a CA certificate in PEM", ca_pem.display()))?;
    let (cert_path, key_path) = paths(&out.dir, name)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = named(name);
    params.subject_alt_names = sans;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // A node serves clients and peers, and dials its peers with the same
    // certificate; a client only dials.
    params.extended_key_usages = if node {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    valid_for(&mut params, out.days.unwrap_or(LEAF_DAYS));
    let key = KeyPair::generate().context("cannot make a key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the certificate")?;
    write(
        &out.dir,
        &cert_path,
        &key_path,
        &cert.pem(),
        &key.serialize_pem(),
    )?;
    println!(
        "dlock-server: wrote {} and its key {}, signed by {}",
        cert_path.display(),
        key_path.display(),
        ca_pem.display()
    );
    Ok(())
}

fn named(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// From a day ago (clocks that lag a little still accept it) for `days`.
fn valid_for(params: &mut CertificateParams, days: u16) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// The subject alternative name for `addr`: `HOST`, `HOST:PORT`, `[V6]:PORT`
/// or a bare IPv6 address.
fn san_of(addr: &str) -> anyhow::Result<SanType> {
    let host =
        match addr.parse::<std::net::SocketAddr>() {
            Ok(sa) => return Ok(SanType::IpAddress(sa.ip())),
            Err(_) if addr.parse::<IpAddr>().is_ok() => addr,
            Err(_) => addr.rsplit_once(':').map_or(addr, |(h, port)| {
                if port.parse::<u16>().is_ok() {
                    h
                } else {
                    addr
                }
            }),
        };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    if !is_dns_name(host) {
        bail!("--addr {addr:?}: {host:?} is neither an IP address nor a DNS name");
    }
    let dns = rcgen::string::Ia5String::try_from(host)
        .map_err(|e| anyhow::anyhow!("--addr {addr:?}: {e}"))?;
    Ok(SanType::DnsName(dns))
}

/// Letters, digits, hyphens and dots, in labels of 1 to 63, as TLS checks
/// them (a leading `*.` is a wildcard).
fn is_dns_name(s: &str) -> bool {
    let s = s.strip_prefix("*.").unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// The certificate and key paths for `name` in `dir`, which must both be
/// free: nothing is overwritten.
fn paths(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    for p in [&cert, &key] {
        if p.exists() {
            bail!(
                "{} exists already: nothing was written (move it aside to make a new one)",
                p.display()
            );
        }
    }
    Ok((cert, key))
}

/// Writes the key (mode 0600) and the certificate (0644) into `dir`, made
/// with mode 0700 if missing; each file is created new, never replaced.
fn write(dir: &Path, cert: &Path, key: &Path, cert_pem: &str, key_pem: &str) -> anyhow::Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let create = |path: &Path, mode: u32, text: &str| -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .with_context(|| format!("cannot write {}", path.display()))
    };
    create(key, 0o600, key_pem)?;
    create(cert, 0o644, cert_pem)
}

/// The port a node's own certificate is for, as [`refuse_unfit_as_own`]
/// names it: which flag gave the certificate, who is to be given the CA's,
/// and whether the node also dials with it.
pub struct OwnFlags {
    /// The flag that named the certificate (`--tls-cert`, `--peer-tls-cert`).
    pub cert: &'static str,
    /// Who takes the CA's certificate, with their flag.
    pub ca: &'static str,
    /// Whether the certificate is also presented when dialling (the peer
    /// port: a node dials its peers with it).
    pub dials: bool,
}

/// Refuses, as a node's own certificate, the first of `chain` (read from
/// `file`) where TLS peers would refuse it at every handshake, so a node
/// started with it would serve nobody:
/// - a CA certificate (basicConstraints CA:TRUE), which peers, dlock's
///   clients and nodes among them, refuse as an end entity. (One
///   self-signed certificate given as both a node's and the CA is the
///   usual way there.)
/// - one whose extended key usage does not allow serving (server
///   authentication) or, where the node dials too, client authentication:
///   a client's certificate (`dlock-server cert create-client`'s) given as
///   a server's. One without the extension allows every use.
///
/// A certificate that does not parse is rustls's to refuse, in its words.
///
/// # Errors
/// The message names `file`, what is wrong, and what to give instead.
pub fn refuse_unfit_as_own(
    file: &Path,
    chain: &[rustls_pki_types::CertificateDer<'_>],
    flags: OwnFlags,
) -> anyhow::Result<()> {
    let Some((_, leaf)) = chain
        .first()
        .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
    else {
        return Ok(());
    };
    if leaf.is_ca() {
        bail!(
            "{} is a CA certificate (basicConstraints CA:TRUE), which TLS peers refuse as a \
             server's own: give {} the server's own certificate, signed by the CA \
             (dlock-server cert create-node NAME --addr HOST writes NAME.pem and NAME.key), \
             and give the CA's to {}",
            file.display(),
            flags.cert,
            flags.ca
        );
    }
    let Ok(Some(usage)) = leaf.extended_key_usage() else {
        return Ok(());
    };
    let usage = usage.value;
    let lacks = if usage.any {
        None
    } else if !usage.server_auth {
        Some("server authentication")
    } else if flags.dials && !usage.client_auth {
        Some("client authentication, which a node needs to dial its peers")
    } else {
        None
    };
    if let Some(lacks) = lacks {
        bail!(
            "{} does not allow {lacks} (its extended key usage): give {} a node's certificate \
             (dlock-server cert create-node NAME --addr HOST writes NAME.pem and NAME.key, for \
             both uses); a certificate made with create-client is a client's",
            file.display(),
            flags.cert,
        );
    }
    Ok(())
}
