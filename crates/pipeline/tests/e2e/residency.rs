//! Residency policies: a flow over `*/*` copies what a policy allows on its target exactly and
//! never creates, copies to or syncs groups on a topic the policy keeps from it, also when the
//! topic was copied before the policy and its unit is still granted.

use std::time::Duration;

use iggy::prelude::Identifier;
use replicator_harness::{store_group_offsets, translated_exactly};
use replicator_model::WorkUnit;
use replicator_pipeline::verify::verify;
use replicator_pipeline::{
    BlockedTopic, FlowParams, InMemoryControl, Pipeline, PipelineParams, PolicyParams,
};
use replicator_sdk::IggyCluster as _;

use crate::harness::{
    assert_exact, client, count, create_topic, flow, produce, wait_until, Env, Intercept,
    Intercepted, TestResult,
};

const WAIT: Duration = Duration::from_secs(30);

/// The policy of these scenarios: `pii-*` streams stay in the `us` zone.
fn pii_stays_in_us() -> PolicyParams {
    PolicyParams {
        name: "pii-stays-in-us".to_owned(),
        select: vec!["pii-*/*".to_owned()],
        allowed_zones: vec!["us".to_owned()],
    }
}

/// Params for `flow` with `us` in zone `us`, the target `eu` in zone `eu`, and
/// [`pii_stays_in_us`].
fn zoned(env: &Env, flow: FlowParams) -> TestResult<PipelineParams> {
    let mut params = env.params(flow);
    for (alias, zone) in [("us", "us"), ("eu", "eu")] {
        let cluster = params.clusters.get_mut(alias).ok_or("no such cluster")?;
        cluster.zones = vec![zone.to_owned()];
    }
    params.policies = vec![pii_stays_in_us()];
    Ok(params)
}

