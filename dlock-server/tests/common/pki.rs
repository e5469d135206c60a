//! A test certificate authority (rcgen): no key is ever checked in.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::path::{Path, PathBuf};

/// A certificate authority that writes PEM files into a directory.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca = Ca {
            issuer,
            dir: dir.to_owned(),
            name: name.to_owned(),
        };
        std::fs::write(ca.ca_file(), ca.issuer.pem()).unwrap();
        ca
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Writes a certificate and key for `names` (the first one is also the
    /// subject CN) and returns their paths.
    pub fn issue(
        &self,
        file: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        self.issue_for(file, names, vec![usage])
    }

    /// As [`Ca::issue`], for every usage in `usages`.
    pub fn issue_for(
        &self,
        file: &str,
        names: &[&str],
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn server(&self, names: &[&str]) -> (PathBuf, PathBuf) {
        self.issue(
            &format!("{}-server", self.name),
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }
}
