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

#[cfg(test)]
mod tests {
    use super::*;

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
