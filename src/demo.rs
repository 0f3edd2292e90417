//! `iggy-replicator demo`: the whole product in one process. Two Iggy-compatible servers
//! (or real ones given by URL), a three-node replicator cluster, a producer, live
//! progress, a node killed halfway, the cutover (`flow promote`, the application's consumer
//! group continuing on the target), and a final `verify`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    delete_stream, ensure_topic, group_next_message, message_id_at, partition_counts,
    store_group_offsets, stream_messages, Client, Endpoint, FlowConfig, MessageShape, NodeConfig,
    PacedProducer, ProducerParams, Topic,
};
use replicator_model::{IggyVersion, NodeId, WorkUnit};
use replicator_pipeline::verify::{verify, VerifyParams};
use replicator_pipeline::{probe, ClusterParams, Spoken, PROBE_TIMEOUT};
use replicator_testkit::{TestServer, TestServerConfig};

use crate::exit::Failure;
use crate::node::{NodeListeners, RunningNode};
use crate::verify::print_report;
use crate::wiring::pipeline_params;

/// Options of `demo`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// Keep the nodes' data (Raft logs) in this directory after the demo; by default a
    /// temporary directory is used and removed at the end.
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Messages to produce in total.
    #[arg(long, default_value_t = 120_000)]
    pub(crate) messages: u64,
    /// Produce rate in messages per second.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) rate: u64,
    /// Use this Iggy server as the source instead of an in-process one
    /// (e.g. `iggy://iggy:iggy@127.0.0.1:8090`); the demo creates and deletes its own stream.
    #[arg(long)]
    pub(crate) source_url: Option<String>,
    /// Use this Iggy server as the target instead of an in-process one.
    #[arg(long)]
    pub(crate) target_url: Option<String>,
    /// Do not kill a node halfway.
    #[arg(long)]
    pub(crate) no_failover: bool,
    /// The migration from Iggy 0.8 to 0.9: the source speaks Iggy 0.8 and the target Iggy 0.9
    /// (in-process, or the servers `--source-url` and `--target-url` name), and the demo ends
    /// with the steps of a real migration (README, "Migrating from Iggy 0.8 to 0.9").
    #[arg(long)]
    pub(crate) migrate: bool,
}

/// Topics of the demo stream and their partition counts.
const TOPICS: [(&str, u32); 3] = [("orders", 6), ("payments", 3), ("clicks", 3)];
/// Messages per send of the producer.
const PRODUCE_BATCH: u64 = 100;
/// How long the cluster may take to copy everything once the producer is done.
const CATCH_UP_DEADLINE: Duration = Duration::from_secs(60);
/// The consumer group of the demo's application, carried over at the cutover.
const DEMO_GROUP: &str = "order-processors";
/// The topic the demo's application consumes.
const DEMO_TOPIC: &str = "orders";

/// Everything the demo started, so that every exit path stops it.
struct Demo {
    servers: Vec<TestServer>,
    nodes: Vec<Option<RunningNode>>,
    producer: Option<PacedProducer>,
    /// Temporary data dir, removed on drop.
    _temp: Option<tempfile::TempDir>,
    /// Stream created on external servers, deleted at the end.
    external_stream: Option<(String, Vec<Endpoint>)>,
    /// The application's user: its name and the password it gets on the target at the cutover.
    app_user: Option<(String, String)>,
}

/// Runs the demo; `Ok` when the final verification finds an exact copy.
pub(crate) async fn run(args: DemoArgs) -> Result<(), Failure> {
    let mut demo = Demo {
        servers: Vec::new(),
        nodes: Vec::new(),
        producer: None,
        _temp: None,
        external_stream: None,
        app_user: None,
    };
    let outcome = tokio::select! {
        outcome = demo.play(&args) => outcome,
        _ = tokio::signal::ctrl_c() => {
            println!("\ninterrupted: stopping everything");
            Err(Failure::runtime("demo interrupted", "run it again without Ctrl-C"))
        }
    };
    demo.stop().await;
    outcome
}

