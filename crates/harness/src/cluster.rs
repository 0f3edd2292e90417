//! A cluster of `iggy-replicator run` node processes: their configs and data dirs in one temp
//! dir, real faults by signal, and what an operator reads (`/status`, `/metrics`, the
//! `cluster` and `verify` commands). Every process is killed by its pid when the
//! [`ReplicatorCluster`] is dropped, also when a test fails; the node logs of a failed test are
//! printed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use replicator_control::ControlTiming;

use crate::{
    tick, Deadline, Error, NodeConfig, NodeId, NodeTls, ReplicatorBinary, Result, Status, TestCa,
};

/// What the nodes of a [`ReplicatorCluster`] replicate and how they run.
#[derive(Debug, Clone)]
pub struct ReplicatorClusterSpec {
    /// The executable of the node processes and commands.
    pub binary: ReplicatorBinary,
    /// `[clusters.*]`, `[[flows]]` and `[pipeline]` TOML, appended to every node's config
    /// after its `[node]` and `[cluster]` sections.
    pub replication_toml: String,
    /// More `[cluster]` keys, e.g. `forget_retired_after = "1s"` (empty: the defaults).
    pub cluster_toml: String,
    /// Live units the nodes must own between them before a start returns, e.g. 16.
    pub units: usize,
    /// `--log-level` of the node processes, e.g. `"info"`.
    pub log_level: &'static str,
    /// How long a start may take until every unit is owned.
    pub owned_within: Duration,
    /// Mutual TLS between the nodes and HTTPS on their admin APIs, with certificates made
    /// for the test (the harness's own admin calls and commands then use the test CA).
    pub tls: bool,
}

/// Where a node listens and how its process is launched.
#[derive(Debug, Clone)]
pub struct Placement {
    /// `node.raft_addr`.
    pub raft_addr: SocketAddr,
    /// `node.api_addr` (what the node binds).
    pub api_bind: SocketAddr,
    /// Where the harness reaches the admin API (`node.advertised_api_addr` when it differs).
    pub api_addr: SocketAddr,
    /// Command prefix, e.g. `ip netns exec NS`; empty for a plain process.
    pub wrapper: Vec<String>,
}

impl Placement {
    /// A node on loopback with free ports.
    pub fn loopback() -> Result<Self> {
        let api = free_addr()?;
        Ok(Self {
            raft_addr: free_addr()?,
            api_bind: api,
            api_addr: api,
            wrapper: Vec::new(),
        })
    }
}

/// A free loopback address for a node process to bind later. Tried first at random below
/// Linux's ephemeral range (32768 and up by default): a port the OS handed out for port 0 is
/// in that range, where any outgoing connection of the machine may take it before the node
/// binds it (seen as "Address already in use" on a busy machine). Port 0 is the fallback.
///
/// A port is handed out once per process: the tests of one binary run in parallel, and two of
/// them that drew the same free port before either node bound it collided (seen in the `ha`
/// suite as a node that could not bind its admin API).
pub fn free_addr() -> Result<SocketAddr> {
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    for _ in 0..50 {
        let port = rand::random::<u16>() % 12_000 + 20_000;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            handed_out.insert(port);
            return Ok(listener.local_addr()?);
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// One replicator node process.
#[derive(Debug)]
pub struct Node {
    /// Node id.
    pub id: NodeId,
    /// Raft address.
    pub raft_addr: SocketAddr,
    /// Admin API address.
    pub api_addr: SocketAddr,
    /// Its config file.
    pub config: PathBuf,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    /// The running process, if any.
    child: Option<Child>,
    /// Stopped by SIGSTOP and not continued yet.
    paused: bool,
    /// Command prefix of its process.
    wrapper: Vec<String>,
    /// Cut off from its peers by the test: not asked for the leader's view.
    unreachable: bool,
}

impl Node {
    /// Whether the process runs (paused or not).
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn pid(&self) -> Result<Pid> {
        let child = self.child.as_ref().ok_or(Error::NotRunning(self.id))?;
        let pid = i32::try_from(child.id())
            .map_err(|_| Error::Setup(format!("node {}: pid out of range", self.id)))?;
        Ok(Pid::from_raw(pid))
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        kill(self.pid()?, signal)?;
        Ok(())
    }

    /// Starts its process with its config (and data dir, kept across restarts).
    fn spawn(&mut self, binary: &ReplicatorBinary, log_level: &str) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = std::process::Command::new(program);
                c.args(args).arg(binary.path()).env_remove("RUST_LOG");
                c
            }
            None => binary.process(),
        };
        let child = command
            .args(["--log-level", log_level, "run", "--config"])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }
}

