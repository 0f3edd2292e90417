//! What the control plane remembers of the metadata a **two-way pair** of flows (one flow
//! from `a` to `b`, one from `b` to `a`) keeps on both of its clusters: for every user and
//! topic the pair syncs, its *home* (the cluster where an operator or application authored
//! it; the other side holds a copy) and, for topic settings, the values both sides had when
//! the pair last agreed. A flow never treats a copy on its source as an original, and only a
//! change made since the last agreement travels (see the pipeline's `sync::metadata::pair`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The two clusters of a two-way pair, by alias, the smaller first (so that both flows of the
/// pair name it alike).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClusterPair {
    /// The smaller alias.
    pub first: String,
    /// The larger alias.
    pub second: String,
}

impl ClusterPair {
    /// The pair of `a` and `b`, in either order.
    pub fn new(a: &str, b: &str) -> Self {
        let (first, second) = if a <= b { (a, b) } else { (b, a) };
        Self {
            first: first.to_owned(),
            second: second.to_owned(),
        }
    }

    /// Whether `alias` is one of the two.
    pub fn has(&self, alias: &str) -> bool {
        self.first == alias || self.second == alias
    }
}

/// One object a two-way pair syncs. Topics are paired by name: only flows with identity
/// naming on both sides copy a topic into its namesake.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MetadataObject {
    /// An Iggy user, by name (the same on both clusters).
    User(String),
    /// A topic, by stream and topic name (the same on both clusters).
    Topic {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
    },
}

impl std::fmt::Display for MetadataObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataObject::User(name) => write!(f, "user {name}"),
            MetadataObject::Topic { stream, topic } => write!(f, "topic {stream}/{topic}"),
        }
    }
}

/// Where a [`MetadataRecord`] lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MetadataKey {
    /// The pair's clusters.
    pub pair: ClusterPair,
    /// The object.
    pub object: MetadataObject,
}

/// What the control plane knows of one object of a two-way pair.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataRecord {
    /// The alias of the object's home cluster.
    pub home: String,
    /// Per setting (`message_expiry`, `max_topic_size`, `compression`), the value both clusters
    /// had when the pair last agreed on it, as the servers encode it. Empty for users.
    pub agreed: BTreeMap<String, u64>,
}

/// A compare-and-set of one record: applied only when the record is `expected` (`None`: there
/// is none), so that two flows deciding from the same old record cannot both win.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataChange {
    /// The record's key.
    pub key: MetadataKey,
    /// The record the decision was made from.
    pub expected: Option<MetadataRecord>,
    /// The new record; `None` drops it (the object is gone from both sides).
    pub record: Option<MetadataRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_the_same_from_both_sides() {
        assert_eq!(ClusterPair::new("us", "eu"), ClusterPair::new("eu", "us"));
        assert_eq!(ClusterPair::new("us", "eu").first, "eu");
        assert!(ClusterPair::new("us", "eu").has("us"));
        assert!(!ClusterPair::new("us", "eu").has("ap"));
    }
}
