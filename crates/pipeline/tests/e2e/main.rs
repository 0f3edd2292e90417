//! End-to-end scenarios of the pipeline against in-process Iggy-compatible servers
//! (`replicator-testkit`) and the in-memory control plane. One test binary, one module per
//! scenario group.
//!
//! This binary runs the suite with both clusters on Iggy 0.8, or on the pair
//! `E2E_IGGY_VERSIONS=<us>-<eu>` names (e.g. `0.9-0.8`). The binaries `e2e_0_8_to_0_9`,
//! `e2e_0_9_to_0_9` and `e2e_0_9_to_0_8` run these same modules on those pairs.

/// The generations of `us` and `eu`: `None` here, where `E2E_IGGY_VERSIONS` decides.
pub(crate) const IGGY_VERSIONS: Option<(
    replicator_model::IggyVersion,
    replicator_model::IggyVersion,
)> = None;

#[path = "suite.rs"]
mod suite;
use suite::harness;
