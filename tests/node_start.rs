//! A node answers its admin API and obeys SIGTERM from the moment its listeners are bound,
//! whatever its control plane and pipeline wait for: here a quorum that never forms (its two
//! peers do not run) and Iggy clusters that do not answer. The node runs as an OS process of
//! the `iggy-replicator` binary, killed by its pid when the test ends, also on failure.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use replicator_config::testing::MinimalConfig;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Generous bound of every wait (a loaded CI machine), never a pass/fail timing goal.
const DEADLINE: Duration = Duration::from_secs(20);

/// A free loopback address: bind port 0 and release it.
fn free_addr() -> TestResult<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A node process, killed (SIGKILL, by pid) when dropped; its log is printed on failure.
struct NodeProcess {
    child: Option<Child>,
    log: PathBuf,
    /// Where its admin API listens.
    api: SocketAddr,
}

impl NodeProcess {
    /// Starts node 1 with its files in `dir`: Raft and the admin API on free addresses, `peers`
    /// as the other initial members (nodes 2, 3, …), and Iggy clusters `us` and `eu` at
    /// `iggy.0` and `iggy.1`.
    fn start(dir: &Path, peers: &[SocketAddr], iggy: (SocketAddr, SocketAddr)) -> TestResult<Self> {
        let urls = (
            format!("iggy://iggy:iggy@{}", iggy.0),
            format!("iggy://iggy:iggy@{}", iggy.1),
        );
        Self::start_with_urls(dir, peers, urls)
    }

    /// [`NodeProcess::start`] with the connection strings of `us` and `eu` (the flow's
    /// target) given whole.
    fn start_with_urls(
        dir: &Path,
        peers: &[SocketAddr],
        (us_url, eu_url): (String, String),
    ) -> TestResult<Self> {
        let (raft, api) = (free_addr()?, free_addr()?);
        let config = MinimalConfig {
            data_dir: dir.join("data").display().to_string(),
            raft_addr: raft.to_string(),
            api_addr: api.to_string(),
            secret: "node-start-test-secret-0123456789".to_owned(),
            initial_members: (1..)
                .zip(std::iter::once(&raft).chain(peers))
                .map(|(id, addr)| (id, addr.to_string()))
                .collect(),
            us_url,
            eu_url,
            ..MinimalConfig::default()
        };
        let path = dir.join("replicator.toml");
        std::fs::write(&path, config.to_string())?;
        Self::spawn(&path, dir.join("node.log"), api)
    }

