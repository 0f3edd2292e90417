//! Mutual TLS between members: certificates made here with rcgen (a CA, node certificates for
//! 127.0.0.1, and a foreign CA), written to PEM files the nodes read and watch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use replicator_control::TlsFiles;
use replicator_model::NodeId;

use crate::util::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A certificate authority that signs node certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Result<Self, BoxError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)?,
        })
    }

    /// A node certificate for 127.0.0.1, usable as server and client: (cert PEM, key PEM).
    fn node(&self) -> Result<(String, String), BoxError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()])?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes a node certificate and this CA into `dir` as the files of node `id`.
    fn write_node(&self, dir: &Path, id: NodeId, trust: &Ca) -> Result<TlsFiles, BoxError> {
        let (cert, key) = self.node()?;
        let files = TlsFiles {
            cert_file: dir.join(format!("node-{id}.crt")),
            key_file: dir.join(format!("node-{id}.key")),
            ca_file: dir.join(format!("ca-{id}.crt")),
        };
        std::fs::write(&files.cert_file, cert)?;
        std::fs::write(&files.key_file, key)?;
        std::fs::write(&files.ca_file, trust.issuer.pem())?;
        Ok(files)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A raw HTTPS client trusting `ca`, presenting `identity` (cert PEM, key PEM) if given.
fn raw_client(ca: &Ca, identity: Option<(String, String)>) -> Result<reqwest::Client, BoxError> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone())?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder.with_client_auth_cert(
            vec![rustls_pki_types::CertificateDer::from_pem_slice(
                cert.as_bytes(),
            )?],
            rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .timeout(Duration::from_secs(5))
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_run_over_mutual_tls_and_refuse_peers_without_a_valid_certificate() -> TestResult
{
    let certs = tempfile::tempdir()?;
    let ca = Ca::new("cluster ca")?;
    let tls: BTreeMap<NodeId, TlsFiles> = (1..=3)
        .map(|id| Ok((id, ca.write_node(certs.path(), id, &ca)?)))
        .collect::<Result<_, BoxError>>()?;
    let cluster = TestCluster::start_with_tls(3, fast_timing(), tls, None).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    cluster.report_units(leader, 3).await?;
    cluster
        .wait_owners("3 units assigned over tls", leader, |owners| {
            owners.len() == 3 && owners.values().all(Option::is_some)
        })
        .await?;

    let url = format!("https://{}/control/ping", cluster.addrs[&1]);
    // Plain HTTP to the TLS listener gets no answer.
    let plain = reqwest::Client::new()
        .post(format!("http://{}/control/ping", cluster.addrs[&1]))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert2::check!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));
    // TLS without a client certificate, or with one from another CA: the handshake fails.
    let anonymous = raw_client(&ca, None)?.post(&url).send().await;
    assert2::check!(anonymous.is_err());
    let foreign = Ca::new("foreign ca")?;
    let stranger = raw_client(&ca, Some(foreign.node()?))?
        .post(&url)
        .send()
        .await;
    assert2::check!(stranger.is_err());
    // A valid certificate gets through TLS, and is then refused for its missing signature:
    // TLS authenticates the peer, the HMAC the request.
    let member = raw_client(&ca, Some(ca.node()?))?.post(&url).send().await?;
    assert2::check!(member.status().as_u16() == 401);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_foreign_certificate_is_shut_out_until_its_files_are_replaced() -> TestResult
{
    let certs = tempfile::tempdir()?;
    let ca = Ca::new("cluster ca")?;
    let foreign = Ca::new("foreign ca")?;
    let mut tls = BTreeMap::new();
    for id in 1..=2 {
        tls.insert(id, ca.write_node(certs.path(), id, &ca)?);
    }
    // Node 3 trusts the right CA but presents a certificate of another one.
    let files3 = foreign.write_node(certs.path(), 3, &ca)?;
    tls.insert(3, files3.clone());
    let cluster = TestCluster::start_with_tls(3, fast_timing(), tls, None).await?;
    let leader = cluster
        .wait_leader_among(&[1, 2], Duration::from_secs(10))
        .await?;
    // Well past an election and a reload check: node 3 still knows no leader.
    let three = cluster.node(3).clone();
    let shut_out = wait_until("node 3 to learn a leader", Duration::from_secs(3), || {
        three.metrics().leader.is_some()
    })
    .await;
    assert2::check!(
        shut_out.is_err(),
        "node 3 joined with a foreign certificate"
    );

    // Rotation: a certificate of the cluster's CA replaces the files; the node reloads them
    // (every few seconds) and joins without a restart.
    let (cert, key) = ca.node()?;
    replace(&files3.key_file, &key)?;
    replace(&files3.cert_file, &cert)?;
    wait_until(
        "node 3 to follow the leader after its certificate was rotated",
        Duration::from_secs(30),
        || three.metrics().leader == Some(leader),
    )
    .await?;
    cluster.shutdown().await;
    Ok(())
}

/// Replaces `path` atomically (as a secret volume or `mv` would).
fn replace(path: &PathBuf, content: &str) -> Result<(), BoxError> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
