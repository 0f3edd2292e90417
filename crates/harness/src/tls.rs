//! Certificates for a cluster under test: one CA, and per node a certificate for its loopback
//! addresses that serves both as the member certificate (`[cluster.tls]`) and as the admin
//! API's (`[node.api_tls]`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// One node's certificate files, and the CA they trust.
#[derive(Debug, Clone)]
pub struct NodeTls {
    /// PEM certificate for the node's addresses.
    pub cert_file: PathBuf,
    /// Its PEM key.
    pub key_file: PathBuf,
    /// The CA that signed every node's certificate.
    pub ca_file: PathBuf,
}

/// A CA written to `dir`, signing node certificates on demand.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    ca_file: PathBuf,
}

fn setup(e: impl std::fmt::Display) -> Error {
    Error::Setup(format!("test certificates: {e}"))
}

impl TestCa {
    /// A new CA whose certificate is written to `dir/ca.crt`.
    pub fn new(dir: &Path) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(setup)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "iggy-replicator test ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(setup)?)
            .map_err(setup)?;
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, issuer.pem())?;
        Ok(Self {
            issuer,
            dir: dir.to_path_buf(),
            ca_file,
        })
    }

    /// The CA certificate's file (for clients: `--ca-file`).
    #[must_use]
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The CA certificate, PEM.
    #[must_use]
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes a certificate for `ips` (server and client use) as the files of `name`.
    pub fn node(&self, name: &str, ips: &[IpAddr]) -> Result<NodeTls> {
        let key = KeyPair::generate().map_err(setup)?;
        let names: Vec<String> = ips.iter().map(ToString::to_string).collect();
        let mut params = CertificateParams::new(names).map_err(setup)?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).map_err(setup)?;
        let files = NodeTls {
            cert_file: self.dir.join(format!("{name}.crt")),
            key_file: self.dir.join(format!("{name}.key")),
            ca_file: self.ca_file.clone(),
        };
        std::fs::write(&files.cert_file, cert.pem())?;
        std::fs::write(&files.key_file, key.serialize_pem())?;
        Ok(files)
    }
}
