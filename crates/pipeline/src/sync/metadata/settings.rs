//! Topic settings sync, the decision: which of a topic's settings the target must take from
//! upstream, and which differences it keeps (pinned by `flows[].keep_target_settings`, or
//! beyond what an update can change).

use std::collections::BTreeSet;

use replicator_model::TopicSetting;
use replicator_sdk::types::{CompressionAlgorithm, IggyExpiry, MaxTopicSize, Topic};
use serde::{Deserialize, Serialize};

/// The settings of one topic the sync keeps in line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TopicSettings {
    pub(crate) message_expiry: IggyExpiry,
    pub(crate) max_topic_size: MaxTopicSize,
    pub(crate) compression: CompressionAlgorithm,
}

impl TopicSettings {
    /// A topic's settings as its server reports them.
    pub(crate) fn of(topic: &Topic) -> Self {
        Self {
            message_expiry: topic.message_expiry,
            max_topic_size: topic.max_topic_size,
            compression: topic.compression_algorithm,
        }
    }

    /// `setting` as status shows it, e.g. `"1h"`, `"unlimited"`, `"gzip"`.
    pub(crate) fn render(&self, setting: TopicSetting) -> String {
        match setting {
            TopicSetting::MessageExpiry => self.message_expiry.to_string(),
            TopicSetting::MaxTopicSize => self.max_topic_size.to_string(),
            TopicSetting::Compression => self.compression.to_string(),
        }
    }

    /// `self` with `setting` taken from `from`.
    pub(crate) fn with(mut self, setting: TopicSetting, from: &Self) -> Self {
        match setting {
            TopicSetting::MessageExpiry => self.message_expiry = from.message_expiry,
            TopicSetting::MaxTopicSize => self.max_topic_size = from.max_topic_size,
            TopicSetting::Compression => self.compression = from.compression,
        }
        self
    }

    /// `setting` as the servers encode it (what a two-way pair records as agreed). A server
    /// answers the value it stores, so two equal values encode alike whatever generation
    /// reports them.
    pub(crate) fn encoded(&self, setting: TopicSetting) -> u64 {
        match setting {
            TopicSetting::MessageExpiry => u64::from(self.message_expiry),
            TopicSetting::MaxTopicSize => u64::from(self.max_topic_size),
            TopicSetting::Compression => u64::from(self.compression.as_code()),
        }
    }

    /// Whether `setting` is the same in both.
    fn same(&self, other: &Self, setting: TopicSetting) -> bool {
        self.encoded(setting) == other.encoded(setting)
    }

    /// Whether upstream's `setting` is a value of its own: a server that reports "its
    /// default" has nothing the target could take (the target would resolve it to its own
    /// default and report that, and the two would never compare equal).
    pub(crate) fn stated(&self, setting: TopicSetting) -> bool {
        match setting {
            TopicSetting::MessageExpiry => self.message_expiry != IggyExpiry::ServerDefault,
            TopicSetting::MaxTopicSize => self.max_topic_size != MaxTopicSize::ServerDefault,
            TopicSetting::Compression => true,
        }
    }
}

/// What the target's topic needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SettingsPlan {
    /// The settings to send (`None`: nothing to change): upstream's for the settings that
    /// follow it, the target's own for the others.
    pub(crate) update: Option<TopicSettings>,
    /// The settings the update changes.
    pub(crate) changed: Vec<TopicSetting>,
    /// Differences left on purpose: settings the flow keeps, with both values.
    pub(crate) kept: Vec<SettingDifference>,
}

/// One setting that differs between upstream and the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingDifference {
    /// The setting, e.g. `message_expiry` (or `partitions`, which a topic can only gain).
    pub setting: String,
    /// Upstream's value, rendered.
    pub upstream: String,
    /// The target's value, rendered.
    pub target: String,
    /// Left on purpose (`flows[].keep_target_settings`), not a drift.
    #[serde(default)]
    pub kept: bool,
}

/// Decides what the target's topic (`target`) needs to match `upstream`, leaving `keep`
/// alone.
pub(crate) fn plan(
    upstream: &TopicSettings,
    target: &TopicSettings,
    keep: &BTreeSet<TopicSetting>,
) -> SettingsPlan {
    let mut wanted = *target;
    let mut changed = Vec::new();
    let mut kept = Vec::new();
    for setting in TopicSetting::ALL {
        if !upstream.stated(setting) || upstream.same(target, setting) {
            continue;
        }
        if keep.contains(&setting) {
            kept.push(SettingDifference {
                setting: setting.as_str().to_owned(),
                upstream: upstream.render(setting),
                target: target.render(setting),
                kept: true,
            });
            continue;
        }
        wanted = wanted.with(setting, upstream);
        changed.push(setting);
    }
    SettingsPlan {
        update: (!changed.is_empty()).then_some(wanted),
        changed,
        kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use replicator_model::TopicSetting;
    use replicator_sdk::types::IggyDuration;

    fn settings(expiry: IggyExpiry, size: MaxTopicSize, c: CompressionAlgorithm) -> TopicSettings {
        TopicSettings {
            message_expiry: expiry,
            max_topic_size: size,
            compression: c,
        }
    }

    fn hours(h: u64) -> IggyExpiry {
        IggyExpiry::ExpireDuration(IggyDuration::from(h * 3_600_000_000))
    }

    #[test]
    fn equal_settings_need_nothing() {
        let s = settings(
            hours(1),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::None,
        );
        let plan = plan(&s, &s, &BTreeSet::new());
        assert!(plan.update.is_none() && plan.changed.is_empty() && plan.kept.is_empty());
    }

    #[test]
    fn a_changed_setting_is_sent_with_the_targets_others() {
        let up = settings(
            hours(2),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::Gzip,
        );
        let down = settings(
            hours(1),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::None,
        );
        let plan = plan(&up, &down, &BTreeSet::new());
        assert!(plan.update == Some(up));
        assert!(plan.changed == vec![TopicSetting::MessageExpiry, TopicSetting::Compression]);
    }

    #[test]
    fn kept_settings_stay_and_are_reported() {
        let up = settings(
            hours(2),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::Gzip,
        );
        let down = settings(
            hours(1),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::None,
        );
        let keep = BTreeSet::from([TopicSetting::MessageExpiry]);
        let plan = plan(&up, &down, &keep);
        let wanted = settings(
            hours(1),
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::Gzip,
        );
        assert!(plan.update == Some(wanted));
        assert!(plan.changed == vec![TopicSetting::Compression]);
        assert!(plan.kept.len() == 1 && plan.kept[0].setting == "message_expiry");
    }

    #[test]
    fn a_server_default_upstream_is_not_copied() {
        let up = settings(
            IggyExpiry::ServerDefault,
            MaxTopicSize::ServerDefault,
            CompressionAlgorithm::None,
        );
        let down = settings(
            IggyExpiry::NeverExpire,
            MaxTopicSize::Unlimited,
            CompressionAlgorithm::None,
        );
        assert!(plan(&up, &down, &BTreeSet::new()).update.is_none());
    }
}
