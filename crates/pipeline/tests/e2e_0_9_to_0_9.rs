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

#[path = "e2e/suite.rs"]
mod suite;
use suite::harness;