impl Demo {
    async fn play(&mut self, args: &DemoArgs) -> Result<(), Failure> {
        let started = Instant::now();
        let data_dir = match &args.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Failure::runtime(
                        format!("cannot create {}: {e}", dir.display()),
                        "choose a writable --data-dir",
                    )
                })?;
                dir.clone()
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("iggy-replicator-demo-")
                    .tempdir()
                    .map_err(|e| {
                        Failure::runtime(
                            format!("cannot create a temporary directory: {e}"),
                            "pass --data-dir",
                        )
                    })?;
                let path = temp.path().to_owned();
                self._temp = Some(temp);
                path
            }
        };

        let target_version = if args.migrate {
            IggyVersion::V0_9
        } else {
            IggyVersion::V0_8
        };
        // The replicator, the demo's producer, its progress readout and its application
        // consumer all talk to each cluster in the cluster's own generation.
        let source = self
            .server(
                args.source_url.as_deref(),
                IggyVersion::V0_8,
                "--source-url",
            )
            .await?;
        let target = self
            .server(args.target_url.as_deref(), target_version, "--target-url")
            .await?;
        let external = args.source_url.is_some() || args.target_url.is_some();
        let stream = if external {
            format!("replicator-demo-{}", std::process::id())
        } else {
            "demo".to_owned()
        };
        println!("source cluster \"us\": {} (Iggy 0.8)", redact(&source.url));
        println!(
            "target cluster \"eu\": {} (Iggy {target_version})",
            redact(&target.url)
        );

        let source_client = connect(&source).await?;
        create_topics(&source_client, &stream).await?;
        let app_user = create_app_user(&source_client, &stream).await?;
        let _ = source_client.shutdown().await;
        self.app_user = Some(app_user.clone());
        if external {
            self.external_stream = Some((stream.clone(), vec![source.clone(), target.clone()]));
        }

        // Three nodes on loopback ports picked by the OS.
        let mut listeners = Vec::new();
        for _ in 0..3 {
            let raft = std::net::TcpListener::bind("127.0.0.1:0").map_err(io_failure)?;
            let api = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(io_failure)?;
            listeners.push((raft, api));
        }
        let mut raft_addrs = BTreeMap::new();
        for (id, (raft, _)) in (1..).zip(&listeners) {
            raft_addrs.insert(id, raft.local_addr().map_err(io_failure)?);
        }
        let secret = format!("demo-secret-{:016x}", rand::random::<u64>());
        let replication = FlowConfig {
            name: "us-to-eu",
            source_alias: "us",
            source_url: &source.url,
            target_alias: "eu",
            target_url: &target.url,
            include: &format!("{stream}/*"),
            target_fencing: None,
            target_iggy_version: args.migrate.then_some(target_version.as_str()),
            // On external servers, writer users of this run's own (a server keeps them after
            // the run, with passwords derived from this run's secret; deleted at the end).
            target_writer_user_prefix: external.then_some(stream.as_str()),
            flow_extra: &format!(
                "consumer_groups = [\"{DEMO_GROUP}\"]\nconsumer_group_sync_interval = \"1s\"\nusers = [\"{}\"]\nmetadata_sync_interval = \"1s\"",
                app_user.0
            ),
        }
        .toml();
        let mut configs = Vec::new();
        for ((id, raft_addr), (_, api)) in raft_addrs.iter().zip(&listeners) {
            let text = NodeConfig {
                id: *id,
                data_dir: &data_dir.join(format!("node-{id}")),
                raft_addr: *raft_addr,
                api_bind: api.local_addr().map_err(io_failure)?,
                advertised_api_addr: None,
                secret: &secret,
                admin_token: None,
                tls: None,
                initial_members: &raft_addrs,
                cluster_extra: "",
            }
            .toml(&replication);
            let config = replicator_config::parse_str(&text, &format!("demo node {id}"), |_| None)
                .map_err(Failure::from)?;
            configs.push(config);
        }
        for ((raft, api), config) in listeners.into_iter().zip(&configs) {
            let node = RunningNode::start(config, Some(NodeListeners { raft, api })).await?;
            println!(
                "node {} started: raft {}  admin http://{}/status",
                node.id, config.node.raft_addr, node.api_addr
            );
            self.nodes.push(Some(node));
        }
        let total_partitions: u32 = TOPICS.iter().map(|(_, p)| p).sum();
        self.wait_for_assignment(total_partitions as usize).await?;
        println!(
            "cluster ready after {:.1} s: {} partitions spread over 3 nodes",
            started.elapsed().as_secs_f64(),
            total_partitions
        );

        self.producer = Some(start_producer(&source, &stream, args));

        // Progress until everything is copied.
        let target_client = connect(&target).await?;
        let downstream_stream = stream.clone();
        let progress = Progress::new(args.messages);
        let mut failover: Option<Failover> = None;
        let mut failover_time: Option<Duration> = None;
        let mut producer_done_at: Option<Instant> = None;
        let mut produced_now = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Some(producer) = &self.producer {
                produced_now = producer.produced();
            }
            // 0 while the stream does not exist downstream yet.
            let replicated = stream_messages(&target_client, &downstream_stream)
                .await
                .unwrap_or(0);
            progress.update(produced_now, replicated);
            progress.nodes(&self.node_lines().await);

            if !args.no_failover && failover.is_none() && produced_now >= args.messages / 2 {
                failover = Some(self.kill_leader(&progress).await?);
            }
            if let (Some(f), None) = (&failover, failover_time) {
                if self.failover_complete(f).await {
                    let took = f.killed_at.elapsed();
                    failover_time = Some(took);
                    progress.println(format!(
                        "failover: the {} partitions of node {} were written again by their new owners {:.2} s after the kill",
                        f.units.len(),
                        f.node,
                        took.as_secs_f64()
                    ));
                }
            }
            if self
                .producer
                .as_ref()
                .is_some_and(PacedProducer::is_finished)
            {
                producer_done_at = Some(Instant::now());
                if let Some(producer) = self.producer.take() {
                    match producer.stop().await {
                        Ok(report) => produced_now = report.produced,
                        Err(e @ replicator_harness::Error::Task(_)) => {
                            return Err(Failure::runtime(
                                format!("producer task failed: {e}"),
                                "report a bug",
                            ))
                        }
                        Err(e) => {
                            return Err(Failure::runtime(
                                format!("producer failed: {e}"),
                                "check the source server",
                            ))
                        }
                    }
                }
            }
            let producer_finished = self.producer.is_none();
            if producer_finished && replicated >= args.messages {
                break;
            }
            if producer_done_at.is_some_and(|t| t.elapsed() > CATCH_UP_DEADLINE) {
                progress.finish();
                return Err(Failure::runtime(
                    format!(
                        "the copy did not catch up within {} s ({replicated} of {} messages)",
                        CATCH_UP_DEADLINE.as_secs(),
                        args.messages
                    ),
                    "look at the warnings above; `iggy-replicator verify` shows what is missing",
                ));
            }
        }
        progress.finish();
        println!(
            "replicated {} messages in {:.1} s",
            args.messages,
            started.elapsed().as_secs_f64()
        );
        if let Some(took) = failover_time {
            println!(
                "failover time (kill → first write by the new owners): {:.2} s",
                took.as_secs_f64()
            );
        }

        self.cutover(&source, &target, &stream).await?;

        // Verify, in each cluster's own generation.
        let flow = pipeline_params(&configs[0]).flows.remove(0);
        let mut params = VerifyParams::new(flow.clone(), source.url.clone(), target.url.clone());
        params.target_version = target_version;
        params.wait = Duration::from_secs(10);
        let report = verify(&params).await.map_err(|e| {
            Failure::runtime(format!("verification failed: {e}"), "check both servers")
        })?;
        print_report(&flow.name, &report);
        if report.is_exact() {
            println!(
                "result: exact copy — every message once, in order, ids, payloads, headers and timestamps preserved ({:.1} s in all)",
                started.elapsed().as_secs_f64()
            );
            if args.migrate {
                print_migration_steps();
            }
            Ok(())
        } else {
            Err(Failure::not_exact("the downstream copy is not exact"))
        }
    }

    /// The disaster-recovery cutover, once everything is copied and the producer stopped: the
    /// application's consumer group has processed part of every partition upstream; promote
    /// the flow (wait for the copy, pause, sync the groups a last time) and show the group
    /// continuing on the target with the next message of every partition.
    async fn cutover(
        &self,
        source: &Endpoint,
        target: &Endpoint,
        stream: &str,
    ) -> Result<(), Failure> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            Failure::runtime(format!("cutover: {what}: {e}"), "check both servers")
        };
        let (up, down) = (connect(source).await?, connect(target).await?);
        let counts = partition_counts(&up, stream, DEMO_TOPIC)
            .await
            .map_err(|e| failed("reading the source", &e))?;
        // The application processed about two thirds of every partition.
        let processed: Vec<(u32, u64)> = (0..)
            .zip(&counts)
            .filter(|(_, n)| **n > 1)
            .map(|(p, n)| (p, n * 2 / 3))
            .collect();
        store_group_offsets(&up, (stream, DEMO_TOPIC), DEMO_GROUP, &processed)
            .await
            .map_err(|e| failed("storing the application's offsets", &e))?;
        println!(
            "\ncutover: the application (consumer group {DEMO_GROUP}) has processed {stream}/{DEMO_TOPIC} upstream up to offsets {:?}; the producer has stopped: promoting flow us-to-eu",
            processed.iter().map(|(_, o)| o).collect::<Vec<_>>()
        );
        let node = self
            .nodes
            .iter()
            .flatten()
            .next()
            .ok_or_else(|| Failure::runtime("cutover: no node runs", "report a bug"))?;
        let cutover = node
            .pipeline()
            .ok_or_else(|| Failure::runtime("cutover: the node runs no pipeline", "report a bug"))?
            .cutover();
        let (app_user, app_password) = self
            .app_user
            .clone()
            .ok_or_else(|| Failure::runtime("cutover: no application user", "report a bug"))?;
        println!(
            "  the application logs in as user {app_user}, synced to eu (inactive, with its permissions translated); promote activates it with the password the operator gives"
        );
        let report = crate::flow::run_promote(
            &node.control,
            &cutover,
            "us-to-eu",
            Duration::from_secs(60),
            &BTreeMap::new(),
            &BTreeMap::from([(app_user.clone(), app_password.clone())]),
        )
        .await
        .map_err(|e| failed("promote", &e))?;
        print!("{}", crate::flow::render(&report));
        if !report.complete {
            return Err(Failure::not_exact(
                "cutover: promote ended with messages not copied",
            ));
        }
        // The application now consumes from the target, as its own user: each partition
        // continues with the message that follows what it processed upstream.
        let address = target.url.rsplit_once('@').map_or("", |(_, a)| a);
        let app = connect(&Endpoint::new(
            target.iggy_version,
            format!("iggy://{app_user}:{app_password}@{address}"),
        ))
        .await
        .map_err(|f| {
            f.with_hint(format!(
                "the application user {app_user} could not log in on eu after promote"
            ))
        })?;
        println!("  the application logged in on eu as {app_user}");
        let mut continued = Ok(());
        for &(partition, offset) in &processed {
            let next = group_next_message(&app, (stream, DEMO_TOPIC), DEMO_GROUP, partition)
                .await
                .map_err(|e| failed("reading the group on the target", &e))?;
            let expected = message_id_at(&up, (stream, DEMO_TOPIC), partition, offset + 1)
                .await
                .map_err(|e| failed("reading the source", &e))?;
            match next {
                Some(m) if m.id == expected => println!(
                    "  partition {partition}: the group continues on eu at offset {} with the message that follows upstream offset {offset} (same id)",
                    m.offset
                ),
                other => {
                    continued = Err(Failure::not_exact(format!(
                        "cutover: partition {partition} of {DEMO_TOPIC} continues with {:?}, not with the message after upstream offset {offset}",
                        other.map(|m| m.offset)
                    )));
                }
            }
        }
        let _ = up.shutdown().await;
        let _ = down.shutdown().await;
        let _ = app.shutdown().await;
        continued
    }

    /// The external server given by `flag`, or an in-process server; either speaks `version`.
    /// An external server that answers only in the other generation stops the demo here, named
    /// by its flag (the nodes' own probe would name a config key the user never wrote).
    async fn server(
        &mut self,
        external: Option<&str>,
        version: IggyVersion,
        flag: &str,
    ) -> Result<Endpoint, Failure> {
        if let Some(url) = external {
            let mut cluster = ClusterParams::new(url);
            cluster.iggy_version = version;
            if let Spoken::Other(spoken) = probe(&cluster, PROBE_TIMEOUT).await {
                let role = if flag == "--source-url" {
                    "source"
                } else {
                    "target"
                };
                return Err(Failure::config(format!(
                    "{flag} {}: the server answers in the Iggy {spoken} protocol, but the demo's \
                     {role} must be Iggy {version}",
                    redact(url)
                ))
                .with_hint(
                    "`demo` copies Iggy 0.8 to Iggy 0.8, `demo --migrate` Iggy 0.8 to Iggy 0.9",
                ));
            }
            return Ok(Endpoint::new(version, url));
        }
        let server = TestServer::start(TestServerConfig {
            iggy_version: version,
            ..TestServerConfig::default()
        })
        .await
        .map_err(|e| {
            Failure::runtime(
                format!("cannot start an in-process Iggy server: {e}"),
                "is loopback available?",
            )
        })?;
        let endpoint = Endpoint::new(version, server.connection_string());
        self.servers.push(server);
        Ok(endpoint)
    }

    async fn wait_for_assignment(&self, units: usize) -> Result<(), Failure> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(node) = self.nodes.iter().flatten().next() {
                if let Ok(status) = node.control.status().await {
                    let assigned = status
                        .units
                        .iter()
                        .filter(|u| u.owner.is_some() && !u.retired)
                        .count();
                    if status.leader.is_some() && assigned >= units {
                        return Ok(());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Failure::runtime(
            "the cluster did not assign every partition within 30 s",
            "run with --log-level debug to see the control plane",
        ))
    }

    /// One line per live node: units, lag, rate.
    async fn node_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for node in self.nodes.iter().flatten() {
            let stats = match node.pipeline() {
                Some(p) => p.stats().await.unwrap_or_default(),
                None => Vec::new(),
            };
            let lag: u64 = stats.iter().filter_map(|s| s.lag).sum();
            let rate: f64 = stats.iter().map(|s| s.messages_per_second).sum();
            let leader = node.control.metrics().is_leader;
            lines.push(format!(
                "node {}{}: {:>2} partitions  lag {:>6}  {:>7.0} msg/s",
                node.id,
                if leader { " (leader)" } else { "" },
                stats.len(),
                lag,
                rate
            ));
        }
        lines
    }

    /// Kills the Raft leader (the hardest case: leader election plus partition failover).
    async fn kill_leader(&mut self, progress: &Progress) -> Result<Failover, Failure> {
        let leader = self
            .nodes
            .iter()
            .flatten()
            .find(|n| n.control.metrics().is_leader)
            .map(|n| n.id)
            .or_else(|| self.nodes.iter().flatten().next().map(|n| n.id))
            .ok_or_else(|| Failure::runtime("no node left to kill", "report a bug"))?;
        let status = self
            .nodes
            .iter()
            .flatten()
            .find(|n| n.id == leader)
            .map(|n| n.control.clone());
        let mut units = BTreeMap::new();
        if let Some(control) = status {
            if let Ok(status) = control.status().await {
                for unit in status.units.into_iter().filter(|u| u.owner == Some(leader)) {
                    units.insert(unit.unit, unit.progress.confirmed);
                }
            }
        }
        let slot = self
            .nodes
            .iter_mut()
            .find(|n| n.as_ref().is_some_and(|n| n.id == leader))
            .and_then(Option::take);
        let killed_at = Instant::now();
        if let Some(node) = slot {
            node.crash().await;
        }
        progress.println(format!(
            "killed node {leader} (the Raft leader, owner of {} partitions) without warning",
            units.len()
        ));
        Ok(Failover {
            node: leader,
            units,
            killed_at,
        })
    }

    /// Whether every unit of the killed node has a new owner that confirmed a write past
    /// where the killed node stopped.
    async fn failover_complete(&self, failover: &Failover) -> bool {
        let Some(node) = self.nodes.iter().flatten().next() else {
            return false;
        };
        let Ok(status) = node.control.status().await else {
            return false;
        };
        failover.units.iter().all(|(unit, before)| {
            status.units.iter().any(|u| {
                &u.unit == unit
                    && u.owner.is_some_and(|o| o != failover.node)
                    && u.progress.confirmed > *before
            })
        })
    }

    /// Stops whatever is running, in order: producer, nodes (graceful), servers, streams.
    async fn stop(&mut self) {
        // Dropping the producer aborts its task.
        drop(self.producer.take());
        let running: Vec<RunningNode> = self.nodes.iter_mut().filter_map(Option::take).collect();
        let drained = futures::future::join_all(running.into_iter().map(RunningNode::drain)).await;
        futures::future::join_all(drained.into_iter().map(|n| n.shutdown())).await;
        if let Some((stream, servers)) = self.external_stream.take() {
            for server in servers {
                let _ = delete_stream(&server, &stream).await;
                if let Ok(client) = connect(&server).await {
                    // The application's user and this run's writer users (named after the
                    // stream: `<stream>-n<node>-i<incarnation>`).
                    if let Ok(users) = client.get_users().await {
                        let app = self.app_user.as_ref().map(|(name, _)| name.as_str());
                        for user in users.iter().filter(|u| {
                            Some(u.username.as_str()) == app
                                || replicator_model::is_writer_username(&stream, &u.username)
                        }) {
                            if let Ok(id) = iggy::prelude::Identifier::numeric(user.id) {
                                let _ = client.delete_user(&id).await;
                            }
                        }
                    }
                    let _ = client.shutdown().await;
                }
            }
        }
        for server in self.servers.drain(..) {
            server.shutdown().await;
        }
    }
}

