//! Replacing the pipeline (a config reload): `shutdown_keeping` stops the kept flow's units
//! after their final commit without handing them back, so the next pipeline resumes them under
//! the same epochs, exactly; the other flow's units are handed back.

use std::collections::BTreeSet;
use std::time::Duration;

use replicator_model::WorkUnit;
use replicator_pipeline::{InMemoryControl, Pipeline, PipelineParams};

use crate::harness::{assert_exact, create_topic, flow, produce, wait_confirmed, Env, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_flow_resumes_under_the_same_epochs_and_the_other_is_handed_back() -> TestResult {
    let (env, up, kept) = Env::seeded("keepa", "t", 2, 0..100, 50).await?;
    create_topic(&up, "keepb", "t", 1).await?;
    produce(&up, "keepb", "t", 1, 0..100, 50).await?;
    let other = flow("keepb", &["keepb/*"]);
    let params = |flows| {
        let mut p = env.params(kept.clone());
        p.flows = flows;
        p
    };
    let both: PipelineParams = params(vec![kept.clone(), other.clone()]);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(both, control.clone()).await?;
    let (a0, a1, b0) = (
        WorkUnit::new("keepa", "keepa", "t", 0),
        WorkUnit::new("keepa", "keepa", "t", 1),
        WorkUnit::new("keepb", "keepb", "t", 0),
    );
    for unit in [&a0, &a1, &b0] {
        wait_confirmed(&control, unit, 99, Duration::from_secs(30)).await?;
    }
    let epochs = (control.epoch(&a0), control.epoch(&a1));
    assert!(epochs.0.is_some() && epochs.1.is_some());

    pipeline
        .shutdown_keeping(BTreeSet::from(["keepa".to_owned()]))
        .await;
    assert_eq!((control.epoch(&a0), control.epoch(&a1)), epochs, "kept");
    assert_eq!(control.epoch(&b0), None, "handed back");

    // The next pipeline runs only the kept flow; it resumes where the first stopped.
    produce(&up, "keepa", "t", 2, 100..200, 50).await?;
    let pipeline = Pipeline::start(params(vec![kept.clone()]), control.clone()).await?;
    for unit in [&a0, &a1] {
        wait_confirmed(&control, unit, 199, Duration::from_secs(30)).await?;
    }
    assert_eq!(
        (control.epoch(&a0), control.epoch(&a1)),
        epochs,
        "no new grant"
    );
    assert_exact(&env.verify(&kept, Duration::from_secs(30)).await?);
    pipeline.shutdown().await;
    assert_eq!(
        control.epoch(&a0),
        None,
        "a plain shutdown hands everything back"
    );
    Ok(())
}
