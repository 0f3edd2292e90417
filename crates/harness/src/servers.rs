//! The Iggy servers a run replicates between: two in-process servers ([`Servers`]), or
//! `iggy-replicator dev-server` processes ([`DevServer`]) when the nodes' CPU must be told apart
//! from the servers'.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use replicator_testkit::{IggyVersion, TestServer, TestServerConfig};

use crate::{
    connect, ensure_topic, partition_messages, tick, Deadline, Endpoint, Error, ReplicatorBinary,
    Result, Topic,
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
        let Topic {
            stream,
            name,
            partitions,
        } = &self.topic;
        (0..*partitions)
            .map(|p| partition_messages(server, stream, name, p))
            .collect()
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

/// An `iggy-replicator dev-server` process (in memory, on a loopback port the OS picked),
/// killed by its pid on drop.
pub struct DevServer {
    /// The process.
    child: Child,
    /// Its connection string, as it printed it, and its generation.
    endpoint: Endpoint,
    /// Reads (and discards) the rest of its stdout, so that it never blocks on a full pipe;
    /// ends when the process does.
    drain: Option<std::thread::JoinHandle<()>>,
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
        let child = binary
            .process()
            .args(["--log-level", "warn", "dev-server", "--port", "0"])
            .args(["--iggy-version", version.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        // From here on, drop kills the process, also on the error paths below.
        let mut server = Self {
            child,
            endpoint: Endpoint::new(version, String::new()),
            drain: None,
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
}

impl Drop for DevServer {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
        if let Some(drain) = self.drain.take() {
            let _ = drain.join();
        }
    }
}
