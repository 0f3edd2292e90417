//! The CLI's side of the admin API: where it is and how to reach it ([`ApiArgs`], the
//! [`ApiClient`] it builds), and the authenticated mutating calls ([`MutationArgs`]) of the
//! `cluster`, `flow` and `flow reset` commands. Below every command that talks to a node.

use std::path::PathBuf;
use std::time::Duration;

use crate::exit::Failure;

/// Where the admin API is and how to reach it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ApiArgs {
    /// Admin API of any cluster member, `host:port`, `http://host:port` or `https://host:port`.
    #[arg(long, default_value = "127.0.0.1:7180", env = "REPLICATOR_API")]
    pub(crate) api: String,
    /// PEM CA that signed the admin API's certificate (`[node.api_tls]`); a `host:port`
    /// address is then reached over https.
    #[arg(long, env = "REPLICATOR_CA_FILE")]
    pub(crate) ca_file: Option<PathBuf>,
    /// PEM client certificate, when the admin API requires one (`client_ca_file`).
    #[arg(long, env = "REPLICATOR_CERT_FILE", requires = "key_file")]
    pub(crate) cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    #[arg(long, env = "REPLICATOR_KEY_FILE", requires = "cert_file")]
    pub(crate) key_file: Option<PathBuf>,
}

/// An HTTP client for the admin API of every member, and the scheme a bare `host:port` gets.
pub(crate) struct ApiClient {
    http: reqwest::Client,
    scheme: &'static str,
}

impl ApiArgs {
    /// The client these arguments describe; unreadable files are config errors (exit 2).
    pub(crate) fn client(&self) -> Result<ApiClient, Failure> {
        self.client_with_timeout(Duration::from_secs(60))
    }

    /// Like [`ApiArgs::client`], with calls bounded by `timeout`.
    pub(crate) fn client_with_timeout(&self, timeout: Duration) -> Result<ApiClient, Failure> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| Failure::config(format!("{flag} {}: {e}", path.display())))
        };
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(ca) = &self.ca_file {
            let cert = reqwest::Certificate::from_pem(&read("--ca-file", ca)?)
                .map_err(|e| Failure::config(format!("--ca-file {}: {e}", ca.display())))?;
            builder = builder.tls_certs_only([cert]);
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            let mut pem = read("--cert-file", cert)?;
            pem.extend(read("--key-file", key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| Failure::config(format!("--cert-file/--key-file: {e}")))?;
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(|e| {
            Failure::runtime(format!("cannot build an HTTP client: {e}"), "report a bug")
        })?;
        Ok(ApiClient {
            http,
            scheme: if self.ca_file.is_some() {
                "https"
            } else {
                "http"
            },
        })
    }
}

impl ApiClient {
    /// `path` on the admin API at `api` (a bare `host:port` gets this client's scheme).
    fn url(&self, api: &str, path: &str) -> String {
        format!("{}{path}", base_url(api, self.scheme))
    }

    /// A GET of `path` on the admin API at `api`.
    pub(crate) fn get(&self, api: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.get(self.url(api, path))
    }

    /// A POST of `path` on the admin API at `api`.
    pub(crate) fn post(&self, api: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.post(self.url(api, path))
    }

    /// A DELETE of `path` on the admin API at `api`.
    pub(crate) fn delete(&self, api: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.delete(self.url(api, path))
    }
}

/// Where a mutating call goes, and its bearer token.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MutationArgs {
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// The admin token (`cluster.admin_token`; the cluster secret is not accepted).
    #[arg(long, env = "REPLICATOR_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
}

impl MutationArgs {
    /// Sends the request `build` makes for `action` with the bearer token, and prints the
    /// answer (a refusal or a failure is the error).
    pub(crate) async fn send(
        &self,
        action: &str,
        build: impl FnOnce(&ApiClient, &str) -> reqwest::RequestBuilder,
    ) -> Result<(), Failure> {
        let body = self
            .call_json(Duration::from_secs(60), action, build)
            .await?;
        print!("{body}");
        Ok(())
    }

    /// POSTs `body` as JSON to `path` for `action`, bounded by `timeout`, and decodes the
    /// answer as a `T` (also returned as the raw text, for `--json`).
    pub(crate) async fn post_for<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        timeout: Duration,
        action: &str,
        path: &str,
        body: &B,
    ) -> Result<(T, String), Failure> {
        let answer = self
            .call_json(timeout, action, |client, api| {
                client.post(api, path).json(body)
            })
            .await?;
        let decoded = serde_json::from_str(&answer).map_err(|e| {
            Failure::runtime(
                format!("{action} answered something unexpected: {e}"),
                "is the node the same version as this command?",
            )
        })?;
        Ok((decoded, answer))
    }

    /// Like [`MutationArgs::send`], bounded by `timeout`, returning the answer's body.
    pub(crate) async fn call_json(
        &self,
        timeout: Duration,
        action: &str,
        build: impl FnOnce(&ApiClient, &str) -> reqwest::RequestBuilder,
    ) -> Result<String, Failure> {
        let client = self.api.client_with_timeout(timeout)?;
        let response = build(&client, &self.api.api)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| unreachable(&self.api.api, e))?;
        mutation_result(response, action).await
    }
}