/// What was killed and what it owned (unit → confirmed offset at the kill).
struct Failover {
    node: NodeId,
    units: BTreeMap<WorkUnit, Option<u64>>,
    killed_at: Instant,
}

/// A connected client of the server's generation (with Nagle's algorithm off: see
/// `replicator_harness::connect`).
async fn connect(server: &Endpoint) -> Result<Client, Failure> {
    let url = redact(&server.url);
    replicator_harness::connect(server)
        .await
        .map_err(|e| match e {
            replicator_harness::Error::InvalidUrl(e) => {
                Failure::config(format!("invalid Iggy URL {url}: {e}"))
            }
            e => Failure::runtime(
                format!(
                    "cannot connect to {url} (Iggy {}): {e}",
                    server.iggy_version
                ),
                "is the server running, of that Iggy generation, and are the credentials right?",
            ),
        })
}

async fn create_topics(client: &Client, stream: &str) -> Result<(), Failure> {
    for (topic, partitions) in TOPICS {
        ensure_topic(client, stream, topic, partitions)
            .await
            .map_err(|e| {
                Failure::runtime(
                    format!("cannot create the demo topics: {e}"),
                    "check the source server's permissions",
                )
            })?;
    }
    Ok(())
}

/// Creates the application's user on the source: it may read the demo stream and consume
/// [`DEMO_TOPIC`] (stream- and topic-level rights, which the sync translates to the target's
/// ids). Returns its name and the password it is to get on the target at the cutover.
async fn create_app_user(client: &Client, stream: &str) -> Result<(String, String), Failure> {
    use iggy::prelude::{Permissions, StreamPermissions, TopicPermissions, UserStatus};
    let failed = |e: &dyn std::fmt::Display| {
        Failure::runtime(
            format!("cannot create the demo's application user: {e}"),
            "the source's user needs manage_users",
        )
    };
    let name = format!("{stream}-app");
    let stream_id = iggy::prelude::Identifier::named(stream).map_err(|e| failed(&e))?;
    let topic_id = iggy::prelude::Identifier::named(DEMO_TOPIC).map_err(|e| failed(&e))?;
    let details = client
        .get_topic(&stream_id, &topic_id)
        .await
        .map_err(|e| failed(&e))?
        .ok_or_else(|| failed(&"the demo topic is missing"))?;
    let sid = client
        .get_stream(&stream_id)
        .await
        .map_err(|e| failed(&e))?
        .ok_or_else(|| failed(&"the demo stream is missing"))?
        .id;
    let topic = TopicPermissions {
        read_topic: true,
        poll_messages: true,
        ..TopicPermissions::default()
    };
    let rights = StreamPermissions {
        read_stream: true,
        topics: Some(BTreeMap::from([(details.id as usize, topic)])),
        ..StreamPermissions::default()
    };
    let permissions = Permissions {
        streams: Some(BTreeMap::from([(sid as usize, rights)])),
        ..Permissions::default()
    };
    let upstream_password = format!("{:032x}", rand::random::<u128>());
    client
        .create_user(
            &name,
            &upstream_password,
            UserStatus::Active,
            Some(permissions),
        )
        .await
        .map_err(|e| failed(&e))?;
    Ok((name, format!("{:032x}", rand::random::<u128>())))
}

