//! The long-running tasks beside the data path (per node: the identity follower and the
//! watchdog; per flow: discovery, metadata sync, group sync, heartbeats), each a child of the
//! task supervisor: one that panics is restarted, says so (its `TaskStats`), and does its work
//! again while the copy goes on exact; one that keeps panicking stops the pipeline, which says
//! so (`gave_up`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use replicator_model::WorkUnit;
use replicator_pipeline::{FlowParams, InMemoryControl, Pipeline, TaskKind, TaskStats};

use crate::harness::{
    assert_exact, create_topic, produce, wait_confirmed, wait_until, Env, TestResult,
};

const WAIT: Duration = Duration::from_secs(30);

/// A flow over `stream/*` that runs every per-flow task, each at a short period.
fn every_task(stream: &str) -> FlowParams {
    let mut f = crate::harness::flow(stream, &[&format!("{stream}/*")]);
    f.heartbeat_interval = Duration::from_millis(100);
    f.consumer_groups = vec!["billing".to_owned()];
    f.consumer_group_sync_interval = Duration::from_millis(100);
    f.metadata_sync_interval = Duration::from_millis(200);
    f
}

/// The stats of task `kind` of `flow` (`None`: of the node).
fn stats_of(pipeline: &Pipeline, kind: TaskKind, flow: Option<&str>) -> Option<TaskStats> {
    pipeline.tasks_reader()()
        .into_iter()
        .find(|t| t.task == kind && t.flow.as_deref() == flow)
}

/// How much work task `kind` of `flow` has done, as it shows outside the task (for
/// discovery, see [`discovers_again`]).
fn work_done(pipeline: &Pipeline, kind: TaskKind, flow: &str) -> u64 {
    let cutover = pipeline.cutover();
    match kind {
        TaskKind::Watchdog => pipeline.liveness().heartbeats_sent(),
        TaskKind::Heartbeats => pipeline.heartbeats_reader()()
            .iter()
            .find(|h| h.flow == flow)
            .map_or(0, |h| h.sent),
        TaskKind::GroupSync => cutover.group_sync_state().get(flow).map_or(0, |s| s.runs),
        TaskKind::MetadataSync => cutover
            .metadata_sync_state()
            .get(flow)
            .map_or(0, |s| s.runs),
        // Their work shows in the copy itself (the writers' connections, new topics).
        TaskKind::IdentityFollower | TaskKind::Discovery => 0,
    }
}

