//! The Iggy servers a run replicates between: two in-process servers ([`Servers`]), or
//! `iggy-replicator dev-server` processes ([`DevServer`]) when the nodes' CPU must be told apart
//! from the servers'.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use replicator_sdk::IggyCluster as _;
use replicator_testkit::{IggyVersion, TestServer, TestServerConfig};

use crate::{
    connect, ensure_topic, tick, Deadline, Endpoint, Error, ReplicatorBinary, Result, Topic,
};

/// Upstream and downstream in-process Iggy servers, with the replicated topic created upstream.
pub struct Servers {
    /// The source cluster.
    pub upstream: TestServer,
    /// The target cluster.
    pub downstream: TestServer,
    /// The topic created upstream, whose partitions the counts are about.
    pub topic: Topic,
}

impl Servers {
    /// Starts both servers on loopback port 0 and creates `topic` upstream.
    pub async fn start(topic: Topic) -> Result<Self> {
        Self::start_with(
            topic,
            TestServerConfig::default(),
            TestServerConfig::default(),
        )
        .await
    }

    /// Like [`Servers::start`] with explicit server configs (e.g. another bind address).
    pub async fn start_with(
        topic: Topic,
        upstream: TestServerConfig,
        downstream: TestServerConfig,
    ) -> Result<Self> {
        let upstream = TestServer::start(upstream).await?;
        let downstream = TestServer::start(downstream).await?;
        let client = connect(&upstream.connection_string()).await?;
        ensure_topic(&client, &topic.stream, &topic.name, topic.partitions).await?;
        let _ = client.shutdown().await;
        Ok(Self {
            upstream,
            downstream,
            topic,
        })
    }

    /// Messages per partition of the topic upstream.
    #[must_use]
    pub fn upstream_counts(&self) -> Vec<u64> {
        self.counts(&self.upstream)
    }

    /// Messages per partition of the topic downstream (0 while it does not exist yet).
    #[must_use]
    pub fn downstream_counts(&self) -> Vec<u64> {
        self.counts(&self.downstream)
    }

    fn counts(&self, server: &TestServer) -> Vec<u64> {
        self.topic.counts_on(server)
    }

    /// Waits until every downstream partition has messages (the copy runs everywhere).
    pub async fn wait_copy_started(&self, within: Duration) -> Result<()> {
        let deadline = Deadline::new(within, "every partition to be copied");
        while self.downstream_counts().contains(&0) {
            deadline.check()?;
            tick().await;
        }
        Ok(())
    }

    /// Waits until every partition downstream has as many messages as upstream; returns how
    /// long that took.
    pub async fn wait_caught_up(&self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        let deadline = Deadline::new(within, "the downstream to catch up");
        loop {
            let (up, down) = (self.upstream_counts(), self.downstream_counts());
            if up == down {
                return Ok(started.elapsed());
            }
            deadline.check_seeing(|| format!("upstream {up:?}, downstream {down:?}"))?;
            tick().await;
        }
    }

    /// Shuts both servers down.
    pub async fn shutdown(self) {
        self.upstream.shutdown().await;
        self.downstream.shutdown().await;
    }
}

/// An `iggy-replicator dev-server` process (in memory, or in a data directory it keeps across a
/// restart), on a loopback port the OS picked, killed by its pid on drop.
pub struct DevServer {
    /// The process.
    child: Child,
    /// Its connection string, as it printed it, and its generation.
    endpoint: Endpoint,
    /// Reads (and discards) the rest of its stdout, so that it never blocks on a full pipe;
    /// ends when the process does.
    drain: Option<std::thread::JoinHandle<()>>,
    /// How to start it again.
    binary: ReplicatorBinary,
    /// Its data directory (`None`: in memory).
    data_dir: Option<PathBuf>,
    /// The process was killed and reaped: its pid may belong to another process now.
    reaped: bool,
}

impl DevServer {
    /// How long a dev server may take to print its address.
    const START_WITHIN: Duration = Duration::from_secs(30);

    /// Starts `iggy-replicator dev-server --port 0` and waits until it accepts a login.
    pub async fn start(binary: &ReplicatorBinary) -> Result<Self> {
        Self::start_in(binary, IggyVersion::V0_8).await
    }