/// Produces `args.messages` messages at about `args.rate` per second into `stream` at
/// `source`, `PRODUCE_BATCH` at a time to each partition of every topic in turn, each with a
/// unique id, a user header and a payload of 200 bytes.
fn start_producer(source: &Endpoint, stream: &str, args: &DemoArgs) -> PacedProducer {
    let targets = TOPICS
        .iter()
        .flat_map(|(topic, partitions)| Topic::new(stream, *topic, *partitions).targets())
        .collect();
    let mut params = ProducerParams::new(source, targets, args.rate.max(1));
    params.total = Some(args.messages);
    params.batch = PRODUCE_BATCH;
    params.shape = MessageShape {
        payload_bytes: 200,
        label: Some("demo message".to_owned()),
        header: Some(("source".to_owned(), "demo".to_owned())),
    };
    PacedProducer::start(params)
}

/// Live progress: bars on a terminal, milestone lines always.
struct Progress {
    bars: MultiProgress,
    produced: ProgressBar,
    replicated: ProgressBar,
    nodes: Vec<ProgressBar>,
}

impl Progress {
    fn new(total: u64) -> Self {
        let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(5));
        let style = ProgressStyle::with_template("{prefix:>11} [{bar:40}] {pos:>7}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let produced = bars.add(
            ProgressBar::new(total)
                .with_style(style.clone())
                .with_prefix("produced"),
        );
        let replicated = bars.add(
            ProgressBar::new(total)
                .with_style(style)
                .with_prefix("replicated"),
        );
        let nodes = (0..3)
            .map(|_| {
                bars.add(
                    ProgressBar::new_spinner()
                        .with_style(
                            ProgressStyle::with_template("{prefix:>11} {msg}")
                                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                        )
                        .with_prefix(""),
                )
            })
            .collect();
        Self {
            bars,
            produced,
            replicated,
            nodes,
        }
    }

    fn update(&self, produced: u64, replicated: u64) {
        self.produced.set_position(produced);
        self.replicated.set_position(replicated);
    }

    fn nodes(&self, lines: &[String]) {
        for (bar, line) in self
            .nodes
            .iter()
            .zip(lines.iter().map(Some).chain(std::iter::repeat(None)))
        {
            bar.set_message(line.cloned().unwrap_or_default());
        }
    }

    /// Prints a milestone above the bars (and plainly when stderr is no terminal).
    fn println(&self, line: String) {
        if self.bars.is_hidden() {
            println!("{line}");
        } else {
            let _ = self.bars.println(line);
        }
    }

    fn finish(&self) {
        self.produced.finish();
        self.replicated.finish();
        for bar in &self.nodes {
            bar.finish();
        }
    }
}

