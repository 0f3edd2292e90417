//! The end-to-end suite of `tests/e2e` (the same modules) with an Iggy 0.9 source (`us`)
//! and an Iggy 0.9 target (`eu`).

/// The generations of `us` and `eu` for every test of this binary.
pub(crate) const IGGY_VERSIONS: Option<(
    replicator_model::IggyVersion,
    replicator_model::IggyVersion,
)> = Some((
    replicator_model::IggyVersion::V0_9,
    replicator_model::IggyVersion::V0_9,
));

#[path = "e2e/copy.rs"]
mod copy;
#[path = "e2e/edges.rs"]
mod edges;
#[path = "e2e/fencing.rs"]
mod fencing;
#[path = "e2e/groups.rs"]
mod groups;
#[path = "e2e/harness.rs"]
mod harness;
#[path = "e2e/heartbeats.rs"]
mod heartbeats;
#[path = "e2e/idle.rs"]
mod idle;
#[path = "e2e/integrity.rs"]
mod integrity;
#[path = "e2e/release.rs"]
mod release;
#[path = "e2e/reload.rs"]
mod reload;
#[path = "e2e/residency.rs"]
mod residency;
#[path = "e2e/throttle.rs"]
mod throttle;
#[path = "e2e/topics.rs"]
mod topics;
