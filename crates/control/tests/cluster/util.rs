//! Harness: an in-process cluster of control-plane nodes on loopback, with real sled dirs.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, Instant};

use replicator_control::{
    ClusterSecret, ClusterStatus, Control, ControlMetrics, ControlParams, ControlTiming, Fencing,
    TlsFiles,
};
use replicator_model::{
    Assignment, CommitCounters, NodeId, ProgressCommit, UnitCounters, WorkUnit,
};
use tokio::task::JoinHandle;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

pub(crate) const SECRET: &str = "test-cluster-secret";

static TRACING: Once = Once::new();

pub(crate) fn init_tracing() {
    TRACING.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn,openraft=off".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// Fast timing for tests: elections well under a second, leases of 1 s.
pub(crate) fn fast_timing() -> ControlTiming {
    ControlTiming {
        heartbeat_interval: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(250),
        election_timeout_max: Duration::from_millis(500),
        lease_renew_interval: Duration::from_millis(150),
        lease_expiry: Duration::from_millis(1000),
        lease_drift_margin: Duration::from_millis(100),
        commit_batch_interval: Duration::from_millis(2),
        assignment_interval: Duration::from_millis(50),
        write_timeout: Duration::from_secs(3),
        rpc_timeout: Duration::from_millis(500),
        drain_timeout: Duration::from_secs(10),
        ..ControlTiming::default()
    }
}

pub(crate) struct TestCluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) addrs: BTreeMap<NodeId, SocketAddr>,
    pub(crate) initial: BTreeMap<NodeId, String>,
    pub(crate) nodes: BTreeMap<NodeId, Control>,
    /// Per node: a task playing the pipeline's part of handing back requested units.
    releasers: BTreeMap<NodeId, JoinHandle<()>>,
    pub(crate) timing: ControlTiming,
    /// Per node: its TLS files (empty: plain HTTP).
    pub(crate) tls: BTreeMap<NodeId, TlsFiles>,
    /// Fencing at the targets, the same for every node (`None`: leases only).
    pub(crate) fencing: Option<Fencing>,
}

/// A loopback listener on a port the OS picked.
pub(crate) fn bind_any() -> std::io::Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
}

impl TestCluster {
    pub(crate) async fn start(
        n: u64,
        timing: ControlTiming,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Self::start_with_tls(n, timing, BTreeMap::new(), None).await
    }

    /// [`Self::start`] with fencing at the targets through `fencing`.
    pub(crate) async fn start_fenced(
        n: u64,
        timing: ControlTiming,
        fencing: Fencing,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Self::start_with_tls(n, timing, BTreeMap::new(), Some(fencing)).await
    }

    /// [`Self::start`] with [`fast_timing`], once every node agrees on a leader (at most 10 s);
    /// returns the cluster and its leader.
    pub(crate) async fn start_led(
        n: u64,
    ) -> Result<(Self, NodeId), Box<dyn std::error::Error + Send + Sync>> {
        let cluster = Self::start(n, fast_timing()).await?;
        let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
        Ok((cluster, leader))
    }

    /// [`Self::start_led`] with `units` units of flow `f` reported through the leader.
    pub(crate) async fn start_with_units(
        n: u64,
        units: u32,
    ) -> Result<(Self, NodeId), Box<dyn std::error::Error + Send + Sync>> {
        let (cluster, leader) = Self::start_led(n).await?;
        cluster.report_units(leader, units).await?;
        Ok((cluster, leader))
    }