/// The topic `pii-users/events` as blocked by [`pii_stays_in_us`].
fn pii_users_blocked() -> BlockedTopic {
    BlockedTopic {
        stream: "pii-users".to_owned(),
        topic: "events".to_owned(),
        policy: "pii-stays-in-us".to_owned(),
        heartbeat: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_a_policy_keeps_from_the_target_never_appears_there_and_the_rest_is_exact(
) -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    for stream in ["pii-users", "orders"] {
        create_topic(&up, stream, "events", 2).await?;
        produce(&up, stream, "events", 2, 0..100, 50).await?;
    }
    let all = flow("all", &["*/*"]);
    let params = zoned(&env, all.clone())?;
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    let residency = pipeline.residency_reader();
    wait_until("pii-users/events reported blocked", WAIT, || async {
        residency()
            .iter()
            .any(|f| f.flow == "all" && f.target == "eu" && f.blocked == [pii_users_blocked()])
    })
    .await?;
    for partition in [0, 1] {
        env.wait_downstream("orders", "events", partition, 100)
            .await?;
    }
    // More of both while the flow runs: only the allowed topic follows.
    for stream in ["pii-users", "orders"] {
        produce(&up, stream, "events", 2, 100..150, 50).await?;
    }
    for partition in [0, 1] {
        env.wait_downstream("orders", "events", partition, 150)
            .await?;
    }

    let mut check = env.verify_params(all, WAIT);
    check.policies = vec![pii_stays_in_us()];
    check.target_zones = vec!["eu".to_owned()];
    let report = verify(&check).await?;
    assert_exact(&report);
    let verified: Vec<(&str, u32)> = report
        .partitions
        .iter()
        .map(|p| (p.stream.as_str(), p.partition))
        .collect();
    assert2::check!(verified == [("orders", 0), ("orders", 1)]);
    assert2::check!(report.downstream_total() == 300);

    let down = client(&env.eu).await?;
    let streams: Vec<String> = down
        .get_streams()
        .await?
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert2::check!(
        !streams.iter().any(|s| s == "pii-users"),
        "the blocked stream was created downstream: {streams:?}"
    );
    assert2::check!(streams.iter().any(|s| s == "orders"));
    assert2::check!(control
        .known_units()
        .iter()
        .all(|u| u.stream != "pii-users"));
    let stats = pipeline.stats().await?;
    assert2::check!(stats.iter().all(|s| s.unit.stream != "pii-users"));
    let blocked = residency();
    assert2::check!(blocked.len() == 1);
    assert2::check!(blocked[0].blocked == [pii_users_blocked()]);
    pipeline.shutdown().await;
    Ok(())
}

/// Reports a unit of `pii-users/events` with every unit set, as a control plane that still
/// holds it from before the policy would keep granting it.
#[derive(Clone)]
struct StaleUnit(WorkUnit);

impl Intercept for StaleUnit {
    fn reported(&self, mut units: Vec<WorkUnit>) -> Vec<WorkUnit> {
        if units.iter().any(|u| u.flow == self.0.flow) && !units.contains(&self.0) {
            units.push(self.0.clone());
        }
        units
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_copied_before_its_policy_is_neither_copied_further_nor_group_synced() -> TestResult
{
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    for stream in ["pii-users", "orders"] {
        create_topic(&up, stream, "events", 1).await?;
        produce(&up, stream, "events", 1, 0..50, 50).await?;
    }
    let mut all = flow("all", &["*/*"]);
    all.consumer_groups = vec!["billing".to_owned()];
    all.consumer_group_sync_interval = Duration::from_millis(100);
    let stale = WorkUnit::new("all", "pii-users", "events", 0);
    let control = Intercepted {
        inner: InMemoryControl::new(),
        hooks: StaleUnit(stale.clone()),
    };
    // Before the policy: everything is copied.
    let before = Pipeline::start(env.params(all.clone()), control.clone()).await?;
    env.wait_downstream("pii-users", "events", 0, 50).await?;
    env.wait_downstream("orders", "events", 0, 50).await?;
    before.shutdown().await;

    // With the policy, the control plane still grants the topic's unit (it stays granted
    // until discovery's report retires it, here never), the topic grows and a group moves on
    // upstream: none of it may reach the target.
    produce(&up, "pii-users", "events", 1, 50..80, 30).await?;
    for stream in ["pii-users", "orders"] {
        store_group_offsets(&up, (stream, "events"), "billing", &[(0, 20)]).await?;
    }
    let pipeline = Pipeline::start(zoned(&env, all)?, control.clone()).await?;
    let down = client(&env.eu).await?;
    wait_until("billing translated on orders/events", WAIT, || async {
        translated_exactly((&up, &down), ("orders", "events"), "billing", 0, 20)
            .await
            .unwrap_or(false)
    })
    .await?;
    assert2::assert!(
        control.inner.epoch(&stale).is_some(),
        "the blocked topic's unit is granted to this node"
    );
    // Two more sync rounds, each over the node's units, the blocked one included.
    let runs = || {
        pipeline
            .cutover()
            .group_sync_state()
            .get("all")
            .map_or(0, |s| s.runs)
    };
    let after = runs() + 2;
    wait_until("two more sync rounds", WAIT, || async { runs() >= after }).await?;

    assert2::check!(
        count(&env.eu, "pii-users", "events", 0) == 50,
        "the blocked topic was copied further"
    );
    let (s, t, g) = (
        Identifier::named("pii-users")?,
        Identifier::named("events")?,
        Identifier::named("billing")?,
    );
    assert2::check!(
        down.get_consumer_group(&s, &t, &g).await?.is_none(),
        "a group was created on the blocked topic downstream"
    );
    let stats = pipeline.stats().await?;
    assert2::check!(
        stats.iter().all(|s| s.unit != stale),
        "the blocked topic's unit was started"
    );
    let state = pipeline.cutover().group_sync_state();
    assert2::check!(state.get("all").is_some_and(|s| s.last.errors.is_empty()));
    let blocked = pipeline.residency_reader()();
    assert2::check!(blocked[0].blocked == [pii_users_blocked()]);
    pipeline.shutdown().await;
    Ok(())
}
