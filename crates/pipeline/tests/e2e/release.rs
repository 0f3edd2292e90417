//! Hand-backs: a release the control plane does not answer holds neither the statistics nor
//! the coordinator's work on other units, and a drain still waits for every release.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use replicator_model::WorkUnit;
use replicator_pipeline::{InMemoryControl, Pipeline};
use tokio::sync::watch;

use crate::harness::{
    confirmed, produce, wait_confirmed, wait_until, Env, Intercept, Intercepted, TestResult,
};

/// Releases that wait while the gate is closed.
#[derive(Clone)]
struct GatedReleases {
    /// `true` lets releases through.
    gate: Arc<watch::Sender<bool>>,
    /// Releases asked for so far.
    asked: Arc<AtomicU64>,
}

impl GatedReleases {
    /// The in-memory control plane `inner` behind a closed gate.
    fn around(inner: InMemoryControl) -> Intercepted<Self> {
        Intercepted {
            inner,
            hooks: Self {
                gate: Arc::new(watch::channel(false).0),
                asked: Arc::new(AtomicU64::new(0)),
            },
        }
    }

    fn asked(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }
}

impl Intercept for GatedReleases {
    fn before_release(&self) -> impl Future<Output = ()> + Send {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut gate = self.gate.subscribe();
        async move {
            let _ = gate.wait_for(|open| *open).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_release_holds_neither_stats_nor_other_units_and_drain_waits_for_it() -> TestResult
{
    let (env, up, f) = Env::seeded("gated", "t", 2, 0..100, 100).await?;
    let control = InMemoryControl::new();
    let gated = GatedReleases::around(control.clone());
    let (u0, u1) = (
        WorkUnit::new("gated", "gated", "t", 0),
        WorkUnit::new("gated", "gated", "t", 1),
    );
    let pipeline = Pipeline::start(env.params(f.clone()), gated.clone()).await?;
    wait_until(
        "both partitions copied",
        Duration::from_secs(30),
        || async { confirmed(&control, &u0) == Some(99) && confirmed(&control, &u1) == Some(99) },
    )
    .await?;

    // The leader asks for unit 0 back; its release hangs in the control plane.
    let first = control.epoch(&u0).ok_or("unit 0 not assigned")?;
    control.request_release(&u0);
    wait_until("release asked", Duration::from_secs(10), || async {
        gated.hooks.asked() >= 1
    })
    .await?;

    // Meanwhile unit 1 moves to a new epoch: the coordinator stops its pair and starts a new
    // one, and the statistics show it (the old coordinator was stuck in the release).
    control.revoke(&u1);
    control.grant(&u1);
    let regranted = control.epoch(&u1).ok_or("unit 1 not granted")?;
    wait_until(
        "unit 1 runs under its new epoch",
        Duration::from_secs(10),
        || async {
            pipeline
                .stats()
                .await
                .is_ok_and(|s| s.iter().any(|s| s.unit == u1 && s.epoch == regranted))
        },
    )
    .await?;
    produce(&up, "gated", "t", 2, 100..200, 100).await?;
    wait_confirmed(&control, &u1, 199, Duration::from_secs(30)).await?;
    assert!(
        control.epoch(&u0) == Some(first),
        "released through a closed gate"
    );

    // Opened: unit 0 is handed back, then granted again by discovery and copied on.
    gated.hooks.gate.send_replace(true);
    wait_until("unit 0 granted again", Duration::from_secs(10), || async {
        control.epoch(&u0).is_some_and(|e| e > first)
    })
    .await?;
    wait_confirmed(&control, &u0, 199, Duration::from_secs(30)).await?;

    // A drain answers only once every release was attempted.
    gated.hooks.gate.send_replace(false);
    let asked = gated.hooks.asked();
    let shutdown = tokio::spawn(pipeline.shutdown());
    wait_until(
        "both units' releases asked",
        Duration::from_secs(15),
        || async { gated.hooks.asked() >= asked + 2 },
    )
    .await?;
    assert!(
        !shutdown.is_finished(),
        "drained before its releases finished"
    );
    gated.hooks.gate.send_replace(true);
    shutdown.await?;
    assert!(
        control.assigned().is_empty(),
        "units left: {:?}",
        control.assigned()
    );
    Ok(())
}
