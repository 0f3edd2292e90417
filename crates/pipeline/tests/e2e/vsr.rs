//! Iggy 0.9 clusters of three replicas (`TestCluster`: one primary, view changes) as the target
//! and as the source, named by a URL that lists every replica: a primary that dies with a send
//! in flight, a replica that stays down. Only on the pairs whose side is 0.9 (clustering is a
//! 0.9 feature); elsewhere these tests print why and pass.

use std::collections::BTreeMap;
use std::time::Duration;

use replicator_harness::{connect, Client, Endpoint};
use replicator_model::IggyVersion;
use replicator_pipeline::verify::{verify, VerifyParams};
use replicator_pipeline::{ClusterParams, FlowParams, InMemoryControl, Pipeline};
use replicator_testkit::{TestCluster, TestServer, TestServerConfig};

use crate::harness::{
    assert_exact, client, count, create_topic, flow, generations, init_tracing, produce, server,
    tuned_params, wait_until, TestResult,
};

/// SEND_MESSAGES.
const SEND_MESSAGES: u32 = 101;
/// GET_CLUSTER_METADATA: the roster a new connection asks for.
const GET_CLUSTER_METADATA: u32 = 12;

/// How long a copy may take to catch up on a busy machine.
const CATCH_UP: Duration = Duration::from_secs(60);

/// A three-replica 0.9 cluster on free ports.
async fn three_replicas() -> TestResult<TestCluster> {
    Ok(TestCluster::start(
        TestServerConfig {
            iggy_version: IggyVersion::V0_9,
            ..TestServerConfig::default()
        },
        3,
    )
    .await?)
}

/// The pipeline's view of a cluster: every replica as a seed address.
fn cluster_params_of(cluster: &TestCluster) -> ClusterParams {
    let mut params = ClusterParams::new(cluster.connection_string());
    params.iggy_version = IggyVersion::V0_9;
    params
}

/// A client of `cluster` through its seed addresses, as the harness's tools reach a cluster.
async fn cluster_client(cluster: &TestCluster) -> TestResult<Client> {
    Ok(connect(Endpoint::new(
        IggyVersion::V0_9,
        cluster.connection_string(),
    ))
    .await?)
}

/// Messages stored in one partition of the cluster (`0` while it does not exist).
fn cluster_count(cluster: &TestCluster, stream: &str, topic: &str, partition: u32) -> u64 {
    cluster
        .partition_info(stream, topic, partition)
        .map_or(0, |info| info.messages_count)
}

/// The clusters of a flow `us → eu`.
fn clusters(us: ClusterParams, eu: ClusterParams) -> BTreeMap<String, ClusterParams> {
    BTreeMap::from([("us".to_owned(), us), ("eu".to_owned(), eu)])
}

/// Verifies `flow` between the two URLs, waiting for the copy to become exact.
async fn verify_exact(flow: FlowParams, us: &ClusterParams, eu: &ClusterParams) -> TestResult<u64> {
    let mut check = VerifyParams::new(
        flow,
        us.connection_string.clone(),
        eu.connection_string.clone(),
    );
    check.source_version = us.iggy_version;
    check.target_version = eu.iggy_version;
    check.wait = CATCH_UP;
    let report = verify(&check).await?;
    assert_exact(&report);
    Ok(report.downstream_total())
}

/// The upstream single server and the clustered target of this pair, or `None` (printed) when
/// the pair's target is not 0.9.
async fn cluster_target() -> TestResult<Option<(TestServer, TestCluster)>> {
    let (up, down) = generations();
    if down != IggyVersion::V0_9 {
        eprintln!("skipped: the target is Iggy {down}; clusters of replicas are Iggy 0.9");
        return Ok(None);
    }
    init_tracing();
    Ok(Some((server(up).await?, three_replicas().await?)))
}

/// Waits until partition `partition` of `vsr/t` on the target cluster holds `messages`.
async fn wait_target(eu: &TestCluster, partition: u32, messages: u64) -> TestResult {
    let what = format!("{messages} messages in vsr/t/{partition} on the target cluster");
    wait_until(&what, CATCH_UP, || async {
        cluster_count(eu, "vsr", "t", partition) == messages
    })
    .await
}

/// What the scenarios with a clustered target start from.
struct Copying {
    /// A client of the upstream server.
    up: Client,
    f: FlowParams,
    us_params: ClusterParams,
    eu_params: ClusterParams,
    pipeline: Pipeline,
}

/// `vsr/t` (two partitions, 300 messages each) upstream, copied by a pipeline to the target
/// cluster named by all its replicas, until both partitions are there.
async fn copying_to(us: &TestServer, eu: &TestCluster) -> TestResult<Copying> {
    let up = client(us).await?;
    create_topic(&up, "vsr", "t", 2).await?;
    produce(&up, "vsr", "t", 2, 0..300, 100).await?;
    let f = flow("vsr", &["vsr/*"]);
    let (us_params, eu_params) = (crate::harness::cluster_params(us), cluster_params_of(eu));
    let params = tuned_params(clusters(us_params.clone(), eu_params.clone()), f.clone());
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    wait_target(eu, 0, 300).await?;
    wait_target(eu, 1, 300).await?;
    Ok(Copying {
        up,
        f,
        us_params,
        eu_params,
        pipeline,
    })
}