    fn spawn(config: &Path, log: PathBuf, api: SocketAddr) -> TestResult<Self> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
            .args(["--log-level", "info", "run", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        Ok(Self {
            child: Some(child),
            log,
            api,
        })
    }

    fn pid(&self) -> TestResult<Pid> {
        let child = self.child.as_ref().ok_or("the node is not running")?;
        Ok(Pid::from_raw(i32::try_from(child.id())?))
    }

    /// Sends SIGTERM and waits until the process exited, at most [`DEADLINE`].
    async fn terminate(&mut self) -> TestResult<ExitStatus> {
        kill(self.pid()?, Signal::SIGTERM)?;
        self.wait_exit(DEADLINE).await
    }

    /// Polls until the process exited, at most `within`.
    async fn wait_exit(&mut self, within: Duration) -> TestResult<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            let child = self.child.as_mut().ok_or("the node is not running")?;
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() > until {
                return Err(format!("the node did not exit within {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- node log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// An HTTP client with a per-request timeout.
fn http_client() -> TestResult<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?)
}

/// Polls `GET base + path` until it answers at all (any status), at most [`DEADLINE`].
async fn get_when_listening(
    client: &reqwest::Client,
    url: &str,
) -> TestResult<(reqwest::StatusCode, String)> {
    let until = Instant::now() + DEADLINE;
    loop {
        match client.get(url).send().await {
            Ok(response) => {
                let status = response.status();
                return Ok((status, response.text().await?));
            }
            Err(e) if Instant::now() > until => {
                return Err(format!("{url} never answered: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Polls `GET url` until it answers 200, at most [`DEADLINE`].
async fn get_ok(client: &reqwest::Client, url: &str) -> TestResult<String> {
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, body) = get_when_listening(client, url).await?;
        if status == reqwest::StatusCode::OK {
            return Ok(body);
        }
        if Instant::now() > until {
            return Err(format!("{url} kept answering {status}: {body}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_quorum_or_iggy_serves_admin_api_and_exits_on_sigterm() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Nothing listens on these: the peers never run, the Iggy clusters never answer.
    let (peer2, peer3) = (free_addr()?, free_addr()?);
    let (us, eu) = (free_addr()?, free_addr()?);
    let mut node = NodeProcess::start(dir.path(), &[peer2, peer3], (us, eu))?;
    let client = http_client()?;
    let base = format!("http://{}", node.api);

    // Alive, whatever it waits for.
    let (status, body) = get_when_listening(&client, &format!("{base}/health")).await?;
    assert_eq!(status, reqwest::StatusCode::OK, "/health: {body}");
    // Not ready without a leader, and it says why.
    let (status, body) = get_when_listening(&client, &format!("{base}/ready")).await?;
    assert_eq!(
        status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "/ready: {body}"
    );
    assert!(body.starts_with("not ready"), "/ready: {body}");
    // Status as far as this node knows it: itself, no leader.
    let status: serde_json::Value =
        serde_json::from_str(&get_ok(&client, &format!("{base}/status")).await?)?;
    assert_eq!(status["node"], 1, "{status}");
    assert!(status["leader"].is_null(), "{status}");
    assert!(status["units"].is_array(), "{status}");
    // Metrics answer too: not the leader, no leader known, not ready.
    let metrics = get_ok(&client, &format!("{base}/metrics")).await?;
    assert!(
        metrics.contains("\niggy_replicator_raft_leader 0\n")
            && metrics.contains("\niggy_replicator_ready 0\n")
            && !metrics.contains("\niggy_replicator_raft_leader_info{"),
        "{metrics}"
    );

    let exit = node.terminate().await?;
    assert_eq!(exit.code(), Some(0), "exit after SIGTERM: {exit:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stopped_as_soon_as_its_admin_api_answers_exits_cleanly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (peer2, us) = (free_addr()?, free_addr()?);
    let mut node = NodeProcess::start(dir.path(), &[peer2], (us, us))?;
    let client = http_client()?;
    // The first answer may come while the control plane or the pipeline still starts.
    let url = format!("http://{}/health", node.api);
    let (status, body) = get_when_listening(&client, &url).await?;
    assert_eq!(status, reqwest::StatusCode::OK, "/health: {body}");
    let exit = node.terminate().await?;
    assert_eq!(exit.code(), Some(0), "exit after SIGTERM: {exit:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_credential_without_manage_users_stops_the_start_with_a_hint() -> TestResult {
    use iggy::prelude::{
        Client, GlobalPermissions, IggyClient, Permissions, UserClient, UserStatus,
    };
    use replicator_testkit::{TestServer, TestServerConfig};

    let server = TestServer::start(TestServerConfig::default()).await?;
    let root = IggyClient::from_connection_string(&server.connection_string())?;
    root.connect().await?;
    // Enough to create streams and topics and to send, not to manage the writer users.
    let rights = Permissions {
        global: GlobalPermissions {
            manage_streams: true,
            read_streams: true,
            manage_topics: true,
            read_topics: true,
            poll_messages: true,
            send_messages: true,
            ..GlobalPermissions::default()
        },
        streams: None,
    };
    root.create_user(
        "no-fencing",
        "no-fencing-pw",
        UserStatus::Active,
        Some(rights),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let urls = (
        server.connection_string(),
        format!("iggy://no-fencing:no-fencing-pw@{}", server.addr()),
    );
    let mut node = NodeProcess::start_with_urls(dir.path(), &[], urls)?;
    let exit = node.wait_exit(DEADLINE).await?;
    let log = std::fs::read_to_string(&node.log)?;
    assert_eq!(exit.code(), Some(2), "exit: {exit:?}\n{log}");
    assert!(
        log.contains("manage_users") && log.contains("fencing = \"off\""),
        "the error names the missing permission and the way out:\n{log}"
    );
    root.shutdown().await?;
    server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_speaks_the_other_iggy_generation_stops_the_start_naming_the_key(
) -> TestResult {
    use replicator_testkit::{IggyVersion, TestServer, TestServerConfig};

    // `eu` is an Iggy 0.9 server, but the config leaves `iggy_version` at its default, 0.8: a
    // 0.8 client would wait for an answer forever.
    let us = TestServer::start(TestServerConfig::default()).await?;
    let eu = TestServer::start(TestServerConfig {
        iggy_version: IggyVersion::V0_9,
        ..TestServerConfig::default()
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let urls = (us.connection_string(), eu.connection_string());
    let mut node = NodeProcess::start_with_urls(dir.path(), &[], urls)?;
    let exit = node.wait_exit(DEADLINE).await?;
    let log = std::fs::read_to_string(&node.log)?;
    assert_eq!(exit.code(), Some(2), "exit: {exit:?}\n{log}");
    assert!(
        log.contains("clusters.eu.iggy_version is \"0.8\"")
            && log.contains("iggy_version = \"0.9\"")
            && !log.contains("clusters.us:"),
        "the error names the cluster, its key and the value to set, and only that cluster:\n{log}"
    );
    us.shutdown().await;
    eu.shutdown().await;
    Ok(())
}