    /// [`DevServer::start`] for a server speaking `version`.
    pub async fn start_in(binary: &ReplicatorBinary, version: IggyVersion) -> Result<Self> {
        Self::spawn(binary, version, 0, None).await
    }

    /// [`DevServer::start_in`] with its data in `data_dir`, so that it can be killed and
    /// started again over it ([`DevServer::kill_and_restart`]).
    pub async fn start_persistent(
        binary: &ReplicatorBinary,
        version: IggyVersion,
        data_dir: &Path,
    ) -> Result<Self> {
        Self::spawn(binary, version, 0, Some(data_dir.to_owned())).await
    }

    /// Kills the process (SIGKILL: nothing is shut down cleanly) and starts it again on the
    /// same port over the same data directory; waits until it accepts a login. Connected
    /// clients see their connections drop.
    pub async fn kill_and_restart(&mut self) -> Result<()> {
        if self.data_dir.is_none() {
            return Err(Error::Setup(
                "an in-memory dev server would come back empty: start it with a data directory"
                    .to_owned(),
            ));
        }
        let port = self
            .endpoint
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| Error::Setup(format!("no port in {}", self.endpoint.url)))?;
        self.kill();
        let again = Self::spawn(
            &self.binary,
            self.endpoint.iggy_version,
            port,
            self.data_dir.clone(),
        )
        .await?;
        // The old process is reaped: dropping the old value kills nothing.
        *self = again;
        Ok(())
    }

    async fn spawn(
        binary: &ReplicatorBinary,
        version: IggyVersion,
        port: u16,
        data_dir: Option<PathBuf>,
    ) -> Result<Self> {
        let mut command = binary.process();
        command
            .args(["--log-level", "warn", "dev-server", "--port"])
            .arg(port.to_string())
            .args(["--iggy-version", version.as_str()]);
        if let Some(dir) = &data_dir {
            command.arg("--data-dir").arg(dir);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        // From here on, drop kills the process, also on the error paths below.
        let mut server = Self {
            child,
            endpoint: Endpoint::new(version, String::new()),
            drain: None,
            binary: binary.clone(),
            data_dir,
            reaped: false,
        };
        let stdout = server
            .child
            .stdout
            .take()
            .ok_or_else(|| Error::Setup("the dev server has no stdout".to_owned()))?;
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).ok().is_some_and(|n| n > 0) {
                if let Some(url) = line.trim().strip_prefix("connection string: ") {
                    return Some((url.to_owned(), reader));
                }
                line.clear();
            }
            None
        });
        let (url, mut reader) = tokio::time::timeout(Self::START_WITHIN, read)
            .await
            .map_err(|_| Error::timed_out("the dev server's address", "nothing printed"))??
            .ok_or_else(|| Error::Setup("the dev server exited before it listened".to_owned()))?;
        server.drain = Some(std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        }));
        server.endpoint.url = url;
        connect(&server.endpoint).await?.shutdown().await?;
        Ok(server)
    }

    /// Its connection string (`iggy://iggy:iggy@127.0.0.1:PORT`).
    #[must_use]
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// Its connection string and generation, for the harness's tools.
    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Its process id (the benchmarks read its CPU from `/proc`).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process (SIGSTOP): its connections stay open and nothing answers, as when a
    /// server's host freezes. [`DevServer::thaw`] lets it go on; dropping it kills it anyway.
    pub fn freeze(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Continues a [`DevServer::freeze`]d process (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        if self.reaped {
            return Err(Error::Setup(format!(
                "the dev server (pid {}) is gone: no {signal}",
                self.child.id()
            )));
        }
        let pid = i32::try_from(self.child.id())
            .map_err(|_| Error::Setup(format!("pid {} out of range", self.child.id())))?;
        Ok(kill(Pid::from_raw(pid), signal)?)
    }

    /// Kills the process by its pid and reaps it, once.
    fn kill(&mut self) {
        if std::mem::replace(&mut self.reaped, true) {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
        if let Some(drain) = self.drain.take() {
            let _ = drain.join();
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.kill();
    }
}
