//! Per-flow policies shared by the config loader and the pipeline.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::Offset;

/// How often a flow syncs its consumer groups' offsets to the target
/// (`flows[].consumer_group_sync_interval`) unless configured.
pub const DEFAULT_GROUP_SYNC_INTERVAL: Duration = Duration::from_secs(5);

/// How downstream stream names are derived from upstream ones (topics keep their names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Naming {
    /// The downstream stream has the upstream stream's name.
    #[default]
    Identity,
    /// The downstream stream is named `<source alias>.<stream>`, e.g. `us.orders`.
    Prefix,
}

/// Where a unit starts when the control plane has no confirmed offset for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum InitialOffset {
    /// The oldest message still retained upstream.
    #[default]
    Earliest,
    /// Only messages appended after the unit starts (the current end of the partition).
    Latest,
    /// A fixed upstream offset (clamped to the oldest retained one).
    At(Offset),
}
