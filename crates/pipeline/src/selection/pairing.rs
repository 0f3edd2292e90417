//! Two-way pairs, the facts: which flows copy the other way of a flow ([`Pairing`]: their
//! selections and naming both ways), and a flow's two clusters ([`PairView`], [`Side`]).
//! Discovery reads them to leave what the reverse flow copied alone; the metadata sync decides
//! with them which side of the pair an object is at home on (`sync::metadata::pair`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use globset::GlobSet;
use replicator_model::{
    ClusterPair, MetadataKey, MetadataObject, MetadataRecord, Naming, TopicSetting,
};

use super::mapping::Selector;
use crate::params::FlowParams;

/// One side of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The flow's source.
    Source,
    /// The flow's target.
    Target,
}

/// A flow of a two-way pair: its clusters, by alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PairView {
    /// The pair.
    pub(crate) pair: ClusterPair,
    /// The flow's source alias.
    pub(crate) source: String,
    /// The flow's target alias.
    pub(crate) target: String,
}

impl PairView {
    /// The view of the flow from `source` to `target`.
    pub(crate) fn new(source: &str, target: &str) -> Self {
        Self {
            pair: ClusterPair::new(source, target),
            source: source.to_owned(),
            target: target.to_owned(),
        }
    }

    /// The side `alias` is on, `None` when it is neither.
    pub(crate) fn side(&self, alias: &str) -> Option<Side> {
        if alias == self.source {
            Some(Side::Source)
        } else if alias == self.target {
            Some(Side::Target)
        } else {
            None
        }
    }

    /// The alias of `side`.
    pub(crate) fn alias(&self, side: Side) -> &str {
        match side {
            Side::Source => &self.source,
            Side::Target => &self.target,
        }
    }

    /// A record of an object at home on `side`, with nothing agreed yet.
    pub(crate) fn home_at(&self, side: Side) -> MetadataRecord {
        MetadataRecord {
            home: self.alias(side).to_owned(),
            agreed: Default::default(),
        }
    }
}

/// Compiles a flow's user globs (`*` matches any run of characters).
pub(crate) fn user_selector(globs: &[String]) -> std::result::Result<GlobSet, (String, String)> {
    super::globs::name_globs("users", globs)
}

/// A flow of a two-way pair and the flows that copy the other way (see `sync::metadata::pair`).
#[derive(Debug, Clone)]
pub(crate) struct Pairing {
    pub(crate) view: PairView,
    /// The flow's own user globs and placement.
    users: GlobSet,
    naming: Naming,
    selector: Selector,
    /// The flows from this flow's target to its source.
    reverse: Vec<ReverseFlow>,
}

/// One flow of [`Pairing::reverse`].
#[derive(Debug, Clone)]
struct ReverseFlow {
    users: GlobSet,
    naming: Naming,
    selector: Selector,
    keep: BTreeSet<TopicSetting>,
}

impl Pairing {
    /// The pairing of `flow`, `None` when no flow copies the other way.
    pub(crate) fn of(
        flow: &FlowParams,
        flows: &BTreeMap<String, Arc<FlowParams>>,
        selectors: &BTreeMap<String, Selector>,
    ) -> std::result::Result<Option<Self>, (String, String)> {
        let selector_of = |f: &FlowParams| {
            selectors.get(&f.name).cloned().unwrap_or_else(|| {
                Selector::new(&[], &[]).unwrap_or_else(|_| unreachable!("no globs"))
            })
        };
        let mut reverse = Vec::new();
        for other in flows.values() {
            if other.source == flow.target && other.target == flow.source {
                reverse.push(ReverseFlow {
                    users: user_selector(&other.users)?,
                    naming: other.naming,
                    selector: selector_of(other),
                    keep: other.keep_target_settings.clone(),
                });
            }
        }
        if reverse.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            view: PairView::new(&flow.source, &flow.target),
            users: user_selector(&flow.users)?,
            naming: flow.naming,
            selector: selector_of(flow),
            reverse,
        }))
    }

    /// Whether both directions sync the user `name`.
    pub(crate) fn pairs_user(&self, name: &str) -> bool {
        self.users.is_match(name) && self.reverse.iter().any(|r| r.users.is_match(name))
    }

    /// Whether both directions copy `stream/topic` into its namesake (identity naming both
    /// ways, selected both ways).
    pub(crate) fn pairs_topic(&self, stream: &str, topic: &str) -> bool {
        self.naming == Naming::Identity
            && self.selector.matches(stream, topic)
            && self
                .reverse
                .iter()
                .any(|r| r.naming == Naming::Identity && r.selector.matches(stream, topic))
    }

    /// The settings that travel in neither direction of `stream/topic`: those this flow
    /// (`own`) or a reverse flow that copies the topic keeps.
    pub(crate) fn kept(
        &self,
        own: &BTreeSet<TopicSetting>,
        stream: &str,
        topic: &str,
    ) -> BTreeSet<TopicSetting> {
        let mut keep = own.clone();
        for r in &self.reverse {
            if r.selector.matches(stream, topic) {
                keep.extend(r.keep.iter().copied());
            }
        }
        keep
    }

    /// Whether `stream` on this flow's source is a copy a reverse flow made with prefix naming
    /// (`<this flow's target>.<stream>`): copying it back would name it
    /// `<source>.<target>.<stream>` on the target, and so on at every round trip.
    pub(crate) fn is_reverse_copy(&self, stream: &str) -> bool {
        self.reverse.iter().any(|r| r.naming == Naming::Prefix)
            && stream
                .strip_prefix(self.view.target.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
    }

    /// The key of `object` in this pair.
    pub(crate) fn key(&self, object: MetadataObject) -> MetadataKey {
        MetadataKey {
            pair: self.view.pair.clone(),
            object,
        }
    }
}
