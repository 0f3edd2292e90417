//! TLS for the node's HTTP listeners. Between members it is mutual: every node presents a
//! certificate signed by the cluster's CA and accepts only peers that do the same
//! ([`TlsFiles`]); the admin API reuses the same loading, reloading and serving
//! ([`ServerTls`], [`serve_tls`]). The files are read at start (an unreadable or invalid file
//! fails the start, naming it) and re-read when they change on disk, so that certificates can
//! be rotated without a restart: new connections use the new files; a set that does not load
//! is refused with a warning and the previous one stays in use.

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

/// An HTTPS listener's own certificate, and optionally the CA its clients must present a
/// certificate of (the admin API's `[node.api_tls]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM certificate chain of the listener.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// Builds the server configuration of `files`.
fn load_server(files: &ServerTlsFiles) -> Result<Arc<ServerConfig>> {
    let chain = certificates(&files.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| bad(&files.key_file, e))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidParams(format!("tls: {e}")))?;
    let builder = match &files.client_ca_file {
        Some(ca_file) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(ca_file)? {
                roots.add(ca).map_err(|e| bad(ca_file, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| bad(ca_file, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| bad(&files.cert_file, e))?;
    Ok(Arc::new(config))
}

/// Something built from files, rebuilt when any of them changes on disk.
pub(crate) struct Reloading<T> {
    paths: Vec<PathBuf>,
    build: Box<dyn Fn() -> Result<T> + Send + Sync>,
    current: RwLock<(T, Vec<Option<SystemTime>>)>,
}

fn stamps(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

impl<T: Clone> Reloading<T> {
    /// Builds once (failing with the file that does not load) and remembers the files' times.
    fn open(paths: Vec<PathBuf>, build: Box<dyn Fn() -> Result<T> + Send + Sync>) -> Result<Self> {
        let stamp = stamps(&paths);
        let value = build()?;
        Ok(Self {
            paths,
            build,
            current: RwLock::new((value, stamp)),
        })
    }

    /// The current value.
    pub(crate) fn get(&self) -> T {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }

    /// Rebuilds if any file changed since the last build; returns the new value. A build that
    /// fails keeps the old value (logged once per change of the files).
    pub(crate) fn reload_if_changed(&self) -> Option<T> {
        let now = stamps(&self.paths);
        if self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            == now
        {
            return None;
        }
        let built = (self.build)();
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        current.1 = now;
        match built {
            Ok(value) => {
                current.0 = value.clone();
                tracing::info!(files = ?self.paths, "tls files reloaded");
                Some(value)
            }
            Err(e) => {
                tracing::warn!(error = %e, "tls files changed but do not load; keeping the previous ones");
                None
            }
        }
    }
}

/// A member's TLS configurations, reloaded when its files change.
pub(crate) type TlsState = Reloading<TlsConfigs>;

impl TlsState {
    /// Loads the member's files; fails naming the file that does not load.
    pub(crate) fn for_member(files: TlsFiles) -> Result<Self> {
        let paths = vec![
            files.cert_file.clone(),
            files.key_file.clone(),
            files.ca_file.clone(),
        ];
        Reloading::open(paths, Box::new(move || load(&files)))
    }
}

/// The TLS configuration of an HTTPS listener, reloaded when its files change; serve with
/// [`serve_tls`] and call [`ServerTls::watch`] to pick up rotated certificates.
pub struct ServerTls(Arc<Reloading<Arc<ServerConfig>>>);

impl ServerTls {
    /// Loads the files; fails naming the file that does not load.
    pub fn open(files: ServerTlsFiles) -> Result<Self> {
        let mut paths = vec![files.cert_file.clone(), files.key_file.clone()];
        paths.extend(files.client_ca_file.clone());
        Ok(Self(Arc::new(Reloading::open(
            paths,
            Box::new(move || load_server(&files)),
        )?)))
    }

    /// Checks the files every few seconds until `stop`, so new connections use rotated files.
    pub fn watch(&self, stop: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
        let state = self.0.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_CHECK_INTERVAL);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                state.reload_if_changed();
            }
        })
    }
}

/// Serves `router` over TLS on `listener` until `shutdown`; connections still open then are
/// closed.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
    tls: &ServerTls,
) {
    let state = tls.0.clone();
    serve_tls_with(listener, router, shutdown, move || state.get()).await;
}

/// How long a peer may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Accepts TLS connections and serves `router` on each until `shutdown`, each with the
/// configuration `config` answers when it is accepted; connections still open then are closed.
pub(crate) async fn serve_tls_with<F>(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
    config: F,
) where
    F: Fn() -> Arc<rustls::ServerConfig> + Send + Sync + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(config());
        let router = router.clone();
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "refused a tls connection");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "tls handshake timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let served =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}