/// What `iggy-replicator verify` reported.
#[derive(Debug, Clone)]
pub struct VerifyRun {
    /// Exit 0: an exact copy (exit 3 is a mismatch; anything else is an error).
    pub exact: bool,
    /// Its table.
    pub stdout: String,
    /// Its warnings.
    pub stderr: String,
}

/// What a one-shot command printed, and its exit code.
#[derive(Debug, Clone)]
pub struct CommandRun {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// A cluster of replicator node processes sharing a secret, with their configs, data dirs and
/// logs in one temp dir.
pub struct ReplicatorCluster {
    /// Temp dir with every node's config, data dir and log.
    dir: tempfile::TempDir,
    /// Cluster secret (signs Raft RPCs).
    secret: String,
    /// Bearer token of mutating admin calls (`cluster add/remove`).
    admin_token: String,
    /// What the nodes replicate.
    spec: ReplicatorClusterSpec,
    /// Raft addresses of the bootstrap members, as their peers dial them.
    initial: BTreeMap<NodeId, SocketAddr>,
    /// The nodes by id.
    nodes: BTreeMap<NodeId, Node>,
    /// Admin API client (trusting the test CA when the cluster runs TLS).
    http: reqwest::Client,
    /// The test CA, when the cluster runs TLS.
    ca: Option<TestCa>,
    /// Nodes whose config a test rewrote ([`ReplicatorCluster::rewrite_replication`]): their
    /// current replication TOML.
    rewritten: BTreeMap<NodeId, String>,
    /// Set by [`ReplicatorCluster::passed`]; otherwise drop prints the logs.
    passed: bool,
}

impl ReplicatorCluster {
    /// Starts `n` loopback nodes (ids 1..=n) bootstrapping one cluster that replicates `spec`,
    /// and waits until every unit is owned.
    pub async fn start(spec: ReplicatorClusterSpec, n: u64) -> Result<Self> {
        let placements = (1..=n)
            .map(|id| Ok((id, Placement::loopback()?)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        Self::launch(spec, placements).await
    }

    /// Starts the nodes of `placements` bootstrapping one cluster that replicates `spec`, and
    /// waits until every unit is owned.
    pub async fn launch(
        spec: ReplicatorClusterSpec,
        placements: BTreeMap<NodeId, Placement>,
    ) -> Result<Self> {
        Self::launch_dialing(spec, placements, &BTreeMap::new()).await
    }

    /// Like [`ReplicatorCluster::launch`], but the peers dial node `id`'s Raft at `dial[id]`
    /// (e.g. a delay proxy in front of its listener) instead of at its placement's `raft_addr`,
    /// which the node still binds: `dial` replaces the bootstrap members' addresses in every node's
    /// `cluster.initial_members`, so every Raft RPC to that node goes through `dial[id]`.
    /// Nodes not in `dial` are dialed where they bind; so is a node added later with
    /// [`ReplicatorCluster::add_member`].
    pub async fn launch_dialing(
        spec: ReplicatorClusterSpec,
        placements: BTreeMap<NodeId, Placement>,
        dial: &BTreeMap<NodeId, SocketAddr>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("iggy-replicator-ha-")
            .tempdir()?;
        let secret = format!("ha-test-secret-{:016x}", rand::random::<u64>());
        let admin_token = format!("ha-admin-token-{:016x}", rand::random::<u64>());
        let ca = if spec.tls {
            Some(TestCa::new(dir.path())?)
        } else {
            None
        };
        let mut http = reqwest::Client::builder().timeout(Duration::from_secs(2));
        if let Some(ca) = &ca {
            http = http.tls_certs_only([reqwest::Certificate::from_pem(ca.ca_pem().as_bytes())?]);
        }
        let mut cluster = Self {
            dir,
            secret,
            admin_token,
            spec,
            initial: placements
                .iter()
                .map(|(id, p)| (*id, dial.get(id).copied().unwrap_or(p.raft_addr)))
                .collect(),
            nodes: BTreeMap::new(),
            http: http.build()?,
            ca,
            rewritten: BTreeMap::new(),
            passed: false,
        };
        let all: Vec<NodeId> = placements.keys().copied().collect();
        for (id, placement) in placements {
            cluster.add_node_process(id, placement)?;
        }
        cluster
            .wait_all_owned(&all, cluster.spec.owned_within)
            .await?;
        Ok(cluster)
    }

    /// Live units the nodes must own between them from now on
    /// ([`ReplicatorClusterSpec::units`]), after a config change that adds or removes flows or
    /// partitions.
    pub fn set_units(&mut self, units: usize) {
        self.spec.units = units;
    }

    /// The control-plane timing the nodes run with: the control plane's defaults, since their
    /// config sets no timing key (the spec's TOML cannot reach `[cluster]`).
    #[must_use]
    pub fn timing(&self) -> ControlTiming {
        ControlTiming::default()
    }

    /// Writes the config of a new node `id` (bootstrap members: the cluster's initial ones)
    /// and starts its process.
    pub fn add_node_process(&mut self, id: NodeId, placement: Placement) -> Result<&Node> {
        let node_dir = self.dir.path().join(format!("node-{id}"));
        std::fs::create_dir_all(&node_dir)?;
        let config = node_dir.join("replicator.toml");
        let tls = match &self.ca {
            Some(ca) => {
                let ips = [
                    placement.raft_addr.ip(),
                    placement.api_addr.ip(),
                    placement.api_bind.ip(),
                ];
                Some(ca.node(&format!("node-{id}"), &ips)?)
            }
            None => None,
        };
        std::fs::write(
            &config,
            self.config_text(id, &placement, &node_dir, tls.as_ref()),
        )?;
        let mut node = Node {
            id,
            raft_addr: placement.raft_addr,
            api_addr: placement.api_addr,
            config,
            log: node_dir.join("node.log"),
            child: None,
            paused: false,
            wrapper: placement.wrapper,
            unreachable: false,
        };
        node.spawn(&self.spec.binary, self.spec.log_level)?;
        self.nodes.insert(id, node);
        self.node(id)
    }

    fn config_text(
        &self,
        id: NodeId,
        placement: &Placement,
        node_dir: &Path,
        tls: Option<&NodeTls>,
    ) -> String {
        NodeConfig {
            id,
            data_dir: &node_dir.join("data"),
            raft_addr: placement.raft_addr,
            api_bind: placement.api_bind,
            advertised_api_addr: (placement.api_addr != placement.api_bind)
                .then_some(placement.api_addr),
            secret: &self.secret,
            admin_token: Some(&self.admin_token),
            tls,
            initial_members: &self.initial,
            cluster_extra: &self.spec.cluster_toml,
        }
        .toml(&self.spec.replication_toml)
    }

    /// `https` when the cluster runs TLS, else `http`.
    fn scheme(&self) -> &'static str {
        if self.ca.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `--ca-file <test CA>` for the binary's admin API commands, when the cluster runs TLS.
    #[must_use]
    pub fn ca_args(&self) -> Vec<std::ffi::OsString> {
        self.ca
            .iter()
            .flat_map(|ca| ["--ca-file".into(), ca.ca_file().as_os_str().to_owned()])
            .collect()
    }

    /// A node by id.
    pub fn node(&self, id: NodeId) -> Result<&Node> {
        self.nodes.get(&id).ok_or(Error::NoNode(id))
    }

    fn node_mut(&mut self, id: NodeId) -> Result<&mut Node> {
        self.nodes.get_mut(&id).ok_or(Error::NoNode(id))
    }

    /// Ids of the nodes whose process runs, is not paused and is not cut off.
    #[must_use]
    pub fn running(&self) -> Vec<NodeId> {
        self.nodes
            .values()
            .filter(|n| n.is_running() && !n.paused && !n.unreachable)
            .map(|n| n.id)
            .collect()
    }

    /// Pids of the node processes, by node id (the benchmarks read their CPU and RSS).
    #[must_use]
    pub fn pids(&self) -> BTreeMap<NodeId, u32> {
        self.nodes
            .values()
            .filter_map(|n| n.child.as_ref().map(|c| (n.id, c.id())))
            .collect()
    }

    /// Config file of the first node (for `verify`).
    pub fn any_config(&self) -> Result<PathBuf> {
        self.nodes
            .values()
            .next()
            .map(|n| n.config.clone())
            .ok_or_else(|| Error::Setup("the cluster has no node".to_owned()))
    }

    /// `kill -9` of a node; waits for the process to be gone.
    pub fn kill(&mut self, id: NodeId) -> Result<()> {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGKILL)?;
        if let Some(mut child) = node.child.take() {
            child.wait()?;
        }
        node.paused = false;
        Ok(())
    }

    /// Marks a node as cut off from its peers (its view of the cluster is stale meanwhile).
    pub fn set_unreachable(&mut self, id: NodeId, unreachable: bool) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.unreachable = unreachable;
        }
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: NodeId) -> Result<()> {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGSTOP)?;
        node.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: NodeId) -> Result<()> {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGCONT)?;
        node.paused = false;
        Ok(())
    }

    /// SIGHUP: the node reloads its config file (see [`ReplicatorCluster::rewrite_replication`]).
    pub fn hangup(&self, id: NodeId) -> Result<()> {
        self.node(id)?.signal(Signal::SIGHUP)
    }

    /// SIGTERM to every node of `ids` at once, then waits for them to exit (graceful drain);
    /// returns their exit codes. A node that does not exit within `within` is killed and
    /// reported as an error.
    pub async fn terminate(
        &mut self,
        ids: &[NodeId],
        within: Duration,
    ) -> Result<Vec<(NodeId, Option<i32>)>> {
        for id in ids {
            self.node(*id)?.signal(Signal::SIGTERM)?;
        }
        let deadline = Deadline::new(within, format!("nodes {ids:?} to exit after SIGTERM"));
        let mut codes = Vec::new();
        for id in ids {
            loop {
                let node = self.node_mut(*id)?;
                let Some(child) = node.child.as_mut() else {
                    break;
                };
                if let Some(status) = child.try_wait()? {
                    node.child = None;
                    codes.push((*id, status.code()));
                    break;
                }
                if let Err(e) = deadline.check() {
                    self.kill(*id)?;
                    return Err(e);
                }
                tick().await;
            }
        }
        Ok(codes)
    }

    /// Starts a stopped node's process again with the same config and data dir.
    pub fn restart(&mut self, id: NodeId) -> Result<()> {
        let binary = self.spec.binary.clone();
        self.restart_with(id, &binary)
    }

    /// [`ReplicatorCluster::restart`] with another executable: one step of a rolling upgrade.
    /// From now on it is also the executable of later restarts and of the commands run against
    /// the cluster (`verify`, `flow`, `cluster`).
    pub fn restart_with(&mut self, id: NodeId, binary: &ReplicatorBinary) -> Result<()> {
        self.spec.binary = binary.clone();
        let log_level = self.spec.log_level;
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            return Err(Error::StillRunning(id));
        }
        node.spawn(binary, log_level)
    }

    /// Rewrites node `id`'s config file with `replication_toml` in place of the replication
    /// part (clusters, flows) it has now, keeping its `[node]` and `[cluster]`: one step of a
    /// rolling config change, applied by [`ReplicatorCluster::reload`] (or a restart).
    pub fn rewrite_replication(&mut self, id: NodeId, replication_toml: &str) -> Result<()> {
        let current = self
            .rewritten
            .get(&id)
            .unwrap_or(&self.spec.replication_toml)
            .clone();
        let path = self.node(id)?.config.clone();
        let text = std::fs::read_to_string(&path)?;
        if !text.contains(&current) {
            return Err(Error::Setup(format!(
                "node {id}'s config no longer holds the replication part it was written with"
            )));
        }
        std::fs::write(&path, text.replacen(&current, replication_toml, 1))?;
        self.rewritten.insert(id, replication_toml.to_owned());
        Ok(())
    }

    /// `POST /config/reload` on node `id` (with the admin token): the answer's status code and
    /// body. Waits up to a minute (a reload drains the flows that changed).
    pub async fn reload(&self, id: NodeId) -> Result<(u16, String)> {
        let node = self.node(id)?;
        let response = self
            .http
            .post(format!(
                "{}://{}/config/reload",
                self.scheme(),
                node.api_addr
            ))
            .bearer_auth(&self.admin_token)
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let code = response.status().as_u16();
        Ok((code, response.text().await?))
    }

    /// `GET /ready` of one node: its status code and body, whatever they are.
    pub async fn ready_answer(&self, id: NodeId) -> Result<(u16, String)> {
        let node = self.node(id)?;
        let response = self
            .http
            .get(format!("{}://{}/ready", self.scheme(), node.api_addr))
            .send()
            .await?;
        let code = response.status().as_u16();
        Ok((code, response.text().await?))
    }

    /// `GET /status` of one node.
    pub async fn status_of(&self, id: NodeId) -> Result<Status> {
        let response = self.get(id, "/status").await?;
        Ok(response.json().await?)
    }

    /// Prometheus text of a node's `/metrics`.
    pub async fn metrics_of(&self, id: NodeId) -> Result<String> {
        Ok(self.get(id, "/metrics").await?.text().await?)
    }

    /// The value of the sample `name` (e.g. `iggy_replicator_writer_fences_total`, without
    /// labels) in a node's `/metrics`; `None` while the node does not report it.
    pub async fn metric_of(&self, id: NodeId, name: &str) -> Result<Option<f64>> {
        Ok(sample(&self.metrics_of(id).await?, name))
    }

    /// The sum of every sample of `name` (e.g. `iggy_replicator_downstream_losses_total`),
    /// whatever its labels, in a node's `/metrics`: 0 while the node reports none.
    pub async fn metric_sum_of(&self, id: NodeId, name: &str) -> Result<f64> {
        Ok(sample_sum(&self.metrics_of(id).await?, name))
    }

    async fn get(&self, id: NodeId, path: &'static str) -> Result<reqwest::Response> {
        let node = self.node(id)?;
        let response = self
            .http
            .get(format!("{}://{}{path}", self.scheme(), node.api_addr))
            .send()
            .await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(Error::AdminStatus {
                node: id,
                path,
                status: response.status(),
            })
        }
    }

    /// The status as the current leader reports it (the only one that knows lease liveness);
    /// `None` while unknown. The leader is the one named by the running nodes at the highest
    /// term: a restarted former leader briefly believes it still leads, at its old term.
    pub async fn leader_status(&self) -> Option<Status> {
        let mut views = Vec::new();
        for id in self.running() {
            if let Ok(status) = self.status_of(id).await {
                views.push((id, status));
            }
        }
        let term = views.iter().map(|(_, s)| s.term).max()?;
        let leader = views
            .iter()
            .find(|(_, s)| s.term == term && s.leader.is_some())
            .and_then(|(_, s)| s.leader)?;
        let (_, status) = views.iter().find(|(id, _)| *id == leader)?;
        (status.leader == Some(leader) && status.term == term).then(|| status.clone())
    }

    /// Waits until the leader reports every unit owned by one of `nodes` and each of `nodes`
    /// owning at least one; returns that status.
    pub async fn wait_all_owned(&self, nodes: &[NodeId], within: Duration) -> Result<Status> {
        self.wait_leader_status(
            format!("every unit owned by {nodes:?}, each owning some"),
            within,
            |status| {
                status.all_units_owned_by_any_of(nodes, self.spec.units)
                    && nodes.iter().all(|n| status.units_owned(*n) > 0)
            },
        )
        .await
    }

    /// Waits until the leader reports every unit owned by one of `nodes`, their shares
    /// differing by at most one, and no release pending; returns that status.
    pub async fn wait_balanced(&self, nodes: &[NodeId], within: Duration) -> Result<Status> {
        self.wait_leader_status(
            format!("a balanced assignment over {nodes:?}"),
            within,
            |status| {
                status.all_units_owned_by_any_of(nodes, self.spec.units)
                    && status.balanced_over(nodes)
            },
        )
        .await
    }

    /// Polls the leader's status until `done` holds; the error names the last status seen.
    /// Waits until the leader's status satisfies `done` (a status read while an election runs
    /// has no leader and waits too); returns that status.
    pub async fn wait_leader_status(
        &self,
        what: String,
        within: Duration,
        done: impl Fn(&Status) -> bool,
    ) -> Result<Status> {
        let deadline = Deadline::new(within, what);
        // Every poll asks every node for a status that lists every unit: with 100,000 units
        // polling at the usual pace took a good part of the nodes' CPU.
        let pause = Duration::from_micros(10 * self.spec.units as u64);
        loop {
            let last = self.leader_status().await;
            if let Some(status) = last.as_ref().filter(|s| done(s)) {
                return Ok(status.clone());
            }
            deadline.check_seeing(|| format!("last leader status: {last:?}"))?;
            tick().await;
            tokio::time::sleep(pause).await;
        }
    }

    /// `iggy-replicator cluster add` for node `id` against the leader's admin API (token from
    /// `REPLICATOR_TOKEN`).
    pub async fn add_member(&self, id: NodeId) -> Result<()> {
        let node = self.node(id)?;
        let args = [
            "add".to_owned(),
            "--id".to_owned(),
            id.to_string(),
            "--raft-addr".to_owned(),
            node.raft_addr.to_string(),
            "--api-addr".to_owned(),
            node.api_addr.to_string(),
        ];
        self.cluster_command(&args).await
    }

    /// `iggy-replicator cluster remove --id N` against the leader (drain, then removal).
    pub async fn remove_member(&self, id: NodeId) -> Result<()> {
        let args = ["remove".to_owned(), "--id".to_owned(), id.to_string()];
        self.cluster_command(&args).await
    }

    /// `iggy-replicator cluster status` of a node, as an operator sees it.
    pub async fn cluster_status_text(&self, id: NodeId) -> Result<String> {
        let node = self.node(id)?;
        let output = self
            .spec
            .binary
            .one_shot()
            .args(["cluster", "status", "--api"])
            .arg(node.api_addr.to_string())
            .args(self.ca_args())
            .output()
            .await?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Runs `iggy-replicator cluster <args> --api <leader>` until it succeeds (the leader may
    /// change meanwhile).
    async fn cluster_command(&self, args: &[String]) -> Result<()> {
        let mut command = vec!["cluster".to_owned()];
        command.extend_from_slice(args);
        self.admin_command_until_done(&command).await.map(|_| ())
    }

    /// Runs `iggy-replicator flow <args>` (with the admin token) against the leader until it
    /// exits 0 (the leader may change meanwhile), and returns its output, e.g.
    /// `flow(&["pause", "up-to-down"])`.
    pub async fn flow(&self, args: &[&str]) -> Result<CommandRun> {
        let mut command = vec!["flow".to_owned()];
        command.extend(args.iter().map(|a| (*a).to_owned()));
        self.admin_command_until_done(&command).await
    }

    /// Runs `iggy-replicator flow <args>` once against the leader's admin API and returns what
    /// it did, whatever its exit code (for `flow promote`, whose exit 3 is an answer).
    pub async fn flow_once(&self, args: &[&str]) -> Result<CommandRun> {
        let deadline = Deadline::new(
            Duration::from_secs(60),
            format!("a leader for flow {args:?}"),
        );
        loop {
            if let Some(leader) = self
                .leader_status()
                .await
                .and_then(|s| s.leader)
                .and_then(|l| self.nodes.get(&l))
            {
                let mut command = vec!["flow".to_owned()];
                command.extend(args.iter().map(|a| (*a).to_owned()));
                return self.admin_command(&command, leader).await;
            }
            deadline.check_seeing(|| "no leader".to_owned())?;
            tick().await;
        }
    }

    /// Runs `iggy-replicator <command> --api <node> --token …` once.
    async fn admin_command(&self, command: &[String], node: &Node) -> Result<CommandRun> {
        let output = self
            .spec
            .binary
            .one_shot()
            .args(command)
            .arg("--api")
            .arg(node.api_addr.to_string())
            .args(self.ca_args())
            .env("REPLICATOR_TOKEN", &self.admin_token)
            .output()
            .await?;
        Ok(CommandRun {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// [`ReplicatorCluster::admin_command`] against the leader until it exits 0.
    async fn admin_command_until_done(&self, command: &[String]) -> Result<CommandRun> {
        let deadline = Deadline::new(Duration::from_secs(60), format!("{command:?}"));
        loop {
            let mut last = String::from("no leader");
            if let Some(status) = self.leader_status().await {
                if let Some(leader) = status.leader.and_then(|l| self.nodes.get(&l)) {
                    let run = self.admin_command(command, leader).await?;
                    if run.code == Some(0) {
                        print!("{}", run.stdout);
                        return Ok(run);
                    }
                    last = format!("exit {:?}: {}", run.code, run.stderr.trim());
                }
            }
            deadline.check_seeing(|| last)?;
            tick().await;
        }
    }

    /// Runs `iggy-replicator verify --config <node config> --wait <wait>` and returns what it
    /// reported.
    pub async fn run_verify(&self, wait: Duration) -> Result<VerifyRun> {
        self.run_verify_flow(None, wait).await
    }

    /// [`ReplicatorCluster::run_verify`] of one flow (`--flow`), or of every flow for `None`:
    /// the others are not read (their clusters may be down).
    pub async fn run_verify_flow(&self, flow: Option<&str>, wait: Duration) -> Result<VerifyRun> {
        let mut command = self.spec.binary.one_shot();
        command
            .args(["--log-level", "warn", "verify", "--wait"])
            .arg(format!("{}s", wait.as_secs()))
            .arg("--config")
            .arg(self.any_config()?);
        if let Some(flow) = flow {
            command.args(["--flow", flow]);
        }
        let output = command.output().await?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        match output.status.code() {
            Some(code @ (0 | 3)) => Ok(VerifyRun {
                exact: code == 0,
                stdout,
                stderr,
            }),
            other => Err(Error::Command {
                command: "verify".to_owned(),
                detail: format!("exit {other:?}: {}\n{stdout}", stderr.trim()),
            }),
        }
    }

    /// Runs `verify` like [`ReplicatorCluster::run_verify`], prints its table and returns
    /// whether it reported an exact copy.
    pub async fn verify(&self, wait: Duration) -> Result<bool> {
        self.verify_flow(None, wait).await
    }

    /// [`ReplicatorCluster::verify`] of one flow, or of every flow for `None`.
    pub async fn verify_flow(&self, flow: Option<&str>, wait: Duration) -> Result<bool> {
        let run = self.run_verify_flow(flow, wait).await?;
        println!("{}", run.stdout);
        if !run.stderr.is_empty() {
            println!("verify stderr: {}", run.stderr);
        }
        Ok(run.exact)
    }

    /// Marks the scenario as passed: drop will not print the node logs.
    pub fn passed(&mut self) {
        self.passed = true;
    }

    /// Prints the last `lines` lines of every node log.
    pub fn print_logs(&self, lines: usize) {
        for node in self.nodes.values() {
            let text = std::fs::read_to_string(&node.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            eprintln!("---- node {} log (last {lines} lines) ----", node.id);
            for line in &all[from..] {
                eprintln!("{line}");
            }
        }
    }
}

/// The value of the unlabelled sample `name` in a Prometheus text, if present.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    samples(metrics, name).find_map(|(labels, value)| labels.is_empty().then_some(value))
}

fn sample_sum(metrics: &str, name: &str) -> f64 {
    samples(metrics, name).map(|(_, value)| value).sum()
}

/// Every sample of `name` in a Prometheus text: its labels (`""` when none) and its value.
fn samples<'a>(metrics: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |l| {
            let (metric, value) = l.rsplit_once(' ')?;
            let (bare, labels) = metric.split_once('{').unwrap_or((metric, ""));
            (bare == name).then(|| Some((labels, value.trim().parse().ok()?)))?
        })
}

impl Drop for ReplicatorCluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = child.wait();
            }
        }
        // `HA_PRINT_LOGS=1` prints the logs of passed runs too.
        if !self.passed || std::env::var_os("HA_PRINT_LOGS").is_some() {
            self.print_logs(60);
        }
        // `HA_KEEP_DIR=1` keeps configs, Raft data and full logs for a look afterwards.
        if std::env::var_os("HA_KEEP_DIR").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_adds_every_labelled_sample_of_the_name_only() {
        let text = "# TYPE iggy_replicator_downstream_losses counter\n\
                    iggy_replicator_downstream_losses_total{flow=\"a\",partition=\"0\"} 1\n\
                    iggy_replicator_downstream_losses_total{flow=\"a b\",partition=\"1\"} 2\n\
                    iggy_replicator_downstream_losses_totalled 5\n\
                    iggy_replicator_messages_recopied_total{flow=\"a\"} 7\n";
        assert_eq!(
            sample_sum(text, "iggy_replicator_downstream_losses_total"),
            3.0
        );
        assert_eq!(sample_sum(text, "iggy_replicator_gap_events_total"), 0.0);
    }

    #[test]
    fn a_sample_is_found_by_its_whole_name() {
        let text = "# HELP iggy_replicator_writer_fences Writer identities fenced\n\
                    # TYPE iggy_replicator_writer_fences counter\n\
                    iggy_replicator_writer_fences_pending 2\n\
                    iggy_replicator_writer_fences_total 3\n\
                    iggy_replicator_raft_leader_info{leader=\"2\"} 1\n";
        assert_eq!(
            sample(text, "iggy_replicator_writer_fences_total"),
            Some(3.0)
        );
        assert_eq!(
            sample(text, "iggy_replicator_writer_fences_pending"),
            Some(2.0)
        );
        assert_eq!(sample(text, "iggy_replicator_writer_fences"), None);
        assert_eq!(sample(text, "iggy_replicator_raft_leader_info"), None);
    }
}