/// Injects a panic into task `kind` mid-copy; checks that it is restarted, counted as one
/// panic (and no other task restarted), works again, and that the copy ends exact.
async fn a_panicking_task_is_restarted(stream: &str, kind: TaskKind) -> TestResult {
    let (env, up, f) = Env::seeded(stream, "t", 2, 0..100, 50).await?;
    let f = FlowParams {
        name: f.name,
        ..every_task(stream)
    };
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    let units: Vec<WorkUnit> = (0..2)
        .map(|p| WorkUnit::new(stream, stream, "t", p))
        .collect();
    for unit in &units {
        wait_confirmed(&control, unit, 99, WAIT).await?;
    }
    let flow = match kind {
        TaskKind::IdentityFollower | TaskKind::Watchdog => None,
        _ => Some(f.name.as_str()),
    };
    // The task has done some work before it panics.
    wait_until(&format!("{kind} at work"), WAIT, || async {
        kind == TaskKind::IdentityFollower
            || kind == TaskKind::Discovery
            || work_done(&pipeline, kind, &f.name) > 0
    })
    .await?;
    assert!(
        pipeline.inject_task_panic_for_tests(kind, flow),
        "no {kind} task of {flow:?}"
    );
    wait_until(
        &format!("{kind} restarted after its panic"),
        WAIT,
        || async {
            stats_of(&pipeline, kind, flow)
                .is_some_and(|t| t.restarts == 1 && t.panics == 1 && t.running)
        },
    )
    .await?;
    let stats = stats_of(&pipeline, kind, flow).ok_or("no stats")?;
    let (how, _) = stats.last_failure.ok_or("no last failure")?;
    assert!(how.contains("panicked"), "{how}");
    // It works again.
    let before = work_done(&pipeline, kind, &f.name);
    if kind == TaskKind::Discovery {
        create_topic(&up, stream, "after-panic", 1).await?;
        produce(&up, stream, "after-panic", 1, 0..10, 10).await?;
        let unit = WorkUnit::new(stream, stream, "after-panic", 0);
        wait_confirmed(&control, &unit, 9, WAIT).await?;
    } else {
        wait_until(&format!("{kind} at work again"), WAIT, || async {
            kind == TaskKind::IdentityFollower || work_done(&pipeline, kind, &f.name) > before
        })
        .await?;
    }
    // The copy goes on, exact, through the writers (the identity follower's connections).
    produce(&up, stream, "t", 2, 100..200, 50).await?;
    for unit in &units {
        wait_confirmed(&control, unit, 199, WAIT).await?;
    }
    assert_exact(&env.verify(&f, WAIT).await?);
    let others: Vec<TaskStats> = pipeline.tasks_reader()()
        .into_iter()
        .filter(|t| !(t.task == kind && t.flow.as_deref() == flow) && t.restarts > 0)
        .collect();
    assert!(others.is_empty(), "other tasks restarted: {others:?}");
    // Every kind ran in this pipeline.
    let kinds: Vec<TaskKind> = pipeline.tasks_reader()().iter().map(|t| t.task).collect();
    for k in TaskKind::ALL {
        assert!(kinds.contains(&k), "no {k} task in {kinds:?}");
    }
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_identity_follower_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-identity", TaskKind::IdentityFollower).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_watchdog_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-watchdog", TaskKind::Watchdog).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_discovery_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-discovery", TaskKind::Discovery).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_metadata_sync_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-metadata", TaskKind::MetadataSync).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_group_sync_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-groups", TaskKind::GroupSync).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_heartbeat_task_is_restarted() -> TestResult {
    a_panicking_task_is_restarted("task-heartbeats", TaskKind::Heartbeats).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_keeps_panicking_stops_the_pipeline_which_says_so() -> TestResult {
    let (env, _up, f) = Env::seeded("task-giveup", "t", 1, 0..10, 10).await?;
    let pipeline = Pipeline::start(env.params(f.clone()), InMemoryControl::new()).await?;
    let gave_up = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let (gave_up, said) = (gave_up.clone(), pipeline.gave_up());
        async move {
            said.await;
            gave_up.store(true, Ordering::SeqCst);
        }
    });
    let flow = Some(f.name.as_str());
    let mut panics = 0;
    while !gave_up.load(Ordering::SeqCst) {
        assert!(panics < 20, "not given up after {panics} panics");
        // Each discovery the supervisor starts again panics as soon as it runs.
        assert!(pipeline.inject_task_panic_for_tests(TaskKind::Discovery, flow));
        panics += 1;
        wait_until("the panic handled", WAIT, || async {
            gave_up.load(Ordering::SeqCst)
                || stats_of(&pipeline, TaskKind::Discovery, flow)
                    .is_some_and(|t| t.panics >= panics && t.running)
        })
        .await?;
    }
    watcher.await?;
    // One more than the restart budget (5 restarts within the window).
    assert!(panics == 6, "given up after {panics} panics");
    let stats = stats_of(&pipeline, TaskKind::Discovery, flow).ok_or("no stats")?;
    assert!(!stats.running && stats.panics == 6, "{stats:?}");
    pipeline.shutdown().await;
    Ok(())
}

/// The tree as it runs, for one flow with every per-flow task and two partitions: the drawing
/// ARCHITECTURE.md shows ("Concurrency"), which this keeps true.
const TREE: &str = "\
Supervisor
├─ Coordinator ×1
│  └─ Flow ×1
│     └─ LoopActor ×4
└─ Tasks ×1
   └─ LoopActor ×6
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_tree_is_the_one_architecture_md_draws() -> TestResult {
    let stream = "task-tree";
    let (env, _up, f) = Env::seeded(stream, "t", 2, 0..10, 10).await?;
    let f = FlowParams {
        name: f.name,
        ..every_task(stream)
    };
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    for p in 0..2 {
        wait_confirmed(&control, &WorkUnit::new(stream, stream, "t", p), 9, WAIT).await?;
    }
    let drawn = pipeline.draw_tree_for_tests();
    pipeline.shutdown().await;
    assert_eq!(drawn, TREE);
    let architecture = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md"),
    )?;
    assert!(
        architecture.contains(TREE),
        "ARCHITECTURE.md does not draw the tree as it runs:\n{TREE}"
    );
    Ok(())
}