fn base_url(api: &str, scheme: &str) -> String {
    let trimmed = api.trim_end_matches('/');
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_owned()
    } else {
        format!("{scheme}://{trimmed}")
    }
}

/// The failure of a call that did not reach the admin API at `api`.
pub(crate) fn unreachable(api: &str, e: reqwest::Error) -> Failure {
    Failure::runtime(
        format!("cannot reach the admin API at {api}: {e}"),
        "check --api (a member's node.api_addr) and that the node runs",
    )
}

/// The body of a successful mutating call; a refusal or a failure is the error.
async fn mutation_result(response: reqwest::Response, action: &str) -> Result<String, Failure> {
    let code = response.status();
    let body = response.text().await.unwrap_or_default();
    if code.is_success() {
        Ok(body)
    } else if code == reqwest::StatusCode::CONFLICT || code == reqwest::StatusCode::NOT_FOUND {
        Err(Failure::runtime(
            format!("{action} refused: {}", body.trim()),
            "the answer above says why",
        ))
    } else if code == reqwest::StatusCode::UNAUTHORIZED {
        Err(Failure::runtime(
            format!("{action} refused: {}", body.trim()),
            "pass cluster.admin_token with --token or REPLICATOR_TOKEN",
        ))
    } else {
        Err(Failure::runtime(
            format!("{action} failed ({code}): {}", body.trim()),
            "see `iggy-replicator cluster status` and the nodes' logs",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_adds_scheme_and_trims_slash() {
        assert_eq!(base_url("10.0.0.1:7180", "http"), "http://10.0.0.1:7180");
        assert_eq!(base_url("10.0.0.1:7180", "https"), "https://10.0.0.1:7180");
        assert_eq!(base_url("http://h:1/", "https"), "http://h:1");
        assert_eq!(base_url("https://h:1", "http"), "https://h:1");
    }

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// A CA and a certificate it signed for `san`: (CA PEM, cert PEM, key PEM).
    fn signed(
        ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        san: &str,
    ) -> Result<(String, String), rcgen::Error> {
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec![san.to_owned()])?.signed_by(&key, ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn ca() -> Result<rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate()?)
    }

    #[tokio::test]
    async fn the_cli_reaches_an_admin_api_that_requires_client_certificates() -> TestResult {
        use std::sync::Arc;

        use replicator_control::tls::{ServerTls, ServerTlsFiles};
        use tokio_util::sync::CancellationToken;

        use crate::admin::{serve, AdminState, NodeParts};
        use crate::metrics::Metrics;

        let dir = tempfile::tempdir()?;
        let write = |name: &str, text: &str| -> std::io::Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let server_ca = ca()?;
        let client_ca = ca()?;
        let (cert, key) = signed(&server_ca, "127.0.0.1")?;
        let (client_cert, client_key) = signed(&client_ca, "operator")?;
        let files = ServerTlsFiles {
            cert_file: write("api.crt", &cert)?,
            key_file: write("api.key", &key)?,
            client_ca_file: Some(write("clients.crt", &client_ca.pem())?),
        };
        let config = replicator_config::parse_str(
            "[node]\nid = 1\ndata_dir = \"/tmp/unused\"\nraft_addr = \"127.0.0.1:1\"\napi_addr = \"127.0.0.1:2\"\n[cluster]\nsecret = \"0123456789abcdef\"\n",
            "test",
            |_| None,
        )?;
        let state = AdminState::new(
            Arc::new(NodeParts::new(Arc::from(Vec::new()))),
            Arc::new(Metrics::new()),
            &config,
            None,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let api = listener.local_addr()?.to_string();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            state,
            stop.clone(),
            Some(ServerTls::open(files)?),
        ));

        let args =
            |cert_file: Option<PathBuf>, key_file: Option<PathBuf>| -> std::io::Result<ApiArgs> {
                Ok(ApiArgs {
                    api: api.clone(),
                    ca_file: Some(write("server-ca.crt", &server_ca.pem())?),
                    cert_file,
                    key_file,
                })
            };
        let operator = args(
            Some(write("operator.crt", &client_cert)?),
            Some(write("operator.key", &client_key)?),
        )?
        .client()
        .map_err(|f| format!("{f:?}"))?;
        let health = operator.get(&api, "/health").send().await?;
        assert_eq!(health.status(), reqwest::StatusCode::OK);
        // Without a client certificate the handshake fails; plain HTTP gets no answer.
        let anonymous = args(None, None)?.client().map_err(|f| format!("{f:?}"))?;
        assert!(anonymous.get(&api, "/health").send().await.is_err());
        let plain = reqwest::Client::new()
            .get(format!("http://{api}/health"))
            .send()
            .await;
        assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));

        stop.cancel();
        server.await?;
        Ok(())
    }
}
