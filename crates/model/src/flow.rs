//! Per-flow policies shared by the config loader and the pipeline, the defaults both use (each
//! written here once: the config's `Default:` and `PipelineParams`' constructors read them), and
//! the rule that decides whether a residency policy lets a flow write to its target.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::Offset;

/// Messages per poll and per send (`flows[].batch_size`) unless configured.
pub const DEFAULT_BATCH_SIZE: u32 = 1000;

/// The largest `flows[].batch_size`, and what a grown batch never exceeds (see
/// [`DEFAULT_MAX_BATCH_BYTES`]).
pub const MAX_BATCH_SIZE: u32 = 100_000;

/// What a batch grown for a distant source or target may hold, in message bytes
/// (`flows[].max_batch_bytes`) unless configured: while a partition is behind and its source or
/// target is far, its batches grow to this after a full poll (README "Across regions").
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 4 << 20;

/// Polls a caught-up partition keeps in flight while its source is far
/// (`flows[].far_source_polls`) unless configured: one, as near a source (README "Across
/// regions").
pub const DEFAULT_FAR_SOURCE_POLLS: u32 = 1;

/// The most polls a caught-up partition may keep in flight while its source is far.
pub const MAX_FAR_SOURCE_POLLS: u32 = 8;

/// Pause between polls of a caught-up partition (`flows[].poll_interval`) unless configured.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Period of the watcher idle partitions wait for (`flows[].idle_poll_interval`) unless
/// configured.
pub const DEFAULT_IDLE_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Whether writers add provenance headers (`flows[].provenance`) unless configured.
pub const DEFAULT_PROVENANCE: bool = true;

/// Batches in flight between a partition's reader and its writer
/// (`flows[].max_in_flight_batches`) unless configured.
pub const DEFAULT_MAX_IN_FLIGHT_BATCHES: usize = 2;

/// How often each flow lists upstream streams and topics (`[pipeline].discovery_interval`)
/// unless configured.
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(5);

/// First delay of the pipeline's backoff, e.g. before restarting a failed reader or writer
/// (`[pipeline].restart_backoff_min`) unless configured.
pub const DEFAULT_RESTART_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Longest such delay (`[pipeline].restart_backoff_max`) unless configured.
pub const DEFAULT_RESTART_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How often a flow syncs its consumer groups' offsets to the target
/// (`flows[].consumer_group_sync_interval`) unless configured.
pub const DEFAULT_GROUP_SYNC_INTERVAL: Duration = Duration::from_secs(5);

/// How often a flow syncs its users and its topics' settings to the target
/// (`flows[].metadata_sync_interval`) unless configured.
pub const DEFAULT_METADATA_SYNC_INTERVAL: Duration = Duration::from_secs(30);

/// A topic setting the metadata sync keeps equal on the target unless the flow keeps the
/// target's own (`flows[].keep_target_settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicSetting {
    /// How long messages are kept.
    MessageExpiry,
    /// The most bytes the topic may hold.
    MaxTopicSize,
    /// The compression algorithm.
    Compression,
}

impl TopicSetting {
    /// Every setting, in the order status lists them.
    pub const ALL: [TopicSetting; 3] = [
        TopicSetting::MessageExpiry,
        TopicSetting::MaxTopicSize,
        TopicSetting::Compression,
    ];

    /// The name the config and status use.
    pub fn as_str(self) -> &'static str {
        match self {
            TopicSetting::MessageExpiry => "message_expiry",
            TopicSetting::MaxTopicSize => "max_topic_size",
            TopicSetting::Compression => "compression",
        }
    }
}

impl std::fmt::Display for TopicSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Default of `flows[].heartbeat_interval`: how often each owner of a flow's units writes a
/// heartbeat record to the flow's target (zero turns heartbeats off).
pub const DEFAULT_HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Default of `flows[].heartbeat_topic`: the `stream/topic` on the target that heartbeats go to.
pub const DEFAULT_HEARTBEAT_TOPIC: &str = "replicator/heartbeats";

/// Characters with a meaning in a glob; a heartbeat topic must not contain any, so that an
/// include pattern equal to it names it literally.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];

/// Splits a heartbeat topic `stream/topic` into its stream and topic, or says why it is not
/// one: exactly one `/`, both parts non-empty, no glob characters.
pub fn heartbeat_topic_parts(value: &str) -> Result<(&str, &str), &'static str> {
    let Some((stream, topic)) = value.split_once('/') else {
        return Err("must have the form \"stream/topic\"");
    };
    if stream.is_empty() || topic.is_empty() || topic.contains('/') {
        return Err("must have the form \"stream/topic\" with both parts non-empty");
    }
    if value.contains(GLOB_CHARS) {
        return Err("must not contain glob characters (* ? [ ] { } \\)");
    }
    Ok((stream, topic))
}

/// Whether a residency policy (`[[policies]]`) that allows `allowed_zones` lets a flow copy
/// the topics it selects to a target cluster in `target_zones` (`clusters.<alias>.zones`):
/// only when they share a zone. A target with no zones is allowed by no policy, so that a
/// cluster nobody placed in a zone never receives data that must stay in one.
pub fn zones_allow(allowed_zones: &[String], target_zones: &[String]) -> bool {
    target_zones.iter().any(|zone| allowed_zones.contains(zone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones(list: &[&str]) -> Vec<String> {
        list.iter().map(|z| (*z).to_owned()).collect()
    }

    #[test]
    fn a_policy_allows_a_target_only_when_they_share_a_zone() {
        let allowed = zones(&["eu", "ch"]);
        assert!(zones_allow(&allowed, &zones(&["eu"])));
        assert!(zones_allow(&allowed, &zones(&["us", "ch"])));
        assert!(!zones_allow(&allowed, &zones(&["us"])));
        // A cluster in no zone is outside every policy's zones.
        assert!(!zones_allow(&allowed, &[]));
        // Zone names are compared exactly.
        assert!(!zones_allow(&allowed, &zones(&["EU"])));
    }

    #[test]
    fn heartbeat_topic_parts_accepts_only_literal_stream_slash_topic() {
        assert_eq!(
            heartbeat_topic_parts(DEFAULT_HEARTBEAT_TOPIC),
            Ok(("replicator", "heartbeats"))
        );
        for bad in [
            "", "a", "/b", "a/", "a/b/c", "a/*", "a?/b", "a/{b}", "a/[b]",
        ] {
            assert!(heartbeat_topic_parts(bad).is_err(), "{bad:?} accepted");
        }
    }
}
