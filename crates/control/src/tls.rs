//! Mutual TLS between members: every node presents a certificate signed by the cluster's CA
//! and accepts only peers that do the same. The files are read at start (an unreadable or
//! invalid file fails the start, naming it) and re-read when they change on disk, so that
//! certificates can be rotated without a restart: new connections use the new files, a file
//! set that does not load is refused with a warning and the previous one stays in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// How often the files are checked for changes.
pub(crate) const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Where a node's TLS material lives (`[cluster.tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain of this node, e.g. `/etc/iggy-replicator/tls/node.crt`. Its
    /// subject alternative names must cover the host of the node's Raft address.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
    /// PEM certificate(s) of the CA that signs every member's certificate.
    pub ca_file: PathBuf,
}

/// The TLS configurations built from one version of the files.
#[derive(Clone)]
pub(crate) struct TlsConfigs {
    /// Accepts only clients with a certificate signed by the CA.
    pub(crate) server: Arc<ServerConfig>,
    /// Presents this node's certificate and trusts only the CA.
    pub(crate) client: ClientConfig,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn bad(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::InvalidParams(format!("tls file {}: {reason}", path.display()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(path, e))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(certs)
}

/// Reads and checks the files and builds both configurations.
pub(crate) fn load(files: &TlsFiles) -> Result<TlsConfigs> {
    let chain = certificates(&files.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| bad(&files.key_file, e))?;
    let mut roots = RootCertStore::empty();
    for ca in certificates(&files.ca_file)? {
        roots.add(ca).map_err(|e| bad(&files.ca_file, e))?;
    }
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| bad(&files.ca_file, e))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidParams(format!("tls: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| bad(&files.cert_file, e))?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidParams(format!("tls: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(&files.cert_file, e))?;
    Ok(TlsConfigs {
        server: Arc::new(server),
        client,
    })
}

/// The modification times of the three files (`None` for one that cannot be read).
fn stamp(files: &TlsFiles) -> [Option<SystemTime>; 3] {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [
        modified(&files.cert_file),
        modified(&files.key_file),
        modified(&files.ca_file),
    ]
}

/// The current TLS configurations of a node, reloaded when the files change.
pub(crate) struct TlsState {
    files: TlsFiles,
    current: RwLock<(TlsConfigs, [Option<SystemTime>; 3])>,
}

impl TlsState {
    /// Loads the files; fails naming the file that does not load.
    pub(crate) fn open(files: TlsFiles) -> Result<Self> {
        let stamp = stamp(&files);
        let configs = load(&files)?;
        Ok(Self {
            files,
            current: RwLock::new((configs, stamp)),
        })
    }

    /// The configurations to use for the next connection.
    pub(crate) fn configs(&self) -> TlsConfigs {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }

    /// Reloads the files if any of them changed since the last load. Returns the new
    /// configurations when they were reloaded; a set that does not load keeps the old one.
    pub(crate) fn reload_if_changed(&self) -> Option<TlsConfigs> {
        let now = stamp(&self.files);
        {
            let current = self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if current.1 == now {
                return None;
            }
        }
        match load(&self.files) {
            Ok(configs) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = (configs.clone(), now);
                tracing::info!(cert_file = %self.files.cert_file.display(), "tls certificates reloaded");
                Some(configs)
            }
            Err(e) => {
                // Remember the stamp so the warning is not repeated until the files change.
                self.current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .1 = now;
                tracing::warn!(error = %e, "tls files changed but do not load; keeping the previous ones");
                None
            }
        }
    }
}