/// The target's primary dies while a send to it is in flight (held unread on its way, so its
/// outcome is unknown to the writer): the view changes, the writer reconnects through the
/// seeds to the new primary, re-reads the tail and sends again; the copy ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_targets_primary_dying_mid_send_leaves_an_exact_copy() -> TestResult {
    let Some((us, mut eu)) = cluster_target().await? else {
        return Ok(());
    };
    let Copying {
        up,
        f,
        us_params,
        eu_params,
        pipeline,
    } = copying_to(&us, &eu).await?;

    let primary = eu.primary().ok_or("the target has no primary")?;
    let hold = eu.faults(primary).hold_sends_to("vsr", "t", 0);
    produce(&up, "vsr", "t", 2, 300..600, 100).await?;
    tokio::time::timeout(CATCH_UP, hold.until_held(1)).await?;
    eu.kill(primary).await;
    // The held send died with its connection, unread: nothing of it was appended.
    drop(hold);
    assert2::check!(eu.primary() != Some(primary));
    assert2::check!(cluster_count(&eu, "vsr", "t", 0) <= 600);

    produce(&up, "vsr", "t", 2, 600..700, 100).await?;
    wait_target(&eu, 0, 700).await?;
    wait_target(&eu, 1, 700).await?;
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 1400);
    pipeline.shutdown().await;
    Ok(())
}

/// The replica of the target's first seed address is killed before the replicator starts and
/// stays down (the cluster moved on to another primary): the replicator passes it over, and the
/// copy, with messages produced after the start, ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_replica_that_stays_down_is_passed_over() -> TestResult {
    let Some((us, mut eu)) = cluster_target().await? else {
        return Ok(());
    };
    eu.kill(0).await;
    let up = client(&us).await?;
    create_topic(&up, "vsr", "t", 2).await?;
    produce(&up, "vsr", "t", 2, 0..300, 100).await?;
    let f = flow("vsr", &["vsr/*"]);
    let (us_params, eu_params) = (crate::harness::cluster_params(&us), cluster_params_of(&eu));
    let params = tuned_params(clusters(us_params.clone(), eu_params.clone()), f.clone());
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    wait_target(&eu, 0, 300).await?;
    produce(&up, "vsr", "t", 2, 300..400, 100).await?;
    wait_target(&eu, 0, 400).await?;
    wait_target(&eu, 1, 400).await?;
    assert2::check!(!eu.is_running(0));
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 800);
    pipeline.shutdown().await;
    Ok(())
}

/// The source is a three-replica 0.9 cluster whose primary dies mid-copy: the readers'
/// connections drop, they reconnect through the seeds, and the copy, with messages produced
/// through the new primary, ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_primary_dying_mid_copy_leaves_an_exact_copy() -> TestResult {
    let (up, down) = generations();
    if up != IggyVersion::V0_9 {
        eprintln!("skipped: the source is Iggy {up}; clusters of replicas are Iggy 0.9");
        return Ok(());
    }
    init_tracing();
    let mut us = three_replicas().await?;
    let eu = server(down).await?;
    let producer = cluster_client(&us).await?;
    create_topic(&producer, "vsr", "t", 2).await?;
    produce(&producer, "vsr", "t", 2, 0..300, 100).await?;
    let f = flow("vsr", &["vsr/*"]);
    let (us_params, eu_params) = (cluster_params_of(&us), crate::harness::cluster_params(&eu));
    let params = tuned_params(clusters(us_params.clone(), eu_params.clone()), f.clone());
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    let what = "the copy under way";
    wait_until(what, CATCH_UP, || async { count(&eu, "vsr", "t", 0) > 0 }).await?;
    let primary = us.primary().ok_or("the source has no primary")?;
    us.kill(primary).await;
    drop(producer);
    let producer = cluster_client(&us).await?;
    produce(&producer, "vsr", "t", 2, 300..400, 100).await?;
    for partition in [0, 1] {
        let what = format!("400 messages in vsr/t/{partition} downstream");
        wait_until(&what, CATCH_UP, || async {
            count(&eu, "vsr", "t", partition) == 400
        })
        .await?;
    }
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 800);
    pipeline.shutdown().await;
    Ok(())
}

/// The target's primary dies and the cluster takes its time to elect (as a real one does, for
/// about a heartbeat timeout): meanwhile the backups refuse the writers' logins as not
/// accepted. The writers keep trying through the seeds, and once the view changes the copy
/// resumes and ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_refused_before_the_targets_election_are_retried_until_it() -> TestResult {
    let Some((us, mut eu)) = cluster_target().await? else {
        return Ok(());
    };
    let Copying {
        up,
        f,
        us_params,
        eu_params,
        pipeline,
    } = copying_to(&us, &eu).await?;

    let primary = eu.primary().ok_or("the target has no primary")?;
    eu.kill_without_view_change(primary).await;
    produce(&up, "vsr", "t", 2, 300..400, 100).await?;
    wait_until("a writer's login refused by a backup", CATCH_UP, || async {
        eu.logins_refused() >= 2
    })
    .await?;
    let started = std::time::Instant::now();
    eu.view_change();
    wait_target(&eu, 0, 400).await?;
    wait_target(&eu, 1, 400).await?;
    eprintln!("caught up {:?} after the view change", started.elapsed());
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 800);
    pipeline.shutdown().await;
    Ok(())
}