fn redact(url: &str) -> String {
    replicator_config::ClusterUrl::new(url).redacted()
}

fn io_failure(e: std::io::Error) -> Failure {
    Failure::runtime(
        format!("cannot bind a loopback port: {e}"),
        "is loopback available?",
    )
}

/// What `demo --migrate` showed, as the steps of a real migration from Iggy 0.8 to 0.9.
fn print_migration_steps() {
    println!(
        "\nthat was a migration from Iggy 0.8 (\"us\") to Iggy 0.9 (\"eu\"). With real clusters \
         (README, \"Migrating from Iggy 0.8 to 0.9\"):\n\
         1. start the new 0.9 cluster; give the replicator a user there that manages streams, topics and users\n\
         2. configure: [clusters.old] iggy_version = \"0.8\", [clusters.new] iggy_version = \"0.9\",\n   \
            [[flows]] source = \"old\", target = \"new\", consumer_groups = [\"*\"], users = [\"*\"]\n\
         3. iggy-replicator run --config replicator.toml on each member; `status --api <member>` shows the lag\n\
         4. iggy-replicator verify --config replicator.toml, any time: a message-by-message comparison\n\
         5. stop the producers on 0.8, then REPLICATOR_TOKEN=... iggy-replicator flow promote <flow> --api <member> --activate-users users.toml\n\
         6. point the consumers at 0.9, as their own users (each group continues with its next message), then the producers"
    );
}