    /// [`Self::start`] with TLS files per node.
    pub(crate) async fn start_with_tls(
        n: u64,
        timing: ControlTiming,
        tls: BTreeMap<NodeId, TlsFiles>,
        fencing: Option<Fencing>,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        init_tracing();
        let dir = tempfile::tempdir()?;
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            listeners.insert(id, bind_any()?);
        }
        let addrs: BTreeMap<NodeId, SocketAddr> = listeners
            .iter()
            .map(|(id, l)| Ok((*id, l.local_addr()?)))
            .collect::<std::io::Result<_>>()?;
        let initial = addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
        let mut cluster = Self {
            dir,
            addrs,
            initial,
            nodes: BTreeMap::new(),
            releasers: BTreeMap::new(),
            timing,
            tls,
            fencing,
        };
        for (id, listener) in listeners {
            cluster.launch(id, Some(listener)).await?;
        }
        Ok(cluster)
    }

    pub(crate) fn data_dir(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    pub(crate) fn params(&self, id: NodeId, listener: Option<TcpListener>) -> ControlParams {
        ControlParams {
            node_id: id,
            data_dir: self.data_dir(id),
            raft_addr: self.addrs[&id],
            raft_listener: listener,
            api_addr: format!("127.0.0.1:{}", 9000 + id),
            secret: ClusterSecret::new(SECRET),
            initial_members: self.initial.clone(),
            timing: self.timing.clone(),
            tls: self.tls.get(&id).cloned(),
            fencing: self.fencing.clone(),
        }
    }

    async fn launch(&mut self, id: NodeId, listener: Option<TcpListener>) -> TestResult {
        let control = Control::start(self.params(id, listener)).await?;
        self.releasers.insert(id, spawn_releaser(control.clone()));
        self.nodes.insert(id, control);
        Ok(())
    }

    /// Starts an extra node that knows the cluster but is not a member yet.
    pub(crate) async fn start_extra(&mut self, id: NodeId) -> TestResult {
        let listener = bind_any()?;
        self.addrs.insert(id, listener.local_addr()?);
        self.launch(id, Some(listener)).await
    }

    pub(crate) fn node(&self, id: NodeId) -> &Control {
        &self.nodes[&id]
    }

    /// Kills a node in-process (`kill -9`).
    pub(crate) async fn crash(&mut self, id: NodeId) {
        if let Some(n) = self.take(id).await {
            n.crash().await;
        }
    }

    /// Stops a node gracefully (its control plane shuts down; what it left in the state
    /// stays).
    pub(crate) async fn stop(&mut self, id: NodeId) {
        if let Some(n) = self.take(id).await {
            n.shutdown().await;
        }
    }

    /// Takes a node out of the cluster's running set, its releaser stopped.
    async fn take(&mut self, id: NodeId) -> Option<Control> {
        if let Some(r) = self.releasers.remove(&id) {
            r.abort();
            let _ = r.await;
        }
        self.nodes.remove(&id)
    }

    /// Restarts a crashed or stopped node on its address and data dir.
    pub(crate) async fn restart(&mut self, id: NodeId) -> TestResult {
        let addr = self.addrs[&id];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The address may linger briefly; the data dir lock is released once the old
            // node's last handle is gone.
            let attempt = match TcpListener::bind(addr) {
                Ok(l) => Control::start(self.params(id, Some(l)))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match attempt {
                Ok(control) => {
                    self.releasers.insert(id, spawn_releaser(control.clone()));
                    self.nodes.insert(id, control);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "restart attempt failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(crate) async fn shutdown(mut self) {
        for (_, r) in std::mem::take(&mut self.releasers) {
            r.abort();
            let _ = r.await;
        }
        for (_, n) in std::mem::take(&mut self.nodes) {
            n.shutdown().await;
        }
    }

    /// Waits until every running node agrees on one running leader.
    pub(crate) async fn wait_leader(
        &self,
        within: Duration,
    ) -> Result<NodeId, Box<dyn std::error::Error + Send + Sync>> {
        let running: Vec<NodeId> = self.nodes.keys().copied().collect();
        self.agreed_leader("a leader all running nodes agree on", &running, within)
            .await
    }

    /// Waits until the nodes `among` agree on one leader, one of them (the others may be cut
    /// off).
    pub(crate) async fn wait_leader_among(
        &self,
        among: &[NodeId],
        within: Duration,
    ) -> Result<NodeId, Box<dyn std::error::Error + Send + Sync>> {
        self.agreed_leader("a leader the given nodes agree on", among, within)
            .await
    }

    async fn agreed_leader(
        &self,
        what: &str,
        among: &[NodeId],
        within: Duration,
    ) -> Result<NodeId, Box<dyn std::error::Error + Send + Sync>> {
        let mut found = None;
        wait_until(what, within, || {
            let leaders: std::collections::BTreeSet<Option<NodeId>> = among
                .iter()
                .map(|id| self.nodes[id].metrics().leader)
                .collect();
            found = match leaders.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(l)] if among.contains(l) && self.nodes[l].metrics().is_leader => Some(*l),
                _ => None,
            };
            found.is_some()
        })
        .await?;
        found.ok_or_else(|| "no leader".into())
    }

    /// Reports `n` units of flow `f` ([`units`]) through node `via`.
    pub(crate) async fn report_units(&self, via: NodeId, n: u32) -> TestResult {
        self.node(via).report_units("f", units("f", n)).await?;
        Ok(())
    }

    /// Waits until node `id` holds assignments for which `enough` holds, and returns them.
    pub(crate) async fn wait_assigned(
        &self,
        id: NodeId,
        enough: impl FnMut(&Vec<Assignment>) -> bool,
    ) -> Result<Vec<Assignment>, Box<dyn std::error::Error + Send + Sync>> {
        let mut rx = self.node(id).assignments();
        rx.wait_for(enough).await?;
        let mine = rx.borrow().clone();
        Ok(mine)
    }

    /// The offset node `id` has applied as confirmed for `unit`.
    pub(crate) fn confirmed(&self, id: NodeId, unit: &WorkUnit) -> Option<u64> {
        self.node(id).progress(unit).and_then(|p| p.confirmed)
    }

    /// Waits until node `id`'s metrics satisfy `cond`, at most 10 s.
    pub(crate) async fn wait_metrics(
        &self,
        what: &str,
        id: NodeId,
        cond: impl Fn(&ControlMetrics) -> bool,
    ) -> TestResult {
        wait_until(what, Duration::from_secs(10), || {
            cond(&self.node(id).metrics())
        })
        .await
    }

    /// Waits until the unit owners node `via` reports (see [`Self::owners`]) satisfy `cond`, at
    /// most 10 s.
    pub(crate) async fn wait_owners(
        &self,
        what: &str,
        via: NodeId,
        cond: impl Fn(&BTreeMap<WorkUnit, Option<NodeId>>) -> bool,
    ) -> TestResult {
        wait_until_async(what, Duration::from_secs(10), || async {
            cond(&self.owners(via).await.unwrap_or_default())
        })
        .await
    }

    /// Waits until the status node `via` reports satisfies `cond`, at most `within`.
    pub(crate) async fn wait_status(
        &self,
        what: &str,
        via: NodeId,
        within: Duration,
        cond: impl Fn(&ClusterStatus) -> bool,
    ) -> TestResult {
        let node = self.node(via);
        wait_until_async(what, within, || async {
            node.status().await.is_ok_and(|s| cond(&s))
        })
        .await
    }

    /// Status as the leader reports it, with unit owners.
    pub(crate) async fn owners(
        &self,
        via: NodeId,
    ) -> Result<BTreeMap<WorkUnit, Option<NodeId>>, Box<dyn std::error::Error + Send + Sync>> {
        let status = self.nodes[&via].status().await?;
        Ok(status
            .units
            .into_iter()
            .filter(|u| !u.retired)
            .map(|u| (u.unit, u.owner))
            .collect())
    }
}

/// Plays the pipeline: hands back every unit whose release was requested.
fn spawn_releaser(control: Control) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = control.assignments();
        loop {
            let wanted: Vec<Assignment> = rx
                .borrow_and_update()
                .iter()
                .filter(|a| a.release_requested)
                .cloned()
                .collect();
            for a in wanted {
                let _ = control.release(a.unit, a.epoch).await;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

/// Polls `cond` every 20 ms until it holds or `within` passed.
pub(crate) async fn wait_until<F: FnMut() -> bool>(
    what: &str,
    within: Duration,
    mut cond: F,
) -> TestResult {
    wait_until_async(what, within, || std::future::ready(cond())).await
}

/// Polls an async condition every 20 ms until it holds or `within` passed.
pub(crate) async fn wait_until_async<F, Fut>(
    what: &str,
    within: Duration,
    mut cond: F,
) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {within:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lowest node id that is not `leader`: a follower.
pub(crate) fn follower_of(leader: NodeId) -> NodeId {
    if leader == 1 {
        2
    } else {
        1
    }
}

/// Unit counts per owner; `None` counts unowned units.
pub(crate) fn load(owners: &BTreeMap<WorkUnit, Option<NodeId>>) -> BTreeMap<Option<NodeId>, usize> {
    let mut out = BTreeMap::new();
    for o in owners.values() {
        *out.entry(*o).or_insert(0) += 1;
    }
    out
}

pub(crate) fn units(flow: &str, n: u32) -> Vec<WorkUnit> {
    (0..n)
        .map(|p| WorkUnit::new(flow, "orders", "created", p))
        .collect()
}

/// A commit of `offset` for `a`'s unit under `a`'s epoch (topic created at 1, no counters).
pub(crate) fn commit(a: &Assignment, offset: u64) -> ProgressCommit {
    ProgressCommit {
        unit: a.unit.clone(),
        epoch: a.epoch,
        offset,
        history_label: 1,
        counters: CommitCounters::Since(UnitCounters::default()),
    }
}