/// The replica of the target's first seed address is frozen (a process stopped with SIGSTOP: it
/// accepts connections and answers nothing), a backup the cluster does not need. A login there
/// is given up after the per-seed bound and not waited for any further; the replicator goes on
/// through the next seed, and the copy ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_seed_replica_is_passed_over() -> TestResult {
    let Some((us, eu)) = cluster_target().await? else {
        return Ok(());
    };
    let addrs = eu.addrs();
    let frozen = 2;
    eu.faults(frozen).stall();
    let up = client(&us).await?;
    create_topic(&up, "vsr", "t", 2).await?;
    produce(&up, "vsr", "t", 2, 0..300, 100).await?;
    let f = flow("vsr", &["vsr/*"]);
    let us_params = crate::harness::cluster_params(&us);
    // The frozen replica first, then the others.
    let mut eu_params = cluster_params_of(&eu);
    eu_params.connection_string =
        format!("iggy://iggy:iggy@{},{},{}", addrs[2], addrs[0], addrs[1]);
    let params = tuned_params(clusters(us_params.clone(), eu_params.clone()), f.clone());
    let started = std::time::Instant::now();
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    wait_target(&eu, 0, 300).await?;
    wait_target(&eu, 1, 300).await?;
    eprintln!("copied {:?} after the start", started.elapsed());
    produce(&up, "vsr", "t", 2, 300..400, 100).await?;
    wait_target(&eu, 0, 400).await?;
    wait_target(&eu, 1, 400).await?;
    // Verify reaches the cluster through a replica that answers.
    let mut check_params = eu_params.clone();
    check_params.connection_string = eu.connection_string();
    assert2::check!(verify_exact(f, &us_params, &check_params).await? == 800);
    eu.faults(frozen).clear();
    pipeline.shutdown().await;
    Ok(())
}

/// The target's primary is demoted while it runs on (a view change it was not part of): the
/// writers' connections to it stay open, and it now refuses their sends as a backup (58). The
/// SDK finds the new primary in the roster or the writer reconnects through the seeds; either
/// way the copy ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_primary_demoted_under_open_connections_leaves_an_exact_copy() -> TestResult {
    let Some((us, eu)) = cluster_target().await? else {
        return Ok(());
    };
    let Copying {
        up,
        f,
        us_params,
        eu_params,
        pipeline,
    } = copying_to(&us, &eu).await?;

    let old = eu.primary().ok_or("the target has no primary")?;
    let sends_before = eu.faults(old).requests(SEND_MESSAGES);
    eu.demote_primary();
    assert2::assert!(eu.primary() != Some(old));
    assert2::assert!(eu.is_running(old));
    produce(&up, "vsr", "t", 2, 300..600, 100).await?;
    wait_target(&eu, 0, 600).await?;
    wait_target(&eu, 1, 600).await?;
    // The demoted primary was still asked (and refused) before the writers moved.
    assert2::check!(eu.faults(old).requests(SEND_MESSAGES) > sends_before);
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 1200);
    pipeline.shutdown().await;
    Ok(())
}

/// Every replica of the target answers the roster (GET_CLUSTER_METADATA) that SDK 0.11 asks for
/// while it connects, and is slow on the next one, the replicator's own ask (to learn the
/// cluster's other ways in): each such ask is given up after a short bound, its connection
/// dropped (the late answer would be read as the next call's), and the same address connected
/// again without asking. Without that, a connection would wait for the roster (or ask again
/// and again) and nothing would be copied before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_not_answered_in_time_is_not_waited_for() -> TestResult {
    let Some((us, eu)) = cluster_target().await? else {
        return Ok(());
    };
    // Far beyond the test's deadlines: only a connection that stops asking gets anywhere.
    let late = Duration::from_secs(300);
    for replica in 0..3 {
        eu.faults(replica)
            .delay_next_after_the_first(GET_CLUSTER_METADATA, late, u32::MAX);
    }
    let Copying {
        up,
        f,
        us_params,
        eu_params,
        pipeline,
    } = copying_to(&us, &eu).await?;
    let asked: u64 = (0..3)
        .map(|replica| eu.faults(replica).requests(GET_CLUSTER_METADATA))
        .sum();
    assert2::check!(asked >= 1, "the roster was asked for and held back");
    produce(&up, "vsr", "t", 2, 300..400, 100).await?;
    wait_target(&eu, 0, 400).await?;
    wait_target(&eu, 1, 400).await?;
    assert2::check!(verify_exact(f, &us_params, &eu_params).await? == 800);
    pipeline.shutdown().await;
    for replica in 0..3 {
        eu.faults(replica).clear();
    }
    Ok(())
}
